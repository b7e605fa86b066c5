"""The torch device CTC kernel (`duoloss.torch._triton._ctc_kernels`) in every variant.

Runs under Triton's interpreter (``TRITON_INTERPRET=1`` for this module, as in
tests/test_device_torch.py).  Oracles: the host path (the numba core) and, on tiny
inputs, brute-force enumeration of every frame path (tests/ctc_reference.py).  The
kernel reads ``(T, N, C)`` log-probabilities, targets and lengths as given and writes
the whole gradient itself: these tests cover its compile-time variants (row shifts in
registers or through scratch; gradient zeros written by the kernel or by a fill),
repeated labels (added rank by rank), concatenated and int32 targets, the reduction
weights, invalid rows (NaN from the kernel), and half-precision inputs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import duoloss.torch as dt  # noqa: E402
from ctc_reference import brute_force_ctc  # noqa: E402
from test_device_torch import _close, interpreted  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    yield from interpreted("_ctc_kernels")


#: (GATHER, ZERO_ROWS, split) forced through the launcher's knobs; split: alpha and beta
#: as concurrent programs, then the gradient rows (`_ctc_kernels.ctc_ab_kernel`,
#: `ctc_post_kernel`) instead of the fused kernel
VARIANTS = {"gather+zero": (10 ** 9, 10 ** 9, False), "scratch+zero": (0, 10 ** 9, False),
            "gather+fill": (10 ** 9, 0, False), "scratch+fill": (0, 0, False),
            # (the shifts live in the alpha/beta kernel, the zeros in the row kernel:
            # two variants reach every branch of both)
            "split gather+zero": (10 ** 9, 10 ** 9, True), "split scratch+fill": (0, 0, True)}


@pytest.fixture(params=list(VARIANTS))
def variant(request, monkeypatch):
    from duoloss.torch._triton import _ops
    gather_max, zero_max, split = VARIANTS[request.param]
    monkeypatch.setattr(_ops, "CTC_GATHER_MAX_BLOCK", gather_max)
    monkeypatch.setattr(_ops, "CTC_ZERO_ROWS_MAX_C", zero_max)
    monkeypatch.setattr(_ops, "CTC_SPLIT_MIN_BLOCK", 0 if split else 1 << 30)
    return request.param


@pytest.fixture(params=["fused", "split"])
def path(request, monkeypatch):
    """The launcher's two forms at the default shifts and zeros: the fused kernel and
    the split alpha/beta + gradient rows (``CTC_SPLIT_MIN_BLOCK``)."""
    from duoloss.torch._triton import _ops
    monkeypatch.setattr(_ops, "CTC_SPLIT_MIN_BLOCK",
                        0 if request.param == "split" else 1 << 30)
    return request.param


def _batch(dtype=torch.float64, seed=0):
    """T=9, N=5, C=6, blank 0: a label three times (three ranks), adjacent repeats
    (the skip rule), a short sequence (padded frames), an empty target, and an
    infeasible one (3 labels with a repeat in 3 frames)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, 5, 6, generator=g, dtype=torch.float64)
    targets = torch.tensor([[1, 2, 1, 3, 1], [4, 4, 5, 0, 0], [2, 0, 0, 0, 0],
                            [0, 0, 0, 0, 0], [3, 3, 5, 0, 0]])
    il = torch.tensor([9, 9, 4, 6, 3])
    tl = torch.tensor([5, 3, 1, 0, 3])
    return x.log_softmax(-1).to(dtype), targets, il, tl


def _both(lp, targets, il, tl, cot=None, **kw):
    out = []
    for impl in ("device", "host"):
        z = lp.detach().clone().requires_grad_()
        loss = dt.ctc_loss(z, targets, il, tl, impl=impl, **kw)
        (loss * (1 if cot is None else cot)).sum().backward()
        out.append((loss.detach(), z.grad))
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_variants_equal_host(variant, dtype):
    lp, targets, il, tl = _batch(dtype)
    cot = torch.tensor([0.5, -1.0, 2.0, 0.25, 3.0], dtype=dtype)
    (ld, gd), (lh, gh) = _both(lp, targets, il, tl, cot, reduction="none")
    assert torch.isinf(ld[4]) and torch.all(gd[:, 4] == 0)
    _close(ld, lh, dtype, f"{variant} losses")
    _close(gd, gh, dtype, f"{variant} grad")
    for reduction in ("sum", "mean"):
        # the feasible rows; all five with zero_infinity (the infeasible one counts 0)
        for n, zero_infinity in ((4, False), (5, True)):
            (ld, gd), (lh, gh) = _both(lp[:, :n], targets[:n], il[:n], tl[:n],
                                       reduction=reduction, zero_infinity=zero_infinity)
            assert torch.isfinite(ld)
            _close(ld, lh, dtype, f"{variant} {reduction} zero_infinity={zero_infinity}")
            _close(gd, gh, dtype, f"{variant} {reduction} grad")


def test_repeated_labels_against_brute_force(variant):
    """One label three times in a 5-label target, T=6, C=4: every frame path enumerated."""
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(6, 1, 4, generator=g, dtype=torch.float64).log_softmax(-1)
    target = [1, 2, 1, 3, 1]
    z = lp.clone().requires_grad_()
    loss = dt.ctc_loss(z, torch.tensor([target]), [6], [5], impl="device", reduction="sum")
    loss.backward()
    ref_loss, ref_grad = brute_force_ctc(lp[:, 0].numpy(), target, blank=0)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12)
    np.testing.assert_allclose(z.grad[:, 0].numpy(), ref_grad, rtol=1e-10, atol=1e-13)


def test_target_forms_read_as_given(path):
    """int32 and int64 tensors, concatenated 1-D targets, Python lengths, a blank
    other than 0, unbatched input: the host path's values."""
    lp, targets, il, tl = _batch(torch.float64, seed=1)
    lp = lp[:, :4]
    targets, il, tl = targets[:4], il[:4], tl[:4]
    (ref, gref), _ = _both(lp, targets, il, tl, reduction="none")
    flat = torch.cat([targets[b, :tl[b]] for b in range(4)])
    for tg, i, n in ((targets.int(), il.int(), tl.int()), (flat, il, tl),
                     (flat.int(), il.int(), tl), (targets, il.tolist(), tl.tolist())):
        (ld, gd), _ = _both(lp, tg, i, n, reduction="none")
        _close(ld, ref, torch.float64, f"{tg.dtype} {tuple(tg.shape)}")
        _close(gd, gref, torch.float64, f"grad {tg.dtype} {tuple(tg.shape)}")
    # blank 5 (the last class): labels shifted below it
    shifted = torch.where(targets > 0, targets - 1, 0)
    (ld, gd), (lh, gh) = _both(lp, shifted, il, tl, blank=5, reduction="mean")
    _close(ld, lh, torch.float64, "blank 5")
    _close(gd, gh, torch.float64, "blank 5 grad")
    # unbatched (T, C) with (S,) targets and int lengths
    (ld, gd), (lh, gh) = _both(lp[:, 0], targets[0], 9, 5, reduction="none")
    _close(ld, lh, torch.float64, "unbatched")
    _close(gd, gh, torch.float64, "unbatched grad")


def test_invalid_rows_are_nan_from_the_kernel(variant):
    """What the traced path cannot check on the host (lengths beyond the tensors,
    labels out of range or the blank): that row's loss and its whole gradient slab
    NaN, the other rows untouched (the operator called directly)."""
    from duoloss.torch._triton import _ops
    lp, targets, il, tl = _batch(torch.float64, seed=2)
    lp, targets, il, tl = lp[:, :4], targets[:4].clone(), il[:4].clone(), tl[:4].clone()
    (ref, gref), _ = _both(lp, targets, il, tl, reduction="none")
    cases = {"il > T": (1, "il", 10), "il < 0": (1, "il", -1), "tl > S": (2, "tl", 6),
             "label >= C": (0, "tg", 6), "label < 0": (0, "tg", -2),
             "label = blank": (0, "tg", 0)}
    for what, (row, arg, value) in cases.items():
        tg, i, n = targets.clone(), il.clone(), tl.clone()
        if arg == "il":
            i[row] = value
        elif arg == "tl":
            n[row] = value
        else:
            tg[row, 1] = value
        z = lp.clone().requires_grad_()
        losses = _ops.ctc(z, tg, i, n, False, blank=0, reduction="none")
        losses.sum().backward()
        assert torch.isnan(losses[row]), what
        assert torch.isnan(z.grad[:, row]).all(), what
        keep = [b for b in range(4) if b != row]
        _close(losses.detach()[keep], ref[keep], torch.float64, what)
        _close(z.grad[:, keep], gref[:, keep], torch.float64, what)


HALF_TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_read_as_they_are(dtype, path):
    """Half log-probabilities: accumulated in float32, the loss and gradient in the
    input's dtype, within the dtype's rounding (``HALF_TOL`` relative to the loss,
    absolute on the gradient, whose entries are posteriors in [0, 1]) of the float64
    host path on the same rounded inputs; under autocast the loss is float32 and
    within float32's bound."""
    lp, targets, il, tl = _batch(torch.float64, seed=4)
    lp, targets, il, tl = lp[:, :4], targets[:4], il[:4], tl[:4]
    half = lp.to(dtype)
    exact = half.to(torch.float64)
    (lh, gh), _ = _both(exact, targets, il, tl, reduction="none")
    z = half.clone().requires_grad_()
    ld = dt.ctc_loss(z, targets, il, tl, impl="device", reduction="none")
    ld.sum().backward()
    assert ld.dtype == dtype and z.grad.dtype == dtype
    tol = HALF_TOL[dtype]
    err = ((ld.double() - lh).abs() / lh.abs().clamp(min=1)).max().item()
    assert err <= tol, err
    assert (z.grad.double() - gh).abs().max().item() <= tol
    with torch.autocast("cpu", dtype=dtype):
        z = half.clone().requires_grad_()
        la = dt.ctc_loss(z, targets, il, tl, impl="device", reduction="mean")
    la.backward()
    assert la.dtype == torch.float32 and z.grad.dtype == dtype
    _, (lm, _) = _both(exact, targets, il, tl, reduction="mean")
    assert la.item() == pytest.approx(lm.item(), rel=1e-5)


def test_sweep_configurations_compute_the_same_values(monkeypatch):
    """Every launch configuration `benchmarks.ctc_device_sweep` may time on a GPU gives
    the host path's values (here under the interpreter, where warps do not matter)."""
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import ctc_device_sweep
    from duoloss.torch._triton import _ops
    lp, targets, il, tl = _batch(torch.float64, seed=5)
    _, (lh, gh) = _both(lp, targets, il, tl, reduction="none")
    for name, cfg in ctc_device_sweep._configs(_ops).items():
        # (the split configurations set the launcher's switch: restored by undo)
        monkeypatch.setattr(_ops, "CTC_SPLIT_MIN_BLOCK", _ops.CTC_SPLIT_MIN_BLOCK)
        if cfg is not None:
            monkeypatch.setattr(_ops, "ctc_config", cfg)
        (ld, gd), _ = _both(lp, targets, il, tl, reduction="none")
        monkeypatch.undo()
        _close(ld, lh, torch.float64, name)
        _close(gd, gh, torch.float64, f"{name} grad")


def test_validation_reads_once_with_the_same_checks(monkeypatch):
    """On a GPU, targets and lengths on the device are read for validation in one copy
    (`duoloss.torch._args.read_ints_together`): forced here on CPU tensors, the values and
    every validation error (type and message) are those of three separate reads."""
    from duoloss.torch import _ctc
    lp, targets, il, tl = _batch(torch.float64, seed=6)
    lp, targets, il, tl = lp[:, :4], targets[:4], il[:4], tl[:4]
    bad = {"label >= C": (targets.clone().index_fill_(1, torch.tensor([0]), 6), il, tl),
           "blank in targets": (targets.clone().index_fill_(1, torch.tensor([0]), 0), il, tl),
           "il > T": (targets, il + 1, tl), "tl > S": (targets, il, tl + 1),
           "negative tl": (targets, il, tl - 10)}

    def outcomes():
        res = {"ok": dt.ctc_loss(lp, targets.int(), il.int(), tl.int(), impl="device",
                                 reduction="none")}
        for what, (tg, i, n) in bad.items():
            with pytest.raises((ValueError, TypeError)) as e:
                dt.ctc_loss(lp, tg, i, n, impl="device")
            res[what] = (type(e.value), str(e.value))
        return res

    separate = outcomes()
    calls = []
    real = _ctc.read_ints_together
    monkeypatch.setattr(_ctc, "read_together_applies", lambda dev, xs: True)
    monkeypatch.setattr(_ctc, "read_ints_together", lambda xs: calls.append(1) or real(xs))
    together = outcomes()
    assert len(calls) == 1 + len(bad)
    _close(together.pop("ok"), separate.pop("ok"), torch.float64, "read together")
    assert together == separate


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_vmap_of_a_reduced_loss(reduction, path):
    """Under ``torch.func.vmap`` the kernel weighs each folded sequence by its own
    row's reduction (``'mean'`` over that row's ``N``) and each row is summed after:
    the values and gradients of a Python loop, and of the host path."""
    lp, targets, il, tl = _batch(torch.float64, seed=7)
    xs = torch.stack([lp[:, :4], lp.flip(0)[:, :4]])       # (M=2, T, N=4, C)
    tgs = torch.stack([targets[:4], targets[[1, 0, 3, 2]]])
    ils = torch.tensor([[9, 9, 4, 6], [9, 8, 9, 7]])
    tls = torch.tensor([[5, 3, 1, 0], [3, 5, 0, 1]])

    def f(z, t, i, n, impl="device"):
        return dt.ctc_loss(z, t, i, n, impl=impl, reduction=reduction)

    args = (xs, tgs, ils, tls)
    got = torch.func.vmap(f)(*args)
    _close(got, torch.stack([f(*a) for a in zip(*args)]), torch.float64, "vmap vs loop")
    _close(got, torch.func.vmap(lambda *a: f(*a, impl="host"))(*args), torch.float64,
           "vmap vs host")
    grads = torch.func.vmap(torch.func.grad(f))(*args)
    _close(grads, torch.stack([torch.func.grad(f)(*a) for a in zip(*args)]), torch.float64,
           "vmap(grad) vs loop")
    _close(grads, torch.func.vmap(torch.func.grad(lambda *a: f(*a, impl="host")))(*args),
           torch.float64, "vmap(grad) vs host")


def test_concatenated_starts_summed_over_many_chunks(path):
    """Concatenated targets with many more sequences than lanes (``BLOCK = 4``, 13
    sequences): each program sums the earlier target lengths in chunks of ``BLOCK``."""
    g = torch.Generator().manual_seed(8)
    n = 13
    lp = torch.randn(4, n, 3, generator=g, dtype=torch.float64).log_softmax(-1)
    tl = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1])
    flat = torch.randint(1, 3, (int(tl.sum()),), generator=g)
    il = torch.tensor([4, 3, 2, 1, 0, 4, 4, 3, 2, 4, 1, 2, 3])
    (ld, gd), (lh, gh) = _both(lp, flat, il, tl, reduction="none")
    _close(ld, lh, torch.float64, "concatenated, 13 sequences")
    _close(gd, gh, torch.float64, "concatenated grad")


def test_backward_scales_the_saved_gradient_in_place(path):
    """The forward's gradient becomes the backward's result (scaled in place: no
    logits-sized copy, and a leaf's ``.grad`` is that very buffer); a second backward
    through the same graph raises a clear error instead of a wrong value."""
    lp, targets, il, tl = _batch(torch.float64, seed=9)
    lp, targets, il, tl = lp[:, :4], targets[:4], il[:4], tl[:4]
    (_, gh), _ = _both(lp, targets, il, tl, cot=torch.tensor(2.5, dtype=torch.float64))
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: seen.append((tuple(t.shape), t.data_ptr())) or t, lambda t: t):
        x = lp.clone().requires_grad_()
        loss = dt.ctc_loss(x, targets, il, tl, impl="device")
    (loss * 2.5).backward()
    _close(x.grad, gh, torch.float64, "in-place scaled gradient")
    saved = [p for shape, p in seen if shape == tuple(x.shape) and p != x.data_ptr()]
    assert saved == [x.grad.data_ptr()]  # the saved gradient itself: no copy was made
    x = lp.clone().requires_grad_()
    loss = dt.ctc_loss(x, targets, il, tl, impl="device")
    (loss * 2.5).backward(retain_graph=True)
    _close(x.grad, gh, torch.float64, "retain_graph: first backward")
    # a second backward of the retained graph computes the gradient again (as native
    # F.ctc_loss's, whose backward recomputes from alpha): it accumulates 2.5 g + 1.0 g
    g1 = x.grad.clone()
    loss.backward(retain_graph=True)
    _close(x.grad, g1 * (3.5 / 2.5), torch.float64, "retain_graph: second backward")
    g2, = torch.autograd.grad(loss, x, retain_graph=True)
    _close(g2, g1 / 2.5, torch.float64, "retain_graph: third backward")
    # the input changed in place since the forward: torch's own error, not a stale value
    with torch.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_no_grad_losses_equal_the_training_step(path, reduction):
    """Validation under ``no_grad`` launches the forward only (the split form: alpha
    alone): the losses are those of the step with a gradient, bit for bit, and the
    host path's."""
    lp, targets, il, tl = _batch(torch.float64, seed=8)
    with torch.no_grad():
        ln = dt.ctc_loss(lp, targets, il, tl, impl="device", reduction=reduction)
    z = lp.clone().requires_grad_()
    lg = dt.ctc_loss(z, targets, il, tl, impl="device", reduction=reduction)
    assert torch.equal(ln, lg.detach())
    _close(ln, dt.ctc_loss(lp, targets, il, tl, impl="host", reduction=reduction),
           torch.float64, f"{path} no_grad")
