"""Spark SQL's own arithmetic, reproduced bit for bit where the feature transform depends on it.

Three places where "the same formula" in numpy gives another answer than the compiled Spark SQL:

* ``xxhash64(a, b, ...)`` is XXH64 chained: the seed is 42, each non-null argument is hashed
  with the previous result as its seed, and a null argument is skipped (the hash is unchanged).
  Strings hash their UTF-8 bytes. The result is a signed 64-bit integer.
* ``log1p`` is ``java.lang.StrictMath.log1p``, fdlibm's algorithm: numpy's (the C library's)
  differs in the last bit for about 1 value in 200, and a bucket boundary is a fitted value,
  so one bit moves a row to the neighbouring bucket.
* ``cast(x AS string)``: integers in decimal, booleans ``true``/``false``. A double's text is
  Java's ``Double.toString`` (``1.0E7``, ``4.9E-324`` on JDK 17, where Python says ``5e-324``),
  which is not reproduced here: :func:`string_of` refuses floats and timestamps (see
  :data:`HASHABLE_TYPES`), and the pipeline says so when it is built.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

import xxhash

from flow.pipeline.columns import HASHABLE_TYPES

__all__ = ["HASHABLE_TYPES", "SEED", "log1p", "pmod", "string_of", "xxhash64"]

SEED = 42
"""The seed of Spark's ``xxhash64`` expression (``XxHash64.seed``)."""


_SIGN = 1 << 63


def xxhash64(*values: bytes | None) -> int:
    """Spark's ``xxhash64(v1, v2, ...)`` of already-encoded arguments (None: a null)."""
    hashed = SEED
    for value in values:
        if value is not None:
            hashed = xxhash.xxh64_intdigest(value, seed=hashed)
    return hashed - (1 << 64) if hashed & _SIGN else hashed


def pmod(value: int, divisor: int) -> int:
    """Spark's ``pmod`` for a positive divisor: Python's ``%`` already is non-negative."""
    return value % divisor


def string_of(value: Any) -> str:
    """``cast(value AS string)`` for the :data:`HASHABLE_TYPES` (a value, not None)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    raise TypeError(
        f"cannot reproduce Spark's cast to string of {type(value).__name__} {value!r} outside "
        "Spark; hash or look up string, integer or boolean columns"
    )


def strings(values: Iterable[Any]) -> list[bytes | None]:
    return [None if v is None else string_of(v).encode() for v in values]


# fdlibm 5.3 s_log1p.c, which java.lang.StrictMath.log1p is (FdLibm.Log1p in the JDK).
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LP = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
    1.818357216161805012e-01,
    1.531383769920937332e-01,
    1.479819860511658591e-01,
)


def _high(x: float) -> int:
    """The signed high 32 bits of a double (fdlibm's ``__HI``)."""
    bits: int = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits >> 32


def _with_high(x: float, high: int) -> float:
    """``x`` with its high 32 bits replaced (fdlibm's ``__HI(x) = high``)."""
    low = struct.unpack("<Q", struct.pack("<d", x))[0] & 0xFFFFFFFF
    value: float = struct.unpack("<d", struct.pack("<Q", ((high & 0xFFFFFFFF) << 32) | low))[0]
    return value


def log1p(x: float) -> float:
    """``StrictMath.log1p(x)``, bit for bit: fdlibm's algorithm, transcribed."""
    hx = _high(x)
    ax = hx & 0x7FFFFFFF
    k = 1
    f = 0.0
    hu = 0
    c = 0.0
    if hx < 0x3FDA827A:  # x < 0.41422
        if ax >= 0x3FF00000:  # x <= -1.0
            return -math.inf if x == -1.0 else math.nan
        if ax < 0x3E200000:  # |x| < 2**-29
            if ax < 0x3C900000:  # |x| < 2**-54
                return x
            return x - x * x * 0.5
        if hx > 0 or hx <= -1076707645:  # (int) 0xbfd2bec3: -0.2929 < x < 0.41422
            k = 0
            f = x
            hu = 1
    if hx >= 0x7FF00000:
        return x + x
    if k != 0:
        if hx < 0x43400000:
            u = 1.0 + x
            hu = _high(u)
            k = (hu >> 20) - 1023
            c = 1.0 - (u - x) if k > 0 else x - (u - 1.0)
            c /= u
        else:
            u = x
            hu = _high(u)
            k = (hu >> 20) - 1023
            c = 0.0
        hu &= 0x000FFFFF
        if hu < 0x6A09E:
            u = _with_high(u, hu | 0x3FF00000)  # normalize u
        else:
            k += 1
            u = _with_high(u, hu | 0x3FE00000)  # normalize u/2
            hu = (0x00100000 - hu) >> 2
        f = u - 1.0
    hfsq = 0.5 * f * f
    if hu == 0:  # |f| < 2**-20
        if f == 0.0:
            if k == 0:
                return 0.0
            c += k * _LN2_LO
            return k * _LN2_HI + c
        r = hfsq * (1.0 - 0.66666666666666666 * f)
        if k == 0:
            return f - r
        return k * _LN2_HI - ((r - (k * _LN2_LO + c)) - f)
    s = f / (2.0 + f)
    z = s * s
    lp1, lp2, lp3, lp4, lp5, lp6, lp7 = _LP
    r = z * (lp1 + z * (lp2 + z * (lp3 + z * (lp4 + z * (lp5 + z * (lp6 + z * lp7))))))
    if k == 0:
        return f - (hfsq - s * (hfsq + r))
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + (k * _LN2_LO + c))) - f)
