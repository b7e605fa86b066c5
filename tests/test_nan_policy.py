"""The NaN/inf policy of every loss, in both frontends (README, "Hardening"):

* ``-inf`` scores (zero probability) are valid and never produce NaN;
* a NaN in one sequence's frames makes only that sequence's loss and gradient
  NaN (and a NaN on a padded frame changes nothing);
* infeasible targets give ``+inf``, or 0 with zero gradient under ``zero_infinity``;
* empty batches and zero-length inputs/targets give the right values
  (cf. pytorch#81459), ``'mean'`` of an empty batch is 0, not NaN.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from bad_inputs import _graph

LOSSES = ("ctc", "asg", "asg_nt", "graph")
C = 5


def _call(mod, loss, em, tg, il, tl, tr, **kw):
    if loss == "ctc":
        return mod.ctc_loss(em, tg, il, tl, **kw)
    if loss in ("asg", "asg_nt"):
        return mod.asg_loss(em, tr if loss == "asg" else None, tg, il, tl, **kw)
    graphs = [_graph([int(k) for k in row[:n]]) for row, n in zip(np.asarray(tg), np.asarray(tl))]
    return mod.graph_loss(em, graphs, il, **kw)


def run(loss, fw, em, tg, il, tl, reduction="none", zero_infinity=False):
    """(losses or reduced loss, d sum(loss) / d emissions) as numpy."""
    em = np.asarray(em, np.float32)
    tg, il, tl = (np.asarray(x, np.int32) for x in (tg, il, tl))
    tr = (np.random.default_rng(7).standard_normal((C, C)) * 0.5).astype(np.float32)
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    if fw == "torch":
        x = torch.tensor(em, requires_grad=True)
        out = _call(dt, loss, x, torch.from_numpy(tg), torch.from_numpy(il),
                    torch.from_numpy(tl), torch.from_numpy(tr), **kw)
        out.sum().backward()
        return out.detach().numpy(), x.grad.numpy()
    f = lambda e: _call(dj, loss, e, tg, il, tl, tr, **kw)  # noqa: E731
    value, grad = jax.value_and_grad(lambda e: f(e).sum())(em)
    return np.asarray(f(em)), np.asarray(grad)


def both(*args, **kw):
    """Run in torch and jax; they must agree exactly (same core, same buffers)."""
    lt, gt = run(args[0], "torch", *args[1:], **kw)
    lj, gj = run(args[0], "jax", *args[1:], **kw)
    if kw.get("reduction", "none") == "none":
        np.testing.assert_array_equal(lt, lj)
        np.testing.assert_array_equal(gt, gj)
    else:  # the frontends reduce (and scale gradients) in their own framework: 1 ulp
        np.testing.assert_allclose(lt, lj, rtol=1e-6)
        np.testing.assert_allclose(gt, gj, rtol=1e-6, atol=1e-7)
    return lt, gt


def _batch(seed=0, t=8, n=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, n, C)).astype(np.float32)
    em = x - np.log(np.exp(x).sum(-1, keepdims=True))
    tg = np.array([[1, 2, 3], [2, 2, 0], [3, 1, 0]])[:n]
    il = np.array([8, 7, 6])[:n]
    tl = np.array([3, 2, 2])[:n]
    return em, tg, il, tl


@pytest.mark.parametrize("loss", LOSSES)
def test_neg_inf_scores_are_valid(loss):
    em, tg, il, tl = _batch()
    em = em.copy()
    em[:, :, 4] = -np.inf          # a class no target uses: probability 0 everywhere
    em[0, 0, 0] = -np.inf          # and one entry of the first sequence
    ref = np.where(np.isinf(em), -1e4, em)  # exp(-1e4) == 0 in float32 and float64
    losses, grad = both(loss, em, tg, il, tl)
    assert np.isfinite(losses).all() and np.isfinite(grad).all(), (losses, grad)
    l_ref, g_ref = both(loss, ref, tg, il, tl)
    np.testing.assert_allclose(losses, l_ref, rtol=1e-6)
    np.testing.assert_allclose(grad, g_ref, atol=1e-7)


@pytest.mark.parametrize("loss", LOSSES)
def test_all_neg_inf_frame_is_infeasible_not_nan(loss):
    em, tg, il, tl = _batch()
    em = em.copy()
    em[2, 1, :] = -np.inf          # sequence 1 has a frame of probability zero
    losses, grad = both(loss, em, tg, il, tl)
    assert not np.isnan(losses).any() and not np.isnan(grad).any(), (losses, grad)
    assert np.isfinite(losses[[0, 2]]).all()
    if loss != "asg" and loss != "asg_nt":  # ASG: both scores -inf; loss is +inf (no path)
        assert losses[1] == np.inf


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("where", ["valid frame", "padded frame"])
def test_nan_stays_in_its_sequence(loss, where):
    em, tg, il, tl = _batch()
    clean_l, clean_g = both(loss, em, tg, il, tl)
    em = em.copy()
    t = 3 if where == "valid frame" else 7   # sequence 1 has 7 frames: t=7 is padding
    em[t, 1, 2] = np.nan
    losses, grad = both(loss, em, tg, il, tl)
    others = [0, 2]
    np.testing.assert_array_equal(losses[others], clean_l[others])
    np.testing.assert_array_equal(grad[:, others], clean_g[:, others])
    if where == "valid frame":
        assert np.isnan(losses[1])
    else:
        np.testing.assert_array_equal(losses, clean_l)
        np.testing.assert_array_equal(grad, clean_g)


@pytest.mark.parametrize("loss", LOSSES)
def test_infeasible_is_inf_or_zero(loss):
    em, tg, il, tl = _batch()
    il = il.copy()
    il[1] = 1                   # target [2, 2] needs >= 3 CTC frames, >= 2 ASG/graph frames
    losses, grad = both(loss, em, tg, il, tl)
    assert losses[1] == np.inf and np.isfinite(losses[[0, 2]]).all()
    assert not np.isnan(grad).any()
    lz, gz = both(loss, em, tg, il, tl, zero_infinity=True)
    assert lz[1] == 0.0
    np.testing.assert_array_equal(gz[:, 1], 0.0)
    np.testing.assert_array_equal(lz[[0, 2]], losses[[0, 2]])
    np.testing.assert_array_equal(gz[:, [0, 2]], grad[:, [0, 2]])
    # reductions stay finite under zero_infinity
    for red in ("sum", "mean"):
        assert np.isfinite(both(loss, em, tg, il, tl, reduction=red, zero_infinity=True)[0])


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_empty_batch(loss, reduction):
    em = np.zeros((4, 0, C), np.float32)
    out, grad = both(loss, em, np.zeros((0, 2)), np.zeros(0), np.zeros(0), reduction=reduction)
    if reduction == "none":
        assert out.shape == (0,)
    else:
        assert out.shape == () and out == 0.0  # not NaN: an empty batch contributes nothing
    assert grad.shape == (4, 0, C)


@pytest.mark.parametrize("loss", LOSSES)
def test_zero_lengths(loss):
    em, tg, il, tl = _batch()
    il, tl = il.copy(), tl.copy()
    il[0], tl[0] = 0, 0          # no frames, empty target: the empty path, loss 0
    il[1] = 0                    # no frames, non-empty target: infeasible
    tl[2] = 0                    # frames, empty target
    losses, grad = both(loss, em, tg, il, tl)
    assert losses[0] == 0.0 and losses[1] == np.inf
    np.testing.assert_array_equal(grad[:, :2], 0.0)
    if loss == "ctc":   # only blanks: -sum_t log p_t(blank)
        want = -em[:6, 2, 0].astype(np.float64).sum()
        np.testing.assert_allclose(losses[2], want, rtol=1e-6)
        g = np.zeros((8, C), np.float32)
        g[:6, 0] = -1
        np.testing.assert_allclose(grad[:, 2], g, atol=1e-6)
    elif loss == "graph":  # the empty-target graph accepts only the empty path
        assert losses[2] == np.inf
    else:                # ASG: an empty target with frames is infeasible (GTN)
        assert losses[2] == np.inf
    lz, _ = both(loss, em, tg, il, tl, zero_infinity=True)
    assert lz[1] == 0.0 and lz[0] == 0.0


def test_jit_traced_invalid_values_give_nan_and_disable_jit_gives_the_error():
    import jax.numpy as jnp

    em, tg, il, tl = _batch()
    f = jax.jit(lambda e, t, i, l: dj.ctc_loss(e, t, i, l, reduction="none"))
    bad = tg.copy()
    bad[0, 2] = 9             # label >= C, traced: cannot be checked at trace time
    out = np.asarray(f(em, bad, il, tl))
    assert np.isnan(out[0]) and np.isfinite(out[1:]).all()
    bad_len = il.copy()
    bad_len[2] = 99           # input length > T
    out = np.asarray(f(em, tg, bad_len, tl))
    assert np.isnan(out[2]) and np.isfinite(out[:2]).all()
    with jax.disable_jit():   # the documented debug path: same call, eager, raises
        with pytest.raises(ValueError, match=r"ctc_loss: argument 'targets' must hold labels "
                                             r"in \[0, 5\), got 9 at sequence 0, position 2"):
            f(em, bad, il, tl)
    # static problems are caught at trace time, under jit too
    with pytest.raises(ValueError, match="ctc_loss: argument 'blank' must be in"):
        jax.jit(lambda e: dj.ctc_loss(e, tg, il, tl, blank=7))(jnp.asarray(em))


@pytest.mark.parametrize("fn", ["asg_loss", "graph_loss"])
def test_jit_traced_invalid_lengths_other_losses(fn):
    em, tg, il, tl = _batch()
    il = il.copy()
    il[1] = -3
    if fn == "asg_loss":
        f = jax.jit(lambda e, i: dj.asg_loss(e, None, tg, i, tl, reduction="none"))
    else:
        graphs = [_graph([int(k) for k in r[:n]]) for r, n in zip(tg, tl)]
        f = jax.jit(lambda e, i: dj.graph_loss(e, graphs, i, reduction="none"))
    out = np.asarray(f(em, il))
    assert np.isnan(out[1]) and np.isfinite(out[[0, 2]]).all()
    with jax.disable_jit():
        with pytest.raises(ValueError, match=f"{fn}: argument 'input_lengths' must be in"):
            f(em, il)
