"""duoloss.jax CTC: optax reference, jit/grad/vmap, x64 on and off, torch parity."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from jax.test_util import check_grads

import duoloss.jax as dj
import duoloss.torch as dt
from ctc_reference import random_batch


def _batch(seed, t_max=40, n=5, n_cls=7, s_max=10, **kw):
    rng = np.random.default_rng(seed)
    logp, targets, il, tl = random_batch(rng, t_max, n, n_cls, s_max, **kw)
    return logp.astype(np.float32), targets.astype(np.int32), il.astype(np.int32), tl.astype(np.int32)


def _paddings(il, tl, t_max, s_max):
    lp = (np.arange(t_max)[None] >= il[:, None]).astype(np.float32)
    lab = (np.arange(s_max)[None] >= tl[:, None]).astype(np.float32)
    return lp, lab


@pytest.mark.parametrize("seed", range(3))
def test_optax_drop_in_matches_optax(seed):
    rng = np.random.default_rng(seed)
    n, t_max, c, s = 6, 50, 8, 12
    logits = rng.normal(size=(n, t_max, c)).astype(np.float32)
    _, labels, il, tl = _batch(seed, t_max, n, c, s)
    il = np.maximum(il, 2 * s + 1)  # feasible: optax would return ~1e5 otherwise
    lpad, labpad = _paddings(il, tl, t_max, s)
    want = optax.ctc_loss(logits, lpad, labels, labpad)
    got = dj.optax_ctc_loss(logits, lpad, labels, labpad)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    gw = jax.grad(lambda z: optax.ctc_loss(z, lpad, labels, labpad).sum())(logits)
    gg = jax.grad(lambda z: dj.optax_ctc_loss(z, lpad, labels, labpad).sum())(logits)
    np.testing.assert_allclose(gg, gw, atol=5e-5)


def test_optax_drop_in_infeasible_is_inf():
    logits = jnp.zeros((1, 3, 4))
    loss = dj.optax_ctc_loss(logits, jnp.zeros((1, 3)), jnp.array([[1, 1, 2]]), jnp.zeros((1, 3)))
    assert float(loss[0]) == np.inf


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_jax_and_torch_are_bit_identical(reduction):
    # Both frontends run the same core on the same buffers: identical numbers.
    logp, targets, il, tl = _batch(1)
    a, ga = jax.value_and_grad(lambda x: dj.ctc_loss(x, targets, il, tl,
                                                     reduction=reduction).sum())(logp)
    x = torch.tensor(logp, requires_grad=True)
    b = dt.ctc_loss(x, torch.from_numpy(targets), torch.from_numpy(il), torch.from_numpy(tl),
                    reduction=reduction).sum()
    b.backward()
    if reduction == "mean":  # the reductions run in float32 (jax) vs float64 (torch)
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(ga), x.grad.numpy(), rtol=1e-6, atol=1e-9)
    else:
        np.testing.assert_array_equal(np.asarray(a), b.detach().numpy())
        np.testing.assert_array_equal(np.asarray(ga), x.grad.numpy())


def test_jit_grad_value_and_grad_agree_with_eager():
    logp, targets, il, tl = _batch(2)
    f = lambda x, t, i, l: dj.ctc_loss(x, t, i, l)
    eager = f(logp, targets, il, tl)
    jitted = jax.jit(f)(logp, targets, il, tl)
    v, g = jax.jit(jax.value_and_grad(f))(logp, targets, il, tl)
    g2 = jax.grad(f)(logp, targets, il, tl)
    np.testing.assert_array_equal(eager, jitted)
    np.testing.assert_array_equal(v, eager)
    np.testing.assert_array_equal(g, g2)
    assert g.dtype == jnp.float32 and v.dtype == jnp.float32


def test_vmap_and_nested_vmap_match_loops():
    logp, targets, il, tl = _batch(3, n=3)
    stack = np.stack([logp, logp * 1.3, logp - 0.2])
    f = lambda x: dj.ctc_loss(x, targets, il, tl, reduction="none")
    vm = jax.vmap(f)(stack)
    np.testing.assert_array_equal(vm, np.stack([f(s) for s in stack]))
    # nested vmap, batched targets too, and gradients through it
    stack2 = np.stack([stack, stack[::-1]])
    tgs = np.stack([targets, np.where(targets > 0, targets % 6 + 1, 0)])
    h = lambda x, t: dj.ctc_loss(x, t, il, tl, reduction="sum")
    nested = jax.vmap(jax.vmap(h, in_axes=(0, None)), in_axes=(0, 0))(stack2, tgs)
    loop = np.array([[h(stack2[i, j], tgs[i]) for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(nested, loop, rtol=1e-6)
    gv = jax.jit(jax.vmap(jax.grad(h), in_axes=(0, None)))(stack, targets)
    np.testing.assert_allclose(gv[1], jax.grad(h)(stack[1], targets), rtol=1e-6)


def test_concatenated_targets_under_jit():
    logp, targets, il, tl = _batch(4)
    concat = np.concatenate([targets[b, : tl[b]] for b in range(len(tl))])
    want = dj.ctc_loss(logp, targets, il, tl, reduction="none")
    got = jax.jit(lambda x, t, i, l: dj.ctc_loss(x, t, i, l, reduction="none"))(logp, concat, il, tl)
    np.testing.assert_array_equal(got, want)


def test_x64_on_gives_float64_and_matches_torch():
    with jax.enable_x64(True):
        logp, targets, il, tl = _batch(5)
        lp64 = logp.astype(np.float64)
        v, g = jax.value_and_grad(lambda x: dj.ctc_loss(x, targets, il, tl, reduction="sum"))(lp64)
        assert v.dtype == jnp.float64 and g.dtype == jnp.float64
        x = torch.tensor(lp64, requires_grad=True)
        ref = torch.nn.functional.ctc_loss(x, torch.from_numpy(targets).long(),
                                           torch.from_numpy(il).long(),
                                           torch.from_numpy(tl).long(), reduction="sum")
        np.testing.assert_allclose(float(v), ref.item(), rtol=1e-12)
        # float32 stays float32 with x64 on
        v32 = dj.ctc_loss(logp, targets, il, tl)
        assert v32.dtype == jnp.float32
        check_grads(lambda x: dj.ctc_loss(x, targets, il, tl, reduction="mean"), (lp64,),
                    order=1, modes=("rev",))


def test_check_grads_float32_x64_off():
    logp, targets, il, tl = _batch(6, t_max=10, n=2, n_cls=4, s_max=3)
    check_grads(lambda x: dj.ctc_loss(x, targets, il, tl, reduction="sum"), (logp,), order=1,
                modes=("rev",), atol=5e-2, rtol=5e-2)


def test_unbatched_and_zero_infinity():
    logp, targets, il, tl = _batch(7, n=1)
    a = dj.ctc_loss(logp[:, 0], targets[0, : tl[0]], il[0], tl[0], reduction="none")
    b = dj.ctc_loss(logp, targets, il, tl, reduction="none")[0]
    assert a.shape == () and float(a) == float(b)
    z = dj.ctc_loss(np.zeros((3, 1, 4), np.float32), np.array([[1, 1, 2]]), np.array([3]),
                    np.array([3]), reduction="none", zero_infinity=True)
    assert float(z[0]) == 0.0


def test_traced_invalid_labels_give_nan_and_eager_raises():
    logp, targets, il, tl = _batch(8, n=2)
    bad = targets.copy()
    bad[1, 0] = 99
    with pytest.raises(ValueError, match=r"ctc_loss: argument 'targets' must hold labels in \[0, 7\)"):
        dj.ctc_loss(logp, bad, il, tl)
    out = jax.jit(lambda t: dj.ctc_loss(logp, t, il, tl, reduction="none"))(bad)
    assert np.isfinite(out[0]) and np.isnan(out[1])
