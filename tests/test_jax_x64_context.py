"""The ``jax.enable_x64`` context manager is thread-local: a jitted computation whose
host callback runs on a thread without it (a JAX worker thread, for long
computations) must still return float64/int64 results.  Compiled under the
context and executed on a plain thread, every callback of duoloss used to fail
with JAX's "Incorrect output dtype ... Expected: float64, Actual: float32"."""
from __future__ import annotations

import threading

import jax
import numpy as np
import torch
import torch.nn.functional as F

import duoloss.jax as dj

T, N, C = 20, 2, 6
RNG = np.random.default_rng(0)
LOGP = np.log(RNG.dirichlet(np.ones(C), size=(T, N)))
TARGETS = np.array([[1, 2, 2], [3, 4, 0]])
IL, TL = np.array([20, 15]), np.array([3, 2])


def _run_on_plain_thread(compiled, *args):
    box = {}

    def work():
        try:
            box["out"] = compiled(*args)
        except Exception as e:  # noqa: BLE001 - reported below
            box["err"] = e

    th = threading.Thread(target=work)
    th.start()
    th.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def test_loss_gradient_and_alignment_compiled_under_x64_context_run_anywhere():
    def f(x):
        loss = dj.ctc_loss(x, TARGETS, IL, TL, reduction="sum")
        labels, scores = dj.ctc_align(x, TARGETS, IL, TL)
        return loss, labels, scores

    with jax.enable_x64(True):
        x = jax.numpy.asarray(LOGP)
        compiled = jax.jit(f).lower(x).compile()
        grad_fn = jax.jit(jax.grad(lambda x: f(x)[0])).lower(x).compile()
    loss, labels, scores = _run_on_plain_thread(compiled, x)
    grad = _run_on_plain_thread(grad_fn, x)
    assert loss.dtype == np.float64 and scores.dtype == np.float64 and grad.dtype == np.float64
    assert labels.dtype == np.int64
    lp = torch.from_numpy(LOGP).requires_grad_()
    reference = F.ctc_loss(lp, torch.from_numpy(TARGETS), torch.from_numpy(IL),
                           torch.from_numpy(TL), reduction="sum")
    reference.backward()
    np.testing.assert_allclose(float(loss), reference.item(), rtol=1e-12)
    # duoloss's gradient is the true -posterior; torch's is exp(lp) - posterior.
    valid = (np.arange(T)[:, None] < IL[None, :])[..., None]
    np.testing.assert_allclose(np.asarray(grad), lp.grad.numpy() - valid * np.exp(LOGP),
                               atol=1e-12)
    assert np.all(np.asarray(labels)[0, :20] >= 0) and np.all(np.asarray(labels)[1, 15:] == -1)
