"""Batched gradients of every torch loss: ``gradcheck(check_batched_grad=True)`` and
``torch.func.vmap`` over ``torch.func.vjp`` (issue 27, point 1).

``gradcheck(..., check_batched_grad=True)`` is what torch's own OpInfo test
``test_fn_grad`` of ``nn.functional.ctc_loss`` and ``test_nn``'s ``test_ctc_loss``
run: besides comparing the analytic gradient with central finite differences (an
independent reference, float64), it ``vmap``s the backward over a stack of
cotangents (legacy vmap, no ``torch.func`` transform active) and compares with
one backward per cotangent.  ``torch.nn.functional.ctc_loss`` passes it (the
first test asserts so: it is the behaviour the losses must match).

``vmap(vjp_fn)`` over a stack of cotangents (``torch.func``) is compared with a
Python loop of single ``vjp_fn`` calls, the cotangent ``1`` included (the eager
backward's fast path).

One test per family: CTC, ASG, graph loss, RNN-T (fused and general paths),
k2's simple/smoothed/pruned RNN-T, TDT, multi-blank, the joiner loss.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

import duoloss.torch as dt
from test_graph_loss import ctc_graph

T, N, C, S = 5, 2, 4, 2


class Family(NamedTuple):
    name: str
    args: Tuple[torch.Tensor, ...]  # float64 inputs, all differentiable
    call: Callable  # call(*args, reduction=...) -> loss(es)


def _rand(rng, *shape, scale=1.0):
    return torch.tensor(rng.standard_normal(shape) * scale, dtype=torch.float64)


def _families():
    rng = np.random.default_rng(27)
    tg = torch.tensor([[1, 2], [3, 0]])
    il = torch.tensor([T, T - 1])
    tl = torch.tensor([2, 1])
    out = []

    # CTC, padded targets
    out.append(Family("ctc", (_rand(rng, T, N, C),),
                      lambda x, reduction: dt.ctc_loss(x.log_softmax(-1), tg, il, tl,
                                                       reduction=reduction)))
    # CTC, concatenated targets, zero_infinity (an impossible target: T=1 for two labels)
    il_short = torch.tensor([T, 1])
    tl_2 = torch.tensor([2, 2])
    cat = torch.tensor([1, 2, 3, 1])
    out.append(Family("ctc_concat", (_rand(rng, T, N, C),),
                      lambda x, reduction: dt.ctc_loss(x.log_softmax(-1), cat, il_short, tl_2,
                                                       reduction=reduction,
                                                       zero_infinity=True)))
    # ASG with learnable (shared) transitions and start transitions
    out.append(Family("asg", (_rand(rng, T, N, C), _rand(rng, C, C, scale=0.3),
                              _rand(rng, C, scale=0.3)),
                      lambda e, a, s, reduction: dt.asg_loss(e, a, tg, il, tl,
                                                             start_transitions=s,
                                                             reduction=reduction)))
    # graph loss: CTC graphs with tied arc weights
    graphs = [ctc_graph([int(v) for v in tg[b, :tl[b]]]) for b in range(N)]
    idx = [rng.integers(-1, 2, g.num_arcs()) for g in graphs]
    out.append(Family("graph", (_rand(rng, T, N, C), _rand(rng, 2, scale=0.3)),
                      lambda e, w, reduction: dt.graph_loss(
                          e, graphs, il, weights=w, arc_weight_index=idx, normalize=True,
                          target_lengths=tl, reduction=reduction)))
    # RNN-T: plain (the fused path for reduced CPU losses), FastEmit + clamp (general path)
    U = S
    rt = torch.tensor([[1, 2], [2, 0]], dtype=torch.int32)
    ril = torch.tensor([T, T - 2], dtype=torch.int32)
    rtl = torch.tensor([2, 1], dtype=torch.int32)
    out.append(Family("rnnt", (_rand(rng, N, T, U + 1, C),),
                      lambda x, reduction: dt.rnnt_loss(x, rt, ril, rtl, blank=0,
                                                        reduction=reduction)))
    out.append(Family("rnnt_clamp", (_rand(rng, N, T, U + 1, C),),
                      lambda x, reduction: dt.rnnt_loss(x, rt, ril, rtl, blank=0, clamp=50.0,
                                                        reduction=reduction)))
    # FastEmit and an active clamp change the gradient on purpose (not the
    # derivative of the loss): no finite-difference check (_NOT_A_DERIVATIVE)
    out.append(Family("rnnt_fastemit_clamp", (_rand(rng, N, T, U + 1, C),),
                      lambda x, reduction: dt.rnnt_loss(x, rt, ril, rtl, blank=0, clamp=0.4,
                                                        fastemit_lambda=0.01,
                                                        reduction=reduction)))
    # k2's simple / smoothed / pruned RNN-T
    sym = torch.tensor([[1, 2], [3, 1]])
    boundary = torch.tensor([[0, 0, 2, T], [0, 0, 1, T - 1]])
    out.append(Family("rnnt_simple", (_rand(rng, N, S + 1, C), _rand(rng, N, T, C)),
                      lambda lm, am, reduction: dt.rnnt_loss_simple(
                          lm, am, sym, 0, boundary, reduction=reduction)))
    out.append(Family("rnnt_smoothed", (_rand(rng, N, S + 1, C), _rand(rng, N, T, C)),
                      lambda lm, am, reduction: dt.rnnt_loss_smoothed(
                          lm, am, sym, 0, 0.1, 0.2, boundary, reduction=reduction)))
    lm0, am0 = _rand(rng, N, S + 1, C), _rand(rng, N, T, C)
    _, (pxg, pyg) = dt.rnnt_loss_simple(lm0, am0, sym, 0, boundary, return_grad=True)
    ranges = dt.get_rnnt_prune_ranges(pxg, pyg, boundary, s_range=2)
    out.append(Family("rnnt_pruned", (_rand(rng, N, T, 2, C),),
                      lambda x, reduction: dt.rnnt_loss_pruned(x, sym, ranges, 0, boundary,
                                                               reduction=reduction)))
    # TDT (token classes C, durations 0, 1, 2) and multi-blank (big blank of duration 2)
    out.append(Family("tdt", (_rand(rng, N, T, U + 1, C + 3),),
                      lambda x, reduction: dt.tdt_loss(x, rt, ril, rtl, blank=0,
                                                       durations=[0, 1, 2],
                                                       reduction=reduction)))
    out.append(Family("multiblank", (_rand(rng, N, T, U + 1, C + 1),),
                      lambda x, reduction: dt.multiblank_rnnt_loss(
                          x, rt, ril, rtl, blank=C, big_blank_durations=[2],
                          reduction=reduction)))
    # the joiner loss: a small tanh joiner, chunks of 2 frames
    w = _rand(rng, 3, C, scale=0.7)

    def joiner(e, p):
        return torch.tanh(e + p) @ w

    out.append(Family("rnnt_from_joiner", (_rand(rng, N, T, 3), _rand(rng, N, U + 1, 3)),
                      lambda e, p, reduction: dt.rnnt_loss_from_joiner(
                          joiner, e, p, rt, ril, rtl, blank=0, chunk_size=2,
                          reduction=reduction)))
    return out


FAMILIES = _families()
IDS = [f.name for f in FAMILIES]


def test_torch_ctc_passes_batched_gradcheck():
    """The behaviour to match: torch's own CTC under the same call."""
    rng = np.random.default_rng(0)
    x = _rand(rng, T, N, C).requires_grad_()
    tg, il, tl = torch.tensor([[1, 2], [3, 0]]), torch.tensor([T, T - 1]), torch.tensor([2, 1])
    for reduction in ("none", "mean", "sum"):
        assert gradcheck(lambda x: F.ctc_loss(x.log_softmax(-1), tg, il, tl,
                                              reduction=reduction),
                         (x,), check_batched_grad=True)
        # and duoloss's CTC under the identical call
        assert gradcheck(lambda x: dt.ctc_loss(x.log_softmax(-1), tg, il, tl,
                                               reduction=reduction),
                         (x,), check_batched_grad=True)


_NOT_A_DERIVATIVE = {"rnnt_fastemit_clamp"}


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_gradcheck_batched_grad(family, reduction):
    args = tuple(a.clone().requires_grad_() for a in family.args)
    if family.name in _NOT_A_DERIVATIVE:
        # gradcheck's batched-gradient step alone (its finite differences would
        # reject the intentionally modified gradient): the legacy vmap of the
        # backward over two cotangents against two single backward passes
        from torch.autograd.gradcheck import _test_batched_grad
        assert _test_batched_grad(args, family.call(*args, reduction=reduction), 0)
        return
    assert gradcheck(lambda *a: family.call(*a, reduction=reduction), args,
                     check_batched_grad=True)


def _cotangents(shape):
    """Three cotangents of ``shape``: all ones (the eager fast path), then two others."""
    base = torch.ones(shape, dtype=torch.float64)
    return torch.stack([base, 2.5 * base - torch.arange(base.numel()).reshape(shape) * 0.75,
                        -0.3 * base])


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_vmap_over_vjp_matches_loop(family, reduction):
    out, vjp_fn = torch.func.vjp(lambda *a: family.call(*a, reduction=reduction),
                                 *family.args)
    cts = _cotangents(out.shape)
    batched = torch.func.vmap(vjp_fn)(cts)
    for k, ct in enumerate(cts):
        single = vjp_fn(ct)
        for b, s in zip(batched, single):
            torch.testing.assert_close(b[k], s, rtol=1e-13, atol=1e-15)
    # the cotangent 1 reproduces the eager backward's gradient
    leaves = [a.clone().requires_grad_() for a in family.args]
    eager = torch.autograd.grad(family.call(*leaves, reduction=reduction).sum(), leaves)
    for b, e in zip(batched, eager):
        torch.testing.assert_close(b[0], e, rtol=1e-13, atol=1e-15)
