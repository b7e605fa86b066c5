"""``rnnt_loss``'s fused device kernels (`duoloss.torch._triton._rnnt_kernels`) against
the host path (the numba core, itself checked against brute force and torchaudio's
formulas elsewhere) and closed forms.

No GPU here: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` set by a
module fixture before they are imported).  Tolerances: float64 1e-12 relative to the
largest magnitude (the base-2 arithmetic changes only the last bits), float32 1e-5;
half-precision logits are compared with the float64 host path on the same (rounded)
values: the loss within 1e-5 relative (it is accumulated in float32), the gradient,
returned in the input's dtype, within one rounding of that dtype (bfloat16 2**-8,
float16 2**-11, relative to the gradient's largest entry).
"""
from __future__ import annotations

import collections
import importlib
import os

import pytest
import torch

pytest.importorskip("triton")

import duoloss.torch as dt  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module("duoloss.torch._triton._rnnt_kernels")
    if not module.INTERPRETED:
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    yield
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _close(a, b, tol, what):
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    assert torch.equal(torch.isnan(a), torch.isnan(b)), what
    assert torch.equal(torch.isinf(a), torch.isinf(b)), what
    fin = torch.isfinite(a)
    if fin.any():
        scale = max(a[fin].abs().max().item(), b[fin].abs().max().item(), 1.0)
        err = (a[fin] - b[fin]).abs().max().item()
        assert err <= tol * scale, f"{what}: {err} > {tol} * {scale}"


def _batch(dtype, seed=0, n=4, t=6, u=3, v=5):
    """Full lengths, a short sequence, an empty target, T_b = 0 with U_b > 0."""
    g = torch.Generator().manual_seed(seed)
    logits = (2 * torch.randn(n, t, u + 1, v, generator=g, dtype=torch.float64)).to(dtype)
    y = torch.randint(0, v - 1, (n, u), generator=g)
    il = torch.tensor([t, t - 2, 3, 0][:n])
    tl = torch.tensor([u, u - 1, 0, 2][:n])
    return logits, y, il, tl


def _both(logits, y, il, tl, cot=None, host_logits=None, **kw):
    out = []
    for impl, lg in (("device", logits), ("host", logits if host_logits is None else host_logits)):
        x = lg.clone().requires_grad_()
        loss = dt.rnnt_loss(x, y, il, tl, impl=impl, **kw)
        c = torch.ones_like(loss) if cot is None else cot.to(loss.dtype)
        (loss * c).sum().backward()
        out.append((loss.detach(), x.grad))
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw", [
    dict(reduction="none"),
    dict(reduction="sum", delay_penalty=0.3),
    dict(reduction="mean", clamp=0.05, fastemit_lambda=0.2),
    dict(reduction="none", clamp=0.1, delay_penalty=0.1, fastemit_lambda=0.05, blank=0),
])
def test_options_equal_host(dtype, kw):
    logits, y, il, tl = _batch(dtype, seed=1)
    if kw.get("blank") == 0:
        y = y + 1  # labels in [1, V)
    cot = torch.tensor([1.5, -0.5, 2.0, 0.25]) if kw["reduction"] == "none" else None
    (ld, gd), (lh, gh) = _both(logits, y, il, tl, cot, **kw)
    assert ld.dtype == dtype and gd.dtype == dtype
    _close(ld, lh, TOL[dtype], f"loss {kw}")
    _close(gd, gh, TOL[dtype], f"grad {kw}")


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_log_probs_without_log_softmax(reduction):
    dtype = torch.float64
    logits, y, il, tl = _batch(dtype, seed=2)
    lp = logits.log_softmax(-1)
    (ld, gd), (lh, gh) = _both(lp, y, il, tl, reduction=reduction, fused_log_softmax=False)
    _close(ld, lh, 1e-12, "loss")
    _close(gd, gh, 1e-12, "grad")
    # the gradient lives on the blank column and each cell's next label only
    v = logits.shape[-1]
    allowed = torch.zeros(gd.shape, dtype=torch.bool)
    allowed[..., v - 1] = True
    for b in range(y.shape[0]):
        for u in range(y.shape[1]):
            allowed[b, :, u, y[b, u]] = True
    assert torch.all(gd[~allowed] == 0) and torch.any(gd[allowed] != 0)


def test_closed_form_empty_target_and_one_path():
    """U_b = 0: one path of T_b blanks; T_b = 1: U_b labels then the blank."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0, 0], [1, 4]])
    loss = dt.rnnt_loss(x, y, torch.tensor([4, 1]), torch.tensor([0, 2]), reduction="none",
                        impl="device")
    lp = x.detach().log_softmax(-1)
    assert loss[0].item() == pytest.approx(-lp[0, :, 0, 5].sum().item(), rel=1e-13)
    one = lp[1, 0, 0, 1] + lp[1, 0, 1, 4] + lp[1, 0, 2, 5]
    assert loss[1].item() == pytest.approx(-one.item(), rel=1e-13)
    loss.sum().backward()
    # one path: the gradient is softmax - onehot on the path's cells, 0 elsewhere
    sm = x.detach().softmax(-1)
    want = torch.zeros_like(sm)
    for u, k in ((0, 1), (1, 4), (2, 5)):
        want[1, 0, u] = sm[1, 0, u]
        want[1, 0, u, k] -= 1
    for t in range(4):
        want[0, t, 0] = sm[0, t, 0]
        want[0, t, 0, 5] -= 1
    _close(x.grad, want, 1e-13, "one-path gradient")


def test_long_rows_read_in_chunks(monkeypatch):
    """V larger than the class block: the online max and sum over chunks."""
    from duoloss.torch._triton import _rnnt_ops
    monkeypatch.setattr(_rnnt_ops, "_MAX_BLOCK_V", 8)
    logits, y, il, tl = _batch(torch.float64, seed=4, v=21)
    logits[0, 1, 1, 3] = 40.0   # a large logit in the first chunk, the label in another
    (ld, gd), (lh, gh) = _both(logits, y, il, tl, torch.tensor([1.0, 2.0, 3.0, 4.0]),
                               reduction="none", clamp=0.2)
    _close(ld, lh, 1e-12, "loss")
    _close(gd, gh, 1e-12, "grad")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_read_as_they_are(dtype):
    logits, y, il, tl = _batch(torch.float32, seed=5)
    half = logits.to(dtype)
    (ld, gd), (lh, gh) = _both(half, y, il, tl, reduction="none",
                               host_logits=half.to(torch.float64))
    assert ld.dtype == torch.float32 and gd.dtype == dtype
    _close(ld, lh, 1e-5, "half loss")
    _close(gd, gh, {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype] * 2, "half grad")


def test_nan_inf_and_dead_rows():
    """A NaN logit poisons its sequence only; a cell of -inf logits only has no
    move out (its gradient 0); a +inf logit gives NaN for its sequence (host
    policy)."""
    logits, y, il, tl = _batch(torch.float64, seed=6)
    clean = _both(logits, y, il, tl, reduction="none")[0]
    x = logits.clone()
    x[0, 1, 1, 2] = float("nan")
    x[1, 2, 0] = float("-inf")          # a dead cell of sequence 1
    x[2, 5, 0, 1] = float("inf")       # past T_b = 3 of sequence 2: never read
    (ld, gd), (lh, gh) = _both(x, y, il, tl, reduction="none")
    assert torch.isnan(ld[0]) and torch.isnan(lh[0])
    _close(ld[1:], lh[1:], 1e-12, "losses")
    _close(gd[1:], gh[1:], 1e-12, "grads")
    assert torch.equal(ld[2:], clean[0][2:]) and torch.equal(gd[2:], clean[1][2:])
    assert torch.all(gd[1, 2, 0] == 0)


def test_invalid_sequences_get_nan():
    """Traced calls are not checked on the host: the kernels mark a sequence with an
    out-of-range length or label (or the blank as a label) NaN, loss and gradient,
    and leave the others as they were."""
    from duoloss.torch._triton import _rnnt_ops
    logits, y, il, tl = _batch(torch.float64, seed=7, n=4)
    ok_l, ok_g = _both(logits, y, il, tl, reduction="none")[0]
    cases = [(il.clone().index_fill_(0, torch.tensor([1]), 7), tl, y),   # T_b > T
             (il, tl.clone().index_fill_(0, torch.tensor([1]), 4), y),   # U_b > U
             (il, tl, y.clone().index_put_((torch.tensor([1]), torch.tensor([0])),
                                           torch.tensor(4))),          # the blank
             (il, tl, y.clone().index_put_((torch.tensor([1]), torch.tensor([1])),
                                           torch.tensor(-1)))]
    for il_c, tl_c, y_c in cases:
        x = logits.clone().requires_grad_()
        loss = _rnnt_ops.rnnt(x, y_c, il_c, tl_c, blank=4, reduction="none", fused=True,
                              lam=0.0, delay=0.0, bound=-1.0)
        loss.sum().backward()
        assert torch.isnan(loss[1]) and torch.isnan(x.grad[1]).all()
        keep = torch.tensor([0, 2, 3])
        assert torch.equal(loss[keep], ok_l[keep]) and torch.equal(x.grad[keep], ok_g[keep])


def test_compile_fullgraph_equals_eager():
    dtype = torch.float64
    logits, y, il, tl = _batch(dtype, seed=8)

    def f(x):
        return dt.rnnt_loss(x, y, il, tl, reduction="mean", clamp=0.5, impl="device")

    xe = logits.clone().requires_grad_()
    eager = f(xe)
    eager.backward()
    xc = logits.clone().requires_grad_()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(xc)
    compiled.backward()
    _close(compiled, eager, 1e-12, "compiled loss")
    _close(xc.grad, xe.grad, 1e-12, "compiled grad")


def test_second_derivative_raises_and_func_grad():
    logits, y, il, tl = _batch(torch.float64, seed=9)
    x = logits.clone().requires_grad_()
    loss = dt.rnnt_loss(x, y, il, tl, impl="device")
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(NotImplementedError, match="rnnt_loss: second derivatives"):
        g.sum().backward()
    fg = torch.func.grad(lambda z: dt.rnnt_loss(z, y, il, tl, impl="device"))(logits)
    _close(fg, g, 1e-13, "torch.func.grad")


def _count_ops(step):
    """aten ops a step dispatches outside the kernels (launches stubbed), the
    bodies of duoloss's own operators included."""
    from torch.utils._python_dispatch import TorchDispatchMode
    import triton.runtime.interpreter as ti

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            if str(func).startswith("duoloss."):
                with self:
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    real = ti.InterpretedFunction.run
    ti.InterpretedFunction.run = lambda self, *a, **k: None
    try:
        with Count() as c:
            step()
    finally:
        ti.InterpretedFunction.run = real
    return sum(c.ops.values()), c.ops


@pytest.mark.parametrize("kw", [dict(), dict(reduction="none"), dict(clamp=1.0)])
def test_host_work_of_a_step(kw):
    """Forward + backward of ``rnnt_loss(impl='device')``: at most 30 aten ops
    (issue 33; 126 before the fused kernels), whatever the shape."""
    logits, y, il, tl = _batch(torch.float32, seed=10)
    counts = []
    for shape_logits in (logits, logits.repeat(2, 2, 1, 3)):
        n = shape_logits.shape[0]
        il_n, tl_n, y_n = il.repeat(n // 4), tl.repeat(n // 4), y.repeat(n // 4, 1)
        x = shape_logits.clone().requires_grad_()

        def step():
            loss = dt.rnnt_loss(x, y_n, il_n, tl_n, impl="device", **kw)
            loss.sum().backward()
            x.grad = None

        step()
        total, ops = _count_ops(step)
        assert total <= 30, ops
        counts.append(total)
    assert counts[0] == counts[1]


# ------------------------------------------------ tdt_loss, multiblank_rnnt_loss
def _dur_call(which, x, y, il, tl, impl, **kw):
    if which == "tdt":
        return dt.tdt_loss(x, y, il, tl, blank=4, durations=[0, 1, 3], impl=impl, **kw)
    if which in ("tdt_rnnt", "tdt_mix"):
        return dt.tdt_loss(x, y, il, tl, blank=4, durations=[0, 1, 3],
                           omega=1.0 if which == "tdt_rnnt" else 0.4, impl=impl, **kw)
    if which == "tdt_even":  # no path for an odd T_b
        return dt.tdt_loss(x, y, il, tl, blank=4, durations=[2], omega=0.25, impl=impl, **kw)
    return dt.multiblank_rnnt_loss(x, y, il, tl, blank=5, big_blank_durations=[2, 3],
                                   impl=impl, **kw)


def _dur_batch(which, dtype, seed=0, n=4, t=7, u=3):
    g = torch.Generator().manual_seed(seed)
    width = 5 + (1 if which == "tdt_even" else 3) if which.startswith("tdt") else 6
    x = (2 * torch.randn(n, t, u + 1, width, generator=g, dtype=torch.float64)).to(dtype)
    y = torch.randint(0, 3, (n, u), generator=g)
    return x, y, torch.tensor([t, t - 2, 3, 0][:n]), torch.tensor([u, u - 1, 0, 2][:n])


def _dur_both(which, x, y, il, tl, cot, host_x=None, **kw):
    out = []
    for impl, xi in (("device", x), ("host", x if host_x is None else host_x)):
        xi = xi.clone().requires_grad_()
        loss = _dur_call(which, xi, y, il, tl, impl, **kw)
        c = torch.ones_like(loss) if cot is None else cot.to(loss.dtype)
        (loss * c).sum().backward()
        out.append((loss.detach(), xi.grad))
    return out


@pytest.mark.parametrize("which", ["tdt", "tdt_rnnt", "tdt_mix", "tdt_even", "multiblank"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_duration_losses_equal_host(which, dtype):
    x, y, il, tl = _dur_batch(which, dtype, seed=11)
    kw = dict(reduction="mean", sigma=0.05, clamp=0.2, fastemit_lambda=0.1)
    (ld, gd), (lh, gh) = _dur_both(which, x, y, il, tl, None, **kw)
    assert ld.dtype == dtype and gd.dtype == dtype
    _close(ld, lh, TOL[dtype], f"{which} loss")
    _close(gd, gh, TOL[dtype], f"{which} grad")
    cot = torch.tensor([1.5, -0.5, 2.0, 0.25])
    (ld, gd), (lh, gh) = _dur_both(which, x, y, il, tl, cot, reduction="none")
    _close(ld, lh, TOL[dtype], f"{which} losses")
    _close(gd, gh, TOL[dtype], f"{which} grads")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_duration_half_logits(dtype):
    x, y, il, tl = _dur_batch("tdt", torch.float32, seed=12)
    half = x.to(dtype)
    (ld, gd), (lh, gh) = _dur_both("tdt", half, y, il, tl, None, host_x=half.double(),
                                   reduction="none")
    assert ld.dtype == dtype and gd.dtype == dtype  # (the loss in the logits' dtype)
    eps = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    _close(ld, lh, eps, "half loss")
    _close(gd, gh, 2 * eps, "half grad")


def test_duration_invalid_sequences_and_vmap():
    """The kernels mark a sequence with a bad length or label (a big blank as a
    label) NaN, loss and gradient; vmap folds into the batch and equals a loop."""
    from duoloss.torch._triton import _dur_ops
    x, y, il, tl = _dur_batch("multiblank", torch.float64, seed=13)
    spec = _dur_ops.multiblank_spec((2, 3), 0.0)
    ref_l, ref_g = _dur_both("multiblank", x, y, il, tl, None, reduction="none")[0]
    for il_c, y_c in ((il.clone().index_fill_(0, torch.tensor([1]), 8), y),
                      (il, y.clone().index_put_((torch.tensor([1]), torch.tensor([0])),
                                                torch.tensor(3)))):
        xi = x.clone().requires_grad_()
        loss = _dur_ops.dur_loss("multiblank_rnnt_loss", xi, y_c, il_c, tl, spec, blank=5,
                                 reduction="none", lam=0.0, clamp=-1.0)
        loss.sum().backward()
        assert torch.isnan(loss[1]) and torch.isnan(xi.grad[1]).all()
        keep = torch.tensor([0, 2, 3])
        assert torch.equal(loss[keep], ref_l[keep]) and torch.equal(xi.grad[keep], ref_g[keep])
    xs = torch.stack([x, x.flip(1)])

    def total(z):
        return _dur_call("multiblank", z, y, il, tl, "device", reduction="sum")

    grads = torch.func.vmap(torch.func.grad(total))(xs)
    _close(grads, torch.stack([torch.func.grad(total)(z) for z in xs]), 1e-13, "vmap(grad)")


@pytest.mark.parametrize("which", ["tdt", "multiblank"])
def test_duration_host_work_of_a_step(which):
    x, y, il, tl = _dur_batch(which, torch.float32, seed=14)
    xi = x.clone().requires_grad_()

    def step():
        _dur_call(which, xi, y, il, tl, "device").backward()
        xi.grad = None

    step()
    total, ops = _count_ops(step)
    assert total <= 30, ops


def test_validation_reads_once_with_the_same_checks(monkeypatch):
    """On a GPU, targets and lengths on the device are read for validation in one copy
    of their bytes (`duoloss.torch._args.read_ints_together`, mixed integer dtypes
    included): forced here on CPU tensors, the losses, gradients and every validation
    error (type and message) are those of one read per argument."""
    from duoloss.torch import _args
    logits, y, il, tl = _batch(torch.float64, seed=11)
    v = logits.shape[-1]
    bad = {"label >= V": (y.clone().index_fill_(1, torch.tensor([0]), v), il, tl),
           "blank label": (y.clone().index_fill_(1, torch.tensor([0]), v - 1), il, tl),
           "il > T": (y, il + 1, tl), "tl > U": (y, il, tl + 1),
           "negative tl": (y, il, tl - 10), "float lengths": (y, il.double(), tl)}
    forms = {"int64/int32": (y, il.int(), tl.int()),
             "int16/uint8": (y.short(), il.to(torch.uint8), tl.to(torch.int8)),
             # strided: transposed targets, every other entry of a longer length row
             "strided": (y.t().contiguous().t(), torch.stack([il, il], 1)[:, 0],
                         torch.stack([tl, tl], 1)[:, 1].int())}

    def outcomes():
        res = {}
        for what, a in forms.items():
            x = logits.clone().requires_grad_()
            loss = dt.rnnt_loss(x, *a, reduction="none", impl="device")
            loss.sum().backward()
            res[what] = (loss.detach(), x.grad)
        for what, a in bad.items():
            with pytest.raises((ValueError, TypeError)) as e:
                dt.rnnt_loss(logits, *a, impl="device")
            res[what] = (type(e.value), str(e.value))
        return res

    separate = outcomes()
    calls = []
    real = _args.read_ints_together
    monkeypatch.setattr(_args, "read_together_applies",
                        lambda dev, xs: all(x.dtype in (torch.int8, torch.uint8, torch.int16,
                                                        torch.int32, torch.int64) for x in xs))
    monkeypatch.setattr(_args, "read_ints_together", lambda xs: calls.append(1) or real(xs))
    together = outcomes()
    assert len(calls) == len(forms) + len(bad) - 1    # (float lengths: read one by one)
    for what in forms:
        (la, ga), (lb, gb) = together.pop(what), separate.pop(what)
        assert torch.equal(la, lb) and torch.equal(ga, gb), what
    assert together == separate
