"""Deterministic randomness whose whole state is a counter.

Every random choice in wdsx is a pure function of (seed, what it is for, how many draws came
before), computed with SplitMix64. A checkpoint therefore stores a draw count instead of a
Mersenne Twister state, and results do not depend on the Python version.
"""

from __future__ import annotations

import hashlib

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
