"""webdataset's ``MultiLoader``: samples from several processes without torch's DataLoader.

Each worker process iterates the whole dataset with ``WORKER`` and ``NUM_WORKERS`` set in its
environment (wdsx's shard splitting reads them, as webdataset's does), and sends what it
yields to the loader. webdataset carries them over ZMQ; here a ``multiprocessing`` queue does,
so nothing beyond the standard library is needed. Samples arrive in the order workers produce
them. For exact resumption, use :class:`~wdsx.loader.webloader.WebLoader`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("wdsx")

the_protocol = pickle.HIGHEST_PROTOCOL
"""The pickle protocol samples travel with."""

all_pids: weakref.WeakSet = weakref.WeakSet()
"""Every worker process started by a MultiLoader in this process."""


class EOF:
    """What a worker sends when its dataset is exhausted; keyword arguments become attributes
    (``index``: the worker's number)."""

    index: int

    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


def reader(dataset: Iterable, sockname: Any, index: int, num_workers: int) -> None:
    """A worker's body: iterate ``dataset`` as worker ``index`` of ``num_workers`` and put each
    sample, pickled, on ``sockname`` (the loader's queue), then an :class:`EOF`."""
    os.environ["WORKER"] = str(index)
    os.environ["NUM_WORKERS"] = str(num_workers)
    for sample in dataset:
        sockname.put(pickle.dumps(sample, protocol=the_protocol))
    sockname.put(pickle.dumps(EOF(index=index), protocol=the_protocol))


class MultiLoader:
    """Iterate ``dataset`` in ``workers`` processes and yield their samples as they come.

    ``nokill``: starting a new iteration leaves the previous one's workers running. ``prefix``
    named webdataset's ZMQ socket and is kept for its signature only."""

    def __init__(
        self,
        dataset: Iterable,
        workers: int = 4,
        verbose: bool = False,
        nokill: bool = False,
        prefix: str = "",
    ):
        self.dataset = dataset
        self.workers = workers
        self.verbose = verbose
        self.nokill = nokill
        self.prefix = prefix
        self.pids: list[Any] = []
        self.socket: Any = None

    def kill(self) -> None:
        """Stop the workers of the current iteration and drop its queue."""
        for process in self.pids:
            if process is not None:
                process.kill()
                process.join(1.0)
        self.pids = []
        if self.socket is not None:
            self.socket.close()
        self.socket = None

    def __iter__(self) -> Iterator[Any]:
        if not self.nokill:
            self.kill()
        context = mp.get_context()
        self.socket = queue = context.Queue(maxsize=max(2 * self.workers, 2))
        self.pids = [
            context.Process(target=reader, args=(self.dataset, queue, index, self.workers), daemon=True)
            for index in range(self.workers)
        ]
        all_pids.update(self.pids)
        for process in self.pids:
            process.start()
        while self.pids.count(None) < len(self.pids):
            sample = pickle.loads(queue.get())  # noqa: S301 - pickled by our own workers just now
            if isinstance(sample, EOF):
                if self.verbose:
                    log.info("MultiLoader: worker %d finished", sample.index)
                self.pids[sample.index].join(1.0)
                self.pids[sample.index] = None
            else:
                yield sample
