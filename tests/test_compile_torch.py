"""torch.compile(fullgraph=True) through the ``duoloss::kernel_loss`` custom operator.

Every kernel the torch frontends use is captured from an eager frontend call
(so a new loss is covered without touching this file) and then compiled with
``fullgraph=True`` (a graph break is an error), forward and backward, against
the same function run eagerly.  One end-to-end model (Linear + log_softmax +
CTC + backward) goes through the default inductor backend and is also checked
against ``torch.nn.functional.ctc_loss``.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch._dynamo.testing

import duoloss.torch as dt
import duoloss.torch._adapter as adapter
from duoloss.core import CTC_KERNEL
from test_func_torch import CASES, IDS

FRONTENDS = ("duoloss.torch._ctc", "duoloss.torch._asg", "duoloss.torch._graph_loss")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def capture(case, reduction):
    """The (kernel, inputs, weights, static) the frontend hands to ``apply_kernel``."""
    seen = []
    real = adapter.apply_kernel
    real_eager = adapter.apply_kernel_eager
    mp = pytest.MonkeyPatch()
    try:
        for name in FRONTENDS:
            mod = importlib.import_module(name)

            def spy(kernel, tensors, *, weights=None, **static):
                seen.append((kernel, tuple(tensors), weights, static))
                return real(kernel, tensors, weights=weights, **static)

            def spy_eager(kernel, tensors, want, weights, static):
                seen.append((kernel, tuple(tensors), weights, dict(static)))
                return real_eager(kernel, tensors, want, weights, static)
            mp.setattr(mod, "apply_kernel", spy)
            if hasattr(mod, "apply_kernel_eager"):  # a frontend's short path
                mp.setattr(mod, "apply_kernel_eager", spy_eager)
        case.call(*case.args, reduction=reduction)
    finally:
        mp.undo()
    assert len(seen) == 1
    return seen[0]


def kernel_fn(kernel, tensors, weights, static):
    """f(*params): the kernel's loss, each differentiable input replaced by a model op on a
    parameter (so the compiled graph has real work before and after the operator)."""
    pos = [i for i, (d, t) in enumerate(zip(kernel.differentiable, tensors))
           if d and isinstance(t, torch.Tensor) and t.is_floating_point()]

    def f(*params):
        inputs = list(tensors)
        for i, p in zip(pos, params):
            inputs[i] = torch.tanh(p) * 2.0
        return adapter.apply_kernel(kernel, inputs, weights=weights, **static)

    return f, [tensors[i].detach().clone() for i in pos]


def eager_and_compiled(f, params, backend, backward_inside):
    def step(*ps):
        loss = f(*ps)
        gs = torch.autograd.grad(loss.sum(), ps)
        return loss.detach(), gs

    leaves = [p.clone().requires_grad_() for p in params]
    ref = step(*leaves)
    leaves = [p.clone().requires_grad_() for p in params]
    if backward_inside:
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            got = torch.compile(step, backend=backend, fullgraph=True)(*leaves)
    else:  # the usual pattern: compiled forward, AOTAutograd-compiled backward
        loss = torch.compile(f, backend=backend, fullgraph=True)(*leaves)
        got = loss.detach(), torch.autograd.grad(loss.sum(), leaves)
    return ref, got


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("backward_inside", [False, True], ids=["bwd_outside", "bwd_inside"])
def test_every_kernel_compiles_fullgraph_and_matches_eager(case, reduction, backward_inside):
    f, params = kernel_fn(*capture(case, reduction))
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    (l0, g0), (l1, g1) = eager_and_compiled(f, params, counter, backward_inside)
    assert counter.frame_count == 1  # one graph, no break
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert b.abs().max() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_vmap_folds_into_one_operator_call(case):
    """torch.compile(torch.func.vmap(loss)): the operator's vmap rule, against eager vmap."""
    f, params = kernel_fn(*capture(case, "mean"))
    rng = np.random.default_rng(2)
    stacked = [p + torch.tensor(rng.standard_normal((3,) + p.shape) * 0.1) for p in params]
    in_dims = (0,) + (None,) * (len(params) - 1)  # vmap the per-sequence input only
    args = [stacked[0]] + params[1:]
    ref = torch.func.vmap(f, in_dims=in_dims)(*args)
    got = torch.compile(torch.func.vmap(f, in_dims=in_dims), backend="aot_eager",
                        fullgraph=True)(*args)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    if len(params) > 1:  # a vmapped shared input: one operator call per copy
        got = torch.compile(torch.func.vmap(f), backend="aot_eager", fullgraph=True)(*stacked)
        torch.testing.assert_close(got, torch.func.vmap(f)(*stacked), rtol=1e-12, atol=1e-12)


def test_compiled_vmap_backward_raises_instead_of_dropping_the_gradient():
    """Differentiating torch.compile(torch.func.vmap(loss)): the traced inputs hide
    requires_grad, so the operator computes no gradient; the backward must say so
    rather than leave ``x.grad`` silently None (the uncompiled vmap differentiates)."""
    torch.manual_seed(0)
    t, n, c, s = 6, 2, 4, 2
    x = torch.randn(3, t, n, c, dtype=torch.float64, requires_grad=True)
    tg = torch.randint(1, c, (n, s))
    il, tl = torch.full((n,), t), torch.full((n,), s)

    def f(z):
        return dt.ctc_loss(z.log_softmax(-1), tg, il, tl, reduction="sum")

    torch.func.vmap(f)(x).sum().backward()
    assert x.grad is not None and x.grad.abs().max() > 0
    x.grad = None
    compiled = torch.compile(torch.func.vmap(f), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match="computed no gradient"):
        compiled(x).sum().backward()
    assert x.grad is None


@pytest.mark.xfail(strict=True, reason="pytorch#168393: a custom op with register_autograd "
                   "cannot run under torch.func.grad, and compiled code must use the op; "
                   "eager torch.func.grad/vmap(grad) work (test_func_torch.py)")
def test_compiled_func_grad():
    f, params = kernel_fn(*capture(CASES[0], "mean"))
    torch.compile(torch.func.grad(f), backend="aot_eager", fullgraph=True)(*params)


def test_operator_is_in_the_graph():
    """The compiled graph calls duoloss::kernel_loss (not a fallback to eager)."""
    f, params = kernel_fn(*capture(CASES[0], "mean"))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(f, backend=backend, fullgraph=True)(*params)
    assert "duoloss.kernel_loss" in graphs[0].code


def _local_kernel():
    from duoloss.core import LossKernel

    def run(arrays, want, **static):  # not reachable by import
        return CTC_KERNEL.run(arrays, want, **static)
    return LossKernel("local", run, CTC_KERNEL.batch_axes, CTC_KERNEL.differentiable)


def test_kernel_must_be_importable_under_compile():
    kernel = _local_kernel()
    ints = (np.ones((1, 1), np.int64), np.ones(1, np.int64), np.ones(1, np.int64))
    f = torch.compile(lambda x: adapter.apply_kernel(kernel, (x,) + ints, blank=0),
                      backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="module-level function"):
        f(torch.zeros(2, 1, 3))


def test_static_args_must_be_plain_values():
    f = torch.compile(lambda x: adapter.apply_kernel(
        CTC_KERNEL, (x, np.ones((1, 1), np.int64), np.ones(1, np.int64), np.ones(1, np.int64)),
        blank=(0, 1)), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="static argument 'blank'"):
        f(torch.zeros(2, 1, 3))


class TinyModel(torch.nn.Module):
    def __init__(self, feat, n_cls):
        super().__init__()
        self.proj = torch.nn.Linear(feat, n_cls)

    def forward(self, x):
        return self.proj(x).log_softmax(-1)


def _batch(rng, t, n, feat, n_cls, s):
    x = torch.tensor(rng.standard_normal((t, n, feat)), dtype=torch.float32)
    tg = torch.tensor(rng.integers(1, n_cls, (n, s)))
    il = torch.tensor(rng.integers(t - 3, t + 1, n))
    tl = torch.tensor(rng.integers(1, s + 1, n))
    return x, tg, il, tl


def test_inductor_model_loss_backward_fullgraph_matches_eager_and_torch():
    """Linear + log_softmax + loss + backward in one inductor graph; integer inputs are
    graph inputs, the 'mean' weights are computed in the graph."""
    torch.manual_seed(0)
    model = TinyModel(6, 5)
    rng = np.random.default_rng(0)

    def loss_fn(x, tg, il, tl):
        lp = model(x)
        w = adapter.reduction_weights("mean", tl)
        return adapter.apply_kernel(CTC_KERNEL, (lp, tg, il, tl), weights=w, blank=0,
                                    zero_infinity=False)

    def step(x, tg, il, tl):
        loss = loss_fn(x, tg, il, tl)
        gs = torch.autograd.grad(loss, list(model.parameters()))
        return loss.detach(), gs

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(step, fullgraph=True)
        for n in (4, 4):  # the second call reuses the compiled graph
            batch = _batch(rng, 12, n, 6, 5, 4)
            loss, gs = compiled(*batch)
            ref_loss, ref_gs = step(*batch)
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
            x, tg, il, tl = batch
            torch_loss = torch.nn.functional.ctc_loss(model(x), tg, il, tl)
            torch_gs = torch.autograd.grad(torch_loss, list(model.parameters()))
            torch.testing.assert_close(loss, torch_loss.detach(), rtol=1e-4, atol=1e-5)
            for a, b, c in zip(gs, ref_gs, torch_gs):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(a, c, rtol=1e-3, atol=1e-4)


def test_dynamic_shapes_one_graph_for_all_sizes():
    """With dynamic=True the fake rule's symbolic shapes serve every (T, N, S)."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def f(x, tg, il, tl):
        return adapter.apply_kernel(CTC_KERNEL, (x.log_softmax(-1), tg, il, tl),
                                    weights=adapter.reduction_weights("sum", tl), blank=0,
                                    zero_infinity=False)

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    rng = np.random.default_rng(1)
    for t, n, s in ((10, 3, 4), (14, 5, 3), (9, 2, 2)):
        x, tg, il, tl = _batch(rng, t, n, 5, 5, s)
        x.requires_grad_()
        got = compiled(x, tg, il, tl)
        (g,) = torch.autograd.grad(got, x)
        ref = f(x, tg, il, tl)
        (rg,) = torch.autograd.grad(ref, x)
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(g, rg)
    assert counter.frame_count == 1


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_frontend_compiles_fullgraph(case):
    """The public loss (validation included) + backward in one graph, as in eager."""
    f = lambda *a: case.call(*a, reduction="mean")  # noqa: E731
    params = [torch.nn.Parameter(a.clone()) for a in case.args]
    (l0, g0), (l1, g1) = eager_and_compiled(f, params, "aot_eager", backward_inside=True)
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_frontend_ctc_compiled_with_tensor_ints_and_concatenated_targets():
    """Integer inputs as graph inputs (tensors, concatenated targets): one graph serves
    new values; results match eager, where the values are validated on the host."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = lambda x, tg, il, tl: dt.ctc_loss(x.log_softmax(-1), tg, il, tl,  # noqa: E731
                                          reduction="sum")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    rng = np.random.default_rng(4)
    for _ in range(2):
        x = torch.tensor(rng.standard_normal((10, 3, 5)), requires_grad=True)
        tl = torch.tensor(rng.permutation([1, 2, 3]))  # same total: same shapes
        tg = torch.tensor(rng.integers(1, 5, int(tl.sum())))
        il = torch.tensor([10, 9, 8])
        got, ref = compiled(x, tg, il, tl), f(x, tg, il, tl)
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(torch.autograd.grad(got, x)[0],
                                   torch.autograd.grad(ref, x)[0])
    assert counter.frame_count == 1


def test_eager_and_func_do_not_use_the_operator(monkeypatch):
    """pytorch#168393: the operator would break torch.func.grad, so eager stays off it."""
    def boom(*a, **k):
        raise AssertionError("custom op used outside torch.compile")
    monkeypatch.setattr(adapter, "kernel_loss_op", boom)
    case = CASES[0]
    case.call(*case.args)
    torch.func.grad(lambda x: case.call(x))(case.args[0])
    torch.func.vmap(lambda x: case.call(x, reduction="none"))(case.args[0][None])


def test_graph_loss_frontend_compiles_and_matches_ctc_loss():
    """graph_loss with CTC target graphs: compiled == eager == ctc_loss.

    Its graphs are host objects that are packed and validated with numpy, so
    dynamo breaks the graph there (no ``fullgraph``); the kernel itself compiles
    fullgraph (``test_every_kernel_compiles_fullgraph_and_matches_eager``)."""
    from test_graph_loss import ctc_graph

    rng = np.random.default_rng(3)
    t_len, n, c = 12, 3, 5
    targets = [[1, 2, 2], [3], [4, 1]]
    graphs = [ctc_graph(tg) for tg in targets]
    x = torch.tensor(rng.normal(size=(t_len, n, c)), requires_grad=True)
    f = lambda z: dt.graph_loss(z.log_softmax(-1), graphs, [t_len] * n,  # noqa: E731
                                reduction="sum")
    eager = f(x)
    (g_eager,) = torch.autograd.grad(eager, x)
    compiled = torch.compile(f, backend="aot_eager")(x)
    (g_comp,) = torch.autograd.grad(compiled, x)
    padded = torch.tensor([tg + [0] * (3 - len(tg)) for tg in targets])
    ref = torch.nn.functional.ctc_loss(x.log_softmax(-1), padded, [t_len] * n,
                                       [len(tg) for tg in targets], reduction="sum")
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_comp, g_eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(eager, ref, rtol=1e-10, atol=1e-10)
