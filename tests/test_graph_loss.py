"""graph_loss / GraphLoss vs ctc_loss, GTN's all-alignments values and brute-force path sums."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads

import duoloss.jax as dj
import duoloss.torch as dt
from duoloss.graphs import ctc_graph  # noqa: F401  (other test files import it from here)
from duoloss.gtn import Graph
from test_asg_reference import grad_tolerance_ok, load_family, logsumexp

ALL = load_family("all_alignments")


def all_alignments_graph(target):
    """GTN pytorch_loss.py target graph (README §3.4)."""
    g = Graph(calc_grad=False)
    g.add_node(start=True, accept=len(target) == 0)
    for i, k in enumerate(target):
        g.add_node(accept=i == len(target) - 1)
        g.add_arc(i, i + 1, k)
        g.add_arc(i + 1, i + 1, k)
    return g


def random_graph(rng, n_nodes, n_arcs, n_cls):
    """Random cyclic acceptor (self-loops, cycles, parallel arcs, dead ends)."""
    g = Graph(calc_grad=False)
    for i in range(n_nodes):
        g.add_node(start=i == 0 or rng.random() < 0.2, accept=i == n_nodes - 1 or
                   rng.random() < 0.2)
    for _ in range(n_arcs):
        g.add_arc(int(rng.integers(n_nodes)), int(rng.integers(n_nodes)),
                  int(rng.integers(n_cls)), None, float(np.float32(rng.standard_normal())))
    return g


def brute_graph_score(g, em, theta=None, idx=None):
    """log-sum over all arc sequences of length T from a start to an accept node."""
    n_arcs = g.num_arcs()
    arcs = [(int(s), int(d), int(k), float(w)) for s, d, k, w in
            zip(*(np.asarray(x) for x in _arc_lists(g)))]
    starts, accepts = set(g.start()), set(g.accept())
    T = em.shape[0]
    if T == 0:
        return np.log(len(starts & accepts)) if starts & accepts else -np.inf
    scores = []
    for seq in itertools.product(range(n_arcs), repeat=T):
        if arcs[seq[0]][0] not in starts or arcs[seq[-1]][1] not in accepts:
            continue
        if any(arcs[seq[i]][1] != arcs[seq[i + 1]][0] for i in range(T - 1)):
            continue
        w = 0.0
        for t, a in enumerate(seq):
            w += arcs[a][3] + em[t, arcs[a][2]]
            if idx is not None and idx[a] >= 0:
                w += theta[idx[a]]
        scores.append(w)
    return logsumexp(scores)


def _arc_lists(g):
    from duoloss.gtn import graph_arrays
    _, src, dst, ilab, _, w, _, _ = graph_arrays(g)
    return src, dst, ilab, w


def _ctc_batch(rng, dtype=np.float64):
    t_max, n, c = 12, 4, 5
    x = rng.standard_normal((t_max, n, c))
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(dtype)
    tg = np.array([[1, 2, 2, 3], [4, 4, 0, 0], [1, 0, 0, 0], [2, 3, 1, 0]])
    il = np.array([12, 9, 5, 3])
    tl = np.array([4, 2, 0, 3])  # with an empty target; sequence 3 has T = L = 3
    return lp, tg, il, tl


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ctc_graphs_equal_ctc_loss_torch(reduction, dtype):
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(0), dtype)
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    a = torch.tensor(lp, requires_grad=True)
    b = torch.tensor(lp, requires_grad=True)
    out_g = dt.graph_loss(a, graphs, torch.tensor(il), target_lengths=torch.tensor(tl),
                          reduction=reduction)
    out_c = dt.ctc_loss(b, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                        reduction=reduction)
    rtol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(out_g.detach().numpy(), out_c.detach().numpy(), rtol=rtol)
    out_g.sum().backward()
    out_c.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=1e-7)


def test_ctc_graphs_equal_ctc_loss_jax_and_infeasible():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(1), np.float32)
    il = np.array([12, 9, 5, 2])  # sequence 3 now infeasible
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    f_g = lambda x: dj.graph_loss(x, graphs, il, reduction="none")  # noqa: E731
    f_c = lambda x: dj.ctc_loss(x, tg, il, tl, reduction="none")  # noqa: E731
    lg, lc = f_g(lp), f_c(lp)
    np.testing.assert_allclose(np.asarray(lg), np.asarray(lc), rtol=1e-6)
    assert np.isinf(np.asarray(lg)[3])
    g_g = jax.grad(lambda x: f_g(x)[:3].sum())(lp)
    g_c = jax.grad(lambda x: f_c(x)[:3].sum())(lp)
    np.testing.assert_allclose(np.asarray(g_g), np.asarray(g_c), rtol=1e-6, atol=1e-7)
    z = dj.graph_loss(lp, graphs, il, reduction="none", zero_infinity=True)
    assert np.asarray(z)[3] == 0.0


@pytest.mark.skipif(ALL is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
@pytest.mark.parametrize("idx", [0, 3, 4, 5, 7, 10, 12])
def test_all_alignments_graphs_match_gtn(idx):
    """GTN's pytorch_loss.py: forward_score(E) - forward_score(target ∩ E)."""
    case = ALL["cases"][idx]
    b, t, u = case["B"], case["T"], case["U"]
    x = torch.tensor(np.asarray(case["inputs"], np.float32).transpose(1, 0, 2),
                     requires_grad=True)
    graphs = [all_alignments_graph(list(case["targets"][i])) for i in range(b)]
    losses = dt.graph_loss(x, graphs, [t] * b, normalize=True, reduction="none")
    want = np.asarray(case["losses"])
    np.testing.assert_allclose(losses.detach().numpy(), want, rtol=1e-5)
    if u == 0 or u > t:  # GTN: +inf with the normaliser's gradient
        assert np.all(np.isinf(losses.detach().numpy()))
    losses.sum().backward()  # per-sequence gradients (GTN's seed 1 per example)
    ok, worst = grad_tolerance_ok(x.grad.numpy().transpose(1, 0, 2), case["grads"],
                                  np.max(np.abs(case["forward_score_E"])))
    assert ok, worst


@pytest.mark.parametrize("seed", range(6))
def test_random_cyclic_graphs_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    c, k = 3, 3
    graphs = [random_graph(rng, int(rng.integers(1, 4)), int(rng.integers(1, 6)), c)
              for _ in range(2)]
    t_max = 4
    em = rng.standard_normal((t_max, 2, c))
    il = np.array([4, int(rng.integers(0, 5))])
    theta = rng.standard_normal(k)
    idx = [rng.integers(-1, k, g.num_arcs()) for g in graphs]
    losses, (ge, gw) = (None, (None, None))
    from duoloss.core.losses.graph_loss import check_graph_args, graph_loss_and_grad
    packed = check_graph_args("graph_loss", em, graphs, il, theta, idx)
    losses, (ge, gw) = graph_loss_and_grad(em, packed, il, weights=theta)
    for b in range(2):
        ref = -brute_graph_score(graphs[b], em[:il[b], b], theta, idx[b])
        if np.isinf(ref):
            assert losses[b] == np.inf
        else:
            np.testing.assert_allclose(losses[b], ref, rtol=1e-10, atol=1e-12)
    # central differences w.r.t. the tied weights and the emissions
    fin = np.isfinite(losses)
    wv = np.where(fin, np.array([0.6, -1.7]), 0.0)

    def total(e, th):
        out = graph_loss_and_grad(e, packed, il, weights=th, want_grad=(False, False))[0]
        return float(wv @ np.where(fin, out, 0.0))
    eps = 1e-6
    for i in range(k):
        d = np.zeros(k)
        d[i] = eps
        num = (total(em, theta + d) - total(em, theta - d)) / (2 * eps)
        np.testing.assert_allclose((wv[:, None] * np.where(fin[:, None], gw, 0)).sum(0)[i], num,
                                   atol=1e-7)
    for pos in [(0, 0, 1), (2, 1, 2), (3, 0, 0)]:
        d = np.zeros_like(em)
        d[pos] = eps
        num = (total(em + d, theta) - total(em - d, theta)) / (2 * eps)
        np.testing.assert_allclose(wv[pos[1]] * (ge[pos] if fin[pos[1]] else 0), num, atol=1e-7)


def _weighted_setup(rng, dtype=np.float64):
    lp, tg, il, tl = _ctc_batch(rng, dtype)
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    k = 3
    idx = [rng.integers(-1, k, g.num_arcs()) for g in graphs]
    theta = rng.standard_normal(k).astype(dtype)
    return lp, graphs, il, tl, idx, theta


@pytest.mark.parametrize("normalize", [False, True])
def test_torch_gradcheck_and_module(normalize):
    lp, graphs, il, tl, idx, theta = _weighted_setup(np.random.default_rng(2))
    e = torch.tensor(lp, requires_grad=True)
    w = torch.tensor(theta, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda e, w: dt.graph_loss(e, graphs, il.tolist(), weights=w, arc_weight_index=idx,
                                   normalize=normalize, target_lengths=tl), (e, w))
    module = dt.GraphLoss(3, normalize=normalize, dtype=torch.float64)
    with torch.no_grad():
        module.weights.copy_(w)
    torch.testing.assert_close(
        module(e, graphs, il.tolist(), idx, tl),
        dt.graph_loss(e, graphs, il.tolist(), weights=w, arc_weight_index=idx,
                      normalize=normalize, target_lengths=tl))


def test_jax_check_grads_and_agreement_with_torch():
    lp, graphs, il, tl, idx, theta = _weighted_setup(np.random.default_rng(3))
    with jax.enable_x64(True):
        def f(e, w):
            return dj.graph_loss(e, graphs, il, weights=w, arc_weight_index=idx, normalize=True,
                                 reduction="sum")
        args = (jnp.asarray(lp), jnp.asarray(theta))
        check_grads(f, args, order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)
        val, (ge, gw) = jax.value_and_grad(f, argnums=(0, 1))(*args)
    e = torch.tensor(lp, requires_grad=True)
    w = torch.tensor(theta, requires_grad=True)
    out = dt.graph_loss(e, graphs, il, weights=w, arc_weight_index=idx, normalize=True,
                        reduction="sum")
    out.backward()
    np.testing.assert_allclose(float(val), out.item(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ge), e.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), w.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_jax_jit_and_vmap_over_emissions():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(4), np.float32)
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    f = jax.jit(lambda x: dj.graph_loss(x, graphs, il, reduction="none"))
    stacked = jnp.stack([lp, lp * 0.5])
    out = jax.vmap(f)(stacked)
    np.testing.assert_allclose(np.asarray(out[1]), np.asarray(f(lp * 0.5)), rtol=1e-6)
    g = jax.grad(lambda s: jax.vmap(f)(s)[:, :3].sum())(stacked)
    np.testing.assert_allclose(np.asarray(g[0]), np.asarray(jax.grad(lambda x: f(x)[:3].sum())(lp)),
                               rtol=1e-6)


def test_padded_frames_get_zero_gradient():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(5))
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    e = torch.tensor(lp, requires_grad=True)
    dt.graph_loss(e, graphs, il, normalize=True).backward()
    for b in range(4):
        assert torch.all(e.grad[il[b]:, b] == 0) and torch.any(e.grad[:il[b], b] != 0)


def test_validation_messages():
    em = torch.zeros(4, 2, 3)
    good = [ctc_graph([1]), ctc_graph([2])]
    eps = Graph()
    eps.add_node(start=True)
    eps.add_node(accept=True)
    eps.add_arc(0, 1, -1)
    eps.add_arc(1, 0, -1)  # an epsilon cycle
    cases = [
        (dict(graphs=good[:1]), ValueError, "argument 'graphs' must hold N = 2 graphs"),
        (dict(graphs=good[0]), TypeError, "argument 'graphs' must be a list or tuple"),
        (dict(graphs=[good[0], "x"]), TypeError, "must hold duoloss.gtn.Graph objects"),
        (dict(graphs=[good[0], eps]), ValueError, "cycle of epsilon arcs"),
        (dict(graphs=[good[0], ctc_graph([3])]), ValueError, "arc labels in [0, 3)"),
        (dict(input_lengths=[5, 4]), ValueError, "argument 'input_lengths' must be in [0, 4]"),
        (dict(weights=torch.zeros(2)), ValueError, "'arc_weight_index' must be given with"),
        (dict(weights=torch.zeros(2), arc_weight_index=[np.zeros(3, int), np.zeros(3, int)]),
         ValueError, "one index per arc, shape (5,) at graph 0"),
        (dict(weights=torch.zeros(2), arc_weight_index=[np.full(5, 2), np.zeros(5, int)]),
         ValueError, "must be in [-1, 2)"),
        (dict(weights=torch.zeros(2, dtype=torch.float64),
              arc_weight_index=[np.zeros(5, int)] * 2), TypeError, "dtype of 'emissions'"),
        (dict(reduction="avg"), ValueError, "argument 'reduction' must be one of"),
    ]
    for override, exc, msg in cases:
        kw = dict(graphs=good, input_lengths=[4, 3])
        kw.update(override)
        graphs = kw.pop("graphs")
        lengths = kw.pop("input_lengths")
        for fe, conv in ((dt, lambda v: v), (dj, lambda v: jnp.asarray(v.numpy())
                                              if isinstance(v, torch.Tensor) else v)):
            with jax.enable_x64(True):
                args = {k: conv(v) for k, v in kw.items()}
                with pytest.raises(exc) as info:
                    fe.graph_loss(conv(em), graphs, lengths, **args)
            assert str(info.value).startswith("graph_loss: ") and msg in str(info.value), (
                str(info.value))


ASG = load_family("asg")


def _asg_graphs(target, n_cls):
    """GTN's ASG as two target graphs whose arcs index tied weights
    ``theta = [transitions.ravel() (i*C + j), start (C*C + k)]``."""
    full = Graph(calc_grad=False)  # Trans: node 0 = <s>, node j+1 = "last token j"
    full.add_node(start=True)
    for _ in range(n_cls):
        full.add_node(accept=True)
    idx_full = []
    for k in range(n_cls):
        full.add_arc(0, k + 1, k)
        idx_full.append(n_cls * n_cls + k)
    for i in range(n_cls):
        for j in range(n_cls):
            full.add_arc(j + 1, i + 1, i)
            idx_full.append(i * n_cls + j)
    num = Graph(calc_grad=False)  # FAL ∘ Trans: position l, stay or advance
    num.add_node(start=True)
    idx_num = []
    for pos, k in enumerate(target):
        num.add_node(accept=pos == len(target) - 1)
        num.add_arc(pos, pos + 1, k)
        idx_num.append(n_cls * n_cls + k if pos == 0 else k * n_cls + target[pos - 1])
        num.add_arc(pos + 1, pos + 1, k)
        idx_num.append(k * n_cls + k)
    return full, np.array(idx_full), num, np.array(idx_num)


@pytest.mark.skipif(ASG is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
@pytest.mark.parametrize("idx", [0, 4, 7, 13, 15, 21])
def test_tied_weights_reproduce_gtn_asg(idx):
    """ASG = graph_loss(FAL∘Trans) - graph_loss(Trans), both with tied transition weights."""
    case = ASG["cases"][idx]
    c, t_max = case["N"], case["T"]
    em = torch.tensor(np.asarray(case["emissions"], np.float32)[:, None, :].astype(np.float64),
                      requires_grad=True)
    theta = torch.tensor(np.concatenate([np.asarray(case["transitions"], np.float32).ravel(),
                                         np.asarray(case["start"], np.float32)]).astype(np.float64),
                         requires_grad=True)
    full, i_full, num, i_num = _asg_graphs(case["target"], c)
    loss = (dt.graph_loss(em, [num], [t_max], weights=theta, arc_weight_index=[i_num],
                          reduction="sum")
            - dt.graph_loss(em, [full], [t_max], weights=theta, arc_weight_index=[i_full],
                            reduction="sum"))
    np.testing.assert_allclose(loss.item(), case["loss"], rtol=1e-5)
    loss.backward()
    s = max(abs(case["forward_score_norm"]), abs(case["forward_score_target"]))
    g = theta.grad.numpy()
    for got, want in ((em.grad[:, 0].numpy(), case["grad_emissions"]),
                      (g[:c * c].reshape(c, c), case["grad_transitions"]),
                      (g[c * c:], case["grad_start"])):
        ok, worst = grad_tolerance_ok(got, want, s)
        assert ok, worst


def test_packed_graphs_are_jit_arguments_without_retracing():
    rng = np.random.default_rng(11)
    traces = []

    @jax.jit
    def step(e, w, packed):
        traces.append(1)
        return jax.value_and_grad(
            lambda e, w: dj.graph_loss(e, packed, il, weights=w, reduction="sum"),
            argnums=(0, 1))(e, w)

    il = np.array([12, 9, 5, 3])
    for _ in range(2):  # two batches of different graphs, same padded sizes
        lp, tg, _, tl = _ctc_batch(rng, np.float32)
        tg = rng.integers(1, 5, tg.shape)
        graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
        idx = [rng.integers(-1, 3, g.num_arcs()) for g in graphs]
        w = rng.standard_normal(3).astype(np.float32)
        packed = dj.pack_graphs(graphs, idx, num_nodes=64, num_arcs=128)
        val, (ge, gw) = step(lp, w, packed)
        ref = dj.graph_loss(lp, graphs, il, weights=w, arc_weight_index=idx, reduction="sum")
        np.testing.assert_allclose(float(val), float(ref), rtol=1e-6)
        tw = torch.tensor(w, requires_grad=True)
        out = dt.graph_loss(torch.tensor(lp), dt.pack_graphs(graphs, idx), il, weights=tw,
                            reduction="sum")
        out.backward()
        np.testing.assert_allclose(out.item(), float(ref), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gw), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert len(traces) == 1


def test_packed_graphs_validation():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(12), np.float32)
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(4)]
    packed = dj.pack_graphs(graphs)
    bad = packed._replace(label=np.where(np.arange(packed.label.size) == 3, 7, packed.label))
    with pytest.raises(ValueError, match=r"graph_loss: argument 'graphs' must have arc labels in "
                                         r"\[0, 5\) \(C from emissions\), got 7 at graph 0, arc 3"):
        dj.graph_loss(lp, bad, il)
    with pytest.raises(ValueError, match="must hold N = 4 graphs"):
        dt.graph_loss(torch.tensor(lp), dt.pack_graphs(graphs[:3]), il[:3].tolist() + [1])
    with pytest.raises(ValueError, match="'arc_weight_index' must be None when 'graphs' is"):
        dj.graph_loss(lp, packed, il, weights=np.zeros(1, np.float32),
                      arc_weight_index=[np.zeros(g.num_arcs(), int) for g in graphs])
    with pytest.raises(ValueError, match="pack_graphs: argument 'num_arcs' must be an int >="):
        dj.pack_graphs(graphs, num_arcs=3)
    # traced packed values cannot be checked: that sequence is NaN, the others are not
    out = jax.jit(lambda p: dj.graph_loss(lp, p, il, reduction="none"))(bad)
    assert np.isnan(np.asarray(out)[0]) and np.isfinite(np.asarray(out)[1:]).all()


def test_ctc_graphs_with_extreme_scores_match_the_log_space_reference():
    # Scores x300 with some -inf: a frame's rescaled posterior sum can
    # underflow; the kernel must fall back to log space, not divide by zero.
    from ctc_reference import check_extreme_scores
    from duoloss.core.losses.graph_loss import check_graph_args, graph_loss_and_grad

    def run(em, target):
        il = np.array([em.shape[0]])
        packed = check_graph_args("graph_loss", em, [ctc_graph(target)], il, None, None)
        losses, (ge, _) = graph_loss_and_grad(em, packed, il)
        return losses[0], ge[:, 0]

    assert check_extreme_scores(run, seed=3, cases=150, t_max=25, max_labels=6) > 50
