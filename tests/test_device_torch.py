"""The torch device path (Triton kernels, ``impl='device'``) against the host path.

No GPU here: the kernels run on CPU tensors in Triton's interpreter, selected
with ``TRITON_INTERPRET=1`` for this module only (a module fixture sets it and
restores the previous value; nothing else in duoloss or torch reads it).  The
host path (the numba core, itself tested against brute force and peers) is the
oracle, plus ``F.ctc_loss`` and JAX's device path on the same inputs.  Tiny
sizes: the interpreter runs each program's loop in Python.
"""
from __future__ import annotations

import os

import numpy as np
import importlib

import pytest
import torch

pytest.importorskip("triton")

import duoloss.torch as dt  # noqa: E402


def interpreted(kernels: str):
    """Body of a module fixture: ``TRITON_INTERPRET=1`` while the module's tests run,
    skipping them when ``duoloss.torch._triton.<kernels>`` was already defined
    without the interpreter; the variable is restored afterwards."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module(f"duoloss.torch._triton.{kernels}")
    if not module.INTERPRETED:  # defined by an earlier, non-interpreted import
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    yield
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    yield from interpreted("_kernels")


TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _close(a, b, dtype, what):
    """Equal to TOL[dtype] relative to the larger magnitude (inf/NaN positions equal)."""
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    assert torch.equal(torch.isnan(a), torch.isnan(b)), what
    assert torch.equal(torch.isinf(a), torch.isinf(b)), what
    fin = torch.isfinite(a)
    if fin.any():
        scale = max(a[fin].abs().max().item(), b[fin].abs().max().item(), 1.0)
        err = (a[fin] - b[fin]).abs().max().item()
        assert err <= TOL[dtype] * scale, f"{what}: {err} > {TOL[dtype]} * {scale}"


# ----------------------------------------------------------------------- CTC
def _ctc_batch(dtype, seed=0):
    """T=10, N=4, C=5: repeated labels (skip rule), an empty target, an
    infeasible target (4 labels with repeats in 5 frames)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(10, 4, 5, generator=g, dtype=torch.float64).to(dtype)
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0], [0, 0, 0, 0], [2, 2, 3, 3]])
    il = torch.tensor([10, 7, 3, 5])
    tl = torch.tensor([4, 2, 0, 4])
    return x, targets, il, tl


def _ctc_both(x, targets, il, tl, cot=None, **kw):
    out = []
    for impl in ("device", "host"):
        xi = x.clone().requires_grad_()
        loss = dt.ctc_loss(xi.log_softmax(-1), targets, il, tl, impl=impl, **kw)
        (loss * (1 if cot is None else cot)).sum().backward()
        out.append((loss, xi.grad))
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ctc_device_equals_host(dtype):
    x, targets, il, tl = _ctc_batch(dtype)
    cot = torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=dtype)
    (ld, gd), (lh, gh) = _ctc_both(x, targets, il, tl, cot, reduction="none")
    assert torch.isinf(ld[3]) and ld.dtype == dtype  # infeasible: +inf ...
    assert torch.all(gd[:, 3] == 0)  # ... with a zero gradient
    assert ld[2].item() == pytest.approx(-x[:3, 2].log_softmax(-1)[:, 0].sum().item())
    _close(ld, lh, dtype, "losses")
    _close(gd, gh, dtype, "grad")
    if dtype == torch.float64:  # an independent reference for the feasible ones
        ref = torch.nn.functional.ctc_loss(x.log_softmax(-1), targets, il, tl,
                                           reduction="none")
        _close(ld[:3], ref[:3], dtype, "F.ctc_loss")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_ctc_device_reductions_zero_infinity(reduction):
    dtype = torch.float64
    x, targets, il, tl = _ctc_batch(dtype, seed=1)
    (ld, gd), (lh, gh) = _ctc_both(x, targets, il, tl, reduction=reduction,
                                   zero_infinity=True)
    assert torch.isfinite(ld)
    _close(ld, lh, dtype, "loss")
    _close(gd, gh, dtype, "grad")
    # zero_infinity: the infeasible sequence contributes nothing
    part = dt.ctc_loss(x[:, :3].log_softmax(-1), targets[:3], il[:3], tl[:3], impl="device",
                       reduction="sum")
    if reduction == "sum":
        assert ld.item() == pytest.approx(part.item(), rel=1e-12)


def test_ctc_device_nan_frame_poisons_only_its_sequence():
    dtype = torch.float64
    x, targets, il, tl = _ctc_batch(dtype, seed=2)
    clean = _ctc_both(x, targets, il, tl, reduction="none")[0]
    x[2, 0, 1] = float("nan")  # sequence 0, frame 2, a class of its target
    (ld, gd), (lh, _) = _ctc_both(x, targets, il, tl, reduction="none")
    assert torch.isnan(ld[0]) and torch.isnan(lh[0])
    assert torch.isnan(gd[:10, 0, [0, 1, 2, 3]]).all()
    assert torch.equal(ld[1:], clean[0][1:])
    assert torch.equal(gd[:, 1:], clean[1][:, 1:])


def test_ctc_device_concatenated_targets_and_unbatched():
    dtype = torch.float64
    x, targets, il, tl = _ctc_batch(dtype, seed=3)
    lp = x.log_softmax(-1)
    flat = torch.cat([targets[b, :tl[b]] for b in range(4)])
    _close(dt.ctc_loss(lp, flat, il, tl, impl="device", reduction="none"),
           dt.ctc_loss(lp, flat, il, tl, impl="host", reduction="none"), dtype, "concat")
    _close(dt.ctc_loss(lp[:, 0], targets[0], 10, 4, impl="device"),
           dt.ctc_loss(lp[:, 0], targets[0], 10, 4, impl="host"), dtype, "unbatched")
    module = dt.CTCLoss(reduction="sum", impl="device")
    _close(module(lp, targets, il, tl), dt.ctc_loss(lp, targets, il, tl, reduction="sum"),
           dtype, "CTCLoss")


def test_device_empty_shapes():
    """No frames, no target positions, no sequences: the host path's values."""
    dtype = torch.float64
    x = torch.randn(4, 2, 3, dtype=dtype)
    for lp, tg, il, tl in ((x[:0], torch.ones(2, 1, dtype=torch.int64), [0, 0], [0, 1]),
                           (x, torch.zeros(2, 0, dtype=torch.int64), [4, 2], [0, 0]),
                           (x[:, :0], torch.zeros(0, 2, dtype=torch.int64), [], [])):
        il, tl = torch.tensor(il, dtype=torch.int64), torch.tensor(tl, dtype=torch.int64)
        for reduction in ("none", "mean"):
            _close(dt.ctc_loss(lp, tg, il, tl, reduction=reduction, impl="device"),
                   dt.ctc_loss(lp, tg, il, tl, reduction=reduction, impl="host"), dtype,
                   f"ctc {tuple(lp.shape)} {reduction}")
    logits = torch.randn(2, 3, 1, 4, dtype=dtype)  # U = 0
    args = (logits, torch.zeros(2, 0, dtype=torch.int64), torch.tensor([3, 0]),
            torch.tensor([0, 0]))
    _close(dt.rnnt_loss(*args, reduction="none", impl="device"),
           dt.rnnt_loss(*args, reduction="none", impl="host"), dtype, "rnnt U=0")


def test_ctc_device_compile_fullgraph_and_func_grad():
    dtype = torch.float64
    x, targets, il, tl = _ctc_batch(dtype, seed=4)
    x, targets, il, tl = x[:, :3], targets[:3], il[:3], tl[:3]

    def f(z):
        return dt.ctc_loss(z.log_softmax(-1), targets, il, tl, impl="device")

    xe = x.clone().requires_grad_()
    eager = f(xe)
    eager.backward()
    torch._dynamo.reset()
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(xc)
    compiled.backward()
    _close(compiled, eager, dtype, "compiled loss")
    _close(xc.grad, xe.grad, dtype, "compiled grad")
    _close(torch.func.grad(f)(x), xe.grad, dtype, "torch.func.grad")
    # the gradient is first order only
    xs = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xs), xs, create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        g.sum().backward()


def test_auto_on_cpu_is_the_host_path():
    x, targets, il, tl = _ctc_batch(torch.float32, seed=5)
    lp = x.log_softmax(-1)
    host = dt.ctc_loss(lp, targets, il, tl, impl="host", reduction="none")
    assert torch.equal(dt.ctc_loss(lp, targets, il, tl, reduction="none"), host)
    logits = torch.randn(2, 4, 3, 5)
    y = torch.tensor([[1, 2], [3, 0]])
    args = (logits, y, torch.tensor([4, 3]), torch.tensor([2, 1]))
    assert torch.equal(dt.rnnt_loss(*args, reduction="none"),
                       dt.rnnt_loss(*args, reduction="none", impl="host"))


def test_bad_impl_and_missing_interpreter(monkeypatch):
    x, targets, il, tl = _ctc_batch(torch.float32)
    lp = x.log_softmax(-1)
    with pytest.raises(ValueError, match=r"ctc_loss: argument 'impl' must be one of"):
        dt.ctc_loss(lp, targets, il, tl, impl="gpu")
    with pytest.raises(ValueError, match=r"CTCLoss: argument 'impl'"):
        dt.CTCLoss(impl=None)
    with pytest.raises(ValueError, match=r"RNNTLoss: argument 'impl'"):
        dt.RNNTLoss(impl="cuda")
    logits = torch.randn(1, 3, 2, 4)
    y = torch.tensor([[1]])
    with pytest.raises(ValueError, match=r"rnnt_loss: argument 'impl'"):
        dt.rnnt_loss(logits, y, torch.tensor([3]), torch.tensor([1]), impl="Device")
    lm, am = torch.randn(1, 2, 4), torch.randn(1, 3, 4)
    for fn in (dt.rnnt_loss_simple, dt.rnnt_loss_smoothed):
        with pytest.raises(ValueError, match=fn.__name__ + r": argument 'impl'"):
            fn(lm, am, y, 0, impl=1)
    ranges = torch.zeros(1, 3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"rnnt_loss_pruned: argument 'impl'"):
        dt.rnnt_loss_pruned(torch.randn(1, 3, 2, 4), y, ranges, 0, impl="x")
    # bad input is validated as on the host path, before any kernel
    with pytest.raises(ValueError, match="ctc_loss"):
        dt.ctc_loss(lp, targets + 10, il, tl, impl="device")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dt.ctc_loss(lp, targets, il, tl, impl="device")


def test_auto_without_triton_falls_back_with_one_warning(monkeypatch):
    import warnings

    from duoloss.torch import _triton
    monkeypatch.setattr(_triton, "_AVAILABLE", (False, "triton is not installed (test)"))
    monkeypatch.setattr(_triton, "_WARNED", [])
    monkeypatch.setattr(_triton, "_is_cuda", lambda t: True)  # as if on a GPU
    x = torch.zeros(1)
    with pytest.warns(RuntimeWarning, match=r"unavailable \(triton is not installed \(test\)\)"):
        assert _triton.resolve_impl("ctc_loss", "auto", x) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _triton.resolve_impl("rnnt_loss", "auto", x) is False  # once per process
    with pytest.raises(RuntimeError, match="rnnt_loss: impl='device' needs Triton"):
        _triton.resolve_impl("rnnt_loss", "device", x)


# (the ahead-of-time compile check of every kernel variant: tests/test_aot_compile.py)


# ---------------------------------------------------------------- transducers
def _rnnt_batch(dtype, seed=0):
    """N=3, T=5, U=3, V=4: full lengths, a short sequence with an empty target,
    and T_b = 0 with U_b > 0 (infeasible)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 4, 4, generator=g, dtype=torch.float64).to(dtype)
    y = torch.tensor([[1, 2, 1], [2, 0, 0], [1, 1, 0]])
    return logits, y, torch.tensor([5, 3, 0]), torch.tensor([3, 0, 2])


def _rnnt_both(logits, y, il, tl, cot=None, **kw):
    out = []
    for impl in ("device", "host"):
        x = logits.clone().requires_grad_()
        loss = dt.rnnt_loss(x, y, il, tl, impl=impl, **kw)
        (loss * (1 if cot is None else cot)).sum().backward()
        out.append((loss, x.grad))
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rnnt_device_equals_host(dtype):
    logits, y, il, tl = _rnnt_batch(dtype)
    cot = torch.tensor([1.5, -0.5, 2.0], dtype=dtype)
    (ld, gd), (lh, gh) = _rnnt_both(logits, y, il, tl, cot, reduction="none")
    assert torch.isinf(ld[2]) and torch.all(gd[2] == 0)
    # an empty target on 3 frames: three blanks
    lp = logits[1].double().log_softmax(-1)
    assert ld[1].item() == pytest.approx(-lp[:3, 0, 3].sum().item(), rel=1e-5)
    _close(ld, lh, dtype, "losses")
    _close(gd, gh, dtype, "grad")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_rnnt_device_reductions_and_options(reduction):
    dtype = torch.float64
    logits, y, il, tl = _rnnt_batch(dtype, seed=1)
    logits, y, il, tl = logits[:2], y[:2], il[:2], tl[:2]
    kw = dict(reduction=reduction, clamp=0.3, fastemit_lambda=0.01)
    (ld, gd), (lh, gh) = _rnnt_both(logits, y, il, tl, **kw)
    _close(ld, lh, dtype, "loss")
    _close(gd, gh, dtype, "grad")
    (ld, gd), (lh, gh) = _rnnt_both(logits.log_softmax(-1), y, il, tl, reduction=reduction,
                                    fused_log_softmax=False)
    _close(ld, lh, dtype, "loss, no log_softmax")
    _close(gd, gh, dtype, "grad, no log_softmax")


def test_rnnt_device_nan_poisons_only_its_sequence():
    dtype = torch.float64
    logits, y, il, tl = _rnnt_batch(dtype, seed=2)
    clean = _rnnt_both(logits, y, il, tl, reduction="none")[0]
    logits[0, 1, 1, 2] = float("nan")
    (ld, gd), (lh, _) = _rnnt_both(logits, y, il, tl, reduction="none")
    assert torch.isnan(ld[0]) and torch.isnan(lh[0])
    assert torch.equal(ld[1:2], clean[0][1:2]) and torch.equal(gd[1:], clean[1][1:])


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
def test_k2_simple_and_pruned_device_equals_host(rnnt_type):
    dtype = torch.float64
    g = torch.Generator().manual_seed(3)
    b, s, t, c = 2, 3, 5, 4
    lm = torch.randn(b, s + 1, c, generator=g, dtype=dtype)
    am = torch.randn(b, t, c, generator=g, dtype=dtype)
    y = torch.tensor([[1, 2, 1], [2, 1, 3]])
    boundary = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 4]])
    res = {}
    for impl in ("device", "host"):
        lmi, ami = lm.clone().requires_grad_(), am.clone().requires_grad_()
        loss, (gx, gy) = dt.rnnt_loss_simple(lmi, ami, y, 0, boundary, rnnt_type,
                                             reduction="sum", return_grad=True, impl=impl)
        loss.backward()
        ranges = dt.get_rnnt_prune_ranges(gx, gy, boundary, s_range=2)
        am_p, lm_p = dt.do_rnnt_pruning(ami, lmi, ranges)
        pruned = dt.rnnt_loss_pruned(am_p + lm_p, y, ranges, 0, boundary, rnnt_type,
                                     reduction="none", impl=impl)
        smoothed = dt.rnnt_loss_smoothed(lm, am, y, 0, 0.1, 0.2, boundary, rnnt_type,
                                         reduction="none", impl=impl)
        res[impl] = (loss, gx, gy, lmi.grad, ami.grad, ranges, pruned, smoothed)
    for name, d, h in zip(("loss", "px_grad", "py_grad", "lm.grad", "am.grad", "ranges",
                           "pruned", "smoothed"), res["device"], res["host"]):
        if name == "ranges":
            assert torch.equal(d, h)
        else:
            _close(d, h, dtype, name)


# ------------------------------------------------------------ torch == JAX
def test_torch_device_equals_jax_device():
    x64 = True  # the strict tolerance; one jit compile per loss (XLA compiles are slow)
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj
    dtype = torch.float64 if x64 else torch.float32
    x, targets, il, tl = _ctc_batch(dtype, seed=6)
    logits, y, ll, yl = _rnnt_batch(dtype, seed=6)
    with jax.enable_x64(x64):
        jnp = jax.numpy
        for reduction in ("none",):
            ours = dt.ctc_loss(x.log_softmax(-1), targets, il, tl, reduction=reduction,
                               impl="device")
            theirs = dj.ctc_loss(jax.nn.log_softmax(jnp.asarray(x.numpy()), axis=-1),
                                 jnp.asarray(targets.numpy()), jnp.asarray(il.numpy()),
                                 jnp.asarray(tl.numpy()), reduction=reduction, impl="device")
            _close(ours, torch.from_numpy(np.asarray(theirs)), dtype, "ctc torch vs jax")
            ours = dt.rnnt_loss(logits, y, ll, yl, reduction=reduction, impl="device")
            theirs = dj.rnnt_loss(jnp.asarray(logits.numpy()), jnp.asarray(y.numpy()),
                                  jnp.asarray(ll.numpy()), jnp.asarray(yl.numpy()),
                                  reduction=reduction, impl="device")
            _close(ours, torch.from_numpy(np.asarray(theirs)), dtype, "rnnt torch vs jax")


# ------------------------------------------------------------------- vmap
@pytest.fixture
def launches(monkeypatch):
    """The kernel launches of a call (each launch looks the kernels module up once)."""
    from duoloss.torch._triton import _ops
    count = []
    real = _ops._kernels

    def counted():
        count.append(1)
        return real()

    monkeypatch.setattr(_ops, "_kernels", counted)
    # rnnt_loss's kernels: one lookup per launch group (the forward's, the backward's)
    from duoloss.torch._triton import _rnnt_ops
    real_rnnt = _rnnt_ops._kernels

    def counted_rnnt():
        count.append(1)
        return real_rnnt()

    monkeypatch.setattr(_rnnt_ops, "_kernels", counted_rnnt)
    return count


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ctc_device_vmap_and_vmap_of_grad(dtype, launches):
    """torch.func.vmap folds the vmapped axis into the batch: one launch, the
    values of a Python loop over that axis and of the host path under vmap."""
    x, targets, _, tl = _ctc_batch(dtype, seed=6)
    xs = torch.stack([x[:6, :3], x[4:, 1:]])  # (M=2, T=6, N=3, C=5)
    tgs = torch.stack([targets[:3], targets[1:]])
    ils = torch.tensor([[6, 5, 3], [4, 6, 5]])  # [1, 2]: 2,2,3,3 in 5 frames, infeasible
    tls = torch.stack([tl[:3], tl[1:]])

    def f(z, t, i, n, impl="device"):
        return dt.ctc_loss(z.log_softmax(-1), t, i, n, impl=impl, reduction="none")

    def total(z, t, i, n, impl="device"):
        return (f(z, t, i, n, impl) * torch.tensor([0.5, -1.0, 2.0], dtype=dtype)).sum()

    args = (xs, tgs, ils, tls)
    launches.clear()
    got = torch.func.vmap(f)(*args)
    assert len(launches) == 1 and got.shape == (2, 3) and got.dtype == dtype
    loop = torch.stack([f(*a) for a in zip(*args)])
    assert torch.isinf(got[1, 2]) and torch.isinf(loop[1, 2])  # infeasible stays +inf
    _close(got, loop, dtype, "vmap vs loop")
    _close(got, torch.func.vmap(lambda *a: f(*a, impl="host"))(*args), dtype, "vmap vs host")
    launches.clear()
    grads = torch.func.vmap(torch.func.grad(total))(*args)
    assert len(launches) == 1
    _close(grads, torch.stack([torch.func.grad(total)(*a) for a in zip(*args)]), dtype,
           "vmap(grad) vs loop")
    _close(grads, torch.func.vmap(torch.func.grad(lambda *a: total(*a, impl="host")))(*args),
           dtype, "vmap(grad) vs host")
    # only the log-probabilities vmapped, along an inner dimension; grad of a vmap; nested
    x2 = xs.movedim(0, 2)  # (T, N, M, C)
    shared = (tgs[0], ils[0], tls[0])
    _close(torch.func.vmap(f, in_dims=(2, None, None, None))(x2, *shared),
           torch.stack([f(xs[j], *shared) for j in range(2)]), dtype, "vmap over an inner dim")
    g = torch.func.grad(lambda z: torch.func.vmap(total)(z, *args[1:]).sum())(xs)
    _close(g, grads, dtype, "grad(vmap)")
    launches.clear()
    nested = torch.func.vmap(torch.func.vmap(f))(*(a.unsqueeze(1).expand(2, 2, *a.shape[1:])
                                                   for a in args))
    assert len(launches) == 1
    _close(nested, torch.stack([loop, loop], 1), dtype, "nested vmap")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rnnt_device_vmap_and_vmap_of_grad(dtype, launches):
    logits, y, il, tl = _rnnt_batch(dtype, seed=7)
    args = (torch.stack([logits, logits.flip(1)]),  # (M=2, N=3, T=5, U+1=4, V=4)
            torch.stack([y, y.flip(1)]), torch.stack([il, torch.tensor([4, 3, 5])]),
            torch.stack([tl, torch.tensor([1, 3, 0])]))

    def f(z, t, i, n, impl="device"):
        return dt.rnnt_loss(z, t, i, n, impl=impl, reduction="none")

    def total(z, t, i, n, impl="device"):
        return (f(z, t, i, n, impl)[:2] * torch.tensor([1.5, -0.5], dtype=dtype)).sum()

    launches.clear()
    got = torch.func.vmap(f)(*args)
    assert len(launches) == 1 and got.dtype == dtype
    assert torch.isinf(got[0, 2]) and torch.isfinite(got[1]).all()  # T=0 with U=2: +inf
    _close(got, torch.stack([f(*a) for a in zip(*args)]), dtype, "vmap vs loop")
    _close(got, torch.func.vmap(lambda *a: f(*a, impl="host"))(*args), dtype, "vmap vs host")
    launches.clear()
    grads = torch.func.vmap(torch.func.grad(total))(*args)
    assert len(launches) == 2  # the forward's launches, then the backward's
    _close(grads, torch.stack([torch.func.grad(total)(*a) for a in zip(*args)]), dtype,
           "vmap(grad) vs loop")
    _close(grads, torch.func.vmap(torch.func.grad(lambda *a: total(*a, impl="host")))(*args),
           dtype, "vmap(grad) vs host")


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_k2_simple_device_vmap_of_grad(rnnt_type, launches):
    dtype = torch.float64
    g = torch.Generator().manual_seed(8)
    lm = torch.randn(2, 2, 4, 4, generator=g, dtype=dtype)  # (M, B, S + 1, C)
    am = torch.randn(2, 2, 5, 4, generator=g, dtype=dtype)  # (M, B, T, C)
    y = torch.tensor([[1, 2, 1], [2, 1, 3]])
    boundary = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 4]])

    def f(a, b, impl="device"):
        return dt.rnnt_loss_simple(a, b, y, 0, boundary, rnnt_type, reduction="sum", impl=impl)

    vg = torch.func.vmap(torch.func.grad_and_value(f, argnums=(0, 1)))
    launches.clear()
    (g_lm, g_am), loss = vg(lm, am)
    assert len(launches) == 1
    (h_lm, h_am), host = torch.func.vmap(torch.func.grad_and_value(
        lambda a, b: f(a, b, "host"), argnums=(0, 1)))(lm, am)
    _close(loss, host, dtype, "loss")
    _close(loss, torch.stack([f(a, b) for a, b in zip(lm, am)]), dtype, "loss vs loop")
    _close(g_lm, h_lm, dtype, "lm grad")
    _close(g_am, h_am, dtype, "am grad")


@pytest.mark.filterwarnings("ignore:Error detected in:UserWarning")
def test_ctc_device_compile_of_vmap():
    """torch.compile(torch.func.vmap(loss)): the operators' vmap rules (one launch);
    its gradient is refused with a clear error (the trace hides requires_grad)."""
    dtype = torch.float64
    x, targets, il, tl = _ctc_batch(dtype, seed=9)
    xs = torch.stack([x[:, :3], x[:, 1:]])

    def f(z):
        return dt.ctc_loss(z.log_softmax(-1), targets[:3], il[:3], tl[:3], impl="device")

    torch._dynamo.reset()
    compiled = torch.compile(torch.func.vmap(f), backend="aot_eager", fullgraph=True)
    _close(compiled(xs), torch.stack([f(z) for z in xs]), dtype, "compiled vmap")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="device path computed no gradient"):
        compiled(xs.clone().requires_grad_()).sum().backward()
    torch._dynamo.reset()


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_k2_device_boxes_inside_the_lattice(rnnt_type, dtype):
    """Boxes that start inside the lattice (``s0, t0 > 0``) and end before its edge: the
    kernels index ``px``/``py`` from the box's corner; the host path (numba core) is the
    oracle."""
    g = torch.Generator().manual_seed(11)
    lm = torch.randn(3, 6, 5, generator=g, dtype=torch.float64).to(dtype)  # (B, S + 1, C)
    am = torch.randn(3, 7, 5, generator=g, dtype=torch.float64).to(dtype)  # (B, T, C)
    y = torch.tensor([[1, 2, 1, 3, 4], [2, 1, 3, 3, 1], [4, 4, 1, 2, 2]])
    boundary = torch.tensor([[1, 2, 4, 6], [0, 1, 5, 7], [2, 0, 3, 3]])
    out = []
    for impl in ("device", "host"):
        a, b = lm.clone().requires_grad_(), am.clone().requires_grad_()
        loss = dt.rnnt_loss_simple(a, b, y, 0, boundary, rnnt_type, reduction="none",
                                   impl=impl)
        (loss * torch.tensor([1.0, -2.0, 0.5], dtype=dtype)).sum().backward()
        out.append((loss, a.grad, b.grad))
    for what, d, h in zip(("loss", "lm grad", "am grad"), *out):
        _close(d, h, dtype, what)


def test_k2_pruned_device_keeps_no_logits_sized_tensor():
    """Memory (issue 27): the device path's pruned lattice saves the logits (alive
    anyway) and ``(B, T, s_range)`` normalisers, no logits-sized temporary (the
    saved-tensor hooks see every tensor autograd keeps); loss and gradient equal the
    host path's (whose lattice autograd composes from logsumexp and gathers)."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(2, 6, 3, 40, generator=g, dtype=torch.float64)
    y = torch.tensor([[1, 2, 5, 7], [3, 3, 9, 1]])
    ranges = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2, 2]])[..., None] + torch.arange(3)
    boundary = torch.tensor([[0, 0, 4, 6], [0, 0, 4, 5]])
    out = []
    for impl in ("device", "host"):
        x = logits.clone().requires_grad_()
        saved = []

        def pack(t):
            saved.append((t.numel(), t.data_ptr()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = dt.rnnt_loss_pruned(x, y, ranges, 0, boundary, reduction="sum", impl=impl)
        if impl == "device":
            big = [n for n, p in saved if n >= x.numel() // 4 and p != x.data_ptr()]
            assert big == [], saved
        loss.backward()
        out.append((loss, x.grad))
    _close(out[0][0], out[1][0], torch.float64, "loss")
    _close(out[0][1], out[1][1], torch.float64, "grad")


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_k2_device_special_boxes_equal_host(rnnt_type, dtype):
    """The recursion on given ``(px, py)`` (what every k2 loss runs): a NaN move, an
    invalid box (``s1 > S``), an infeasible one (modified: more symbols than frames),
    an empty one (``s0 = s1``, ``t0 = t1``), strided inputs, and a batch whose states
    outnumber one warp's 32 lanes; losses and both per-sequence gradients against the
    host path (the numba core), NaN positions included."""
    from duoloss.torch._triton import transducer_losses_and_grads
    from duoloss.torch._rnnt_k2 import _recursion
    g = torch.Generator().manual_seed(21)
    for b, s, t in ((6, 4, 6), (2, 40, 9)):
        tx = t + 1 if rnnt_type == "regular" else t
        px = torch.randn(b, s, tx + 2, generator=g, dtype=torch.float64).to(dtype)
        px = px[..., 1:tx + 1]
        py = (torch.randn(b, s + 1, t, generator=g, dtype=torch.float64) - 1.0).to(dtype)
        bd = torch.tensor([[0, 0, s, t]] * b)
        if b == 6:
            px[1, 2, 3] = float("nan")
            bd[2] = torch.tensor([0, 0, s + 1, t])     # invalid: s1 > S
            bd[3] = torch.tensor([1, 2, 4, 4])         # 3 symbols in 2 frames
            bd[4] = torch.tensor([2, 3, 2, 3])         # a single cell
            bd[5] = torch.tensor([1, 1, 3, 5])
        assert not px.is_contiguous()
        ld, gxd, gyd = transducer_losses_and_grads(px, py, bd, rnnt_type)
        lh, (gxh, gyh) = _recursion(px.contiguous(), py, bd, rnnt_type, True, device=False)
        _close(ld, lh, dtype, "losses")
        _close(gxd, -gxh, dtype, "d loss / d px")
        _close(gyd, -gyh, dtype, "d loss / d py")
        if b == 6:
            assert torch.isnan(ld[[1, 2]]).all() and ld[4] == 0
            assert torch.isnan(gxd[2]).all() and torch.isnan(gyd[2]).all()
