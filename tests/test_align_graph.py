"""graph_align vs ctc_align, GTN's Viterbi paths, and brute-force max over paths."""
from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from test_asg_reference import load_family
from test_graph_loss import _arc_lists, ctc_graph, random_graph

VIT = load_family("viterbi")


def brute_best(g, em, theta=None, idx=None):
    """(best score, set of optimal arc sequences) over paths of exactly T arcs."""
    src, dst, lab, w = (np.asarray(x) for x in _arc_lists(g))
    starts, accepts = set(g.start()), set(g.accept())
    T = em.shape[0]
    best, arg = -np.inf, set()
    for seq in itertools.product(range(len(src)), repeat=T):
        if src[seq[0]] not in starts or dst[seq[-1]] not in accepts:
            continue
        if any(dst[seq[i]] != src[seq[i + 1]] for i in range(T - 1)):
            continue
        v = sum(float(w[a]) + em[t, lab[a]] + (theta[idx[a]] if idx is not None and idx[a] >= 0
                                                else 0.0) for t, a in enumerate(seq))
        if v > best + 1e-12:
            best, arg = v, {seq}
        elif abs(v - best) <= 1e-12:
            arg.add(seq)
    return best, arg


@pytest.mark.parametrize("seed", range(5))
def test_graph_align_brute_force(seed):
    rng = np.random.default_rng(seed)
    graphs = [random_graph(rng, int(rng.integers(1, 4)), int(rng.integers(1, 6)), 3)
              for _ in range(2)]
    em = rng.standard_normal((4, 2, 3))
    if seed % 2:
        em = np.round(em)  # exact ties
    theta = rng.standard_normal(2)
    idx = [rng.integers(-1, 2, g.num_arcs()) for g in graphs]
    il = [4, int(rng.integers(1, 5))]
    labels, scores, arcs = dt.graph_align(torch.tensor(em), graphs, il,
                                          weights=torch.tensor(theta), arc_weight_index=idx)
    for b in range(2):
        best, arg = brute_best(graphs[b], em[:il[b], b], theta, idx[b])
        if best == -np.inf:
            assert scores[b] == -np.inf and torch.all(labels[b] == -1)
            continue
        np.testing.assert_allclose(scores[b].item(), best, rtol=1e-12)
        path = tuple(arcs[b, :il[b]].tolist())
        assert path in arg
        _, _, lab, _ = _arc_lists(graphs[b])
        assert labels[b, :il[b]].tolist() == [int(lab[a]) for a in path]


def test_graph_align_tie_rule_first_arc_wins():
    from duoloss.gtn import Graph
    g = Graph(calc_grad=False)
    g.add_node(start=True)
    g.add_node(accept=True)
    g.add_node(accept=True)
    g.add_arc(0, 2, 1)  # arc 0: to the higher accept node
    g.add_arc(0, 1, 1)  # arc 1: same score into node 1
    g.add_arc(0, 1, 1)  # arc 2: parallel duplicate of arc 1
    _, scores, arcs = dt.graph_align(torch.zeros(1, 1, 2), [g], [1])
    assert arcs[0].tolist() == [1] and scores[0] == 0  # lowest accept node, then first arc


def test_graph_align_equals_ctc_align():
    rng = np.random.default_rng(7)
    lp = rng.standard_normal((15, 3, 6)).astype(np.float32)
    tg = np.array([[1, 2, 2], [3, 4, 0], [5, 5, 5]])
    il, tl = np.array([15, 11, 5]), np.array([3, 2, 3])
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(3)]
    l_g, s_g, _ = dj.graph_align(lp, graphs, il)
    l_c, s_c = dj.ctc_align(lp, tg, il, tl)
    np.testing.assert_allclose(np.asarray(s_g), np.asarray(s_c), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(l_g), np.asarray(l_c))
    lt, st, at = dt.graph_align(torch.tensor(lp), graphs, il)
    np.testing.assert_array_equal(lt.numpy(), np.asarray(l_g))
    assert jax.jit(lambda x: dj.graph_align(x, graphs, il))(lp)[1].shape == (3,)


@pytest.mark.skipif(VIT is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
def test_graph_align_matches_gtn_viterbi_paths():
    for case in VIT["cases"]:
        if case["kind"] != "ctc":
            continue
        logp = np.asarray(case["logp"], np.float32)[:, None, :]
        g = ctc_graph(case["target"], case["blank"])
        labels, scores, _ = dt.graph_align(torch.tensor(logp), [g], [case["T"]])
        np.testing.assert_allclose(scores[0].item(), case["score"], rtol=1e-6)
        if not case["viterbi_tie"] and case["path_labels"]:
            assert labels[0].tolist() == case["path_labels"], case["id"]
