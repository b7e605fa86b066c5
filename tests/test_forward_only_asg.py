"""An ASG loss is the same number with or without a gradient (issue #10, point 1).

Long sequences flush linear-space cells that race ahead of the bulk; before the
fix the no-gradient path (``torch.no_grad``, ``jax.jit(loss)``) returned the
flushed forward's value.  The reference is an independent vectorised log-space
forward in numpy (normaliser over all labellings, numerator over the target's
segmentations), for ASG with transitions and the all-alignments variant.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from duoloss.core.losses.asg import asg_loss_and_grad


def _lse(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.squeeze(m, axis) + np.log(np.exp(x - m).sum(axis))


def numpy_asg(em, trans, start, target):
    """Exact loss of one sequence in log space; ``em (T, C)``, ``trans[i, j]``: j -> i."""
    t_len, n_cls = em.shape
    start = np.zeros(n_cls) if start is None else start
    tr = np.zeros((n_cls, n_cls)) if trans is None else trans
    a = start + em[0]
    for t in range(1, t_len):
        a = _lse(tr + a[None, :], 1) + em[t]
    logz = _lse(a, 0)
    lab = np.asarray(target)
    stay = tr[lab, lab]
    adv = np.full(len(lab), -np.inf)
    adv[1:] = tr[lab[1:], lab[:-1]]
    n = np.full(len(lab), -np.inf)
    n[0] = start[lab[0]] + em[0, lab[0]]
    for t in range(1, t_len):
        moved = np.full(len(lab), -np.inf)
        moved[1:] = n[:-1] + adv[1:]
        n = np.logaddexp(n + stay, moved) + em[t, lab]
    return logz - n[-1]


CASES = [(5000, 6, 250), (10000, 5, 500), (20000, 4, 1000)]


def _case(t_len, n_cls, n_lab, n=1, scale=3.0, seed=0):
    rng = np.random.default_rng(seed + t_len)
    em = scale * rng.standard_normal((t_len, n, n_cls))
    trans = rng.standard_normal((n_cls, n_cls))
    start = rng.standard_normal(n_cls)
    target = rng.integers(0, n_cls, (n, n_lab))
    return em, trans, start, target


@pytest.mark.parametrize("with_trans", [True, False])
@pytest.mark.parametrize("t_len,n_cls,n_lab", CASES)
def test_core_long_sequences_without_gradient_are_exact(t_len, n_cls, n_lab, with_trans):
    em, trans, start, target = _case(t_len, n_cls, n_lab)
    tr = trans if with_trans else None
    args = (em, tr, target, [t_len], [n_lab])
    no_grad, _ = asg_loss_and_grad(*args, start_transitions=start, want_grad=(False,) * 3)
    with_grad, _ = asg_loss_and_grad(*args, start_transitions=start, want_grad=(True,) * 3)
    reference = numpy_asg(em[:, 0], tr, start, target[0])
    assert no_grad[0] == with_grad[0]
    np.testing.assert_allclose(no_grad[0], reference, rtol=1e-10)


@pytest.mark.parametrize("with_trans", [True, False])
def test_torch_no_grad_equals_requires_grad(with_trans):
    import duoloss.torch as dt

    em, trans, start, target = _case(10000, 5, 500, n=2)
    il, tl = torch.tensor([10000, 4000]), torch.tensor([500, 200])
    emt = torch.from_numpy(em)
    tr = torch.from_numpy(trans) if with_trans else None
    st_ = torch.from_numpy(start)
    with torch.no_grad():
        a = dt.asg_loss(emt, tr, torch.from_numpy(target), il, tl, start_transitions=st_,
                        reduction="none")
    x = emt.clone().requires_grad_(True)
    b = dt.asg_loss(x, tr, torch.from_numpy(target), il, tl, start_transitions=st_,
                    reduction="none")
    b.sum().backward()
    assert torch.equal(a, b.detach())
    ref = numpy_asg(em[:, 0], trans if with_trans else None, start, target[0])
    np.testing.assert_allclose(a[0].item(), ref, rtol=1e-10)


@pytest.mark.parametrize("with_trans", [True, False])
def test_jax_jit_loss_equals_value_and_grad(with_trans):
    import jax
    import jax.numpy as jnp
    import duoloss.jax as dj

    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        _jax_jit_case(with_trans)
    finally:
        jax.config.update("jax_enable_x64", old)


def _jax_jit_case(with_trans):
    import jax
    import jax.numpy as jnp
    import duoloss.jax as dj

    em, trans, start, target = _case(10000, 5, 500)
    tr = jnp.asarray(trans) if with_trans else None
    il, tl = jnp.asarray([10000]), jnp.asarray([500])

    def loss(e):
        return dj.asg_loss(e, tr, jnp.asarray(target), il, tl,
                           start_transitions=jnp.asarray(start), reduction="sum")

    e = jnp.asarray(em)
    v1 = jax.jit(loss)(e)
    v2, _ = jax.jit(jax.value_and_grad(loss))(e)
    assert np.asarray(v1) == np.asarray(v2)
    ref = numpy_asg(em[:, 0], trans if with_trans else None, start, target[0])
    np.testing.assert_allclose(float(v1), ref, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t_len=st.integers(1, 400), n_cls=st.integers(1, 5),
       scale=st.sampled_from([1.0, 30.0, 300.0, 1000.0]), with_trans=st.booleans())
def test_property_no_grad_loss_is_bit_identical(seed, t_len, n_cls, scale, with_trans):
    rng = np.random.default_rng(seed)
    n = 2
    em = scale * rng.standard_normal((t_len, n, n_cls))
    trans = scale * rng.standard_normal((n_cls, n_cls)) if with_trans else None
    start = rng.standard_normal(n_cls)
    tl = rng.integers(1, t_len + 1, n)
    target = rng.integers(0, n_cls, (n, int(tl.max())))
    args = (em, trans, target, [t_len, max(1, t_len // 2)], np.minimum(tl, [t_len, max(1, t_len // 2)]))
    a, _ = asg_loss_and_grad(*args, start_transitions=start, want_grad=(False,) * 3)
    b, _ = asg_loss_and_grad(*args, start_transitions=start, want_grad=(True,) * 3)
    np.testing.assert_array_equal(a, b)
    if t_len <= 60:
        ref = numpy_asg(em[:, 0], trans, start, target[0, :args[4][0]])
        # log-space sums round at about eps times the size of the scores they add
        # (up to scale * t_len): a loss near 0 (p close to 1) is exact only to that
        # absolute error, whatever its own size (seed 245, t_len 1, scale 300: 1.5e-15)
        np.testing.assert_allclose(a[0], ref, rtol=1e-9, atol=1e-13 * scale * t_len)


def test_core_seed0_draw_no_grad_equals_grad():
    rng = np.random.default_rng(0)
    em = 3 * rng.standard_normal((10000, 1, 5))
    tr = rng.standard_normal((5, 5))
    y = rng.integers(0, 5, (1, 500))
    a, _ = asg_loss_and_grad(em, tr, y, [10000], [500], want_grad=(False,) * 3)
    b, _ = asg_loss_and_grad(em, tr, y, [10000], [500], want_grad=(True,) * 3)
    assert a[0] == b[0]
