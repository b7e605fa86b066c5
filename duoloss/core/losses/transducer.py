r"""The transducer lattice recursion (RNN-T and its variants) on numpy buffers.

Every transducer loss here is one recursion over an ``(S + 1) x (T + 1)``
lattice whose two kinds of moves carry log-probabilities that the *framework*
has already gathered from the joiner's output (k2's formulation): the host
never sees the ``V`` axis.

Shapes: ``N`` sequences, ``S`` padded symbol positions, ``T`` padded frames.

* ``px``: ``(N, S, T + 1)`` for ``rnnt_type='regular'``, ``(N, S, T)`` for
  ``'modified'`` and ``'constrained'``; ``px[b, s, t]`` is the log-probability
  of the move that emits symbol ``s`` (0-based) from lattice node ``(s, t)``;
* ``py``: ``(N, S + 1, T)``; ``py[b, s, t]`` is the log-probability of the move
  ``(s, t) -> (s, t + 1)`` (the blank / termination symbol: next frame);
* ``boundary``: ``(N, 4)`` int64 rows ``[s_begin, t_begin, s_end, t_end]``
  with ``0 <= s_begin <= s_end <= S`` and ``0 <= t_begin <= t_end <= T``.

The recursion is exactly k2's ``mutual_information_recursion``:

.. math::

    p_{s_0, t_0} = 0, \qquad
    p_{s,t} = \operatorname{logaddexp}\left(p_{s-1,t} + px_{s-1,t},\;
        p_{s,t-1} + py_{s,t-1}\right) \quad \text{(regular)},

    p_{s,t} = \operatorname{logaddexp}\left(p_{s-1,t-1} + px_{s-1,t-1},\;
        p_{s,t-1} + py_{s,t-1}\right) \quad \text{(modified, constrained)},

over ``s_begin <= s <= s_end``, ``t_begin <= t <= t_end`` (terms outside the
box are ``-inf``), and the loss is the per-sequence NEGATIVE log-likelihood

.. math::

    \text{loss}_b = -p_{s_{end}, t_{end}}.

(k2 returns $+p$; its ``rnnt_loss`` negates it.)  ``'constrained'``
differs from ``'modified'`` only in how k2 builds ``px`` (it adds the next
context's blank, ``px += py[:, 1:]``); the recursion is the same.

NB: as in k2, nothing here forbids a regular path from using
``px[b, :, t_end]`` (a symbol emitted on the "one-past-the-last" frame): an
RNN-T frontend sets that column to ``-inf`` (k2's ``fix_for_boundary``).

Gradients: ``d loss_b / d px[b, s, t]`` is minus the posterior probability
(occupation) of that move,
``-exp(p[s, t] + px[s, t] + q[s+1, t'] - p[s_end, t_end])`` with ``q`` the
backward (suffix) scores and ``t' = t`` (regular) or ``t + 1`` (modified);
likewise for ``py``.  They are exactly zero outside each sequence's box.

NB (NaN/inf policy): ``-inf`` log-probabilities are valid (probability zero)
and never produce NaN.  A sequence with no path of finite score (e.g. a
modified lattice with ``s_end - s_begin > t_end - t_begin``) gets loss
``+inf`` and zero gradients.  A NaN inside a sequence's box makes its loss and
its gradients (inside the box) NaN and leaves the other sequences unchanged;
entries outside the box are never read.  An invalid ``boundary`` row (possible
only for traced values) gives that sequence a NaN loss and NaN gradients,
never an out-of-bounds read.

Implementation: a rescaled *linear-space* forward-backward in float64 (inputs
are read in their own float32/float64 dtype), parallel over the batch, with the
exact log-space recursion as its safety net (the same design as CTC's kernel,
see `duoloss.core.losses.ctc`).  The sweep runs over *levels* of the lattice:
anti-diagonals ``(s - s_begin) + (t - t_begin)`` for ``'regular'`` (every move
goes from one to the next) and frames ``t`` for ``'modified'``/``'constrained'``
(every move advances one frame), so every path crosses every level exactly once.
Each move's probability is exponentiated once, relative to the largest move
of the box (one `exp_poly` per move, a vectorised pass; nothing
transcendental in the recursions themselves); each level of the forward is
scaled by a power of two (exact) and the exponents summed; the backward reuses
the stored move probabilities.  At every level the backward checks that the
posteriors sum to one (``sum alpha * beta = Z``, relative tolerance ``1e-7``);
the move posteriors (the gradients) are ``alpha * e(move) * beta / r`` with
``r`` that level's sum.  The sweeps are branch-free loops over each level's
cells, stored level by level with guard entries (see the comment above
`_window`), vectorised along the level; every sum has a fixed order, so the
results do not depend on the CPU's vector width.

The loss is the same number whether or not a gradient is asked for.  The
forward records whether any positive value left float64's normal range
("flushed": a move probability or a product of cells below ``1e-290``).  If
nothing was flushed, the rescaled forward is exact and its log Z is the loss
(should the backward's check fail, only the gradient is recomputed in log
space).  If something was flushed (a cell far below its level's bulk that
later carries the posterior mass), the backward's per-level check decides --
it also runs, without writing a gradient, when no gradient was asked for -- and
a failed check sends loss and gradients to the exact log-space recursion
(one ``log1p`` and one `fast_exp` per cell and move), as does any NaN or
``+inf`` score, a level whose mass falls below ``1e-200``, an invalid
``boundary`` row and an infeasible modified box.  The lattice is tiny next to
the joiner output (``S T`` versus ``S T V``), so the framework's
``log_softmax`` dominates the cost of a full RNN-T loss.

References:
  Graves, "Sequence Transduction with Recurrent Neural Networks",
  arXiv:1211.3711, 2012.
  Kuang, Guo, Kang, Lin, Luo, Povey, "Pruned RNN-T for fast, memory-efficient
  ASR training", arXiv:2206.13236, 2022 (k2's formulation and ``boundary``).
"""
from __future__ import annotations

import math

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

# NB: the kernels inline fast_exp; numba's on-disk cache is keyed on this
# file's mtime only, so touch it after editing _numerics.py.
from .._numerics import CHECK_TOL as _CHECK_TOL
from .._numerics import FLUSH as _FLUSH
from .._numerics import NEG_INF as _NEG_INF
from .. import _numerics
from .._numerics import HELPER, _bits_to_f64, _f64_to_bits, exp_poly, fast_exp
from .._pool import run_batch
from .._numerics import logaddexp_fast as _lae
from .._spec import LossKernel

__all__ = [
    "RNNT_FLOAT_DTYPES",
    "RNNT_TYPES",
    "check_rnnt_args",
    "check_rnnt_options",
    "rnnt_alignment",
    "TRANSDUCER_KERNEL",
    "transducer_loss_and_grad",
    "transducer_viterbi",
]

#: The lattice topologies (k2's names).
RNNT_TYPES = ("regular", "modified", "constrained")

_PARALLEL_MIN_CELLS = 20_000
# The linear sweep gives up (exact log space recomputes) when a level's mass
# falls below this: float64's range ends near 1e-308.
_TINY = 1e-200
# ln 2 in two parts: k * _LN2_HI is exact for |k| < 2**20
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")


@numba.njit(cache=True, nogil=True, inline="always")
def _box(bd, b):
    """Sequence ``b``'s box ``(s0, t0, s1, t1)`` and its size ``(ns, nt)``."""
    s0 = bd[b, 0]
    t0 = bd[b, 1]
    s1 = bd[b, 2]
    t1 = bd[b, 3]
    return s0, t0, s1, t1, s1 - s0 + 1, t1 - t0 + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _box_ok(bd, b, n_s, n_t):
    s0, t0, s1, t1, _, _ = _box(bd, b)
    return 0 <= s0 and s0 <= s1 and s1 <= n_s and 0 <= t0 and t0 <= t1 and t1 <= n_t


@numba.njit(cache=True, nogil=True, inline="always")
def _fill_box(g, b, s0, s1, t0, t1, value):
    for s in range(s0, s1):
        for t in range(t0, t1):
            g[b, s, t] = value


@numba.njit(cache=True, nogil=True, inline="always")
def _max_nan(a, b):
    """max(a, b) with NaN propagating."""
    if a != a or b != b:
        return np.nan
    return a if a >= b else b


@numba.njit(cache=True, nogil=True, inline="always")
def _lattice_forward(b, px, py, s0, t0, ns, nt, modified, tropical):
    """Forward table ``table[i, j]`` of lattice node ``(s0 + i, t0 + j)`` over the box.

    One recursion in two semirings: ``tropical=False`` sums paths (log space:
    `_one`'s exact fallback), ``tropical=True`` keeps the best one (NaN
    propagating: `_viterbi_one`).  Callers pass the semiring as a literal,
    so after inlining LLVM drops the other branch.
    """
    table = np.empty((ns, nt))
    for i in range(ns):
        s = s0 + i
        for j in range(nt):
            t = t0 + j
            if i == 0 and j == 0:
                v = 0.0
            else:
                v = _NEG_INF
                if j > 0:
                    v = table[i, j - 1] + np.float64(py[b, s, t - 1])
                if i > 0 and (j > 0 or not modified):
                    if modified:
                        w = table[i - 1, j - 1] + np.float64(px[b, s - 1, t - 1])
                    else:
                        w = table[i - 1, j] + np.float64(px[b, s - 1, t])
                    v = _max_nan(v, w) if tropical else _lae(v, w)
            table[i, j] = v
    return table


@numba.njit(cache=True, nogil=True)
def _one(b, px, py, bd, modified, want_x, want_y, losses, gx, gy):
    """Loss (and gradients) of sequence ``b``; ``gx``/``gy`` are zero on entry."""
    n_s = py.shape[1] - 1
    n_t = py.shape[2]
    if not _box_ok(bd, b, n_s, n_t):
        losses[b] = np.nan
        if want_x:
            _fill_box(gx, b, 0, gx.shape[1], 0, gx.shape[2], np.nan)
        if want_y:
            _fill_box(gy, b, 0, gy.shape[1], 0, gy.shape[2], np.nan)
        return
    s0, t0, s1, t1, ns, nt = _box(bd, b)
    # alpha[i, j] = p[s0 + i, t0 + j]
    alpha = _lattice_forward(b, px, py, s0, t0, ns, nt, modified, False)
    total = alpha[ns - 1, nt - 1]
    losses[b] = -total
    if not (want_x or want_y):
        return
    if total != total:
        if want_x:
            _fill_box(gx, b, s0, s1, t0, min(t1 + 1, gx.shape[2]), np.nan)
        if want_y:
            _fill_box(gy, b, s0, s1 + 1, t0, t1, np.nan)
        return
    if total == _NEG_INF:
        return  # infeasible: loss +inf, zero gradients
    # Backward (suffix) scores, two rows: nxt = q[s + 1, :], cur = q[s, :].
    nxt = np.full(nt + 1, _NEG_INF)
    cur = np.full(nt + 1, _NEG_INF)
    for i in range(ns - 1, -1, -1):
        s = s0 + i
        cur[nt] = _NEG_INF
        for j in range(nt - 1, -1, -1):
            t = t0 + j
            a = alpha[i, j]
            if i == ns - 1 and j == nt - 1:
                q = 0.0
            else:
                q = _NEG_INF
                if j < nt - 1:
                    w = np.float64(py[b, s, t]) + cur[j + 1]
                    if want_y:
                        gy[b, s, t] = -fast_exp(a + w - total)
                    q = w
                if i < ns - 1:
                    if not modified:
                        w = np.float64(px[b, s, t]) + nxt[j]
                        if want_x:
                            gx[b, s, t] = -fast_exp(a + w - total)
                        q = _lae(q, w)
                    elif j < nt - 1:
                        w = np.float64(px[b, s, t]) + nxt[j + 1]
                        if want_x:
                            gx[b, s, t] = -fast_exp(a + w - total)
                        q = _lae(q, w)
            cur[j] = q
        for j in range(nt + 1):
            nxt[j] = cur[j]


# --------------------------------------------------------------------------- #
# Linear space (rescaled) forward-backward, along the wavefront                #
# --------------------------------------------------------------------------- #
# Layout and vectorisation (issue 36).  The sweeps run over *levels* (anti-
# diagonals for 'regular', frames for 'modified'), and every array they touch is
# stored level by level, each level a row indexed by the symbol offset ``i``
# plus one guard entry on each side: ``e[L + 1, i + 1]`` is the probability of
# a move out of cell ``i`` of level ``L`` (``ey``: blank, ``ex``: symbol),
# ``alpha[L, i + 1]`` the forward score.  Both moves into cell ``i`` of level
# ``L`` come from level ``L - 1``, at ``i`` (blank) and ``i - 1`` (symbol), in
# both topologies, so one level is
#
#     alpha[L, k] = alpha[L - 1, k] * ey[L, k] + alpha[L - 1, k - 1] * ex[L, k - 1]
#
# over a contiguous range of ``k``: unit-stride loads, no branch, no gather (the
# exponential pass gathers each move once, from ``px``/``py``, into this
# layout).  Entries just outside a level's window are zeros written with it
# (never a stale value: 0 * NaN), so no bound is tested inside the loops.
#
# Why along the wavefront and not across sequences (8 sequences per vector):
# measured single-thread, interleaved, forward sweep only, float64, 8 sequences of
# the *same* box (the lockstep's best case; 2026-11-28, AMD EPYC with AVX-512, a
# loaded machine), the wavefront took 1.5 / 2.3 / 4.0 ns per cell at (T, U) =
# (150, 40) / (300, 60) / (150, 5) and a lockstep sweep in [level, i, sequence]
# layout 2.9 / 5.8 / 3.0: the lockstep only wins for very short targets, where a
# level holds a handful of cells.  Besides, sequences have their own boxes
# (lengths), scales and fall-backs: in lockstep every lane runs the longest box,
# and the batch's sequences no longer run one at a time (the fused RNN-T kernel
# keeps a sequence's logits in cache between its two passes; `run_batch`
# balances threads per sequence).  A level holds up to ``U + 1`` cells (41 at
# U = 40): 5 AVX-512 vectors of float64, 10 of AVX2.
#
# Scaling: each level is rescaled by a power of two (its maximum's exponent), so
# the rescaling is exact and the scales are integers; nothing transcendental is
# left in the sweeps (one log for the loss).  Reductions (the per-level sum of
# the backward check) run in a fixed layout of 8 lanes (`_lane_sum`); maxima
# are exact in any order: the results are the same bits whatever the vector
# width the CPU offers (tests/test_transducer_vectorised.py, AVX2 against the
# host).  No fastmath reassociation anywhere.
_EXP_MASK = 0x7FF


@numba.njit(cache=True, nogil=True, inline="always")
def _window(lev, ns, nt, modified):
    """Cells ``i`` (symbol offset) of level ``lev`` that lie on a complete path."""
    if modified:  # level = frame offset j; i <= j and the end stays reachable
        return max(0, ns - nt + lev), min(ns - 1, lev)
    return max(0, lev - (nt - 1)), min(ns - 1, lev)  # level = i + j (anti-diagonal)


@numba.njit(cache=True, nogil=True, inline="always")
def _level_moves(lev, ns, nt, modified):
    """``(lo, hi, ylo, xhi)``: level ``lev``'s window; its cells ``[ylo, hi]``
    have a blank move and ``[lo, xhi]`` a symbol move that stays on a complete
    path."""
    lo, hi = _window(lev, ns, nt, modified)
    c = nt - ns if modified else nt - 1
    return lo, hi, max(lo, lev - c + 1), min(hi, ns - 2)


@numba.njit(cache=True, nogil=True, inline="always")
def _moves(i, ns, nt, modified):
    """Frame offsets ``[ylo, yhi)`` of the blank moves and ``[xlo, xhi)`` of the
    symbol moves out of row ``i`` of the box that lie on a complete path."""
    if modified:  # cells (i, j) with i <= j <= i + nt - ns
        ylo, yhi = i, i + nt - ns
        xlo, xhi = i, i + nt - ns + 1
    else:
        ylo, yhi = 0, nt - 1
        xlo, xhi = 0, nt
    if i == ns - 1:
        xhi = xlo
    return ylo, yhi, xlo, xhi


@numba.njit(cache=True, nogil=True, inline="always")
def _row_max(a, b, s, t0, lo, hi, m, nan):
    """``(m, nan)`` updated with the moves ``a[b, s, t0 + lo:t0 + hi]``: the
    running maximum and the count of NaNs (a vectorised loop)."""
    for j in range(lo, hi):
        w = np.float64(a[b, s, t0 + j])
        nan += w != w
        m = w if w > m else m
    return m, nan


@intrinsic
def _lanes8_sum(typingctx, v, n):
    """float64 ``sum(v[:n])`` of a C-contiguous 1-D float32/float64 array in a
    fixed order, written as LLVM vectors so that it vectorises without
    reassociation: blocks of 32 entries go to four ``<8 x double>``
    accumulators (entry ``32 j + 8 q + l`` to accumulator ``q``, lane ``l``),
    up to three more blocks of 8 to accumulators 0, 1, 2; then ``(a0 + a1) +
    (a2 + a3)`` lane by lane, the 8 lanes as a balanced tree, and the last
    ``n % 8`` entries in order.  AVX-512 holds an accumulator in one register,
    AVX2 in two; either way every lane sees the same additions in the same
    order: the same bits on any CPU.  (LLVM leaves the scalar form of such
    lanes scalar; this runs 2-5x faster.)  ``n`` must not exceed ``v``'s
    length (unchecked)."""
    if not (isinstance(v, types.Array) and v.ndim == 1 and v.layout == "C"
            and isinstance(v.dtype, types.Float) and isinstance(n, types.Integer)):
        return None
    sig = types.float64(v, n)

    def codegen(context, builder, signature, args):
        vty = signature.args[0]
        data = context.make_array(vty)(context, builder, args[0]).data
        count = context.cast(builder, args[1], signature.args[1], types.int64)
        i64 = ir.IntType(64)
        f64 = ir.DoubleType()
        wide = vty.dtype.bitwidth == 32
        vin = ir.VectorType(context.get_data_type(vty.dtype), 8)
        vd = ir.VectorType(f64, 8)
        align = vty.dtype.bitwidth // 8

        def load8(start):
            ptr = builder.gep(data, [start])
            x = builder.load(builder.bitcast(ptr, vin.as_pointer()), align=align)
            return builder.fpext(x, vd) if wide else x

        acc = [cgutils.alloca_once_value(builder, ir.Constant(vd, None)) for _ in range(4)]
        big = builder.sdiv(count, ir.Constant(i64, 32))
        with cgutils.for_range(builder, big) as loop:
            base = builder.mul(loop.index, ir.Constant(i64, 32))
            for q in range(4):
                x = load8(builder.add(base, ir.Constant(i64, 8 * q)))
                builder.store(builder.fadd(builder.load(acc[q]), x), acc[q])
        done = builder.mul(big, ir.Constant(i64, 32))
        rest = builder.sdiv(builder.sub(count, done), ir.Constant(i64, 8))  # 0 to 3 blocks
        for q in range(3):
            with builder.if_then(builder.icmp_signed(">", rest, ir.Constant(i64, q))):
                x = load8(builder.add(done, ir.Constant(i64, 8 * q)))
                builder.store(builder.fadd(builder.load(acc[q]), x), acc[q])
        add = builder.fadd
        a = add(add(builder.load(acc[0]), builder.load(acc[1])),
                add(builder.load(acc[2]), builder.load(acc[3])))
        ln = [builder.extract_element(a, ir.Constant(ir.IntType(32), k)) for k in range(8)]
        total = cgutils.alloca_once_value(
            builder, add(add(add(ln[0], ln[1]), add(ln[2], ln[3])),
                         add(add(ln[4], ln[5]), add(ln[6], ln[7]))))
        done = builder.add(done, builder.mul(rest, ir.Constant(i64, 8)))
        with cgutils.for_range(builder, builder.sub(count, done)) as loop:
            x = builder.load(builder.gep(data, [builder.add(done, loop.index)]))
            if wide:
                x = builder.fpext(x, f64)
            builder.store(builder.fadd(builder.load(total), x), total)
        return builder.load(total)

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _lane_sum(v, n):
    """float64 ``sum(v[:n])`` (``v`` C-contiguous 1-D, float32 or float64) in a
    fixed order of lanes (`_lanes8_sum`): the same bits on any CPU."""
    return _lanes8_sum(v, n)


@numba.njit(cache=True, nogil=True, inline="always")
def _row_peak(v, n):
    """``max(v[:n])`` for ``n >= 1`` values ``>= 0`` (exact in any order)."""
    m = 0.0
    for k in range(n):
        x = v[k]
        m = x if x > m else m
    return m


@numba.njit(cache=True, nogil=True, inline="always")
def _exponent(x):
    """``e`` with ``x = f 2**e``, ``0.5 <= f < 1``, for a positive normal float64."""
    return ((_f64_to_bits(x) >> 52) & _EXP_MASK) - 1022


@numba.njit(cache=True, nogil=True, inline="always")
def _pow2(e):
    """``2.0**e`` for ``-1022 <= e <= 1023`` (exact, from the bits)."""
    return _bits_to_f64((e + 1023) << 52)


@numba.njit(**HELPER, fastmath={"contract"})
def _exp_row(a, b, s, t0, lo, hi, m, out):
    """``out[k] = exp(a[b, s, t0 + lo + k] - m)`` for ``k < hi - lo`` (unit
    stride: a vectorised loop); returns how many moves of nonzero probability
    fell below ``_FLUSH``."""
    n_flush = 0
    row = a[b, s, t0 + lo:t0 + hi]
    for k in range(hi - lo):
        d = np.float64(row[k]) - m
        e = exp_poly(d)
        out[k] = e
        n_flush += (e < _FLUSH) & (d > _NEG_INF)
    return n_flush


@numba.njit(**HELPER)
def _skew_row(e, i, step, jlo, jhi, lo, hi, buf):
    """Row ``i`` of the box into the wavefront layout: ``e[j + step i + 1, i + 1]``
    is ``buf[j - lo]`` for the moves ``lo <= j < hi`` and 0 for the other
    cells of the row's path range ``[jlo, jhi]`` and one cell past each end."""
    col = e[:, i + 1]
    base = step * i + 1
    for j in range(jlo - 1, lo):
        col[j + base] = 0.0
    dst = col[lo + base:hi + base]
    for k in range(hi - lo):
        dst[k] = buf[k]
    for j in range(max(hi, lo), jhi + 2):
        col[j + base] = 0.0


@numba.njit(**HELPER, fastmath={"contract"})
def _exp_moves(b, px, py, s0, t0, ns, nt, modified):
    """``(ex, ey, m, bad, flushed)``: every move on a complete path exponentiated
    relative to the largest of them, ``m``, in the wavefront layout (see the
    comment above: ``ey[L + 1, i + 1]`` the blank move out of cell ``i`` of
    level ``L``, zeros for moves off every complete path and one guard entry
    past each side of every level).

    ``bad``: a NaN or ``+inf`` move, or none finite (the exact log space
    decides); ``flushed``: a move of nonzero probability below ``_FLUSH``.
    One shift for the whole box is exact for the rescaled sweep because every
    path makes the same number of moves.  The exponentials run along the rows
    of ``px``/``py`` (unit stride, vectorised: `exp_poly`), then are copied
    into the layout (the only strided pass).  ``fastmath`` allows only FMA
    contraction (no reassociation): the polynomial's bits do not depend on the
    vector width.
    """
    n_lev = nt if modified else ns + nt - 1
    m = _NEG_INF
    nan = 0
    for i in range(ns):  # the maximum: rows of px / py, unit stride
        ylo, yhi, xlo, xhi = _moves(i, ns, nt, modified)
        m, nan = _row_max(py, b, s0 + i, t0, ylo, yhi, m, nan)
        m, nan = _row_max(px, b, s0 + i, t0, xlo, xhi, m, nan)
    bad = nan > 0 or not m > _NEG_INF or m == np.inf
    w = ns + 2
    ex = np.empty((n_lev + 2, w), np.float64)
    ey = np.empty((n_lev + 2, w), np.float64)
    if bad:
        return ex, ey, m, bad, False
    for r in range(n_lev + 2):  # the guard columns i = -1 and i = ns
        ex[r, 0] = 0.0
        ex[r, w - 1] = 0.0
        ey[r, 0] = 0.0
        ey[r, w - 1] = 0.0
    step = 0 if modified else 1
    buf = np.empty(nt, np.float64)
    n_flush = 0
    for i in range(ns):
        ylo, yhi, xlo, xhi = _moves(i, ns, nt, modified)
        jlo = i if modified else 0          # the row's cells on a complete path
        jhi = i + nt - ns if modified else nt - 1
        n_flush += _exp_row(py, b, s0 + i, t0, ylo, yhi, m, buf)
        _skew_row(ey, i, step, jlo, jhi, ylo, yhi, buf)
        if xhi > xlo:  # the last row has no symbol move (and no row of px)
            n_flush += _exp_row(px, b, s0 + i, t0, xlo, xhi, m, buf)
        _skew_row(ex, i, step, jlo, jhi, xlo, xhi, buf)
    return ex, ey, m, bad, n_flush > 0


@numba.njit(**HELPER)
def _linear_forward(ex, ey, ns, nt, modified, n_lev, state):
    """`_one_linear`'s rescaled forward sweep: ``(alpha, ka, state, flushed)``.

    ``alpha[L, i + 1] 2**ka[L] e**(L m)`` is the forward score of cell ``i``
    of level ``L`` (every move carries ``e**-m``); each level is scaled by a
    power of two so that its largest cell lies in ``[0.5, 1)``.  ``state`` 1:
    a level's mass left the range (recompute in log space); ``flushed``: a
    product of nonzero factors fell below ``_FLUSH``.
    """
    w = ns + 2
    alpha = np.empty((n_lev, w), np.float64)
    ka = np.empty(n_lev, np.int64)
    a0 = alpha[0]
    a0[0] = 0.0
    a0[1] = 1.0
    a0[2] = 0.0   # w >= 3
    ka[0] = 0
    n_flush = 0
    for lev in range(1, n_lev if state == 0 else 1):
        lo, hi = _window(lev, ns, nt, modified)
        n = hi - lo + 1
        # the cells lo..hi: blank from (lev - 1, i), symbol from (lev - 1, i - 1)
        prev_y = alpha[lev - 1, lo + 1:]
        prev_x = alpha[lev - 1, lo:]
        e_y = ey[lev, lo + 1:]
        e_x = ex[lev, lo:]
        cur = alpha[lev, lo + 1:]
        for k in range(n):
            ay = prev_y[k]
            fy = e_y[k]
            ax = prev_x[k]
            fx = e_x[k]
            u = ay * fy
            v = ax * fx
            cur[k] = u + v
            n_flush += (((u < _FLUSH) & (ay > 0.0) & (fy > 0.0))
                        | ((v < _FLUSH) & (ax > 0.0) & (fx > 0.0)))
        peak = _row_peak(cur, n)
        if not peak >= _TINY:
            state = 1
            break
        e = _exponent(peak)
        scale = _pow2(-e)
        for k in range(n):
            cur[k] *= scale
        alpha[lev, lo] = 0.0
        alpha[lev, hi + 2] = 0.0
        ka[lev] = ka[lev - 1] + e
    return alpha, ka, state, n_flush > 0


@numba.njit(**HELPER)
def _unskew_row(e, i, step, lo, hi, dst):
    """``dst[k] = e[lo + k + step i + 1, i + 1]`` for ``k < hi - lo``: moves
    ``lo <= j < hi`` of row ``i`` back from the wavefront layout."""
    base = step * i + 1
    src = e[lo + base:hi + base, i + 1]
    for k in range(hi - lo):
        dst[k] = src[k]


@numba.njit(**HELPER)
def _linear_backward(b, s0, t0, ns, nt, modified, n_lev, ex, ey, alpha, ka, want, want_x,
                     want_y, gx, gy):
    """`_one_linear`'s backward sweep: the per-level check and (``want``) the move
    posteriors into ``gx``/``gy``; 0, or 1 when a level's check fails (then
    ``gx``/``gy`` are untouched).

    ``beta`` holds level ``L + 1`` scaled by ``2**-kb``; at every level the
    forward-backward identity ``sum_i alpha beta = Z`` must hold to
    ``_CHECK_TOL``: in the scaled units ``sum_i alpha[L] nb = alpha_end
    2**(ka_end - ka[L] - kb)``, a power of two, exactly (see the module
    docstring).  The posteriors are ``alpha e beta / r`` with ``r`` that
    level's sum (`_lane_sum`); they overwrite the move probabilities in
    ``ex``/``ey`` (read for the last time), which go back to the box layout of
    ``gx``/``gy`` once every level has passed.
    """
    w = ns + 2
    beta = np.empty(w, np.float64)    # level lev + 1, scaled by 2**-kb
    nb = np.empty(w, np.float64)      # level lev, unscaled (beta's units)
    prod = np.empty(w, np.float64)
    beta[ns - 1] = 0.0
    beta[ns] = 1.0
    beta[ns + 1] = 0.0
    kb = 0
    a_end = alpha[n_lev - 1, ns]
    k_end = ka[n_lev - 1]
    for lev in range(n_lev - 2, -1, -1):
        lo, hi = _window(lev, ns, nt, modified)
        n = hi - lo + 1
        e_y = ey[lev + 1, lo + 1:lo + 1 + n]
        e_x = ex[lev + 1, lo + 1:lo + 1 + n]
        b_y = beta[lo + 1:lo + 1 + n]
        b_x = beta[lo + 2:lo + 2 + n]
        a_l = alpha[lev, lo + 1:lo + 1 + n]
        v_l = nb[:n]
        p_l = prod[:n]
        for k in range(n):
            v = e_y[k] * b_y[k] + e_x[k] * b_x[k]
            v_l[k] = v
            p_l[k] = a_l[k] * v
        r = _lane_sum(p_l, n)
        d = _row_peak(v_l, n)
        shift = k_end - ka[lev] - kb
        expected = a_end * _pow2(shift) if -1022 <= shift <= 1023 else 0.0
        if not (abs(r - expected) <= _CHECK_TOL * expected and r >= _TINY
                and d >= _TINY):
            return 1
        if want:
            g = 1.0 / r
            for k in range(n):
                a = a_l[k] * g
                e_y[k] = -(a * e_y[k] * b_y[k])
                e_x[k] = -(a * e_x[k] * b_x[k])
        scale = _pow2(-_exponent(d))
        kb += _exponent(d)
        for k in range(n):
            b_y[k] = v_l[k] * scale
        beta[lo] = 0.0
        beta[hi + 2] = 0.0
    if want:
        step = 0 if modified else 1
        for i in range(ns):
            ylo, yhi, xlo, xhi = _moves(i, ns, nt, modified)
            if want_y:
                _unskew_row(ey, i, step, ylo, yhi, gy[b, s0 + i, t0 + ylo:t0 + yhi])
            if want_x and xhi > xlo:  # px has no row past the last symbol
                _unskew_row(ex, i, step, xlo, xhi, gx[b, s0 + i, t0 + xlo:t0 + xhi])
    return 0


@numba.njit(cache=True, nogil=True, inline="always")
def _one_linear(b, px, py, bd, modified, want_x, want_y, losses, gx, gy):
    """Loss (and gradients) of sequence ``b`` by the rescaled linear-space sweep.

    Returns 0 when done; else the exact log-space recursion `_one` must
    finish the sequence (`_fallback_batch`: compiled only when first needed):
    1 for its loss and gradients, 2 for its gradients only (``losses[b]`` is
    already exact and stays).  ``gx``/``gy`` are zero on entry, and zero in
    the box again on a nonzero return.  See the module docstring.

    Inlined glue: the sweeps are functions of their own (`_exp_moves`,
    `_linear_forward`, `_linear_backward`; called once per sequence), which
    numba compiles in well under the time one body took (issue 19).
    """
    n_s = py.shape[1] - 1
    n_t = py.shape[2]
    if not _box_ok(bd, b, n_s, n_t):
        return 1
    s0, t0, s1, t1, ns, nt = _box(bd, b)
    if modified and ns > nt:  # no complete path: the log-space kernel's +inf / zeros
        return 1
    n_lev = nt if modified else ns + nt - 1
    ex, ey, m, bad, flushed = _exp_moves(b, px, py, s0, t0, ns, nt, modified)
    state = 1 if (bad and n_lev > 1) else 0  # 0: fine, 1: recompute in log space
    alpha, ka, state, flushed_f = _linear_forward(ex, ey, ns, nt, modified, n_lev, state)
    flushed = flushed or flushed_f
    # the last level is one cell, alpha[n_lev - 1, ns] in [0.5, 1) (1 when n_lev == 1)
    logz = np.nan
    if state == 0:
        kd = np.float64(ka[n_lev - 1])
        logz = ((kd * _LN2_HI + ((n_lev - 1) * m if n_lev > 1 else 0.0))
                + (kd * _LN2_LO + math.log(alpha[n_lev - 1, ns])))

    # Backward: beta level by level, the level check, the move posteriors.
    # Every path crosses every level exactly once, so sum_i alpha * beta = Z there.
    linear_loss = state == 0 and not flushed
    want = want_x or want_y
    if state == 0 and (want or flushed):
        state = _linear_backward(b, s0, t0, ns, nt, modified, n_lev, ex, ey, alpha, ka, want,
                                 want_x, want_y, gx, gy)
    if state == 0:
        losses[b] = -logz
        return 0
    if want:  # clear what the linear sweep wrote; `_one` recomputes exactly
        if want_x:
            _fill_box(gx, b, s0, s1, t0, min(t1 + 1, gx.shape[2]), 0.0)
        if want_y:
            _fill_box(gy, b, s0, s1 + 1, t0, t1, 0.0)
    if linear_loss:
        # Nothing was flushed: the forward's log Z is exact; only the gradient's
        # sweep lost precision (the log-space pass recomputes it).
        losses[b] = -logz
        return 2
    return 1


# The batch kernels: the same argument list ``(order, inputs..., outputs...)``;
# each processes exactly the sequences listed in the int64 array ``order`` and
# writes only their entries of the preallocated outputs ``losses`` (N,) float64,
# ``gx``/``gy`` (zero on entry; (0, 0, 0) when not wanted) and ``pending`` (N,)
# int8 (`_one_linear`'s status).



@numba.njit(cache=True, nogil=True)
def _batch_serial(order, px, py, bd, modified, want_x, want_y, losses, gx, gy, pending):
    for i in range(order.shape[0]):
        b = order[i]
        pending[b] = _one_linear(b, px, py, bd, modified, want_x, want_y, losses, gx, gy)


@numba.njit(cache=True, nogil=True)
def _fallback_batch(order, px, py, bd, modified, want_x, want_y, losses, gx, gy, pending):
    """The sequences of ``order`` that `_one_linear` marked in ``pending``,
    exactly in log space (`_one`): the same steps as if `_one_linear` had
    called `_one` itself (their boxes in ``gx``/``gy`` are zero)."""
    for i in range(order.shape[0]):
        b = order[i]
        if pending[b] == 0:
            continue
        loss = losses[b]
        _one(b, px, py, bd, modified, want_x, want_y, losses, gx, gy)
        if pending[b] == 2:  # the linear forward's log Z stands
            losses[b] = loss


def run_fallback(args):
    """`_fallback_batch` over the sequences marked in ``args[-1]`` (``pending``),
    ``args`` as for the batch kernels less ``order``.  It compiles only when a call
    first needs it (and under duoloss.warmup, with no sequence to run, so that it
    is cached).  Returns those sequences (int64)."""
    todo = np.flatnonzero(args[-1]).astype(np.int64, copy=False)
    if todo.size or _numerics._compile_both:
        py = args[1]
        run_batch(_fallback_batch, todo, todo.size * py.shape[1] * (py.shape[2] + 1),
                  _PARALLEL_MIN_CELLS, args)
    return todo


def _check_rnnt_type(fn, rnnt_type):
    if not isinstance(rnnt_type, str) or rnnt_type not in RNNT_TYPES:
        raise ValueError(f"{fn}: argument 'rnnt_type' must be one of {RNNT_TYPES}, "
                         f"got {rnnt_type!r}")
    return rnnt_type != "regular"


def _prepare(fn, px, py, boundary, rnnt_type):
    """Shape checks (ValueError naming ``fn``) and contiguous host buffers."""
    modified = _check_rnnt_type(fn, rnnt_type)
    px = np.asarray(px)
    py = np.asarray(py)
    if py.ndim != 3:
        raise ValueError(f"{fn}: argument 'py' must be an (N, S + 1, T)-array, "
                         f"got shape {tuple(py.shape)}")
    n, s1, n_t = py.shape
    want_px = (n, s1 - 1, n_t if modified else n_t + 1)
    if px.shape != want_px:
        raise ValueError(f"{fn}: argument 'px' must have shape {want_px} for rnnt_type "
                         f"{rnnt_type!r} (from py {tuple(py.shape)}), got {tuple(px.shape)}")
    if px.dtype != py.dtype:
        raise TypeError(f"{fn}: arguments 'px' and 'py' must have the same dtype, "
                        f"got {px.dtype} and {py.dtype}")
    if px.dtype not in (np.float32, np.float64):
        px = px.astype(np.float64)
        py = py.astype(np.float64)
    if boundary is None:
        bd = np.zeros((n, 4), np.int64)
        bd[:, 2] = s1 - 1
        bd[:, 3] = n_t
    else:
        bd = np.asarray(boundary)
        if bd.shape != (n, 4) or bd.dtype.kind not in "iu":
            raise ValueError(f"{fn}: argument 'boundary' must be an integer ({n}, 4)-array "
                             f"of rows [s_begin, t_begin, s_end, t_end], got shape "
                             f"{tuple(bd.shape)} and dtype {bd.dtype}")
        bd = bd.astype(np.int64)
    return (np.ascontiguousarray(px), np.ascontiguousarray(py),
            np.ascontiguousarray(bd), modified)


def transducer_loss_and_grad(px: npt.ArrayLike, py: npt.ArrayLike,
                             boundary: npt.ArrayLike | None = None, *, rnnt_type: str = "regular",
                             want_grad: bool | tuple[bool, bool] = (True, True),
                             _log_space: bool = False
                             ) -> tuple[np.ndarray, tuple[np.ndarray | None, np.ndarray | None]]:
    """Per-sequence transducer losses ``-p[s_end, t_end]`` and their gradients.

    Args:
      px: ``(N, S, T + 1)`` (regular) or ``(N, S, T)`` (modified, constrained)
        float array: symbol-emission log-probabilities (see the module doc).
      py: ``(N, S + 1, T)`` float array: blank (next-frame) log-probabilities.
      boundary: ``(N, 4)`` integer rows ``[s_begin, t_begin, s_end, t_end]``,
        or ``None`` for ``[0, 0, S, T]``.
      rnnt_type: ``'regular'``, ``'modified'`` or ``'constrained'``.
      want_grad: booleans ``(px, py)``.

    Returns:
      ``(losses, (g_px, g_py))``: ``(N,)`` negative log-likelihoods in
      ``px``'s dtype and the gradient of each sequence's loss w.r.t. its own
      ``px``/``py`` (minus the move posteriors; ``None`` when not wanted).
    """
    px, py, bd, modified = _prepare("transducer_loss", px, py, boundary, rnnt_type)
    dtype = px.dtype
    n = py.shape[0]
    want_x, want_y = (bool(w) for w in want_grad)
    losses = np.empty(n, np.float64)
    gx = np.zeros(px.shape if want_x else (0, 0, 0), dtype)
    gy = np.zeros(py.shape if want_y else (0, 0, 0), dtype)
    if n > 0:
        # _log_space: every sequence straight to the exact log-space recursion
        pending = np.ones(n, np.int8) if _log_space else np.zeros(n, np.int8)
        args = (px, py, bd, bool(modified), want_x, want_y, losses, gx, gy, pending)
        if not _log_space:
            cells = n * py.shape[1] * (py.shape[2] + 1)
            run_batch(_batch_serial, np.arange(n, dtype=np.int64), cells, _PARALLEL_MIN_CELLS,
                      args)
        run_fallback(args)
    return losses.astype(dtype, copy=False), (gx if want_x else None, gy if want_y else None)


def _transducer_run(arrays, want_grad, *, rnnt_type="regular"):
    px, py, boundary = arrays
    losses, (gx, gy) = transducer_loss_and_grad(px, py, boundary, rnnt_type=rnnt_type,
                                                want_grad=tuple(want_grad[:2]))
    return losses, (gx, gy, None)


#: The transducer lattice loss for the frontends' adapters: arrays are
#: ``(px, py, boundary)`` (see the module doc), static ``rnnt_type``.
TRANSDUCER_KERNEL = LossKernel(
    name="transducer_loss",
    run=_transducer_run,
    batch_axes=(0, 0, 0),
    differentiable=(True, True, False),
)


# --------------------------------------------------------------------------- #
# Viterbi                                                                      #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER)
def _viterbi_one(b, px, py, bd, modified, checkpoint_cells, scores, frames):
    n_s = py.shape[1] - 1
    n_t = py.shape[2]
    if not _box_ok(bd, b, n_s, n_t):
        scores[b] = np.nan
        return
    s0, t0, s1, t1, ns, nt = _box(bd, b)
    if ns * nt > checkpoint_cells:
        _viterbi_checkpointed(b, px, py, s0, t0, ns, nt, modified, scores, frames)
        return
    v = _lattice_forward(b, px, py, s0, t0, ns, nt, modified, True)
    best = v[ns - 1, nt - 1]
    scores[b] = best
    if best != best or best == _NEG_INF:
        return
    # Backtrace; ties go to the symbol move.
    i = ns - 1
    j = nt - 1
    while i > 0 or j > 0:
        s = s0 + i
        t = t0 + j
        cx = _NEG_INF
        if i > 0:
            if not modified:
                cx = v[i - 1, j] + np.float64(px[b, s - 1, t])
            elif j > 0:
                cx = v[i - 1, j - 1] + np.float64(px[b, s - 1, t - 1])
        cy = _NEG_INF
        if j > 0:
            cy = v[i, j - 1] + np.float64(py[b, s, t - 1])
        if i > 0 and cx >= cy and cx > _NEG_INF:
            if modified:
                frames[b, s - 1] = t - 1
                j -= 1
            else:
                frames[b, s - 1] = t
            i -= 1
        else:
            j -= 1


# ---- bounded memory: checkpointed rows, recomputing backtrace ----------------
# The forward keeps two rows (symbol positions i) of the table and a copy of every
# k-th row.  The backtrace at node (i, j) reads rows i and i-1 at columns <= j
# only, and never moves right; a cell (r, x) depends on (r, x-1) and on row r-1 at
# x (regular) or x-1 (modified).  So on reaching the rows c..c+k of a segment, the
# backtrace recomputes them from the checkpoint row c on the columns [0, j]: the
# same operations on the same values as `_lattice_forward`, hence the full table's
# bits, ties included.  Unlike CTC (a path moves at most 2 states a frame) a
# transducer path can cross the whole frame axis within one symbol, so the window
# is a prefix, not a band.  Memory: (ns / k + k + 3) nt floats, k ~ sqrt(ns),
# i.e. about 2 sqrt(S) T; time: the forward plus at most one more.


@numba.njit(cache=True, nogil=True, inline="always")
def _viterbi_row(b, px, py, s0, t0, i, prev, cur, n_cols, modified):
    """Row ``i`` of `_lattice_forward`'s tropical table on the columns
    ``[0, n_cols)`` into ``cur``, from row ``i - 1`` in ``prev`` (unread when
    ``i == 0``); the same operations in the same order."""
    s = s0 + i
    for j in range(n_cols):
        t = t0 + j
        if i == 0 and j == 0:
            v = 0.0
        else:
            v = _NEG_INF
            if j > 0:
                v = cur[j - 1] + np.float64(py[b, s, t - 1])
            if i > 0 and (j > 0 or not modified):
                if modified:
                    w = prev[j - 1] + np.float64(px[b, s - 1, t - 1])
                else:
                    w = prev[j] + np.float64(px[b, s - 1, t])
                v = _max_nan(v, w)
        cur[j] = v


@numba.njit(cache=True, nogil=True)
def _viterbi_segment(ns):
    """Rows between checkpoints: about ``sqrt(ns)`` (the memory optimum of
    ``(ns / k + k) nt``), in ``[1, ns]``."""
    k = int(np.sqrt(ns) + 0.5)
    return min(max(k, 1), ns)


@numba.njit(**HELPER)
def _viterbi_checkpointed(b, px, py, s0, t0, ns, nt, modified, scores, frames):
    """`_viterbi_one`'s score and frames without the full ``ns x nt`` table
    (see the comment above)."""
    k = _viterbi_segment(ns)
    ckpt = np.empty(((ns - 1) // k + 1, nt))
    rows = np.empty((2, nt))
    for i in range(ns):
        _viterbi_row(b, px, py, s0, t0, i, rows[(i - 1) & 1], rows[i & 1], nt, modified)
        if i % k == 0:
            ckpt[i // k, :] = rows[i & 1]
    best = rows[(ns - 1) & 1][nt - 1]
    scores[b] = best
    if best != best or best == _NEG_INF:
        return
    buf = np.empty((k + 1, nt))
    seg = -1
    c = 0
    i = ns - 1
    j = nt - 1
    while i > 0 or j > 0:
        need = (i - 1) // k if i > 0 else 0
        if need != seg:
            # rows c..min(c + k, ns - 1) on the columns [0, j]
            seg = need
            c = seg * k
            buf[0, :j + 1] = ckpt[seg, :j + 1]
            for r in range(c + 1, min(c + k, ns - 1) + 1):
                _viterbi_row(b, px, py, s0, t0, r, buf[r - 1 - c], buf[r - c], j + 1, modified)
        s = s0 + i
        t = t0 + j
        cx = _NEG_INF
        if i > 0:
            if not modified:
                cx = buf[i - 1 - c, j] + np.float64(px[b, s - 1, t])
            elif j > 0:
                cx = buf[i - 1 - c, j - 1] + np.float64(px[b, s - 1, t - 1])
        cy = _NEG_INF
        if j > 0:
            cy = buf[i - c, j - 1] + np.float64(py[b, s, t - 1])
        if i > 0 and cx >= cy and cx > _NEG_INF:
            if modified:
                frames[b, s - 1] = t - 1
                j -= 1
            else:
                frames[b, s - 1] = t
            i -= 1
        else:
            j -= 1



@numba.njit(cache=True, nogil=True)
def _viterbi_serial(order, px, py, bd, modified, checkpoint_cells, scores, frames):
    for i in range(order.shape[0]):
        _viterbi_one(order[i], px, py, bd, modified, checkpoint_cells, scores, frames)


#: Sequences of more lattice cells (``(U_b + 1) (T_b + 1)``) than this are aligned
#: in bounded memory (`_viterbi_checkpointed`, about ``2 sqrt(U) T`` floats);
#: below it the full table (8 bytes a cell, 256 MiB at the threshold).
RNNT_CHECKPOINT_CELLS = 1 << 25


def transducer_viterbi(px: npt.ArrayLike, py: npt.ArrayLike, boundary: npt.ArrayLike | None = None,
                       rnnt_type: str = "regular", *, _checkpoint_cells: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Best path through the transducer lattice (max instead of logaddexp).

    Args: as [`transducer_loss_and_grad`][duoloss.core.transducer_loss_and_grad].

    Returns:
      ``(scores, frames)``: ``(N,)`` float64 best path scores (the max over
      paths of the summed move log-probabilities; ``-inf`` if no path has a
      finite score, NaN for a NaN on the best path or an invalid boundary row)
      and ``(N, S)`` int64 ``frames``: ``frames[b, s]`` is the frame ``t`` at
      which symbol ``s`` is emitted on the best path (the move reads
      ``px[b, s, t]``), for ``s_begin <= s < s_end``; ``-1`` elsewhere and for
      sequences without a finite best path.  Blank moves are implied: on a
      regular lattice frame ``t`` emits the symbols with ``frames == t`` and
      then one blank (``py``); on a modified lattice each frame emits either one
      symbol or one blank.

    NB: ties go to the symbol move at the later position of the backtrace
    (i.e. symbols are emitted as late as possible among equal-score paths).

    Memory: a sequence of more than `RNNT_CHECKPOINT_CELLS` lattice cells is
    aligned without its full table (checkpointed rows, recomputed while
    backtracking: about ``2 sqrt(S) T`` floats), with the same scores and
    frames, bit for bit; the private ``_checkpoint_cells`` overrides the
    threshold (0 forces that path, for tests).
    """
    px, py, bd, modified = _prepare("transducer_viterbi", px, py, boundary, rnnt_type)
    n = py.shape[0]
    scores = np.empty(n, np.float64)
    frames = np.full((n, py.shape[1] - 1), -1, np.int64)
    if n > 0:
        cells = n * py.shape[1] * (py.shape[2] + 1)
        limit = RNNT_CHECKPOINT_CELLS if _checkpoint_cells is None else int(_checkpoint_cells)
        run_batch(_viterbi_serial, np.arange(n, dtype=np.int64), cells, _PARALLEL_MIN_CELLS,
                  (px, py, bd, bool(modified), limit, scores, frames))
    return scores, frames


# --------------------------------------------------------------------------- #
# Frontend validation (RNN-T on joiner logits)                                 #
# --------------------------------------------------------------------------- #
#: Joiner-output dtypes the RNN-T frontends take (halves are upcast to float32).
RNNT_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_rnnt_args(fn, logits, targets, logit_lengths, target_lengths, blank, *,
                    concrete=True):
    """Validate RNN-T arguments; raise ``TypeError``/``ValueError`` naming ``fn``.

    Arguments are anything with ``.shape``/``.dtype`` (numpy, torch, JAX,
    tracers when ``concrete=False``): ``logits`` ``(N, T, U + 1, V)``, ``targets``
    ``(N, U)`` integers, lengths ``(N,)`` integers, ``blank`` a Python int in
    ``[-V, V)``.  With ``concrete``, also the values: ``0 <= logit_lengths <= T``,
    ``0 <= target_lengths <= U``, labels in ``[0, V)`` and never the blank.

    Returns:
      The blank index in ``[0, V)``.
    """
    from .. import _validate as v

    v.check_ndim(fn, "logits", logits.shape, (4,), "an (N, T, U + 1, V)-array")
    v.check_dtype(fn, "logits", logits.dtype, RNNT_FLOAT_DTYPES, "a floating")
    n, t_max, u1, n_cls = (int(s) for s in logits.shape)
    if u1 < 1 or n_cls < 1:
        raise ValueError(f"{fn}: argument 'logits' must have U + 1 >= 1 and V >= 1, "
                         f"got shape {v.shape_str(logits.shape)}")
    blank = v.check_int_scalar(fn, "blank", blank, -n_cls, n_cls)
    if blank < 0:
        blank += n_cls
    check_targets_and_lengths(fn, logits.shape, targets, logit_lengths, target_lengths)
    if concrete:
        il = np.asarray(logit_lengths).astype(np.int64)
        tl = np.asarray(target_lengths).astype(np.int64)
        v.check_lengths(fn, "logit_lengths", il, t_max, "T, the number of frames")
        v.check_lengths(fn, "target_lengths", tl, u1 - 1, "U, the padded target length")
        v.check_labels(fn, "targets", np.asarray(targets).astype(np.int64), tl, n_cls,
                       forbidden=blank, forbidden_what="the blank")
    return blank


def check_targets_and_lengths(fn, logits_shape, targets, logit_lengths, target_lengths):
    """Shapes and dtypes of a transducer's ``targets`` ``(N, U)`` and lengths ``(N,)``
    against logits of shape ``(N, T, U + 1, ...)`` (any array or tracer with
    ``.shape``/``.dtype``); the error messages every transducer loss shares."""
    from .. import _validate as v

    n, u1 = int(logits_shape[0]), int(logits_shape[2])
    v.check_ndim(fn, "targets", targets.shape, (2,), f"an (N, U) = ({n}, {u1 - 1})-array")
    v.check_dtype(fn, "targets", targets.dtype, v.INT_DTYPES, "an integer")
    if tuple(int(s) for s in targets.shape) != (n, u1 - 1):
        raise ValueError(f"{fn}: argument 'targets' must have shape (N, U) = ({n}, {u1 - 1}) "
                         f"(from logits {v.shape_str(logits_shape)}), "
                         f"got {v.shape_str(targets.shape)}")
    for arg, x in (("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        v.check_ndim(fn, arg, x.shape, (1,), f"an (N,)-array with N = {n}")
        v.check_dtype(fn, arg, x.dtype, v.INT_DTYPES, "an integer")
        if int(x.shape[0]) != n:
            raise ValueError(f"{fn}: argument '{arg}' must be an (N,)-array with N = {n}, "
                             f"got shape {v.shape_str(x.shape)}")


def check_rnnt_options(fn, reduction, clamp, fused_log_softmax, fastemit_lambda,
                       delay_penalty):
    """The scalar options of ``rnnt_loss`` (plain Python values)."""
    from .. import _validate as v

    v.check_reduction(fn, reduction)
    for arg, x in (("clamp", clamp), ("fastemit_lambda", fastemit_lambda),
                   ("delay_penalty", delay_penalty)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer,
                                                                 np.floating)):
            raise TypeError(f"{fn}: argument '{arg}' must be a float, got {type(x).__name__}")
        if not math.isfinite(float(x)):
            raise ValueError(f"{fn}: argument '{arg}' must be finite, got {x!r}")
    for arg, x in (("fastemit_lambda", fastemit_lambda), ("delay_penalty", delay_penalty)):
        if float(x) < 0:
            raise ValueError(f"{fn}: argument '{arg}' must be >= 0, got {x!r}")
    if not isinstance(fused_log_softmax, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument 'fused_log_softmax' must be a bool, "
                        f"got {type(fused_log_softmax).__name__}")


def rnnt_alignment(scores, frames, targets, logit_lengths, target_lengths, blank, t_max):
    """Token sequence of a regular RNN-T lattice path from its symbol frames.

    Args:
      scores, frames: ``(N,)`` and ``(N, U)`` from `transducer_viterbi`.
      targets: ``(N, U)`` labels; lengths: ``(N,)``; blank: the blank index;
      t_max: ``T``, the padded number of frames.

    Returns:
      ``(N, T + U)`` int64: for each frame ``t < T_b`` in order, the labels
      emitted on frame ``t`` followed by one blank (``T_b + U_b`` tokens), then
      ``-1``.  All ``-1`` for a sequence without a finite best path.
    """
    n, u_max = frames.shape
    out = np.full((n, u_max + t_max), -1, np.int64)
    for b in range(n):
        if not np.isfinite(scores[b]):
            continue
        tb, ub = int(logit_lengths[b]), int(target_lengths[b])
        fr = frames[b, :ub]
        k, s = 0, 0
        for t in range(tb):
            while s < ub and fr[s] == t:
                out[b, k] = targets[b, s]
                k += 1
                s += 1
            out[b, k] = blank
            k += 1
    return out
