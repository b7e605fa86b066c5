"""torch ``ctc_align`` / ``rnnt_align`` with ``impl='device'`` (duoloss/torch/_device_align.py:
max-plus loops in torch operations with one-byte back-pointers) against the host path (the
numba core is the oracle): the same labels/frames/tokens and the same scores bit for bit, in
every dtype; ties (uniform inputs) broken by the core's rule; -inf, NaN, infeasible and empty
(T=0, N=0, S=0) cases; torch device == JAX device (x64 on: bit for bit); a bad ``impl``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import duoloss.torch as dt

DTYPES = [torch.float32, torch.float64]


def bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    if a.is_floating_point():
        a64, b64 = a.double(), b.double()
        assert torch.equal(torch.isnan(a64), torch.isnan(b64))
        ok = ~torch.isnan(a64)
        assert torch.equal(a64[ok], b64[ok])       # bit-exact (float values compared exactly)
    else:
        assert torch.equal(a, b)


def ctc_both(*args, **kw):
    host = dt.ctc_align(*args, impl="host", **kw)
    dev = dt.ctc_align(*args, impl="device", **kw)
    for h, d in zip(host, dev):
        bits_equal(h, d)
    return host


def ctc_case(dtype, seed=0, t=9, n=7, c=5, s=4):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn((t, n, c), generator=g, dtype=torch.float64).log_softmax(-1).to(dtype)
    tg = torch.randint(1, c, (n, s), generator=g)
    tg[0, 1] = tg[0, 0]                                # a repeat: a blank in between
    il = torch.tensor([t, t - 2, 3, 0, 0, 2, t])[:n]   # zero frames with and without targets
    tl = torch.tensor([4, 3, 2, 0, 1, 2, 0])[:n]
    tg[5, 1] = tg[5, 0]                                # a repeat in 2 frames: infeasible
    return lp, tg, il, tl


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
def test_ctc_random_equals_host(dtype):
    lp, tg, il, tl = ctc_case(dtype)
    labels, scores = ctc_both(lp, tg, il, tl)
    assert scores[3] == 0 and scores[4] == -math.inf and scores[5] == -math.inf
    assert (labels[[3, 4, 5]] == -1).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_ctc_ties_neg_inf_nan(dtype):
    t, n, c = 6, 3, 3
    lp = torch.full((t, n, c), -math.log(c), dtype=dtype)   # uniform: every path ties
    tg = torch.tensor([[1, 2], [1, 1], [2, 0]])
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([2, 2, 1])
    labels, scores = ctc_both(lp, tg, il, tl)
    # the core's rule: stay > advance > skip on the backtrace, labels as early as possible
    assert labels[0].tolist() == [1, 2, 0, 0, 0, 0]
    assert float(scores[0]) == pytest.approx(-6 * math.log(3))
    lp2 = lp.clone()
    lp2[:, 0, 1] = -math.inf                              # label 1 impossible: -inf score
    lp2[2, 1, 0] = math.nan                               # a NaN frame in sequence 1
    lp2[1, 2, 2] = -math.inf                              # one -inf entry: a detour
    labels, scores = ctc_both(lp2, tg, il, tl)
    assert scores[0] == -math.inf and (labels[0] == -1).all()
    assert math.isnan(float(scores[1]))
    assert math.isfinite(float(scores[2]))


def test_ctc_empty_shapes_unbatched_concatenated():
    for shape, tg, il, tl in [((0, 2, 3), torch.zeros((2, 0), dtype=torch.int64), [0, 0], [0, 0]),
                              ((4, 0, 3), torch.zeros((0, 2), dtype=torch.int64), [], []),
                              ((4, 2, 3), torch.zeros((2, 0), dtype=torch.int64), [4, 2], [0, 0])]:
        lp = torch.randn(shape, dtype=torch.float64).log_softmax(-1)
        ctc_both(lp, tg, torch.tensor(il, dtype=torch.int64), torch.tensor(tl, dtype=torch.int64))
    lp = torch.randn((5, 3), dtype=torch.float64).log_softmax(-1)
    labels, scores = ctc_both(lp, torch.tensor([1, 2]), torch.tensor(5), torch.tensor(2))
    assert labels.shape == (5,) and scores.shape == ()
    lp, tg, il, tl = ctc_case(torch.float64, seed=3)
    flat = torch.cat([tg[b, :tl[b]] for b in range(tg.shape[0])])
    ctc_both(lp, flat, il, tl)


def rnnt_both(*args, **kw):
    host = dt.rnnt_align(*args, impl="host", **kw)
    dev = dt.rnnt_align(*args, impl="device", **kw)
    for h, d in zip(host, dev):
        bits_equal(h, d)
    return host


def rnnt_case(dtype, seed=0, n=4, t=5, u=3, c=4):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((n, t, u + 1, c), generator=g, dtype=torch.float64).to(dtype)
    tg = torch.randint(0, c - 1, (n, u), generator=g)
    return logits, tg, torch.tensor([t, 3, 0, 1])[:n], torch.tensor([u, 1, 0, 2])[:n]


@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
def test_rnnt_random_equals_host(dtype, fused):
    logits, tg, il, tl = rnnt_case(dtype)
    align, frames, scores = rnnt_both(logits, tg, il, tl, fused_log_softmax=fused)
    assert math.isfinite(float(scores[3]))                      # T_b = 1, U_b = 2: both labels on frame 0
    assert frames[3].tolist() == [0, 0, -1] and (align[3, 3:] == -1).all()
    assert scores[2] == 0                                        # T_b = U_b = 0: the empty path


@pytest.mark.parametrize("dtype", DTYPES)
def test_rnnt_ties_neg_inf_nan_empty(dtype):
    logits = torch.zeros((3, 3, 3, 3), dtype=dtype)              # uniform: every alignment ties
    tg = torch.tensor([[0, 1], [1, 0], [0, 0]])
    il, tl = torch.tensor([3, 2, 0]), torch.tensor([2, 1, 1])
    align, frames, scores = rnnt_both(logits, tg, il, tl)
    assert frames[0].tolist() == [2, 2]                          # labels as late as possible
    assert scores[2] == -math.inf and (align[2] == -1).all()     # T_b = 0 < U_b: infeasible
    logits2 = logits.clone()
    logits2[1, 0, 0, 1] = math.nan
    logits2[0, 2, 2, 2] = -math.inf                              # the blank at the end: no path
    logits2[0, :, :, 0] = -math.inf
    align, frames, scores = rnnt_both(logits2, tg, il, tl, fused_log_softmax=False)
    assert scores[0] == -math.inf and (frames[0] == -1).all() and (align[0] == -1).all()
    assert math.isnan(float(scores[1])) and (align[1] == -1).all()   # NaN propagates
    for shape, u in [((2, 0, 1, 3), 0), ((0, 3, 2, 3), 1), ((2, 3, 1, 3), 0)]:
        n, t = shape[:2]
        rnnt_both(torch.randn(shape, dtype=dtype), torch.zeros((n, u), dtype=torch.int64),
                  torch.full((n,), t), torch.full((n,), u))


def test_torch_device_equals_jax_device():
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj
    with jax.enable_x64(True):
        lp, tg, il, tl = ctc_case(torch.float64, seed=5)
        tl_ = dt.ctc_align(lp, tg, il, tl, impl="device")
        jl = dj.ctc_align(lp.numpy(), tg.numpy(), il.numpy(), tl.numpy(), impl="device")
        np.testing.assert_array_equal(tl_[0].numpy(), np.asarray(jl[0]))
        np.testing.assert_array_equal(tl_[1].numpy(), np.asarray(jl[1]))
        logits, tg, il, tl = rnnt_case(torch.float64, seed=5)
        out_t = dt.rnnt_align(logits, tg, il, tl, impl="device")
        out_j = dj.rnnt_align(logits.numpy(), tg.numpy(), il.numpy(), tl.numpy(), impl="device")
        for a, b in zip(out_t, out_j):
            np.testing.assert_array_equal(a.numpy(), np.asarray(b))


def test_bad_impl():
    lp, tg, il, tl = ctc_case(torch.float64)
    with pytest.raises(ValueError, match="ctc_align: argument 'impl' must be one of"):
        dt.ctc_align(lp, tg, il, tl, impl="gpu")
    logits, tg, il, tl = rnnt_case(torch.float64)
    with pytest.raises(ValueError, match="rnnt_align: argument 'impl' must be one of"):
        dt.rnnt_align(logits, tg, il, tl, impl=None)


@pytest.mark.parametrize("seed", range(4))
def test_many_ties_equal_host(seed):
    """Scores rounded to whole numbers: many equal-score paths, broken by the core's rules."""
    g = torch.Generator().manual_seed(100 + seed)
    lp = -torch.randint(0, 3, (8, 5, 4), generator=g).to(torch.float64)
    tg = torch.randint(1, 4, (5, 3), generator=g)
    ctc_both(lp, tg, torch.tensor([8, 7, 6, 5, 4]), torch.tensor([3, 2, 3, 1, 2]))
    logits = torch.randint(0, 2, (3, 5, 4, 4), generator=g).to(torch.float32)
    tg = torch.randint(0, 3, (3, 3), generator=g)
    for fused in (True, False):
        rnnt_both(logits, tg, torch.tensor([5, 4, 2]), torch.tensor([3, 2, 3]),
                  fused_log_softmax=fused)
