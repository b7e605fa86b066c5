"""An inlinable ``exp`` for the numba kernels (float64, about 0.5 ulp).

Without Intel SVML, ``math.exp`` / ``np.exp`` on scalars inside a numba kernel is
a call into the C library: ~7 ns, and much more inside the score kernels, whose
exponentials sit on a dependency chain (node after node) interleaved with
unpredictable branches.  :func:`fast_exp` is short, branch-free in its range and
inlined by LLVM:

* ``x = (32 k + j) ln2/32 + r`` with ``|r| <= ln2/64`` (the shift trick rounds
  ``x * 32/ln2`` to an integer; ``ln2/32`` is split into a high part with
  trailing zeros, so ``n * _L_HI`` is exact, and a low part);
* ``exp(x) = 2**k * 2**(j/32) * exp(r)``: ``2**(j/32)`` from a 32-entry table
  held as a float64 plus its rounding error (computed with :mod:`decimal` at
  import), ``exp(r) - 1`` by its degree-6 Taylor polynomial (truncation error
  below ``4e-18``), and ``2**k`` built from its bits.

Arguments below -708 or above 709, and NaN, go to the C library, so ``-inf``,
``inf``, NaN and subnormal results are exactly the C library's.
``tests/gtn/test_speed_kernels.py`` checks the error against ``mpmath``.

NB: numba's on-disk cache of a kernel that inlines these functions is keyed on the
kernel's own source file: after editing this file, touch ``_graph_kernels.py`` (or
clear ``__pycache__``) so the kernels are recompiled.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["fast_exp", "exp_core"]


@intrinsic
def _bits_to_f64(typingctx, x):
    """Reinterpret an int64's bits as a float64."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _f64_to_bits(typingctx, x):
    """Reinterpret a float64's bits as an int64."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


def _tables():
    with localcontext() as ctx:
        ctx.prec = 50
        two = Decimal(2)
        hi = np.empty(32)
        lo = np.empty(32)
        for j in range(32):
            t = two ** (Decimal(j) / 32)   # correctly rounded to 50 digits
            hi[j] = float(t)
            lo[j] = float(t - Decimal(hi[j]))
        ln2_32 = two.ln() / 32
        # high part: 35 significant bits, so n * _L_HI is exact for |n| < 2**18
        m, e = math.frexp(float(ln2_32))
        l_hi = math.ldexp(math.floor(math.ldexp(m, 35)), e - 35)
        l_lo = float(ln2_32 - Decimal(l_hi))
        inv = float(32 / two.ln())
    return hi, lo, l_hi, l_lo, inv


_T_HI, _T_LO, _L_HI, _L_LO, _INV_L = _tables()
_SHIFT = 6755399441055744.0           # 1.5 * 2**52: x + _SHIFT rounds x to an integer
_SHIFT_BITS = 0x4338000000000000      # its bits (low 32 bits zero)
_C2 = 1.0 / 2
_C3 = 1.0 / 6
_C4 = 1.0 / 24
_C5 = 1.0 / 120
_C6 = 1.0 / 720


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def exp_core(x):
    """``exp(x)`` for ``-708 <= x <= 709`` (no checks: the caller guarantees it)."""
    kd = x * _INV_L + _SHIFT
    ki = _f64_to_bits(kd) - _SHIFT_BITS     # n = round(x * 32 / ln2)
    kd -= _SHIFT
    r = (x - kd * _L_HI) - kd * _L_LO
    j = ki & 31
    scale = _bits_to_f64(((ki >> 5) + 1023) << 52)
    r2 = r * r
    p = r + r2 * (_C2 + r * _C3) + (r2 * r2) * (_C4 + r * _C5 + r2 * _C6)
    th = _T_HI[j]
    return scale * (th + (_T_LO[j] + th * p))


@numba.njit(cache=True, nogil=True)
def fast_exp(x):
    """``exp(x)`` for any float64 (about 0.5 ulp; the C library's outside [-708, 709])."""
    if -708.0 <= x <= 709.0:
        return exp_core(x)
    return math.exp(x)   # overflow, underflow / subnormal results, +-inf, NaN
