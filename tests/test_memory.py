"""Thousands of forward+backward calls leave resident memory flat, and no
framework tensor is kept alive by duoloss after backward."""
import gc
import weakref

import numpy as np
import psutil
import torch

import duoloss.torch as dt
from ctc_reference import random_batch


def _rss_mb():
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def test_no_rss_growth_over_many_calls():
    import jax

    import duoloss.jax as dj

    lp, tg, il, tl = random_batch(np.random.default_rng(0), 60, 8, 12, 10)
    x = torch.tensor(lp, dtype=torch.float32, requires_grad=True)
    tg_t, il_t, tl_t = (torch.from_numpy(a) for a in (tg, il, tl))
    vg = jax.jit(jax.value_and_grad(lambda z: dj.ctc_loss(z, tg, il, tl)))
    z = lp.astype(np.float32)

    def step():
        x.grad = None
        dt.ctc_loss(x, tg_t, il_t, tl_t).backward()
        vg(z)[1].block_until_ready()

    for _ in range(300):  # warm-up: caches, allocator pools
        step()
    before = _rss_mb()
    for _ in range(3000):
        step()
    growth = _rss_mb() - before
    # 3000 calls each allocating ~100 KiB of gradients: a leak would show as >= 300 MiB.
    assert growth < 25, f"resident memory grew by {growth:.1f} MiB over 3000 calls"


def test_inputs_are_released_after_backward():
    lp, tg, il, tl = random_batch(np.random.default_rng(1), 30, 4, 6, 5)
    x = torch.tensor(lp, requires_grad=True)
    logp = x.log_softmax(-1)
    loss = dt.ctc_loss(logp, torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl))
    loss.backward()
    refs = [weakref.ref(t) for t in (x, logp, loss)]
    del x, logp, loss
    gc.collect()
    assert all(r() is None for r in refs)


def _other_losses():
    """(torch step, jax step) running ASG (with/without transitions), graph_loss with
    tied weights and every aligner, forward and backward."""
    import jax

    import duoloss.jax as dj
    from test_graph_loss import ctc_graph

    rng = np.random.default_rng(2)
    t, n, c = 40, 6, 10
    em = rng.standard_normal((t, n, c)).astype(np.float32)
    tr = rng.standard_normal((c, c)).astype(np.float32)
    tg = rng.integers(1, c, (n, 8)).astype(np.int32)
    il = np.full(n, t, np.int32)
    tl = rng.integers(1, 9, n).astype(np.int32)
    graphs = [ctc_graph(list(tg[b, :tl[b]])) for b in range(n)]
    idx = [np.arange(g.num_arcs()) % 3 for g in graphs]
    w = np.zeros(3, np.float32)
    x = torch.tensor(em, requires_grad=True)
    a = torch.tensor(tr, requires_grad=True)
    wt = torch.zeros(3, requires_grad=True)
    tg_t, il_t, tl_t = (torch.from_numpy(v) for v in (tg, il, tl))

    def torch_step():
        x.grad = a.grad = wt.grad = None
        loss = (dt.asg_loss(x, a, tg_t, il_t, tl_t) + dt.asg_loss(x, None, tg_t, il_t, tl_t)
                + dt.graph_loss(x, graphs, il_t, weights=wt, arc_weight_index=idx))
        loss.backward()
        dt.ctc_align(x.detach(), tg_t, il_t, tl_t)
        dt.asg_align(x.detach(), a.detach(), tg_t, il_t, tl_t)
        dt.asg_viterbi(x.detach(), a.detach(), il_t)
        dt.graph_align(x.detach(), graphs, il_t)

    vg = jax.jit(jax.value_and_grad(
        lambda e, m, ww: (dj.asg_loss(e, m, tg, il, tl) + dj.asg_loss(e, None, tg, il, tl)
                          + dj.graph_loss(e, graphs, il, weights=ww, arc_weight_index=idx)),
        argnums=(0, 1, 2)))
    align = jax.jit(lambda e, m: (dj.ctc_align(e, tg, il, tl), dj.asg_align(e, m, tg, il, tl),
                                  dj.asg_viterbi(e, m, il), dj.graph_align(e, graphs, il)))

    def jax_step():
        jax.block_until_ready((vg(em, tr, w), align(em, tr)))

    return torch_step, jax_step


def test_no_rss_growth_every_loss_both_frontends():
    torch_step, jax_step = _other_losses()
    for _ in range(100):  # warm-up
        torch_step()
        jax_step()
    before = _rss_mb()
    for _ in range(1000):
        torch_step()
        jax_step()
    growth = _rss_mb() - before
    # 1000 steps x 14 calls, each allocating >= 10 KiB of outputs: a leak shows as >= 140 MiB.
    assert growth < 25, f"resident memory grew by {growth:.1f} MiB over 1000 steps"


def test_asg_and_graph_inputs_are_released_after_backward():
    from test_graph_loss import ctc_graph

    rng = np.random.default_rng(3)
    t, n, c = 12, 3, 5
    em = torch.tensor(rng.standard_normal((t, n, c)), requires_grad=True)
    tr = torch.zeros(c, c, dtype=torch.float64, requires_grad=True)
    st = torch.zeros(c, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[1, 2], [3, 3], [4, 0]])
    il, tl = torch.tensor([12, 10, 8]), torch.tensor([2, 2, 1])
    graphs = [ctc_graph([1, 2]), ctc_graph([3, 3]), ctc_graph([4])]
    idx = [np.arange(g.num_arcs()) % 2 for g in graphs]
    h = em * 1.0
    loss = (dt.asg_loss(h, tr, tg, il, tl, start_transitions=st)
            + dt.graph_loss(h, graphs, il, weights=w, arc_weight_index=idx, normalize=True))
    loss.backward()
    assert em.grad is not None and tr.grad is not None and w.grad is not None
    refs = [weakref.ref(v) for v in (em, tr, st, w, h, loss)]
    del em, tr, st, w, h, loss
    gc.collect()
    assert all(r() is None for r in refs), [r() is None for r in refs]
