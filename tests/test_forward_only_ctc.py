"""A CTC loss is the same number with or without a gradient (issue #10, point 1).

Long sequences with spread-out posteriors make the rescaled linear-space forward
flush trellis cells that race ahead of the bulk.  Before the fix, the
no-gradient path (``torch.no_grad``, ``jax.jit(loss)``) returned the flushed
forward's value: 170 nats off at T = 8000, C = 32, L = 400 (the reproducer
below).  References here are independent: a vectorised log-space forward in
numpy, torch's own float64 ``F.ctc_loss`` and a numpy Viterbi.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from duoloss.core.losses.ctc import ctc_loss_and_grad
from duoloss.core.losses.align import ctc_align as core_ctc_align


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _ext(target, blank):
    ext = np.full(2 * len(target) + 1, blank, np.int64)
    ext[1::2] = target
    skip = np.zeros(len(ext), bool)
    skip[2:] = (ext[2:] != blank) & (ext[2:] != ext[:-2])
    return ext, skip


def numpy_log_forward(logp, target, blank=0, semiring=np.logaddexp):
    """log Z (or the Viterbi score with ``np.maximum``), vectorised over states."""
    ext, skip = _ext(np.asarray(target), blank)
    a = np.full(len(ext), -np.inf)
    a[:2] = logp[0, ext[:2]]
    for t in range(1, logp.shape[0]):
        prev = a.copy()
        a[1:] = semiring(a[1:], prev[:-1])
        a[2:] = np.where(skip[2:], semiring(a[2:], prev[:-2]), a[2:])
        a = a + logp[t, ext]
    return semiring(a[-1], a[-2]) if len(ext) > 1 else a[-1]


CASES = [(5000, 32, 500), (10000, 20, 400), (20000, 16, 300)]


@pytest.mark.parametrize("t_len,n_cls,n_lab", CASES)
def test_core_long_sequences_without_gradient_are_exact(t_len, n_cls, n_lab):
    rng = np.random.default_rng(t_len)
    logp = _log_softmax(rng.standard_normal((t_len, 1, n_cls)))
    target = rng.integers(1, n_cls, (1, n_lab))
    no_grad, _ = ctc_loss_and_grad(logp, target, [t_len], [n_lab], want_grad=False)
    with_grad, _ = ctc_loss_and_grad(logp, target, [t_len], [n_lab], want_grad=True)
    reference = -numpy_log_forward(logp[:, 0], target[0])
    assert no_grad[0] == with_grad[0]
    np.testing.assert_allclose(no_grad[0], reference, rtol=1e-11)
    torch_ref = F.ctc_loss(torch.from_numpy(logp), torch.from_numpy(target), [t_len], [n_lab],
                           reduction="none")
    np.testing.assert_allclose(no_grad[0], torch_ref.item(), rtol=1e-11)


def _reproducer(dtype=torch.float64):
    torch.manual_seed(0)
    t_len, n_cls, n_lab = 8000, 32, 400
    lp = torch.randn(t_len, 2, n_cls, dtype=torch.float64).log_softmax(-1).to(dtype)
    targets = torch.randint(1, n_cls, (2, n_lab))
    return lp, targets, torch.tensor([t_len, 3000]), torch.tensor([n_lab, 150])


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_torch_no_grad_equals_requires_grad(reduction):
    import duoloss.torch as dt

    lp, targets, il, tl = _reproducer()
    with torch.no_grad():
        validation = dt.ctc_loss(lp, targets, il, tl, reduction=reduction)
    x = lp.clone().requires_grad_()
    training = dt.ctc_loss(x, targets, il, tl, reduction=reduction)
    training.sum().backward()
    assert torch.equal(validation, training.detach())
    reference = F.ctc_loss(lp, targets, il, tl, reduction=reduction)
    torch.testing.assert_close(validation, reference, rtol=1e-11, atol=0)


def test_jax_jitted_loss_equals_value_and_grad():
    # float32 in (jax_enable_x64 off, the default): the kernel still computes in
    # float64 and both paths cast the same float64 loss.  (Under the
    # ``jax.enable_x64`` *context manager*, a long-running callback executes on
    # a JAX worker thread where the context is not set, and JAX's own output
    # check rejects the float64 result; with the global flag it works.)
    import jax
    import duoloss.jax as dj

    lp, targets, il, tl = _reproducer(torch.float32)
    args = (targets.numpy(), il.numpy(), tl.numpy())

    def f(x):
        return dj.ctc_loss(x, *args, reduction="sum")

    x = jax.numpy.asarray(lp.numpy())
    loss_only = jax.jit(f)(x)
    loss, _ = jax.jit(jax.value_and_grad(f))(x)
    assert np.asarray(loss_only) == np.asarray(loss)
    reference = F.ctc_loss(lp.double(), targets, il, tl, reduction="sum")
    np.testing.assert_allclose(np.asarray(loss_only), reference.item(), rtol=1e-6)


def test_float32_inputs_agree_too():
    import duoloss.torch as dt

    lp, targets, il, tl = _reproducer(torch.float32)
    with torch.no_grad():
        validation = dt.ctc_loss(lp, targets, il, tl, reduction="none")
    training = dt.ctc_loss(lp.clone().requires_grad_(), targets, il, tl, reduction="none")
    assert torch.equal(validation, training.detach())
    reference = F.ctc_loss(lp.double(), targets, il, tl, reduction="none")
    torch.testing.assert_close(validation.double(), reference, rtol=1e-6, atol=0)


def test_ctc_align_is_exact_on_long_sequences():
    rng = np.random.default_rng(7)
    t_len, n_cls, n_lab = 10000, 20, 400
    logp = _log_softmax(rng.standard_normal((t_len, 1, n_cls)))
    target = rng.integers(1, n_cls, (1, n_lab))
    _, scores = core_ctc_align(logp, target, np.array([t_len]), np.array([n_lab]))
    reference = numpy_log_forward(logp[:, 0], target[0], semiring=np.maximum)
    np.testing.assert_allclose(scores[0], reference, rtol=1e-12)


@st.composite
def _batches(draw):
    n = draw(st.integers(1, 4))
    n_cls = draw(st.integers(2, 12))
    t_max = draw(st.sampled_from([1, 5, 40, 300, 1500]))
    scale = draw(st.sampled_from([0.3, 1.0, 5.0, 60.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    logp = _log_softmax(scale * rng.standard_normal((t_max, n, n_cls)))
    if draw(st.booleans()):
        logp[rng.random(logp.shape) < 0.05] = -np.inf
    il = rng.integers(0, t_max + 1, n)
    s_max = max(1, min(t_max // 2, 200))
    tl = rng.integers(0, s_max + 1, n)
    targets = rng.integers(1, n_cls, (n, s_max)) if n_cls > 1 else np.ones((n, s_max), int)
    return logp, targets, il, tl


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_batches(), st.booleans())
def test_property_loss_is_bitwise_the_same_with_or_without_gradient(batch, zero_infinity):
    logp, targets, il, tl = batch
    a, _ = ctc_loss_and_grad(logp, targets, il, tl, want_grad=False, zero_infinity=zero_infinity)
    b, _ = ctc_loss_and_grad(logp, targets, il, tl, want_grad=True, zero_infinity=zero_infinity)
    np.testing.assert_array_equal(a, b)
