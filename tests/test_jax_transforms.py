"""JAX transforms on every loss (one device): jit, grad, nested vmap, x64 on and off.

References: eager (un-jitted) calls, Python loops over the vmapped axes, the
torch frontend (same core, independent framework glue) and ``optax.ctc_loss``.
Multi-device checks (shard_map, pmap, data parallel, device placement) are in
``test_jax_transforms_multidevice.py``.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import duoloss.jax as dj
from test_func_torch import ctc_graph

T, N, C, S = 9, 4, 5, 3


class JCase(NamedTuple):
    name: str
    module: str
    kernel_attr: str
    args: Tuple[np.ndarray, ...]  # float inputs (all differentiable), float64 numpy
    call: Callable  # call(*args, reduction=...) -> losses; ints closed over
    shared: Tuple[bool, ...]  # per float input: shared by the batch (not batch axis 1)
    ints: Tuple[np.ndarray, ...] = ()  # per-sequence non-float inputs, batch axis 0
    call_ints: Callable = None  # call_ints(*args, *ints, reduction=...)


def make_cases(seed=0, n=N, graphs_per_shard=None):
    """One case per loss and kernel of the JAX frontend, batch of ``n`` sequences.

    ``graphs_per_shard``: the graph loss gets graphs repeating with this period (the
    same per-shard graphs, as ``shard_map`` needs; see the multi-device tests).
    """
    rng = np.random.default_rng(seed)
    tg = rng.integers(1, C, (n, S)).astype(np.int32)
    il = np.array([T - (b % 3) for b in range(n)], np.int32)
    tl = np.array([S - (b % 2) for b in range(n)], np.int32)
    period = graphs_per_shard or n
    tg[period:] = np.tile(tg[:period], (n // period, 1))[: n - period]
    tl[period:] = np.tile(tl[:period], n // period)[: n - period]
    graphs = [ctc_graph([int(v) for v in tg[b, :tl[b]]]) for b in range(period)]
    idx = [rng.integers(-1, 2, g.num_arcs()) for g in graphs]

    def rand(*shape, scale=1.0):
        return rng.standard_normal(shape) * scale

    pads = (np.arange(T)[None, :] >= il[:, None]).astype(np.float32)
    lpads = (np.arange(S)[None, :] >= tl[:, None]).astype(np.float32)

    def sl(a, lo, hi):  # slice the per-sequence ints for a shard
        return a[lo:hi]

    def graph_call(e, w, il_, tl_, reduction="mean"):
        reps = il_.shape[0] // period
        return dj.graph_loss(e, graphs * reps, il_, weights=w, arc_weight_index=idx * reps,
                             normalize=True, target_lengths=tl_, reduction=reduction)

    ints_calls = {
        "ctc": ((tg, il, tl), lambda x, t, i, l, reduction="mean": dj.ctc_loss(
            jax.nn.log_softmax(x), t, i, l, reduction=reduction)),
        "optax_ctc": ((pads, tg, lpads), lambda x, p, t, lp, reduction="none": _reduce(
            dj.optax_ctc_loss(x.transpose(1, 0, 2), p, t, lp), reduction)),
        "asg": ((tg, il, tl), lambda e, a, s, t, i, l, reduction="mean": dj.asg_loss(
            e, a, t, i, l, start_transitions=s, reduction=reduction)),
        "asg_no_transitions": ((tg, il, tl), lambda e, t, i, l, reduction="mean": dj.asg_loss(
            e, None, t, i, l, reduction=reduction)),
        "graph": ((il, tl), graph_call),
    }
    return [c._replace(ints=ints_calls[c.name][0], call_ints=ints_calls[c.name][1])
            for c in _cases(rand, tg, il, tl, pads, lpads, graphs, idx, period, sl, n)]


def _cases(rand, tg, il, tl, pads, lpads, graphs, idx, period, sl, n):
    return [
        JCase("ctc", "duoloss.jax._ctc", "CTC_KERNEL", (rand(T, n, C),),
              lambda x, reduction="mean", lo=0, hi=n: dj.ctc_loss(
                  jax.nn.log_softmax(x), sl(tg, lo, hi), sl(il, lo, hi), sl(tl, lo, hi),
                  reduction=reduction), (False,)),
        JCase("optax_ctc", "duoloss.jax._ctc", "CTC_LOGITS_KERNEL", (rand(T, n, C),),
              lambda x, reduction="none", lo=0, hi=n: _reduce(dj.optax_ctc_loss(
                  x.transpose(1, 0, 2), sl(pads, lo, hi), sl(tg, lo, hi), sl(lpads, lo, hi)),
                  reduction), (False,)),
        JCase("asg", "duoloss.jax._asg", "ASG_KERNEL",
              (rand(T, n, C), rand(C, C, scale=0.3), rand(C, scale=0.3)),
              lambda e, a, s, reduction="mean", lo=0, hi=n: dj.asg_loss(
                  e, a, sl(tg, lo, hi), sl(il, lo, hi), sl(tl, lo, hi), start_transitions=s,
                  reduction=reduction), (False, True, True)),
        JCase("asg_no_transitions", "duoloss.jax._asg", "ASG_NO_TRANSITIONS_KERNEL",
              (rand(T, n, C),),
              lambda e, reduction="mean", lo=0, hi=n: dj.asg_loss(
                  e, None, sl(tg, lo, hi), sl(il, lo, hi), sl(tl, lo, hi), reduction=reduction),
              (False,)),
        JCase("graph", "duoloss.jax._graph_loss", "GRAPH_LOSS_KERNEL",
              (rand(T, n, C), rand(2, scale=0.3)),
              lambda e, w, reduction="mean", lo=0, hi=n: dj.graph_loss(
                  e, graphs * ((hi - lo) // period), sl(il, lo, hi), weights=w,
                  arc_weight_index=idx * ((hi - lo) // period), normalize=True,
                  target_lengths=sl(tl, lo, hi), reduction=reduction), (False, True)),
    ]


def _reduce(losses, reduction):
    return losses if reduction == "none" else losses.sum() if reduction == "sum" \
        else losses.mean()


CASES = make_cases()
IDS = [c.name for c in CASES]


@pytest.fixture
def count_calls(monkeypatch):
    """Wrap a frontend's kernel so that its core (host) calls are counted."""
    def install(case):
        mod = importlib.import_module(case.module)
        kernel = getattr(mod, case.kernel_attr)
        count = [0]

        def run(arrays, want, **static):
            count[0] += 1
            return kernel.run(arrays, want, **static)

        monkeypatch.setattr(mod, case.kernel_attr, dataclasses.replace(kernel, run=run))
        return lambda: count[0]
    return install


def f32(args):
    return tuple(jnp.asarray(a, jnp.float32) for a in args)


def assert_close(a, b, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jit_value_and_grad_matches_eager(case):
    args = f32(case.args)
    argnums = tuple(range(len(args)))
    f = lambda *a: case.call(*a, reduction="sum")  # noqa: E731
    v0, g0 = jax.value_and_grad(f, argnums=argnums)(*args)
    v1, g1 = jax.jit(jax.value_and_grad(f, argnums=argnums))(*args)
    assert_close(v1, v0, 1e-7, 0)
    for a, b in zip(g1, g0):
        assert_close(a, b, 1e-7, 0)
        assert float(jnp.abs(b).max()) > 0


def test_ctc_matches_optax_and_torch():
    """Independent references for one case: optax.ctc_loss and torch's F.ctc_loss."""
    import torch
    case = CASES[1]
    x = jnp.asarray(case.args[0], jnp.float32)
    rng = np.random.default_rng(0)  # same draws as make_cases
    tg = rng.integers(1, C, (N, S)).astype(np.int32)
    il = np.array([T - (b % 3) for b in range(N)], np.int32)
    tl = np.array([S - (b % 2) for b in range(N)], np.int32)
    pads = (np.arange(T)[None, :] >= il[:, None]).astype(np.float32)
    lpads = (np.arange(S)[None, :] >= tl[:, None]).astype(np.float32)
    ours, g = jax.value_and_grad(lambda x: case.call(x, reduction="none").sum())(x)
    ref, gr = jax.value_and_grad(lambda x: optax.ctc_loss(
        x.transpose(1, 0, 2), pads, tg, lpads).sum())(x)
    assert_close(ours, ref, 1e-5, 1e-5)
    assert_close(g, gr, 1e-4, 1e-5)
    xt = torch.tensor(np.asarray(x), requires_grad=True)
    tref = torch.nn.functional.ctc_loss(xt.log_softmax(-1), torch.tensor(tg).long(),
                                        torch.tensor(il).long(), torch.tensor(tl).long(),
                                        reduction="sum")
    tref.backward()
    assert_close(ours, tref.item(), 1e-5, 1e-5)
    assert_close(g, xt.grad.numpy(), 1e-4, 1e-5)


def _stack(args, lead, seed=1):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(a + rng.standard_normal(lead + a.shape) * 0.2, jnp.float32)
                 for a in args)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_nested_vmap_under_jit_one_core_call_matches_loop(case, count_calls):
    x = _stack(case.args[:1], (2, 3))[0]
    rest = f32(case.args[1:])
    f = lambda a: case.call(a, *rest, reduction="none")  # noqa: E731
    loop = np.stack([np.stack([f(x[i, j]) for j in range(3)]) for i in range(2)])
    calls = count_calls(case)
    got = jax.jit(jax.vmap(jax.vmap(f)))(x)
    assert calls() == 1
    assert_close(got, loop, 1e-6, 1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_per_example_grads_vmap_grad_one_core_call(case, count_calls):
    stacked = _stack(case.args, (3,))
    in_axes = tuple(None if sh else 0 for sh in case.shared)
    args = tuple(f32([a])[0] if ax is None else s for s, a, ax in zip(stacked, case.args, in_axes))
    f = lambda *a: case.call(*a, reduction="sum")  # noqa: E731
    argnums = tuple(range(len(args)))
    loop = [jax.grad(f, argnums=argnums)(*[a if ax is None else a[i]
                                          for a, ax in zip(args, in_axes)]) for i in range(3)]
    calls = count_calls(case)
    got = jax.jit(jax.vmap(jax.grad(f, argnums=argnums), in_axes=in_axes))(*args)
    assert calls() == 1  # the forward rule returns the gradients: one host call in all
    for j in argnums:
        assert_close(got[j], np.stack([lg[j] for lg in loop]), 1e-6, 1e-7)


@pytest.mark.parametrize("case", [c for c in CASES if any(c.shared)], ids=lambda c: c.name)
def test_vmap_over_shared_inputs_matches_loop(case):
    stacked = _stack(case.args, (2,))
    f = lambda *a: case.call(*a, reduction="none")  # noqa: E731
    got = jax.jit(jax.vmap(f))(*stacked)
    loop = np.stack([f(*[s[i] for s in stacked]) for i in range(2)])
    assert_close(got, loop, 1e-6, 1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_x64_on_float64_in_float64_out_and_float32_kept(case):
    argnums = tuple(range(len(case.args)))
    f = lambda *a: case.call(*a, reduction="sum")  # noqa: E731
    with jax.enable_x64(True):
        a64 = tuple(jnp.asarray(a, jnp.float64) for a in case.args)
        v64, g64 = jax.jit(jax.value_and_grad(f, argnums=argnums))(*a64)
        assert v64.dtype == jnp.float64 and all(g.dtype == jnp.float64 for g in g64)
        v32, g32 = jax.jit(jax.value_and_grad(f, argnums=argnums))(*f32(case.args))
        assert v32.dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in g32)
    with jax.enable_x64(False):
        v, g = jax.jit(jax.value_and_grad(f, argnums=argnums))(*f32(case.args))
        assert v.dtype == jnp.float32 and all(x.dtype == jnp.float32 for x in g)
    # float64 agrees with float32 to float32 accuracy (and is the better of the two)
    assert_close(v, v64, 1e-5, 1e-5)
    for a, b in zip(g, g64):
        assert_close(a, b, 1e-4, 1e-5)


def test_x64_matches_torch_float64():
    import torch
    from test_func_torch import CASES as TORCH_CASES
    case, tcase = CASES[2], TORCH_CASES[1]  # asg: different batches, compare loss per seq
    del case
    # the torch cases have N=3: build a jax case with the same numbers through dj directly
    e, a, s = (np.asarray(x) for x in tcase.args)
    rng = np.random.default_rng(0)
    tg = rng.integers(1, 5, (3, 3))
    il, tl = np.array([9, 8, 6]), np.array([3, 2, 1])
    with jax.enable_x64(True):
        got = dj.asg_loss(jnp.asarray(e), jnp.asarray(a), tg, il, tl,
                          start_transitions=jnp.asarray(s), reduction="none")
        assert got.dtype == jnp.float64
    ref = tcase.call(*[torch.tensor(x) for x in (e, a, s)], reduction="none")
    np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=1e-12)


def test_outputs_on_the_input_device():
    dev = jax.devices()[-1]
    for case in CASES:
        args = tuple(jax.device_put(a, dev) for a in f32(case.args))
        v, g = jax.jit(jax.value_and_grad(lambda *a: case.call(*a, reduction="sum")))(*args)
        assert v.devices() == {dev} and g.devices() == {dev}
