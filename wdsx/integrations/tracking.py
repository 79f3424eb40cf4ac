"""A WebLoader seen through a consumer that fetches ahead: the state after the batches *used*.

A loader's ``state_dict()`` counts every batch it has delivered. Trainers fetch batches before
they train on them (Lightning prefetches one to tell an epoch's last batch), so that state is
ahead of the model, and a resume from it would skip the prefetched batches.
:class:`TrackedLoader` remembers the loader's state right after each batch it hands out, and
reports the state after the last batch the consumer says it used (:meth:`TrackedLoader.used`).

It also looks one batch ahead itself, to know which batch is an epoch's last: the state after
that batch is then the state after the epoch, which resumes at the start of the next one (a
state taken just before the loader found its epoch over would resume into the empty rest of
that epoch, and a trainer that counts batches would run an empty epoch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from wdsx.core.errors import NotResumableError
from wdsx.loader.webloader import GLOBAL_FORMAT, WebLoader, gather_states
from wdsx.state.checkpoint import JsonDict

_END = object()


class TrackedLoader:
    """Iterates ``loader`` like the loader itself, and keeps the state after the batches used.

    ``state_dict()`` gathers every rank's state (a ``torch.distributed`` collective when it is
    initialised: call it on every rank, as trainers do when they checkpoint), so whichever rank
    writes the checkpoint, it resumes every rank, on the same or another topology.
    """

    def __init__(self, loader: WebLoader):
        self.loader = loader
        self._after: deque[JsonDict] = deque()
        """The loader's state after each batch handed out and not yet used, oldest first."""
        self._used: JsonDict | None = None
        """The loader's state after the last batch used (None before the first iteration)."""
        self._pending: JsonDict | None = None
        """A loaded state, for the next iteration to start from."""

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        loader = self.loader
        if self._pending is not None:
            loader.load_state_dict(self._pending)
            self._pending = None
        batches = iter(loader)
        self._after.clear()
        self._used = self._current()
        try:
            batch = next(batches, _END)
            while batch is not _END:
                after = self._current()
                following = next(batches, _END)
                self._after.append(self._current() if following is _END else after)
                yield batch
                batch = following
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _current(self) -> JsonDict:
        return self.loader.current_state().to_json()

    def used(self) -> None:
        """The consumer is using the oldest batch handed out and not yet used."""
        if self._after:
            self._used = self._after.popleft()

    def state_dict(self) -> JsonDict:
        """Every rank's loader state after the batches used, as :func:`wdsx.gather_loader_state`
        returns it."""
        reasons = self.loader.not_resumable()
        if reasons:
            raise NotResumableError("this loader cannot be checkpointed exactly: " + "; ".join(reasons))
        pending = self._pending
        if pending is not None and pending.get("format") == GLOBAL_FORMAT:
            return pending  # every rank loaded this same gathered state
        return gather_states(pending or self._used or self.loader.state_dict())

    def load_state_dict(self, state: JsonDict) -> None:
        """Start the next iteration from ``state`` (one rank's or a gathered state)."""
        self._pending = state
        self._used = None
        self._after.clear()
