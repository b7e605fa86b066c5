"""The same bits everywhere: reductions computed once, in the core, in no framework's order.

* the core's reduction (``duoloss.core._reduce``) against exact rational arithmetic;
* torch == JAX bit for bit for every reduced loss (CTC, ASG with shared transitions,
  graph losses incl. the LF-MMI denominator), x64 on and off, for a unit cotangent and
  a scaled one, with subnormal gradient entries (flushed in both);
* eager == ``torch.compile`` bit for bit for ``ctc_loss`` 'mean'/'sum' and for the
  default training call of ``rnnt_loss`` (``fullgraph=True``);
* 1 vs 2 numba threads give the same bits;
* the numeric defects of issue 19 point 6: RNN-T with large tied logits (analytic
  loss and gradient) and CTC with raw scores of 1e100 (gradient in [-1, 0]).
"""
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from duoloss.core._reduce import (flush_subnormals, reduce_losses, reduction_weights,
                                  weighted_sum)


# ---- the core reduction ----------------------------------------------------

def test_weighted_sum_is_correctly_rounded_in_any_order():
    # naive left-to-right float64 summation gives 1.0 here; the exact sum is 2
    losses = np.array([1e16, 1.0, -1e16, 1.0])
    assert float(np.float64(1e16) + 1.0 - 1e16 + 1.0) == 1.0
    assert float(weighted_sum(losses, np.ones(4))) == 2.0
    rng = np.random.default_rng(0)
    x = rng.normal(size=257) * 10.0 ** rng.integers(-8, 9, size=257)
    w = reduction_weights("mean", 257, rng.integers(0, 9, size=257))
    exact = sum(Fraction(float(np.float64(a) * b)) for a, b in zip(x, w))  # products rounded
    got = weighted_sum(x, w)
    assert float(got) == float(exact)  # correctly rounded sum of the rounded products
    for perm in (rng.permutation(257) for _ in range(3)):
        assert weighted_sum(x[perm], w[perm]) == got


def test_reduction_weights_and_reduce_losses_conventions():
    lengths = np.array([3, 0, 5])
    np.testing.assert_array_equal(reduction_weights("mean", 3, lengths),
                                  [1 / 9, 1 / 3, 1 / 15])
    np.testing.assert_array_equal(reduction_weights("mean", 3), [1 / 3] * 3)
    np.testing.assert_array_equal(reduction_weights("sum", 3), [1.0] * 3)
    assert reduction_weights("none", 3) is None
    losses = np.array([3.0, 2.0, 15.0], np.float32)
    assert reduce_losses(losses, "mean", lengths) == 2.0  # (3/3 + 2/1 + 15/5) / 3
    assert reduce_losses(losses, "mean", lengths).dtype == np.float32
    assert reduce_losses(np.zeros(0), "mean") == 0.0
    assert np.isnan(reduce_losses(np.zeros(0), "mean", k2_mean=True))
    assert np.isposinf(reduce_losses(np.array([1.0, np.inf]), "sum"))
    assert np.isnan(reduce_losses(np.array([np.inf, -np.inf]), "sum"))
    assert np.isnan(reduce_losses(np.array([np.nan, 1.0]), "sum"))
    with pytest.raises(ValueError, match="reduction_weights: argument 'reduction'"):
        reduction_weights("avg", 3)


def test_flush_subnormals_keeps_signs_and_normals():
    a = np.array([-2.3e-40, 2.3e-40, 1.2e-38, -np.inf, np.nan, 0.0, 1.0], np.float32)
    flush_subnormals(a)
    assert np.signbit(a[0]) and a[0] == 0 and not np.signbit(a[1]) and a[1] == 0
    assert a[2] == np.float32(1.2e-38) and np.isneginf(a[3]) and np.isnan(a[4])
    b = np.array([5e-310, -5e-310, 3e-308])
    flush_subnormals(b)
    assert b[0] == 0 and np.signbit(b[1]) and b[2] == 3e-308


# ---- torch == JAX ----------------------------------------------------------

def _ctc_batch(seed, dtype, n=5, t_max=12, n_cls=6, s=3):
    rng = np.random.default_rng(seed)
    lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, n))).astype(dtype)
    tg = rng.integers(1, n_cls, size=(n, s))
    il = rng.integers(2 * s + 1, t_max + 1, size=n)
    tl = rng.integers(0, s + 1, size=n)
    return lp, tg, il, tl


def _torch_ctc(lp, tg, il, tl, reduction, scale=1.0):
    x = torch.tensor(lp, requires_grad=True)
    loss = dt.ctc_loss(x, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                       reduction=reduction)
    (loss.sum() * scale).backward()
    return loss.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("reduction,scale", [("sum", 1.0), ("mean", 1.0), ("none", 1.0),
                                             ("mean", 0.37), ("none", 0.37)])
def test_ctc_torch_equals_jax(x64, reduction, scale):
    dtype = np.float64 if x64 else np.float32
    lp, tg, il, tl = _ctc_batch(1, dtype)
    lt, gt = _torch_ctc(lp, tg, il, tl, reduction, scale)
    with jax.enable_x64(x64):
        f = lambda x: dj.ctc_loss(x, tg, il, tl, reduction=reduction)  # noqa: E731
        lj = f(jnp.asarray(lp))
        gj = jax.grad(lambda x: f(x).sum() * scale)(jnp.asarray(lp))
    assert lj.dtype == dtype
    assert np.array_equal(np.asarray(lj), lt) and np.array_equal(np.asarray(gj), gt)
    if reduction != "none":  # the value the core promises: the correctly rounded sum
        per = dt.ctc_loss(torch.tensor(lp), torch.tensor(tg), torch.tensor(il),
                          torch.tensor(tl), reduction="none").numpy()
        w = [Fraction(1, len(tl) * max(int(k), 1)) if reduction == "mean" else Fraction(1)
             for k in tl]
        exact = float(sum(Fraction(float(np.float64(p) * float(v))) for p, v in zip(per, w)))
        assert float(lt) == float(np.asarray(exact, dtype))


def test_ctc_unbatched_mean_torch_equals_jax():
    lp, tg, il, tl = _ctc_batch(2, np.float32, n=1)
    x = torch.tensor(lp[:, 0], requires_grad=True)
    lt = dt.ctc_loss(x, torch.tensor(tg[0]), int(il[0]), int(tl[0]))
    lt.backward()
    lj, gj = jax.value_and_grad(lambda z: dj.ctc_loss(z, tg[0], int(il[0]), int(tl[0])))(
        jnp.asarray(lp[:, 0]))
    assert np.array_equal(np.asarray(lj), lt.detach().numpy())
    assert np.array_equal(np.asarray(gj), x.grad.numpy())


def test_subnormal_gradient_entries_are_flushed_in_both_frontends():
    # a class with log-probability -92 on a path: its posterior ~1e-40 is subnormal in float32
    t_max, n_cls = 6, 4
    lp = np.full((t_max, 2, n_cls), -92.0)
    lp[:, :, 0] = 0.0
    lp[1, :, 1] = -0.5
    lp = lp.astype(np.float32)
    tg, il, tl = np.array([[1], [1]]), np.array([6, 6]), np.array([1, 1])
    for reduction in ("none", "sum", "mean"):
        for scale in (1.0, 1e-3):
            lt, gt = _torch_ctc(lp, tg, il, tl, reduction, scale)
            gj = jax.grad(lambda x: dj.ctc_loss(x, tg, il, tl, reduction=reduction).sum()
                          * scale)(jnp.asarray(lp))
            tiny = np.finfo(np.float32).tiny
            assert not ((gt != 0) & (np.abs(gt) < tiny)).any()
            assert np.array_equal(np.asarray(gj), gt)
            assert np.array_equal(np.signbit(np.asarray(gj)), np.signbit(gt))


@pytest.mark.parametrize("x64", [False, True])
def test_asg_shared_transitions_torch_equals_jax(x64):
    dtype = np.float64 if x64 else np.float32
    rng = np.random.default_rng(3)
    t_max, n, c = 8, 4, 5
    em = rng.normal(size=(t_max, n, c)).astype(dtype)
    tr = rng.normal(size=(c, c)).astype(dtype)
    tg = rng.integers(0, c, size=(n, 3))
    il, tl = np.array([8, 7, 6, 8]), np.array([3, 2, 1, 0])
    for reduction in ("sum", "mean"):
        e, t = torch.tensor(em, requires_grad=True), torch.tensor(tr, requires_grad=True)
        lt = dt.asg_loss(e, t, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                         reduction=reduction)
        lt.backward()
        with jax.enable_x64(x64):
            lj, (ge, gtr) = jax.value_and_grad(
                lambda a, b: dj.asg_loss(a, b, tg, il, tl, reduction=reduction),
                argnums=(0, 1))(jnp.asarray(em), jnp.asarray(tr))
        assert np.array_equal(np.asarray(lj), lt.detach().numpy())
        assert np.array_equal(np.asarray(ge), e.grad.numpy())
        assert np.array_equal(np.asarray(gtr), t.grad.numpy())


def test_jax_vmap_of_a_reduced_loss_is_each_instance_alone():
    lp, tg, il, tl = _ctc_batch(4, np.float32)
    f = jax.value_and_grad(lambda x: dj.ctc_loss(x, tg, il, tl, reduction="mean"))
    stacked = np.stack([lp, lp[::-1].copy()])
    vl, vg = jax.vmap(f)(jnp.asarray(stacked))
    for i in range(2):
        li, gi = f(jnp.asarray(stacked[i]))
        assert np.array_equal(np.asarray(vl[i]), np.asarray(li))
        assert np.array_equal(np.asarray(vg[i]), np.asarray(gi))


# ---- eager == compiled, thread counts -------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ctc_compiled_equals_eager_bit_for_bit(reduction):
    lp, tg, il, tl = _ctc_batch(5, np.float32, n=6, t_max=30, n_cls=12, s=6)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    le, ge = _torch_ctc(lp, tg, il, tl, reduction)
    fn = torch.compile(lambda x, *a: dt.ctc_loss(x, *a, reduction=reduction), fullgraph=True)
    x = torch.tensor(lp, requires_grad=True)
    loss = fn(x, *args)
    loss.backward()
    assert np.array_equal(loss.detach().numpy(), le) and np.array_equal(x.grad.numpy(), ge)


def test_rnnt_default_training_call_compiles_fullgraph_and_equals_eager():
    rng = np.random.default_rng(6)
    n, t_max, u, v = 3, 5, 3, 4
    logits = rng.normal(size=(n, t_max, u + 1, v)).astype(np.float32)
    tg = torch.tensor(rng.integers(0, v - 1, size=(n, u)))
    il, tl = torch.tensor([5, 4, 3]), torch.tensor([3, 2, 1])
    for reduction in ("mean", "sum"):
        a = torch.tensor(logits, requires_grad=True)
        eager = dt.rnnt_loss(a, tg, il, tl, reduction=reduction)  # no FastEmit, no penalty
        eager.backward()
        fn = torch.compile(lambda x: dt.rnnt_loss(x, tg, il, tl, reduction=reduction),
                           fullgraph=True)
        b = torch.tensor(logits, requires_grad=True)
        compiled = fn(b)
        compiled.backward()
        assert torch.equal(compiled, eager) and torch.equal(b.grad, a.grad)


def test_one_and_two_numba_threads_give_the_same_bits():
    lp, tg, il, tl = _ctc_batch(7, np.float32, n=16, t_max=40, n_cls=10, s=8)
    before = numba.get_num_threads()
    out = []
    try:
        for k in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(k)
            out.append(_torch_ctc(lp, tg, il, tl, "mean"))
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


# ---- issue 19 point 6: numeric defects --------------------------------------

@pytest.mark.parametrize("dtype,c", [(np.float64, 1e15), (np.float32, 3e5), (np.float32, 1e8)])
def test_rnnt_large_tied_logits_are_exact(dtype, c):
    """All V = 3 logits equal to c: every move has probability 1/3, so a sequence of T_b
    frames and U_b labels has loss -log(C(T_b + U_b - 1, U_b) 3^-(T_b + U_b)); with
    T = 1, U = 0 (one blank) the loss is log 3 and the gradient softmax - onehot(blank)
    = (1/3, 1/3, -2/3)."""
    tol = 8 * np.finfo(dtype).eps
    cases = [(1, 0), (2, 1)]
    for t_b, u_b in cases:
        x = np.full((1, t_b, u_b + 1, 3), c, dtype)
        tg = np.zeros((1, u_b), np.int64)
        exact = -math.log(math.comb(t_b + u_b - 1, u_b) * 3.0 ** -(t_b + u_b))
        a = torch.tensor(x, requires_grad=True)
        lt = dt.rnnt_loss(a, torch.tensor(tg), torch.tensor([t_b]), torch.tensor([u_b]),
                          reduction="sum")
        lt.backward()
        with jax.enable_x64(dtype == np.float64):
            lj, gj = jax.value_and_grad(lambda z: dj.rnnt_loss(
                z, tg, np.array([t_b]), np.array([u_b]), reduction="sum"))(jnp.asarray(x))
        assert abs(lt.item() - exact) <= tol * exact
        assert abs(float(lj) - exact) <= tol * exact
        if (t_b, u_b) == (1, 0):
            want = np.array([1 / 3, 1 / 3, -2 / 3])
            np.testing.assert_allclose(a.grad.numpy().reshape(3), want, rtol=tol, atol=tol)
            np.testing.assert_allclose(np.asarray(gj).reshape(3), want, rtol=tol, atol=tol)


def test_ctc_raw_scores_of_1e100_give_a_gradient_in_minus_one_zero():
    """Raw score 1e100 on the blank at every frame (not log-probabilities): the loss is
    -(3e100 + log 10) (the 10 paths with 3 blanks and labels 1, 2 dominate); the
    gradient -posterior lies in [-1, 0] and sums to -1 on every frame.  (Which of the
    tied best paths gets how much is below float64's resolution at 3e100.)"""
    t_max, c = 5, 4
    x = np.zeros((t_max, 1, c))
    x[:, 0, 0] = 1e100
    a = torch.tensor(x, requires_grad=True)
    lt = dt.ctc_loss(a, torch.tensor([[1, 2]]), torch.tensor([t_max]), torch.tensor([2]),
                     reduction="sum")
    lt.backward()
    assert lt.item() == pytest.approx(-3e100, rel=1e-15)
    g = a.grad.numpy()[:, 0]
    assert np.isfinite(g).all() and (g <= 0).all() and (g >= -1).all()
    np.testing.assert_allclose(g.sum(axis=1), -1.0, rtol=1e-12)
    assert (g[:, 3] == 0).all()  # class 3 is on no path
    with jax.enable_x64(True):
        gj = jax.grad(lambda z: dj.ctc_loss(z, np.array([[1, 2]]), np.array([t_max]),
                                            np.array([2]), reduction="sum"))(jnp.asarray(x))
    assert np.array_equal(np.asarray(gj), a.grad.numpy())
