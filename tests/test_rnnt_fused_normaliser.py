"""The fused normaliser + gather of the RNN-T frontends (issue #11 speed work).

The torch CPU path runs ``log_softmax`` through blocks of rows; the JAX path
has one custom backward.  Both are checked against an independent float64
reference written here (plain torch autograd through ``log_softmax``, gathers
and the alpha recursion), on every block split, and against each other.
"""
import numpy as np
import pytest
import torch

import duoloss.torch as dt
import duoloss.torch._rnnt as trnnt


def _reference(logits, targets, il, tl, blank):
    """Per-sequence RNN-T NLL by the textbook alpha recursion, torch autograd."""
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for b in range(logits.shape[0]):
        t_b, u_b = int(il[b]), int(tl[b])
        alpha = {}
        for t in range(t_b):
            for u in range(u_b + 1):
                terms = []
                if t == 0 and u == 0:
                    terms.append(lp.new_zeros(()))
                if t > 0:
                    terms.append(alpha[t - 1, u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t, u - 1] + lp[b, t, u - 1, int(targets[b, u - 1])])
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[t_b - 1, u_b] + lp[b, t_b - 1, u_b, blank]))
    return torch.stack(out)


def _case(seed=0, n=3, t=5, u=3, v=7):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, t, u + 1, v))
    tg = rng.integers(1, v, (n, u))
    il = np.array([t, t - 2, 1])[:n]
    tl = np.array([u, 1, 0])[:n]
    return x, tg, il, tl


def _torch_loss_grad(x, tg, il, tl, **kw):
    xt = torch.tensor(x, requires_grad=True)
    loss = dt.rnnt_loss(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), blank=0,
                        reduction="none", **kw)
    w = torch.arange(1.0, x.shape[0] + 1, dtype=xt.dtype)  # distinct cotangents per sequence
    (loss * w).sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("block_rows", [1, 3, 4, 10_000])
def test_torch_blocked_matches_reference(monkeypatch, block_rows):
    x, tg, il, tl = _case()
    monkeypatch.setattr(trnnt, "_BLOCKED_MIN_BYTES", 0)
    monkeypatch.setattr(trnnt, "_BLOCK_BYTES", block_rows * x.shape[-1] * 8)
    loss, grad = _torch_loss_grad(x, tg, il, tl)
    xr = torch.tensor(x, requires_grad=True)
    ref = _reference(xr, tg, il, tl, 0)
    (ref * torch.arange(1.0, 4.0, dtype=xr.dtype)).sum().backward()
    np.testing.assert_allclose(loss, ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, xr.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_torch_blocked_is_bit_identical_to_whole_tensor_path(monkeypatch):
    x, tg, il, tl = _case(1)
    monkeypatch.setattr(trnnt, "_BLOCKED_MIN_BYTES", 0)
    monkeypatch.setattr(trnnt, "_BLOCK_BYTES", 3 * x.shape[-1] * 8)
    blocked = _torch_loss_grad(x, tg, il, tl)
    monkeypatch.setattr(trnnt, "_row_blocks", lambda x: None)
    whole = _torch_loss_grad(x, tg, il, tl)
    assert np.array_equal(blocked[0], whole[0]) and np.array_equal(blocked[1], whole[1])


def test_torch_no_grad_loss_is_bit_identical_and_retain_graph_works(monkeypatch):
    x, tg, il, tl = _case(2)
    monkeypatch.setattr(trnnt, "_BLOCKED_MIN_BYTES", 0)
    monkeypatch.setattr(trnnt, "_BLOCK_BYTES", 2 * x.shape[-1] * 8)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    with torch.no_grad():
        plain = dt.rnnt_loss(torch.tensor(x), *args, blank=0, reduction="none")
    xt = torch.tensor(x, requires_grad=True)
    loss = dt.rnnt_loss(xt, *args, blank=0, reduction="sum")
    g1, = torch.autograd.grad(loss, xt, retain_graph=True)
    g2, = torch.autograd.grad(loss, xt)
    assert torch.equal(g1, g2)
    with_grad = dt.rnnt_loss(xt, *args, blank=0, reduction="none").detach()
    assert torch.equal(plain, with_grad)


def test_torch_nan_in_padding_stays_out_with_blocks(monkeypatch):
    x, tg, il, tl = _case(3)
    monkeypatch.setattr(trnnt, "_BLOCKED_MIN_BYTES", 0)
    monkeypatch.setattr(trnnt, "_BLOCK_BYTES", 2 * x.shape[-1] * 8)
    clean = _torch_loss_grad(x, tg, il, tl)
    dirty = x.copy()
    dirty[2, 4, 3, :] = np.nan  # sequence 2 has T_b = 1, U_b = 0: a padded cell
    dirty[1, 0, 3, 2] = np.inf  # beyond U_b = 1 of sequence 1
    loss, grad = _torch_loss_grad(dirty, tg, il, tl)
    assert np.array_equal(loss, clean[0]) and np.array_equal(grad, clean[1])


def test_torch_fused_grad_matches_finite_differences():
    x, tg, il, tl = _case(4, n=2, t=3, u=2, v=4)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    xt = torch.tensor(x, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: dt.rnnt_loss(z, *args, blank=0, reduction="none"), (xt,), eps=1e-6,
        atol=1e-7)


def test_jax_fused_backward_matches_reference_and_torch():
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj

    with jax.enable_x64(True):
        x, tg, il, tl = _case(5)
        w = np.arange(1.0, 4.0)
        f = jax.value_and_grad(lambda z: (dj.rnnt_loss(z, tg, il, tl, blank=0,
                                                        reduction="none") * w).sum())
        val, grad = f(jax.numpy.asarray(x))
        xr = torch.tensor(x, requires_grad=True)
        ref = (_reference(xr, tg, il, tl, 0) * torch.tensor(w)).sum()
        ref.backward()
        np.testing.assert_allclose(float(val), float(ref.detach()), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(grad), xr.grad.numpy(), rtol=1e-10, atol=1e-12)
        _, tgrad = _torch_loss_grad(x, tg, il, tl)
        np.testing.assert_allclose(np.asarray(grad), tgrad, rtol=1e-12, atol=1e-14)
