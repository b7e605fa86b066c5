"""asg_loss / ASGLoss in torch and JAX: gradchecks, cross-frontend agreement, validation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads

import duoloss.jax as dj
import duoloss.torch as dt
from test_asg_reference import brute_asg, load_family

ASG = load_family("asg")


def _batch(rng, t_max=7, n=3, c=4, s=4, dtype=np.float64):
    em = rng.standard_normal((t_max, n, c)).astype(dtype)
    tr = rng.standard_normal((c, c)).astype(dtype)
    sv = rng.standard_normal(c).astype(dtype)
    tg = rng.integers(0, c, (n, s))
    tg[0, :3] = [1, 1, 2]  # a repeat
    il = np.array([t_max, t_max - 2, 3][:n])
    tl = np.array([3, s, 1][:n])
    return em, tr, sv, tg, il, tl


def _reduce(losses, tl, reduction):
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return (losses / np.maximum(tl, 1)).mean()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("with_trans,with_start", [(True, True), (True, False), (False, True),
                                                   (False, False)])
def test_torch_gradcheck(reduction, with_trans, with_start):
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(0))
    inputs = [torch.tensor(em, requires_grad=True)]
    if with_trans:
        inputs.append(torch.tensor(tr, requires_grad=True))
    if with_start:
        inputs.append(torch.tensor(sv, requires_grad=True))

    def f(*xs):
        xs = list(xs)
        e = xs.pop(0)
        t = xs.pop(0) if with_trans else None
        s = xs.pop(0) if with_start else None
        return dt.asg_loss(e, t, torch.tensor(tg), torch.tensor(il), tuple(tl.tolist()),
                           start_transitions=s, reduction=reduction)

    assert torch.autograd.gradcheck(f, tuple(inputs))


@pytest.mark.parametrize("with_trans", [True, False])
def test_jax_check_grads(with_trans):
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(1))
    with jax.enable_x64(True):
        if with_trans:
            def f(e, t, s):
                return dj.asg_loss(e, t, tg, il, tl, start_transitions=s, reduction="mean")
            args = (jnp.asarray(em), jnp.asarray(tr), jnp.asarray(sv))
        else:
            def f(e, s):
                return dj.asg_loss(e, None, tg, il, tl, start_transitions=s, reduction="sum")
            args = (jnp.asarray(em), jnp.asarray(sv))
        check_grads(f, args, order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)
        check_grads(jax.jit(f), args, order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_torch_and_jax_agree(dtype, reduction):
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(2), dtype=dtype)
    te, tt, ts = (torch.tensor(x, requires_grad=True) for x in (em, tr, sv))
    out_t = dt.asg_loss(te, tt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                        start_transitions=ts, reduction=reduction)
    out_t.sum().backward()
    with jax.enable_x64(dtype == np.float64):
        def f(e, t, s):
            return dj.asg_loss(e, t, tg, il, tl, start_transitions=s, reduction=reduction).sum()
        val, grads = jax.value_and_grad(f, argnums=(0, 1, 2))(
            jnp.asarray(em), jnp.asarray(tr), jnp.asarray(sv))
        assert val.dtype == dtype and grads[0].dtype == dtype
        rtol = 1e-12 if dtype == np.float64 else 1e-6
        np.testing.assert_allclose(np.asarray(val), out_t.detach().sum().numpy(), rtol=rtol)
        for g_j, t in zip(grads, (te, tt, ts)):
            np.testing.assert_allclose(np.asarray(g_j), t.grad.numpy(), rtol=rtol, atol=1e-6)
    # and both equal the reduced brute-force losses
    ref = np.array([brute_asg(em[:il[b], b].astype(np.float64), tr.astype(np.float64),
                              sv.astype(np.float64), list(tg[b, :tl[b]]))[0] for b in range(3)])
    np.testing.assert_allclose(out_t.detach().numpy(), _reduce(ref, tl, reduction),
                               rtol=1e-12 if dtype == np.float64 else 2e-6)


def test_padded_frames_get_zero_gradient():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(3))
    te = torch.tensor(em, requires_grad=True)
    dt.asg_loss(te, torch.tensor(tr), torch.tensor(tg), torch.tensor(il), torch.tensor(tl)
                ).backward()
    assert torch.all(te.grad[il[1]:, 1] == 0) and torch.all(te.grad[il[2]:, 2] == 0)
    assert torch.all(te.grad[:il[1], 1] != 0)


def test_zero_infinity_and_infeasible():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(4))
    tl = np.array([3, 4, 4])  # sequence 2 has 3 frames for 4 tokens
    te = torch.tensor(em, requires_grad=True)
    out = dt.asg_loss(te, torch.tensor(tr), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                      reduction="none")
    assert torch.isinf(out[2]) and torch.isfinite(out[:2]).all()
    out = dt.asg_loss(te, torch.tensor(tr), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                      reduction="sum", zero_infinity=True)
    out.backward()
    assert torch.isfinite(out) and torch.all(te.grad[:, 2] == 0)
    j = dj.asg_loss(em, tr, tg, il, tl, reduction="none", zero_infinity=True)
    np.testing.assert_allclose(np.asarray(j)[2], 0.0)


def test_asg_module_learns_transitions():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(5))
    module = dt.ASGLoss(4, learn_start=True, dtype=torch.float64)
    assert {n for n, _ in module.named_parameters()} == {"transitions", "start_transitions"}
    loss = module(torch.tensor(em), torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    loss.backward()
    assert module.transitions.grad.abs().sum() > 0 and module.start_transitions.grad is not None
    ref = dt.asg_loss(torch.tensor(em), torch.zeros(4, 4, dtype=torch.float64), torch.tensor(tg),
                      torch.tensor(il), torch.tensor(tl),
                      start_transitions=torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(loss.detach(), ref)
    # training lowers the loss
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    first = None
    for _ in range(5):
        opt.zero_grad()
        loss = module(torch.tensor(em), torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    assert loss.item() < first


@pytest.mark.skipif(ASG is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
def test_frontends_match_gtn_float32():
    case = ASG["cases"][15]
    em = np.asarray(case["emissions"], np.float32)[:, None, :]
    tr = np.asarray(case["transitions"], np.float32)
    sv = np.asarray(case["start"], np.float32)
    tg = np.asarray(case["target"])[None]
    args = (tg, np.array([case["T"]]), np.array([tg.shape[1]]))
    lt = dt.asg_loss(torch.tensor(em), torch.tensor(tr), torch.tensor(tg),
                     *map(torch.tensor, args[1:]),
                     start_transitions=torch.tensor(sv), reduction="none")
    lj = dj.asg_loss(em, tr, *args, start_transitions=sv, reduction="none")
    np.testing.assert_allclose(lt.numpy(), [case["loss"]], rtol=2e-6)
    np.testing.assert_allclose(np.asarray(lj), [case["loss"]], rtol=2e-6)


def test_jax_vmap_and_traced_invalid_values():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(6), dtype=np.float32)
    f = jax.jit(lambda e, t, g: dj.asg_loss(e, t, g, il, tl, reduction="none"))
    base = np.asarray(f(em, tr, tg))
    batched = jax.vmap(f, in_axes=(0, None, None))(jnp.stack([em, em * 0.5]), tr, tg)
    np.testing.assert_allclose(np.asarray(batched)[0], base, rtol=1e-6)
    bad = tg.copy()
    bad[1, 0] = 99  # cannot be validated under jit: that sequence is NaN
    out = np.asarray(f(em, tr, bad))
    assert np.isnan(out[1]) and np.isfinite(out[[0, 2]]).all()


BAD_CASES = [
    (dict(em=np.zeros((3, 2))), ValueError, "argument 'emissions' must be a (T, N, C)-array"),
    (dict(em=np.zeros((3, 2, 4), np.int64)), TypeError,
     "argument 'emissions' must have a floating"),
    (dict(tr=np.zeros((4, 3))), ValueError, "argument 'transitions' must have shape (4, 4)"),
    (dict(sv=np.zeros(5)), ValueError, "argument 'start_transitions' must have shape (4,)"),
    (dict(tr=np.zeros((4, 4), np.float32)), TypeError, "must have the dtype of 'emissions'"),
    (dict(tg=np.array([[0, 4], [1, 1]])), ValueError,
     "argument 'targets' must hold labels in [0, 4)"),
    (dict(tg=np.zeros((3, 2), np.int64)), ValueError, "argument 'targets' must have N = 2"),
    (dict(tg=np.zeros((2, 2))), TypeError, "argument 'targets' must have an integer dtype"),
    (dict(il=np.array([3, 4])), ValueError, "argument 'input_lengths' must be in [0, 3]"),
    (dict(tl=np.array([-1, 1])), ValueError, "argument 'target_lengths' must be in [0, 2]"),
    (dict(il=np.array([3])), ValueError, "argument 'input_lengths' must be an (N,)-array"),
    (dict(reduction="avg"), ValueError, "argument 'reduction' must be one of"),
    (dict(zero_infinity=1), TypeError, "argument 'zero_infinity' must be a bool"),
]


@pytest.mark.parametrize("frontend", ["torch", "jax"])
@pytest.mark.parametrize("override,exc,msg", BAD_CASES)
def test_validation_messages(frontend, override, exc, msg):
    a = dict(em=np.zeros((3, 2, 4)), tr=np.zeros((4, 4)), sv=np.zeros(4),
             tg=np.array([[0, 1], [2, 3]]), il=np.array([3, 2]), tl=np.array([2, 1]),
             reduction="mean", zero_infinity=False)
    a.update(override)
    if frontend == "torch":
        conv = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
        call = dt.asg_loss
    else:
        with jax.enable_x64(True):
            conv = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
        call = dj.asg_loss
    with jax.enable_x64(True):
        with pytest.raises(exc) as info:
            call(conv["em"], conv["tr"], conv["tg"], conv["il"], conv["tl"],
                 start_transitions=conv["sv"], reduction=conv["reduction"],
                 zero_infinity=conv["zero_infinity"])
    assert str(info.value).startswith("asg_loss: ") and msg in str(info.value), str(info.value)


def test_torch_rejects_non_tensors():
    with pytest.raises(TypeError, match="asg_loss: argument 'emissions' must be a torch.Tensor"):
        dt.asg_loss(np.zeros((3, 1, 2)), None, torch.zeros(1, 1, dtype=torch.long), [3], [1])
    with pytest.raises(TypeError, match="argument 'transitions' must be a torch.Tensor or None"):
        dt.asg_loss(torch.zeros(3, 1, 2), np.zeros((2, 2)), torch.zeros(1, 1, dtype=torch.long),
                    [3], [1])


def test_jax_vmap_over_shared_transitions():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(7), dtype=np.float32)
    trs = np.stack([tr, 0.5 * tr])
    f = lambda t: dj.asg_loss(em, t, tg, il, tl)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(trs)), [f(trs[0]), f(trs[1])], rtol=1e-6)
    g = jax.vmap(jax.grad(f))(trs)
    np.testing.assert_allclose(np.asarray(g[1]), np.asarray(jax.grad(f)(trs[1])), rtol=1e-6)


def test_concatenated_targets():
    em, tr, sv, tg, il, tl = _batch(np.random.default_rng(8), dtype=np.float32)
    flat = np.concatenate([tg[b, :tl[b]] for b in range(3)])
    padded = dt.asg_loss(torch.tensor(em), torch.tensor(tr), torch.tensor(tg), il.tolist(),
                         tl.tolist(), reduction="none")
    concat = dt.asg_loss(torch.tensor(em), torch.tensor(tr), torch.tensor(flat), il.tolist(),
                         tl.tolist(), reduction="none")
    torch.testing.assert_close(concat, padded)
    jitted = jax.jit(lambda f, l: dj.asg_loss(em, tr, f, il, l, reduction="none"))(flat, tl)
    np.testing.assert_allclose(np.asarray(jitted), padded.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="asg_loss: argument 'target_lengths' must sum to"):
        dj.asg_loss(em, tr, flat[:-1], il, tl)
