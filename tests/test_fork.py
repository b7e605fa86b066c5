"""Forked workers run the kernels after the parent already ran batches on threads.

duoloss spreads a large batch over a pool of Python threads (`duoloss.core._pool`),
not over numba's threading layer (with GNU OpenMP a child forked after the parent's
first parallel kernel is killed at its own: fork pools hang and DataLoader workers
"exit unexpectedly").  A forked child has none of the parent's pool threads and
must make its own.  Each scenario runs in a fresh interpreter with timeouts, so a
hang fails the test instead of blocking the run.  The children's results must
equal the parent's bit for bit (same compiled kernels, same inputs), whatever
numba threading layer is requested: duoloss never starts one.
"""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")

#: Seconds a forked worker may take to hand back all its results.
WORKER_TIMEOUT = 120
#: Seconds for a whole scenario (interpreter, imports, kernels from the cache).
SCENARIO_TIMEOUT = 600

# Inputs large enough for the threaded path of every kernel used
# (CTC/ASG: T*(2S+1)*N >= 40_000 cells; alignment: >= 200_000 cells).
_COMMON = textwrap.dedent("""
    import multiprocessing, sys
    import numpy as np
    from duoloss.core import asg_loss_and_grad, ctc_align, ctc_loss_and_grad
    from duoloss.core import threading_layer
    from duoloss.core import _pool

    T, N, C, S = 240, 16, 20, 30

    def job(seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((T, N, C)).astype(np.float32)
        lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
        tg = rng.integers(1, C, (N, S))
        il = np.full(N, T)
        tl = np.full(N, S)
        tr = (0.5 * rng.standard_normal((C, C))).astype(np.float32)
        return x, lp, tg, il, tl, tr

    def core_results(seed):
        x, lp, tg, il, tl, tr = job(seed)
        ctc, ctc_grad = ctc_loss_and_grad(lp, tg, il, tl)
        asg, (asg_ge, asg_gt, _) = asg_loss_and_grad(x, tr, tg, il, tl)
        labels, scores = ctc_align(lp, tg, il, tl)
        return [ctc, ctc_grad, asg, asg_ge, asg_gt, labels, scores]

    def same(a, b):
        return len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b))

    SEEDS = [0, 1, 2, 3]
    parent = {s: core_results(s) for s in SEEDS}
    # The parent ran batches on its thread pool (and never loaded numba's layer).
    assert _pool._pool is not None
""")

_POOL = _COMMON + textwrap.dedent("""
    hold_lock = len(sys.argv) > 1 and sys.argv[1] == "hold-lock"
    if hold_lock:
        # As if another thread were handing work to the pool at fork time.
        _pool._pool_lock.acquire()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        children = pool.map_async(core_results, SEEDS).get(timeout=WORKER_TIMEOUT)
    if hold_lock:
        _pool._pool_lock.release()
    assert all(same(parent[s], c) for s, c in zip(SEEDS, children))
    print("OK", threading_layer())
""")

_DATALOADER = _COMMON + textwrap.dedent("""
    import torch
    import duoloss.torch as dt

    def torch_results(seed):
        x, lp, tg, il, tl, tr = job(seed)
        lpt = torch.tensor(lp, requires_grad=True)
        xt = torch.tensor(x, requires_grad=True)
        trt = torch.tensor(tr, requires_grad=True)
        tgt, ilt, tlt = torch.tensor(tg), torch.tensor(il), torch.tensor(tl)
        ctc = dt.ctc_loss(lpt, tgt, ilt, tlt, reduction="none")
        ctc.sum().backward()
        asg = dt.asg_loss(xt, trt, tgt, ilt, tlt, reduction="none")
        asg.sum().backward()
        labels, scores = dt.ctc_align(lpt.detach(), tgt, ilt, tlt)
        return [t.detach().numpy() for t in
                (ctc, lpt.grad, asg, xt.grad, trt.grad, labels, scores)]

    class Jobs(torch.utils.data.Dataset):
        def __len__(self):
            return len(SEEDS)

        def __getitem__(self, i):
            return torch_results(SEEDS[i])

    in_parent = {s: torch_results(s) for s in SEEDS}
    loader = torch.utils.data.DataLoader(
        Jobs(), batch_size=None, num_workers=2, multiprocessing_context="fork",
        timeout=WORKER_TIMEOUT)
    children = [[t.numpy() for t in item] for item in loader]
    assert all(same(in_parent[s], c) for s, c in zip(SEEDS, children))
    # The torch frontends run the same core (shared transitions: summed over the batch).
    for s in SEEDS:
        p = parent[s]
        for u, v in zip([p[0], p[1], p[2], p[3], p[4].sum(0), p[5], p[6]], in_parent[s]):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
    print("OK", threading_layer())
""")


def _run(code, *args, env=None):
    """Run ``code`` in a fresh interpreter (own process group); kill it all on timeout."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH")) if p)
    code = f"WORKER_TIMEOUT = {WORKER_TIMEOUT}\n" + code
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=SCENARIO_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {SCENARIO_TIMEOUT} s (a forked worker hung?)\n"
                    f"{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftover forked workers, if any
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def _default_env():
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    env["NUMBA_NUM_THREADS"] = "2"  # the parent uses its pool even on a 1-CPU machine
    return env


def test_fork_pool_after_threaded_batches():
    rc, out, err = _run(_POOL, env=_default_env())
    assert rc == 0, err[-3000:]
    assert out.split() == ["OK", "unknown"]  # numba's threading layer never loaded


def test_fork_pool_while_the_pool_lock_is_held():
    # The child's only thread is the forking one: a lock another thread held at
    # fork time must not stay locked in the child.
    rc, out, err = _run(_POOL, "hold-lock", env=_default_env())
    assert rc == 0, err[-3000:]
    assert out.split() == ["OK", "unknown"]


def test_torch_dataloader_fork_workers_after_threaded_batches():
    pytest.importorskip("torch")
    rc, out, err = _run(_DATALOADER, env=_default_env())
    assert rc == 0, err[-3000:]
    assert out.split()[0] == "OK"


@pytest.mark.parametrize("layer", ["omp", "workqueue"])
def test_a_requested_numba_layer_changes_nothing(layer):
    # Forcing numba's GNU OpenMP layer used to make forked children unable to run
    # parallel kernels; duoloss's threads do not use numba's layer at all.
    env = _default_env()
    env["NUMBA_THREADING_LAYER"] = layer
    rc, out, err = _run(_POOL, env=env)
    assert rc == 0, err[-3000:]
    assert out.split() == ["OK", "unknown"]
