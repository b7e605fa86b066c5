"""torch.func on every loss: grad, vjp, vmap (one core call), and their compositions.

References are independent of the transform under test: ``torch.func.grad`` and
``vjp`` against eager autograd, ``vmap`` against a Python loop of eager calls,
per-example gradients (``vmap(grad)``) against a loop of eager backward passes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Tuple

import numpy as np
import pytest
import torch
from torch.func import grad, vjp, vmap

import duoloss.torch as dt
import duoloss.torch._adapter as adapter
from test_graph_loss import ctc_graph

T, N, C, S = 9, 3, 5, 3
B = 3  # vmapped copies


class Case(NamedTuple):
    name: str
    module: str  # frontend module holding the kernel constant (for call counting)
    kernel_attr: str
    args: Tuple[torch.Tensor, ...]  # float inputs (all differentiable)
    call: Callable  # call(*args, reduction=...) -> losses
    shared: Tuple[bool, ...]  # per float input: shared by the batch (not per-sequence)


def _ints(rng):
    tg = torch.tensor(rng.integers(1, C, (N, S)))
    il = torch.tensor([T, T - 1, T - 3])
    tl = torch.tensor([S, S - 1, 1])
    return tg, il, tl


def make_cases(dtype=torch.float64, seed=0):
    """One case per loss (and per kernel) of the torch frontend."""
    rng = np.random.default_rng(seed)
    tg, il, tl = _ints(rng)

    def rand(*shape, scale=1.0):
        return torch.tensor(rng.standard_normal(shape) * scale, dtype=dtype)

    graphs = [ctc_graph([int(v) for v in tg[b, :tl[b]]]) for b in range(N)]
    idx = [rng.integers(-1, 2, g.num_arcs()) for g in graphs]
    return [
        Case("ctc", "duoloss.torch._ctc", "CTC_KERNEL", (rand(T, N, C),),
             lambda x, reduction="mean": dt.ctc_loss(x.log_softmax(-1), tg, il, tl,
                                                     reduction=reduction),
             (False,)),
        Case("asg", "duoloss.torch._asg", "ASG_KERNEL",
             (rand(T, N, C), rand(C, C, scale=0.3), rand(C, scale=0.3)),
             lambda e, a, s, reduction="mean": dt.asg_loss(e, a, tg, il, tl, start_transitions=s,
                                                           reduction=reduction),
             (False, True, True)),
        Case("asg_no_transitions", "duoloss.torch._asg", "ASG_NO_TRANSITIONS_KERNEL",
             (rand(T, N, C),),
             lambda e, reduction="mean": dt.asg_loss(e, None, tg, il, tl, reduction=reduction),
             (False,)),
        Case("graph", "duoloss.torch._graph_loss", "GRAPH_LOSS_KERNEL",
             (rand(T, N, C), rand(2, scale=0.3)),
             lambda e, w, reduction="mean": dt.graph_loss(
                 e, graphs, il, weights=w, arc_weight_index=idx, normalize=True,
                 target_lengths=tl, reduction=reduction),
             (False, True)),
    ]


CASES = make_cases()
IDS = [c.name for c in CASES]


@pytest.fixture
def count_calls(monkeypatch):
    """Wrap a frontend's kernel so that its core calls are counted."""
    counts = {}

    def install(case: Case):
        import importlib
        mod = importlib.import_module(case.module)
        kernel = getattr(mod, case.kernel_attr)
        counts[case.name] = 0

        def run(arrays, want, **static):
            counts[case.name] += 1
            return kernel.run(arrays, want, **static)

        monkeypatch.setattr(mod, case.kernel_attr, dataclasses.replace(kernel, run=run))
        return lambda: counts[case.name]

    return install


def eager_grads(case, args, reduction="mean", cotangent=None):
    leaves = [a.clone().requires_grad_() for a in args]
    out = case.call(*leaves, reduction=reduction)
    gs = torch.autograd.grad(out, leaves, cotangent)
    return out.detach(), gs


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_func_grad_matches_autograd(case, reduction):
    _, ref = eager_grads(case, case.args, reduction)
    got = grad(lambda *a: case.call(*a, reduction=reduction), argnums=tuple(range(len(case.args))))(
        *case.args)
    for g, r in zip(got, ref):
        close(g, r)
        assert g.abs().max() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_func_vjp_matches_autograd(case):
    ct = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    out_ref, ref = eager_grads(case, case.args, "none", ct)
    out, fn = vjp(lambda *a: case.call(*a, reduction="none"), *case.args)
    close(out, out_ref)
    for g, r in zip(fn(ct), ref):
        close(g, r)


def _stack(case, seed=1):
    """B different copies of each per-sequence float input (shared inputs too)."""
    rng = np.random.default_rng(seed)
    return tuple(a + torch.tensor(rng.standard_normal((B,) + a.shape) * 0.2, dtype=a.dtype)
                 for a in case.args)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_vmap_matches_loop_with_one_core_call(case, reduction, count_calls):
    stacked = _stack(case)
    # vmap over the per-sequence inputs; shared ones (transitions, arc weights) fixed
    in_dims = tuple(None if sh else 0 for sh in case.shared)
    loop = torch.stack([case.call(*[s[i] if d == 0 else a for s, a, d in
                                    zip(stacked, case.args, in_dims)], reduction=reduction)
                        for i in range(B)])
    calls = count_calls(case)
    got = vmap(lambda *a: case.call(*a, reduction=reduction), in_dims=in_dims)(
        *[s if d == 0 else a for s, a, d in zip(stacked, case.args, in_dims)])
    assert calls() == 1
    close(got, loop)


@pytest.mark.parametrize("case", [c for c in CASES if any(c.shared)], ids=lambda c: c.name)
def test_vmap_over_shared_inputs_matches_loop(case, count_calls):
    """A vmapped transition matrix cannot be folded into the batch: one call per copy."""
    stacked = _stack(case)
    loop = torch.stack([case.call(*[s[i] for s in stacked], reduction="none") for i in range(B)])
    calls = count_calls(case)
    got = vmap(lambda *a: case.call(*a, reduction="none"))(*stacked)
    assert calls() == B
    close(got, loop)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_per_example_gradients_vmap_grad(case):
    """vmap(grad(f)) and grad(sum vmap(f)) against a loop of eager backward passes."""
    stacked = _stack(case)
    argnums = tuple(range(len(case.args)))
    f = lambda *a: case.call(*a, reduction="mean")  # noqa: E731
    loop = [eager_grads(case, [s[i] for s in stacked])[1] for i in range(B)]
    per_example = vmap(grad(f, argnums=argnums))(*stacked)
    total = grad(lambda *a: vmap(f)(*a).sum(), argnums=argnums)(*stacked)
    for j in argnums:
        ref = torch.stack([lg[j] for lg in loop])
        close(per_example[j], ref)
        close(total[j], ref)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_nested_vmap_one_core_call_and_eager_backward(case, count_calls):
    x = case.args[0]
    rng = np.random.default_rng(5)
    xs = x + torch.tensor(rng.standard_normal((2, B) + x.shape) * 0.2, dtype=x.dtype)
    rest = case.args[1:]
    loop = torch.stack([torch.stack([case.call(xs[i, j], *rest, reduction="sum")
                                     for j in range(B)]) for i in range(2)])
    leaf = xs.clone().requires_grad_()
    calls = count_calls(case)
    got = vmap(vmap(lambda a: case.call(a, *rest, reduction="sum")))(leaf)
    assert calls() == 1
    close(got.detach(), loop)
    # plain autograd through the vmapped call: d sum / d xs = per-copy gradients
    got.sum().backward()
    for i in range(2):
        for j in range(B):
            close(leaf.grad[i, j], eager_grads(case, (xs[i, j],) + rest, "sum")[1][0])


def test_vmap_over_targets_through_the_adapter():
    """Batched integer inputs fold into the batch too (adapter level)."""
    from duoloss.core import CTC_KERNEL
    rng = np.random.default_rng(3)
    x = torch.tensor(rng.standard_normal((B, T, N, C))).log_softmax(-1)
    tg = torch.tensor(rng.integers(1, C, (B, N, S)))
    il = torch.full((N,), T)
    tl = torch.full((N,), S)
    f = lambda a, t: adapter.apply_kernel(CTC_KERNEL, (a, t, il, tl), blank=0,  # noqa: E731
                                          zero_infinity=False)
    got = vmap(f)(x, tg)
    ref = torch.stack([torch.nn.functional.ctc_loss(x[i], tg[i], il, tl, reduction="none")
                       for i in range(B)])
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_vmap_with_batched_reduction_weights_through_the_adapter(reduction):
    """Weights computed from vmapped target lengths (what a traced frontend does)."""
    from duoloss.core import CTC_KERNEL
    rng = np.random.default_rng(8)
    x = torch.tensor(rng.standard_normal((B, T, N, C)), requires_grad=True)
    tg = torch.tensor(rng.integers(1, C, (B, N, S)))
    il = torch.full((N,), T)
    tls = torch.tensor(rng.integers(1, S + 1, (B, N)))

    def f(a, t, tl):
        return adapter.apply_kernel(CTC_KERNEL, (a.log_softmax(-1), t, il, tl),
                                    weights=adapter.reduction_weights(reduction, tl),
                                    blank=0, zero_infinity=False)

    got = vmap(f)(x, tg, tls)
    (g,) = torch.autograd.grad(got.sum(), x)
    refs = [torch.nn.functional.ctc_loss(x[i].log_softmax(-1), tg[i], il, tls[i],
                                         reduction=reduction) for i in range(B)]
    ref = torch.stack(refs)
    (rg,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(g, rg, rtol=1e-7, atol=1e-9)
    per_example = vmap(grad(f))(x.detach(), tg, tls)
    torch.testing.assert_close(per_example, rg, rtol=1e-7, atol=1e-9)


def test_vmap_empty_batch():
    from duoloss.core import CTC_KERNEL
    x = torch.zeros(B, T, 0, C)
    ints = (np.zeros((0, S), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    out = vmap(lambda a: adapter.apply_kernel(CTC_KERNEL, (a,) + ints, blank=0,
                                              zero_infinity=False))(x)
    assert out.shape == (B, 0)


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_vmap_over_targets_through_the_frontends(case, count_calls):
    """Per-example targets (the usual per-example-gradient setup): vmap over them too."""
    rng = np.random.default_rng(6)
    tgs = torch.tensor(rng.integers(1, C, (B, N, S)))
    x = case.args[0]
    rest = case.args[1:]
    if case.name == "ctc":
        f = lambda a, t: dt.ctc_loss(a.log_softmax(-1), t, (T,) * N, (S,) * N,  # noqa: E731
                                     reduction="none")
    else:
        f = lambda a, t: dt.asg_loss(a, *(rest[:1] or (None,)), t, (T,) * N,  # noqa: E731
                                     (S,) * N, reduction="none")
    loop = torch.stack([f(x, tgs[i]) for i in range(B)])
    calls = count_calls(case)
    got = vmap(f, in_dims=(None, 0))(x, tgs)
    assert calls() == 1
    close(got, loop)


def test_is_concrete():
    x = torch.ones(2)
    assert adapter.is_concrete(x, np.ones(2), 3)
    assert vmap(lambda a: torch.tensor(adapter.is_concrete(a, x)))(torch.ones(3, 2)).eq(0).all()
    assert grad(lambda a: a.sum() * float(adapter.is_concrete(a)))(x).eq(1).all()
