r"""Viterbi forced alignment (tropical semiring) for CTC and ASG on numpy buffers.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``S`` padded target
length; sequence ``b`` has ``T_b = input_lengths[b]`` frames and ``L_b =
target_lengths[b]`` labels.

Both alignments run the same trellis as the corresponding loss with
``logsumexp`` replaced by ``max`` (literally: the CTC and ASG aligners call the
loss modules' exact log-space trellis code with the tropical semiring as a
compile-time constant, and recompute each back-pointer while backtracking
instead of storing them) and return the best path:

.. math::

    \delta_t(s) = w_t(s) + \max_{s' \in \text{pred}(s)} \left(\delta_{t-1}(s')
        + a(s' \to s)\right), \qquad
    \text{score}_b = \max_{s \in \text{final}} \delta_{T_b - 1}(s).

* CTC (:func:`ctc_align`): states are the ``2L+1`` blank/label states of the
  CTC acceptor, :math:`w_t(s) = \log p_t(z_s)`, no arc weights.  The frame
  labels include the blank, like ``torchaudio.functional.forced_align``.
* ASG (:func:`asg_align`): states are the ``L`` target positions (each token
  spans >= 1 frame), :math:`w_t(l) = e_t(y_l)`, arc weights are the
  transitions (:math:`A_{y_l y_l}` to stay, :math:`A_{y_l y_{l-1}}` to
  advance) and the start score :math:`s_{y_1}` at the first frame.
* ASG decoding (:func:`asg_viterbi`): the best *unconstrained* labelling
  (GTN's ``viterbi_path(compose(E, Trans))``), over all ``C`` tokens.
* Target graphs (:func:`graph_align`): nodes of one acceptor per sequence,
  :math:`w_t(a) = e_t(k_a)` plus the arc weight (GTN's
  ``viterbi_path(intersect(G, E))``); also returns the arc used at each frame.

The gradient of a Viterbi score w.r.t. the scores is the indicator (count) of
the arcs on the returned path; it is not provided here.

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

from .asg import _asg_best_previous_token, _asg_token_final, _asg_token_forward
from .asg import _asg_best_target_step, _asg_target_forward, _asg_target_weights
from .ctc import ctc_states
from .ctc import _ctc_best_step, _ctc_trellis_final, _ctc_trellis_forward
from .graph_loss import _frames_forward, _load_graph
from .._numerics import NEG_INF as _NEG_INF
from .._numerics import run_batch, sequence_ok

__all__ = ["ctc_align", "asg_align", "asg_viterbi", "graph_align"]

_PARALLEL_MIN_CELLS = 200_000


def _run(kernel_serial, kernel_parallel, cells, args):
    n = cells.shape[0]
    order = np.argsort(-cells, kind="stable").astype(np.int64)
    run_batch(kernel_serial, kernel_parallel, n, int(cells.sum()), _PARALLEL_MIN_CELLS,
              (order,) + tuple(args))


# --------------------------------------------------------------------------- #
# CTC                                                                          #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _ctc_align_one(b, logp, targets, in_len, tg_len, blank, labels, scores):
    """Viterbi alignment of sequence ``b``: the CTC trellis of
    :func:`duoloss.core.losses.ctc._ctc_trellis_forward` in the tropical semiring.

    No back-pointers are stored: backtracking asks
    :func:`~duoloss.core.losses.ctc._ctc_best_step` again, on the same table
    values, so it takes the same steps (and ties) as the forward did.
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
    delta = _ctc_trellis_forward(b, input_len, lab, skip, logp, True)
    score, s = _ctc_trellis_final(delta, True)
    if score == _NEG_INF:
        scores[b] = _NEG_INF
        return
    scores[b] = score  # NaN included: the labels are then a valid, arbitrary path
    for t in range(input_len - 1, -1, -1):
        labels[b, t] = lab[s]
        if t > 0:
            _, step = _ctc_best_step(delta[t - 1, s], delta[t - 1, s - 1] if s >= 1 else _NEG_INF,
                                     delta[t - 1, s - 2] if skip[s] else _NEG_INF)
            s -= step


@numba.njit(cache=True, nogil=True, parallel=True)
def _ctc_align_parallel(order, logp, targets, in_len, tg_len, blank, labels, scores):
    for i in numba.prange(order.shape[0]):
        _ctc_align_one(order[i], logp, targets, in_len, tg_len, blank, labels, scores)


@numba.njit(cache=True, nogil=True)
def _ctc_align_serial(order, logp, targets, in_len, tg_len, blank, labels, scores):
    for i in range(order.shape[0]):
        _ctc_align_one(order[i], logp, targets, in_len, tg_len, blank, labels, scores)


def _int_buffers(targets, input_lengths, target_lengths, n):
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    if tg.ndim != 2:
        tg = tg.reshape(n, -1)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64).reshape(n)
    return tg, il, tl


def ctc_align(log_probs, targets, input_lengths, target_lengths, *, blank=0):
    """Viterbi CTC forced alignment of a batch.

    Args:
      log_probs: ``(T, N, C)`` float array of (log-)scores.
      targets: ``(N, S)`` integer padded targets (never ``blank``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      blank: the blank class.

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame labels (blank included, ``-1``
      past ``input_lengths[b]``) and ``(N,)`` best-path scores in the input's
      dtype (see the module docstring for ties and infeasible sequences).
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
        _run(_ctc_align_serial, _ctc_align_parallel, cells,
             (logp, tg, il, tl, int(blank), labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# ASG forced alignment                                                         #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _asg_align_one(b, em, trans, start, has_trans, targets, in_len, tg_len, labels, scores):
    """Viterbi alignment of sequence ``b``: the target trellis of
    :func:`duoloss.core.losses.asg._asg_target_forward` in the tropical semiring;
    backtracking asks :func:`~duoloss.core.losses.asg._asg_best_target_step` again
    instead of storing back-pointers."""
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


@numba.njit(cache=True, nogil=True, parallel=True)
def _asg_align_parallel(order, em, trans, start, has_trans, targets, in_len, tg_len, labels,
                        scores):
    for i in numba.prange(order.shape[0]):
        _asg_align_one(order[i], em, trans, start, has_trans, targets, in_len, tg_len, labels,
                       scores)


@numba.njit(cache=True, nogil=True)
def _asg_align_serial(order, em, trans, start, has_trans, targets, in_len, tg_len, labels,
                      scores):
    for i in range(order.shape[0]):
        _asg_align_one(order[i], em, trans, start, has_trans, targets, in_len, tg_len, labels,
                       scores)


def _asg_params(em, transitions, start_transitions):
    n_cls = em.shape[2]
    has_trans = transitions is not None
    trans = (np.ascontiguousarray(transitions, dtype=np.float64) if has_trans
             else np.zeros((0, 0)))
    start = (np.ascontiguousarray(start_transitions, dtype=np.float64)
             if start_transitions is not None
             else np.zeros(n_cls))
    return has_trans, trans, start


def asg_align(emissions, transitions, targets, input_lengths, target_lengths, *,
              start_transitions=None):
    """Viterbi ASG forced alignment of a batch.

    Args:
      emissions: ``(T, N, C)`` float array of unnormalised scores.
      transitions: ``(C, C)`` (``[i, j]`` = score of ``i`` after ``j``) or ``None``.
      targets: ``(N, S)`` integer padded targets, tokens in ``[0, C)``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      start_transitions: ``(C,)`` first-token scores or ``None``.

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame tokens (``-1`` past the
      sequence) and ``(N,)`` best-path scores (start + transitions + emissions)
      in the emissions' dtype.
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
        _run(_asg_align_serial, _asg_align_parallel, cells,
             (em, trans, start, has_trans, tg, il, tl, labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# ASG decoding (unconstrained)                                                 #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _asg_viterbi_one(b, em, trans, start, has_trans, in_len, labels, scores):
    """Viterbi decoding of sequence ``b``: the normaliser's token trellis of
    :func:`duoloss.core.losses.asg._asg_token_forward` in the tropical semiring;
    backtracking asks :func:`~duoloss.core.losses.asg._asg_best_previous_token`
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


@numba.njit(cache=True, nogil=True, parallel=True)
def _asg_viterbi_parallel(order, em, trans, start, has_trans, in_len, labels, scores):
    for i in numba.prange(order.shape[0]):
        _asg_viterbi_one(order[i], em, trans, start, has_trans, in_len, labels, scores)


def asg_viterbi(emissions, transitions, input_lengths, *, start_transitions=None):
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
        _run(_asg_viterbi_serial, _asg_viterbi_parallel, cells,
             (em, trans, start, has_trans, il, labels, scores))
    return labels, scores.astype(dtype, copy=False)


# --------------------------------------------------------------------------- #
# Target graphs                                                                #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _graph_align_one(b, em, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all, gw_all,
                     start_all, accept_all, widx_all, labels, arcs, scores):
    """Viterbi alignment of sequence ``b``: the loss's trellis recursion
    (:func:`duoloss.core.losses.graph_loss._frames_forward`) in the tropical semiring,
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


@numba.njit(cache=True, nogil=True, parallel=True)
def _graph_align_parallel(order, em, theta, in_len, node_off, arc_off, src, dst, lab, gw, start,
                          accept, widx, labels, arcs, scores):
    for i in numba.prange(order.shape[0]):
        _graph_align_one(order[i], em, theta, in_len, node_off, arc_off, src, dst, lab, gw,
                         start, accept, widx, labels, arcs, scores)


def graph_align(emissions, packed, input_lengths, *, weights=None):
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
        _run(_graph_align_serial, _graph_align_parallel, cells,
             (em, theta, il, node_off, arc_off, src, dst, lab, gw.astype(np.float64, copy=False),
              start.astype(np.int8, copy=False), accept.astype(np.int8, copy=False), widx,
              labels, arcs, scores))
    return labels, scores.astype(dtype, copy=False), arcs
