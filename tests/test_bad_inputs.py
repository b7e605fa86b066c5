"""Every bad input in ``tests/bad_inputs.py`` raises, in torch and in JAX, the same
``TypeError``/``ValueError`` naming the function, the argument, expected and
actual, before any kernel or host callback runs."""
from __future__ import annotations

import numpy as np
import pytest

import duoloss.jax as dj
import duoloss.torch as dt
from bad_inputs import all_cases, call

CASES = all_cases()


def _forbid(*_, **__):
    raise AssertionError("a kernel/callback ran before validation rejected the input")


@pytest.fixture
def no_kernels(monkeypatch):
    """Any compute entry point reached by a frontend fails the test."""
    import duoloss.jax._align as ja
    import duoloss.jax._asg as jasg
    import duoloss.jax._ctc as jctc
    import duoloss.jax._graph_loss as jg
    import duoloss.torch._align as ta
    import duoloss.torch._asg as tasg
    import duoloss.torch._ctc as tctc
    import duoloss.torch._graph_loss as tg

    for mod in (jctc, jasg, jg, tctc, tasg, tg):
        monkeypatch.setattr(mod, "apply_kernel", _forbid)
        if hasattr(mod, "apply_kernel_eager"):  # a frontend's short path
            monkeypatch.setattr(mod, "apply_kernel_eager", _forbid)
    for name in ("_ctc_align", "_asg_align", "_asg_viterbi", "_graph_align"):
        monkeypatch.setattr(ta, name, _forbid)
    monkeypatch.setattr(ja, "_callback", _forbid)
    import duoloss.jax._rnnt_k2 as jk2  # k2-style RNN-T (helper F2)
    import duoloss.torch._rnnt_k2 as tk2
    for mod, names in ((jk2, ("apply_kernel", "_call")), (tk2, ("apply_kernel", "kernel_loss_op"))):
        for name in names:
            monkeypatch.setattr(mod, name, _forbid)
    # RNN-T (transducer helper F1)
    import duoloss.jax._rnnt as jr
    import duoloss.torch._rnnt as tr
    for mod in (jr, tr):
        monkeypatch.setattr(mod, "apply_kernel", _forbid)
        monkeypatch.setattr(mod, "transducer_viterbi", _forbid)
    for name in ("_ctc_align", "_asg_align", "_asg_viterbi", "_graph_align"):
        monkeypatch.setattr(ja, name, _forbid)
    import duoloss.jax._tdt as jt  # TDT and multi-blank (helper H7)
    import duoloss.torch._tdt as tt
    for mod in (jt, tt):
        monkeypatch.setattr(mod, "apply_kernel", _forbid)
    # decoders (helper H): the searches, the ARPA LM's table build, greedy CTC's tensor ops
    import types

    import duoloss._xp.transducer_decode as xtd
    import duoloss.core.decoding._beam_python as bpy
    import duoloss.core.decoding.ctc_beam as cb
    import duoloss.core.decoding.wfst as wfst
    import duoloss.jax._decode_greedy as jgd
    import duoloss.torch._decode_greedy as tgd
    monkeypatch.setattr(cb, "run_batch", _forbid)
    monkeypatch.setattr(cb, "compile_lm", _forbid)
    monkeypatch.setattr(bpy, "decode_python", _forbid)
    monkeypatch.setattr(wfst, "_pool", types.SimpleNamespace(run_batch=_forbid))
    for name in ("greedy_search", "beam_search"):
        monkeypatch.setattr(xtd, name, _forbid)
    for mod in (jgd, tgd):
        monkeypatch.setattr(mod, "_decode", _forbid)


def _check(case, err, framework):
    if isinstance(err, AssertionError):  # _forbid: a kernel ran first
        raise err
    assert err is not None, f"{framework}: {case.fn} accepted {case.what}"
    assert type(err) is case.exc, f"{framework}: {case.fn}, {case.what}: {type(err).__name__}: {err}"
    msg = str(err)
    prefix = case.prefix or f"{case.fn}: argument '{case.arg}'"
    assert msg.startswith(prefix), f"{framework}: {msg!r} does not start with {prefix!r}"
    if case.expect:
        assert case.expect in msg, f"{framework}: {msg!r} lacks {case.expect!r}"


def _param(c):
    marks = [pytest.mark.xfail(strict=True, reason=f"known gap, fix in {c.gap}")] if c.gap else []
    return pytest.param(c, id=f"{c.fn}-{c.what}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case, no_kernels):
    errs = {}
    for fw in case.frameworks:
        errs[fw] = call(case, fw)
        _check(case, errs[fw], fw)
    if len(errs) == 2:
        t, j = str(errs["torch"]), str(errs["jax"])
        if "torch.Tensor" in t:  # the container type differs by design
            t = t.replace("a torch.Tensor", "an array")
            j = j.replace("a jax.Array", "an array")
        if case.arg == "impl":  # JAX also takes 'xla' and 'pallas' (its two device paths)
            j = j.replace("'device', 'xla', 'pallas',", "'device',")
        assert t == j, f"torch: {t!r}\n  jax: {j!r}"


def test_case_count():
    # A floor, so the catalogue cannot silently shrink.
    assert len(CASES) >= 200, len(CASES)
