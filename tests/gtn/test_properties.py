"""Property tests: every operation and score against brute-force path enumeration.

Random small acyclic graphs (node ids permuted, parallel arcs, epsilons, several
start/accept nodes) are pushed through each operation; the output's weighted
language must equal the algebraic combination of the inputs' languages, and the
gradients must equal central differences (float64) of the brute-force score.
"""
from __future__ import annotations

import io
import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duoloss.gtn as gtn

from ._reference import brute_forward, brute_viterbi, language, logsumexp, paths

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def dags(draw, max_nodes=5, max_arcs=8, labels=(-1, 0, 1, 2), acceptor=None):
    n = draw(st.integers(1, max_nodes))
    perm = draw(st.permutations(range(n)))
    A = draw(st.integers(0, max_arcs))
    src, dst, il, ol, w = [], [], [], [], []
    is_acc = draw(st.booleans()) if acceptor is None else acceptor
    for _ in range(A):
        i = draw(st.integers(0, n - 1))
        j = draw(st.integers(0, n - 1))
        if i == j:
            continue
        i, j = min(i, j), max(i, j)
        src.append(perm[i])
        dst.append(perm[j])
        a = draw(st.sampled_from(labels))
        b = a if is_acc else draw(st.sampled_from(labels))
        il.append(a)
        ol.append(b)
        w.append(draw(st.floats(-2, 2, width=32)))
    starts = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True))
    accepts = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
    return gtn.Graph.from_arrays(n, np.array(src, np.int64), np.array(dst, np.int64),
                                 np.array(il, np.int64), np.array(ol, np.int64),
                                 np.array(w, np.float32), np.array(starts, np.int64),
                                 np.array(accepts, np.int64))


def weights64(g):
    return gtn.graph_arrays(g)[5].astype(np.float64)


def central_diff(f, w, h=1e-5):
    out = np.zeros_like(w)
    for a in range(w.size):
        wp = w.copy()
        wm = w.copy()
        wp[a] += h
        wm[a] -= h
        fp, fm = f(wp), f(wm)
        out[a] = 0.0 if (fp == fm) else (fp - fm) / (2 * h)
    return out


def path_table(g, weights):
    """[(ilabels, olabels, arcs)] of all paths; weights applied by the caller."""
    n, src, dst, il, ol = (gtn.graph_arrays(g)[i] for i in range(5))
    out = []
    for p in paths(g):
        out.append((tuple(int(il[a]) for a in p if il[a] != -1),
                    tuple(int(ol[a]) for a in p if ol[a] != -1), p))
    return out


def lang_equal(got, want, tol=1e-4):
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        a, b = got[k], want[k]
        assert (a == b) or abs(a - b) <= tol * max(1.0, abs(b)), (k, a, b)


def grad_of(score_graph, *inputs):
    for g in inputs:
        g.zero_grad()
    gtn.backward(score_graph)
    return [g.grad().weights_to_numpy().astype(np.float64) if g.num_arcs() else np.zeros(0)
            for g in inputs]


# ----------------------------------------------------------------- scores
@SETTINGS
@given(dags(max_nodes=6, max_arcs=10))
def test_forward_score_matches_enumeration_and_central_differences(g):
    w = weights64(g)
    s = gtn.forward_score(g)
    assert math.isclose(s.item(), brute_forward(g), rel_tol=1e-5, abs_tol=1e-5) or \
        s.item() == brute_forward(g)
    (grad,) = grad_of(s, g)
    assert not np.isnan(grad).any()
    num = central_diff(lambda x: brute_forward(g, x), w)
    np.testing.assert_allclose(grad, num, atol=2e-4, rtol=1e-3)


@SETTINGS
@given(dags(max_nodes=6, max_arcs=10))
def test_viterbi_matches_enumeration(g):
    best = brute_viterbi(g)
    v = gtn.viterbi_score(g)
    assert v.item() == pytest.approx(best, rel=1e-5, abs=1e-5) or v.item() == best
    path = gtn.viterbi_path(g)
    if best == -math.inf:
        assert path.num_nodes() == 0
        return
    assert sum(path.weights_to_list()) == pytest.approx(best, rel=1e-5, abs=1e-5)
    (grad,) = grad_of(v, g)
    # the gradient marks one optimal path: its weight is the score
    assert set(np.unique(grad)) <= {0.0, 1.0}
    assert float(grad @ weights64(g)) == pytest.approx(best, rel=1e-5, abs=1e-5)
    # the path's label sequence is accepted by g
    key = (tuple(x for x in path.labels_to_list() if x != -1),
           tuple(x for x in path.labels_to_list(False) if x != -1))
    assert key in language(g)


@settings(max_examples=20, deadline=None)
@given(dags(max_nodes=6, max_arcs=10))
def test_counting_identity(g):
    """With all weights 0 the forward score is log(number of paths)."""
    g.set_weights(np.zeros(g.num_arcs(), np.float32))
    count = len(paths(g))
    want = math.log(count) if count else -math.inf
    assert gtn.forward_score(g).item() == pytest.approx(want, abs=1e-5) or count == 0
    assert gtn.viterbi_score(g).item() == (0.0 if count else -math.inf)


@pytest.mark.parametrize("M,N", [(1, 1), (3, 2), (7, 5), (20, 30)])
def test_linear_graph_counts(M, N):
    g = gtn.linear_graph(M, N)
    assert g.num_nodes() == M + 1 and g.num_arcs() == M * N
    assert gtn.forward_score(g).item() == pytest.approx(M * math.log(N), rel=1e-6)
    assert gtn.viterbi_score(g).item() == 0.0


# ------------------------------------------------------- binary operations
def _pair_lang(t1, w1, t2, w2, key1, key2):
    """Algebraic composition language from path tables (float64)."""
    out = defaultdict(list)
    for a in t1:
        for b in t2:
            if key1(a) == key2(b):
                out[(a[0], b[1])].append(sum(w1[x] for x in a[2]) + sum(w2[x] for x in b[2]))
    return {k: logsumexp(v) for k, v in out.items()}


@SETTINGS
@given(dags(acceptor=True), dags(acceptor=True))
def test_intersect(g1, g2):
    t1, t2 = path_table(g1, None), path_table(g2, None)
    w1, w2 = weights64(g1), weights64(g2)
    want = _pair_lang(t1, w1, t2, w2, lambda p: p[0], lambda p: p[0])
    out = gtn.intersect(g1, g2)
    lang_equal(language(out), want)
    s = gtn.forward_score(out)
    g1g, g2g = grad_of(s, g1, g2)
    f = lambda x, y: logsumexp(list(_pair_lang(t1, x, t2, y, lambda p: p[0], lambda p: p[0]).values()))
    np.testing.assert_allclose(g1g, central_diff(lambda x: f(x, w2), w1), atol=2e-4, rtol=1e-3)
    np.testing.assert_allclose(g2g, central_diff(lambda y: f(w1, y), w2), atol=2e-4, rtol=1e-3)


@SETTINGS
@given(dags(acceptor=False), dags(acceptor=False))
def test_compose(g1, g2):
    t1, t2 = path_table(g1, None), path_table(g2, None)
    w1, w2 = weights64(g1), weights64(g2)
    key1, key2 = (lambda p: p[1]), (lambda p: p[0])
    want = _pair_lang(t1, w1, t2, w2, key1, key2)
    out = gtn.compose(g1, g2)
    lang_equal(language(out), want)
    s = gtn.forward_score(out)
    g1g, g2g = grad_of(s, g1, g2)
    f = lambda x, y: logsumexp(list(_pair_lang(t1, x, t2, y, key1, key2).values()))
    np.testing.assert_allclose(g1g, central_diff(lambda x: f(x, w2), w1), atol=2e-4, rtol=1e-3)
    np.testing.assert_allclose(g2g, central_diff(lambda y: f(w1, y), w2), atol=2e-4, rtol=1e-3)


@SETTINGS
@given(st.lists(dags(max_nodes=4, max_arcs=5), min_size=1, max_size=3))
def test_union(gs):
    out = gtn.union(gs)
    want = defaultdict(list)
    for g in gs:
        for k, v in language(g).items():
            want[k].append(v)
    lang_equal(language(out), {k: logsumexp(v) for k, v in want.items()})
    s = gtn.forward_score(out)
    grads = grad_of(s, *gs)
    ws = [weights64(g) for g in gs]
    for i, g in enumerate(gs):
        def f(x, i=i):
            return logsumexp([brute_forward(h, x if j == i else ws[j]) for j, h in enumerate(gs)])
        np.testing.assert_allclose(grads[i], central_diff(f, ws[i]), atol=2e-4, rtol=1e-3)


@SETTINGS
@given(st.lists(dags(max_nodes=4, max_arcs=5), min_size=1, max_size=3))
def test_concat(gs):
    out = gtn.concat(gs)
    want = {((), ()): 0.0}
    for g in gs:
        nxt = defaultdict(list)
        for (i1, o1), v1 in want.items():
            for (i2, o2), v2 in language(g).items():
                nxt[(i1 + i2, o1 + o2)].append(v1 + v2)
        want = {k: logsumexp(v) for k, v in nxt.items()}
    lang_equal(language(out), want)
    s = gtn.forward_score(out)
    grads = grad_of(s, *gs)
    ws = [weights64(g) for g in gs]
    for i, g in enumerate(gs):
        def f(x, i=i):
            return sum(brute_forward(h, x if j == i else ws[j]) for j, h in enumerate(gs))
        np.testing.assert_allclose(grads[i], central_diff(f, ws[i]), atol=2e-4, rtol=1e-3)


def test_concat_pair_and_empty():
    g1 = gtn.linear_graph(1, 2)
    g2 = gtn.linear_graph(2, 1)
    assert language(gtn.concat(g1, g2)) == language(gtn.concat([g1, g2]))
    e = gtn.concat([])
    assert e.num_nodes() == 1 and language(e) == {((), ()): 0.0}


# -------------------------------------------------------- unary operations
@SETTINGS
@given(dags())
def test_projections_negate_clone(g):
    lang = language(g)
    pi = defaultdict(list)
    po = defaultdict(list)
    for (i, o), v in lang.items():
        pi[(i, i)].append(v)
        po[(o, o)].append(v)
    lang_equal(language(gtn.project_input(g)), {k: logsumexp(v) for k, v in pi.items()})
    lang_equal(language(gtn.project_output(g)), {k: logsumexp(v) for k, v in po.items()})
    c = gtn.clone(g)
    assert gtn.equal(c, g)
    (grad,) = grad_of(gtn.forward_score(c), g)
    (grad2,) = grad_of(gtn.forward_score(g), g)
    np.testing.assert_allclose(grad, grad2, atol=1e-6)


@SETTINGS
@given(dags(max_nodes=5, max_arcs=9, labels=(-1, -1, 0, 1)))
def test_remove_keeps_weighted_language_and_gradient(g):
    out = gtn.remove(g)
    # the only epsilon arcs left carry a weighted empty string: from a companion
    # start node (no other arcs) into an accept node
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(out)
    eps = (il == -1) & (ol == -1)
    assert start[src[eps]].all() and accept[dst[eps]].all()
    assert not np.isin(src[eps], dst).any() and np.bincount(src, minlength=n)[src[eps]].max(initial=1) == 1
    lang_equal(language(out), language(g))
    s = gtn.forward_score(out)
    (grad,) = grad_of(s, g)
    num = central_diff(lambda x: brute_forward(g, x), weights64(g))
    np.testing.assert_allclose(grad, num, atol=2e-4, rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(dags(max_nodes=4, max_arcs=5, labels=(0, 1), acceptor=True), st.integers(1, 4))
def test_closure_against_star(g, K):
    """intersect(closure(g), chain of K steps) == sum over splits of g's strings."""
    if ((), ()) in language(g):
        g = gtn.concat(g, gtn.linear_graph(1, 1))  # closure needs g without the empty string
        g = gtn.Graph.from_arrays(*gtn.graph_arrays(g))
    chain = gtn.linear_graph(K, 2)
    rng = np.random.default_rng(K)
    chain.set_weights(rng.standard_normal(K * 2).astype(np.float32))
    out = gtn.intersect(gtn.closure(g), chain)
    lang = language(g)
    cw = gtn.graph_arrays(chain)[5].astype(np.float64).reshape(K, 2)
    # dynamic programme over lengths
    frontier = {(): 0.0}
    total = defaultdict(list)
    total[()].append(0.0)
    for _ in range(K):
        nxt = defaultdict(list)
        for s_, v in frontier.items():
            for (i, _o), wv in lang.items():
                if len(s_) + len(i) <= K:
                    nxt[s_ + i].append(v + wv)
        frontier = {k: logsumexp(v) for k, v in nxt.items()}
        for k, v in frontier.items():
            total[k].append(v)
    want = {}
    for s_, vs in total.items():
        if len(s_) == K:
            want[(s_, s_)] = logsumexp(vs) + sum(cw[t, c] for t, c in enumerate(s_))
    lang_equal(language(out), want)


@settings(max_examples=30, deadline=None)
@given(dags(max_nodes=6, max_arcs=10), st.randoms(use_true_random=False))
def test_text_round_trip_and_isomorphism(g, rnd):
    buf = io.StringIO()
    gtn.savetxt(g, buf)
    h = gtn.loadtxt(io.StringIO(buf.getvalue()), num_nodes=g.num_nodes())
    assert gtn.equal(g, h)
    # renumbering nodes and shuffling arcs keeps the graph isomorphic, not equal
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(g)
    perm = list(range(n))
    rnd.shuffle(perm)
    perm = np.asarray(perm, np.int64)
    order = list(range(len(src)))
    rnd.shuffle(order)
    order = np.asarray(order, np.int64)
    inv_start = np.zeros(n, bool)
    inv_accept = np.zeros(n, bool)
    inv_start[perm] = start
    inv_accept[perm] = accept
    p = gtn.Graph.from_arrays(n, perm[src][order], perm[dst][order], il[order], ol[order],
                              w[order], inv_start, inv_accept)
    assert gtn.isomorphic(g, p)
    lang_equal(language(p), language(g), tol=1e-12)
    if g.num_arcs():
        q = gtn.clone(p)
        q.set_weights(np.asarray(q.weights_to_list(), np.float32) + np.float32(1.0))
        assert not gtn.isomorphic(g, q)
