"""Graph comparisons: exact equality, isomorphism, randomised equivalence."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .graph import Graph

__all__ = ["equal", "isomorphic", "rand_equivalent"]


def _check(fn, name, g):
    if not isinstance(g, Graph):
        raise TypeError(f"{fn}: {name} must be a Graph, got {type(g).__name__}")


def _sorted_arcs(g: Graph):
    """The arcs as ``(src, dst, ilabel, olabel, weight)`` columns in a canonical order."""
    A = g._na
    src, dst, il, ol = g._src[:A], g._dst[:A], g._ilabel[:A], g._olabel[:A]
    w = g._weight[:A]
    # weights by value (-0.0 == 0.0, NaN last); integer columns break ties
    order = np.lexsort((w, ol, il, dst, src))
    return src[order], dst[order], il[order], ol[order], w[order]


def equal(first: Graph, second: Graph) -> bool:
    """True when both graphs have the same nodes (same numbering and flags) and
    the same arcs, in any order (GTN's ``gtn::equal``).

    Each node's outgoing arcs must match one to one in ``(dst, ilabel, olabel,
    weight)``, weights compared as float32 (``0.0 == -0.0``).

    NB: unlike GTN, NaN weights compare equal to each other, so a graph with NaN
    weights equals itself.
    """
    _check("equal", "first", first)
    _check("equal", "second", second)
    if first._n != second._n or first._na != second._na:
        return False
    n = first._n
    if not (np.array_equal(first._start[:n], second._start[:n])
            and np.array_equal(first._accept[:n], second._accept[:n])):
        return False
    a, b = _sorted_arcs(first), _sorted_arcs(second)
    return bool(all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4]))
                and np.array_equal(a[4], b[4], equal_nan=True))


def _node_sig(g: Graph):
    n, A = g._n, g._na
    src, dst = g._src[:A], g._dst[:A]
    il, ol, w = g._ilabel[:A], g._olabel[:A], g._weight[:A]
    outs: List[list] = [[] for _ in range(n)]
    ins: List[list] = [[] for _ in range(n)]
    for a in range(A):
        outs[src[a]].append((int(il[a]), int(ol[a]), float(w[a]), src[a] == dst[a]))
        ins[dst[a]].append((int(il[a]), int(ol[a]), float(w[a]), src[a] == dst[a]))
    return [(bool(g._start[v]), bool(g._accept[v]), tuple(sorted(outs[v], key=repr)),
             tuple(sorted(ins[v], key=repr))) for v in range(n)]


def isomorphic(first: Graph, second: Graph) -> bool:
    """True when a renumbering of nodes maps one graph onto the other (flags and
    the multiset of arcs ``(src, dst, ilabel, olabel, weight)`` preserved).

    NB: backtracking search with node signatures; exponential in the worst case,
    quick for the graphs met in practice.
    """
    _check("isomorphic", "first", first)
    _check("isomorphic", "second", second)
    if first._n != second._n or first._na != second._na:
        return False
    s1, s2 = _node_sig(first), _node_sig(second)
    if sorted(map(repr, s1)) != sorted(map(repr, s2)):
        return False
    n = first._n

    def arcs(g):
        A = g._na
        d: Dict[tuple, int] = {}
        for a in range(A):
            k = (int(g._src[a]), int(g._dst[a]), int(g._ilabel[a]), int(g._olabel[a]), float(g._weight[a]))
            d[k] = d.get(k, 0) + 1
        return d

    a1, a2 = arcs(first), arcs(second)
    # adjacency (src, dst) -> multiset of arc attributes
    def adj(d):
        out: Dict[tuple, Dict[tuple, int]] = {}
        for (s, t, i, o, w), c in d.items():
            out.setdefault((s, t), {})[(i, o, w)] = c
        return out

    adj1, adj2 = adj(a1), adj(a2)
    cand = {v: [u for u in range(n) if repr(s2[u]) == repr(s1[v])] for v in range(n)}
    order = sorted(range(n), key=lambda v: len(cand[v]))
    mapping: Dict[int, int] = {}
    used = set()

    def consistent(v, u):
        for x, y in mapping.items():
            if adj1.get((v, x)) != adj2.get((u, y)) or adj1.get((x, v)) != adj2.get((y, u)):
                return False
        return adj1.get((v, v)) == adj2.get((u, u))

    def search(i):
        if i == n:
            return True
        v = order[i]
        for u in cand[v]:
            if u in used or not consistent(v, u):
                continue
            mapping[v] = u
            used.add(u)
            if search(i + 1):
                return True
            del mapping[v]
            used.discard(u)
        return False

    return search(0)


def _pair_score(g: Graph, ilabels, olabels) -> float:
    from .ops import compose, forward_score

    def chain(labels):
        k = len(labels)
        lab = np.asarray(labels, np.int64)
        st = np.zeros(k + 1, np.bool_)
        ac = np.zeros(k + 1, np.bool_)
        st[0] = True
        ac[k] = True
        nodes = np.arange(k, dtype=np.int64)
        return Graph._from_trusted(k + 1, nodes, nodes + 1, lab, lab.copy(), np.zeros(k, np.float32),
                                   st, ac, False)

    return forward_score(compose(compose(chain(ilabels), g), chain(olabels))).item()


def rand_equivalent(g1: Graph, g2: Graph, num_samples: int = 1000, tol: float = 1e-4,
                    max_length: int = 1000, rng: Optional[np.random.Generator] = None) -> bool:
    """Randomised test that two graphs have the same weighted language.

    Samples ``num_samples`` paths from each graph (`sample`),
    and checks that both graphs give the path's label pair (epsilons removed)
    the same log-semiring weight within ``tol`` (relative to ``max(1, |w|)``).

    NB: probabilistic (can miss differences), as in GTN.  Both graphs must be
    acyclic on their useful parts.
    """
    from .ops import sample

    _check("rand_equivalent", "g1", g1)
    _check("rand_equivalent", "g2", g2)
    rng = np.random.default_rng() if rng is None else rng
    for a, b in ((g1, g2), (g2, g1)):
        for _ in range(int(num_samples)):
            p = sample(a, max_length, rng=rng)
            if p._n == 0:
                break
            il = [x for x in p._ilabel[:p._na].tolist() if x != -1]
            ol = [x for x in p._olabel[:p._na].tolist() if x != -1]
            sa = _pair_score(a, il, ol)
            sb = _pair_score(b, il, ol)
            if sa == sb:
                continue
            if not (abs(sa - sb) <= tol * max(1.0, abs(sa))):
                return False
    # graphs with no accepting paths: both must be empty
    from .ops import forward_score

    try:
        e1 = forward_score(g1).item() == -np.inf
        e2 = forward_score(g2).item() == -np.inf
        if e1 != e2:
            return False
    except ValueError:
        pass
    return True
