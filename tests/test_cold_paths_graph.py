"""The cold-compile restructuring of the WFST graph loss (issue 19 point 3) keeps every bit.

The exact log-space fallback (``_graph_log``) runs after the batch in its own
kernel (``_graph_log_batch``) for the sequences ``_graph_one`` marks pending:
forced here (scores x300, heavy epsilon arcs) and checked against brute force,
central differences and the independent CTC log-space reference; the batch
kernels process exactly the sequences listed in ``order``.
"""
import numpy as np
import pytest

from ctc_reference import check_extreme_scores
from duoloss.core import _pool
from duoloss.core import _numerics
from duoloss.core.losses import graph_loss as gl
from duoloss.graphs import ctc_graph
from test_graph_loss import brute_graph_score, random_graph


@pytest.fixture
def pending_spy(monkeypatch):
    """The sequences the fallback kernel is given (all calls)."""
    seen = []
    orig = gl._graph_log_batch

    def spy(order, *args):
        seen.extend(int(b) for b in order if args[-1][b])
        return orig(order, *args)

    monkeypatch.setattr(gl, "_graph_log_batch", spy)
    return seen


def test_ctc_graphs_fallback_matches_log_space_reference(pending_spy):
    def run(em, target):
        il = np.array([em.shape[0]])
        packed = gl.check_graph_args("graph_loss", em, [ctc_graph(target)], il, None, None)
        losses, (ge, _) = gl.graph_loss_and_grad(em, packed, il)
        return losses[0], ge[:, 0]

    assert check_extreme_scores(run, seed=5, cases=60, t_max=20, max_labels=5) > 20
    assert len(pending_spy) > 10


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
@pytest.mark.parametrize("normalize", [False, True])
def test_random_graphs_fallback_matches_brute_force(seed, normalize, pending_spy):
    rng = np.random.default_rng(seed)
    c, k, n = 3, 3, 3
    graphs = [random_graph(rng, int(rng.integers(2, 4)), int(rng.integers(3, 7)), c)
              for _ in range(n)]
    em = rng.standard_normal((4, n, c)) * 300.0
    il = np.array([4, 3, 4])
    theta = rng.standard_normal(k)
    idx = [rng.integers(-1, k, g.num_arcs()) for g in graphs]
    packed = gl.check_graph_args("graph_loss", em, graphs, il, theta, idx)
    losses, (ge, gw) = gl.graph_loss_and_grad(em, packed, il, weights=theta, normalize=normalize)
    assert pending_spy
    for b in range(n):
        ref = -brute_graph_score(graphs[b], em[:il[b], b], theta, idx[b])
        if normalize:
            ref += np.logaddexp.reduce(em[:il[b], b], axis=1).sum()
        if np.isinf(ref):
            assert losses[b] == np.inf
        else:
            np.testing.assert_allclose(losses[b], ref, rtol=1e-10, atol=1e-9)
    fin = np.isfinite(losses)
    wv = np.where(fin, rng.standard_normal(n), 0.0)

    def total(e, th):
        out = gl.graph_loss_and_grad(e, packed, il, weights=th, normalize=normalize,
                                     want_grad=(False, False))[0]
        return float(wv @ np.where(fin, out, 0.0))

    eps = 1e-5
    for i in range(k):
        d = np.zeros(k)
        d[i] = eps
        num = (total(em, theta + d) - total(em, theta - d)) / (2 * eps)
        got = (wv[:, None] * np.where(fin[:, None], gw, 0.0)).sum(0)[i]
        np.testing.assert_allclose(got, num, atol=1e-6)
    for pos in [(0, 0, 1), (2, 1, 2), (3, 2, 0), (1, 0, 0)]:
        d = np.zeros_like(em)
        d[pos] = eps
        num = (total(em + d, theta) - total(em - d, theta)) / (2 * eps)
        np.testing.assert_allclose(wv[pos[1]] * (ge[pos] if fin[pos[1]] else 0.0), num,
                                   atol=1e-6)


def _big_batch(n=48):
    rng = np.random.default_rng(11)
    graphs = [random_graph(rng, 5, 14, 5) for _ in range(6)]
    for g in graphs[::2]:
        g.add_arc(0, 4, -1, None, 40.0)  # a heavy epsilon arc: linear space gives up
    em = rng.standard_normal((60, n, 5)) * rng.choice([1.0, 300.0], (1, n, 1))
    il = rng.integers(0, 61, n)
    theta = rng.standard_normal(4)
    idx = [rng.integers(-1, 4, g.num_arcs()) for g in graphs]
    return em, gl.pack_graphs(graphs, idx), il, theta  # sequence b uses graph b % 6


@pytest.mark.parametrize("normalize", [False, True])
def test_parallel_with_fallbacks_equals_serial(normalize, monkeypatch, pending_spy):
    monkeypatch.setattr(_pool, "num_threads", lambda: 3)  # threads on any machine
    em, packed, il, theta = _big_batch()
    for dtype in (np.float64, np.float32):
        kw = {"weights": theta, "normalize": normalize}
        par = gl.graph_loss_and_grad(em.astype(dtype), packed, il, **kw)
        monkeypatch.setattr(gl, "_PARALLEL_MIN_CELLS", 1 << 62)
        ser = gl.graph_loss_and_grad(em.astype(dtype), packed, il, **kw)
        monkeypatch.setattr(gl, "_PARALLEL_MIN_CELLS", 40_000)
        assert par[0].tobytes() == ser[0].tobytes()
        for a, b in zip(par[1], ser[1]):
            assert a.tobytes() == b.tobytes()
    assert len(set(pending_spy)) > 5


@pytest.mark.parametrize("kernel", ["_graph_batch_serial"])
def test_batch_kernels_process_exactly_the_listed_sequences(kernel):
    em, packed, il, theta = _big_batch(8)
    full_l, (full_e, full_w) = gl.graph_loss_and_grad(em, packed, il, weights=theta)
    subset = np.array([6, 0, 2, 5], np.int64)
    n = em.shape[1]
    fmax = em.max(axis=2)
    fmax[~np.isfinite(fmax)] = 0.0
    probs = np.exp(em - fmax[:, :, None])
    losses = np.full(n, -7.0)
    g_em = np.full_like(em, -7.0)
    g_w = np.full((n, theta.shape[0]), -7.0)
    pending = np.full(n, 9, np.int8)
    p = [np.ascontiguousarray(x) for x in packed]
    args = (em, probs, fmax, theta, il, p[0], p[1], p[2], p[3], p[4], p[5],
            p[6].astype(np.int8), p[7].astype(np.int8), p[8], False, True, True, False,
            losses, g_em, g_w, pending)
    getattr(gl, kernel)(subset, *args)
    assert pending[subset].any()  # the fallback is exercised
    gl._graph_log_batch(subset, *args)
    others = np.setdiff1d(np.arange(n), subset)
    assert (losses[others] == -7.0).all() and (g_em[:, others] == -7.0).all()
    assert (g_w[others] == -7.0).all() and (pending[others] == 9).all()
    assert losses[subset].tobytes() == full_l[subset].tobytes()
    assert g_em[:, subset].tobytes() == full_e[:, subset].tobytes()
    assert g_w[subset].tobytes() == full_w[subset].tobytes()


def test_warmup_mode_calls_the_fallback_with_no_sequence(monkeypatch, pending_spy):
    em = np.log(np.full((5, 2, 4), 0.25))
    il = np.array([5, 4])
    packed = gl.check_graph_args("graph_loss", em, ctc_graph([[1, 2], [3]]), il, None, None)
    gl.graph_loss_and_grad(em, packed, il)
    assert pending_spy == []
    calls = []
    orig = gl._graph_log_batch
    monkeypatch.setattr(gl, "_graph_log_batch",
                        lambda order, *a: calls.append(order) or orig(order, *a))
    monkeypatch.setattr(_numerics, "_compile_both", True)
    gl.graph_loss_and_grad(em, packed, il)
    assert len(calls) == 1 and calls[0].shape == (0,) and calls[0].dtype == np.int64
