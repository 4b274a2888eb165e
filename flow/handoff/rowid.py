"""Stable 64-bit hashes of key values, the same in any batch, process or machine.

The trainer hashes a channel's label key to tie an impression's rows together
(trainers.data.key_hashes) and to name each row it reads in its audit
(:mod:`flow.handoff.audit`); ``flow handoff verify --audit`` hashes the channel's rows the same
way to prove the audit. One implementation, here, so the two can never disagree.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["bytes_hashes", "mix"]

# A polynomial hash of the bytes modulo 2**64, then splitmix64's finaliser so that keys that
# differ in one byte differ in every bit. 64 bits: two of 10 million keys collide with a chance
# of about 3e-6.
_MULTIPLIER = np.uint64(0x100000001B3)


def mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 values (a copy)."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def bytes_hashes(array: pa.Array) -> np.ndarray:
    """One uint64 per value of a (large) string or binary array, vectorised over its bytes."""
    array = array.cast(pa.large_binary())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[
        array.offset : array.offset + len(array) + 1
    ]
    raw = array.buffers()[2]
    start, end = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(raw, dtype=np.uint8)[start:end].astype(np.uint64)
        if raw
        else np.zeros(0, np.uint64)
    )
    starts = offsets[:-1] - start
    lengths = np.diff(offsets)
    # byte i of its value gets MULTIPLIER ** (its position in the value): a prefix sum of the
    # weighted bytes, taken at the values' ends, minus at their starts, is each value's sum.
    position = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    powers = np.cumprod(np.full(max(int(lengths.max(initial=0)), 1), _MULTIPLIER))
    powers = np.concatenate([[np.uint64(1)], powers[:-1]])
    prefix = np.concatenate([[np.uint64(0)], np.cumsum(data * powers[position], dtype=np.uint64)])
    sums = prefix[starts + lengths] - prefix[starts]
    return mix(sums ^ mix(lengths.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
