"""Mixing weights that change as training goes on: schedules over the number of draws.

``Mix(sources, weights=schedule)`` takes, besides fixed weights, a schedule: a function of
``drawn``, the number of outputs the whole job has drawn from the mixture so far in this epoch,
returning one weight per source. Two common shapes come ready-made::

    wdsx.PiecewiseConstant([(0, [1, 1]), (10_000, [1, 3])])  # 1:1, then 1:3 from draw 10 000
    wdsx.PiecewiseLinear([(0, [1, 0]), (10_000, [1, 1])])     # source 1 fades in over 10 000

and any callable ``f(drawn) -> weights`` works too. A schedule must be a pure function of
``drawn`` (the same weights for the same count, in every process), because that is what makes
a resumed or re-dealt mixture continue it exactly: the count is in the checkpoint, the weights
are not. Plain functions and the classes here pickle, so they reach DataLoader workers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

Weights = Sequence[float]
Schedule = Callable[[int], Weights]
"""A function of the number of draws so far to the sources' weights."""
WeightsOrSchedule = Weights | Schedule | None


def _phases(points: Sequence[tuple[int, Weights]]) -> tuple[list[int], list[list[float]]]:
    """The start counts and weight lists of a schedule's phases, checked: counts ascending from
    0, every weight list as long as the first, non-negative, with a positive sum."""
    if not points:
        raise ValueError("a schedule needs at least one (drawn, weights) point")
    starts = [int(start) for start, _ in points]
    weights = [[float(w) for w in ws] for _, ws in points]
    if starts[0] != 0:
        raise ValueError(f"a schedule's first point must be at drawn=0, not {starts[0]}")
    if any(later <= earlier for earlier, later in zip(starts, starts[1:])):
        raise ValueError(f"a schedule's draw counts must increase, got {starts}")
    for ws in weights:
        if len(ws) != len(weights[0]) or any(w < 0 for w in ws) or not sum(ws) > 0:
            raise ValueError(
                f"each point needs {len(weights[0])} non-negative weights with a positive sum, got {ws}"
            )
    return starts, weights


class PiecewiseConstant:
    """Weights that jump: ``[(0, w0), (n1, w1), ...]`` uses ``w0`` for draws ``0..n1-1``,
    ``w1`` from draw ``n1`` on, and so on; the last weights hold for ever."""

    def __init__(self, points: Sequence[tuple[int, Weights]]):
        self.starts, self.weights = _phases(points)

    def __call__(self, drawn: int) -> list[float]:
        return self.weights[bisect.bisect_right(self.starts, drawn) - 1]

    def __repr__(self) -> str:
        return f"PiecewiseConstant({list(zip(self.starts, self.weights))})"


class PiecewiseLinear:
    """Weights that move linearly between points: ``[(0, w0), (n1, w1)]`` goes from ``w0`` at
    draw 0 to ``w1`` at draw ``n1`` (each source's weight interpolated on its own) and stays at
    ``w1`` after it."""

    def __init__(self, points: Sequence[tuple[int, Weights]]):
        self.starts, self.weights = _phases(points)

    def __call__(self, drawn: int) -> list[float]:
        phase = bisect.bisect_right(self.starts, drawn) - 1
        if phase == len(self.starts) - 1:
            return self.weights[phase]
        start, end = self.starts[phase], self.starts[phase + 1]
        fraction = (drawn - start) / (end - start)
        return [a + (b - a) * fraction for a, b in zip(self.weights[phase], self.weights[phase + 1])]

    def __repr__(self) -> str:
        return f"PiecewiseLinear({list(zip(self.starts, self.weights))})"


def describe(weights: WeightsOrSchedule) -> str:
    """The weights or schedule as a checkpoint fingerprint names them: a schedule by its repr
    (a plain function by its qualified name), so that resuming with another schedule is
    noticed."""
    if weights is None or not callable(weights):
        return str(None if weights is None else [float(w) for w in weights])
    if isinstance(weights, PiecewiseConstant | PiecewiseLinear):
        return repr(weights)
    return f"schedule({getattr(weights, '__qualname__', type(weights).__name__)})"


def checked(weights: Sequence[float], sources: int, drawn: int | None = None) -> list[float]:
    """``weights`` as floats, refused unless they are ``sources`` non-negative numbers with a
    positive sum (``drawn``: the count a schedule gave them for)."""
    values = [float(w) for w in weights]
    if len(values) != sources or any(w < 0 for w in values) or not sum(values) > 0:
        where = f" (a schedule's weights at drawn={drawn})" if drawn is not None else ""
        raise ValueError(
            f"weights must be {sources} non-negative numbers with a positive sum{where}, got {values}"
        )
    return values
