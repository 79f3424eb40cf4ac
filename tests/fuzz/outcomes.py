"""What a fuzz input can give, and how a reading of it is captured.

Outcome classes (:data:`FAILURES` are the ones that fail a campaign), the same on every
surface (:mod:`tests.fuzz.surfaces`):

``ok``            no error, exactly what the oracle says the input holds;
``error``         a wdsx error, on an input the oracle calls damaged (or over a limit);
``strict``        a wdsx error on an input the oracle reads (wdsx refuses more than the oracle:
                  sparse tar members, Fortran-ordered arrays, a lone zero block before data...);
``tolerated``     no error on a damaged input, and exactly the undamaged input's content
                  (the damage was in bytes the format ignores);
``hang``          the watchdog fired;
``foreign``       an exception that is not the wdsx error the surface's API promises;
``over-memory``   a ``MemoryError`` under the memory cap;
``silent-loss``   no error, and content missing or altered;
``disagreement``  the ways of reading one input disagree (one fails and another does not, or
                  different content);
``crash``         the worker process died.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAILURES = ("hang", "foreign", "over-memory", "silent-loss", "disagreement", "crash")
OUTCOMES = ("ok", "error", "strict", "tolerated", *FAILURES)


class Hang(BaseException):
    """Raised by the watchdog's alarm inside a reading that takes too long."""


@dataclass(frozen=True)
class Reading:
    """What one way of reading gave: a result, or an exception."""

    result: Any = None
    error: BaseException | None = None

    def failed_as(self, *kinds: type[BaseException]) -> bool:
        """Whether the reading raised an exception of all of ``kinds`` (a wdsx error class and
        the standard class the API promises beside it)."""
        return self.error is not None and all(isinstance(self.error, kind) for kind in kinds)


def attempt(read: Callable[[], Any]) -> Reading:
    """Run one reading, capturing any exception but the watchdog's."""
    try:
        return Reading(read())
    except Hang:
        raise
    except BaseException as exn:  # the class of any exception is what is being tested
        return Reading(error=without_tracebacks(exn))


def without_tracebacks(error: BaseException) -> BaseException:
    """``error`` and the errors it chains to, without their tracebacks: a traceback holds the
    reader's frames and buffers in a reference cycle that only a full garbage collection frees,
    and a campaign would grow by megabytes a second."""
    chained: BaseException | None = error
    visited: set[int] = set()
    while chained is not None and id(chained) not in visited:
        visited.add(id(chained))
        chained.__traceback__ = None
        chained = chained.__cause__ or chained.__context__
    return error


def first_failure(readings: dict[str, Reading], *kinds: type[BaseException]) -> tuple[str, str] | None:
    """The outcome of the first reading that ran out of memory or raised something other than
    ``kinds``; None when every reading gave a result or the promised error."""
    for name, reading in readings.items():
        if isinstance(reading.error, MemoryError):
            return "over-memory", f"{name}: MemoryError"
        if reading.error is not None and not reading.failed_as(*kinds):
            return "foreign", f"{name}: {describe_error(reading.error)}"
    return None


def describe_error(error: BaseException, width: int = 200) -> str:
    return f"{type(error).__name__}: {str(error)[:width]}"


def describe(readings: dict[str, Reading]) -> str:
    """One line saying what each reading gave (its error, or the size of its result)."""
    parts = []
    for name, reading in readings.items():
        if reading.error is not None:
            parts.append(f"{name}: {describe_error(reading.error, 100)}")
        else:
            result = reading.result
            parts.append(f"{name}: {len(result) if hasattr(result, '__len__') else result}")
    return "; ".join(parts)
