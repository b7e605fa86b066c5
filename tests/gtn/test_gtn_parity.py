"""GTN drop-in behaviour (issue #12 item 1) and the deliberate differences.

Expected values come from GTN's documented behaviour (``bindings/python/*.cpp``,
``gtn/utils.cpp``: binary layout, argument order, ``equal`` semantics, autograd
release rule), from analytic scores, and from brute-force path enumeration.
"""
from __future__ import annotations

import io
import math
import struct

import numpy as np
import pytest
from hypothesis import given

import duoloss.gtn as gtn

from ._reference import brute_forward, language, logsumexp
from .test_properties import SETTINGS, _pair_lang, central_diff, dags, grad_of, lang_equal, \
    path_table, weights64


def two_nodes(calc_grad=True):
    g = gtn.Graph(calc_grad)
    g.add_node(True)
    g.add_node(False, True)
    return g


# ------------------------------------------------------------------ add_arc
def test_add_arc_label_keyword_makes_an_acceptor_arc():
    g = two_nodes()
    assert g.add_arc(src_node=0, dst_node=1, label=4) == 0
    g.add_arc(0, 1, ilabel=1, olabel=2, weight=2.5)
    assert g.labels_to_list() == [4, 1] and g.labels_to_list(False) == [4, 2]
    assert g.weights_to_list() == [0.0, 2.5]
    with pytest.raises(TypeError, match="Graph.add_arc: label= makes an acceptor arc"):
        g.add_arc(0, 1, 3, label=4)
    with pytest.raises(TypeError, match="Graph.add_arc: label= makes an acceptor arc"):
        g.add_arc(0, 1, label=4, weight=1.0)
    with pytest.raises(TypeError, match="Graph.add_arc: missing the label"):
        g.add_arc(0, 1)
    assert g.num_arcs() == 2


def test_graph_is_truthy_even_without_arcs():
    # GTN's test helper does ``assert graph`` on a loaded graph with no arcs
    assert gtn.Graph() and two_nodes()


# --------------------------------------------------------- text and binary I/O
def test_savetxt_takes_gtns_argument_order_and_the_reverse(tmp_path):
    g = two_nodes()
    g.add_arc(0, 1, 2, 3, 1.5)
    want = "0\n1\n0 1 2 3 1.5\n"
    p = tmp_path / "a.txt"
    gtn.savetxt(str(p), g)                     # GTN: savetxt(file_name, graph)
    assert p.read_text() == want
    gtn.savetxt(g, str(tmp_path / "b.txt"))    # earlier duoloss order
    assert (tmp_path / "b.txt").read_text() == want
    gtn.savetxt(file_name=str(tmp_path / "c.txt"), graph=g)
    assert (tmp_path / "c.txt").read_text() == want
    buf = io.StringIO()
    gtn.savetxt(buf, g)
    assert buf.getvalue() == want
    with pytest.raises(TypeError, match="savetxt: graph must be a Graph, got str"):
        gtn.savetxt("x.txt", "y.txt")
    with pytest.raises(TypeError, match="savetxt: file_name must be a path or a file object, got int"):
        gtn.savetxt(3, g)


def test_loadtxt_follows_gtns_line_rules():
    # fewer than two lines (GTN: "Must specify accept node(s).")
    for text in ("", "\n", "1", "1\n"):
        with pytest.raises(ValueError, match="loadtxt: expected a start-node line and an accept-node line"):
            gtn.loadtxt(io.StringIO(text))
    with pytest.raises(ValueError, match="loadtxt: repeated start node id"):
        gtn.loadtxt(io.StringIO("1 0 0\n0 1\n"))
    with pytest.raises(ValueError, match="loadtxt: repeated accept node id"):
        gtn.loadtxt(io.StringIO("0\n1 1\n"))
    # two empty lines (what savetxt writes for a graph without start/accept nodes)
    g = gtn.loadtxt(io.StringIO("\n\n"))
    assert (g.num_nodes(), g.num_arcs()) == (0, 0)
    g = gtn.loadtxt(io.StringIO("0\n1"))   # no final newline
    assert (g.num_nodes(), g.num_start(), g.num_accept()) == (2, 1, 1)


def _gtn_bytes(n, starts, accepts, arcs, weights):
    """GTN's binary layout (gtn/utils.cpp ``save``), written independently."""
    out = struct.pack("<4i", n, len(arcs), len(starts), len(accepts))
    out += struct.pack(f"<{len(starts)}i", *starts) + struct.pack(f"<{len(accepts)}i", *accepts)
    for a in arcs:
        out += struct.pack("<4i", *a)
    return out + struct.pack(f"<{len(weights)}f", *weights)


def test_save_writes_gtns_binary_layout_and_load_reads_it(tmp_path):
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 2, 0, 1, 1.25)
    g.add_arc(1, 2, 2, gtn.epsilon, -0.5)
    g.add_arc(2, 3, 3)
    want = _gtn_bytes(4, [0, 1], [3], [(0, 2, 0, 1), (1, 2, 2, -1), (2, 3, 3, 3)],
                      [1.25, -0.5, 0.0])
    p = tmp_path / "g.bin"
    gtn.save(str(p), g)
    assert p.read_bytes() == want
    buf = io.BytesIO()
    gtn.save(buf, g)
    assert buf.getvalue() == want
    h = gtn.load(str(p))
    assert gtn.equal(g, h) and h.calc_grad
    assert gtn.equal(gtn.load(io.BytesIO(want), calc_grad=False), g)
    empty = tmp_path / "e.bin"
    gtn.save(str(empty), gtn.Graph())
    assert empty.read_bytes() == struct.pack("<4i", 0, 0, 0, 0)
    assert gtn.equal(gtn.load(str(empty)), gtn.Graph())


def test_load_rejects_bad_data():
    good = _gtn_bytes(2, [0], [1], [(0, 1, 5, 5)], [0.5])
    with pytest.raises(ValueError, match="load: expected at least 16 bytes"):
        gtn.load(io.BytesIO(good[:10]))
    with pytest.raises(ValueError, match=r"load: the header .* needs 44 bytes, got 43"):
        gtn.load(io.BytesIO(good[:-1]))
    with pytest.raises(ValueError, match="load: Graph.from_arrays: dst must lie in"):
        gtn.load(io.BytesIO(_gtn_bytes(2, [0], [1], [(0, 7, 5, 5)], [0.5])))
    with pytest.raises(ValueError, match="load: negative count"):
        gtn.load(io.BytesIO(struct.pack("<4i", -1, 0, 0, 0)))
    with pytest.raises(TypeError, match="load: file_name must be opened in binary mode"):
        gtn.load(io.StringIO("abc"))


# ---------------------------------------------------------------- creations
def test_scalar_graph_is_labelled_epsilon_and_score_graphs_zero():
    s = gtn.scalar_graph(1.5)
    assert s.labels_to_list() == [gtn.epsilon] and s.labels_to_list(False) == [gtn.epsilon]
    assert s.item() == 1.5 and s.num_nodes() == 2
    assert not gtn.scalar_graph(0.0, False).calc_grad
    # results of scalar operations are labelled 0:0 (GTN's negate/add/forwardScore)
    for r in (gtn.negate(s), gtn.add(s, s), gtn.subtract(s, s), gtn.forward_score(s)):
        assert r.labels_to_list() == [0] and r.labels_to_list(False) == [0]


# ---------------------------------------------------------------- autograd
def test_second_backward_without_retain_graph_raises():
    a, b = gtn.scalar_graph(3.0), gtn.scalar_graph(4.0)
    r = gtn.add(a, b)
    gtn.backward(r)
    assert a.grad().item() == 1.0
    with pytest.raises(ValueError, match="backward: cannot backward twice without retaining the graph"):
        gtn.backward(r)
    assert a.grad().item() == 1.0          # nothing accumulated by the failed call
    # retained: any number of times, accumulating
    a.zero_grad()
    b.zero_grad()
    r = gtn.add(a, b)
    gtn.backward(r, True)
    gtn.backward(r, retain_graph=True)
    gtn.backward(r)
    assert a.grad().item() == 3.0 and b.grad().item() == 3.0


def test_backward_through_a_released_intermediate_raises():
    a, b = gtn.scalar_graph(1.0), gtn.scalar_graph(2.0)
    mid = gtn.add(a, b)
    gtn.backward(mid)                        # releases mid's record
    top = gtn.negate(mid)
    with pytest.raises(ValueError, match="an intermediate result's record was released"):
        gtn.backward(top)


def test_backward_list_broadcasts_one_grad_and_one_retain_flag():
    xs = [gtn.scalar_graph(float(k)) for k in range(3)]
    ys = [gtn.scalar_graph(float(k)) for k in range(3)]
    outs = gtn.add(xs, ys)
    gtn.backward(outs, [gtn.scalar_graph(5.0)], [False])
    assert [x.grad().item() for x in xs] == [5.0, 5.0, 5.0]
    assert [y.grad().item() for y in ys] == [5.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="backward: cannot backward twice"):
        gtn.backward(outs[1])
    # per-graph seeds and retain flags; the retained ones can go again
    for g in xs + ys:
        g.zero_grad()
    outs = gtn.add(xs, ys)
    gtn.backward(outs, [gtn.scalar_graph(float(k + 1)) for k in range(3)], [True, False, True])
    assert [x.grad().item() for x in xs] == [1.0, 2.0, 3.0]
    gtn.backward(outs[0])
    with pytest.raises(ValueError, match="backward: cannot backward twice"):
        gtn.backward(outs[1])
    gtn.backward([outs[2]], [True])          # a list of flags alone: retain_graphs
    assert xs[0].grad().item() == 2.0 and xs[2].grad().item() == 4.0   # seed 1 added to 3
    with pytest.raises(ValueError, match=r"backward: grads must have 1 or 3 entries .*got 2"):
        gtn.backward(outs, [gtn.scalar_graph(1.0)] * 2)
    with pytest.raises(TypeError, match=r"backward: graphs\[1\] must be a Graph, got int"):
        gtn.backward([outs[0], 3])


# ------------------------------------------------------------------ equal
def test_equal_ignores_arc_order_but_not_numbering_or_weights():
    def build(order, w=3.1, flip=False):
        g = gtn.Graph()
        g.add_node(True)
        g.add_node()
        g.add_node(False, True)
        arcs = [(0, 1, 0, 0, 2.1), (0, 1, 1, 1, w), (1, 1, 1, 1, 4.1), (1, 2, 2, 2, 5.1)]
        for k in order:
            s, d, i, o, wt = arcs[k]
            g.add_arc(s, d, i, o if not flip else o + 1, wt)
        return g

    base = build([0, 1, 2, 3])
    assert gtn.equal(base, build([3, 1, 0, 2]))
    assert not gtn.equal(base, build([0, 1, 2, 3], w=3.2))
    assert not gtn.equal(base, build([0, 1, 2, 3], flip=True))
    assert not gtn.equal(base, build([0, 1, 2]))
    # repeated arcs count: {a, a, b} != {a, b, b}
    g1, g2 = two_nodes(), two_nodes()
    for lab in (0, 0, 1):
        g1.add_arc(0, 1, lab)
    for lab in (0, 1, 1):
        g2.add_arc(0, 1, lab)
    assert not gtn.equal(g1, g2)
    # same arcs on renumbered nodes: isomorphic, not equal
    h = gtn.Graph()
    h.add_node(False, True)
    h.add_node(True)
    h.add_arc(1, 0, 0)
    k = two_nodes()
    k.add_arc(0, 1, 0)
    assert gtn.isomorphic(h, k) and not gtn.equal(h, k)
    # -0.0 == 0.0 (float comparison, as GTN); NaN equals NaN (a graph equals itself)
    z1, z2 = two_nodes(), two_nodes()
    z1.add_arc(0, 1, 0, 0, 0.0)
    z2.add_arc(0, 1, 0, 0, -0.0)
    assert gtn.equal(z1, z2)
    z1.set_weights([math.nan])
    assert gtn.equal(z1, z1) and not gtn.equal(z1, z2)


# ------------------------------------------------- one-sided epsilon compose
def test_one_sided_epsilons_compose_to_one_state_per_node_pair():
    # epsilon outputs on the first side only: no filter states, so the result
    # has the structure GTN's test expects (a self-loop stays a self-loop)
    g1 = two_nodes()
    g1.add_arc(0, 0, 0, gtn.epsilon, 1.0)
    g1.add_arc(0, 1, 1, 2)
    g2 = two_nodes()
    g2.add_arc(0, 1, 2, 3)
    want = two_nodes()
    want.add_arc(0, 0, 0, gtn.epsilon, 1.0)
    want.add_arc(0, 1, 1, 3)
    assert gtn.equal(gtn.compose(g1, g2), want)
    # epsilon inputs on the second side only
    g1 = two_nodes()
    g1.add_arc(0, 1, 1, 2)
    g2 = two_nodes()
    g2.add_arc(0, 1, 2, 3)
    g2.add_arc(1, 1, gtn.epsilon, 0, 2.0)
    want = two_nodes()
    want.add_arc(0, 1, 1, 3)
    want.add_arc(1, 1, gtn.epsilon, 0, 2.0)
    assert gtn.equal(gtn.compose(g1, g2), want)


@SETTINGS
@given(dags(acceptor=False), dags(acceptor=False, labels=(0, 1, 2)))
def test_compose_with_epsilons_on_one_side_matches_enumeration(g1, g2):
    for a, b in ((g1, g2), (g2, g1)):
        t1, t2 = path_table(a, None), path_table(b, None)
        w1, w2 = weights64(a), weights64(b)
        key1, key2 = (lambda p: p[1]), (lambda p: p[0])
        out = gtn.compose(a, b)
        lang_equal(language(out), _pair_lang(t1, w1, t2, w2, key1, key2))
        s = gtn.forward_score(out)
        ga, gb = grad_of(s, a, b)
        if s.item() == -math.inf:   # no pair of paths: nothing to differentiate
            continue
        f = lambda x, y: logsumexp(list(_pair_lang(t1, x, t2, y, key1, key2).values()))  # noqa: E731
        np.testing.assert_allclose(ga, central_diff(lambda x: f(x, w2), w1), atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(gb, central_diff(lambda y: f(w1, y), w2), atol=2e-4, rtol=1e-3)


# ---------------------------------------- deliberate differences from GTN
def test_difference_neg_inf_weights_give_zero_not_nan_gradients():
    """GTN: NaN gradients for two parallel -inf arcs; duoloss: the posterior, 0."""
    g = two_nodes()
    g.add_arc(0, 1, 0, 0, -math.inf)
    g.add_arc(0, 1, 1, 1, -math.inf)
    s = gtn.forward_score(g)
    gtn.backward(s)
    assert s.item() == -math.inf
    assert g.grad().weights_to_list() == [0.0, 0.0]


def test_difference_unreachable_source_node_does_not_raise():
    """GTN raises "Graph has a cycle, self-loop or is disconnected!" when a
    non-start node without in-arcs leads to an accept node; duoloss scores the
    one start-to-accept path."""
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 2, 0, 0, 0.75)
    g.add_arc(1, 2, 0, 0, 5.0)   # on no path: node 1 is not a start node
    s = gtn.forward_score(g)
    assert s.item() == pytest.approx(brute_forward(g)) == pytest.approx(0.75)
    gtn.backward(s)
    assert g.grad().weights_to_list() == [1.0, 0.0]
    assert gtn.viterbi_score(g).item() == pytest.approx(0.75)


def test_difference_remove_keeps_epsilon_weights_and_their_gradient():
    """GTN's remove marks nodes 1 and 2 accepting and drops the epsilon weights
    (and has no gradient); duoloss keeps them on copies of the arcs into a new
    accept node, so the weighted language and its gradient are exact."""
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0)
    g.add_arc(0, 2, 1)
    g.add_arc(1, 3, gtn.epsilon, gtn.epsilon, 0.5)
    g.add_arc(2, 3, gtn.epsilon, gtn.epsilon, 0.25)
    r = gtn.remove(g)
    assert language(r) == pytest.approx({((0,), (0,)): 0.5, ((1,), (1,)): 0.25})
    s = gtn.forward_score(r)
    assert s.item() == pytest.approx(np.logaddexp(0.5, 0.25))
    gtn.backward(s)
    p = np.exp(np.array([0.5, 0.25]) - np.logaddexp(0.5, 0.25))
    np.testing.assert_allclose(g.grad().weights_to_list(), [p[0], p[1], p[0], p[1]], rtol=1e-6)


def test_remove_turns_zero_weight_epsilon_sinks_into_accept_nodes():
    """With epsilon weights 0 the result is GTN's (nodes 1 and 2 accept), and the
    epsilon arcs still get their posterior (1/2 each) as gradient."""
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0)
    g.add_arc(0, 2, 1)
    g.add_arc(1, 3, gtn.epsilon)
    g.add_arc(2, 3, gtn.epsilon)
    want = gtn.Graph()
    want.add_node(True)
    want.add_node(False, True)
    want.add_node(False, True)
    want.add_arc(0, 1, 0)
    want.add_arc(0, 2, 1)
    r = gtn.remove(g)
    assert gtn.equal(r, want)
    s = gtn.forward_score(r)
    assert s.item() == pytest.approx(math.log(2))
    gtn.backward(s)
    np.testing.assert_allclose(g.grad().weights_to_list(), [0.5, 0.5, 0.5, 0.5], rtol=1e-6)


@SETTINGS
@given(dags(max_nodes=5, max_arcs=9, labels=(-1, -1, 0, 1)))
def test_remove_with_zero_weight_epsilons_matches_enumeration(g):
    n, src, dst, il, ol, w, st, ac = gtn.graph_arrays(g)
    g = gtn.Graph.from_arrays(n, src, dst, il, ol, np.where(il == -1, 0.0, w), st, ac)
    out = gtn.remove(g)
    lang_equal(language(out), language(g))
    s = gtn.forward_score(out)
    (grad,) = grad_of(s, g)
    num = central_diff(lambda x: brute_forward(g, x), weights64(g))
    np.testing.assert_allclose(grad, num, atol=2e-4, rtol=1e-3)


def test_difference_both_sided_epsilons_keep_exactly_one_path_per_pair():
    """a:eps b:eps composed with eps:c eps:d has one pair of paths, so exactly one
    output path (score log 1 = 0 with zero weights): without the filter there
    would be 6 interleavings (log 6); GTN's build can also drop paths here."""
    g1 = gtn.Graph()
    for k in range(3):
        g1.add_node(k == 0, k == 2)
    g1.add_arc(0, 1, 0, gtn.epsilon)
    g1.add_arc(1, 2, 1, gtn.epsilon)
    g2 = gtn.Graph()
    for k in range(3):
        g2.add_node(k == 0, k == 2)
    g2.add_arc(0, 1, gtn.epsilon, 2)
    g2.add_arc(1, 2, gtn.epsilon, 3)
    out = gtn.compose(g1, g2)
    assert language(out) == {((0, 1), (2, 3)): 0.0}
    assert gtn.forward_score(out).item() == 0.0
