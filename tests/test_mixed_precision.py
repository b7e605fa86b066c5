"""float16 / bfloat16 inputs and ``torch.autocast`` in both frontends.

References are independent of the half-precision path: ``F.ctc_loss`` in
float64 on the *same* (exactly upcast) values, optax on the float32 upcast,
and for ASG the float64 path (itself checked against GTN fixtures in
test_asg_reference.py).  A half-precision result may only differ from those
by the rounding of the result itself.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import duoloss.jax as dj
import duoloss.torch as dt

T, N, C = 12, 3, 6
TARGETS = np.array([[1, 2, 3, 4], [3, 3, 5, 0], [2, 0, 0, 0]], np.int64)
IL = np.array([12, 10, 7], np.int64)
TL = np.array([4, 3, 1], np.int64)
# Relative rounding of one value (half an ulp, x2 for the gradient's sum of terms).
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
JTOL = {jnp.float16: 2e-3, jnp.bfloat16: 1.6e-2}


def _ints():
    return tuple(torch.from_numpy(a) for a in (TARGETS, IL, TL))


def _logits(seed=0):
    return np.random.default_rng(seed).normal(size=(T, N, C))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_torch_ctc_half_matches_float64_torch_reference(dtype, reduction):
    tg, il, tl = _ints()
    x = torch.from_numpy(_logits()).log_softmax(-1).to(dtype).requires_grad_()
    loss = dt.ctc_loss(x, tg, il, tl, reduction=reduction)
    assert loss.dtype == dtype
    loss.sum().backward()
    assert x.grad.dtype == dtype
    # F.ctc_loss in float64 on the same values (F rejects half on CPU).
    x64 = x.detach().double().requires_grad_()
    ref = F.ctc_loss(x64, tg, il, tl, reduction=reduction)
    ref.sum().backward()
    torch.testing.assert_close(loss.double(), ref, rtol=TOL[dtype], atol=0)
    # torch's gradient is exp(lp) - posterior; ours the true -posterior.
    mask = (torch.arange(T)[:, None] < il[None, :]).double()[..., None]  # (T, N, 1)
    scale = (1.0 / (tl.clamp(min=1) * N) if reduction == "mean"
             else torch.ones(N, dtype=torch.float64))[None, :, None]
    ref_grad = x64.grad - torch.exp(x64.detach()) * mask * scale
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_asg_half_emissions_and_transitions(dtype):
    tg, il, tl = _ints()
    em = torch.from_numpy(_logits(1)).to(dtype).requires_grad_()
    tr = torch.from_numpy(np.random.default_rng(2).normal(size=(C, C)) * 0.1).to(dtype)
    tr.requires_grad_()
    loss = dt.asg_loss(em, tr, tg, il, tl, reduction="none")
    loss.sum().backward()
    assert loss.dtype == em.grad.dtype == tr.grad.dtype == dtype
    em64 = em.detach().double().requires_grad_()
    tr64 = tr.detach().double().requires_grad_()
    ref = dt.asg_loss(em64, tr64, tg, il, tl, reduction="none")
    ref.sum().backward()
    torch.testing.assert_close(loss.double(), ref, rtol=TOL[dtype], atol=0)
    torch.testing.assert_close(em.grad.double(), em64.grad, rtol=0, atol=TOL[dtype])
    torch.testing.assert_close(tr.grad.double(), tr64.grad, rtol=TOL[dtype], atol=TOL[dtype])


def test_torch_graph_loss_and_aligners_accept_bfloat16():
    from test_graph_loss import ctc_graph
    tg, il, tl = _ints()
    x = torch.from_numpy(_logits()).log_softmax(-1).to(torch.bfloat16).requires_grad_()
    graphs = [ctc_graph(list(t[:n])) for t, n in zip(TARGETS, TL)]
    loss = dt.graph_loss(x, graphs, il, reduction="none")
    loss.sum().backward()
    assert loss.dtype == x.grad.dtype == torch.bfloat16
    ref = F.ctc_loss(x.detach().double(), tg, il, tl, reduction="none")
    torch.testing.assert_close(loss.double(), ref, rtol=TOL[torch.bfloat16], atol=0)
    # Aligners: the same labels as on the exactly upcast input, scores rounded.
    for fn, args in ((dt.ctc_align, (tg, il, tl)), (dt.asg_align, (None, tg, il, tl)),
                     (dt.asg_viterbi, (None, il))):
        labels, scores = fn(x.detach(), *args)
        labels64, scores64 = fn(x.detach().double(), *args)
        assert scores.dtype == torch.bfloat16
        torch.testing.assert_close(labels, labels64, rtol=0, atol=0)
        torch.testing.assert_close(scores.double(), scores64, rtol=TOL[torch.bfloat16], atol=0)


def test_torch_autocast_behaves_like_F_ctc_loss():
    # F.ctc_loss is on autocast's float32 list: bfloat16 inputs are upcast and
    # the loss is float32.  Same model, same autocast, both losses.
    torch.manual_seed(0)
    tg, il, tl = _ints()
    lin = torch.nn.Linear(8, C)
    feats = torch.randn(T, N, 8)
    grads = {}
    losses = {}
    for name, loss_fn in (("F", F.ctc_loss), ("duoloss", dt.ctc_loss)):
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(feats)
            assert h.dtype == torch.bfloat16
            lp = h.log_softmax(-1).to(torch.bfloat16)  # bfloat16 log_probs
            loss = loss_fn(lp, tg, il, tl)
        loss.backward()
        losses[name], grads[name] = loss, lin.weight.grad.clone()
    assert losses["duoloss"].dtype == losses["F"].dtype == torch.float32
    torch.testing.assert_close(losses["duoloss"], losses["F"], rtol=1e-5, atol=0)
    torch.testing.assert_close(grads["duoloss"], grads["F"], rtol=1e-2, atol=1e-3)


def test_torch_autocast_keeps_float64_and_float32():
    tg, il, tl = _ints()
    for dtype in (torch.float32, torch.float64):
        x = torch.from_numpy(_logits()).log_softmax(-1).to(dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = dt.ctc_loss(x, tg, il, tl)
        assert loss.dtype == dtype
        torch.testing.assert_close(loss, dt.ctc_loss(x, tg, il, tl), rtol=0, atol=0)


def test_torch_half_same_on_every_path():
    # eager, torch.func.grad and torch.compile give the same bfloat16 results
    tg, il, tl = _ints()
    x = torch.from_numpy(_logits()).log_softmax(-1).to(torch.bfloat16)
    f = lambda y: dt.ctc_loss(y, tg, il, tl)  # noqa: E731
    xe = x.clone().requires_grad_()
    le = f(xe)
    le.backward()
    g_func = torch.func.grad(f)(x)
    xc = x.clone().requires_grad_()
    lc = torch.compile(f, backend="aot_eager", fullgraph=True)(xc)
    lc.backward()
    assert lc.dtype == g_func.dtype == xc.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lc, le, rtol=0, atol=0)
    torch.testing.assert_close(g_func, xe.grad, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_jax_ctc_half_matches_float64_torch_reference(dtype):
    tg, il, tl = _ints()
    x = jnp.asarray(jax.nn.log_softmax(jnp.asarray(_logits(), jnp.float32), -1), dtype)
    f = lambda y: dj.ctc_loss(y, TARGETS, IL, TL, reduction="none")  # noqa: E731
    loss = jax.jit(f)(x)
    g = jax.grad(lambda y: f(y).sum())(x)
    assert loss.dtype == g.dtype == dtype
    x64 = torch.from_numpy(np.asarray(x.astype(jnp.float32), np.float64))
    ref = F.ctc_loss(x64, tg, il, tl, reduction="none")
    np.testing.assert_allclose(np.asarray(loss, np.float64), ref.numpy(), rtol=JTOL[dtype])
    # same bits as the torch frontend on the same half values
    xt = torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(
        torch.float16 if dtype == jnp.float16 else torch.bfloat16)
    np.testing.assert_array_equal(np.asarray(loss.astype(jnp.float32)),
                                  dt.ctc_loss(xt, tg, il, tl, reduction="none").float().numpy())


def test_jax_asg_and_aligners_accept_bfloat16():
    em = jnp.asarray(_logits(1), jnp.bfloat16)
    tr = jnp.asarray(np.random.default_rng(2).normal(size=(C, C)) * 0.1, jnp.bfloat16)
    f = lambda e, t: dj.asg_loss(e, t, TARGETS, IL, TL, reduction="none")  # noqa: E731
    loss = f(em, tr)
    ge, gt = jax.grad(lambda e, t: f(e, t).sum(), argnums=(0, 1))(em, tr)
    assert loss.dtype == ge.dtype == gt.dtype == jnp.bfloat16
    ref = dt.asg_loss(torch.from_numpy(np.asarray(em, np.float64)),
                      torch.from_numpy(np.asarray(tr, np.float64)), *_ints(), reduction="none")
    np.testing.assert_allclose(np.asarray(loss, np.float64), ref.numpy(), rtol=1.6e-2)
    labels, scores = dj.ctc_align(jax.nn.log_softmax(em.astype(jnp.float32), -1).astype(
        jnp.bfloat16), TARGETS, IL, TL)
    assert scores.dtype == jnp.bfloat16 and labels.shape == (N, T)


@pytest.mark.parametrize("pad_dtype", [jnp.float32, jnp.bfloat16])
def test_optax_ctc_loss_accepts_what_optax_accepts(pad_dtype):
    rng = np.random.default_rng(3)
    b, t, k, n = 3, 10, 5, 4
    logits = jnp.asarray(rng.normal(size=(b, t, k)), jnp.bfloat16)
    lengths = np.array([10, 8, 6])
    logit_paddings = jnp.asarray(np.arange(t)[None] >= lengths[:, None], pad_dtype)
    labels = jnp.asarray(rng.integers(1, k, size=(b, n)), jnp.int32)
    label_paddings = jnp.asarray(np.arange(n)[None] >= np.array([4, 2, 3])[:, None], pad_dtype)
    ours = dj.optax_ctc_loss(logits, logit_paddings, labels, label_paddings)
    theirs_bf16 = optax.ctc_loss(logits, logit_paddings, labels, label_paddings)
    assert ours.dtype == theirs_bf16.dtype == jnp.float32  # optax's choice for half logits
    # optax in float32 on the exactly upcast logits is the reference
    ref = optax.ctc_loss(logits.astype(jnp.float32), logit_paddings.astype(jnp.float32), labels,
                         label_paddings.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(ref, np.float64),
                               rtol=1.6e-2)
    g = jax.grad(lambda l: dj.optax_ctc_loss(l, logit_paddings, labels, label_paddings).sum())(
        logits)
    g_ref = jax.grad(lambda l: optax.ctc_loss(l, logit_paddings.astype(jnp.float32), labels,
                                              label_paddings.astype(jnp.float32)).sum())(
        logits.astype(jnp.float32))
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(g_ref, np.float64),
                               atol=1.6e-2)


def test_torch_asg_module_under_autocast_float32_parameters():
    # ASGLoss holds float32 transitions; under autocast the model's emissions
    # are bfloat16.  As on autocast's float32 list, both run in float32.
    tg, il, tl = _ints()
    crit = dt.ASGLoss(C, learn_start=True)
    torch.nn.init.normal_(crit.transitions, std=0.1)
    em = torch.from_numpy(_logits(1)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = crit(em.to(torch.bfloat16), tg, il, tl)
    assert loss.dtype == torch.float32
    loss.backward()
    assert crit.transitions.grad.dtype == torch.float32
    ref = dt.asg_loss(em.to(torch.bfloat16).float(), crit.transitions.detach(), tg, il, tl,
                      start_transitions=crit.start_transitions.detach())
    torch.testing.assert_close(loss.detach(), ref, rtol=0, atol=0)


def test_torch_graph_loss_module_under_autocast_float32_weights():
    # GraphLoss holds float32 tied weights; under autocast the emissions are
    # bfloat16: both run in float32 (as ASGLoss), against an explicit float32 call.
    from duoloss.graphs import ctc_graph

    tg, il, tl = _ints()
    graphs = [ctc_graph(row[:n], blank=0) for row, n in zip(tg.tolist(), tl.tolist())]
    index = [np.arange(g.num_arcs()) % 3 for g in graphs]
    crit = dt.GraphLoss(3)
    torch.nn.init.normal_(crit.weights, std=0.1)
    em = torch.from_numpy(_logits(2)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = crit(em.to(torch.bfloat16), graphs, il, arc_weight_index=index)
    assert loss.dtype == torch.float32
    loss.backward()
    assert crit.weights.grad.dtype == torch.float32
    ref = dt.graph_loss(em.to(torch.bfloat16).float(), graphs, il,
                        weights=crit.weights.detach(), arc_weight_index=index)
    torch.testing.assert_close(loss.detach(), ref, rtol=0, atol=0)
