"""First call of each loss family in a new process: with an empty numba cache, and warm.

    python benchmarks/cold_start.py                 # every case
    python benchmarks/cold_start.py --cases ctc_torch,rnnt_torch
    python benchmarks/cold_start.py --repeat 2      # two cold runs per case (the minimum is kept)

For every case a fresh, empty ``NUMBA_CACHE_DIR`` (a temporary folder) and a new Python
process: the imports and the inputs are made first (not timed), then the first call
(forward and backward where there is one) is timed with ``time.perf_counter`` -- that is
numba compiling (and caching) the kernels the call uses.  Then a second new process with
the same, now filled, cache times the same first call: what a user sees from then on.
The ``warmup`` case times the whole ``python -m duoloss warmup`` process (all families),
then a ``ctc_torch`` first call on the cache it filled.

The table gives wall-clock seconds, the CPU seconds the process spent on them (numba
compiles on one thread, so CPU seconds hardly depend on the load: compare those between
runs on a shared machine), and the machine's load average (``os.getloadavg``) before and
after each case: wall-clock compile times scale with the load.  JSON goes to ``benchmarks/results/cold_start-<UTC time>.json``
(``--json PATH``; ``--json ''`` for none).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # ``python benchmarks/cold_start.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

_TORCH_CTC = """
import torch, duoloss.torch as dt
g = torch.Generator().manual_seed(0)
lp = torch.randn(30, 2, 8, generator=g).log_softmax(-1).requires_grad_()
tg = torch.tensor([[1, 2, 3], [4, 5, 0]]); il = torch.tensor([30, 25]); tl = torch.tensor([3, 2])
"""

#: name -> (set-up code, timed code, what it is).  The timed code is the first call.
CASES = {
    "ctc_torch": (_TORCH_CTC, "dt.ctc_loss(lp, tg, il, tl).backward()",
                  "duoloss.torch.ctc_loss fwd+bwd, float32"),
    "ctc_jax": ("""
import jax, jax.numpy as jnp, numpy as np, duoloss.jax as dj
lp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(0).standard_normal((30, 2, 8)),
                                    jnp.float32), -1)
tg = np.array([[1, 2, 3], [4, 5, 0]]); il = np.array([30, 25]); tl = np.array([3, 2])
f = jax.value_and_grad(lambda x: dj.ctc_loss(x, tg, il, tl))
""", "jax.block_until_ready(f(lp))", "duoloss.jax.ctc_loss value_and_grad, float32"),
    "rnnt_torch": ("""
import torch, duoloss.torch as dt
g = torch.Generator().manual_seed(0)
x = torch.randn(2, 12, 4, 6, generator=g).requires_grad_()
tg = torch.tensor([[1, 2, 3], [4, 5, 1]], dtype=torch.int32)
il = torch.tensor([12, 9], dtype=torch.int32); tl = torch.tensor([3, 2], dtype=torch.int32)
""", "dt.rnnt_loss(x, tg, il, tl, blank=0).backward()", "duoloss.torch.rnnt_loss fwd+bwd, float32"),
    "asg_torch": ("""
import torch, duoloss.torch as dt
g = torch.Generator().manual_seed(0)
x = torch.randn(30, 2, 8, generator=g).requires_grad_()
tg = torch.tensor([[1, 2, 3], [4, 5, 0]]); il = torch.tensor([30, 25]); tl = torch.tensor([3, 2])
asg = dt.ASGLoss(8)
""", "asg(x, tg, il, tl).backward()", "duoloss.torch.ASGLoss fwd+bwd, float32"),
    "graph_torch": ("""
import torch, duoloss.torch as dt
from duoloss import gtn
from duoloss.graphs import ctc_graph, ctc_topo
lp = torch.randn(20, 2, 5, dtype=torch.float64).log_softmax(-1).requires_grad_()
targets = [[1, 2, 2], [3, 4]]; il = [20, 15]
""", """
dt.graph_loss(lp, ctc_graph(targets), il).backward()
acc = gtn.Graph(calc_grad=False)
for i in range(4):
    acc.add_node(start=i == 0, accept=i == 3)
for i, k in enumerate([1, 2, 2]):
    acc.add_arc(i, i + 1, k)
dt.graph_loss(lp[:, :1], [gtn.compose(ctc_topo(5), acc)], il[:1]).backward()
""", "docs/wfst.md example: graph_loss (ctc_graph; ctc_topo o acceptor), float64"),
    "k2_torch": ("""
import torch, duoloss.torch as dt
g = torch.Generator().manual_seed(0)
am = torch.randn(2, 12, 6, generator=g).requires_grad_()
lm = torch.randn(2, 4, 6, generator=g).requires_grad_()
sy = torch.tensor([[1, 2, 3], [4, 5, 1]])
""", "dt.rnnt_loss_simple(lm, am, sy, termination_symbol=0).backward()",
        "duoloss.torch.rnnt_loss_simple fwd+bwd, float32"),
    "align_torch": (_TORCH_CTC, """
dt.ctc_align(lp.detach(), tg, il, tl)
dt.asg_align(lp.detach(), torch.zeros(8, 8), tg, il, tl)
""", "duoloss.torch.ctc_align + asg_align, float32"),
}


def _child(setup, timed):
    return ("import time\n" + setup + "\nt0, c0 = time.perf_counter(), time.process_time()\n"
            + timed + "\nprint('SECONDS', time.perf_counter() - t0, time.process_time() - c0)\n")


def _run(code, cache, extra_env=None, args=None):
    """(wall seconds, CPU seconds) of the timed part (or of the whole process)."""
    env = H.child_env(NUMBA_CACHE_DIR=cache, DUOLOSS_QUIET_COMPILE=1, **(extra_env or {}))
    cmd = [sys.executable] + (args if args is not None else ["-c", code])
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("SECONDS "):
            return tuple(float(v) for v in line.split()[1:3])
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def _load():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def measure(name, repeat=1):
    """((cold wall, cold CPU), (warm wall, warm CPU), load before, load after) of a case;
    the minimum over ``repeat`` runs."""
    load0 = _load()
    colds, warms = [], []
    for _ in range(repeat):
        cache = tempfile.mkdtemp(prefix="duoloss-cold-")
        try:
            if name == "warmup":
                colds.append(_run(None, cache, args=["-m", "duoloss", "warmup"]))
                setup, timed, _ = CASES["ctc_torch"]
            else:
                setup, timed, _ = CASES[name]
                colds.append(_run(_child(setup, timed), cache))
            warms.append(_run(_child(setup, timed), cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return min(colds), min(warms), load0, _load()


def main(argv=None):
    names = list(CASES) + ["warmup"]
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(names),
                   help=f"comma-separated, from {','.join(names)} (default: all)")
    p.add_argument("--repeat", type=int, default=1, help="cold runs per case (minimum kept)")
    p.add_argument("--json", default=None, help="where to write the JSON ('' for none)")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(names))
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {names}")
    if args.json is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        args.json = os.path.join(H.RESULTS_DIR, f"cold_start-{stamp}.json")
    args.script = "cold_start"

    rows, results = [], []
    for i, name in enumerate(cases):
        H.progress(f"[{i + 1}/{len(cases)}] {name}")
        cold, warm, l0, l1 = measure(name, args.repeat)
        what = "python -m duoloss warmup (all families); warm: ctc_torch" if name == "warmup" \
            else CASES[name][2]
        rows.append([name, f"{cold[0]:.1f}", f"{cold[1]:.1f}", f"{warm[0]:.2f}",
                     f"{l0:.1f} / {l1:.1f}", what])
        results.append({"case": name, "cold_s": cold[0], "cold_cpu_s": cold[1],
                        "warm_s": warm[0], "warm_cpu_s": warm[1],
                        "load_before": l0, "load_after": l1, "what": what})
    H.progress_done()
    text = H.table(["case", "cold s", "cold CPU s", "warm s", "load 1 min (before / after)",
                    "first call"], rows, align="lrrrll")
    text += f"\n# {os.cpu_count()} CPUs; {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    H.emit(args, results, text)


if __name__ == "__main__":
    main()
