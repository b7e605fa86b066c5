r"""WFST decoding: beam-pruned Viterbi search of emissions against a decoding graph.

The search composes the emissions of one utterance (a ``(T, C)`` matrix of frame
scores, read as the linear acceptor ``E`` whose ``t``-th arc has label ``c`` and
weight ``emissions[t, c]``) with a decoding graph ``G`` (a ``duoloss.gtn.Graph``:
input labels are classes ``[0, C)`` or ``-1`` (epsilon, consumes no frame); output
labels are whatever the graph emits, e.g. word ids of ``ctc_topo ∘ L ∘ G``) *on the
fly*, frame by frame, in the tropical semiring, keeping only the states within
``beam`` of the frame's best and at most ``max_active`` of them (token passing, as
Kaldi's ``SimpleDecoder``/``FasterDecoder`` and k2's ``intersect_dense_pruned``).

Score of a path: the sum of its emissions and of its graph arc weights,

$$
\text{score}(\pi) = \sum_{t=0}^{T-1} \text{emissions}[t, \text{ilabel}(a_t)] +
\sum_{a \in \pi} w_a ,
$$

``a_t`` the path's ``t``-th frame-consuming arc; input-epsilon arcs add their
weight only.  With ``beam = inf`` and ``max_active = None`` nothing is pruned and
the result is ``duoloss.gtn.viterbi_path(compose(E, G))`` (same score, same input
and output labels), without ever building that composition.

Memory: per utterance, the graph's arrays (CSR by source state, built once per
call), one ``(num_states,)`` int64 slot table, the tokens of one frame, and the
traceback records of the tokens that survived pruning (at most ``max_active``
per frame, times one plus the longest chain of input-epsilon arcs): bounded by
the beam, not by ``T`` times the graph.

NB: the input-epsilon arcs of the graph must not form a cycle (a cycle of epsilon
arcs gives infinitely many paths per frame; ``viterbi_path`` refuses the
composition for the same reason).  This module never imports torch or jax.

References:
  M. Mohri, F. Pereira, M. Riley, "Speech recognition with weighted finite-state
  transducers", Springer Handbook of Speech Processing, 2008.
  D. Povey et al., "Generating exact lattices in the WFST framework", ICASSP 2012
  (token passing with a beam and a maximum active-state count, Kaldi's decoders).
"""
from __future__ import annotations

import operator
from typing import Any, List, NamedTuple, Optional

import numba
import numpy as np

from duoloss.core import _pool
from duoloss.core._numerics import HELPER
from duoloss.core.graph.graph import Graph, graph_arrays

__all__ = ["GraphHypothesis", "DecodingGraph", "prepare_graph", "graph_decode", "check_decode_args"]

_NEG_INF = -np.inf


class GraphHypothesis(NamedTuple):
    """The best path of one utterance through the decoding graph.

    Attributes:
      labels: ``(L,)`` the output labels of the path (epsilons removed), e.g. word ids.
      score: the path's score: emissions of the frames plus graph arc weights (tropical).
      alignment: ``(T_b,)`` the input label (class) read at each frame.
      timesteps: ``(L,)`` the frame at which each output label was emitted: the frame
        of the arc that carries it; an output on an input-epsilon arc gets the frame
        of the last arc that consumed one before it (``0`` if none did).
      arcs: ``(K,)`` the graph's arc indices along the path in order, input-epsilon
        arcs included (``K >= T_b``).
    """

    labels: Any
    score: float
    alignment: Any
    timesteps: Any
    arcs: Any


class DecodingGraph(NamedTuple):
    """A graph in the search's layout (CSR by source state; per state the
    input-epsilon arcs first, then the frame-consuming ones sorted by input label).
    Only arcs from which an accept state can be reached are kept."""

    num_states: int
    num_classes_needed: int   # 1 + the largest input label (0 when none)
    ptr: np.ndarray           # (N + 1,) int64
    eps_end: np.ndarray       # (N,) int64: arcs ptr[s]:eps_end[s] are input-epsilon
    dst: np.ndarray           # (A',) int64
    ilabel: np.ndarray        # (A',) int64
    weight: np.ndarray        # (A',) float64
    arc_id: np.ndarray        # (A',) int64: index of the arc in the user's graph
    rank: np.ndarray          # (N,) int64: topological rank in the epsilon subgraph
    gain: np.ndarray          # (N,) float64: the most a chain of epsilon arcs adds from a state (>= 0)
    eps_depth: int            # most input-epsilon arcs on one chain
    starts: np.ndarray        # (S,) int64
    accept: np.ndarray        # (N,) bool
    has_eps: bool
    ilabel_all: np.ndarray    # (A,) int64: the user's graph's arrays (for the results)
    olabel_all: np.ndarray    # (A,) int64


def _graph_error(fn, msg):
    return ValueError(f"{fn}: argument 'graph' {msg}")


def prepare_graph(graph: Graph, fn: str = "graph_decode") -> DecodingGraph:
    """Check ``graph`` and lay it out for the search (one pass over its arcs).

    Raises:
      TypeError: ``graph`` is not a ``duoloss.gtn.Graph``.
      ValueError: an input label below ``-1``, a NaN or ``+inf`` arc weight, or a
        cycle of input-epsilon arcs.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"{fn}: argument 'graph' must be a duoloss.gtn.Graph, got "
                        f"{type(graph).__name__}")
    n, src, dst, il, ol, w, start, accept = graph_arrays(graph)
    A = src.shape[0]
    if A and int(il.min()) < -1:
        raise _graph_error(fn, f"has input label {int(il.min())}; labels must be >= -1 "
                           "(-1 = epsilon)")
    wf = w.astype(np.float64)
    bad = np.isnan(wf) | (wf == np.inf)
    if bad.any():
        a = int(np.flatnonzero(bad)[0])
        raise _graph_error(fn, f"has arc weight {float(wf[a])} on arc {a}; weights must be "
                           "finite or -inf")
    eps = il < 0
    # topological order of the epsilon subgraph (Kahn); a leftover means a cycle
    rank, depth, ok = _eps_rank(n, src[eps], dst[eps])
    if not ok:
        raise _graph_error(fn, "has a cycle of input-epsilon arcs (a path could read "
                           "infinitely many of them between two frames); remove it, e.g. "
                           "with duoloss.gtn.remove")
    # co-accessible states (an accept state reachable): arcs into others are useless
    accept = np.array(accept, np.bool_)      # a writeable copy: one kernel signature for all callers
    co = _coaccessible(n, src, dst, accept)
    keep = co[dst] & (wf > -np.inf) if A else np.zeros(0, np.bool_)
    ids = np.flatnonzero(keep)
    # sort by (source, epsilon first, input label): stable, arc order kept among equals
    key_il = il[ids]
    order = np.lexsort((key_il, src[ids]))
    ids = ids[order]
    s_ids = src[ids]
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(s_ids, minlength=n), out=ptr[1:])
    n_eps = np.bincount(s_ids[il[ids] < 0], minlength=n)
    eps_end = ptr[:-1] + n_eps
    starts = np.flatnonzero(np.asarray(start) & co).astype(np.int64)
    dk = np.ascontiguousarray(dst[ids])
    wk = np.ascontiguousarray(wf[ids])
    return DecodingGraph(
        int(n), int(il.max()) + 1 if A and int(il.max()) >= 0 else 0, ptr, eps_end.astype(np.int64),
        dk, np.ascontiguousarray(il[ids]),
        wk, ids.astype(np.int64), rank, _eps_gain(n, ptr, eps_end, dk, wk, rank), int(depth), starts,
        accept, bool(eps.any()), il.copy(), ol.copy())


def _eps_rank(n, src, dst):
    """Topological rank of every state in the graph of the epsilon arcs, the longest
    chain of epsilon arcs, and whether that graph is acyclic."""
    if src.size == 0:
        return np.arange(n, dtype=np.int64), 0, True
    rank = np.zeros(n, np.int64)
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    ok, depth = _kahn(n, ptr, dst[order], indeg.astype(np.int64), rank)
    return rank, depth, ok


@numba.njit(cache=True, nogil=True)
def _kahn(n, ptr, dst, indeg, rank):
    queue = np.empty(n, np.int64)
    level = np.zeros(n, np.int64)
    head = 0
    tail = 0
    for s in range(n):
        if indeg[s] == 0:
            queue[tail] = s
            tail += 1
    depth = 0
    while head < tail:
        s = queue[head]
        rank[s] = head
        head += 1
        for a in range(ptr[s], ptr[s + 1]):
            d = dst[a]
            if level[s] + 1 > level[d]:
                level[d] = level[s] + 1
                if level[d] > depth:
                    depth = level[d]
            indeg[d] -= 1
            if indeg[d] == 0:
                queue[tail] = d
                tail += 1
    return tail == n, depth


@numba.njit(cache=True, nogil=True)
def _eps_gain(n, ptr, eps_end, dst, weight, rank):
    """gain[s]: the largest total weight of a chain of epsilon arcs from ``s`` (0 for the
    empty chain): pruning may drop a state only when its score plus this is below the cut."""
    gain = np.zeros(n, np.float64)
    order = np.empty(n, np.int64)
    for s in range(n):
        order[rank[s]] = s
    for i in range(n - 1, -1, -1):
        s = order[i]
        for a in range(ptr[s], eps_end[s]):
            g = weight[a] + gain[dst[a]]
            if g > gain[s]:
                gain[s] = g
    return gain


def _coaccessible(n, src, dst, accept):
    """States from which an accept state is reachable (reverse breadth-first search)."""
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return _reverse_reach(n, ptr, src[order], np.ascontiguousarray(accept, np.bool_))


@numba.njit(cache=True, nogil=True)
def _reverse_reach(n, ptr, src, accept):
    seen = np.zeros(n, np.bool_)
    stack = np.empty(n, np.int64)
    top = 0
    for s in range(n):
        if accept[s]:
            seen[s] = True
            stack[top] = s
            top += 1
    while top > 0:
        top -= 1
        d = stack[top]
        for a in range(ptr[d], ptr[d + 1]):
            s = src[a]
            if not seen[s]:
                seen[s] = True
                stack[top] = s
                top += 1
    return seen


# ----------------------------------------------------------------------------- search
@numba.njit(**HELPER)
def _grow(a, cap):
    """``a`` copied into a new array of ``cap`` entries of its dtype (the rest unset)."""
    out = np.empty(cap, a.dtype)
    for i in range(a.shape[0]):
        out[i] = a[i]
    return out


@numba.njit(**HELPER)
def _kth_smallest(v, k):
    """The ``k``-th smallest value of ``v`` (0-based; ``v`` is reordered): quickselect."""
    lo = 0
    hi = v.shape[0] - 1
    while lo < hi:
        pivot = v[(lo + hi) >> 1]
        i = lo
        j = hi
        while i <= j:
            while v[i] < pivot:
                i += 1
            while v[j] > pivot:
                j -= 1
            if i <= j:
                tmp = v[i]
                v[i] = v[j]
                v[j] = tmp
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return v[k]


@numba.njit(**HELPER)
def _grow_tokens(tk):
    """The token store ``tk`` with twice the room."""
    cap = 2 * tk[0].shape[0]
    return (_grow(tk[0], cap), _grow(tk[1], cap), _grow(tk[2], cap), _grow(tk[3], cap),
            _grow(tk[4], cap), _grow(tk[5], cap), _grow(tk[6], cap))


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_push(heap, size, key, rank, k):
    # min-heap of token indices keyed by rank[key[k]]
    i = size
    heap[i] = k
    r = rank[key[k]]
    while i > 0:
        p = (i - 1) >> 1
        if rank[key[heap[p]]] <= r:
            break
        heap[i] = heap[p]
        heap[p] = k
        i = p
    return size + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_pop(heap, size, key, rank):
    top = heap[0]
    size -= 1
    last = heap[size]
    r = rank[key[last]]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and rank[key[heap[c + 1]]] < rank[key[heap[c]]]:
            c += 1
        if rank[key[heap[c]]] >= r:
            break
        heap[i] = heap[c]
        i = c
    if size > 0:
        heap[i] = last
    return top, size


@numba.njit(inline="always")
def _relax(tk, n_next, slot, d, v, pred, prev, a):
    """Offer state ``d`` the score ``v`` (through arc ``a``, from epsilon predecessor
    ``pred`` or previous-frame record ``prev``) in the token store ``tk = (state, score,
    pred, prev, arc, heap, mark)``: a new token, or a better way to an existing one.
    Returns (tk, n_next, the token's index, whether it is new)."""
    j = slot[d]
    new = j < 0
    if new:
        j = n_next
        slot[d] = j
        tk[0][j] = d
        tk[1][j] = v
        n_next += 1
    elif not (v > tk[1][j]):
        return tk, n_next, j, False
    tk[1][j] = v
    tk[2][j] = pred
    tk[3][j] = prev
    tk[4][j] = a
    if n_next == tk[0].shape[0]:
        tk = _grow_tokens(tk)
    return tk, n_next, j, new


@numba.njit(**HELPER)
def _start_tokens(starts, slot, tk):
    """Frame -1: a token of score 0 per start state.  Returns (tk, n_next, best)."""
    n_next = 0
    for i in range(starts.shape[0]):
        if slot[starts[i]] < 0:
            tk, n_next, _, _ = _relax(tk, n_next, slot, starts[i], 0.0, -1, -1, -1)
    return tk, n_next, (0.0 if n_next > 0 else -np.inf)


@numba.njit(**HELPER)
def _emit(row, cur, n_cur, g, gain_max, beam, slot, tk):
    """Frame ``t``: every surviving token ``cur = (state, score, record)`` follows each of
    its frame-consuming arcs (graph ``g``); moves the cut would drop are skipped.  Returns
    (tk, n_next, best)."""
    ptr, eps_end, dst, ilabel, weight, gain = g
    c_state, c_score, c_rec = cur
    # a first lower bound on the frame's best: the best token's best move (so that moves
    # that the final cut would drop are skipped from the start)
    best = -np.inf
    kb = 0
    for k in range(1, n_cur):
        if c_score[k] > c_score[kb]:
            kb = k
    s = c_state[kb]
    for a in range(eps_end[s], ptr[s + 1]):
        v = c_score[kb] + weight[a] + row[ilabel[a]]
        if v > best:
            best = v
    n_next = 0
    for k in range(n_cur):
        s = c_state[k]
        base = c_score[k]
        for a in range(eps_end[s], ptr[s + 1]):
            v = base + weight[a] + row[ilabel[a]]
            # skip a move whose state (and what its epsilon arcs can add) the cut drops
            if not (v + gain_max >= best - beam) or v == -np.inf:
                continue
            d = dst[a]
            if not (v + gain[d] >= best - beam):
                continue
            tk, n_next, _, _ = _relax(tk, n_next, slot, d, v, -1, c_rec[k], a)
            if v > best:
                best = v
    return tk, n_next, best


@numba.njit(**HELPER)
def _eps_closure(tk, n_next, best, beam, g, rank, slot):
    """Follow the input-epsilon arcs from the frame's tokens, states in topological order
    of the epsilon arcs (a heap on ``rank``), each once.  Returns (tk, n_next, best)."""
    ptr, eps_end, dst, _, weight, gain = g
    hsize = 0
    for j in range(n_next):
        s = tk[0][j]
        if eps_end[s] > ptr[s]:     # only states with epsilon arcs need a visit
            hsize = _heap_push(tk[5], hsize, tk[0], rank, j)
    while hsize > 0:
        j, hsize = _heap_pop(tk[5], hsize, tk[0], rank)
        s = tk[0][j]
        base = tk[1][j]
        for a in range(ptr[s], eps_end[s]):
            v = base + weight[a]
            d = dst[a]
            if not (v + gain[d] >= best - beam) or v == -np.inf:
                continue
            tk, n_next, i, new = _relax(tk, n_next, slot, d, v, j, -1, a)
            if new and eps_end[d] > ptr[d]:
                hsize = _heap_push(tk[5], hsize, tk[0], rank, i)
            if v > best:
                best = v
    return tk, n_next, best


@numba.njit(**HELPER)
def _prune(tk, n_next, best, beam, max_active, slot):
    """Keep the tokens within ``beam`` of the best, then the ``max_active`` best (ties by
    creation order); their indices go to ``tk``'s heap array.  Clears the slots.  Returns
    the number kept."""
    n_state, n_score, heap, mark = tk[0], tk[1], tk[5], tk[6]
    for j in range(n_next):
        slot[n_state[j]] = -1
    n_keep = 0
    for j in range(n_next):
        mark[j] = 0
        if n_score[j] >= best - beam and n_score[j] > -np.inf:
            heap[n_keep] = j
            n_keep += 1
    if max_active > 0 and n_keep > max_active:
        # the max_active best: a cutoff from a partial sort, ties by creation order
        vals = np.empty(n_keep, np.float64)
        for i in range(n_keep):
            vals[i] = n_score[heap[i]]
        cut = _kth_smallest(vals.copy(), n_keep - max_active)
        above = 0
        for i in range(n_keep):
            if vals[i] > cut:
                above += 1
        ties = max_active - above
        m = 0
        for i in range(n_keep):
            v = vals[i]
            if v > cut or (v == cut and ties > 0):
                if v == cut:
                    ties -= 1
                heap[m] = heap[i]
                m += 1
        n_keep = m
    return n_keep


@numba.njit(**HELPER)
def _record(tk, n_next, n_keep, r_prev, r_arc, n_rec):
    """Traceback records for the survivors and their epsilon ancestors (``tk``'s mark
    array gets each token's record id + 1).  Returns (r_prev, r_arc, n_rec)."""
    n_pred, n_prev, n_arc, heap, mark = tk[2], tk[3], tk[4], tk[5], tk[6]
    for i in range(n_keep):
        j = heap[i]
        while j >= 0 and mark[j] == 0:
            mark[j] = 1
            j = n_pred[j]
    n_new = 0
    for j in range(n_next):
        if mark[j] == 1:
            n_new += 1
    if n_rec + n_new > r_prev.shape[0]:
        rcap = r_prev.shape[0]
        while n_rec + n_new > rcap:
            rcap *= 2
        r_prev = _grow(r_prev, rcap)
        r_arc = _grow(r_arc, rcap)
    # record ids first (an ancestor may have been created after its child)
    for j in range(n_next):
        if mark[j] == 1:
            mark[j] = n_rec + 1    # record id + 1
            n_rec += 1
    for j in range(n_next):
        if mark[j] > 0:
            r = mark[j] - 1
            r_arc[r] = n_arc[j]
            r_prev[r] = n_prev[j] if n_pred[j] < 0 else mark[n_pred[j]] - 1
    return r_prev, r_arc, n_rec


@numba.njit(**HELPER)
def _survivors(tk, n_keep, cur):
    """The kept tokens become the current frame's ``(state, score, record)``."""
    if n_keep > cur[0].shape[0]:
        cap = tk[0].shape[0]
        cur = (np.empty(cap, np.int64), np.empty(cap, np.float64), np.empty(cap, np.int64))
    for i in range(n_keep):
        j = tk[5][i]
        cur[0][i] = tk[0][j]
        cur[1][i] = tk[1][j]
        cur[2][i] = tk[6][j] - 1
    return cur


@numba.njit(**HELPER)
def _trace_back(cur, n_cur, accept, r_prev, r_arc, out_arcs, b):
    """The best accepting token's arcs into ``out_arcs[b]``: (score, path length), or
    (-inf, -1) when no token accepts."""
    c_state, c_score, c_rec = cur
    kb = -1
    bs = -np.inf
    for k in range(n_cur):
        if accept[c_state[k]] and c_score[k] > bs:
            bs = c_score[k]
            kb = k
    if kb < 0:
        return -np.inf, -1
    m = 0
    r = c_rec[kb]
    while r >= 0:
        if r_arc[r] >= 0:
            m += 1
        r = r_prev[r]
    i = m
    r = c_rec[kb]
    while r >= 0:
        if r_arc[r] >= 0:
            i -= 1
            out_arcs[b, i] = r_arc[r]
        r = r_prev[r]
    return bs, m


@numba.njit(**HELPER)
def _decode_one(em, T, ptr, eps_end, dst, ilabel, weight, rank, gain, starts, accept, has_eps,
                beam_all, max_active_all, slot, out_arcs, b, stats):
    """Search one utterance; write its arcs to ``out_arcs[b]``.  Returns
    ``(score, path length)``; length ``-1`` when no path survives.  Every frame but the
    last is pruned (beam, then max_active).

    Per frame: ``_emit`` (frame-consuming arcs), ``_eps_closure``, ``_prune``, ``_record``
    (traceback records), ``_survivors``; at the end ``_trace_back``."""
    g = (ptr, eps_end, dst, ilabel, weight, gain)
    # tokens of the frame being built: state, score, local eps predecessor, record of the
    # previous frame, arc; a heap / keep list; marks
    cap = 256
    tk = (np.empty(cap, np.int64), np.empty(cap, np.float64), np.empty(cap, np.int64),
          np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
          np.zeros(cap, np.int64))
    cur = (np.empty(cap, np.int64), np.empty(cap, np.float64), np.empty(cap, np.int64))
    n_cur = 0
    r_prev = np.empty(1024, np.int64)
    r_arc = np.empty(1024, np.int64)
    n_rec = 0
    peak = 0
    gain_max = 0.0
    for s in range(gain.shape[0]):
        if gain[s] > gain_max:
            gain_max = gain[s]
    for t in range(-1, T):
        # the last frame is not pruned: every accept state reached then stays a candidate
        beam = beam_all if t < T - 1 else np.inf
        max_active = max_active_all if t < T - 1 else 0
        if t < 0:
            tk, n_next, best = _start_tokens(starts, slot, tk)
        else:
            tk, n_next, best = _emit(em[t], cur, n_cur, g, gain_max, beam, slot, tk)
        if has_eps and n_next > 0:
            tk, n_next, best = _eps_closure(tk, n_next, best, beam, g, rank, slot)
        n_keep = _prune(tk, n_next, best, beam, max_active, slot)
        if n_keep == 0:
            stats[b, 0] = max(stats[b, 0], peak)
            return -np.inf, -1
        if n_keep > peak and t < T - 1:
            peak = n_keep
        r_prev, r_arc, n_rec = _record(tk, n_next, n_keep, r_prev, r_arc, n_rec)
        cur = _survivors(tk, n_keep, cur)
        n_cur = n_keep
    stats[b, 0] = peak
    stats[b, 1] = n_rec
    return _trace_back(cur, n_cur, accept, r_prev, r_arc, out_arcs, b)


@numba.njit(cache=True, nogil=True)
def _decode_batch(order, em, lengths, ptr, eps_end, dst, ilabel, weight, rank, gain, starts,
                  accept, has_eps, beam, max_active, out_arcs, out_len, out_score, stats):
    slot = np.full(ptr.shape[0] - 1, -1, np.int64)
    for i in range(order.shape[0]):
        b = order[i]
        if out_len[b] == -2:      # NaN emissions: no hypothesis
            continue
        score, m = _decode_one(em[b], lengths[b], ptr, eps_end, dst, ilabel, weight, rank, gain,
                               starts, accept, has_eps, beam, max_active, slot, out_arcs, b,
                               stats)
        out_score[b] = score
        out_len[b] = m


# ----------------------------------------------------------------------------- API
def check_decode_args(fn: str, emissions: np.ndarray, lengths: Optional[np.ndarray],
                      beam: Any, max_active: Any):
    """Validate the arguments of `graph_decode` (numpy emissions and lengths).

    Returns ``(emissions as C-contiguous float64, lengths as int64, beam, max_active)``
    (``max_active`` 0 for no limit).
    """
    em = emissions
    if em.dtype.kind not in "f":
        raise TypeError(f"{fn}: argument 'emissions' must hold floating-point scores, got "
                        f"dtype {em.dtype}")
    if em.ndim != 3:
        raise ValueError(f"{fn}: argument 'emissions' must have shape (B, T, C), got shape "
                         f"{tuple(em.shape)}")
    B, T, C = em.shape
    if lengths is None:
        ln = np.full(B, T, np.int64)
    else:
        ln = np.asarray(lengths)
        if ln.dtype.kind not in "iu" or ln.dtype == np.bool_:
            raise TypeError(f"{fn}: argument 'lengths' must hold integers, got dtype {ln.dtype}")
        if ln.shape != (B,):
            raise ValueError(f"{fn}: argument 'lengths' must have shape ({B},) (one length per "
                             f"utterance of 'emissions'), got shape {tuple(ln.shape)}")
        ln = ln.astype(np.int64)
        if B and (int(ln.min()) < 0 or int(ln.max()) > T):
            bad = int(np.flatnonzero((ln < 0) | (ln > T))[0])
            raise ValueError(f"{fn}: argument 'lengths' must lie in [0, T = {T}], got "
                             f"lengths[{bad}] = {int(ln[bad])}")
    if isinstance(beam, bool):
        raise TypeError(f"{fn}: argument 'beam' must be a float, got bool")
    try:
        bm = float(beam)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: argument 'beam' must be a float, got {type(beam).__name__}") from None
    if not bm > 0:
        raise ValueError(f"{fn}: argument 'beam' must be > 0 (math.inf: no score pruning), got {beam}")
    if max_active is None:
        ma = 0
    else:
        if isinstance(max_active, bool):
            raise TypeError(f"{fn}: argument 'max_active' must be an int or None, got bool")
        try:
            ma = operator.index(max_active)
        except TypeError:
            raise TypeError(f"{fn}: argument 'max_active' must be an int or None, got "
                            f"{type(max_active).__name__}") from None
        if ma < 1:
            raise ValueError(f"{fn}: argument 'max_active' must be >= 1 (None: no limit), got {ma}")
    return np.ascontiguousarray(em, np.float64), ln, bm, int(ma)


def graph_decode(emissions: np.ndarray, graph: Graph, *, lengths: Optional[np.ndarray] = None,
                 beam: float = 20.0, max_active: Optional[int] = 10000,
                 fn: str = "graph_decode", _stats: Optional[dict] = None
                 ) -> List[List[GraphHypothesis]]:
    """Beam-pruned Viterbi decoding of ``(B, T, C)`` emissions against ``graph`` (numpy).

    See the module docstring for the score and the memory; the frontends'
    ``graph_decode`` documents the arguments.  Returns, per utterance, a list
    holding the best hypothesis (numpy arrays), or an empty list when the
    utterance's emissions hold a NaN or no path reaches an accept state.
    """
    em, ln, bm, ma = check_decode_args(fn, emissions, lengths, beam, max_active)
    dg = prepare_graph(graph, fn)
    B, T, C = em.shape
    if dg.num_classes_needed > C:
        raise ValueError(f"{fn}: argument 'graph' has input label {dg.num_classes_needed - 1} but "
                         f"'emissions' has C = {C} classes (labels must lie in [0, C) or be "
                         "-1, epsilon)")
    out_len = np.zeros(B, np.int64)
    out_score = np.full(B, -np.inf)
    for b in range(B):
        if np.isnan(em[b, :ln[b]]).any():
            out_len[b] = -2
    cap = (T + 1) * (dg.eps_depth + 1) + 1
    out_arcs = np.full((B, cap), -1, np.int64)
    stats = np.zeros((B, 2), np.int64)
    if B:
        order = np.argsort(-ln, kind="stable").astype(np.int64)
        cells = int(ln.sum()) * max(1, min(ma or dg.num_states, dg.num_states))
        _pool.run_batch(_decode_batch, order, cells, 1 << 16,
                        (em, ln, dg.ptr, dg.eps_end, dg.dst, dg.ilabel, dg.weight, dg.rank,
                         dg.gain, dg.starts, dg.accept, dg.has_eps, bm, ma, out_arcs, out_len,
                         out_score, stats))
    if _stats is not None:
        _stats["peak_active"] = stats[:, 0].copy()
        _stats["records"] = stats[:, 1].copy()
    results: List[List[GraphHypothesis]] = []
    for b in range(B):
        m = int(out_len[b])
        if m < 0:
            results.append([])
            continue
        arcs = dg.arc_id[out_arcs[b, :m]]
        il = dg.ilabel_all[arcs]
        ol = dg.olabel_all[arcs]
        consumed = np.cumsum(il >= 0)
        emit = ol >= 0
        # an arc's frame: its own if it reads one, else the last one read before it (or 0)
        frames = np.maximum(consumed - 1, 0)
        results.append([GraphHypothesis(ol[emit].astype(np.int64), float(out_score[b]),
                                        il[il >= 0].astype(np.int64),
                                        frames[emit].astype(np.int64), arcs.astype(np.int64))])
    return results
