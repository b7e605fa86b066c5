r"""Viterbi forced alignment (tropical semiring) for CTC and ASG on numpy buffers.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``S`` padded target
length; sequence ``b`` has ``T_b = input_lengths[b]`` frames and ``L_b =
target_lengths[b]`` labels.

Both alignments run the same trellis as the corresponding loss with
``logsumexp`` replaced by ``max`` (the ASG aligner calls the loss module's exact
log-space trellis code with the tropical semiring as a compile-time constant; the
CTC aligner runs the same recursion, cell for cell, in a branch-free vectorised
row, `_ctc_tropical_row`; both recompute each back-pointer while backtracking
instead of storing them) and return the best path:

.. math::

    \delta_t(s) = w_t(s) + \max_{s' \in \text{pred}(s)} \left(\delta_{t-1}(s')
        + a(s' \to s)\right), \qquad
    \text{score}_b = \max_{s \in \text{final}} \delta_{T_b - 1}(s).

* CTC (`ctc_align`): states are the ``2L+1`` blank/label states of the
  CTC acceptor, $w_t(s) = \log p_t(z_s)$, no arc weights.  The frame
  labels include the blank, like ``torchaudio.functional.forced_align``.
* ASG (`asg_align`): states are the ``L`` target positions (each token
  spans >= 1 frame), $w_t(l) = e_t(y_l)$, arc weights are the
  transitions ($A_{y_l y_l}$ to stay, $A_{y_l y_{l-1}}$ to
  advance) and the start score $s_{y_1}$ at the first frame.
* ASG decoding (`asg_viterbi`): the best *unconstrained* labelling
  (GTN's ``viterbi_path(compose(E, Trans))``), over all ``C`` tokens.
* Target graphs (`graph_align`): nodes of one acceptor per sequence,
  $w_t(a) = e_t(k_a)$ plus the arc weight (GTN's
  ``viterbi_path(intersect(G, E))``); also returns the arc used at each frame.

The gradient of a Viterbi score w.r.t. the scores is the indicator (count) of
the arcs on the returned path; it is not provided here.

**Memory**: a sequence of more than ``CTC_CHECKPOINT_CELLS`` (CTC) or
``ASG_CHECKPOINT_CELLS`` (ASG forced alignment) trellis cells is aligned without
its full table: the forward keeps two rows and every ``k``-th row, and the
backtrace recomputes each stretch of ``k`` frames from its checkpoint on the
window of states the path can still reach (`_ctc_align_checkpointed`,
`_asg_align_checkpointed`), ``O((T S)^(2/3))`` floats.  Labels, scores and
ties are the full table's, bit for bit.  The batch kernel only marks such a
sequence pending; a separate kernel (`_ctc_align_big`, `_asg_align_big`) aligns
the pending ones, so the bounded-memory code compiles only when a call needs it
(and in ``duoloss.warmup``).

**Ties** are broken deterministically: whenever two predecessors (or two final
states) have the same score, the one with the **higher state index** wins
(CTC: stay > advance by one > skip; the trailing blank ``2L`` over the last
label ``2L-1``; ASG: stay > advance; decoding: the larger previous token).
On backtracking this keeps labels as early as possible and blanks as late as
possible.  Target graphs have no state order: there the first arc in the
graph's arc order (and the lowest accept node) wins, like GTN's first maximum.

**Padding**: frames at or beyond ``T_b`` get label ``-1``.  An infeasible
sequence (too few frames, or every path ``-inf``) gets score ``-inf`` and all
labels ``-1``; ``T_b = L_b = 0`` gives score 0.  Invalid labels or lengths
(possible only for traced JAX values) give score NaN and labels ``-1``; a NaN
among the scores gives a NaN score (its labels are then a valid path but
otherwise arbitrary).

References:
  Viterbi, "Error bounds for convolutional codes and an asymptotically optimum
  decoding algorithm", IEEE Trans. Inf. Theory, 1967.
  torchaudio.functional.forced_align (frame-label layout).
"""
from __future__ import annotations


import numba
import numpy as np
import numpy.typing as npt

from .asg import _asg_best_previous_token, _asg_token_final, _asg_token_forward
from .asg import _asg_best_target_step, _asg_target_forward, _asg_target_weights
from .ctc import ctc_states
from .ctc import _ctc_best_step
from .graph_loss import PackedGraphs, _frames_forward, _load_graph
from .. import _numerics
from .._numerics import HELPER
from .._numerics import NEG_INF as _NEG_INF
from .._numerics import sequence_ok
from .._pool import run_batch

__all__ = ["ctc_align", "asg_align", "asg_viterbi", "graph_align", "token_spans",
           "check_token_spans_args", "count_token_spans"]

_PARALLEL_MIN_CELLS = 200_000
# numba wraps a negative signed index around (a select per access, which makes
# contiguous loads gathers); unsigned indices it takes as they are.
_U = np.uint64
#: Pending (bounded-memory) sequences of more cells than this, together, run on threads.
_PENDING_THREADS_MIN_CELLS = _PARALLEL_MIN_CELLS


def _run(kernel, cells, args):
    """Run a batch kernel ``kernel(order, *args)`` over the sequences, largest
    first (on several threads for a large batch: `duoloss.core._pool.run_batch`);
    returns ``order``."""
    order = np.argsort(-cells, kind="stable").astype(np.int64)
    run_batch(kernel, order, int(cells.sum()), _PARALLEL_MIN_CELLS, tuple(args))
    return order


def _run_pending(kernel, order, pending, cells, args):
    """Run ``kernel(idx, *args)`` on the sequences the batch kernel marked
    ``pending`` (the bounded-memory path, compiled only when a sequence needs it),
    largest first; several of them, with enough cells, on the thread pool
    (`duoloss.core._pool.run_batch`).  While ``duoloss.warmup`` runs
    (`duoloss.core._numerics._compile_both`) an empty batch still calls the
    kernel, so that it compiles with the signature real calls use."""
    idx = np.ascontiguousarray(order[pending[order] != 0], dtype=np.int64)
    m = idx.shape[0]
    if m == 0:
        if _numerics._compile_both:
            kernel(idx, *args)
        return
    run_batch(kernel, idx, int(cells[idx].sum()), _PENDING_THREADS_MIN_CELLS, tuple(args))


# --------------------------------------------------------------------------- #
# CTC                                                                          #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER)
def _ctc_align_one(b, logp, targets, in_len, tg_len, blank, checkpoint_cells, labels, scores,
                   pending):
    """Viterbi alignment of sequence ``b``: the CTC trellis of
    `duoloss.core.losses.ctc._ctc_trellis_forward` in the tropical semiring.

    No back-pointers are stored: backtracking asks
    `_ctc_best_step` again, on the same table
    values, so it takes the same steps (and ties) as the forward did.  A
    sequence of more than ``checkpoint_cells`` trellis cells is only marked
    (``pending[b] = 1``, its labels ``-1``): `_ctc_align_big` then aligns it
    on the bounded-memory path (`_ctc_align_checkpointed`), which reads the
    same values.
    """
    t_max, _, n_cls = logp.shape
    input_len = in_len[b]
    target_len = tg_len[b]
    for t in range(t_max):
        labels[b, t] = -1
    ok = sequence_ok(targets, b, input_len, target_len, t_max, n_cls, blank, True)
    if not ok:
        scores[b] = np.nan
        return
    if input_len == 0:
        scores[b] = 0.0 if target_len == 0 else _NEG_INF
        return
    lab, skip = ctc_states(targets, b, target_len, blank)
    n_states = lab.shape[0]
    if input_len * n_states > checkpoint_cells:
        pending[b] = 1
        return
    # delta[t, 2 + s]: the table of `_ctc_trellis_forward` in the tropical semiring
    # (the same values, bit for bit) with two guard columns of -inf, row by row
    # with the branch-free `_ctc_tropical_row`
    delta = np.empty((input_len, n_states + 2))
    emit = np.empty(n_states)
    skip_f = np.empty(n_states, np.float32)  # (4 bytes a state: rows are L2-bound)
    for x in range(n_states):
        skip_f[x] = 1.0 if skip[x] else 0.0
    _ctc_tropical_first_row(b, input_len, lab, logp, delta[0])
    for t in range(1, input_len):
        _ctc_tropical_row(b, t, input_len, lab, skip_f, logp, delta[t - 1], delta[t], 0,
                          n_states - 1, emit)
    last = delta[input_len - 1]
    s = n_states - 1  # the trailing blank wins a tie (`_ctc_trellis_final`)
    if n_states > 1 and last[n_states] > last[n_states + 1]:
        s = n_states - 2
    score = last[2 + s]
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score  # NaN included: the labels are then a valid, arbitrary path
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = lab[s]
        if t > 0:
            row = delta[t - 1]
            _, step = _ctc_best_step(row[2 + s], row[1 + s] if s >= 1 else _NEG_INF,
                                     row[s] if skip[s] else _NEG_INF)
            s -= step


# ---- bounded memory: checkpointed rows, windowed recomputation ---------------
# The forward keeps two rows and a copy of every k-th row (the checkpoints).  The
# backtrace needs row t-1 only at the states s, s-1, s-2 below the path's state s
# at frame t; walking back from state s_e at frame e to a checkpoint c, the path
# stays at states >= s_e - 2 (e - c), and a state x of row r depends on row r-1
# at x, x-1, x-2 only.  So the rows c..e-1 are recomputed from the checkpoint on
# the window [s_e - 2 (e - c), s_e] alone: every cell the backtrace reads comes
# out bit-identical to the full table's (same operations on the same values;
# cells near the window's lower edge may differ, and are never read).  Memory:
# (T / k) S + k (2k + 1) floats; with k ~ (T S / 4)^(1/3) this is
# O((T S)^(2/3)), at most S sqrt(T) + 2T; time: one forward over the T x S
# trellis plus about 2 k T cells of recomputation.


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_tropical_row(b, t, input_len, lab, skip_f, logp, prev, cur, w_lo, w_hi, emit):
    """Row ``t`` (``t >= 1``) of the tropical CTC trellis on the states
    ``[w_lo, w_hi]`` (``cur[2 + x - w_lo]``: two guard cells of ``-inf``
    before the window) from row ``t - 1`` on the same window (states below
    ``w_lo`` read as ``-inf``); cells outside the frame's band are ``-inf``,
    as in `_ctc_trellis_forward`.

    Branch-free and vectorised along the row (AVX2/AVX-512): the emissions are
    gathered first into ``emit`` (one pass), the skip rule is the float mask
    ``skip_f``, the maximum is `_ctc_best_step`'s (``x if x > best else
    best``, an exact ``vmaxpd``: the same value, NaN included), and the
    indices are unsigned (numba's wraparound of a signed index turned the
    contiguous loads into gathers).  The values are those of the branchy form,
    bit for bit."""
    n_states = lab.shape[0]
    lo = max(0, n_states - 2 * (input_len - t))
    hi = min(n_states - 1, 2 * t + 1)
    a = max(lo, w_lo)
    z = min(hi, w_hi)
    cur[0] = _NEG_INF
    cur[1] = _NEG_INF
    for x in range(w_lo, min(a, w_hi + 1)):
        cur[2 + x - w_lo] = _NEG_INF
    for x in range(max(z + 1, w_lo), w_hi + 1):
        cur[2 + x - w_lo] = _NEG_INF
    if z < a:
        return
    a_u = _U(a)
    off = _U(2 + a - w_lo)  # cur / prev index of state a
    logp_t = logp[t, b]
    for i in range(z + 1 - a):
        x = a_u + _U(i)
        emit[x] = logp_t[_U(lab[x])]
    for i in range(z + 1 - a):
        x = a_u + _U(i)
        j = off + _U(i)
        best = prev[j]
        advance = prev[j - _U(1)]
        best = advance if advance > best else best
        skip_over = prev[j - _U(2)] if skip_f[x] != 0.0 else _NEG_INF
        best = skip_over if skip_over > best else best
        cur[j] = best + emit[x]


@numba.njit(cache=True, nogil=True, inline="always")
def _ctc_tropical_first_row(b, input_len, lab, logp, row):
    """Row 0 of the tropical CTC trellis with its two guard cells (``row[2 + x]``):
    the emissions of the states a path can start in, ``-inf`` elsewhere."""
    n_states = lab.shape[0]
    row[0] = _NEG_INF
    row[1] = _NEG_INF
    hi0 = min(n_states - 1, 1)
    lo0 = max(0, n_states - 2 * input_len)
    for x in range(n_states):
        row[2 + x] = np.float64(logp[0, b, lab[x]]) if lo0 <= x <= hi0 else _NEG_INF


@numba.njit(cache=True, nogil=True)
def _ctc_segment(input_len, n_states):
    """The checkpoint spacing ``k``: about ``(T S / 4)^(1/3)`` (the memory
    optimum of ``(T / k) S + 2 k^2``), in ``[1, T]``."""
    k = int((input_len * n_states / 4.0) ** (1.0 / 3.0) + 0.5)
    return min(max(k, 1), input_len)


@numba.njit(**HELPER)
def _ctc_align_checkpointed(b, input_len, lab, skip, logp, labels, scores):
    """`_ctc_align_one`'s alignment and score in ``O((T S)^(2/3))`` memory
    (see the comment above).  Rows carry two guard cells before state 0 (or
    before the window's first state): `_ctc_tropical_row`."""
    n_states = lab.shape[0]
    k = _ctc_segment(input_len, n_states)
    n_seg = (input_len + k - 1) // k
    ckpt = np.empty((n_seg, n_states))
    rows = np.empty((2, n_states + 2))
    emit = np.empty(n_states)
    skip_f = np.empty(n_states, np.float32)  # (4 bytes a state: rows are L2-bound)
    for x in range(n_states):
        skip_f[x] = 1.0 if skip[x] else 0.0
    row0 = rows[0]
    _ctc_tropical_first_row(b, input_len, lab, logp, row0)
    for x in range(n_states):  # element loops: no array-broadcast setitem to compile
        ckpt[0, x] = row0[2 + x]
    for t in range(1, input_len):
        cur = rows[t & 1]
        _ctc_tropical_row(b, t, input_len, lab, skip_f, logp, rows[(t - 1) & 1], cur, 0,
                          n_states - 1, emit)
        if t % k == 0:
            ck = ckpt[t // k]
            for x in range(n_states):
                ck[_U(x)] = cur[_U(x + 2)]
    last = rows[(input_len - 1) & 1]
    s = n_states - 1
    if n_states > 1 and last[n_states] > last[n_states + 1]:
        s = n_states - 2
    score = last[2 + s]
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score  # NaN included, as _ctc_align_one
    buf = np.empty((k, 2 * k + 3))
    seg = -1
    c = 0
    w_lo = 0
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = lab[s]
        if t == 0:
            break
        j = (t - 1) // k
        if j != seg:
            # rows c..t-1 on the window [s - 2 (t - c), s]
            seg = j
            c = j * k
            w_lo = max(0, s - 2 * (t - c))
            w_hi = s
            buf[0, 0] = _NEG_INF
            buf[0, 1] = _NEG_INF
            ck = ckpt[j]
            b0 = buf[0]
            for x in range(w_hi + 1 - w_lo):
                b0[_U(x + 2)] = ck[_U(x + w_lo)]
            for r in range(c + 1, t):
                _ctc_tropical_row(b, r, input_len, lab, skip_f, logp, buf[r - 1 - c],
                                  buf[r - c], w_lo, w_hi, emit)
        row = buf[t - 1 - c]
        i = 2 + s - w_lo
        _, step = _ctc_best_step(row[i], row[i - 1] if s >= 1 else _NEG_INF,
                                 row[i - 2] if skip[s] else _NEG_INF)
        s -= step


@numba.njit(cache=True, nogil=True)
def _ctc_align_serial(order, logp, targets, in_len, tg_len, blank, checkpoint_cells, labels,
                      scores, pending):
    for i in range(order.shape[0]):
        _ctc_align_one(order[i], logp, targets, in_len, tg_len, blank, checkpoint_cells, labels,
                       scores, pending)


@numba.njit(cache=True, nogil=True)
def _ctc_align_big(order, logp, targets, in_len, tg_len, blank, labels, scores):
    """The sequences ``order`` that `_ctc_align_one` marked pending (valid, with
    ``T_b > 0``; labels already ``-1``), on the bounded-memory path."""
    for i in range(order.shape[0]):
        b = order[i]
        lab, skip = ctc_states(targets, b, tg_len[b], blank)
        _ctc_align_checkpointed(b, in_len[b], lab, skip, logp, labels, scores)


def _int_buffers(targets, input_lengths, target_lengths, n):
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    if tg.ndim != 2:
        tg = tg.reshape(n, -1)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64).reshape(n)
    return tg, il, tl


#: Sequences of more trellis cells (``T_b (2 L_b + 1)``) than this are aligned in
#: bounded memory (`_ctc_align_checkpointed`); below it the full table
#: (8 bytes a cell, 256 MiB at the threshold) is faster by a little.
CTC_CHECKPOINT_CELLS = 1 << 25


def ctc_align(log_probs: npt.ArrayLike, targets: npt.ArrayLike, input_lengths: npt.ArrayLike,
              target_lengths: npt.ArrayLike, *, blank: int = 0, _checkpoint_cells: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Viterbi CTC forced alignment of a batch.

    Args:
      log_probs: ``(T, N, C)`` float array of (log-)scores.
      targets: ``(N, S)`` integer padded targets (never ``blank``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      blank: the blank class.
      _checkpoint_cells: private: the size (trellis cells) above which a
        sequence takes the bounded-memory path (default
        `CTC_CHECKPOINT_CELLS`; 0 forces it, for tests).

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame labels (blank included, ``-1``
      past ``input_lengths[b]``) and ``(N,)`` best-path scores in the input's
      dtype (see the module docstring for ties and infeasible sequences).  Both
      paths give the same labels and scores, bit for bit.
    """
    logp = np.ascontiguousarray(log_probs)
    dtype = logp.dtype
    logp = logp.astype(np.float64, copy=False)  # one compiled signature
    t_max, n, _ = logp.shape
    tg, il, tl = _int_buffers(targets, input_lengths, target_lengths, n)
    labels = np.empty((n, t_max), np.int64)
    scores = np.empty(n, np.float64)
    if n:
        cells = np.clip(il, 0, t_max) * (2 * np.clip(tl, 0, tg.shape[1]) + 1)
        limit = CTC_CHECKPOINT_CELLS if _checkpoint_cells is None else int(_checkpoint_cells)
        pending = np.zeros(n, np.int8)
        order = _run(_ctc_align_serial, cells,
                     (logp, tg, il, tl, int(blank), limit, labels, scores, pending))
        _run_pending(_ctc_align_big, order, pending, cells,
                     (logp, tg, il, tl, int(blank), labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# ASG forced alignment                                                         #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER)
def _asg_align_one(b, em, trans, start, has_trans, targets, in_len, tg_len, checkpoint_cells,
                   labels, scores, pending):
    """Viterbi alignment of sequence ``b``: the target trellis of
    `duoloss.core.losses.asg._asg_target_forward` in the tropical semiring;
    backtracking asks `_asg_best_target_step` again
    instead of storing back-pointers.  Above ``checkpoint_cells`` cells the
    sequence is only marked (``pending[b] = 1``, labels ``-1``) for
    `_asg_align_big`: the bounded-memory path (`_asg_align_checkpointed`),
    same results."""
    t_max, _, n_cls = em.shape
    input_len = in_len[b]
    target_len = tg_len[b]
    for t in range(t_max):
        labels[b, t] = -1
    ok = sequence_ok(targets, b, input_len, target_len, t_max, n_cls, -1, False)
    if not ok:
        scores[b] = np.nan
        return
    if input_len == 0 or target_len == 0 or target_len > input_len:
        scores[b] = 0.0 if (input_len == 0 and target_len == 0) else _NEG_INF
        return
    if input_len * target_len > checkpoint_cells:
        pending[b] = 1
        return
    lab = np.empty(target_len, np.int64)
    for l in range(target_len):
        lab[l] = targets[b, l]
    stay, advance = _asg_target_weights(lab, trans, has_trans)
    delta = _asg_target_forward(b, input_len, lab, stay, advance, em, start, True)
    score = delta[input_len - 1, target_len - 1]
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score
    l = target_len - 1
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = lab[l]
        if t > 0:
            _, step = _asg_best_target_step(
                delta[t - 1, l] + stay[l], delta[t - 1, l - 1] + advance[l] if l >= 1 else _NEG_INF)
            l -= step


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_tropical_row(b, t, input_len, lab, stay, advance, em, prev, cur, w_lo, w_hi):
    """Row ``t >= 1`` of the tropical ASG target trellis on the positions
    ``[w_lo, w_hi]`` (``cur[x - w_lo]``), positions below ``w_lo`` read as
    ``-inf``; as `duoloss.core.losses.asg._asg_target_forward` on every
    cell the backtrace reads (the CTC comment above, with one position per
    frame instead of two)."""
    n_lab = lab.shape[0]
    lo = max(0, n_lab - (input_len - t))
    hi = min(n_lab - 1, t)
    a = max(lo, w_lo)
    z = min(hi, w_hi)
    for x in range(w_lo, min(a, w_hi + 1)):
        cur[x - w_lo] = _NEG_INF
    for x in range(max(z + 1, w_lo), w_hi + 1):
        cur[x - w_lo] = _NEG_INF
    for x in range(a, z + 1):
        i = x - w_lo
        v, _ = _asg_best_target_step(prev[i] + stay[x],
                                     prev[i - 1] + advance[x] if i >= 1 else _NEG_INF)
        cur[i] = v + np.float64(em[t, b, lab[x]])


@numba.njit(**HELPER)
def _asg_align_checkpointed(b, input_len, lab, stay, advance, em, start, labels, scores):
    """`_asg_align_one`'s alignment and score with checkpointed rows and a
    windowed recomputing traceback (``0 < L <= T``): ``(T / k) L + k (k + 1)``
    floats with ``k ~ (T L / 2)^(1/3)``."""
    n_lab = lab.shape[0]
    k = int((input_len * n_lab / 2.0) ** (1.0 / 3.0) + 0.5)
    k = min(max(k, 1), input_len)
    n_seg = (input_len + k - 1) // k
    ckpt = np.empty((n_seg, n_lab))
    rows = np.empty((2, n_lab))
    row0 = rows[0]
    for x in range(n_lab):
        row0[x] = _NEG_INF
    row0[0] = np.float64(start[lab[0]]) + np.float64(em[0, b, lab[0]])
    for x in range(n_lab):  # element loops: no array-broadcast setitem to compile
        ckpt[0, x] = row0[x]
    for t in range(1, input_len):
        cur = rows[t & 1]
        _asg_tropical_row(b, t, input_len, lab, stay, advance, em, rows[(t - 1) & 1], cur, 0,
                          n_lab - 1)
        if t % k == 0:
            for x in range(n_lab):
                ckpt[t // k, x] = cur[x]
    score = rows[(input_len - 1) & 1][n_lab - 1]
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score
    buf = np.empty((k, k + 1))
    seg = -1
    c = 0
    w_lo = 0
    l = n_lab - 1
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = lab[l]
        if t == 0:
            break
        j = (t - 1) // k
        if j != seg:
            # rows c..t-1 on the positions [l - (t - c), l]
            seg = j
            c = j * k
            w_lo = max(0, l - (t - c))
            for x in range(w_lo, l + 1):
                buf[0, x - w_lo] = ckpt[j, x]
            for r in range(c + 1, t):
                _asg_tropical_row(b, r, input_len, lab, stay, advance, em, buf[r - 1 - c],
                                  buf[r - c], w_lo, l)
        row = buf[t - 1 - c]
        i = l - w_lo
        _, step = _asg_best_target_step(row[i] + stay[l],
                                        row[i - 1] + advance[l] if l >= 1 else _NEG_INF)
        l -= step



@numba.njit(cache=True, nogil=True)
def _asg_align_serial(order, em, trans, start, has_trans, targets, in_len, tg_len,
                      checkpoint_cells, labels, scores, pending):
    for i in range(order.shape[0]):
        _asg_align_one(order[i], em, trans, start, has_trans, targets, in_len, tg_len,
                       checkpoint_cells, labels, scores, pending)


@numba.njit(cache=True, nogil=True)
def _asg_align_big(order, em, trans, start, has_trans, targets, in_len, tg_len, labels, scores):
    """The sequences ``order`` that `_asg_align_one` marked pending (valid,
    ``0 < L_b <= T_b``; labels already ``-1``), on the bounded-memory path."""
    for i in range(order.shape[0]):
        b = order[i]
        target_len = tg_len[b]
        lab = np.empty(target_len, np.int64)
        for l in range(target_len):
            lab[l] = targets[b, l]
        stay, advance = _asg_target_weights(lab, trans, has_trans)
        _asg_align_checkpointed(b, in_len[b], lab, stay, advance, em, start, labels, scores)


def _asg_params(em, transitions, start_transitions):
    n_cls = em.shape[2]
    has_trans = transitions is not None
    trans = (np.ascontiguousarray(transitions, dtype=np.float64) if has_trans
             else np.zeros((0, 0)))
    start = (np.ascontiguousarray(start_transitions, dtype=np.float64)
             if start_transitions is not None
             else np.zeros(n_cls))
    return has_trans, trans, start


#: ASG sequences of more target-trellis cells (``T_b L_b``) than this are aligned in
#: bounded memory (`_asg_align_checkpointed`).
ASG_CHECKPOINT_CELLS = 1 << 25


def asg_align(emissions: npt.ArrayLike, transitions: npt.ArrayLike, targets: npt.ArrayLike,
              input_lengths: npt.ArrayLike, target_lengths: npt.ArrayLike, *,
              start_transitions: npt.ArrayLike | None = None, _checkpoint_cells: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Viterbi ASG forced alignment of a batch.

    Args:
      emissions: ``(T, N, C)`` float array of unnormalised scores.
      transitions: ``(C, C)`` (``[i, j]`` = score of ``i`` after ``j``) or ``None``.
      targets: ``(N, S)`` integer padded targets, tokens in ``[0, C)``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      start_transitions: ``(C,)`` first-token scores or ``None``.
      _checkpoint_cells: private: the size (``T_b L_b`` cells) above which a
        sequence takes the bounded-memory path (default
        `ASG_CHECKPOINT_CELLS`; 0 forces it, for tests).

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame tokens (``-1`` past the
      sequence) and ``(N,)`` best-path scores (start + transitions + emissions)
      in the emissions' dtype; the same, bit for bit, on both paths.
    """
    em = np.ascontiguousarray(emissions)
    dtype = em.dtype
    em = em.astype(np.float64, copy=False)  # one compiled signature
    t_max, n, _ = em.shape
    has_trans, trans, start = _asg_params(em, transitions, start_transitions)
    tg, il, tl = _int_buffers(targets, input_lengths, target_lengths, n)
    labels = np.empty((n, t_max), np.int64)
    scores = np.empty(n, np.float64)
    if n:
        cells = np.clip(il, 0, t_max) * np.clip(tl, 1, tg.shape[1] + 1)
        limit = ASG_CHECKPOINT_CELLS if _checkpoint_cells is None else int(_checkpoint_cells)
        pending = np.zeros(n, np.int8)
        order = _run(_asg_align_serial, cells,
                     (em, trans, start, has_trans, tg, il, tl, limit, labels, scores, pending))
        _run_pending(_asg_align_big, order, pending, cells,
                     (em, trans, start, has_trans, tg, il, tl, labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# ASG decoding (unconstrained)                                                 #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER)
def _asg_viterbi_one(b, em, trans, start, has_trans, in_len, labels, scores):
    """Viterbi decoding of sequence ``b``: the normaliser's token trellis of
    `duoloss.core.losses.asg._asg_token_forward` in the tropical semiring;
    backtracking asks `_asg_best_previous_token`
    again instead of storing back-pointers."""
    t_max = em.shape[0]
    input_len = in_len[b]
    for t in range(t_max):
        labels[b, t] = -1
    if not 0 <= input_len <= t_max:
        scores[b] = np.nan
        return
    if input_len == 0:
        scores[b] = _NEG_INF  # GTN: no accepting path without a token
        return
    delta = _asg_token_forward(b, input_len, em, trans, start, has_trans, True)
    score, k = _asg_token_final(delta, True)
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = k
        if t > 0:
            _, k = _asg_best_previous_token(delta, t, k, trans, has_trans)


@numba.njit(cache=True, nogil=True)
def _asg_viterbi_serial(order, em, trans, start, has_trans, in_len, labels, scores):
    for i in range(order.shape[0]):
        _asg_viterbi_one(order[i], em, trans, start, has_trans, in_len, labels, scores)



def asg_viterbi(emissions: npt.ArrayLike, transitions: npt.ArrayLike, input_lengths: npt.ArrayLike,
                *, start_transitions: npt.ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best unconstrained ASG labelling (Viterbi decoding) of a batch.

    Args:
      emissions: ``(T, N, C)`` float array of unnormalised scores.
      transitions: ``(C, C)`` or ``None``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      start_transitions: ``(C,)`` or ``None``.

    Returns:
      ``(labels, scores)`` as in [`asg_align`][duoloss.core.asg_align]; the score is GTN's
      ``viterbi_score(compose(E, Trans))``.  Ties: the larger token index wins.
    """
    em = np.ascontiguousarray(emissions)
    dtype = em.dtype
    em = em.astype(np.float64, copy=False)  # one compiled signature
    t_max, n, n_cls = em.shape
    has_trans, trans, start = _asg_params(em, transitions, start_transitions)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    labels = np.empty((n, t_max), np.int64)
    scores = np.empty(n, np.float64)
    if n:
        cells = np.clip(il, 0, t_max) * n_cls * n_cls
        _run(_asg_viterbi_serial, cells,
             (em, trans, start, has_trans, il, labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# Target graphs                                                                #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER)
def _graph_align_one(b, em, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all, gw_all,
                     start_all, accept_all, widx_all, labels, arcs, scores):
    """Viterbi alignment of sequence ``b``: the loss's trellis recursion
    (`duoloss.core.losses.graph_loss._frames_forward`) in the tropical semiring,
    then a trace back through the winning arcs."""
    t_max, _, n_cls = em.shape
    for t in range(t_max):
        labels[b, t] = -1
        arcs[b, t] = -1
    tb = in_len[b]
    ok, a0, v_n, a_e, perm, src, dst, lab, lw, start, accept = _load_graph(
        b, n_cls, t_max, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all, gw_all,
        start_all, accept_all, widx_all)
    if not ok:
        scores[b] = np.nan
        return
    delta = np.full((tb + 1, v_n), _NEG_INF)
    back = np.full((tb + 1, v_n), -1, np.int64)
    _frames_forward(b, tb, v_n, a_e, src, dst, lab, lw, start, em, delta, back, True)
    best = _NEG_INF
    node = -1
    for n in range(v_n):
        if accept[n]:
            v = delta[tb, n]
            if v > best or (v != v and node < 0):
                best = v
                node = n
    if node < 0:
        scores[b] = _NEG_INF
        return
    scores[b] = best
    if best != best:
        return
    t = tb
    while t > 0:
        i = back[t, node]
        node = src[i]
        if i >= a_e:
            continue
        t -= 1
        arcs[b, t] = perm[i]
        labels[b, t] = lab[i]


@numba.njit(cache=True, nogil=True)
def _graph_align_serial(order, em, theta, in_len, node_off, arc_off, src, dst, lab, gw, start,
                        accept, widx, labels, arcs, scores):
    for i in range(order.shape[0]):
        _graph_align_one(order[i], em, theta, in_len, node_off, arc_off, src, dst, lab, gw,
                         start, accept, widx, labels, arcs, scores)



def graph_align(emissions: npt.ArrayLike, packed: PackedGraphs, input_lengths: npt.ArrayLike, *,
                weights: npt.ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Viterbi alignment of each sequence to its target graph.

    Args:
      emissions: ``(T, N, C)`` float array.
      packed: [`duoloss.core.losses.graph_loss.pack_graphs`][duoloss.core.pack_graphs] output (sequence ``b``
        uses graph ``b % G``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      weights: ``(K,)`` tied arc weights (with the packed ``arc_weight_index``) or ``None``.

    Returns:
      ``(labels, scores, arcs)``: ``(N, T)`` int64 frame labels, ``(N,)``
      best-path scores, and ``(N, T)`` int64 indices of the graph arc used at each
      frame (labels and arcs are ``-1`` past the sequence); the scores are
      ``max sum_t (w_{a_t} + e_t(k_{a_t}))``.  Ties: the arc that comes first in
      the graph's arc order, and the lowest accept node, win (as GTN's first
      maximum).  No path: ``-inf`` and ``-1`` labels.  Epsilon arcs (label
      ``-1``) consume no frame: their weights count in the score but they have
      no entry in ``arcs``; per frame, frame arcs are relaxed before epsilon
      arcs (in topological order), and an epsilon arc wins only when strictly
      better.
    """
    em = np.ascontiguousarray(emissions)
    dtype = em.dtype
    em = em.astype(np.float64, copy=False)  # one compiled signature
    t_max, n, _ = em.shape
    node_off, arc_off, src, dst, lab, gw, start, accept, widx = (
        np.ascontiguousarray(x) for x in packed)
    node_off, arc_off, src, dst, lab, widx = (
        x.astype(np.int64, copy=False) for x in (node_off, arc_off, src, dst, lab, widx))
    theta = (np.zeros(0) if weights is None
             else np.ascontiguousarray(weights).astype(np.float64, copy=False))
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    labels = np.empty((n, t_max), np.int64)
    arcs = np.empty((n, t_max), np.int64)
    scores = np.empty(n, np.float64)
    if n:
        n_g = max(node_off.shape[0] - 1, 1)
        n_arcs = np.diff(arc_off) if node_off.shape[0] > 1 else np.zeros(1, np.int64)
        cells = np.clip(il, 0, t_max) * (n_arcs[np.arange(n) % n_g] + 1)
        _run(_graph_align_serial, cells,
             (em, theta, il, node_off, arc_off, src, dst, lab, gw.astype(np.float64, copy=False),
              start.astype(np.int8, copy=False), accept.astype(np.int8, copy=False), widx,
              labels, arcs, scores))
    return labels, scores.astype(dtype, copy=False), arcs


# --------------------------------------------------------------------------- #
# Token spans (torchaudio.functional.merge_tokens)                             #
# --------------------------------------------------------------------------- #
def check_token_spans_args(fn, labels_shape, labels_dtype, lp_shape, lp_dtype, blank, num_spans):
    """Shape/dtype/option checks of ``token_spans`` (before any computation);
    returns ``(batched, n_cls)``."""
    if not np.issubdtype(np.dtype(labels_dtype), np.integer):
        raise TypeError(f"{fn}: labels must be an integer array, got dtype {labels_dtype}")
    if not np.issubdtype(np.dtype(lp_dtype), np.floating):
        raise TypeError(f"{fn}: log_probs must be a floating array, got dtype {lp_dtype}")
    if len(lp_shape) not in (2, 3):
        raise ValueError(f"{fn}: log_probs must be (T, N, C) or (T, C), got shape "
                         f"{tuple(lp_shape)}")
    batched = len(lp_shape) == 3
    want = (lp_shape[1], lp_shape[0]) if batched else (lp_shape[0],)
    if tuple(labels_shape) != want:
        raise ValueError(f"{fn}: labels must have shape {want} (N, T) for log_probs of shape "
                         f"{tuple(lp_shape)}, got {tuple(labels_shape)}")
    n_cls = lp_shape[-1]
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) \
            or not 0 <= blank < n_cls:
        raise ValueError(f"{fn}: blank must be an int in [0, {n_cls}), got {blank!r}")
    if num_spans is not None and (isinstance(num_spans, bool)
                                  or not isinstance(num_spans, (int, np.integer))
                                  or num_spans < 0):
        raise ValueError(f"{fn}: num_spans must be None or an int >= 0, got {num_spans!r}")
    return batched, n_cls


def count_token_spans(labels, n_cls, blank, fn="token_spans"):
    """The largest number of spans over the rows of ``labels`` (``(N, T)`` or
    ``(T,)``), after checking that they lie in ``[-1, n_cls)``."""
    lab = np.asarray(labels).astype(np.int64, copy=False)
    if lab.size and (lab.min() < -1 or lab.max() >= n_cls):
        raise ValueError(f"{fn}: labels must be in [-1, {n_cls}) (-1: padding), got values in "
                         f"[{lab.min()}, {lab.max()}]")
    # explicit row count: reshape(-1, 0) is ambiguous for zero frames (ctc_align's T = 0)
    lab = (lab.reshape(int(np.prod(lab.shape[:-1])), lab.shape[-1]) if lab.ndim
           else lab.reshape(1, 1))
    if lab.shape[0] == 0 or lab.shape[1] == 0:
        return 0
    first = np.ones(lab.shape, bool)
    first[:, 1:] = lab[:, 1:] != lab[:, :-1]
    return int((first & (lab >= 0) & (lab != blank)).sum(axis=1).max())


def token_spans(labels, log_probs, *, blank=0, num_spans=None, fn="token_spans"):
    """The token spans of frame alignments: ``torchaudio.functional.merge_tokens``
    for a batch.

    A span is a maximal run of equal consecutive frame labels that is not the
    blank (nor the ``-1`` padding past a sequence): ``start`` is its first frame,
    ``end`` one past its last (as torchaudio's ``TokenSpan``), and its score the
    mean over its frames of ``exp(log_probs[t, b, token])`` (the frame
    probabilities torchaudio's tutorial passes to ``merge_tokens``).

    Args:
      labels: ``(N, T)`` integer frame labels in ``[-1, C)`` (``ctc_align``'s).
      log_probs: ``(T, N, C)`` float array (the one aligned).
      blank: the blank class.
      num_spans: the number of span slots per sequence (``None``: the largest
        number of spans in the batch); sequences with more spans keep their first
        ``num_spans``.
      fn: the public name for error messages.

    Returns:
      ``(tokens, starts, ends, scores)``, each ``(N, K)``: int64 tokens and
      frames, float scores in ``log_probs``' dtype; unused slots hold ``-1``
      (tokens, starts, ends) and ``0`` (scores).
    """
    lab = np.asarray(labels)
    lp = np.asarray(log_probs)
    check_token_spans_args(fn, lab.shape, lab.dtype, lp.shape, lp.dtype, blank, num_spans)
    if lp.ndim == 2:
        lab, lp = lab[None], lp[:, None]
    t_max, n, n_cls = lp.shape
    lab = lab.astype(np.int64, copy=False)
    count_token_spans(lab, n_cls, blank, fn)
    runs = []
    for b in range(n):
        row = lab[b]
        edge = np.flatnonzero(np.diff(row, prepend=-2, append=-2) != 0)
        first, stop = edge[:-1], edge[1:]
        tok = row[first] if first.size else first
        keep = (tok >= 0) & (tok != blank)
        if t_max:
            p = np.exp(lp[np.arange(t_max), b, np.clip(row, 0, n_cls - 1)].astype(np.float64))
            sums = np.add.reduceat(p, first) if first.size else np.zeros(0)
        else:
            sums = np.zeros(0)
        runs.append((tok[keep], first[keep], stop[keep],
                     sums[keep] / (stop[keep] - first[keep])))
    k = max((r[0].size for r in runs), default=0) if num_spans is None else int(num_spans)
    tokens = np.full((n, k), -1, np.int64)
    starts = np.full((n, k), -1, np.int64)
    ends = np.full((n, k), -1, np.int64)
    scores = np.zeros((n, k), np.float64)
    for b, (tok, a, z, sc) in enumerate(runs):
        m = min(k, tok.size)
        tokens[b, :m], starts[b, :m], ends[b, :m], scores[b, :m] = tok[:m], a[:m], z[:m], sc[:m]
    return tokens, starts, ends, scores.astype(lp.dtype, copy=False)
