"""Drop-in gaps vs ``F.ctc_loss``, TorchScript's clear refusal, and a dynamo-free import."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import duoloss.torch as dt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _critical(seed=0, t=60, s=25, c=10):
    """torch's test_CTCLoss_critical_target_len, smaller: N = 1, 1-D targets,
    0-d target_lengths."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(1, c, (s,), generator=g)
    input_lengths = torch.full((1,), t, dtype=torch.int)
    target_lengths = torch.tensor(s, dtype=torch.int)
    logits = torch.randn(t, 1, c, generator=g, dtype=torch.float64)
    return logits, target, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_zero_dim_target_length_with_n1_matches_F(reduction):
    logits, target, il, tl = _critical()
    grads = []
    outs = []
    for fn in (F.ctc_loss, dt.ctc_loss):
        x = logits.clone().requires_grad_()
        out = fn(x.log_softmax(2), target, il, tl, reduction=reduction, zero_infinity=True)
        out.sum().backward()
        outs.append(out)
        grads.append(x.grad)
    assert outs[1].shape == outs[0].shape
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-7, atol=1e-9)


def test_zero_dim_lengths_and_tuples_of_zero_dim_tensors_match_F():
    logits, target, _, _ = _critical(1)
    lp = logits.log_softmax(2)
    t, s = lp.shape[0], target.shape[0]
    cases = [
        (torch.tensor(t), torch.tensor(s)),                      # both 0-d
        ((torch.tensor(t),), (torch.tensor(s),)),                # tuples of 0-d tensors
        ([torch.tensor(t)], (torch.tensor(s, dtype=torch.int32),)),
        ((t,), (torch.tensor(s),)),
    ]
    ref = F.ctc_loss(lp, target[None], (t,), (s,), reduction="none")
    for il, tl in cases:
        torch.testing.assert_close(F.ctc_loss(lp, target[None], il, tl, reduction="none"), ref)
        for tg in (target, target[None]):
            torch.testing.assert_close(dt.ctc_loss(lp, tg, il, tl, reduction="none"), ref,
                                       rtol=1e-9, atol=1e-9)


def test_zero_dim_lengths_reach_asg_and_aligners():
    logits, target, _, _ = _critical(2, t=40, s=12)
    lp = logits.log_softmax(2)
    t, s = lp.shape[0], target.shape[0]
    one = (torch.tensor([t]), torch.tensor([s]))
    zero_d = (torch.tensor(t), torch.tensor(s))
    assert torch.equal(dt.asg_loss(lp, None, target[None], *zero_d),
                       dt.asg_loss(lp, None, target[None], *one))
    for a, b in zip(dt.ctc_align(lp, target, *zero_d), dt.ctc_align(lp, target[None], *one)):
        assert torch.equal(a, b)
    for a, b in zip(dt.asg_align(lp, None, target, *zero_d),
                    dt.asg_align(lp, None, target[None], *one)):
        assert torch.equal(a, b)
    for a, b in zip(dt.asg_viterbi(lp, None, zero_d[0]), dt.asg_viterbi(lp, None, one[0])):
        assert torch.equal(a, b)


def test_zero_dim_lengths_still_rejected_for_n_above_1():
    lp = torch.randn(10, 2, 5).log_softmax(2)
    with pytest.raises(RuntimeError):  # F's own check
        F.ctc_loss(lp, torch.tensor([1, 2, 3, 4]), torch.tensor(10), torch.tensor(2))
    with pytest.raises(ValueError, match=r"ctc_loss: argument 'input_lengths' must have shape "
                                         r"\(2,\) .* got shape \(\)"):
        dt.ctc_loss(lp, torch.tensor([1, 2, 3, 4]), torch.tensor(10), torch.tensor(2))
    with pytest.raises(TypeError, match="non-int entries"):
        dt.ctc_loss(lp[:, :1], torch.tensor([[1, 2]]), (torch.tensor(10.0),), (2,))


class _Model(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.lin = torch.nn.Linear(4, 5)
        self.loss = loss

    def forward(self, x, tg, il, tl):
        return self.loss(self.lin(x).log_softmax(-1), tg, il, tl)


def _batch():
    torch.manual_seed(0)
    return (torch.randn(6, 2, 4), torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]),
            torch.tensor([2, 2]))


@pytest.mark.parametrize("module", ["CTCLoss", "ASGLoss"])
def test_torchscript_raises_a_clear_error(module):
    loss = dt.CTCLoss() if module == "CTCLoss" else dt.ASGLoss(5)
    model = _Model(loss)
    args = _batch()
    message = r"TorchScript \(torch.jit.trace / torch.jit.script\) is not supported.*torch.compile"
    with pytest.raises(RuntimeError, match=rf"{module}: " + message):
        torch.jit.script(model)
    fn = "ctc_loss" if module == "CTCLoss" else "asg_loss"
    with pytest.raises(RuntimeError, match=rf"{fn}: " + message):
        torch.jit.trace(model, args)
    model(*args).backward()  # eager use is unaffected afterwards


def test_torch_export_works_and_matches_eager():
    model = _Model(dt.CTCLoss())
    args = _batch()
    exported = torch.export.export(model, args)
    torch.testing.assert_close(exported.module()(*args), model(*args), rtol=0, atol=0)


def test_import_does_not_load_dynamo():
    code = (
        "import sys, torch\n"
        "import duoloss.torch as dt\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported by duoloss.torch'\n"
        "x = torch.randn(6, 2, 4).log_softmax(-1).requires_grad_()\n"
        "tg, il, tl = torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]), torch.tensor([2, 2])\n"
        "dt.ctc_loss(x, tg, il, tl).backward()\n"
        "dt.asg_loss(x, torch.zeros(4, 4), tg, il, tl).backward()\n"
        "dt.ctc_loss(x, tg, (6, 5), (2, 2), reduction='none').sum().backward()\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported by an eager call'\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_graph_loss_takes_the_same_length_forms_and_refuses_torchscript():
    from duoloss.graphs import ctc_graph

    logits, target, _, _ = _critical(3, t=30, s=8)
    lp = logits.log_softmax(2)
    t, s = lp.shape[0], target.shape[0]
    graphs = [ctc_graph(target.tolist(), blank=0)]
    zero_d = dt.graph_loss(lp, graphs, torch.tensor(t), target_lengths=torch.tensor(s))
    tuple_0d = dt.graph_loss(lp, graphs, (torch.tensor(t),), target_lengths=(torch.tensor(s),))
    reference = F.ctc_loss(lp, target[None], torch.tensor([t]), torch.tensor([s]))
    assert torch.equal(zero_d, tuple_0d)
    torch.testing.assert_close(zero_d, reference, rtol=1e-9, atol=0)
    with pytest.raises(RuntimeError, match=r"GraphLoss: TorchScript \(torch.jit.trace / "
                                           r"torch.jit.script\) is not supported"):
        torch.jit.script(dt.GraphLoss(3))
