"""duoloss.warmup, ``python -m duoloss [demo|warmup]`` and the compile notice.

Two subprocesses share one fresh, empty numba cache: the first compiles the CTC kernels
(a first call, which prints the notice, then ``warmup(['ctc'])``); the second makes the
first calls users make (torch and JAX, float32 and float64, small and large batches) and
must compile nothing.  Everything else runs in-process without compiling.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import duoloss
from ctc_reference import log_space_ctc
from duoloss.core import _numba_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(cache=None):
    env = {k: v for k, v in os.environ.items() if k != "DUOLOSS_QUIET_COMPILE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache)
    return env


def _python(code, env, args=("-c",)):
    out = subprocess.run([sys.executable, *args, code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


# Counts compiles (numba cache misses) of duoloss's own kernels in the child.
_COUNT = """
import json, numba.core.event as ev
compiled = []
class _L(ev.Listener):
    def on_start(self, e):
        m = getattr(e.data["dispatcher"].py_func, "__module__", "")
        if m.startswith("duoloss."):
            compiled.append(m + "." + e.data["dispatcher"].py_func.__name__)
    def on_end(self, e):
        pass
ev.register("numba:compile", _L())
"""

_FIRST_CALL = _COUNT + """
import numpy as np
from duoloss.core import ctc_loss_and_grad
lp = np.log(np.full((12, 2, 6), 1 / 6, np.float32))
ctc_loss_and_grad(lp, np.array([[1, 2, 3], [4, 2, 1]]), np.array([12, 10]), np.array([3, 2]))
import duoloss
seconds = duoloss.warmup(["ctc"])
print(json.dumps({"compiled": len(compiled), "seconds": seconds}))
"""

_LATER_CALLS = _COUNT + """
import numpy as np, torch, jax, jax.numpy as jnp
import duoloss.torch as dt, duoloss.jax as dj
tg = torch.tensor([[1, 2, 3], [4, 2, 1]]); il = torch.tensor([12, 10]); tl = torch.tensor([3, 2])
for dtype in (torch.float32, torch.float64):
    for n in (1, 2, 64):  # one sequence, a small and a large (parallel) batch
        lp = torch.randn(30, n, 6, dtype=dtype).log_softmax(-1).requires_grad_()
        t, i, l = tg.repeat(n, 1)[:n], il.repeat(n)[:n], tl.repeat(n)[:n]
        dt.ctc_loss(lp, t, i, l).backward()
        dt.ctc_loss(lp, t, i, l, reduction="none")
lp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(0).standard_normal((12, 2, 6)),
                                    jnp.float32))
jax.value_and_grad(lambda x: dj.ctc_loss(x, tg.numpy(), il.numpy(), tl.numpy()))(lp)
print(json.dumps({"compiled": compiled}))
"""


def test_warmup_then_first_calls_compile_nothing(tmp_path):
    first = _python(_FIRST_CALL, _env(tmp_path))
    result = json.loads(first.stdout.strip().splitlines()[-1])
    assert result["compiled"] > 0 and list(result["seconds"]) == ["ctc"]
    # The first call announced the CTC family once, naming the cache folder; the
    # warm-up (which compiled the rest of the family) printed its progress instead.
    notices = [ln for ln in first.stderr.splitlines() if "duoloss: compiling" in ln]
    assert len(notices) == 1 and "CTC kernels" in notices[0], first.stderr
    assert str(tmp_path) in notices[0] and "DUOLOSS_QUIET_COMPILE" in notices[0]
    assert "  ctc " in first.stderr and "duoloss warmup: done" in first.stderr

    later = _python(_LATER_CALLS, _env(tmp_path))
    assert json.loads(later.stdout.strip().splitlines()[-1]) == {"compiled": []}
    assert "duoloss: compiling" not in later.stderr


class _Event:
    def __init__(self, module):
        fn = types.FunctionType((lambda: None).__code__, {}, "kernel")
        fn.__module__ = module
        self.data = {"dispatcher": types.SimpleNamespace(py_func=fn, __name__="kernel")}


@pytest.fixture
def notice(monkeypatch):
    """A fresh listener, as if no family had compiled yet in this process."""
    monkeypatch.setattr(_numba_setup, "_noticed", set())
    monkeypatch.delenv("DUOLOSS_QUIET_COMPILE", raising=False)
    return _numba_setup._CompileNotice()


def _fire(listener, *modules):
    for module in modules:
        listener.on_start(_Event(module))
        listener.on_end(_Event(module))


def test_notice_once_per_family_outermost_only(notice, caplog):
    caplog.set_level(logging.INFO, logger="duoloss")
    _fire(notice, "duoloss.core.losses.ctc", "duoloss.core.losses.ctc", "numba.np.arrayobj")
    # a nested compile (a helper of another family) is part of the outer kernel's compile
    notice.on_start(_Event("duoloss.core.losses.asg"))
    _fire(notice, "duoloss.core._numerics", "duoloss.core.losses.ctc")
    notice.on_end(_Event("duoloss.core.losses.asg"))
    _fire(notice, "duoloss.core.graph.scores", "duoloss.core.losses.graph_loss")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3, lines
    for line, what in zip(lines, ("CTC", "ASG", "WFST graph")):
        assert line.startswith(f"duoloss: compiling the {what} kernels (")
        assert _numba_setup.cache_location() in line


@pytest.mark.parametrize("how", ["env", "logging"])
def test_notice_is_silenceable(notice, caplog, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("DUOLOSS_QUIET_COMPILE", "1")
        caplog.set_level(logging.INFO, logger="duoloss")
    else:
        caplog.set_level(logging.ERROR, logger="duoloss")
    _fire(notice, "duoloss.core.losses.ctc", "duoloss.core.losses.transducer")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_gc_paused_only_during_an_outermost_duoloss_compile(notice):
    was = gc.isenabled()
    try:
        gc.enable()
        notice.on_start(_Event("duoloss.core.losses.ctc"))
        assert not gc.isenabled()
        _fire(notice, "duoloss.core._numerics", "numba.np.arrayobj")  # nested: still paused
        assert not gc.isenabled()
        notice.on_end(_Event("duoloss.core.losses.ctc"))
        assert gc.isenabled()
        # another library's compile (even one that compiles a duoloss helper) is not ours
        notice.on_start(_Event("numba.np.arrayobj"))
        _fire(notice, "duoloss.core._numerics")
        assert gc.isenabled()
        notice.on_end(_Event("numba.np.arrayobj"))
        # a collector the user switched off stays off
        gc.disable()
        _fire(notice, "duoloss.core.losses.asg")
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


_GC_IN_REAL_COMPILES = """
import gc, json, numba.core.event as ev
import numpy as np
import duoloss.core  # its listener first: numba tells listeners in registration order
seen = []
class _L(ev.Listener):
    def on_start(self, e):
        seen.append(gc.isenabled())
    def on_end(self, e):
        pass
ev.register("numba:compile", _L())
from duoloss.core import ctc_loss_and_grad
from duoloss.core._numerics import exp_core
lp = np.log(np.full((12, 2, 6), 1 / 6, np.float32))
loss, _ = ctc_loss_and_grad(lp, np.array([[1, 2, 3], [4, 2, 1]]), np.array([12, 10]),
                            np.array([3, 2]))
after_ok = gc.isenabled()
try:
    exp_core("not a number")  # a compile that fails (a typing error)
except Exception as err:
    failed = type(err).__name__
after_error = gc.isenabled()
gc.disable()
from duoloss.core import asg_loss_and_grad
asg_loss_and_grad(lp, np.zeros((6, 6), np.float32), np.array([[1, 2, 3], [4, 2, 1]]),
                  np.array([12, 10]), np.array([3, 2]))
print(json.dumps({"seen": seen, "after_ok": after_ok, "failed": failed,
                  "after_error": after_error, "user_off_stays_off": not gc.isenabled(),
                  "loss": [float(v) for v in loss]}))
"""


def test_gc_paused_in_real_compiles_and_restored_after_errors(tmp_path):
    out = _python(_GC_IN_REAL_COMPILES, _env(tmp_path))
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # the recorder hears each compile's start after duoloss's listener: the outermost
    # kernel's start already found the collector off, as did every nested compile
    assert len(r["seen"]) > 5 and not any(r["seen"]), r["seen"]
    assert r["after_ok"] and r["after_error"] and r["failed"] == "TypingError"
    assert r["user_off_stays_off"]
    # a check that the paused compile computed: the textbook log-space recursion
    ref, _ = log_space_ctc(np.log(np.full((12, 6), 1 / 6)), [1, 2, 3])
    assert r["loss"][0] == pytest.approx(ref, rel=1e-6)


def test_warmup_rejects_unknown_family_and_bad_jobs():
    with pytest.raises(ValueError, match=r"warmup: argument 'families' .*\['bogus'\]"):
        duoloss.warmup(["ctc", "bogus"])
    for jobs in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"warmup: argument 'jobs' must be a positive"):
            duoloss.warmup(["ctc"], jobs=jobs)


def test_cli_help_names_the_program_and_commands():
    out = subprocess.run([sys.executable, "-m", "duoloss", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m duoloss ")
    assert "{demo,warmup}" in out.stdout and "__main__" not in out.stdout
    out = subprocess.run([sys.executable, "-m", "duoloss", "warmup", "--families", "nope"],
                         capture_output=True, text=True, cwd=ROOT, env=_env())
    assert out.returncode == 2 and "'families'" in out.stderr and "['nope']" in out.stderr


def test_worker_shares_cover_every_family_once_and_balance():
    from duoloss import _warmup

    for jobs in (1, 2, 3, 7, 9):
        shares = _warmup._shares(list(_warmup.FAMILIES), jobs)
        flat = [f for share in shares for f in share]
        assert sorted(flat) == sorted(_warmup.FAMILIES) and len(shares) <= jobs
    two = _warmup._shares(list(_warmup.FAMILIES), 2)
    loads = sorted(sum(_warmup._COST[f] for f in share) for share in two)
    # longest-first greedy: no worker carries more than the ideal half plus one family
    assert loads[1] - loads[0] <= max(_warmup._COST.values())
    assert _warmup._shares(["ctc"], 2) == [["ctc"]]


# The decode family's calls, then the calls users make: the second set may add no numba
# signature to a decoding kernel (same signatures = what the warm-up cached is what later
# processes load).  Runs on the suite's numba cache (seconds when warm).
_DECODE_SIGNATURES = """
import json, os, sys, tempfile
import numpy as np
from numba.core.registry import CPUDispatcher
from duoloss import _warmup

def signatures():
    out = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("duoloss.core.decoding") and module is not None:
            for obj in list(vars(module).values()):
                if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name:
                    out[name + "." + obj.py_func.__name__] = sorted(map(str, obj.signatures))
    return out

_warmup._run_family("decode", ["torch", "jax"])
warm = signatures()

import jax, jax.numpy as jnp, torch
import duoloss.torch as dt, duoloss.jax as dj
from duoloss import gtn
from duoloss.core.decoding import build_decoder, read_arpa
from duoloss.graphs import arpa_graph, ctc_topo, lexicon_graph
d = tempfile.mkdtemp()
em, lengths, options, _ = _warmup._decode_inputs(d)
lexicon, arpa = os.path.join(d, "lexicon.txt"), os.path.join(d, "lm.arpa")
rng = np.random.default_rng(1)
big = rng.standard_normal((40, 30, 5))
big -= np.log(np.exp(big).sum(-1, keepdims=True))
kinds = [dict(lexicon=lexicon), dict(lm=arpa, beam_size=3, log_add=True),
         dict(lexicon=lexicon, lm=read_arpa(arpa), nbest=3, unk_score=-5.0, beam_size_token=2),
         dict(hotwords=[("a b", 2.0)], sil_score=-0.5)]
for kw in kinds:
    for dtype in (torch.float16, torch.float32, torch.float64):
        dt.ctc_decoder(_warmup._DECODE_TOKENS, **kw)(torch.tensor(big).to(dtype))
    dj.ctc_decoder(_warmup._DECODE_TOKENS, **kw)(jnp.asarray(big, jnp.float32), np.full(40, 30))
    jax.jit(dj.ctc_decoder(_warmup._DECODE_TOKENS, **kw).padded)(jnp.asarray(em, jnp.float32))
    build_decoder(_warmup._DECODE_TOKENS, **kw).decode(big[:, ::2])  # not contiguous
lm = read_arpa(arpa)
hlg = gtn.compose(ctc_topo(5), gtn.compose(lexicon_graph(lexicon, _warmup._DECODE_TOKENS,
                                                         words=lm.words), arpa_graph(lm)))
dt.graph_decode(torch.tensor(big, dtype=torch.float32), hlg, beam=5.0, max_active=None)
dj.graph_decode(jnp.asarray(big, jnp.float32), hlg, lengths=np.arange(40) % 31)
later = signatures()
new = {k: sorted(set(v) - set(warm.get(k, []))) for k, v in later.items()}
print(json.dumps({"warm": warm, "new": {k: v for k, v in new.items() if v}}))
"""


def test_decode_family_covers_the_signatures_of_real_decoding_calls():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    out = _python(_DECODE_SIGNATURES, _env())
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["new"] == {}, r["new"]
    compiled = {k for k, v in r["warm"].items() if v}
    # the CTC beam search in float32 and float64, its LM kernels, the WFST search
    ctc = "duoloss.core.decoding._beam_kernel."
    assert len(r["warm"][ctc + "decode_batch"]) == 2
    assert {ctc + "lm_fill", ctc + "lm_score_many",
            "duoloss.core.decoding.wfst._decode_batch"} <= compiled, sorted(compiled)


def test_decode_kernels_are_announced_as_the_decode_family(notice, caplog):
    caplog.set_level(logging.INFO, logger="duoloss")
    _fire(notice, "duoloss.core.decoding._beam_kernel", "duoloss.core.decoding.wfst",
          "duoloss.core.decoding.some_future_module")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    what, seconds = _numba_setup.FAMILIES["decode"]
    assert lines[0].startswith(f"duoloss: compiling the {what} kernels (first use with an "
                               f"empty numba cache: about {seconds} s")
    from duoloss import _warmup

    assert "shared" not in lines[0] and "decode" in _warmup.FAMILIES
