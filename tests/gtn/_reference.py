"""Independent float64 references: path enumeration and a plain-Python DAG DP.

Nothing here calls duoloss's kernels; graphs are read through ``graph_arrays``.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from duoloss.gtn import graph_arrays

NEG_INF = -math.inf


def logsumexp(xs):
    xs = [x for x in xs]
    if not xs:
        return NEG_INF
    m = max(xs)
    if m == NEG_INF or math.isinf(m):
        return m
    return m + math.log(sum(math.exp(x - m) for x in xs))


def arrays(g):
    n, src, dst, il, ol, w, st, ac = graph_arrays(g)
    return (n, src.tolist(), dst.tolist(), il.tolist(), ol.tolist(),
            [float(x) for x in w], st.tolist(), ac.tolist())


def paths(g, max_paths=200000):
    """All start->accept paths (lists of arc indices) of an acyclic graph."""
    n, src, dst, il, ol, w, st, ac = arrays(g)
    out_arcs = defaultdict(list)
    for a, s in enumerate(src):
        out_arcs[s].append(a)
    result = []

    def dfs(v, path, depth):
        if depth > n + 1:
            raise ValueError("cycle")
        if ac[v]:
            result.append(list(path))
            if len(result) > max_paths:
                raise ValueError("too many paths")
        for a in out_arcs[v]:
            path.append(a)
            dfs(dst[a], path, depth + 1)
            path.pop()

    for v in range(n):
        if st[v]:
            dfs(v, [], 0)
    return result


def language(g, weights=None):
    """{(ilabels, olabels) without epsilons: float64 logsumexp weight}."""
    n, src, dst, il, ol, w, st, ac = arrays(g)
    if weights is not None:
        w = [float(x) for x in weights]
    groups = defaultdict(list)
    for p in paths(g):
        key = (tuple(il[a] for a in p if il[a] != -1), tuple(ol[a] for a in p if ol[a] != -1))
        groups[key].append(sum(w[a] for a in p))
    return {k: logsumexp(v) for k, v in groups.items()}


def brute_forward(g, weights=None):
    n, src, dst, il, ol, w, st, ac = arrays(g)
    if weights is not None:
        w = [float(x) for x in weights]
    return logsumexp([sum(w[a] for a in p) for p in paths(g)])


def brute_viterbi(g, weights=None):
    n, src, dst, il, ol, w, st, ac = arrays(g)
    if weights is not None:
        w = [float(x) for x in weights]
    scores = [sum(w[a] for a in p) for p in paths(g)]
    return max(scores) if scores else NEG_INF


def dag_forward_backward(g):
    """Plain-Python float64 forward score and arc posteriors on the useful part
    (arcs from accessible to co-accessible nodes).  Raises ValueError on a cycle."""
    n, src, dst, il, ol, w, st, ac = arrays(g)
    A = len(src)
    fwd = set(v for v in range(n) if st[v])
    changed = True
    while changed:
        changed = False
        for a in range(A):
            if src[a] in fwd and dst[a] not in fwd:
                fwd.add(dst[a]); changed = True
    bwd = set(v for v in range(n) if ac[v])
    changed = True
    while changed:
        changed = False
        for a in range(A):
            if dst[a] in bwd and src[a] not in bwd:
                bwd.add(src[a]); changed = True
    useful = [a for a in range(A) if src[a] in fwd and dst[a] in bwd]
    nodes = fwd & bwd
    memo_a, memo_b = {}, {}

    def alpha(v, depth=0):
        if depth > n:
            raise ValueError("cycle")
        if v not in memo_a:
            terms = [0.0] if st[v] else []
            terms += [alpha(src[a], depth + 1) + w[a] for a in useful if dst[a] == v]
            memo_a[v] = logsumexp(terms)
        return memo_a[v]

    def beta(v, depth=0):
        if depth > n:
            raise ValueError("cycle")
        if v not in memo_b:
            terms = [0.0] if ac[v] else []
            terms += [w[a] + beta(dst[a], depth + 1) for a in useful if src[a] == v]
            memo_b[v] = logsumexp(terms)
        return memo_b[v]

    Z = logsumexp([alpha(v) for v in nodes if ac[v]])
    grad = [0.0] * A
    if Z != NEG_INF:
        for a in useful:
            x = alpha(src[a]) + w[a] + beta(dst[a])
            grad[a] = 0.0 if x == NEG_INF else math.exp(x - Z)
    return Z, np.array(grad)
