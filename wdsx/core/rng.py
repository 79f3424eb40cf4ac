"""Deterministic randomness whose whole state is a counter.

Every random choice in wdsx is a pure function of (seed, what it is for, how many draws came
before), computed with SplitMix64. A checkpoint therefore stores a draw count instead of a
Mersenne Twister state, and results do not depend on the Python version.

Where webdataset's order is a function of a seeded ``random.Random`` (a seeded buffer
shuffle), :class:`CountingRandom` draws the same numbers and keeps its state a count too.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def mix64(value: int) -> int:
    """SplitMix64 finaliser: a well-mixed 64-bit function of a 64-bit integer."""
    value = (value + _GOLDEN) & MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK
    return value ^ (value >> 31)


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any mix of ints and strings, stable across processes and runs."""
    text = "\x1f".join(repr(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def draw(seed: int, counter: int) -> int:
    """The ``counter``-th 64-bit draw of the stream named by ``seed``."""
    return mix64((seed + counter * _GOLDEN) & MASK)


def below(seed: int, counter: int, n: int) -> int:
    """The ``counter``-th draw of stream ``seed`` as an integer in ``range(n)``."""
    return (draw(seed, counter) * n) >> 64


def uniform(seed: int, counter: int) -> float:
    """The ``counter``-th draw of stream ``seed`` as a float in [0, 1)."""
    return (draw(seed, counter) >> 11) * (1.0 / (1 << 53))


def permutation(n: int, seed: int) -> list[int]:
    """A uniformly random permutation of ``range(n)`` (Fisher-Yates)."""
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = below(seed, i, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


_SKIP_CHUNK = 1 << 16
"""Words discarded per call of :meth:`CountingRandom.skip` (a 256 KiB integer)."""


class CountingRandom(random.Random):
    """A ``random.Random`` (Mersenne Twister, so the same numbers as one seeded alike) that
    counts the 32-bit words it draws, so that its state is two numbers: its seed and that count.

    Every draw reaches the generator through :meth:`getrandbits` (``randint``, ``shuffle``,
    ``choice`` and ``sample`` go through ``_randbelow``, which calls it) or :meth:`random`
    (floats and the distributions built on them), the two methods counted here.
    :meth:`skip` brings a freshly seeded generator to where another one stopped.
    """

    words: int

    def seed(self, a: Any = None, version: int = 2) -> None:
        super().seed(a, version)
        self.words = 0

    def getrandbits(self, k: int, /) -> int:
        self.words += (k + 31) // 32
        return super().getrandbits(k)

    def random(self) -> float:
        self.words += 2
        return super().random()

    def skip(self, words: int) -> None:
        """Draw and discard ``words`` 32-bit words, in chunks that keep memory small."""
        while words > 0:
            chunk = min(words, _SKIP_CHUNK)
            self.getrandbits(32 * chunk)
            words -= chunk
