"""CTC with a large vocabulary crosses to the host as ``(T, N, S+1)`` (issue #11, point 4).

The frontends gather the blank and each target's labels in the framework and
run the unchanged kernel on the gathered columns.  Checked here: the kernel
really receives ``(T, N, S+1)``; losses are bit-identical to the full-width call
(forced by raising the threshold) and gradients equal; both agree with torch's
``F.ctc_loss`` and ``optax.ctc_loss``; repeated labels, garbage padding,
concatenated targets, ``torch.compile`` and ``jax.jit``/``vmap`` work; an
invalid traced label gives NaN for its sequence only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import duoloss.core.losses.ctc as core_ctc
import duoloss.jax as dj
import duoloss.torch as dt

T, N, C, S = 120, 4, 600, 9
TARGETS = np.array([[5, 5, 17, 599, 5, 3, 3, 3, 40],   # repeats, also non-adjacent
                    [1, 2, 3, 4, 0, 0, 0, 0, 0],         # padding = blank value
                    [77, 77, 77, 77, 77, 77, 77, 1000, -3],  # garbage padding
                    [9, 8, 7, 6, 5, 4, 3, 2, 1]])
TL = np.array([9, 4, 7, 9])
IL = np.array([120, 100, 110, 60])


def _logits(seed=0):
    return np.random.default_rng(seed).normal(size=(T, N, C)) * 2.0


@pytest.fixture
def seen_shapes(monkeypatch):
    shapes = []
    original = core_ctc.ctc_loss_and_grad

    def spy(log_probs, *args, **kwargs):
        shapes.append(tuple(np.shape(log_probs)))
        return original(log_probs, *args, **kwargs)

    monkeypatch.setattr(core_ctc, "ctc_loss_and_grad", spy)
    return shapes


def _full_width(monkeypatch):
    monkeypatch.setattr(core_ctc, "GATHER_MIN_RATIO", 10**9)


def _torch_step(logits, targets=TARGETS, tl=TL, reduction="none"):
    x = torch.tensor(logits, requires_grad=True)
    tg = torch.from_numpy(targets) if isinstance(targets, np.ndarray) else targets
    loss = dt.ctc_loss(x.log_softmax(2), tg, torch.from_numpy(IL), torch.from_numpy(tl),
                       reduction=reduction)
    loss.sum().backward()
    return loss.detach(), x.grad


def test_torch_gathered_is_the_full_width_result_and_torch_s(seen_shapes, monkeypatch):
    assert core_ctc.ctc_gather_worthwhile(T, N, C, S)
    logits = _logits()
    loss, grad = _torch_step(logits)
    assert seen_shapes[-1] == (T, N, S + 1)
    _full_width(monkeypatch)
    loss_full, grad_full = _torch_step(logits)
    assert seen_shapes[-1] == (T, N, C)
    assert torch.equal(loss, loss_full)
    torch.testing.assert_close(grad, grad_full, rtol=0, atol=1e-15)
    x = torch.tensor(logits, requires_grad=True)
    ref = F.ctc_loss(x.log_softmax(2), torch.from_numpy(TARGETS), torch.from_numpy(IL),
                     torch.from_numpy(TL), reduction="none")
    ref.sum().backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-10, atol=0)
    torch.testing.assert_close(grad, x.grad, rtol=0, atol=1e-10)


def test_torch_float32_no_grad_and_concatenated_targets(seen_shapes):
    logits = _logits(1).astype(np.float32)
    lp = torch.from_numpy(logits).log_softmax(2)
    with torch.no_grad():
        padded = dt.ctc_loss(lp, torch.from_numpy(TARGETS), torch.from_numpy(IL),
                             torch.from_numpy(TL), reduction="sum")
    concat = torch.from_numpy(np.concatenate([t[:n] for t, n in zip(TARGETS, TL)]))
    flat = dt.ctc_loss(lp, concat, tuple(IL.tolist()), tuple(TL.tolist()), reduction="sum")
    assert all(shape[2] < C for shape in seen_shapes)
    assert torch.equal(padded, flat)
    ref = F.ctc_loss(lp.double(), torch.from_numpy(TARGETS), torch.from_numpy(IL),
                     torch.from_numpy(TL), reduction="sum")
    torch.testing.assert_close(padded.double(), ref, rtol=1e-6, atol=0)


def test_torch_compile_fullgraph_gathers_too():
    logits = _logits(2)
    tg, il, tl = (torch.from_numpy(a) for a in (TARGETS, IL, TL))

    def f(x):
        return dt.ctc_loss(x.log_softmax(2), tg, il, tl)

    x = torch.tensor(logits, requires_grad=True)
    eager = f(x)
    (g_eager,) = torch.autograd.grad(eager, x)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x2 = torch.tensor(logits, requires_grad=True)
    out = compiled(x2)
    (g_out,) = torch.autograd.grad(out, x2)
    torch.testing.assert_close(out, eager, rtol=1e-12, atol=0)
    torch.testing.assert_close(g_out, g_eager, rtol=0, atol=1e-12)


def _jax_loss(targets=TARGETS):
    def f(logits):
        lp = jax.nn.log_softmax(logits, axis=-1)
        return dj.ctc_loss(lp, targets, IL, TL, reduction="sum")
    return f


def test_jax_jit_gathered_is_the_full_width_result(seen_shapes, monkeypatch):
    logits = jnp.asarray(_logits(3).astype(np.float32))
    loss, grad = jax.jit(jax.value_and_grad(_jax_loss()))(logits)
    assert seen_shapes[-1] == (T, N, S + 1)
    _full_width(monkeypatch)
    loss_full, grad_full = jax.jit(jax.value_and_grad(_jax_loss()))(logits)
    assert seen_shapes[-1] == (T, N, C)
    assert np.asarray(loss) == np.asarray(loss_full)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_full), rtol=0, atol=1e-7)


def test_optax_drop_in_gathers_and_matches_optax(seen_shapes):
    logits = jnp.asarray(_logits(4).astype(np.float32)).transpose(1, 0, 2)  # (B, T, K)
    logit_pad = (np.arange(T)[None, :] >= IL[:, None]).astype(np.float32)
    labels = np.where(np.arange(S)[None, :] < TL[:, None], TARGETS, 0)
    label_pad = (np.arange(S)[None, :] >= TL[:, None]).astype(np.float32)
    ours = dj.optax_ctc_loss(logits, logit_pad, labels, label_pad)
    assert seen_shapes[-1] == (T, N, S + 1)
    ref = optax.ctc_loss(logits, logit_pad, labels, label_pad)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=2e-4)


def test_invalid_traced_label_gives_nan_for_its_sequence_only(seen_shapes):
    logits = jnp.asarray(_logits(5).astype(np.float32))
    bad = TARGETS.copy()
    bad[1, 2] = C + 3  # out of range, only visible as a traced value under jit

    @jax.jit
    def losses(lp, targets):
        return dj.ctc_loss(lp, targets, IL, TL, reduction="none")

    lp = jax.nn.log_softmax(logits, axis=-1)
    good_losses = np.asarray(losses(lp, jnp.asarray(TARGETS)))
    bad_losses = np.asarray(losses(lp, jnp.asarray(bad)))
    assert seen_shapes[-1] == (T, N, S + 1)
    assert np.isnan(bad_losses[1]) and not np.isnan(bad_losses[[0, 2, 3]]).any()
    np.testing.assert_array_equal(bad_losses[[0, 2, 3]], good_losses[[0, 2, 3]])


def test_jax_vmap_over_batches_of_targets():
    logits = jnp.asarray(_logits(6).astype(np.float32))
    lp = jax.nn.log_softmax(logits, axis=-1)
    stacked = jnp.stack([jnp.asarray(TARGETS), jnp.asarray(TARGETS[::-1].copy())])
    tl2 = jnp.stack([jnp.asarray(TL), jnp.asarray(TL[::-1].copy())])

    def one(targets, tl):
        return dj.ctc_loss(lp, targets, IL, tl, reduction="none")

    out = jax.vmap(one)(stacked, tl2)
    for k in range(2):
        np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(one(stacked[k], tl2[k])))
