r"""Connectionist Temporal Classification on numpy buffers.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes (blank included), ``S``
padded target length; sequence ``b`` has ``T_b = input_lengths[b]`` frames and
``L_b = target_lengths[b]`` labels ``y_1 .. y_L``.

The CTC acceptor of a target has ``2L+1`` states: blanks at even states and
``y_i`` at state ``2i-1``.  A path visits one state per frame, starts in state 0
or 1, ends in state ``2L`` or ``2L-1``, and moves by 0, 1, or 2 states per frame
(2 only onto a label different from the one it skips).  With
$\ell_t(k) = \log p_t(k)$ (``log_probs[t, b, k]``):

.. math::

    \alpha_t(s) = \ell_t(z_s) + \operatorname{logsumexp}(\alpha_{t-1}(s),
        \alpha_{t-1}(s-1), [z_s \ne z_{s-2}]\,\alpha_{t-1}(s-2)) \\
    \text{loss}_b = -\log Z_b,\quad \log Z_b = \operatorname{logsumexp}(
        \alpha_{T_b-1}(2L), \alpha_{T_b-1}(2L-1)) \\
    \frac{\partial\, \text{loss}_b}{\partial \ell_t(k)} =
        -\sum_{s: z_s = k} \gamma_t(s),\qquad
        \gamma_t(s) = \frac{\alpha_t(s)\,\beta_t(s)}{Z_b}

The gradient is the *true* gradient w.r.t. ``log_probs`` (minus the posterior
occupancy of each class).  ``torch.nn.functional.ctc_loss`` instead returns
``exp(log_probs) - posterior``, which equals the gradient only once it is pushed
back through a ``log_softmax``; both give the same gradient w.r.t. the logits.

Implementation: per sequence and frame, ``p_t(k) / max_k p_t(k)`` is computed
once for the classes the target uses (blank and its labels; one ``exp`` per
frame and class, so a large vocabulary costs nothing); the kernels then run the
forward-backward in *linear* space in float64 with per-frame rescaling (no
transcendental function in the inner loop).  Every frame is checked: the posteriors of frame ``t`` must
sum to one.  If that fails, or a frame's mass falls below ``1e-200`` of its
maximum (a needed label hundreds of nats below the frame's best, where linear
space would underflow), the sequence is recomputed exactly in log space.  Both
paths produce float64-accurate results for float32 and float64 inputs.  The
exact log-space trellis is the same code as the Viterbi trellis in the other
semiring (logsumexp vs max, a compile-time constant), which the aligner
(`duoloss.core.losses.align.ctc_align`) reproduces bit for bit in vectorised
rows; the rescaled linear-space kernels are a different algorithm,
specialised for speed and vectorised along the row (see below).

The loss is the same number whether or not a gradient is asked for.  The
forward pass records whether any positive value left float64's normal range
("flushed": a probability or a trellis cell below ``1e-290``).  If nothing was
flushed, the rescaled forward is exact and its log Z is the loss (should the
backward's check fail, only the gradient is recomputed in log space).  If
something was flushed, the backward sweep's per-frame check decides — it also
runs, without writing a gradient, when no gradient was asked for — and a failed
check sends loss and gradient to log space.  Long sequences with spread-out
posteriors (e.g. T = 8000, L = 400) flush cells that race ahead of the bulk;
before this rule their no-gradient losses were off by up to thousands of nats.

NB: ``log_probs`` need not be normalised (any real scores work).  Frames at or
beyond ``T_b`` and classes outside the target get zero gradient.  An infeasible
target (``T_b`` too short) gives ``+inf`` loss and zero gradient (or zero loss
with ``zero_infinity``).  A NaN or ``+inf`` among a sequence's frames, or an
invalid label/length (possible only for traced JAX values, as everything else is
validated up front), makes that sequence's loss and gradient NaN; the other
sequences are unaffected.

References:
  Graves et al., "Connectionist Temporal Classification: Labelling Unsegmented
  Sequence Data with Recurrent Neural Networks", ICML 2006.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .. import _numerics
from .._numerics import CHECK_TOL as _CHECK_TOL
from .._numerics import FLUSH as _FLUSH
from .._numerics import HELPER, exp_poly, fast_exp, sequence_ok
from .._pool import run_batch
from .._numerics import logaddexp as _logaddexp
from .._reduce import subnormal_free
from .._spec import LossKernel

__all__ = ["ctc_loss_and_grad", "concat_to_padded", "CTC_KERNEL"]

# A frame whose total mass (relative to its best class) falls below this is
# recomputed in log space: float64's range ends near 1e-308.
_TINY = 1e-200
# A target of at least this many distinct classes (blank included) takes the packed
# `exp_poly` for its frame probabilities; fewer, the scalar `fast_exp` (for a few
# classes the packed loop's set-up and scalar tail cost more than they save: 1.6 us
# of a 14 us kernel call at (1, 50, 20, 10)).  The choice depends on the input only.
_PACKED_EXP_MIN = 16
# Below this many trellis cells in a batch, a serial loop beats the thread launch.
_PARALLEL_MIN_CELLS = 40_000


@numba.njit(**HELPER)
def _fill_rows(grad, b, t0, t1, value):
    for t in range(t0, t1):
        for k in range(grad.shape[2]):
            grad[t, b, k] = value


@numba.njit(cache=True, nogil=True, inline="always")
def _flush_row(grad, t, b, lab, lo, hi, row, scale):
    """grad[t, b, k] = -scale * row[k] for the classes of states lo..hi; reset row.

    Posteriors are summed and scaled in float64 before the single store, so
    float32 gradients carry one rounding only.  A stored value that is
    subnormal in the gradient's dtype becomes a zero of its sign (what
    `duoloss.core._reduce.flush_subnormals` would do afterwards, in the same
    pass): the kernel's gradients hold no subnormals (`subnormal_free`).
    """
    # float64 values below this round to a subnormal (or zero) of the gradient's
    # dtype: float32's smallest normal less half its ulp there (the midpoint rounds
    # to the even neighbour, the normal one), or float64's smallest normal
    flush = 1.1754942807573643e-38 if grad.itemsize == 4 else 2.2250738585072014e-308
    for s in range(lo, hi + 1):
        k = lab[s]
        if row[k] != 0.0:
            v = -row[k] * scale
            grad[t, b, k] = v * 0.0 if abs(v) < flush else v
            row[k] = 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _store_row(grad, t, b, used, row, scale):
    """grad[t, b, used[j]] = -scale * row[j] for every j (then row[j] = 0), as
    `_flush_row` writes it: one rounding, subnormals of the gradient's dtype to
    a zero of their sign, and an untouched (+0) entry where ``row[j]`` is 0.
    A loop over the target's distinct classes, without branches."""
    flush = 1.1754942807573643e-38 if grad.itemsize == 4 else 2.2250738585072014e-308
    for j in range(used.shape[0]):
        x = row[j]
        v = -x * scale
        v = v * 0.0 if abs(v) < flush else v
        grad[t, b, used[j]] = v if x != 0.0 else 0.0
        row[j] = 0.0


# ---- the CTC trellis in the log and tropical semirings -----------------------
# One recursion serves the exact log-space loss (logsumexp over predecessors)
# and, as the definition the aligner's vectorised rows reproduce bit for bit
# (``align._ctc_tropical_row``, tested against it), the Viterbi trellis (max over
# predecessors): ``tropical`` is a literal constant at every call site, and the
# cores are inlined, so LLVM drops the other semiring's branch.  ``ctc_align``
# itself calls `_ctc_best_step` (backtracking) and `ctc_states` from here.
# NB: numba's on-disk cache of a caller in another module is keyed on that
# module's mtime only: touch ``align.py`` after editing these.


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_best_step(stay, advance, skip_over):
    """Tropical sum into a state: ``(best, step)`` over the scores of its
    predecessors at the frame before (``step`` 0 stay, 1 advance, 2 skip;
    ``-inf`` for a step that is not allowed).

    Ties go to the higher state (stay > advance > skip); NaN is never picked
    over a number.  The aligner calls it again while backtracking, on the same
    values, instead of storing back-pointers.  (Scalars only: an array
    argument costs two reference-count calls per cell even when inlined,
    which made the trellis 5-9x slower.)
    """
    best = stay
    step = 0
    if advance > best:
        best = advance
        step = 1
    if skip_over > best:
        best = skip_over
        step = 2
    return best, step


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_trellis_forward(b, input_len, lab, skip, logp, tropical):
    """The forward table ``(input_len, 2L+1)`` of sequence ``b`` (``-inf`` outside
    each frame's reachable band).

    Log semiring (``tropical=False``): ``log alpha_t(s)`` of the module
    docstring.  Tropical semiring: the Viterbi scores ``delta_t(s)``
    (`duoloss.core.losses.align`), with the predecessor rule of
    `_ctc_best_step`.
    """
    n_states = lab.shape[0]
    table = np.full((input_len, n_states), -np.inf)
    for t in range(input_len):
        lo = max(0, n_states - 2 * (input_len - t))
        hi = min(n_states - 1, 2 * t + 1)
        for s in range(lo, hi + 1):
            emit = np.float64(logp[t, b, lab[s]])
            if tropical:
                if t == 0:
                    table[t, s] = emit
                else:
                    best, _ = _ctc_best_step(
                        table[t - 1, s], table[t - 1, s - 1] if s >= 1 else -np.inf,
                        table[t - 1, s - 2] if skip[s] else -np.inf)
                    table[t, s] = best + emit
            else:
                if t == 0:
                    v = 0.0
                else:
                    v = table[t - 1, s]
                    if s >= 1:
                        v = _logaddexp(v, table[t - 1, s - 1])
                    if skip[s]:
                        v = _logaddexp(v, table[t - 1, s - 2])
                table[t, s] = v + emit if v != -np.inf else -np.inf
    return table


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_trellis_final(table, tropical):
    """``(value, state)`` at the last frame over the final states ``2L`` and ``2L-1``.

    Log semiring: ``(log Z, 2L)``.  Tropical: the best final state and its
    score (``2L`` wins a tie).
    """
    last = table.shape[0] - 1
    n_states = table.shape[1]
    if tropical:
        s = n_states - 1
        if n_states > 1 and table[last, n_states - 2] > table[last, n_states - 1]:
            s = n_states - 2
        return table[last, s], s
    logz = table[last, n_states - 1]
    if n_states > 1:
        logz = _logaddexp(logz, table[last, n_states - 2])
    return logz, n_states - 1


@numba.njit(**HELPER)
def _ctc_log_space(b, input_len, lab, skip, logp, want_grad, grad, scale):
    """Exact log-space forward-backward of one sequence; returns log Z.

    Writes ``-scale * posterior`` into ``grad[:input_len, b, :]`` (already
    zeroed) when ``want_grad``.  The forward is the shared trellis
    (`_ctc_trellis_forward`, log semiring).
    """
    n_states = lab.shape[0]
    log_alpha = _ctc_trellis_forward(b, input_len, lab, skip, logp, False)
    logz, _ = _ctc_trellis_final(log_alpha, False)
    if not want_grad or logz == -np.inf or logz != logz:
        return logz
    # log_beta[s]: log-sum over suffixes leaving state s at frame t (emission at t excluded).
    log_beta = np.full(n_states, -np.inf)
    emit_beta = np.full(n_states, -np.inf)
    row = np.zeros(logp.shape[2])
    log_beta[n_states - 1] = 0.0
    if n_states > 1:
        log_beta[n_states - 2] = 0.0
    for t in range(input_len - 1, -1, -1):
        if t < input_len - 1:
            # emit_beta[s] = emission at t+1 times suffix from s at t+1
            for s in range(n_states):
                emit_beta[s] = (log_beta[s] + np.float64(logp[t + 1, b, lab[s]])
                                if log_beta[s] != -np.inf else -np.inf)
            for s in range(n_states):
                v = emit_beta[s]
                if s + 1 < n_states:
                    v = _logaddexp(v, emit_beta[s + 1])
                if s + 2 < n_states and skip[s + 2]:
                    v = _logaddexp(v, emit_beta[s + 2])
                log_beta[s] = v
        # Posteriors normalised by the frame's own total (= Z in exact
        # arithmetic), relative to the frame's best state m: in [0, 1] and
        # summing to 1 even when alpha + beta and log Z are huge (raw scores
        # of 1e100: their rounding errors are ~1e84, and exp(alpha + beta -
        # log Z) overflowed to an -inf gradient).
        m = -np.inf
        for s in range(n_states):
            a = log_alpha[t, s]
            if a != -np.inf and log_beta[s] != -np.inf and a + log_beta[s] > m:
                m = a + log_beta[s]
        total = 0.0
        for s in range(n_states):
            a = log_alpha[t, s]
            if a != -np.inf and log_beta[s] != -np.inf:
                e = math.exp((a + log_beta[s]) - m)
                row[lab[s]] += e
                total += e
        _flush_row(grad, t, b, lab, 0, n_states - 1, row, scale / total if total > 0 else scale)
    return logz


@numba.njit(cache=True, nogil=True, inline="always")
def ctc_states(targets, b, n_labels, blank):
    """The CTC acceptor of ``targets[b, :n_labels]``: per state its class
    (blanks at even states) and whether it can be entered by skipping the
    state before (``y_i != y_{i-1}``)."""
    s_n = 2 * n_labels + 1
    lab = np.empty(s_n, np.int64)
    skip = np.zeros(s_n, np.bool_)
    for s in range(s_n):
        if s % 2 == 0:
            lab[s] = blank
        else:
            lab[s] = targets[b, (s - 1) // 2]
            if s >= 3 and lab[s] != lab[s - 2]:
                skip[s] = True
    return lab, skip


# ---- the rescaled linear-space forward-backward ------------------------------
# Not the same algorithm as the log/tropical trellis above: it multiplies
# probabilities relative to each frame's best class and renormalises every
# frame, so its inner loops have no exp/log (numba has no vector exp/log here,
# and the log-space recursion runs ~2.5x slower, see NOTES.md); it also tracks
# underflow ("flushed") and checks every frame, which the exact trellis needs
# not.  Hence its own kernels, specialised for speed.
#
# Vectorised along the row (the 2L+1 states of one frame), not across sequences:
# a frame's cells depend only on the frame before, so the state loop is a plain
# map that LLVM turns into packed AVX2/AVX-512 code, for any batch and any mix of
# lengths (across sequences would need equal T and L in every lane, or masks and
# padding to the longest sequence: measured no faster at (32,500,50,100), and
# slower on ragged batches).  What made the state loop scalar, and its cure:
# * the ``s >= 1`` / skip branches and numba's negative-index wraparound: guard
#   columns (zeros) before the forward row and after the backward row, and the
#   skip rule as a select (``x if skip else 0.0``: adding +0.0 to a non-negative
#   sum changes no bit, so the cells are those of the branchy form);
# * the gather ``probs[t, column[s]]``: one gather pass per frame into a row of
#   its own (``prow``), then the recursion reads it contiguously;
# * the running sums (a strict left-to-right sum cannot be vectorised without
#   ``fastmath``, whose reassociation would make the bits depend on the vector
#   width): `_lane_sum` and `_pair_lane_sums` add in 8 fixed lanes combined in a
#   fixed tree, written out in the source, so that every target (SSE, AVX2,
#   AVX-512, or none) computes the same additions in the same order;
# * the class scatter ``row[lab[s]] += ab``: its own pass, after the sums, over
#   the label states only (the blank's posterior is the even lanes' sum).
# ``tests/test_bit_identity_isa.py`` compiles these kernels for AVX2 and for the
# host in child processes and compares the bytes.


# Unsigned indices: numba wraps a negative signed index around (a select per
# access, which turned the contiguous loads into gathers); uint64 ones it takes
# as they are.  (int64 + uint64 is a float64 in numba: keep both sides uint64.)
_U = np.uint64
# (constants, not ``_U(k)`` calls: each call is one more thing to type at compile time)
_U1, _U2, _U3, _U4, _U5, _U6, _U7, _U8 = (np.uint64(k) for k in range(1, 9))


@intrinsic
def _vector_pair_sums(typingctx, x, start, n):
    """``(sum of x[start + k] over even k, over odd k)``, ``0 <= k < n``, for a
    C-contiguous 1-D float64 ``x`` (``start + n <= len(x)``, unchecked), in a
    fixed order written as LLVM vectors: blocks of 16 entries go to two
    ``<8 x double>`` accumulators (entry ``16 j + 8 q + l`` to accumulator
    ``q``, lane ``l``), one more block of 8 to accumulator 0; the two are added
    lane by lane, then the even lanes ``(l0 + l2) + (l4 + l6)`` and the odd ones
    likewise, then the last ``n % 8`` entries in order, each to its parity's sum.
    AVX-512 holds an accumulator in one register, AVX2 in two, SSE in four:
    every lane sees the same additions in the same order, whatever the width.
    (LLVM keeps 8 scalar running sums written in numba scalar: no packed adds.)"""
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"
            and x.dtype == types.float64 and isinstance(start, types.Integer)
            and isinstance(n, types.Integer)):
        return None
    sig = types.UniTuple(types.float64, 2)(x, start, n)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        first = context.cast(builder, args[1], signature.args[1], types.int64)
        count = context.cast(builder, args[2], signature.args[2], types.int64)
        i64 = ir.IntType(64)
        v8 = ir.VectorType(ir.DoubleType(), 8)
        base = builder.gep(data, [first])

        def const(k):
            return ir.Constant(i64, k)

        def load8(offset):
            ptr = builder.bitcast(builder.gep(base, [offset]), v8.as_pointer())
            return builder.load(ptr, align=8)

        accs = [cgutils.alloca_once_value(builder, ir.Constant(v8, None)) for _ in range(2)]
        blocks = builder.sdiv(count, const(16))
        with cgutils.for_range(builder, blocks) as loop:
            offset = builder.mul(loop.index, const(16))
            for q in range(2):
                x8 = load8(builder.add(offset, const(8 * q)))
                builder.store(builder.fadd(builder.load(accs[q]), x8), accs[q])
        done = builder.mul(blocks, const(16))
        one_more = builder.icmp_signed(">=", builder.sub(count, done), const(8))
        with builder.if_then(one_more):
            builder.store(builder.fadd(builder.load(accs[0]), load8(done)), accs[0])
        done = builder.select(one_more, builder.add(done, const(8)), done)
        lanes = builder.fadd(builder.load(accs[0]), builder.load(accs[1]))
        lane = [builder.extract_element(lanes, ir.Constant(ir.IntType(32), k)) for k in range(8)]
        add = builder.fadd
        sums = [cgutils.alloca_once_value(builder, add(add(lane[p], lane[p + 2]),
                                                       add(lane[p + 4], lane[p + 6])))
                for p in range(2)]
        with cgutils.for_range(builder, builder.sub(count, done)) as loop:
            k = builder.add(done, loop.index)
            xk = builder.load(builder.gep(base, [k]))
            odd = builder.trunc(k, ir.IntType(1))
            with builder.if_else(odd) as (then, otherwise):
                with then:
                    builder.store(add(builder.load(sums[1]), xk), sums[1])
                with otherwise:
                    builder.store(add(builder.load(sums[0]), xk), sums[0])
        return context.make_tuple(builder, signature.return_type,
                                  [builder.load(sums[0]), builder.load(sums[1])])

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _lane_sum(x, lo, hi):
    """``sum(x[lo:hi + 1])`` in the fixed order of `_vector_pair_sums` (its
    even and odd sums, then their sum): the same bits whatever the vector
    width; 0 for an empty band (``hi < lo``)."""
    even, odd = _vector_pair_sums(x, lo, max(hi + 1 - lo, 0))
    return even + odd


@numba.njit(cache=True, nogil=True, inline="always")
def _pair_lane_sums(x, lo, hi):
    """``(sum of x[s] over even s, over odd s)`` for ``s`` in ``[lo, hi]``, in
    the fixed order of `_vector_pair_sums` from the even state at or below
    ``lo``.  Reads ``x[lo - 1]`` when ``lo`` is odd, which must be zero."""
    first = lo - (lo & 1)
    return _vector_pair_sums(x, first, max(hi + 1 - first, 0))


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_frame_probs(b, logp, lab, input_len, scratch):
    """Per frame the probabilities of the classes the sequence reads (the
    input of the specialised linear-space kernels, see the comment above).

    Returns ``(probs, frame_max, column, used, flushed)``: ``probs[t, j] =
    p_t(k_j) / max_j' p_t(k_j')`` over the distinct classes ``k_j`` of the
    states (blank first; one exp per frame and class, no log),
    ``frame_max[t]`` the log of that maximum, ``column[s]`` the ``j`` of
    state ``s``, ``used[j]`` the class ``k_j``, and whether a probability from a finite score came out
    below ``_FLUSH``.
    """
    n_cls = logp.shape[2]
    n_states = lab.shape[0]
    # Buffers: only np.empty(n, np.int64 / np.float64) and np.empty((m, n),
    # np.float64) in these kernels, filled by loops: every other form of
    # np.full/np.zeros/np.empty is one more overload numba compiles at the first call.
    slot = np.empty(n_cls, np.int64)
    for k in range(n_cls):
        slot[k] = -1
    used = np.empty((n_states + 1) // 2, np.int64)
    n_used = 0
    column = np.empty(n_states, np.int64)
    for s in range(n_states):
        k = lab[s]
        if slot[k] < 0:
            slot[k] = n_used
            used[n_used] = k
            n_used += 1
        column[s] = slot[k]
    probs = scratch[:input_len * n_used].reshape((input_len, n_used))
    frame_max = np.empty(input_len, np.float64)
    scores = np.empty(n_used, np.float64)
    n_flushed = 0
    for t in range(input_len):
        row = probs[t]
        logp_t = logp[t, b]
        m = -np.inf
        for j in range(n_used):  # the gather, and the maximum (NaN if any is NaN)
            v = np.float64(logp_t[_U(used[j])])
            scores[j] = v
            m = v if v > m or v != v else m
        if m == -np.inf:  # every needed class impossible here: all zeros, no NaN
            m = 0.0
        frame_max[t] = m
        n_frame = 0
        if n_used >= _PACKED_EXP_MIN:
            for j in range(n_used):  # branch-free exp (`exp_poly`): packed
                x = scores[j]
                p = exp_poly(x - m)
                row[j] = p
                n_frame += (p < _FLUSH) & (x != -np.inf)
        else:
            for j in range(n_used):
                x = scores[j]
                p = fast_exp(x - m)
                row[j] = p
                n_frame += (p < _FLUSH) & (x != -np.inf)
        if n_frame:
            # (rare) a class hundreds of nats below the frame's best: `fast_exp`
            # keeps the C library's subnormals where `exp_poly` gives 0 below
            # -708, so that such posteriors still come out as signed zeros
            for j in range(n_used):
                row[j] = fast_exp(scores[j] - m)
            n_flushed += n_frame
    return probs, frame_max, column, used[:n_used], n_flushed > 0


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_forward_linear(probs, frame_max, column, skip_f, flushed, scratch, prow):
    """Rescaled forward: ``(alpha, log_scale, status, logz, flushed)``.

    Specialised, not the shared log/tropical trellis: products of rescaled
    probabilities, no exp/log per cell (several times faster, see above).

    ``alpha[t, 2 + s]`` (two guard columns of zeros before state 0, two
    after the last) sums to 1 over the frame's band; ``log_scale[t]`` is the
    log of what frames ``0..t`` divided out (frame maxima included).
    ``status``: 0 fine, 1 fall back to log space (a frame's mass below
    ``_TINY``), 2 NaN or ``+inf``.  ``flushed`` is or-ed with whether a cell
    whose inputs are positive came out below ``_FLUSH``.
    """
    input_len = probs.shape[0]
    n_states = column.shape[0]
    # Only the band [lo, hi] of each row is written; the recursion reads the row
    # before at s, s - 1, s - 2 for s in the band: inside that row's band, its
    # guard columns, or the two cells above its band (zeroed below).
    alpha = scratch[:input_len * (n_states + 4)].reshape((input_len, n_states + 4))
    log_scale = np.empty(input_len, np.float64)
    status = 0
    acc = 0.0
    n_flushed = 0
    for t in range(input_len):
        lo = max(0, n_states - 2 * (input_len - t))
        hi = min(n_states - 1, 2 * t + 1)
        row = alpha[t]
        row[0] = 0.0
        row[1] = 0.0
        row[hi + 3] = 0.0
        row[hi + 4] = 0.0
        p_t = probs[t]
        lo_u = _U(lo)
        width = hi + 1 - lo
        for i in range(width):  # the gather, out of the recursion
            s = lo_u + _U(i)
            prow[s] = p_t[_U(column[s])]
        if t == 0:
            for i in range(width):
                s = lo_u + _U(i)
                p = prow[s]
                n_flushed += (p < _FLUSH) & (p > 0.0)
                row[s + _U2] = p
        else:
            prev = alpha[t - 1]
            for i in range(width):  # branch-free: packed on AVX2/AVX-512
                s = lo_u + _U(i)
                v = prev[s + _U2] + prev[s + _U1]
                v += prev[s] if skip_f[s] != 0.0 else 0.0
                p = prow[s]
                w = v * p
                n_flushed += (w < _FLUSH) & (v > 0.0) & (p > 0.0)
                row[s + _U2] = w
        c = _lane_sum(row, lo + 2, hi + 2)
        if c != c or c == np.inf:
            status = 2
            break
        if c < _TINY:
            status = 1
            break
        inv = 1.0 / c
        for i in range(width):
            row[lo_u + _U(i + 2)] *= inv
        acc += math.log(c) + frame_max[t]
        log_scale[t] = acc
    flushed = flushed or n_flushed > 0
    logz = 0.0
    if status == 0:
        zfin = alpha[input_len - 1, n_states + 1]
        if n_states > 1:
            zfin += alpha[input_len - 1, n_states]
        if zfin < _TINY:
            status = 1
        else:
            logz = log_scale[input_len - 1] + math.log(zfin)
    return alpha, log_scale, status, logz, flushed


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_backward_linear(b, alpha, log_scale, probs, frame_max, column, used, skip_f, prow, logz,
                         want_grad, grad, scale):
    """Rescaled backward sweep with the per-frame check; returns the status
    (0 fine, 1 fall back to log space).  Specialised like
    `_ctc_forward_linear` (``alpha`` with its guard columns).

    With ``want_grad`` writes ``-scale * posterior`` into ``grad[t, b, :]``;
    on a failed check the rows written so far are zeroed again.  Without it
    only the check runs (the verdict on a flushed forward's loss).
    """
    input_len = probs.shape[0]
    n_states = column.shape[0]
    status = 0
    beta = np.empty(n_states, np.float64)
    # emission times beta at the frame after, two guard zeros after the last state
    emit_beta = np.empty(n_states + 2, np.float64)
    # alpha * beta per state; a zero before and after the band (`_pair_lane_sums`)
    ab = np.empty(n_states + 1, np.float64)
    for s in range(n_states):
        beta[s] = 0.0
        ab[s] = 0.0
    ab[n_states] = 0.0
    emit_beta[n_states] = 0.0
    emit_beta[n_states + 1] = 0.0
    # Per distinct class of the target (``used[j]``, the column j of
    # `_ctc_frame_probs`, blank first): its summed alpha * beta at the frame.
    row = np.empty(used.shape[0] if want_grad else 0, np.float64)
    for j in range(row.shape[0]):
        row[j] = 0.0
    beta[n_states - 1] = 1.0
    if n_states > 1:
        beta[n_states - 2] = 1.0
    log_beta_scale = 0.0
    bscale = 1.0  # beta holds beta-hat / bscale: its normalisation is deferred
    for t in range(input_len - 1, -1, -1):
        lo = max(0, n_states - 2 * (input_len - t))
        hi = min(n_states - 1, 2 * t + 1)
        a_row = alpha[t]
        lo_u = _U(lo)
        if t < input_len - 1:
            hi1 = min(n_states - 1, 2 * t + 3)
            p_t = probs[t + 1]
            for i in range(hi1 + 1 - lo):  # the gather, out of the recursion
                s = lo_u + _U(i)
                prow[s] = p_t[_U(column[s])]
            for i in range(hi1 + 1 - lo):
                s = lo_u + _U(i)
                emit_beta[s] = beta[s] * bscale * prow[s]
            emit_beta[hi1 + 1] = 0.0
            emit_beta[hi1 + 2] = 0.0
            for i in range(hi + 1 - lo):  # branch-free: packed on AVX2/AVX-512
                s = lo_u + _U(i)
                v = emit_beta[s] + emit_beta[s + _U1]
                v += emit_beta[s + _U2] if skip_f[s + _U2] != 0.0 else 0.0
                beta[s] = v
            # States above hi are never read again (the window shrinks
            # going back), those below lo were never written.
            d = _lane_sum(beta, lo, hi)
            if not d >= _TINY:
                status = 1
                break
        for i in range(hi + 1 - lo):
            s = lo_u + _U(i)
            ab[s] = a_row[s + _U2] * beta[s]
        ab[hi + 1] = 0.0  # (cells below lo were never written: zeros)
        blank_ab, label_ab = _pair_lane_sums(ab, lo, hi)
        r = blank_ab + label_ab  # sum of alpha * beta as stored (beta-hat / bscale)
        if t < input_len - 1:
            bscale = 1.0 / d
            log_beta_scale += math.log(d) + frame_max[t + 1]
        # Every path crosses frame t exactly once: the posteriors sum to 1.
        expected = math.exp(logz - log_scale[t] - log_beta_scale)  # (once a frame)
        if not (abs(r * bscale - expected) <= _CHECK_TOL * expected and r >= _TINY):
            status = 1  # (an underflowed r would also divide by zero below)
            break
        if want_grad:
            # The class scatter, a pass of its own: blanks at the even states
            # (their lanes' sum), labels at the odd ones, in state order.
            row[0] = blank_ab
            for s in range((lo | 1), hi + 1, 2):
                row[column[s]] += ab[s]
            # row holds alpha * beta as stored: posterior = row / r.
            _store_row(grad, t, b, used, row, scale / r)
    if status == 1 and want_grad:
        _fill_rows(grad, b, 0, input_len, 0.0)
    return status


# The batch kernels: the same argument list ``(order, inputs..., outputs...)``;
# each processes exactly the sequences listed in the int64 array ``order`` and
# writes only their entries of the preallocated outputs ``losses`` (N,) float64,
# ``grad`` (like logp, or (0, 0, 0) without a gradient) and ``pending`` (N,) int8.
#
# Compile time (a user's first call, issue 19): the per-sequence steps live in the
# batch loop itself, not in a function of their own that the loop calls (numba
# would compile that function, then link, re-optimise and re-emit it into the
# loop's module: 0.6 s more), nor in one inlined into the loop (numba's inliner
# copies and retypes its IR: 1.4 s more).  The steps below are inlined (as a
# function of its own, the backward sweep compiled as fast but ran 3% slower).
# `_fill_rows` (four call sites, once per sequence) is compiled once instead
# (`HELPER`: no wrappers); a helper compiled on its own is called, not inlined,
# so those called every frame stay inlined.


@numba.njit(cache=True, nogil=True)
def _ctc_batch_serial(order, logp, targets, in_len, tg_len, blank, want_grad, zero_inf, gscale,
                      losses, grad, pending):
    """Loss (and gradient, times ``gscale[b]`` if given) of each sequence ``b`` of
    ``order``; see the module docstring.  Writes ``losses[b]``, ``grad[:, b, :]``
    and ``pending[b]`` only.

    Steps per sequence: validate; frame probabilities (`_ctc_frame_probs`);
    rescaled forward (`_ctc_forward_linear`); backward sweep with the per-frame
    check (`_ctc_backward_linear`).  Where linear space lost precision,
    ``pending[b]`` is set (1: the gradient only, 2: loss and gradient) and the
    driver runs the exact log-space trellis afterwards (`_ctc_log_space_batch`,
    a kernel compiled only when first needed).
    """
    # One alpha and one probs buffer for all the sequences of this call, sized for
    # the largest: a fresh multi-megabyte array per sequence came from fresh pages
    # (mmap), and their page faults cost as much as the whole vectorised forward.
    t_max, _, n_cls = logp.shape
    s_cap = targets.shape[1]
    need = 0
    need_probs = 0
    for i in range(order.shape[0]):
        b = order[i]
        n_lab = min(max(tg_len[b], 0), s_cap)
        frames = min(max(in_len[b], 0), t_max)
        need = max(need, frames * (2 * n_lab + 5))
        # (distinct classes of the target, blank included: at most L + 1 and C)
        need_probs = max(need_probs, frames * min(n_lab + 1, n_cls))
    alpha_buf = np.empty(need, np.float64)
    probs_buf = np.empty(need_probs, np.float64)
    for i in range(order.shape[0]):
        b = order[i]
        scale = gscale[b] if gscale.shape[0] > b else 1.0
        input_len = in_len[b]
        target_len = tg_len[b]
        pending[b] = 0
        # Memory safety first: anything out of range makes the sequence NaN.
        ok = sequence_ok(targets, b, input_len, target_len, t_max, n_cls, blank, True)
        if want_grad:
            _fill_rows(grad, b, 0, t_max, 0.0)
        if not ok:
            losses[b] = np.nan
            if want_grad:
                _fill_rows(grad, b, 0, t_max, np.nan)
            continue
        if input_len == 0:
            losses[b] = 0.0 if target_len == 0 else (0.0 if zero_inf else np.inf)
            continue
        lab, skip = ctc_states(targets, b, target_len, blank)
        # flushed: did linear space lose anything?  Set when a positive quantity (a
        # probability from a finite score, or a cell whose inputs are positive)
        # comes out below _FLUSH: only then can the rescaled forward differ from the
        # exact one, and only then does the loss need the backward sweep's verdict.
        probs, frame_max, column, used, flushed = _ctc_frame_probs(b, logp, lab, input_len,
                                                                   probs_buf)
        n_states = lab.shape[0]
        # the skip rule as 1.0 / 0.0, two zeros after the last state (the backward
        # reads state s + 2's); the per-frame gathered probabilities
        skip_f = np.empty(n_states + 2, np.float64)
        for s in range(n_states):
            skip_f[s] = 1.0 if skip[s] else 0.0
        skip_f[n_states] = 0.0
        skip_f[n_states + 1] = 0.0
        prow = np.empty(n_states, np.float64)
        alpha, log_scale, state, logz, flushed = _ctc_forward_linear(
            probs, frame_max, column, skip_f, flushed, alpha_buf, prow)
        # Without a gradient the sweep still runs when the forward flushed something:
        # its per-frame check is the verdict on the loss, so a loss is the same number
        # whether or not a gradient was asked for.
        linear_loss = state == 0 and not flushed
        if state == 0 and (want_grad or flushed):
            state = _ctc_backward_linear(b, alpha, log_scale, probs, frame_max, column, used,
                                         skip_f, prow, logz, want_grad, grad, scale)
        if state == 2:
            losses[b] = np.nan
            if want_grad:
                _fill_rows(grad, b, 0, input_len, np.nan)
            continue
        if state == 1:
            # Linear space lost precision: the exact log-space trellis runs after the
            # batch (`_ctc_log_space_batch`).  1: nothing was flushed, so the
            # forward's log Z (kept, negated, in losses[b]) is exact and only the
            # gradient is recomputed; 2: both.
            pending[b] = 1 if linear_loss else 2
            losses[b] = -logz
            continue
        if logz == -np.inf:
            losses[b] = 0.0 if zero_inf else np.inf
            if want_grad:
                _fill_rows(grad, b, 0, input_len, 0.0)
            continue
        losses[b] = -logz


@numba.njit(cache=True, nogil=True)
def _ctc_log_space_batch(order, logp, targets, in_len, tg_len, blank, want_grad, zero_inf,
                         gscale, losses, grad, pending):
    """The sequences of ``order`` that `_ctc_batch_serial` marked in ``pending``,
    exactly in log space: the same steps, in the same order, as if the batch
    kernel had run them itself (their grad rows are already zero)."""
    for i in range(order.shape[0]):
        b = order[i]
        if pending[b] == 0:
            continue
        scale = gscale[b] if gscale.shape[0] > b else 1.0
        input_len = in_len[b]
        lab, skip = ctc_states(targets, b, tg_len[b], blank)
        if pending[b] == 1:
            # Nothing was flushed: the forward's log Z (losses[b]) stands.
            _ctc_log_space(b, input_len, lab, skip, logp, want_grad, grad, scale)
            continue
        logz = _ctc_log_space(b, input_len, lab, skip, logp, want_grad, grad, scale)
        if logz != logz:
            losses[b] = np.nan
            if want_grad:
                _fill_rows(grad, b, 0, input_len, np.nan)
        elif logz == -np.inf:
            losses[b] = 0.0 if zero_inf else np.inf
            if want_grad:
                _fill_rows(grad, b, 0, input_len, 0.0)
        else:
            losses[b] = -logz


def concat_to_padded(targets: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """Concatenated 1-D targets -> padded ``(N, max(target_lengths))`` (zeros as padding)."""
    n = target_lengths.shape[0]
    s = int(target_lengths.max()) if n else 0
    out = np.zeros((n, s), np.int64)
    if n and s:
        offsets = np.concatenate([[0], np.cumsum(target_lengths)[:-1]])
        idx = offsets[:, None] + np.arange(s)[None, :]
        valid = np.arange(s)[None, :] < target_lengths[:, None]
        out[valid] = targets[idx[valid]]
    return out


_NO_SCALE = np.zeros(0)
_SERIAL_ORDERS: dict = {}


def _serial_order(n: int) -> np.ndarray:
    """``np.arange(n)`` (int64), shared by the serial calls of batch size ``n``.

    Writeable (a read-only array is another numba type: a second compiled
    signature), but no kernel writes to ``order``.
    """
    order = _SERIAL_ORDERS.get(n)
    if order is None:
        if len(_SERIAL_ORDERS) >= 64:
            _SERIAL_ORDERS.clear()
        order = _SERIAL_ORDERS[n] = np.arange(n, dtype=np.int64)
    return order


def ctc_loss_and_grad(log_probs: npt.ArrayLike, targets: npt.ArrayLike,
                      input_lengths: npt.ArrayLike, target_lengths: npt.ArrayLike, *,
                      blank: int = 0, want_grad: bool = True, zero_infinity: bool = False,
                      grad_weights: npt.ArrayLike | None = None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-sequence CTC losses and their gradient w.r.t. ``log_probs``.

    Args:
      log_probs: ``(T, N, C)`` float32/float64 array of log-probabilities.
      targets: ``(N, S)`` integer array of padded targets.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      blank: blank class index.
      want_grad: compute the gradient (else only the forward pass runs).
      zero_infinity: infeasible sequences get loss 0 and zero gradient.
      grad_weights: optional ``(N,)`` float64 weights ``w``: the gradient is then
        that of ``w[b] * losses[b]`` (a reduction folded into the single store).

    Returns:
      ``(losses, grad)``: ``(N,)`` losses in ``log_probs.dtype``, and ``(T, N, C)``
      ``d losses[b] / d log_probs[:, b, :]`` in ``log_probs.dtype`` (``None`` if
      not ``want_grad``).
    """
    logp = np.ascontiguousarray(log_probs)
    n = logp.shape[1]
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64)
    gscale = (_NO_SCALE if grad_weights is None
              else np.ascontiguousarray(grad_weights, dtype=np.float64).reshape(n))
    t_max, s_cap = logp.shape[0], tg.shape[1]
    losses = np.empty(n)
    grad = np.empty_like(logp) if want_grad else np.empty((0, 0, 0), logp.dtype)
    pending = np.zeros(n, np.int8)
    cells = t_max * (2 * s_cap + 1) * n
    args = (logp, tg, il, tl, int(blank), bool(want_grad), bool(zero_infinity), gscale,
            losses, grad, pending)
    if n > 1 and cells >= _PARALLEL_MIN_CELLS:
        # For the threads: longest sequences first (stable: ties in batch order),
        # so that the chunks taken last are the short ones.  The order decides
        # only which thread runs which sequence, never a bit.
        cost = np.minimum(np.maximum(il, 0), t_max) * (
            2 * np.minimum(np.maximum(tl, 0), s_cap) + 1)
        run_batch(_ctc_batch_serial, np.argsort(-cost, kind="stable"), cells,
                  _PARALLEL_MIN_CELLS, args)
    elif _ctc_batch_serial.overloads:
        # one call on this thread, as run_batch would make it (minus its bookkeeping:
        # a few us of a small batch's step)
        _ctc_batch_serial(_serial_order(n), *args)
    else:  # this process's first call: run_batch pauses the collector while numba loads
        run_batch(_ctc_batch_serial, np.arange(n), cells, _PARALLEL_MIN_CELLS, args)
    # The exact log-space fallback compiles only when a call first needs it (and
    # under duoloss.warmup, with no sequence to run, so that it is cached).
    if np.count_nonzero(pending) or _numerics._compile_both:
        redo = np.flatnonzero(pending)
        run_batch(_ctc_log_space_batch, redo, t_max * (2 * s_cap + 1) * redo.shape[0],
                  _PARALLEL_MIN_CELLS, args)
    return losses.astype(logp.dtype, copy=False), (grad if want_grad else None)


def _ctc_run(arrays, want_grad, *, blank=0, zero_infinity=False, grad_weights=None):
    log_probs, targets, input_lengths, target_lengths = arrays
    losses, grad = ctc_loss_and_grad(
        log_probs, targets, input_lengths, target_lengths, blank=blank,
        want_grad=bool(want_grad[0]), zero_infinity=zero_infinity, grad_weights=grad_weights)
    return losses, (grad, None, None, None)


# (its gradient stores flush subnormals: `_flush_row`)
subnormal_free(_ctc_run)

#: The CTC loss for the frontends' adapters: arrays are
#: ``(log_probs (T,N,C), targets (N,S), input_lengths (N,), target_lengths (N,))``.
CTC_KERNEL = LossKernel(
    name="ctc_loss",
    run=_ctc_run,
    batch_axes=(1, 0, 0, 0),
    differentiable=(True, False, False, False),
    weighted=True,
)


_NO_REDUCTION = object()


def check_ctc_static(fn, lp_shape, lp_dtype, tg_shape, tg_dtype, il_shape, il_dtype,
                     tl_shape, tl_dtype, blank, reduction=_NO_REDUCTION, *, cache=True):
    """Shape/dtype checks of ``ctc_loss``'s arguments (valid on tracers too).

    ``reduction`` is checked unless left out (the aligners have none); ``None``
    is an invalid reduction, not a missing one.  Shapes are tuples.

    Returns ``(batched, concatenated)``: whether ``log_probs`` is ``(T, N, C)``
    (else ``(T, C)``), and whether ``targets`` is 1-D concatenated.

    NB: a training loop calls this with the same arguments at every step, so
    passing results are cached (by value and type) unless ``cache=False`` (for
    callers traced by torch.compile, which warns about cached functions);
    failures are not cached.
    """
    args = (fn, lp_shape, lp_dtype, tg_shape, tg_dtype, il_shape, il_dtype, tl_shape, tl_dtype,
            blank, reduction)
    if cache:
        try:
            return _check_ctc_static_cached(*args)
        except TypeError:  # an unhashable argument, or a failed dtype check: no caching
            pass
    return _check_ctc_static(*args)


def _check_ctc_static(fn, lp_shape, lp_dtype, tg_shape, tg_dtype, il_shape, il_dtype,
                      tl_shape, tl_dtype, blank, reduction):
    from .. import _validate as v

    v.check_dtype(fn, "log_probs", lp_dtype, v.FLOAT_DTYPES, "a floating")
    ndim = v.check_ndim(fn, "log_probs", lp_shape, (2, 3), "(T, N, C) or unbatched (T, C)")
    batched = ndim == 3
    n_cls = lp_shape[-1]
    if n_cls < 1:
        raise ValueError(f"{fn}: argument 'log_probs' must have at least one class (C >= 1), "
                         f"got shape {v.shape_str(lp_shape)}")
    v.check_int_scalar(fn, "blank", blank, 0, n_cls)
    if reduction is not _NO_REDUCTION:
        v.check_reduction(fn, reduction)
    v.check_dtype(fn, "targets", tg_dtype, v.INT_DTYPES, "an integer")
    v.check_dtype(fn, "input_lengths", il_dtype, v.INT_DTYPES, "an integer")
    v.check_dtype(fn, "target_lengths", tl_dtype, v.INT_DTYPES, "an integer")
    if batched:
        n = lp_shape[1]
        v.check_ndim(fn, "targets", tg_shape, (1, 2),
                     f"padded (N, S) = ({n}, S) or concatenated 1-D")
        concatenated = len(tg_shape) == 1
        if not concatenated and tg_shape[0] != n:
            raise ValueError(f"{fn}: argument 'targets' must have N = {n} rows (batch size of "
                             f"log_probs), got shape {v.shape_str(tg_shape)}"
                             + v.batch_first_hint(lp_shape, tg_shape[0]))
        for arg, shape in (("input_lengths", il_shape), ("target_lengths", tl_shape)):
            if tuple(shape) != (n,):
                hint = v.batch_first_hint(lp_shape, shape[0]) if len(shape) == 1 else ""
                raise ValueError(f"{fn}: argument '{arg}' must have shape ({n},) (one length per "
                                 f"sequence), got shape {v.shape_str(shape)}" + hint)
    else:
        concatenated = False
        v.check_ndim(fn, "targets", tg_shape, (1,), "1-D (S,) for unbatched (T, C) log_probs")
        for arg, shape in (("input_lengths", il_shape), ("target_lengths", tl_shape)):
            if tuple(shape) not in ((), (1,)):
                raise ValueError(f"{fn}: argument '{arg}' must be a scalar for unbatched (T, C) "
                                 f"log_probs, got shape {v.shape_str(shape)}")
    return batched, concatenated


_check_ctc_static_cached = functools.lru_cache(maxsize=256, typed=True)(_check_ctc_static)


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` (shared, read-only)."""
    a = np.arange(n)
    a.flags.writeable = False
    return a


#: `_first_invalid` checks up to this many target entries (N * S) on Python lists:
#: its numpy reductions cost about 6 us together whatever the size, the whole check
#: in Python about 2 us at N = 1, S = 10 (and as much as numpy's at N * S = 80).
_SMALL_CHECK = 64


def _first_invalid_small(rows, in_len, tg_len, s_cap, t_max, n_cls, blank):
    """`_first_invalid` on Python lists (``rows``: N >= 1 lists of S ints): the same
    checks in the same order, each a builtin min/max/containment first."""
    if min(in_len) < 0 or max(in_len) > t_max:
        b = next(b for b, v in enumerate(in_len) if v < 0 or v > t_max)
        return 1, b, 0, in_len[b]
    if min(tg_len) < 0 or max(tg_len) > s_cap:
        b = next(b for b, v in enumerate(tg_len) if v < 0 or v > s_cap)
        return 2, b, 0, tg_len[b]
    for b, row in enumerate(rows):
        labels = row[:tg_len[b]]
        if labels and (min(labels) < 0 or max(labels) >= n_cls or blank in labels):
            for i, y in enumerate(labels):
                if y < 0 or y >= n_cls:
                    return 3, b, i, y
                if y == blank:
                    return 4, b, i, y
    return 0, 0, 0, 0


def _first_invalid(targets, in_len, tg_len, t_max, n_cls, blank):
    """(code, b, i, value) of the first invalid entry; code 0 when all is valid.

    Codes: 1 input length, 2 target length, 3 label out of range, 4 blank in target.
    ``targets`` is ``(N, S)``, the lengths ``(N,)``: int64 numpy arrays.  Plain
    numpy (a numba kernel here cost ~0.8 s of compile at the first call); the
    int64 values are read as uint64 so that one comparison catches negatives too.
    """
    in_len = np.asarray(in_len, np.int64)
    tg_len = np.asarray(tg_len, np.int64)
    targets = np.asarray(targets, np.int64)
    n, s_cap = targets.shape
    if n == 0:
        return 0, 0, 0, 0
    if n * s_cap <= _SMALL_CHECK:
        return _first_invalid_small(targets.tolist(), in_len.tolist(), tg_len.tolist(), s_cap,
                                    t_max, n_cls, blank)
    # (one reduction per check on the valid path: a per-call cost of every step)
    if in_len.view(np.uint64).max() > t_max:
        b = int((in_len.view(np.uint64) > t_max).argmax())
        return 1, b, 0, int(in_len[b])
    if tg_len.view(np.uint64).max() > s_cap:
        b = int((tg_len.view(np.uint64) > s_cap).argmax())
        return 2, b, 0, int(tg_len[b])
    bad = targets.view(np.uint64) >= n_cls
    np.logical_or(bad, targets == blank, out=bad)
    if not bad.any():  # (padding included: nothing to mask)
        return 0, 0, 0, 0
    bad &= _arange(s_cap) < tg_len[:, None]
    if not bad.any():
        return 0, 0, 0, 0
    b, i = divmod(int(bad.argmax()), s_cap)  # row-major: b first, then i, as the loops ran
    y = int(targets[b, i])
    return (3 if y < 0 or y >= n_cls else 4), b, i, y


def check_ctc_values(fn, targets, input_lengths, target_lengths, t_max, n_cls, blank,
                     concatenated):
    """Value checks on concrete int64 numpy arrays; returns the padded ``(N, S)`` targets.

    ``targets`` is ``(N, S)`` padded or, with ``concatenated``, 1-D.
    """
    from .. import _validate as v

    if not concatenated:
        code, b, i, val = _first_invalid(targets, input_lengths, target_lengths, t_max, n_cls,
                                         blank)
        if code == 0:
            return targets
    v.check_lengths(fn, "input_lengths", input_lengths, t_max, "T, the number of frames")
    if concatenated:
        if target_lengths.size and target_lengths.min() < 0:
            v.check_lengths(fn, "target_lengths", target_lengths, targets.shape[0],
                            "the concatenated targets' size")
        total = int(target_lengths.sum())
        if total != targets.shape[0]:
            raise ValueError(f"{fn}: argument 'target_lengths' must sum to the size of the "
                             f"concatenated 1-D targets ({targets.shape[0]}), got sum {total}")
        padded = concat_to_padded(targets, target_lengths)
    else:
        v.check_lengths(fn, "target_lengths", target_lengths, targets.shape[1],
                        "S, the padded target length")
        padded = targets
    v.check_labels(fn, "targets", padded, target_lengths, n_cls, forbidden=blank,
                   forbidden_what="the blank index")
    return padded


# ---- the gathered crossing ---------------------------------------------------
# A sequence's CTC reads only the blank and its own labels.  With a large
# vocabulary the frontends gather those columns in the framework, on the input's
# device, into a ``(T, N, S+1)`` array (column 0: the blank; column ``1+i``: the
# class of label ``i``) and run the same kernel on it with ``blank=0`` and each
# label replaced by the column of its FIRST occurrence in the target (so repeated
# labels share a column and the skip rule, which compares labels, is unchanged).
# The per-sequence arithmetic is then identical — same values, same order — so
# losses are bit-identical to the full-width call, and the framework's autograd
# scatters the gathered gradient back (zero for every class the target does not
# use; for a NaN sequence only its own columns are NaN).

#: Gather when C >= this many times (S+1) ...
GATHER_MIN_RATIO = 4
#: ... and the full tensor has at least this many entries (below, a host copy of
#: the whole tensor is cheaper than the framework ops of the gather).
GATHER_MIN_SIZE = 1 << 18


def ctc_gather_worthwhile(t_max: int, n: int, n_cls: int, s: int) -> bool:
    """Whether the frontends should gather ``(T, N, C)`` to ``(T, N, S+1)``."""
    return n_cls >= GATHER_MIN_RATIO * (s + 1) and t_max * n * n_cls >= GATHER_MIN_SIZE


def ctc_gather_plan(targets: np.ndarray, target_lengths: np.ndarray, n_cls: int, blank: int):
    """Host version (numpy) of `duoloss._xp.ctc.gather_plan`:
    ``(columns (N, S+1), column_targets (N, S))`` int64.

    ``columns[b]`` lists the classes to gather (blank first, then the target's
    labels in order; padding reads the blank); ``column_targets[b, i]`` is the
    gathered column of label ``i`` (its first occurrence), or -1 for a label
    that is out of range or the blank (the kernel then returns NaN for that
    sequence, as it would on the full tensor).
    """
    from duoloss._xp import NumpyOps, ctc  # one copy of the plan for every frontend

    return ctc.gather_plan(NumpyOps, np.asarray(targets).astype(np.int64, copy=False),
                           np.asarray(target_lengths), n_cls, blank)
