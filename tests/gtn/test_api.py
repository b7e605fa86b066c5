"""GTN's Python API surface: construction, I/O, autograd semantics, validation, threads."""
from __future__ import annotations

import ctypes
import io
import math
import subprocess
import sys
import threading

import numpy as np
import pytest

import duoloss.gtn as gtn
from duoloss.core.graph import compose as KC
from duoloss.core.graph import scores as KS

from ._reference import language


def small():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 1, 0.5)
    g.add_arc(0, 1, 1)
    g.add_arc(1, 2, 2, gtn.epsilon, -1.25)
    return g


def test_graph_basics():
    g = small()
    assert (g.num_nodes(), g.num_arcs(), g.num_start(), g.num_accept()) == (3, 3, 1, 1)
    assert g.labels_to_list() == [0, 1, 2]
    assert g.labels_to_list(False) == [1, 1, -1]
    assert g.weights_to_list() == [0.5, 0.0, -1.25]
    assert g.weights_to_numpy().dtype == np.float32
    assert gtn.epsilon == -1
    assert not g.acceptor()
    assert g.calc_grad and not gtn.Graph(False).calc_grad
    with pytest.raises(ValueError, match="exactly one arc"):
        g.item()
    assert gtn.scalar_graph(2.5).item() == 2.5


def test_set_weights_forms():
    g = gtn.linear_graph(2, 3)
    w = np.arange(6, dtype=np.float32) / 4
    g.set_weights(w.tolist())
    assert g.weights_to_list() == w.tolist()
    g.set_weights(w[::-1].copy())
    assert g.weights_to_list() == w[::-1].tolist()
    buf = (w * 2).astype(np.float32)
    g.set_weights(buf.ctypes.data)  # an integer address, like tensor.data_ptr()
    assert g.weights_to_list() == (w * 2).tolist()
    g.set_weights(w.reshape(2, 3))  # any shape with num_arcs values
    h = gtn.linear_graph(2, 3)
    h.set_weights(g.weights())  # GTN's idiom: copy weights through their address
    assert h.weights_to_list() == g.weights_to_list()
    with pytest.raises(ValueError, match=r"set_weights: expected 6 weights.*got 5"):
        g.set_weights(np.zeros(5))
    with pytest.raises(ValueError, match="address"):
        g.set_weights(0)
    with pytest.raises(TypeError, match="set_weights"):
        g.set_weights(["a"] * 6)


def test_validation_errors():
    g = gtn.Graph()
    g.add_node(True)
    with pytest.raises(ValueError, match=r"add_arc: src_node and dst_node must lie in \[0, 1\), got 0 and 3"):
        g.add_arc(0, 3, 0)
    with pytest.raises(ValueError, match=r"labels must lie in \[-1, 2\*\*63 - 1\]"):
        g.add_arc(0, 0, -2)
    with pytest.raises(TypeError, match="intersect: .*Graph"):
        gtn.intersect(g, 3)
    with pytest.raises(ValueError, match="negate: g must have exactly one arc"):
        gtn.negate(gtn.linear_graph(2, 2))
    with pytest.raises(ValueError, match=r"from_arrays: dst must lie in \[0, 2\)"):
        gtn.Graph.from_arrays(2, [0], [5], [0])
    with pytest.raises(ValueError, match="from_arrays: dst must have 2 entries"):
        gtn.Graph.from_arrays(2, [0, 1], [1], [0, 0])
    with pytest.raises(TypeError, match="from_arrays: ilabel must hold integers"):
        gtn.Graph.from_arrays(2, [0], [1], [0.5])
    with pytest.raises(ValueError, match="linear_graph: M and N must be >= 0"):
        gtn.linear_graph(-1, 2)
    with pytest.raises(ValueError, match="same length"):
        gtn.intersect([g], [g, g])


def test_cycles_raise_only_when_on_a_path():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(False, True)
    g.add_node()
    g.add_arc(0, 1, 0)
    g.add_arc(2, 2, 0)  # a self-loop on an unreachable node is harmless
    assert gtn.forward_score(g).item() == 0.0
    g.add_arc(1, 1, 0)  # a self-loop on a path makes the path set infinite
    for fn in (gtn.forward_score, gtn.viterbi_score, gtn.viterbi_path):
        with pytest.raises(ValueError, match=fn.__name__ + ": the graph has a cycle"):
            fn(g)


def test_text_round_trip(tmp_path):
    g = small()
    path = tmp_path / "g.txt"
    gtn.savetxt(g, str(path))
    h = gtn.loadtxt(str(path))
    assert gtn.equal(g, h)
    # empty start/accept lines (which GTN's own savetxt writes) load fine
    e = gtn.Graph()
    e.add_node()
    e.add_node()
    e.add_arc(0, 1, 3, 4, 1.5)
    buf = io.StringIO()
    gtn.savetxt(e, buf)
    assert buf.getvalue().startswith("\n\n")
    e2 = gtn.loadtxt(io.StringIO(buf.getvalue()))
    assert gtn.equal(e, e2) and e2.num_start() == 0 and e2.num_accept() == 0
    # exact float32 weights survive the round trip
    r = gtn.linear_graph(3, 3)
    r.set_weights(np.random.default_rng(0).standard_normal(9).astype(np.float32))
    buf = io.StringIO()
    gtn.savetxt(r, buf)
    assert gtn.equal(r, gtn.loadtxt(io.StringIO(buf.getvalue())))
    with pytest.raises(ValueError, match="loadtxt: cannot parse line 3"):
        gtn.loadtxt(io.StringIO("0\n1\n0 x 1\n"))
    assert repr(g).startswith("0\n2\n0 1 0 1 0.5\n")


def test_isomorphic_and_equal():
    g = small()
    # renumber nodes 0->2, 1->0, 2->1 and reverse the arc order
    h = gtn.Graph.from_arrays(3, [0, 2, 2], [1, 0, 0], [2, 1, 0], [-1, 1, 1],
                              [-1.25, 0.0, 0.5], [2], [1])
    assert gtn.isomorphic(g, h) and not gtn.equal(g, h)
    h.set_weights([-1.25, 0.0, 0.25])
    assert not gtn.isomorphic(g, h)


def test_rand_equivalent_and_sample():
    g = small()
    r = gtn.remove(gtn.concat(g, gtn.linear_graph(1, 1)))
    c = gtn.concat(g, gtn.linear_graph(1, 1))
    assert gtn.rand_equivalent(c, r, num_samples=30)
    other = gtn.clone(c)
    other.set_weights(np.asarray(other.weights_to_list()) + 0.5)
    assert not gtn.rand_equivalent(c, other, num_samples=30)
    p = gtn.sample(g)
    key = (tuple(x for x in p.labels_to_list() if x != -1),
           tuple(x for x in p.labels_to_list(False) if x != -1))
    assert key in language(g)
    s = gtn.forward_score(p)
    gtn.backward(s)
    grad = g.grad().weights_to_list()  # one of the two parallel first arcs, then arc 2
    assert grad[2] == 1.0 and sorted(grad[:2]) == [0.0, 1.0]


def test_dot_and_draw(tmp_path):
    g = small()
    dot = gtn.to_dot(g, {0: "a", 1: "b", 2: "c"})
    assert dot.startswith("digraph") and "doublecircle" in dot and '"a:1/0.5"' in dot
    out = gtn.draw(g, str(tmp_path / "g.dot"))
    assert open(out).read() == gtn.to_dot(g)


def test_backward_semantics():
    g = gtn.linear_graph(2, 2)
    g.set_weights([0.0, 1.0, 2.0, 3.0])
    s = gtn.forward_score(g)
    with pytest.raises(RuntimeError, match="not calculated"):
        g.grad()
    gtn.backward(s, retain_graph=True)
    first = np.array(g.grad().weights_to_list())
    gtn.backward(s)  # accumulates
    np.testing.assert_allclose(g.grad().weights_to_list(), 2 * first, rtol=1e-6)
    g.zero_grad()
    # the record was released: a second backward raises, as GTN's
    # "[autograd::backward] Cannot Backward twice without retaining the graph."
    with pytest.raises(ValueError, match="backward: cannot backward twice"):
        gtn.backward(s)
    assert not g.is_grad_available()
    # explicit seed gradient
    s2 = gtn.forward_score(g)
    gtn.backward(s2, gtn.scalar_graph(-2.0, False))
    np.testing.assert_allclose(g.grad().weights_to_list(), -2 * first, rtol=1e-6)
    # calc_grad=False inputs get nothing, outputs do not need a gradient
    h = gtn.linear_graph(2, 2, False)
    out = gtn.forward_score(h)
    assert not out.calc_grad
    with pytest.raises(ValueError, match="calc_grad=False"):
        gtn.backward(out)
    # a shared input used twice receives both contributions
    k = gtn.linear_graph(1, 2)
    tot = gtn.add(gtn.forward_score(k), gtn.forward_score(k))
    gtn.backward(tot)
    np.testing.assert_allclose(k.grad().weights_to_list(), [1.0, 1.0], rtol=1e-6)


def test_scalar_ops_and_lists():
    a, b = gtn.scalar_graph(1.5), gtn.scalar_graph(-0.5)
    assert gtn.add(a, b).item() == 1.0 and gtn.subtract(a, b).item() == 2.0
    assert gtn.negate(a).item() == -1.5
    gs = [gtn.linear_graph(t, 2) for t in range(1, 4)]
    scores = gtn.forward_score(gs)
    assert [round(s.item(), 5) for s in scores] == [round(t * math.log(2), 5) for t in range(1, 4)]
    ints = gtn.intersect(gs, gs)
    assert [i.num_arcs() for i in ints] == [2, 4, 6]
    assert [u.num_nodes() for u in gtn.union([gs, gs])] == [9, 9]
    assert len(gtn.remove(gs, [gtn.epsilon])) == 3


def test_parallel_for_runs_on_threads_and_propagates_errors():
    seen = set()
    out = [None] * 16

    def work(i):
        seen.add(threading.get_ident())
        out[i] = gtn.forward_score(gtn.linear_graph(i + 1, 3)).item()

    gtn.parallel_for(work, range(16))
    np.testing.assert_allclose(out, [(i + 1) * math.log(3) for i in range(16)], rtol=1e-6)
    assert threading.get_ident() not in seen

    def boom(i):
        if i == 3:
            raise KeyError("bad item")

    with pytest.raises(KeyError, match="bad item"):
        gtn.parallel_for(boom, range(5))
    with pytest.raises(TypeError, match="parallel_for: function must be callable"):
        gtn.parallel_for(3, range(2))


def test_kernels_release_the_gil():
    from numba.core.registry import CPUDispatcher
    kernels = [(m.__name__, k, v) for m in (KS, KC) for k, v in vars(m).items()
               if isinstance(v, CPUDispatcher) and v.__module__ == m.__name__]
    assert len(kernels) >= 10
    for module, name, fn in kernels:
        assert fn.targetoptions.get("nogil") is True, (module, name)
        assert fn._cache.__class__.__name__ != "NullCache", (module, name)


def test_graph_arrays_interface():
    g = small()
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(g)
    assert n == 3 and src.dtype == np.int64 and w.dtype == np.float32 and start.dtype == bool
    assert not w.flags.writeable
    h = gtn.Graph.from_arrays(n, src, dst, il, ol, w, start, accept, calc_grad=False)
    assert gtn.equal(g, h) and not h.calc_grad
    with pytest.raises(TypeError, match="graph_arrays"):
        gtn.graph_arrays("nope")


def test_core_never_imports_frameworks():
    code = ("import sys, duoloss.gtn, duoloss.core.graph.ops;"
            "bad=[m for m in ('torch','jax') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_nan_free_gradients_with_neg_inf_weights():
    g = gtn.linear_graph(3, 2)
    g.set_weights([0.0, -np.inf, -np.inf, 0.5, 1.0, -np.inf])
    s = gtn.forward_score(g)
    gtn.backward(s)
    grad = np.array(g.grad().weights_to_list())
    assert not np.isnan(grad).any()
    np.testing.assert_allclose(grad, [1, 0, 0, 1, 1, 0])
    # no path at all: -inf score and zero gradient (not NaN)
    g.set_weights([-np.inf] * 6)
    g.zero_grad()
    s = gtn.forward_score(g)
    gtn.backward(s)
    assert s.item() == -np.inf and g.grad().weights_to_list() == [0.0] * 6


def test_compose_hash_mode_matches_dense_mode(monkeypatch):
    """Large products use a hash table for the state index; both paths agree."""
    from duoloss.core.graph import ops as ops

    rng = np.random.default_rng(3)
    g1 = gtn.Graph.from_arrays(6, rng.integers(0, 6, 30), rng.integers(0, 6, 30),
                               rng.integers(-1, 3, 30), rng.integers(-1, 3, 30),
                               rng.standard_normal(30).astype(np.float32), [0, 1], [4, 5])
    g2 = gtn.linear_graph(5, 3)
    g2.set_weights(rng.standard_normal(15).astype(np.float32))
    dense = ops.compose(g1, g2)
    monkeypatch.setattr(ops, "_DENSE_MAX", 0)
    hashed = ops.compose(g1, g2)
    assert gtn.equal(dense, hashed)
    # tiny initial buffers force the grow-and-retry path as well
    monkeypatch.setattr(ops, "_compose_caps", lambda bound, n1, n2, m1, m2: (1, 1))
    assert gtn.equal(dense, ops.compose(g1, g2))


def test_parallel_backward_into_a_shared_graph():
    """Gradients from many threads accumulate into one shared input without loss."""
    shared = gtn.linear_graph(3, 4)
    shared.set_weights(np.random.default_rng(1).standard_normal(12).astype(np.float32))
    chains = [gtn.linear_graph(3, 4, False) for _ in range(24)]
    losses = [None] * 24

    def work(i):
        losses[i] = gtn.forward_score(gtn.intersect(chains[i], shared))
        gtn.backward(losses[i])

    gtn.parallel_for(work, range(24))
    single = gtn.forward_score(gtn.intersect(chains[0], gtn.clone(shared)))
    ref = gtn.linear_graph(3, 4)
    ref.set_weights(shared.weights_to_numpy())
    s = gtn.forward_score(gtn.intersect(chains[0], ref))
    gtn.backward(s)
    np.testing.assert_allclose(shared.grad().weights_to_numpy(),
                               24 * ref.grad().weights_to_numpy(), rtol=1e-5)
    assert single.item() == pytest.approx(s.item())


def test_pooled_results_never_share_live_memory():
    from duoloss.core.graph import ops as ops

    ctc = gtn.linear_graph(200, 30, False)  # big enough for pooled outputs
    e = gtn.linear_graph(200, 30)
    first = gtn.intersect(ctc, e)
    second = gtn.intersect(ctc, e)
    a1 = gtn.graph_arrays(first)
    a2 = gtn.graph_arrays(second)
    assert a1[1].nbytes >= ops._POOL_MIN
    for x, y in zip(a1[1:], a2[1:]):
        assert not np.shares_memory(x, y)
    keep = a1[5]  # a view keeps its buffer alive after the graph is gone
    del first, a1
    third = gtn.intersect(ctc, e)
    assert not np.shares_memory(keep, gtn.graph_arrays(third)[5])
    assert gtn.equal(second, third)


def test_remove_regression_start_node_on_a_longer_path():
    """Start node 2 accepts the empty string through an epsilon arc, and paths from
    start node 1 pass through 2: each path must be counted once."""
    g = gtn.loadtxt(io.StringIO("1 2\n0\n1 2 -1 0 0.0\n2 0 -1 -1 0.0\n"))
    out = gtn.remove(g)
    assert language(out) == pytest.approx(language(g))
    assert language(g) == {((), (0,)): 0.0, ((), ()): 0.0}
