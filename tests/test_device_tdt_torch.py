"""TDT and multi-blank RNN-T on the torch device path (Triton, ``impl='device'``)
against the host path (the numba core, itself tested against brute-force path
enumeration and NeMo's semantics in tests/test_tdt.py / tests/test_multiblank.py)
and against JAX's device path (pure XLA) on the same inputs.

No GPU here: the kernel runs on CPU tensors in Triton's interpreter, selected with
``TRITON_INTERPRET=1`` for this module only (as tests/test_device_torch.py).
Tiny sizes: the interpreter runs each program's loops in Python.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import duoloss.torch as dt  # noqa: E402
from test_device_torch import _close, interpreted  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    yield from interpreted("_dur_kernels")


def _logits(seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _both(f, x, targets, il, tl, cot=None, **kw):
    """``[(loss, grad) device, (loss, grad) host]`` of ``(loss * cot).sum()``."""
    out = []
    for impl in ("device", "host"):
        xi = x.clone().requires_grad_()
        loss = f(xi, targets, il, tl, impl=impl, **kw)
        (loss * (1 if cot is None else cot)).sum().backward()
        out.append((loss, xi.grad))
    return out


def _check(f, x, targets, il, tl, dtype, cot=None, **kw):
    (ld, gd), (lh, gh) = _both(f, x, targets, il, tl, cot, **kw)
    assert ld.dtype == dtype and gd.dtype == dtype
    _close(ld, lh, dtype, f"{f.__name__} loss {kw}")
    _close(gd, gh, dtype, f"{f.__name__} grad {kw}")
    return ld, gd


#: ``(tiles, dtype)``: the recursion's default form in both dtypes, the others in
#: float64 (the suite runs twice in CI: each interpreter case counts)
FORMS = pytest.mark.parametrize(
    "tiles,dtype", [("prefetch", torch.float64), ("prefetch", torch.float32),
                    ("unrolled", torch.float64), ("looped", torch.float64)],
    ids=["prefetch-f64", "prefetch-f32", "unrolled-f64", "looped-f64"], indirect=["tiles"])


@pytest.fixture(params=["prefetch", "unrolled", "looped"])
def tiles(request, monkeypatch):
    """The recursion's three forms (`_dur_ops.recursion_tiles`): every move of a frame
    in one tile with its weights loaded a frame ahead (what these sizes get), two
    moves per tile unrolled, one move per tile in a loop (what large ``U`` gets)."""
    from duoloss.torch._triton import _dur_ops
    if request.param != "prefetch":
        rule = _dur_ops.recursion_tiles

        def forced(block, moves, dtype):
            nw, t = rule(block, moves, dtype)
            mc = 2 if request.param == "unrolled" else 1
            return nw, dict(t, MC=mc, PREFETCH=False, UNROLL=request.param == "unrolled")
        monkeypatch.setattr(_dur_ops, "recursion_tiles", forced)
    return request.param


TDT_CASES = [
    # durations with 0 (the within-frame label chain), NeMo's options, a cotangent
    dict(durations=[0, 1, 2], blank=3, sigma=0.05, fastemit_lambda=0.1, clamp=0.3,
         reduction="none"),
    # no duration 0, long jumps past T_b, the omega mixture, batch mean
    dict(durations=[1, 2, 3, 4, 5], blank=3, omega=0.4, reduction="mean"),
    # blank not last, NeMo's recommended durations, only the RNN-T part (omega = 1)
    dict(durations=[0, 1, 2, 3, 4], blank=0, omega=1.0, reduction="sum"),
]


@FORMS
@pytest.mark.parametrize("case", range(len(TDT_CASES)), ids=["d012-opts", "d1-5-omega",
                                                               "d0-4-blank0-rnnt"])
def test_tdt_device_equals_host(case, dtype, tiles):
    kw = dict(TDT_CASES[case])
    n_dur = len(kw["durations"])
    x = _logits(case, (2, 6, 3, 4 + n_dur), dtype)
    targets = torch.tensor([[1, 2], [2, 0]]) if kw["blank"] == 3 else torch.tensor([[1, 3],
                                                                                  [2, 0]])
    il, tl = torch.tensor([6, 4]), torch.tensor([2, 1])
    cot = torch.tensor([0.5, -2.0], dtype=dtype) if kw["reduction"] == "none" else None
    loss, grad = _check(dt.tdt_loss, x, targets, il, tl, dtype, cot, **kw)
    assert torch.isfinite(loss).all() and grad[1, 4:].abs().max() == 0  # past T_b: zero


def test_tdt_infeasible_inf_zero_grad_and_nan(tiles):
    """``durations=[2]`` and an odd ``T_b``: no path, ``+inf`` and zero gradient
    (the other sequence unaffected); a NaN logit inside a box: NaN loss and NaN
    gradient over that box, as the core."""
    dtype = torch.float64
    x = _logits(7, (2, 5, 2, 3 + 1), dtype)
    targets = torch.tensor([[1], [0]])
    loss, grad = _check(dt.tdt_loss, x, targets, torch.tensor([5, 4]), torch.tensor([1, 1]),
                        dtype, reduction="none", durations=[2], blank=2)
    assert torch.isinf(loss[0]) and loss[0] > 0 and torch.isfinite(loss[1])
    assert grad[0].abs().max() == 0 and grad[1].abs().max() > 0
    x = _logits(8, (2, 5, 2, 3 + 2), dtype)
    x[1, 1, 0, 0] = float("nan")
    loss, grad = _check(dt.tdt_loss, x, targets, torch.tensor([5, 4]), torch.tensor([1, 1]),
                        dtype, reduction="none", durations=[1, 2], blank=2)
    assert torch.isnan(loss[1]) and torch.isnan(grad[1]).any() and not torch.isnan(grad[0]).any()


@FORMS
def test_multiblank_device_equals_host(dtype, tiles):
    """Big blanks of durations 2 and 3 at ``blank - 1``, ``blank - 2``; sigma,
    FastEmit and clamp on every logit."""
    x = _logits(11, (2, 6, 3, 6), dtype)
    targets = torch.tensor([[1, 0], [2, 0]])
    cot = torch.tensor([1.5, -0.5], dtype=dtype)
    loss, _ = _check(dt.multiblank_rnnt_loss, x, targets, torch.tensor([6, 5]),
                     torch.tensor([2, 1]), dtype, cot, blank=5, big_blank_durations=[2, 3],
                     sigma=0.05, fastemit_lambda=0.2, clamp=0.4, reduction="none")
    assert torch.isfinite(loss).all()


def test_closed_form_on_device():
    """The docstring examples' hand counts: TDT log 27, multi-blank -log(2/64 + 1/16)."""
    loss = dt.tdt_loss(torch.zeros((1, 2, 2, 5), dtype=torch.float64), torch.tensor([[0]]),
                       (2,), (1,), blank=2, durations=[0, 1], impl="device")
    assert abs(float(loss) - np.log(27.0)) < 1e-12
    loss = dt.multiblank_rnnt_loss(torch.zeros((1, 2, 2, 4), dtype=torch.float64),
                                   torch.tensor([[0]]), (2,), (1,), blank=3,
                                   big_blank_durations=[2], impl="device")
    assert abs(float(loss) + np.log(2 / 64 + 1 / 16)) < 1e-12


def test_torch_device_equals_jax_device():
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj
    x = _logits(3, (2, 5, 3, 4 + 3), torch.float64)
    targets = torch.tensor([[1, 2], [0, 0]])
    il, tl = (5, 3), (2, 1)
    kw = dict(blank=3, durations=[0, 1, 2], sigma=0.05, fastemit_lambda=0.1, omega=0.25,
              reduction="sum")
    xi = x.clone().requires_grad_()
    ours = dt.tdt_loss(xi, targets, il, tl, impl="device", **kw)
    ours.backward()
    with jax.enable_x64(True):
        jnp = jax.numpy
        theirs, g = jax.value_and_grad(
            lambda z: dj.tdt_loss(z, targets.numpy(), il, tl, impl="device", **kw))(
                jnp.asarray(x.numpy()))
        _close(ours, torch.tensor(float(theirs), dtype=torch.float64), torch.float64,
               "tdt torch vs jax")
        _close(xi.grad, torch.from_numpy(np.array(g)), torch.float64, "tdt grad torch vs jax")


def test_module_and_no_grad():
    """``TDTLoss(impl='device')`` is the function; no-grad gives the same loss."""
    x = _logits(5, (1, 4, 2, 3 + 2), torch.float64)
    targets, il, tl = torch.tensor([[1]]), (4,), (1,)
    a = dt.TDTLoss(2, [1, 2], impl="device")(x, targets, il, tl)
    with torch.no_grad():
        b = dt.tdt_loss(x, targets, il, tl, 2, [1, 2], impl="device")
    c = dt.tdt_loss(x, targets, il, tl, 2, [1, 2], impl="host")
    assert torch.equal(a, b)
    _close(a, c, torch.float64, "module")


@pytest.mark.parametrize("shape,tg,il,tl", [
    ((0, 3, 2, 5), [[0]][:0], [], []),          # N = 0
    ((2, 0, 2, 5), [[1], [0]], [0, 0], [0, 1]),  # T = 0: 0 for an empty target, else +inf
    ((2, 3, 1, 5), [[], []], [3, 2], [0, 0]),    # U = 0
], ids=["N0", "T0", "U0"])
def test_empty_shapes(shape, tg, il, tl):
    x = _logits(9, shape, torch.float64)
    targets = torch.tensor(tg, dtype=torch.int64).reshape(shape[0], shape[2] - 1)
    _check(dt.tdt_loss, x, targets, torch.tensor(il, dtype=torch.int64),
           torch.tensor(tl, dtype=torch.int64), torch.float64, reduction="sum", blank=2,
           durations=[0, 1])


def test_half_runs_in_float32():
    x = _logits(10, (2, 3, 2, 5), torch.float32).half()
    (ld, gd), (lh, gh) = _both(dt.tdt_loss, x, torch.tensor([[1], [0]]), (3, 2), (1, 1),
                               blank=2, durations=[0, 1])
    assert ld.dtype == gd.dtype == torch.float16
    assert torch.equal(ld, lh) and (gd.float() - gh.float()).abs().max() <= 1e-3


def test_func_grad_and_second_order_raises():
    x = _logits(12, (2, 4, 2, 5), torch.float64)
    targets = torch.tensor([[1], [0]])

    def f(z, impl):
        return dt.tdt_loss(z, targets, (4, 3), (1, 1), blank=2, durations=[0, 1], impl=impl)

    _close(torch.func.grad(f)(x, "device"), torch.func.grad(f)(x, "host"), torch.float64,
           "torch.func.grad")
    xi = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xi, "device"), xi, create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives are not implemented"):
        g.sum().backward()


def test_torch_compile_takes_the_host_path():
    """``impl='device'`` traced by ``torch.compile(fullgraph=True)`` compiles (the host
    operator) and equals the eager device path."""
    x = _logits(13, (2, 4, 2, 5), torch.float64)
    targets, il, tl = torch.tensor([[1], [0]]), torch.tensor([4, 3]), torch.tensor([1, 1])

    def f(z):
        return dt.tdt_loss(z, targets, il, tl, blank=2, durations=[0, 1], impl="device")

    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    lc = torch.compile(f, fullgraph=True, backend="aot_eager")(xc)
    lc.backward()
    le = f(xe)
    le.backward()
    _close(lc, le, torch.float64, "compiled loss")
    _close(xc.grad, xe.grad, torch.float64, "compiled grad")


@pytest.mark.parametrize("kind", ["tdt", "tdt omega", "multiblank"])
def test_forward_keeps_no_logits_sized_tensor(kind):
    """Memory (issue 27): between forward and backward the device path keeps only the
    gradient's ``(N, T, U + 1)``-sized factors, never a tensor as large as the logits
    (the saved-tensor hooks see every tensor autograd keeps); the gradient it then
    builds in place equals the host path's."""
    x = _logits(21, (2, 5, 3, 40), torch.float64)
    targets, il, tl = torch.tensor([[1, 2], [3, 1]]), torch.tensor([5, 4]), torch.tensor([2, 1])
    if kind == "multiblank":
        f = dt.multiblank_rnnt_loss
        kw = dict(blank=35, big_blank_durations=[2, 3])
    else:
        f = dt.tdt_loss
        x = x[..., :38].contiguous()
        kw = dict(blank=0, durations=[0, 1, 2], omega=0.3 if "omega" in kind else 0.0)
    xi = x.clone().requires_grad_()
    saved = []

    def pack(t):
        saved.append((t.numel(), t.data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = f(xi, targets, il, tl, impl="device", reduction="sum", **kw)
    big = [n for n, ptr in saved if n >= xi.numel() // 4 and ptr != xi.data_ptr()]
    assert big == [], saved
    loss.backward()
    (_, gh), = _both(f, x, targets, il, tl, reduction="sum", **kw)[1:]
    _close(xi.grad, gh, torch.float64, f"{kind} grad")


def test_validation_reads_once_with_the_same_checks(monkeypatch):
    """On a GPU, targets and lengths on the device are read for validation in one copy
    (`duoloss.torch._args.read_ints_together`): forced here on CPU tensors, TDT's and
    multi-blank's losses, gradients and validation errors are those of one read per
    argument, with mixed integer dtypes."""
    from duoloss.torch import _args
    x = _logits(5, (2, 6, 3, 4 + 3), torch.float64)
    targets, il, tl = torch.tensor([[1, 2], [2, 0]]), torch.tensor([6, 4]), torch.tensor([2, 1])
    calls = {"tdt": lambda z, a: dt.tdt_loss(z, *a, blank=3, durations=[0, 1, 2],
                                             reduction="none", impl="device"),
             "multiblank": lambda z, a: dt.multiblank_rnnt_loss(
                 z[..., :6], *a, blank=5, big_blank_durations=(2, 4), reduction="none",
                 impl="device")}
    good = {"int32": (targets.int(), il.int(), tl.int()),
            "int64/int16": (targets, il.short(), tl.to(torch.uint8))}
    bad = {"label out of range": (targets + 7, il, tl), "il > T": (targets, il + 3, tl),
           "tl > U": (targets, il, tl + 2)}

    def outcomes():
        res = {}
        for name, f in calls.items():
            for what, a in good.items():
                z = x.clone().requires_grad_()
                loss = f(z, a)
                loss.sum().backward()
                res[name, what] = (loss.detach(), z.grad)
            for what, a in bad.items():
                with pytest.raises((ValueError, TypeError)) as e:
                    f(x, a)
                res[name, what] = (type(e.value), str(e.value))
        return res

    separate = outcomes()
    seen = []
    real = _args.read_ints_together
    monkeypatch.setattr(_args, "read_together_applies", lambda dev, xs: True)
    monkeypatch.setattr(_args, "read_ints_together", lambda xs: seen.append(1) or real(xs))
    together = outcomes()
    assert len(seen) == len(calls) * (len(good) + len(bad))
    for key in list(separate):
        a, b = together.pop(key), separate.pop(key)
        if isinstance(a[0], torch.Tensor):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), key
        else:
            assert a == b, key
