"""Many Python threads calling the losses at once give the sequential results."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ctc_reference import random_batch
from duoloss.core import ctc_loss_and_grad

N_THREADS = 8
CALLS_PER_THREAD = 6


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return random_batch(rng, 120, 12, 15, 20)  # large enough for the parallel kernel


def test_core_threads_match_sequential():
    jobs = [_inputs(s) for s in range(N_THREADS * CALLS_PER_THREAD)]
    sequential = [ctc_loss_and_grad(*job) for job in jobs]
    with ThreadPoolExecutor(N_THREADS) as pool:
        concurrent = list(pool.map(lambda job: ctc_loss_and_grad(*job), jobs))
    for (l1, g1), (l2, g2) in zip(sequential, concurrent):
        np.testing.assert_array_equal(l1, l2)
        np.testing.assert_array_equal(g1, g2)


def test_torch_and_jax_frontends_from_threads():
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    jobs = [_inputs(100 + s) for s in range(2 * N_THREADS)]

    def run_torch(job):
        lp, tg, il, tl = job
        x = torch.tensor(lp, requires_grad=True)
        loss = dt.ctc_loss(x, torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl))
        loss.backward()
        return loss.item(), x.grad.numpy()

    vg = jax.value_and_grad(lambda x, t, i, l: dj.ctc_loss(x, t, i, l))

    def run_jax(job):
        lp, tg, il, tl = job
        v, g = vg(lp.astype(np.float32), tg, il, tl)
        return float(v), np.asarray(g)

    for fn in (run_torch, run_jax):
        sequential = [fn(j) for j in jobs]
        with ThreadPoolExecutor(N_THREADS) as pool:
            concurrent = list(pool.map(fn, jobs))
        for (l1, g1), (l2, g2) in zip(sequential, concurrent):
            assert l1 == l2
            np.testing.assert_array_equal(g1, g2)


@pytest.mark.parametrize("layer", ["workqueue", "omp", None])
def test_threads_whatever_numba_layer_is_requested(layer):
    # numba's workqueue layer aborts the process on concurrent parallel launches and
    # GNU OpenMP is not fork-safe; duoloss's batches run on its own Python threads
    # (duoloss.core._pool) and never start numba's layer, whatever is requested.
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np
        from ctc_reference import random_batch
        from duoloss.core import _pool, ctc_loss_and_grad, threading_layer
        jobs = [random_batch(np.random.default_rng(s), 120, 12, 15, 20) for s in range(24)]
        seq = [ctc_loss_and_grad(*j)[0] for j in jobs]
        with ThreadPoolExecutor(8) as pool:
            conc = list(pool.map(lambda j: ctc_loss_and_grad(*j)[0], jobs))
        assert all(np.array_equal(a, b) for a, b in zip(seq, conc))
        assert _pool._pool is not None  # the batches did run on duoloss's threads
        print(threading_layer())
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    env["NUMBA_NUM_THREADS"] = "2"
    if layer is not None:
        env["NUMBA_THREADING_LAYER"] = layer
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "unknown"


def _asg_job(seed, with_trans):
    rng = np.random.default_rng(seed)
    t, n, c = 120, 12, 15
    em = rng.standard_normal((t, n, c)).astype(np.float32)
    tr = rng.standard_normal((c, c)).astype(np.float32) if with_trans else None
    tl = rng.integers(1, 20, n)
    tg = rng.integers(0, c, (n, 20))
    il = rng.integers(tl.max(), t + 1, n)
    return em, tr, tg, il, tl


def _graph_job(seed):
    from test_graph_loss import ctc_graph

    from duoloss.core import pack_graphs

    rng = np.random.default_rng(seed)
    t, n, c = 100, 10, 12
    em = rng.standard_normal((t, n, c)).astype(np.float32)
    graphs = [ctc_graph(list(rng.integers(1, c, int(rng.integers(1, 15))))) for _ in range(n)]
    il = rng.integers(40, t + 1, n)
    return em, pack_graphs(graphs), il, graphs


def _same(seq, conc):
    for a, b in zip(seq, conc):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_asg_and_graph_core_threads_match_sequential():
    from duoloss.core import asg_loss_and_grad, graph_loss_and_grad

    def asg(job):
        em, tr, tg, il, tl = job
        losses, grads = asg_loss_and_grad(em, tr, tg, il, tl)
        return (losses,) + tuple(g for g in grads if g is not None)

    def graph(job):
        em, packed, il, _ = job
        losses, (ge, _) = graph_loss_and_grad(em, packed, il, normalize=True,
                                              want_grad=(True, False))
        return losses, ge

    for fn, jobs in ((asg, [_asg_job(s, s % 2 == 0) for s in range(N_THREADS * 3)]),
                     (graph, [_graph_job(s) for s in range(N_THREADS * 3)])):
        sequential = [fn(j) for j in jobs]
        with ThreadPoolExecutor(N_THREADS) as pool:
            concurrent = list(pool.map(fn, jobs))
        _same(sequential, concurrent)


def test_asg_and_graph_frontends_from_threads():
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    asg_jobs = [_asg_job(200 + s, True) for s in range(2 * N_THREADS)]
    graph_jobs = [_graph_job(300 + s) for s in range(2 * N_THREADS)]

    def torch_asg(job):
        em, tr, tg, il, tl = job
        x, w = torch.tensor(em, requires_grad=True), torch.tensor(tr, requires_grad=True)
        loss = dt.asg_loss(x, w, torch.from_numpy(tg), torch.from_numpy(il),
                           torch.from_numpy(tl))
        loss.backward()
        return loss.detach().numpy(), x.grad.numpy(), w.grad.numpy()

    asg_vg = jax.value_and_grad(lambda e, w, t, i, l: dj.asg_loss(e, w, t, i, l), argnums=(0, 1))

    def jax_asg(job):
        em, tr, tg, il, tl = job
        v, (ge, gw) = asg_vg(em, tr, tg.astype(np.int32), il.astype(np.int32),
                             tl.astype(np.int32))
        return np.asarray(v), np.asarray(ge), np.asarray(gw)

    def torch_graph(job):
        em, _, il, graphs = job
        x = torch.tensor(em, requires_grad=True)
        loss = dt.graph_loss(x, graphs, torch.from_numpy(il), normalize=True)
        loss.backward()
        return loss.detach().numpy(), x.grad.numpy()

    def jax_graph(job):
        em, _, il, graphs = job
        v, g = jax.value_and_grad(lambda e: dj.graph_loss(e, graphs, il.astype(np.int32),
                                                          normalize=True))(em)
        return np.asarray(v), np.asarray(g)

    for fn, jobs in ((torch_asg, asg_jobs), (jax_asg, asg_jobs), (torch_graph, graph_jobs),
                     (jax_graph, graph_jobs)):
        sequential = [fn(j) for j in jobs]
        with ThreadPoolExecutor(N_THREADS) as pool:
            concurrent = list(pool.map(fn, jobs))
        _same(sequential, concurrent)


def test_gtn_parallel_for_matches_sequential():
    # GTN's idiom: each call builds its graphs, runs ops and backward; parallel_for
    # runs the calls on a thread pool and must give the sequential results.
    from test_graph_loss import ctc_graph

    import duoloss.gtn as gtn

    rng = np.random.default_rng(5)
    t, c = 20, 6
    inputs = [(rng.standard_normal((t, c)).astype(np.float32),
               list(rng.integers(1, c, int(rng.integers(1, 8))))) for _ in range(2 * N_THREADS)]

    def work(i, out):
        em, target = inputs[i]
        e = gtn.linear_graph(t, c, True)
        e.set_weights(em)
        loss = gtn.negate(gtn.forward_score(gtn.intersect(ctc_graph(target), e)))
        gtn.backward(loss)
        out[i] = (loss.item(), e.grad().weights_to_numpy().copy())

    seq, par = [None] * len(inputs), [None] * len(inputs)
    for i in range(len(inputs)):
        work(i, seq)
    gtn.parallel_for(lambda i: work(i, par), range(len(inputs)))
    for (l1, g1), (l2, g2) in zip(seq, par):
        assert l1 == l2
        np.testing.assert_array_equal(g1, g2)
