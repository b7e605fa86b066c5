"""Differentiable operations on `Graph`.

Every operation returns a new graph.  When an input has ``calc_grad=True`` the
output records its inputs and a gradient function; `backward`
uses it to push ``d output / d output-arc-weight`` back to the inputs' arcs.

Semirings:

* **log** (``forward_score``): path scores add, alternative paths combine with
  ``logsumexp``.  Its gradient is the *arc posterior*: the expected number of
  times a path drawn with probability ``exp(score(path) - forward_score)`` uses
  the arc.
* **tropical** (``viterbi_score``, ``viterbi_path``): alternatives combine with
  ``max``.  The gradient is the indicator (use count) of the arcs of the best
  path found (ties: see `viterbi_score`).

NB: all scores are defined on the *useful* part of a graph (arcs on some
start -> accept path); a cycle there makes the path set infinite and raises
``ValueError``.  Cycles elsewhere are ignored.

References:
  A. Hannun et al., "Differentiable Weighted Finite-State Transducers", 2020.
  C. Allauzen, M. Riley, J. Schalkwyk, "A Generalized Composition Algorithm for
  Weighted Finite-State Transducers", Interspeech 2009 (epsilon filters).
  M. Mohri, "Generic epsilon-removal and input epsilon-normalization algorithms
  for weighted transducers", IJFCS 2002.
"""
from __future__ import annotations

import sys
import threading
from typing import List, Optional, Sequence

import numpy as np

from . import compose as KC
from . import scores as KS
from .graph import EPSILON, MAX_LABEL, Graph, _float_arg, _int_arg

__all__ = [
    "clone", "negate", "add", "subtract", "project_input", "project_output", "concat",
    "closure", "union", "intersect", "compose", "remove", "forward_score",
    "viterbi_score", "viterbi_path", "linear_graph", "scalar_graph", "sample",
]


# --------------------------------------------------------------------- helpers
def _check(fn: str, name: str, g) -> Graph:
    if not isinstance(g, Graph):
        raise TypeError(f"{fn}: {name} must be a Graph, got {type(g).__name__}")
    return g


def _arrays(g: Graph):
    n, A = g._n, g._na
    return (n, g._src[:A], g._dst[:A], g._ilabel[:A], g._olabel[:A], g._weight[:A],
            g._start[:n], g._accept[:n])


def _make(n, src, dst, il, ol, w, start, accept, inputs: Sequence[Graph], grad_fn) -> Graph:
    calc = any(g._calc_grad for g in inputs)
    return Graph._from_trusted(
        n, np.ascontiguousarray(src, np.int64), np.ascontiguousarray(dst, np.int64),
        np.ascontiguousarray(il, np.int64), np.ascontiguousarray(ol, np.int64),
        np.ascontiguousarray(w, np.float32), np.ascontiguousarray(start, np.bool_),
        np.ascontiguousarray(accept, np.bool_), calc, inputs, grad_fn if calc else None,
    )


_SCALAR_TEMPLATE = (np.array([0], np.int64), np.array([1], np.int64), np.array([True, False]),
                    np.array([False, True]))


def _scalar(value, inputs: Sequence[Graph], grad_fn, label: int = 0) -> Graph:
    """A 2-node, 1-arc graph ``0 -> 1`` (label ``label``) holding ``value``."""
    s0, d0, st0, ac0 = _SCALAR_TEMPLATE
    lab = np.full(1, label, np.int64)
    calc = any(g._calc_grad for g in inputs)
    return Graph._from_trusted(2, s0.copy(), d0.copy(), lab, lab.copy(),
                               np.full(1, value, np.float32), st0.copy(), ac0.copy(),
                               calc, inputs, grad_fn if calc else None)


def _gather_grad(index: np.ndarray, gout: np.ndarray, size: int) -> np.ndarray:
    """``out[a] = sum of gout[k] over k with index[k] == a`` (index ``-1`` ignored)."""
    return KS.scatter_add(index, np.asarray(gout, np.float64), int(size))


def _identity_grad(gout, inputs):
    return (gout,)


# ------------------------------------------------------------------ creation
def scalar_graph(weight: float = 0.0, calc_grad: bool = True) -> Graph:
    """A graph with one arc ``0 -> 1`` of weight ``weight`` (node 0 start, 1 accept).

    NB: the arc is labelled epsilon (``-1:-1``), as GTN's ``scalarGraph``; the
    scalar *results* of ``negate``/``add``/``subtract``/``forward_score`` are
    labelled ``0:0``, as in GTN (facebookresearch).
    """
    weight = _float_arg("scalar_graph", "weight", weight)
    g = Graph._from_trusted(2, np.array([0], np.int64), np.array([1], np.int64),
                            np.array([EPSILON], np.int64), np.array([EPSILON], np.int64),
                            np.array([weight], np.float32), np.array([True, False]),
                            np.array([False, True]), calc_grad)
    return g


def linear_graph(M: int, N: int, calc_grad: bool = True) -> Graph:
    """A chain of ``M+1`` nodes with ``N`` parallel arcs per step.

    Arc ``t*N + c`` goes ``t -> t+1`` with label ``c`` and weight 0; node 0 is
    the start and node ``M`` the accept node.  With ``set_weights(emissions)``
    for a ``(M, N)`` score matrix this is GTN's emission graph.

    Raises:
      ValueError: ``M`` or ``N`` is negative.
    """
    M, N = _int_arg("linear_graph", "M", M), _int_arg("linear_graph", "N", N)
    if M < 0 or N < 0:
        raise ValueError(f"linear_graph: M and N must be >= 0, got M={M}, N={N}")
    src, dst, lab, olab, w = KS.linear_arrays(M, N)
    start = np.zeros(M + 1, np.bool_)
    accept = np.zeros(M + 1, np.bool_)
    start[0] = True
    accept[M] = True
    return Graph._from_trusted(M + 1, src, dst, lab, olab, w, start, accept, calc_grad)


# ------------------------------------------------------------ structural ops
def clone(g: Graph) -> Graph:
    """A copy of ``g``; the gradient passes through unchanged."""
    _check("clone", "g", g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    return _make(n, src.copy(), dst.copy(), il.copy(), ol.copy(), w.copy(), st.copy(), ac.copy(),
                 (g,), _identity_grad)


def project_input(g: Graph) -> Graph:
    """The acceptor of ``g``'s input labels (``olabel := ilabel``)."""
    _check("project_input", "g", g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    return _make(n, src.copy(), dst.copy(), il.copy(), il.copy(), w.copy(), st.copy(), ac.copy(),
                 (g,), _identity_grad)


def project_output(g: Graph) -> Graph:
    """The acceptor of ``g``'s output labels (``ilabel := olabel``)."""
    _check("project_output", "g", g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    return _make(n, src.copy(), dst.copy(), ol.copy(), ol.copy(), w.copy(), st.copy(), ac.copy(),
                 (g,), _identity_grad)


def _one_arc(fn: str, name: str, g: Graph) -> float:
    _check(fn, name, g)
    if g._na != 1:
        raise ValueError(f"{fn}: {name} must have exactly one arc (a scalar graph), got {g._na}")
    return g._weight[0]


def negate(g: Graph) -> Graph:
    """``-w`` for a one-arc graph ``g`` of weight ``w``; gradient ``-1``."""
    w = _one_arc("negate", "g", g)
    return _scalar(-w, (g,), lambda gout, inputs: (-gout,))


def add(g1: Graph, g2: Graph) -> Graph:
    """``w1 + w2`` for one-arc graphs; gradients ``1, 1``."""
    w1 = _one_arc("add", "g1", g1)
    w2 = _one_arc("add", "g2", g2)
    with np.errstate(over="ignore", invalid="ignore"):
        value = np.float32(w1) + np.float32(w2)
    return _scalar(value, (g1, g2), lambda gout, inputs: (gout, gout))


def subtract(g1: Graph, g2: Graph) -> Graph:
    """``w1 - w2`` for one-arc graphs; gradients ``1, -1``."""
    w1 = _one_arc("subtract", "g1", g1)
    w2 = _one_arc("subtract", "g2", g2)
    with np.errstate(over="ignore", invalid="ignore"):
        value = np.float32(w1) - np.float32(w2)
    return _scalar(value, (g1, g2), lambda gout, inputs: (gout, -gout))


def _graph_list(fn: str, graphs) -> List[Graph]:
    if isinstance(graphs, Graph):
        raise TypeError(f"{fn}: graphs must be a sequence of Graphs, got a single Graph")
    try:
        gl = list(graphs)
    except TypeError:
        raise TypeError(f"{fn}: graphs must be a sequence of Graphs, got {type(graphs).__name__}") from None
    for i, g in enumerate(gl):
        _check(fn, f"graphs[{i}]", g)
    return gl


def _split_grad(sizes):
    bounds = np.cumsum([0] + list(sizes))

    def fn(gout, inputs):
        return tuple(gout[bounds[i]:bounds[i + 1]] for i in range(len(sizes)))

    return fn


def union(graphs: Sequence[Graph]) -> Graph:
    """The union: all inputs side by side (node ids offset, flags kept).

    Its language is the union of the languages; a label pair accepted by several
    inputs gets the ``logsumexp`` of their weights.
    """
    gl = _graph_list("union", graphs)
    offs = np.cumsum([0] + [g._n for g in gl])
    parts = [_arrays(g) for g in gl]
    cat = lambda i, dt: np.concatenate([p[i] for p in parts] or [np.zeros(0, dt)]).astype(dt)
    src = np.concatenate([p[1] + o for p, o in zip(parts, offs)] or [np.zeros(0, np.int64)])
    dst = np.concatenate([p[2] + o for p, o in zip(parts, offs)] or [np.zeros(0, np.int64)])
    return _make(int(offs[-1]), src, dst, cat(3, np.int64), cat(4, np.int64), cat(5, np.float32),
                 cat(6, np.bool_), cat(7, np.bool_), tuple(gl), _split_grad([g._na for g in gl]))


def concat(*args) -> Graph:
    """Concatenation ``concat(g1, g2)`` or ``concat([g1, g2, ...])``.

    The inputs are placed side by side; after graph ``i``'s arcs come epsilon
    arcs (weight 0) from every accept node of graph ``i-1`` to every start node
    of graph ``i``.  Only the first graph's starts and the last graph's accepts
    keep their flags.  ``concat([])`` is the one-node graph accepting the empty
    string.
    """
    if len(args) == 2 and all(isinstance(a, Graph) for a in args):
        gl = list(args)
    elif len(args) == 1:
        gl = _graph_list("concat", args[0])
    else:
        raise TypeError("concat: expected concat(g1, g2) or concat([g1, g2, ...])")
    if not gl:
        return Graph._from_trusted(1, *(np.zeros(0, np.int64) for _ in range(4)),
                                   np.zeros(0, np.float32), np.ones(1, np.bool_),
                                   np.ones(1, np.bool_), False)
    offs = np.cumsum([0] + [g._n for g in gl])
    src, dst, il, ol, w, idx = [], [], [], [], [], []
    base = 0
    for i, g in enumerate(gl):
        n, s, d, a, b, wt, st, ac = _arrays(g)
        src.append(s + offs[i]); dst.append(d + offs[i]); il.append(a); ol.append(b)
        w.append(wt); idx.append(np.arange(base, base + g._na))
        base += g._na
        if i > 0:
            prev = gl[i - 1]
            acc = np.flatnonzero(prev._accept[:prev._n]) + offs[i - 1]
            sts = np.flatnonzero(st) + offs[i]
            es = np.repeat(acc, sts.size)
            ed = np.tile(sts, acc.size)
            src.append(es); dst.append(ed)
            il.append(np.full(es.size, EPSILON)); ol.append(np.full(es.size, EPSILON))
            w.append(np.zeros(es.size, np.float32)); idx.append(np.full(es.size, -1))
    N = int(offs[-1])
    start = np.zeros(N, np.bool_)
    accept = np.zeros(N, np.bool_)
    start[offs[0]:offs[1]] = gl[0]._start[:gl[0]._n]
    accept[offs[-2]:offs[-1]] = gl[-1]._accept[:gl[-1]._n]
    index = np.concatenate(idx).astype(np.int64)
    sizes = [g._na for g in gl]
    split = _split_grad(sizes)

    def grad_fn(gout, inputs):
        return split(gout[index >= 0], inputs)

    return _make(N, np.concatenate(src), np.concatenate(dst), np.concatenate(il),
                 np.concatenate(ol), np.concatenate(w), start, accept, tuple(gl), grad_fn)


def closure(g: Graph) -> Graph:
    """Kleene closure: new node 0 is the only start and accept node.

    Old node ``n`` becomes ``n+1`` and the old arcs come first, then epsilon arcs
    ``0 -> s+1`` for each start ``s`` and ``a+1 -> 0`` for each accept ``a``
    (weight 0), as in GTN.  The result is cyclic.
    """
    _check("closure", "g", g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    starts = np.flatnonzero(st) + 1
    accs = np.flatnonzero(ac) + 1
    ne = starts.size + accs.size
    nsrc = np.concatenate([src + 1, np.zeros(starts.size, np.int64), accs])
    ndst = np.concatenate([dst + 1, starts, np.zeros(accs.size, np.int64)])
    nil = np.concatenate([il, np.full(ne, EPSILON)])
    nol = np.concatenate([ol, np.full(ne, EPSILON)])
    nw = np.concatenate([w, np.zeros(ne, np.float32)])
    flag = np.zeros(n + 1, np.bool_)
    flag[0] = True
    A = g._na
    return _make(n + 1, nsrc, ndst, nil, nol, nw, flag, flag.copy(), (g,),
                 lambda gout, inputs: (gout[:A],))


# -------------------------------------------------------- intersect / compose
_TLS = threading.local()


def _scratch(name: str, size: int, dtype) -> np.ndarray:
    """A per-thread scratch buffer of at least ``size`` entries (reused across calls)."""
    buf = getattr(_TLS, name, None)
    if buf is None or buf.shape[0] < size:
        buf = np.empty(max(size, 2 * (0 if buf is None else buf.shape[0])), dtype)
        setattr(_TLS, name, buf)
    return buf


_LABEL_TABLES = True  # (node, label) lookup tables in compose (tests turn them off)
_DENSE_MAX = 1 << 21  # entries of the per-thread dense state table (16 MiB of int64)
_EMPTY_TABLE = np.zeros(0, np.int64)
_EMPTY_LABELS = np.zeros(0, np.int64)


def _dense_table(size: int) -> np.ndarray:
    """A per-thread all ``-1`` table of ``size`` entries, or an empty one (use hashing)."""
    if size > _DENSE_MAX:
        return _EMPTY_TABLE
    buf = getattr(_TLS, "table", None)
    if buf is None or buf.shape[0] < size:
        buf = np.full(max(size, 2 * (0 if buf is None else buf.shape[0])), -1, np.int64)
        _TLS.table = buf
    return buf


_POOL_MIN = 1 << 15   # arrays of fewer bytes come straight from malloc
_POOL_SLOTS = 48      # recycled buffers kept per thread and dtype


def _free_refs() -> int:
    """Reference count of an unused pooled buffer as seen in `_pooled`."""
    pool = [np.empty(1)]
    for i in range(len(pool)):
        buf = pool[i]
        return sys.getrefcount(buf)
    return 3  # pragma: no cover


_FREE_REFS = _free_refs()


def _pooled(dtype, size: int) -> np.ndarray:
    """A fresh-contents array of ``size`` entries whose memory is recycled.

    Large intermediate graphs (an intersection of a CTC graph with 200 frames
    has ~30k arcs) would otherwise come from fresh ``mmap`` pages every call,
    and first-touch page faults then cost more than the kernels.  Buffers are
    kept per thread; one is reused once no array refers to it any more (its
    reference count says so), so results never share memory.
    """
    dtype = np.dtype(dtype)
    if size * dtype.itemsize < _POOL_MIN:
        return np.empty(size, dtype)
    pools = getattr(_TLS, "pools", None)
    if pools is None:
        pools = _TLS.pools = {}
    pool = pools.setdefault(dtype.str, [])
    best = -1
    for i in range(len(pool)):
        buf = pool[i]
        # free = 3 references: the pool list, ``buf`` and getrefcount's argument
        if buf.shape[0] >= size and sys.getrefcount(buf) <= _FREE_REFS and \
                (best < 0 or buf.shape[0] < pool[best].shape[0]):
            best = i
    if best >= 0 and pool[best].shape[0] <= 2 * size + 1024:
        return pool[best][:size]
    cap = 1 << max(0, (size - 1).bit_length())
    buf = np.empty(cap, dtype)
    if len(pool) < _POOL_SLOTS:
        pool.append(buf)
    else:
        for i in range(len(pool)):
            old = pool[i]
            if sys.getrefcount(old) <= _FREE_REFS:
                pool[i] = buf
                break
    return buf[:size]


def _compose_caps(bound: int, n1: int, n2: int, m1: int, m2: int):
    """Initial (state, arc) buffer sizes for compose; the kernel asks for more."""
    state_cap = bound if bound <= (1 << 18) else max(1024, 4 * (n1 + n2))
    return state_cap, max(1024, 4 * state_cap, m1 + m2)


def _compose_impl(fn: str, g1: Graph, g2: Graph, match1: np.ndarray, match2: np.ndarray,
                  out_il_from1: np.ndarray, out_ol_from2: np.ndarray) -> Graph:
    n1, s1, d1, _, _, w1, st1, ac1 = _arrays(g1)
    n2, s2, d2, _, _, w2, st2, ac2 = _arrays(g2)
    if max(g1._na, g2._na) >= 2 ** 31:
        raise ValueError(f"{fn}: graphs with 2**31 arcs or more are not supported")
    # three filter states only when both sides have epsilons (see compose_kernel)
    nf = 3 if (KC.has_label(match1, _EMPTY_LABELS, EPSILON)
               and KC.has_label(_EMPTY_LABELS, match2, EPSILON)) else 1
    bound = max(n1 * n2 * nf, 1)   # Python ints: exact
    if bound >= 2 ** 62:
        # state keys ``(q2 * n1 + q1) * nf`` must fit int64 inside the kernel
        raise ValueError(f"{fn}: the product of the node counts is too large "
                         f"({n1} x {n2} nodes; at most 2**62 / {nf} pairs are supported)")
    state_cap, arc_cap = _compose_caps(bound, n1, n2, g1._na, g2._na)
    while True:
        hcap = 64
        while hcap < 2 * state_cap:
            hcap *= 2
        hkeys = _scratch("hkeys", hcap, np.int64)[:hcap]
        ws = _scratch("ws", hcap + 6 * state_cap + 5 * arc_cap + 1, np.int64)
        table = _dense_table(bound)
        status, ns, na, nstart, n, m, topo = KC.compose_kernel(
            n1, s1, d1, match1, st1, ac1, out_il_from1, w1,
            n2, s2, d2, match2, st2, ac2, out_ol_from2, w2, state_cap, arc_cap, hkeys, ws, table,
            _LABEL_TABLES)
        if status == 0:
            # three recycled blocks (views of one buffer per dtype: fewer pool scans)
            blk = _pooled(np.int64, 4 * m)
            src, dst, il, ol = blk[:m], blk[m:2 * m], blk[2 * m:3 * m], blk[3 * m:]
            blk = _pooled(np.int32, 2 * m)
            a1, a2 = blk[:m], blk[m:]
            w = _pooled(np.float32, m)
            start, accept = np.empty(n, np.bool_), np.empty(n, np.bool_)
            status = KC.compose_emit(ns, na, nstart, n, m, ac1, ac2, out_il_from1, w1,
                                    out_ol_from2, w2, state_cap, arc_cap, hcap, ws,
                                    src, dst, a1, a2, il, ol, w, start, accept)
            if status != 0:  # pragma: no cover - sizes come from compose_kernel
                raise RuntimeError(f"{fn}: internal error (compose output buffers too small)")
            break
        if status != 1:  # pragma: no cover - scratch sizes are computed above
            raise RuntimeError(f"{fn}: internal error (compose scratch buffers too small)")
        state_cap = int(min(4 * state_cap, bound))
        arc_cap = 4 * arc_cap
    A1, A2 = g1._na, g2._na

    def grad_fn(gout, inputs):
        return (_gather_grad(a1, gout, A1) if inputs[0]._calc_grad else None,
                _gather_grad(a2, gout, A2) if inputs[1]._calc_grad else None)

    calc = g1._calc_grad or g2._calc_grad
    out = Graph._from_trusted(n, src, dst, il, ol, w, start, accept, calc, (g1, g2),
                              grad_fn if calc else None)
    out._topo = bool(topo)   # node ids topological, arcs grouped by source
    return out


def compose(g1: Graph, g2: Graph) -> Graph:
    """Composition of transducers: ``g1``'s output labels meet ``g2``'s input labels.

    Output arcs carry ``(g1.ilabel, g2.olabel)`` and weight ``w1 + w2``.  The
    weight of a label pair ``(x, z)`` in the result is
    ``logsumexp over y of w1(x, y) + w2(y, z)`` (epsilons removed from the
    sequences).  Epsilon moves are handled with a three-state epsilon filter
    (only when both sides have epsilons; otherwise none is needed), so
    every pair of input paths yields exactly one output path (GTN's
    facebookresearch build can drop paths here).  Only states that are both
    accessible and co-accessible are kept.

    Gradient: each output arc passes its gradient to the input arc(s) it was
    built from.
    """
    _check("compose", "g1", g1)
    _check("compose", "g2", g2)
    return _compose_impl("compose", g1, g2, g1._olabel[:g1._na], g2._ilabel[:g2._na],
                         g1._ilabel[:g1._na], g2._olabel[:g2._na])


def intersect(g1: Graph, g2: Graph) -> Graph:
    """Intersection of acceptors: paths of ``g1`` and ``g2`` with equal label
    sequences (epsilons removed), weights added.

    Matching uses the input labels of both graphs; output arcs carry
    ``(g1.ilabel, g2.olabel)``.  See `compose` for the epsilon filter and
    the gradient.
    """
    _check("intersect", "g1", g1)
    _check("intersect", "g2", g2)
    return _compose_impl("intersect", g1, g2, g1._ilabel[:g1._na], g2._ilabel[:g2._na],
                         g1._ilabel[:g1._na], g2._olabel[:g2._na])


# ------------------------------------------------------------------- scores
def _prepare(fn: str, g: Graph):
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    prep = KS.dag_prepare(n, src, dst, st, ac)
    if prep[0] != 0:
        raise ValueError(
            f"{fn}: the graph has a cycle (or self-loop) on a path from a start to an accept "
            "node, so it has infinitely many paths; scores are defined only for graphs whose "
            "useful part is acyclic"
        )
    return prep


def forward_score(g: Graph) -> Graph:
    """Log-semiring score: ``log sum over paths of exp(sum of arc weights)``.

    $$
    \\alpha_v = \\log\\Big([v \\in S] + \\sum_{a: u \\to v} e^{\\alpha_u + w_a}\\Big),
    \\qquad \\text{score} = \\log \\sum_{v \\in F} e^{\\alpha_v}
    $$

    computed in float64 over a topological order of the useful part.  No path
    gives ``-inf``.  A node that is both start and accept contributes the empty
    path (weight 0).

    Gradient: ``d score / d w_a`` = posterior of arc ``a`` (0 for arcs on no
    path or only on ``-inf`` paths; never NaN unless the score is NaN/``+inf``).

    Returns:
      A one-arc graph holding the score (float32).

    Raises:
      ValueError: the useful part of ``g`` is cyclic.
    """
    _check("forward_score", "g", g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    if g._topo is None:
        g._topo = bool(KS.is_sorted_dag(src, dst))
    if g._topo:
        # node ids are a topological order and arcs are grouped by source (e.g.
        # intersect/compose results with a linear graph): no sort, no CSR
        if not g._calc_grad:
            return _scalar(KS.log_forward_sorted(n, src, dst, w, st, ac)[0], (g,), None)
        # the weights are copied (set_weights may change them later; node flags never change)
        w_saved = np.empty(g._na, np.float32)
        score, mx, sm = KS.log_forward_sorted(n, src, dst, w, st, ac, w_saved)
        w = w_saved

        def grad_sorted(gout, inputs):
            return (KS.log_backward_sorted(src, dst, w, ac, mx, sm, score, _scratch("mb", n, np.float64),
                                          _scratch("sb", n, np.float64), float(gout[0])),)

        return _scalar(score, (g,), grad_sorted)
    scratch = _scratch("fwd", 2 * n + g._na + 1, np.int64)
    status, score, alpha, order, out_ptr, out_idx = KS.log_forward_fast(n, src, dst, w, st, ac, scratch)
    if status == 0:
        if not g._calc_grad:
            return _scalar(score, (g,), None)
        w = w.copy()
        ac = ac.copy()

        def grad_fn(gout, inputs):
            beta = _scratch("beta", n, np.float64)
            post = KS.log_backward_fast(order, out_ptr, out_idx, dst, w, ac, alpha, score, beta)
            return (post * gout[0],)

        return _scalar(score, (g,), grad_fn)
    # a cycle somewhere: restrict to the useful part (raises if the cycle is on a path)
    status, order, un, ua, op, oi, ip, ii = _prepare("forward_score", g)
    score, alpha = KS.log_forward(order, ua, ip, ii, src, w, st, ac, n)
    if not g._calc_grad:
        return _scalar(score, (g,), None)
    w = w.copy()
    ac = ac.copy()

    def grad_fn_useful(gout, inputs):
        post = KS.log_backward(order, ua, op, oi, src, dst, w, ac, n, alpha, score)
        return (post * gout[0],)

    return _scalar(score, (g,), grad_fn_useful)


def _viterbi(fn: str, g: Graph):
    status, order, un, ua, op, oi, ip, ii = _prepare(fn, g)
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    score, best_acc, back = KS.max_forward(order, ua, ip, ii, src, w, st, ac, n)
    if best_acc < 0:
        return score, np.zeros(0, np.int64)
    return score, KS.trace_back(best_acc, back, src, order.shape[0] + 1)


def viterbi_score(g: Graph) -> Graph:
    """Tropical score: the largest path weight (``-inf`` without paths).

    Gradient: the use count (0/1 in a DAG) of each arc on the best path found.
    Ties are broken deterministically: at each node the empty path (start node)
    beats incoming arcs, and incoming arcs keep the first maximum in arc order;
    among accept nodes the lowest id wins.  NaN weights never win.
    """
    _check("viterbi_score", "g", g)
    score, path = _viterbi("viterbi_score", g)
    A = g._na
    return _scalar(score, (g,), lambda gout, inputs: (np.bincount(path, minlength=A)[:A] * gout[0],))


def viterbi_path(g: Graph) -> Graph:
    """The best path as a linear graph (arcs keep labels and weights).

    Node 0 is the start, the last node accepts.  When no path scores above
    ``-inf`` the result is the empty graph (0 nodes).  Gradient: each path arc
    passes its gradient to the input arc it copies.
    """
    _check("viterbi_path", "g", g)
    score, path = _viterbi("viterbi_path", g)
    if score == -np.inf:
        return _empty_graph(g)
    return _path_graph(g, path)


def _empty_graph(g: Graph) -> Graph:
    """The graph with no nodes (no path), recorded as computed from ``g``."""
    return _make(0, *(np.zeros(0, np.int64) for _ in range(4)), np.zeros(0, np.float32),
                 np.zeros(0, np.bool_), np.zeros(0, np.bool_), (g,), None)


def _path_graph(g: Graph, path: np.ndarray) -> Graph:
    k = path.size
    A = g._na
    start = np.zeros(k + 1, np.bool_)
    accept = np.zeros(k + 1, np.bool_)
    start[0] = True
    accept[k] = True
    nodes = np.arange(k, dtype=np.int64)
    return _make(k + 1, nodes, nodes + 1, g._ilabel[path], g._olabel[path], g._weight[path],
                 start, accept, (g,), lambda gout, inputs: (_gather_grad(path, gout, A),))


def sample(g: Graph, max_length: int = 1000, rng: Optional[np.random.Generator] = None) -> Graph:
    """A random path of ``g`` as a linear graph (like GTN's ``sample``).

    Starting at a uniformly chosen start node, at each node the walk stops (if
    the node accepts) or follows an out-arc, all choices equally likely; it is
    retried when it reaches a dead end.  Returns the empty graph if ``g`` has no
    accepting path or no path is found within ``max_length`` arcs (after 100
    attempts).  Gradient as `viterbi_path`.
    """
    max_length = _int_arg("sample", "max_length", max_length)
    if max_length < 0:
        raise ValueError(f"sample: max_length must be >= 0, got {max_length}")
    _check("sample", "g", g)
    rng = np.random.default_rng() if rng is None else rng
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    starts = np.flatnonzero(st)
    if starts.size == 0 or not ac.any():
        return _empty_graph(g)
    ptr, idx = KS.csr(n, src)
    for _ in range(100):
        v = int(rng.choice(starts))
        path = []
        while len(path) <= max_length:
            deg = int(ptr[v + 1] - ptr[v])
            choices = deg + (1 if ac[v] else 0)
            if choices == 0:
                break
            c = int(rng.integers(choices))
            if c == deg:
                return _path_graph(g, np.asarray(path, np.int64))
            a = int(idx[ptr[v] + c])
            path.append(a)
            v = int(dst[a])
    return _empty_graph(g)


# --------------------------------------------------------------- remove (eps)
def _removable_closure(u, n, order_from_u, out_ptr, out_idx, e_dst, e_w):
    """``(alpha, seen)`` of node ``u`` for `remove`: ``alpha[v]`` is the
    ``logsumexp`` of the removable paths ``u -> v`` (``v = n``: the virtual
    final node behind every accept node), ``seen[v]`` whether there is one.
    ``order_from_u`` is the removable arcs' topological order from ``u`` on."""
    alpha = np.full(n + 1, -np.inf)
    seen = np.zeros(n + 1, np.bool_)
    alpha[u] = 0.0
    seen[u] = True
    for y in order_from_u:
        if not seen[y]:
            continue
        for k in range(out_ptr[y], out_ptr[y + 1]):
            e = out_idx[k]
            z = e_dst[e]
            seen[z] = True
            alpha[z] = np.logaddexp(alpha[z], alpha[y] + e_w[e])
    return alpha, seen


def _removable_closure_backward(alpha, seen, s, order_from_u, out_ptr, out_idx, e_dst, e_w,
                                e_idx, grad):
    """Backward of `_removable_closure`: ``s[v]`` holds the incoming
    gradient of ``alpha[v]`` and becomes the total gradient; each removable
    arc's share (its posterior on the paths ``u -> v``) is added to ``grad``."""
    for y in order_from_u[::-1]:
        if not seen[y]:
            continue
        acc = s[y]
        for k in range(out_ptr[y], out_ptr[y + 1]):
            e = out_idx[k]
            z = e_dst[e]
            if alpha[z] == -np.inf or alpha[y] == -np.inf or e_w[e] == -np.inf:
                continue
            p = np.exp(alpha[y] + e_w[e] - alpha[z])
            acc += p * s[z]
            if e_idx[e] >= 0:
                grad[e_idx[e]] += p * s[z]
        s[y] = acc


def _remove_rows(out, final_rho, st, kept_ids, newid, il, ol, il_rm, ol_rm, n):
    """The arcs and nodes of `remove`'s result, from the re-rooted arcs
    ``out`` (``(u, x, a, weight, u, v)``: kept node ``u`` reaches ``v`` through
    removable arcs, then real arc ``a = v -> x``) and the final weights
    ``final_rho`` (``None``: a plain accept node).

    Returns ``(N, rows, start, accept)``: the node count, one row
    ``(src, dst, ilabel, olabel, weight, a, deps)`` per output arc (``a = -1``:
    a companion start node's removable arc; ``deps`` the closures ``(u, v)``
    its weight depends on), and the start / accept masks.
    """
    # a sink (no kept out-arcs, not a start node) whose removable paths reach
    # acceptance with weight exactly 0 simply becomes an accept node (GTN's
    # result): every path into it ends there, so the in-arcs' gradients are the
    # flow through rho and the epsilon weights keep their gradient
    has_out = {u for (u, x, a, wt, uu, v) in out}
    sinks = {u for u, r in final_rho.items()
             if r is not None and r == 0.0 and not st[u] and u not in has_out}
    need_f = [u for u, r in final_rho.items() if r is not None and u not in sinks]
    # start nodes whose empty string has a non-trivial weight get a new start node
    # with one removable arc into F (using the start node itself would let paths
    # that merely pass through it end there as well)
    empty_starts = [u for u in need_f if st[u]]
    F = kept_ids.size
    N = kept_ids.size + (1 if need_f else 0) + len(empty_starts)
    accept_new = np.zeros(N, np.bool_)
    for u, r in final_rho.items():
        if r is None or u in sinks:
            accept_new[newid[u]] = True
    if need_f:
        accept_new[F] = True
    rows = []   # (src_new, dst_new, ilabel, olabel, weight, a, deps[(u, v)])
    for (u, x, a, wt, uu, v) in out:
        deps = ((uu, v), (x, n)) if x in sinks else ((uu, v),)
        rows.append((newid[u], newid[x], int(il[a]), int(ol[a]), wt, a, deps))
    need_set = set(need_f)
    for (u, x, a, wt, uu, v) in out:
        if x in need_set:
            rows.append((newid[u], F, int(il[a]), int(ol[a]), wt + final_rho[x], a, ((uu, v), (x, n))))
    for j, u in enumerate(empty_starts):
        rows.append((F + 1 + j, F, il_rm, ol_rm, final_rho[u], -1, ((u, n),)))
    start_new = np.zeros(N, np.bool_)
    start_new[newid[np.flatnonzero(st)]] = True
    start_new[F + 1:] = True
    return N, rows, start_new, accept_new


def remove(g: Graph, ilabel: int = EPSILON, olabel: Optional[int] = None) -> Graph:
    """Epsilon removal that keeps the weighted language.

    ``remove(g, label)`` removes arcs labelled ``label:label`` (default epsilon);
    ``remove(g, ilabel, olabel)`` removes arcs labelled ``ilabel:olabel``.  Every
    remaining arc ``v -> x`` is re-rooted at each node ``u`` whose removable
    paths reach ``v``, with weight ``d(u, v) + w``, where ``d(u, v)`` is the
    ``logsumexp`` over removable paths ``u -> v``.  Kept nodes: starts and nodes
    with a kept in-arc (GTN's rule).

    Because GTN graphs have no final weights, a node ``x`` that reaches an accept
    node through removable arcs (other than being an accept node itself with no
    further such path) gets its final weight ``rho(x)`` folded into copies of
    its in-arcs that lead to one new accept node.  A start node with such a
    weighted empty path gets a companion start node with one removable arc
    (weight ``rho``) into that accept node: without final weights this is the
    only way to give the empty string a weight.

    Gradient: exact (``d(u, v)`` is differentiated through its removable-path
    posteriors).  Unlike GTN, weights are kept and the gradient exists.

    Raises:
      ValueError: the removable arcs form a cycle.

    NB: cost ``O(N * E)`` for ``N`` kept nodes and ``E`` removable arcs: meant
    for moderate graphs.
    """
    _check("remove", "g", g)
    il_rm = _int_arg("remove", "ilabel", ilabel)
    ol_rm = il_rm if olabel is None else _int_arg("remove", "olabel", olabel)
    if not (EPSILON <= il_rm <= MAX_LABEL and EPSILON <= ol_rm <= MAX_LABEL):
        raise ValueError(f"remove: labels must lie in [-1, 2**63 - 1], got ilabel={il_rm}, "
                         f"olabel={ol_rm}")
    n, src, dst, il, ol, w, st, ac = _arrays(g)
    A = g._na
    eps = (il == il_rm) & (ol == ol_rm)
    # removable arcs plus virtual arcs accept -> F (F = n)
    acc_nodes = np.flatnonzero(ac)
    e_src = np.concatenate([src[eps], acc_nodes]).astype(np.int64)
    e_dst = np.concatenate([dst[eps], np.full(acc_nodes.size, n, np.int64)])
    e_w = np.concatenate([w[eps].astype(np.float64), np.zeros(acc_nodes.size)])
    e_idx = np.concatenate([np.flatnonzero(eps), np.full(acc_nodes.size, -1, np.int64)])
    allt = np.ones(n + 1, np.bool_)
    status, order, _, _, out_ptr, out_idx, in_ptr, in_idx = KS.dag_prepare(n + 1, e_src, e_dst, allt, allt)
    if status:
        raise ValueError(f"remove: the arcs labelled {il_rm}:{ol_rm} form a cycle; their closure is infinite")
    real = np.flatnonzero(~eps)
    kept = np.zeros(n, np.bool_)
    kept[st] = True
    kept[dst[real]] = True
    kept_ids = np.flatnonzero(kept)
    newid = np.full(n + 1, -1, np.int64)
    newid[kept_ids] = np.arange(kept_ids.size)
    # real arcs grouped by source
    r_ptr, r_idx = KS.csr(n, src[real]) if real.size else (np.zeros(n + 1, np.int64), np.zeros(0, np.int64))
    pos = np.empty(n + 1, np.int64)
    pos[order] = np.arange(order.size)

    out = []   # (src_u, dst_x_old, arc a (input) or -1, weight, u, v)  v: closure target (or n for F)
    alphas = {}
    reach = {}
    final_rho = {}
    for u in kept_ids:
        alpha, seen = _removable_closure(u, n, order[pos[u]:], out_ptr, out_idx, e_dst, e_w)
        alphas[u] = alpha
        reach[u] = seen
        for v in np.flatnonzero(seen[:n]):
            for k in range(r_ptr[v], r_ptr[v + 1]):
                a = real[r_idx[k]]
                out.append((u, int(dst[a]), int(a), alpha[v] + float(w[a]), u, int(v)))
        if seen[n]:
            # accepted through removable arcs (or by being an accept node)
            other = seen[:n] & ac
            other[u] = False
            simple = ac[u] and not other.any()
            final_rho[u] = None if simple else alpha[n]
    N, rows, start_new, accept_new = _remove_rows(out, final_rho, st, kept_ids, newid, il, ol,
                                                  il_rm, ol_rm, n)
    M = len(rows)
    r_src = np.array([r[0] for r in rows], np.int64)
    r_dst = np.array([r[1] for r in rows], np.int64)
    r_il = np.array([r[2] for r in rows], np.int64)
    r_ol = np.array([r[3] for r in rows], np.int64)
    r_w = np.array([r[4] for r in rows], np.float64).astype(np.float32)
    r_a = np.array([r[5] for r in rows], np.int64)
    r_deps = [r[6] for r in rows]

    def grad_fn(gout, inputs):
        grad = _gather_grad(r_a, gout, A) if M else np.zeros(A)
        G = {}
        for k in range(M):
            gk = gout[k]
            if gk == 0:
                continue
            for (u, v) in r_deps[k]:
                Gu = G.setdefault(u, {})
                Gu[v] = Gu.get(v, 0.0) + gk
        for u, Gu in G.items():
            alpha = alphas[u]
            seen = reach[u]
            s = np.zeros(n + 1)
            for v, val in Gu.items():
                s[v] += val
            _removable_closure_backward(alpha, seen, s, order[pos[u]:], out_ptr, out_idx, e_dst,
                                        e_w, e_idx, grad)
        return (grad,)

    return _make(N, r_src, r_dst, r_il, r_ol, r_w, start_new, accept_new, (g,), grad_fn)
