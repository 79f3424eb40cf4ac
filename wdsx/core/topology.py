"""Who is reading: rank and world size of the job, worker id and count of the DataLoader.

Rank and world size come from ``torch.distributed`` when it is initialised, else from the
launcher's environment (torchrun's ``RANK``/``WORLD_SIZE``, SLURM, Open MPI, MPICH). DataLoader
workers started with ``spawn`` cannot see the process group, so datasets capture the rank in
the main process (:func:`capture`) and WebLoader tells each worker who it is
(:func:`assign`); a WebLoader with reader threads tells each thread (:func:`assigned_to_thread`).
torch is only consulted when the program has already imported it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


@dataclass(frozen=True)
class Topology:
    """One reader's place in the job: rank of world_size, worker of num_workers."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def consumer(self) -> int:
        """Index of this reading stream among all ranks' workers."""
        return self.rank * self.num_workers + self.worker

    @property
    def consumers(self) -> int:
        return self.world_size * self.num_workers


_assigned: Topology | None = None
"""The identity of this process (a DataLoader worker process), set by :func:`assign`."""

_thread = threading.local()
"""``_thread.topology``: the identity of the current thread (a reader thread), which takes
precedence over the process's."""


def assign(topology: Topology | None) -> None:
    """Set this process's identity explicitly (WebLoader does this in each worker)."""
    global _assigned
    _assigned = topology


@contextmanager
def assigned_to_thread(topology: Topology) -> Iterator[None]:
    """Within the block, the current thread is the reader ``topology`` (a WebLoader reader
    thread: several read in one process, each as its own worker)."""
    previous = getattr(_thread, "topology", None)
    _thread.topology = topology
    try:
        yield
    finally:
        _thread.topology = previous


def in_reader_thread() -> bool:
    """True in a WebLoader reader thread (a worker that is a thread, not a process)."""
    return getattr(_thread, "topology", None) is not None


def _assigned_now() -> Topology | None:
    """The identity assigned to this thread, else to this process, else None."""
    return getattr(_thread, "topology", None) or _assigned


def rank_and_world_from_environment(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world_size) from the first launcher whose rank and size variables are both set in
    ``environ`` (default: this process's): torchrun's ``RANK``/``WORLD_SIZE``, then SLURM's
    ``SLURM_PROCID``/``SLURM_NTASKS``, Open MPI's ``OMPI_COMM_WORLD_RANK``/``_SIZE``, MPICH's
    ``PMI_RANK``/``PMI_SIZE``; (0, 1) when none is."""
    environ = os.environ if environ is None else environ
    for rank_var, size_var in _RANK_VARIABLES:
        if rank_var in environ and size_var in environ:
            return int(environ[rank_var]), int(environ[size_var])
    return 0, 1


def rank_and_world(group: ProcessGroup | None = None) -> tuple[int, int]:
    """(rank, world_size) in ``group`` (default: the whole job) from torch.distributed if
    initialised, else from the launcher's variables (:func:`rank_and_world_from_environment`)."""
    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            group = group or dist.group.WORLD
            return dist.get_rank(group=group), dist.get_world_size(group=group)
    return rank_and_world_from_environment()


def worker_and_count() -> tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker; (0, 1) elsewhere."""
    if "WORKER" in os.environ and "NUM_WORKERS" in os.environ:
        return int(os.environ["WORKER"]), int(os.environ["NUM_WORKERS"])
    if "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1


def in_loader_worker() -> bool:
    """True in a WebLoader's worker (a process or a thread), which its loader gave an identity,
    and not in a plain DataLoader's."""
    return _assigned_now() is not None


def in_worker() -> bool:
    """True inside a DataLoader worker process or a WebLoader reader thread."""
    if getattr(_thread, "topology", None) is not None:
        return True
    if "torch" not in sys.modules:
        return False
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def capture() -> tuple[int, int]:
    """The main process's (rank, world_size), to be carried into worker processes."""
    return rank_and_world()


def current(captured: tuple[int, int] | None = None) -> Topology:
    """This reader's topology: the assigned one, else workers use the rank captured in the
    main process (when the live lookup sees a single process), else the live lookup."""
    assigned = _assigned_now()
    if assigned is not None:
        return assigned
    rank, world = rank_and_world()
    if captured is not None and world == 1 and in_worker():
        rank, world = captured
    worker, workers = worker_and_count()
    return Topology(rank, world, worker, workers)


def pytorch_worker_info(group: ProcessGroup | None = None) -> tuple[int, int, int, int]:
    """webdataset-compatible ``(rank, world_size, worker, num_workers)``."""
    topo = _assigned_now()
    if topo is not None:
        return topo.rank, topo.world_size, topo.worker, topo.num_workers
    rank, world = rank_and_world(group)
    worker, workers = worker_and_count()
    return rank, world, worker, workers
