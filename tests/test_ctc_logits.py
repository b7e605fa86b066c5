"""``optax_ctc_loss``'s host path: ``log_softmax``, the CTC kernel and the way back in
one host call (`duoloss.core.losses.ctc_logits`).

References: torch's ``F.ctc_loss`` on ``log_softmax`` with autograd to the logits in
float64 (independent maths and code), optax's ``ctc_loss`` in float32, and duoloss's
general path (``jax.nn.log_softmax`` then ``ctc_loss``) for the special rows: NaN,
``-inf`` and ``+inf`` logits, rows far from 0, infeasible and empty sequences.
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
from duoloss.core.losses import ctc_logits


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _case(seed, n=4, t=30, k=9, s=7, scale=3.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, t, k)) * scale
    tg = rng.integers(1, k, size=(n, s))
    tg[0, 1] = tg[0, 0]  # a repeated label
    il = np.array([t, t - 4, 2 * s + 1, t - 1])[:n]
    tl = np.array([s, s - 2, s, 0])[:n]
    return x, tg, il, tl


def _paddings(il, tl, t, s):
    return ((np.arange(t)[None] >= il[:, None]).astype(np.float32),
            (np.arange(s)[None] >= tl[:, None]).astype(np.float32))


def _torch_reference(x, tg, il, tl, weights):
    """float64 losses and d(sum_b w_b loss_b)/d logits by torch's own CTC + autograd."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(xt, -1).transpose(0, 1)
    losses = F.ctc_loss(lp, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                        reduction="none", zero_infinity=False)
    (losses * torch.tensor(weights)).sum().backward()
    return losses.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("seed", range(3))
def test_core_float64_equals_torch(seed):
    x, tg, il, tl = _case(seed)
    x[1, 3] += 400.0  # a row far from 0: the max-shifted pass
    x[2, 5] -= 300.0
    w = np.array([1.0, 0.5, 2.0, 1.5])
    want_l, want_g = _torch_reference(x, tg, il, tl, w)
    losses, grad = ctc_logits.ctc_logits_loss_and_grad(x, tg, il, tl, grad_weights=w)
    np.testing.assert_allclose(losses, want_l, rtol=1e-12)
    np.testing.assert_allclose(grad, want_g, rtol=1e-9, atol=1e-12)
    assert grad.shape == x.shape and grad.dtype == np.float64


def test_jax_float64_equals_torch(x64):
    x, tg, il, tl = _case(7)
    lpad, labpad = _paddings(il, tl, x.shape[1], tg.shape[1])
    want_l, want_g = _torch_reference(x, tg, il, tl, np.ones(4))
    f = jax.jit(jax.value_and_grad(
        lambda z: dj.optax_ctc_loss(z, lpad, tg, labpad).sum()))
    loss, grad = f(jnp.asarray(x))
    assert grad.dtype == jnp.float64
    np.testing.assert_allclose(float(loss), want_l.sum(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(2))
def test_jax_float32_equals_optax(seed):
    x, tg, il, tl = _case(seed, n=4, t=40, k=12, s=6)
    x = x.astype(np.float32)
    lpad, labpad = _paddings(il, tl, x.shape[1], tg.shape[1])
    ours = jax.jit(jax.value_and_grad(lambda z: dj.optax_ctc_loss(z, lpad, tg, labpad).sum()))
    ref = jax.jit(jax.value_and_grad(lambda z: optax.ctc_loss(z, lpad, tg, labpad).sum()))
    (lo, go), (lr, gr) = ours(jnp.asarray(x)), ref(jnp.asarray(x))
    np.testing.assert_allclose(float(lo), float(lr), rtol=2e-5)
    np.testing.assert_allclose(np.asarray(go), np.asarray(gr), atol=5e-5)


def _general_path(z, lpad, tg, labpad):
    """duoloss's other path: XLA's log_softmax, then ctc_loss on (T, B, K)."""
    il = (z.shape[1] - jnp.round(lpad.sum(1))).astype(jnp.int32)
    tl = (tg.shape[1] - jnp.round(labpad.sum(1))).astype(jnp.int32)
    lp = jax.nn.log_softmax(z, -1).transpose(1, 0, 2)
    return dj.ctc_loss(lp, tg, il, tl, reduction="none")


def test_special_rows_as_the_general_path():
    x, tg, il, tl = _case(11, n=4, t=30, k=9, s=7)
    x = x.astype(np.float32)
    x[0, 4, 2] = np.nan        # NaN inside sequence 0: its loss NaN
    x[1, 28, :] = np.nan       # NaN in a padded frame of sequence 1 (il = 26): ignored
    x[2, 3, :] = -np.inf       # a row of -inf: NaN, as jax.nn.log_softmax
    x[3, 7, 1] = np.inf        # +inf: NaN
    tg2 = tg.copy()
    lpad, labpad = _paddings(il, tl, x.shape[1], tg.shape[1])
    ours = dj.optax_ctc_loss(jnp.asarray(x), lpad, tg2, labpad)
    ref = _general_path(jnp.asarray(x), lpad, tg2, labpad)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5)
    assert np.isnan(np.asarray(ours)[[0, 2, 3]]).all() and np.isfinite(np.asarray(ours)[1])
    g = jax.grad(lambda z: dj.optax_ctc_loss(z, lpad, tg2, labpad)[1])(jnp.asarray(x))
    gr = jax.grad(lambda z: _general_path(z, lpad, tg2, labpad)[1])(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(g), np.asarray(gr), atol=2e-6)  # NaN where it is


def test_infeasible_and_empty_sequences():
    x, tg, il, tl = _case(12, n=4, t=12, k=6, s=7)
    x = x.astype(np.float32)
    il = np.array([12, 3, 0, 12])  # 3 frames for 7 labels; no frame at all
    tl = np.array([5, 7, 0, 0])
    lpad, labpad = _paddings(il, tl, x.shape[1], tg.shape[1])
    ours = np.asarray(dj.optax_ctc_loss(jnp.asarray(x), lpad, tg, labpad))
    ref = np.asarray(_general_path(jnp.asarray(x), lpad, tg, labpad))
    assert ours[1] == np.inf and ours[2] == 0.0  # infeasible; empty target over 0 frames
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    g = jax.grad(lambda z: dj.optax_ctc_loss(z, lpad, tg, labpad)[jnp.array([0, 2, 3])].sum())(
        jnp.asarray(x))
    gr = jax.grad(lambda z: _general_path(z, lpad, tg, labpad)[jnp.array([0, 2, 3])].sum())(
        jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(g), np.asarray(gr), atol=2e-6)
    assert float(jnp.abs(g[2]).max()) == 0.0  # no frame: no gradient


def test_a_large_vocabulary_keeps_the_gathered_crossing(monkeypatch):
    """Few labels over many classes (`ctc_gather_worthwhile`): the general path, whose
    callback sees S + 1 gathered columns, not the whole (B, T, K) logits."""
    seen = []
    real = ctc_logits.ctc_logits_loss_and_grad
    monkeypatch.setattr(ctc_logits, "ctc_logits_loss_and_grad",
                        lambda *a, **k: seen.append(1) or real(*a, **k))
    x = np.random.default_rng(0).standard_normal((2, 40, 4000)).astype(np.float32)
    tg = np.array([[5, 9, 2], [7, 7, 1]])
    lpad, labpad = _paddings(np.array([40, 33]), np.array([3, 2]), 40, 3)
    dj.optax_ctc_loss(jnp.asarray(x), lpad, tg, labpad)
    assert not seen
    dj.optax_ctc_loss(jnp.asarray(x[:, :, :8]), lpad, np.minimum(tg, 7), labpad)
    assert seen
