"""duoloss.torch.ctc_loss against torch.nn.functional.ctc_loss and gradcheck."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import duoloss.torch as dt
from ctc_reference import random_batch


def _batch(seed, t_max=40, n=5, n_cls=7, s_max=10, **kw):
    rng = np.random.default_rng(seed)
    logp, targets, il, tl = random_batch(rng, t_max, n, n_cls, s_max, **kw)
    logits = torch.tensor(rng.normal(size=logp.shape), dtype=torch.float64, requires_grad=True)
    return logits, torch.from_numpy(targets), torch.from_numpy(il), torch.from_numpy(tl)


def _both(logits, targets, il, tl, **kw):
    """(ours, torch's): loss values and logits-gradients through log_softmax."""
    out = []
    for fn in (dt.ctc_loss, F.ctc_loss):
        x = logits.detach().clone().requires_grad_()
        loss = fn(x.log_softmax(-1), targets, il, tl, **kw)
        (g,) = torch.autograd.grad(loss.sum(), x)
        out.append((loss.detach(), g))
    return out


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_matches_torch_padded(reduction, zero_infinity, seed):
    logits, targets, il, tl = _batch(seed)
    (a, ga), (b, gb) = _both(logits, targets, il, tl, reduction=reduction,
                             zero_infinity=zero_infinity)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_matches_torch_concatenated_targets(reduction):
    logits, targets, il, tl = _batch(4)
    concat = torch.cat([targets[b, : tl[b]] for b in range(len(tl))])
    (a, ga), (b, gb) = _both(logits, concat, tuple(il.tolist()), tuple(tl.tolist()),
                             reduction=reduction)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)
    # padded and concatenated layouts give the same numbers
    pad = dt.ctc_loss(logits.log_softmax(-1), targets, il, tl, reduction=reduction)
    torch.testing.assert_close(pad, a, rtol=0, atol=0)


def test_matches_torch_random_shapes_repeats_empty_and_infeasible():
    rng = np.random.default_rng(0)
    for seed in range(6):
        t_max, n, c, s = (int(v) for v in rng.integers([2, 1, 2, 1], [30, 6, 9, 12]))
        logits, targets, il, tl = _batch(100 + seed, t_max, n, c, s, repeats=True)
        tl[0] = 0  # an empty target
        for zi in (False, True):
            (a, ga), (b, gb) = _both(logits, targets, il, tl, reduction="none",
                                     zero_infinity=zi)
            finite = torch.isfinite(b)
            assert torch.equal(torch.isinf(a), torch.isinf(b))  # same infeasible set
            torch.testing.assert_close(a[finite], b[finite], rtol=1e-12, atol=1e-10)
            if zi:  # torch's gradient for infinite losses is only defined under zero_infinity
                torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)


def test_infeasible_loss_is_inf_with_zero_gradient():
    lp = torch.zeros(3, 1, 4, dtype=torch.float64, requires_grad=True)
    loss = dt.ctc_loss(lp, torch.tensor([[1, 1, 2]]), [3], [3], reduction="sum")
    loss.backward()
    assert loss.item() == float("inf")
    assert torch.equal(lp.grad, torch.zeros_like(lp))


def test_unbatched_matches_torch():
    logits, targets, il, tl = _batch(5, n=1)
    for reduction in ("none", "sum", "mean"):
        x = logits[:, 0].detach().requires_grad_()
        a = dt.ctc_loss(x.log_softmax(-1), targets[0, : tl[0]], il[0], tl[0], reduction=reduction)
        b = F.ctc_loss(x.log_softmax(-1), targets[0, : tl[0]], il[0], tl[0], reduction=reduction)
        assert a.shape == b.shape == ()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_float32_matches_float64_closely():
    logits, targets, il, tl = _batch(6, t_max=200, n=4, n_cls=20, s_max=40)
    lp64 = logits.detach().log_softmax(-1)
    x32 = lp64.float().requires_grad_()
    x64 = x32.detach().double().requires_grad_()
    l32 = dt.ctc_loss(x32, targets, il, tl, reduction="sum")
    l64 = dt.ctc_loss(x64, targets, il, tl, reduction="sum")
    l32.backward()
    l64.backward()
    assert l32.dtype == torch.float32 and x32.grad.dtype == torch.float32
    assert abs(l32.item() - l64.item()) <= 1e-6 * abs(l64.item())
    err = (x32.grad.double() - x64.grad).abs() / x64.grad.abs().clamp(min=1)
    assert err.max().item() < 1e-6


def test_gradcheck_leaf_log_probs():
    # torch's own ctc_loss fails this on a leaf (its gradient is exp(lp) - posterior).
    logits, targets, il, tl = _batch(7, t_max=12, n=3, n_cls=4, s_max=4)
    lp = logits.detach().log_softmax(-1).requires_grad_()
    for reduction in ("none", "mean"):
        assert torch.autograd.gradcheck(
            lambda x: dt.ctc_loss(x, targets, il, tl, reduction=reduction), (lp,))
    # also with unnormalised scores and an upstream gradient that is not 1
    sc = logits.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: 3 * dt.ctc_loss(x, targets, il, tl, reduction="none"),
                                    (sc,))


def test_module_and_no_grad_path():
    logits, targets, il, tl = _batch(8)
    mod = dt.CTCLoss(blank=0, reduction="mean", zero_infinity=True)
    ref = torch.nn.CTCLoss(blank=0, reduction="mean", zero_infinity=True)
    lp = logits.log_softmax(-1)
    torch.testing.assert_close(mod(lp, targets, il, tl), ref(lp, targets, il, tl))
    with torch.no_grad():
        out = mod(lp, targets, il, tl)
    assert not out.requires_grad
    assert "zero_infinity=True" in repr(mod)


def test_nonzero_blank_matches_torch():
    logits, targets, il, tl = _batch(9, n_cls=5, blank=4)
    (a, ga), (b, gb) = _both(logits, targets, il, tl, blank=4, reduction="mean")
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad, exc, match", [
    (dict(targets=torch.tensor([[1, 7]])), ValueError, r"ctc_loss: argument 'targets' must hold labels in \[0, 4\)"),
    (dict(targets=torch.tensor([[1, 0]])), ValueError, r"must not contain the blank index"),
    (dict(targets=torch.tensor([[1, -1]])), ValueError, r"labels in \[0, 4\), got -1"),
    (dict(targets=torch.tensor([[1.0, 2.0]])), TypeError, r"'targets' must have an integer dtype"),
    (dict(input_lengths=torch.tensor([9])), ValueError, r"'input_lengths' must be in \[0, 5\]"),
    (dict(target_lengths=torch.tensor([3])), ValueError, r"'target_lengths' must be in \[0, 2\]"),
    (dict(blank=4), ValueError, r"'blank' must be in \[0, 4\), got 4"),
    (dict(reduction="avg"), ValueError, r"'reduction' must be one of"),
    (dict(log_probs=torch.zeros(5, 1, 4, dtype=torch.complex64)), TypeError, r"floating dtype"),
    (dict(log_probs=torch.zeros(5, 4, 1, 4)), ValueError, r"'log_probs' must be \(T, N, C\)"),
    (dict(input_lengths=torch.tensor([5, 5])), ValueError, r"'input_lengths' must have shape \(1,\)"),
])
def test_bad_input_raises_clear_errors(bad, exc, match):
    args = dict(log_probs=torch.zeros(5, 1, 4), targets=torch.tensor([[1, 2]]),
                input_lengths=torch.tensor([5]), target_lengths=torch.tensor([2]), blank=0,
                reduction="mean")
    args.update(bad)
    with pytest.raises(exc, match=match):
        dt.ctc_loss(**args)


@pytest.mark.parametrize("func", [False, True])
def test_second_derivative_is_refused_not_silently_wrong(func):
    # The gradient is computed once in the forward (once_differentiable): a
    # first-order create_graph=True backward works and equals the plain one; a
    # second differentiation raises instead of returning a wrong Hessian.
    logits, targets, il, tl = _batch(3, t_max=8, n=2, n_cls=4, s_max=3)
    lp = logits.detach().log_softmax(-1).double().requires_grad_()
    if func:  # the torch.func path (setup_context Function)
        g_plain = torch.func.grad(lambda x: dt.ctc_loss(x, targets, il, tl))(lp)
    else:
        (g_plain,) = torch.autograd.grad(dt.ctc_loss(lp, targets, il, tl), lp)
    (g,) = torch.autograd.grad(dt.ctc_loss(lp, targets, il, tl), lp, create_graph=True)
    torch.testing.assert_close(g, g_plain, rtol=0, atol=0)
    # (torch's message for once_differentiable depends on the cotangent)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), lp)
    lp2 = lp.detach().requires_grad_()
    (g2,) = torch.autograd.grad(dt.ctc_loss(lp2, targets, il, tl), lp2,
                                grad_outputs=torch.ones((), dtype=lp2.dtype, requires_grad=True),
                                create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g2.sum(), lp2)
