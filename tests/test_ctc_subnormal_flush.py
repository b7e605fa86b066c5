"""CTC's kernel flushes subnormal gradient entries in its own stores (issue 27, point 8).

The reductions used to make a second pass over every CTC gradient to flush
subnormals (XLA on CPU flushes them, so both frontends must receive buffers
without any); the kernel now flushes while it stores, and the pass is skipped.
Reference: the textbook float64 log-space CTC of ``tests/ctc_reference.py`` (no
duoloss code), times the reduction weight, rounded to the input dtype.  Entries
whose reference is subnormal in that dtype must come back as zeros of the
reference's sign (``-0.0``: the gradient is ``-posterior``); all others must
match the reference; no entry may be subnormal, on the linear-space path
(float32) and the log-space fallback (float64, posteriors near ``e^-740``), in
the core and through both frontends.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctc_reference import log_space_ctc
from duoloss.core.losses.ctc import ctc_loss_and_grad

T, N, C = 12, 3, 5
TARGETS = np.array([[1, 2, 3], [2, 1, 4], [3, 4, 1]])
IN_LEN = np.array([T, T, T - 2])
TG_LEN = np.array([3, 3, 3])


def _scores(dtype, gap):
    """Uniform frames, label 1 ``gap`` nats less likely on frames 3-6: the
    posteriors of label 1 there are about ``exp(-gap)``."""
    lp = np.log(np.full((T, N, C), 1.0 / C))
    lp[3:7, :, 1] -= gap
    return lp.astype(dtype)


def _reference(lp, weights):
    ref = np.zeros(lp.shape, np.float64)
    for b in range(N):
        _, g = log_space_ctc(lp[:IN_LEN[b], b].astype(np.float64), TARGETS[b, :TG_LEN[b]])
        ref[:IN_LEN[b], b] = g * weights[b]
    return ref.astype(lp.dtype)


def _check(grad, ref):
    tiny = np.finfo(grad.dtype).tiny
    sub = (ref != 0) & (np.abs(ref) < tiny)
    assert sub.sum() >= 3, "the case must produce subnormal gradient entries"
    assert not ((grad != 0) & (np.abs(grad) < tiny)).any()
    assert (grad[sub] == 0).all() and np.signbit(grad[sub]).all()
    rtol = 1e-4 if grad.dtype == np.float32 else 1e-9
    np.testing.assert_allclose(grad[~sub], ref[~sub], rtol=rtol, atol=0)


CASES = [("float32", 92.0), ("float32", 97.0), ("float64", 735.0)]


@pytest.mark.parametrize("dtype,gap", CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_core_gradient_has_no_subnormals(dtype, gap, weighted):
    lp = _scores(dtype, gap)
    w = np.array([1.0, 0.5, 1e-3]) if weighted else np.ones(N)
    _, grad = ctc_loss_and_grad(lp, TARGETS, IN_LEN, TG_LEN,
                                grad_weights=w if weighted else None)
    _check(grad, _reference(lp, w))


@pytest.mark.parametrize("dtype,gap", CASES[:1] + CASES[2:])
def test_frontends_receive_the_flushed_gradient(dtype, gap):
    torch = pytest.importorskip("torch")
    import duoloss.torch as dt

    lp = _scores(dtype, gap)
    ref = _reference(lp, np.ones(N))
    x = torch.tensor(lp, requires_grad=True)
    dt.ctc_loss(x, torch.tensor(TARGETS), torch.tensor(IN_LEN), torch.tensor(TG_LEN),
                reduction="sum").backward()
    _check(x.grad.numpy(), ref)
    if dtype == "float32":  # (JAX without x64: float32)
        jax = pytest.importorskip("jax")
        import duoloss.jax as dj

        g = jax.grad(lambda a: dj.ctc_loss(a, TARGETS, IN_LEN, TG_LEN, reduction="sum"))(lp)
        _check(np.asarray(g), ref)
