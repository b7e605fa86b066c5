"""Many Python threads running jitted computations with duoloss's host callbacks at once
(issue 35, item 6): none hangs.

The mechanism (see `duoloss.jax._callback`): ``jax.pure_callback`` puts its operands on the
CPU device asynchronously and the host function waits for that copy on a worker of the
pool that must run it; with several computations in flight every worker can be such a
wait.  Each scenario runs in a child process (a hang cannot be stopped in-process) whose
threads, once the function is compiled, must finish within a time limit: a plain callback
that reads a large operand, the jitted ``value_and_grad`` of ``dj.ctc_loss`` and
``jax.jit(decoder.padded)``, 8 threads each, each thread's results equal to the
sequential ones.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[1]
#: Seconds the threads may take once compiled (they take 1-4 s here; a hang never ends).
THREADS_LIMIT_S = 25
#: Seconds for the whole child: imports and compiles too, on a busy machine.
TIMEOUT_S = 90

_PRELUDE = """
import os, threading, time
import numpy as np, jax, jax.numpy as jnp

def threads(fn, n=8, iters=3, limit_s=%(limit)d):
    want = fn(0)                        # compiles, outside the time limit
    got, errors = {}, []
    def run(i):
        try:
            got[i] = [fn(0) for _ in range(iters)]
        except BaseException as e:  # reported below
            errors.append(repr(e))
    ths = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    deadline = time.monotonic() + limit_s
    for t in ths:
        t.start()
    for t in ths:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in ths):
        print("hung", flush=True)
        os._exit(3)                     # (the blocked threads would keep the process)
    assert not errors, errors
    for i in range(n):
        for g in got[i]:
            for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(g)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    print("ok", flush=True)
""" % dict(limit=THREADS_LIMIT_S)

SCENARIOS = {
    # a host function that only reads its (4 MB) operand, through duoloss's callback
    "plain_callback": """
from duoloss.jax._callback import pure_callback
def host(x):
    s = 0.0
    for _ in range(20):
        s += float(np.asarray(x).sum())
    return np.full(x.shape, s, np.float32)
f = jax.jit(lambda x: (pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                     vmap_method="sequential") * 2).sum())
x = jnp.ones((800_000,), jnp.float32)
threads(lambda i: f(x + i), iters=5)
""",
    # issue 35's case: the jitted value_and_grad of ctc_loss at (B, T, C) = (16, 1000, 50)
    "ctc_value_and_grad": """
import duoloss.jax as dj
rng = np.random.default_rng(0)
B, T, C, L = 16, 1000, 50, 40
lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((T, B, C)), jnp.float32), -1)
tg = jnp.asarray(rng.integers(1, C, (B, L)), jnp.int32)
il = jnp.full((B,), T, jnp.int32)
tl = jnp.full((B,), L, jnp.int32)
f = jax.jit(jax.value_and_grad(lambda lp: dj.ctc_loss(lp, tg, il, tl).mean()))
threads(lambda i: f(lp + i), iters=2)
""",
    # issue 35's other case: jax.jit(decoder.padded), lexicon-free
    "decoder_padded": """
import duoloss.jax as dj
tokens = ["-", "|"] + [chr(ord("a") + k) for k in range(26)]
decoder = dj.ctc_decoder(tokens, nbest=2, beam_size=8)
rng = np.random.default_rng(1)
em = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((8, 400, len(tokens))) * 3,
                                    jnp.float32), -1)
f = jax.jit(decoder.padded)
threads(lambda i: f(em + i), iters=2)
""",
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_jitted_callbacks_from_many_threads_finish(name):
    code = textwrap.dedent(_PRELUDE) + textwrap.dedent(SCENARIOS[name])
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: the child did not finish in {TIMEOUT_S} s")
    assert "hung" not in out.stdout, f"{name}: 8 threads did not finish in {THREADS_LIMIT_S} s"
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
