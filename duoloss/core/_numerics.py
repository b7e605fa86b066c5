"""The numerics every core kernel shares: one definition each.

* **Constants**: ``NEG_INF``; ``FLUSH`` (a positive value below it has left, or
  is about to leave, float64's normal range: a rescaled linear-space forward
  records it as "flushed" and then needs the backward sweep's per-frame check);
  ``CHECK_TOL`` (relative tolerance of the per-frame "posteriors sum to one"
  check); ``OK`` / ``FALLBACK`` / ``NAN``, the status codes of one
  forward-backward pass.
* **Log-add**: `logaddexp` (the C library's ``exp``/``log1p``; ``-inf`` is
  the identity, NaN propagates) and `logaddexp_fast` (the same with
  `fast_exp`; the transducer lattice's inner loop).
* **Fast exp**: `fast_exp` / `exp_core`, below; `exp_poly`,
  table-free and branch-free for ``x <= 0.5``, so that loops over arrays of
  exponentials vectorise (about 1 ulp); `log_poly`, its counterpart for
  ``log`` of positive normal numbers.
* **Warm-up flag**: `_compile_both`, set while ``duoloss.warmup`` runs (the
  batch driver itself, Python threads over one kernel, is `duoloss.core._pool`).

An inlinable ``exp`` for the numba kernels (float64, about 0.5 ulp).


Without Intel SVML, ``math.exp`` / ``np.exp`` on scalars inside a numba kernel is
a call into the C library: ~7 ns, and much more inside the score kernels, whose
exponentials sit on a dependency chain (node after node) interleaved with
unpredictable branches.  `fast_exp` is short, branch-free in its range and
inlined by LLVM:

* ``x = (32 k + j) ln2/32 + r`` with ``|r| <= ln2/64`` (the shift trick rounds
  ``x * 32/ln2`` to an integer; ``ln2/32`` is split into a high part with
  trailing zeros, so ``n * _L_HI`` is exact, and a low part);
* ``exp(x) = 2**k * 2**(j/32) * exp(r)``: ``2**(j/32)`` from a 32-entry table
  held as a float64 plus its rounding error (computed with `decimal` at
  import), ``exp(r) - 1`` by its degree-6 Taylor polynomial (truncation error
  below ``4e-18``), and ``2**k`` built from its bits.

Arguments below -708 or above 709, and NaN, go to the C library, so ``-inf``,
``inf``, NaN and subnormal results are exactly the C library's.
``tests/gtn/test_speed_kernels.py`` checks the error against ``mpmath``.

NB: numba's on-disk cache of a kernel that inlines these functions is keyed on the
kernel's own source file: after editing this file, touch every module that imports it (or clear ``__pycache__``) so the kernels are recompiled.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


__all__ = ["CHECK_TOL", "FALLBACK", "FLUSH", "HELPER", "NAN", "NEG_INF", "OK", "exp_core",
           "exp_poly", "fast_exp", "log_poly",
           "logaddexp", "logaddexp_fast", "sequence_ok"]

NEG_INF = -np.inf
FLUSH = 1e-290
CHECK_TOL = 1e-7
OK, FALLBACK, NAN = 0, 1, 2


def _bitcast(name, accepts, src, dst, llvm_dst):
    """A numba intrinsic ``name(x)`` that reinterprets the bits of a ``src``
    value (any ``accepts`` numba type, cast to ``src``) as a ``dst`` value."""
    def reinterpret(typingctx, x):
        if not isinstance(x, accepts):
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_dst)

        return dst(src), codegen

    reinterpret.__name__ = reinterpret.__qualname__ = name
    reinterpret.__doc__ = f"Reinterpret a {src}'s bits as a {dst}."
    return intrinsic(reinterpret)


_bits_to_f64 = _bitcast("_bits_to_f64", types.Integer, types.int64, types.float64,
                        ir.DoubleType())
_f64_to_bits = _bitcast("_f64_to_bits", types.Float, types.float64, types.int64,
                        ir.IntType(64))
_bits_to_f32 = _bitcast("_bits_to_f32", types.Integer, types.int32, types.float32,
                        ir.FloatType())
_f32_to_bits = _bitcast("_f32_to_bits", types.Float, types.float32, types.int32,
                        ir.IntType(32))


@intrinsic
def _fdiv(typingctx, a, b):
    """float64 ``a / b`` by IEEE rules (no zero-divisor check): numba's ``/``
    tests the divisor and raises ``ZeroDivisionError``, and that branch keeps a
    loop around it from vectorising (`log_poly`).  The quotient is correctly
    rounded either way: the same bits."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        x = context.cast(builder, args[0], signature.args[0], types.float64)
        y = context.cast(builder, args[1], signature.args[1], types.float64)
        return builder.fdiv(x, y)

    return types.float64(a, b), codegen


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


# 2**(j/32) as a float64 and its rounding error, and ln2/32 in two parts (from
# _tables(), which computes them with decimal at 50 digits; a test checks they agree)
_T_HI = np.array([float.fromhex(h) for h in (
    "0x1.0000000000000p+0", "0x1.059b0d3158574p+0", "0x1.0b5586cf9890fp+0",
    "0x1.11301d0125b51p+0", "0x1.172b83c7d517bp+0", "0x1.1d4873168b9aap+0",
    "0x1.2387a6e756238p+0", "0x1.29e9df51fdee1p+0", "0x1.306fe0a31b715p+0",
    "0x1.371a7373aa9cbp+0", "0x1.3dea64c123422p+0", "0x1.44e086061892dp+0",
    "0x1.4bfdad5362a27p+0", "0x1.5342b569d4f82p+0", "0x1.5ab07dd485429p+0",
    "0x1.6247eb03a5585p+0", "0x1.6a09e667f3bcdp+0", "0x1.71f75e8ec5f74p+0",
    "0x1.7a11473eb0187p+0", "0x1.82589994cce13p+0", "0x1.8ace5422aa0dbp+0",
    "0x1.93737b0cdc5e5p+0", "0x1.9c49182a3f090p+0", "0x1.a5503b23e255dp+0",
    "0x1.ae89f995ad3adp+0", "0x1.b7f76f2fb5e47p+0", "0x1.c199bdd85529cp+0",
    "0x1.cb720dcef9069p+0", "0x1.d5818dcfba487p+0", "0x1.dfc97337b9b5fp+0",
    "0x1.ea4afa2a490dap+0", "0x1.f50765b6e4540p+0",
)])
_T_LO = np.array([float.fromhex(h) for h in (
    "0x0.0p+0", "0x1.d73e2a475b465p-55", "0x1.8a62e4adc610bp-54",
    "-0x1.6c51039449b3ap-54", "-0x1.19041b9d78a76p-55", "0x1.e016e00a2643cp-54",
    "0x1.9b07eb6c70573p-54", "0x1.612e8afad1255p-55", "0x1.6f46ad23182e4p-55",
    "-0x1.63aeabf42eae2p-54", "0x1.ada0911f09ebcp-55", "0x1.89b7a04ef80d0p-59",
    "0x1.d4397afec42e2p-56", "-0x1.07abe1db13cadp-55", "0x1.6324c054647adp-54",
    "-0x1.383c17e40b497p-54", "-0x1.bdd3413b26456p-54", "-0x1.16e4786887a99p-55",
    "-0x1.41577ee04992fp-55", "-0x1.d4c1dd41532d8p-54", "0x1.6e9f156864b27p-54",
    "-0x1.75fc781b57ebcp-57", "0x1.c7c46b071f2bep-56", "-0x1.d2f6edb8d41e1p-54",
    "0x1.7a1cd345dcc81p-54", "-0x1.5584f7e54ac3bp-56", "0x1.11065895048ddp-55",
    "0x1.503cbd1e949dbp-56", "0x1.2ed02d75b3707p-55", "-0x1.1a5cd4f184b5cp-54",
    "-0x1.e9c23179c2893p-54", "0x1.9d3e12dd8a18bp-54",
)])
_L_HI = float.fromhex("0x1.62e42fef80000p-6")
_L_LO = float.fromhex("0x1.1cf79abc9e3b4p-41")
_INV_L = float.fromhex("0x1.71547652b82fep+5")
_SHIFT = 6755399441055744.0           # 1.5 * 2**52: x + _SHIFT rounds x to an integer
_SHIFT_BITS = 0x4338000000000000      # its bits (low 32 bits zero)
_C2 = 1.0 / 2
_C3 = 1.0 / 6
_C4 = 1.0 / 24
_C5 = 1.0 / 120
_C6 = 1.0 / 720


#: ``numba.njit`` options of a helper that only other kernels call, never Python: no
#: CPython or C entry points to generate and compile for it (a first call's compile
#: time, issue 19).  Calling one from Python raises numba's error.
HELPER = {"cache": True, "nogil": True, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}


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


@numba.njit(cache=True, nogil=True, inline="always")
def fast_exp(x):
    """``exp(x)`` for any float64 (about 0.5 ulp; the C library's outside [-708, 709])."""
    if -708.0 <= x <= 709.0:
        return exp_core(x)
    return math.exp(x)   # overflow, underflow / subnormal results, +-inf, NaN


_LOG2E = 1.4426950408889634
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")   # ln 2 with 32 trailing zero bits
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
# 1/k! for the degree-13 Taylor polynomial of exp on |r| <= ln2/2 (truncation
# below 5e-18 relative)
_E13 = tuple(1.0 / math.factorial(k) for k in range(14))


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def exp_poly(x):
    """``exp(x)`` for ``x <= 0.5``: 0 below -708, NaN for NaN (about 1 ulp).

    No table and no branch (selects only), so a loop over an array of these
    vectorises, unlike `exp_core`'s table lookups: ``x = k ln2 + r`` with
    ``|r| <= ln2/2`` by the shift trick, ``exp(r)`` by its degree-13 Taylor
    polynomial (Horner), ``2**k`` from its bits.
    """
    xc = x if not x < -708.0 else -708.0
    kd = xc * _LOG2E + _SHIFT
    k = _f64_to_bits(kd) - _SHIFT_BITS
    kd -= _SHIFT
    r = (xc - kd * _LN2_HI) - kd * _LN2_LO
    p = _E13[13]
    p = p * r + _E13[12]
    p = p * r + _E13[11]
    p = p * r + _E13[10]
    p = p * r + _E13[9]
    p = p * r + _E13[8]
    p = p * r + _E13[7]
    p = p * r + _E13[6]
    p = p * r + _E13[5]
    p = p * r + _E13[4]
    p = p * r + _E13[3]
    p = p * r + _E13[2]
    p = p * r + 1.0
    p = p * r + 1.0
    e = p * _bits_to_f64((k + 1023) << 52)
    return e if not x < -708.0 else 0.0


_MANT_MASK = (1 << 52) - 1
_ONE_BITS = 1023 << 52
_SQRT2 = math.sqrt(2.0)
# 2/(2k+1): log f = z * sum_k 2/(2k+1) z**(2k), z = (f-1)/(f+1), |z| <= 0.1716
_L12 = tuple(2.0 / (2 * k + 1) for k in range(12))


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def log_poly(x):
    """``log(x)`` for a positive normal finite float64 ``x`` (about 1 ulp; no
    check: zero, subnormal, inf and NaN give garbage, the caller screens them).

    Table-free and branch-free, so a loop over an array of these vectorises:
    ``x = 2**k f`` with ``f`` in ``[sqrt(1/2), sqrt(2))`` from the bits,
    ``log f = 2 atanh(z)``, ``z = (f - 1)/(f + 1)``, by its odd series to
    ``z**23`` (truncation below 1e-18), ``k ln2`` in two parts.
    """
    bits = _f64_to_bits(x)
    k = (bits >> 52) - 1023
    f = _bits_to_f64((bits & _MANT_MASK) | _ONE_BITS)
    big = f > _SQRT2
    f = f * 0.5 if big else f
    k = k + 1 if big else k
    z = _fdiv(f - 1.0, f + 1.0)  # f + 1 >= 1.7: never a zero divisor
    z2 = z * z
    p = _L12[11]
    p = p * z2 + _L12[10]
    p = p * z2 + _L12[9]
    p = p * z2 + _L12[8]
    p = p * z2 + _L12[7]
    p = p * z2 + _L12[6]
    p = p * z2 + _L12[5]
    p = p * z2 + _L12[4]
    p = p * z2 + _L12[3]
    p = p * z2 + _L12[2]
    p = p * z2 + _L12[1]
    p = p * z2 + _L12[0]
    kd = np.float64(k)
    return kd * _LN2_HI + (kd * _LN2_LO + z * p)


@numba.njit(cache=True, nogil=True, inline="always")
def logaddexp(a, b):
    """``log(exp(a) + exp(b))`` with the C library's ``exp``; ``-inf`` is the identity."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@numba.njit(cache=True, nogil=True, inline="always")
def logaddexp_fast(a, b):
    """``log(exp(a) + exp(b))`` with `fast_exp`; ``-inf`` is the identity, NaN propagates."""
    if a < b:
        a, b = b, a
    if b == NEG_INF:
        return a
    return a + math.log1p(fast_exp(b - a))


@numba.njit(cache=True, nogil=True, inline="always")
def sequence_ok(targets, b, input_len, target_len, t_max, n_cls, blank, has_blank):
    """Memory safety of sequence ``b`` before a trellis kernel reads it: lengths
    in range and every label of its target in ``[0, n_cls)``; with
    ``has_blank`` the blank must lie in ``[0, n_cls)`` and appear in no target
    (ASG has no blank).  A sequence that fails gets NaN, never an out-of-bounds read."""
    ok = (0 <= input_len <= t_max and 0 <= target_len <= targets.shape[1]
          and (not has_blank or 0 <= blank < n_cls))
    if ok:
        for i in range(target_len):
            y = targets[b, i]
            if y < 0 or y >= n_cls or (has_blank and y == blank):
                ok = False
    return ok


#: Set by ``duoloss.warmup`` while it runs: the drivers then also call each
#: family's lazily compiled kernels (the exact log-space fallbacks, the
#: bounded-memory aligners) with an empty batch, so that they compile (and are
#: cached) with the signatures real calls use.
_compile_both = False
