"""Nanoseconds per lattice cell, one thread: the CTC loss kernel and ``ctc_align``.

One number per kernel that can be set beside what this CPU allows (issue 36): the CTC
forward-backward (loss and gradient w.r.t. ``log_probs``, float32 in, from normalised
scores) of a whole batch on one thread, divided by its ``sum_b T_b (2 L_b + 1)`` trellis
cells; and ``ctc_align`` of one long sequence (bounded-memory path above
``CTC_CHECKPOINT_CELLS``) divided by ``T (2L + 1)``.  The core kernels are called
directly on this thread (no frontend, no thread pool), so the figure is the kernel's.

With ``--base PATH`` (a checkout of another commit, e.g. a ``git worktree``) every case
runs in alternating fresh processes for this checkout and that one (``--rounds`` pairs),
and the table gives both medians and the median of the per-pair ratios (new / base).

    python benchmarks/cpu_cells.py
    python benchmarks/cpu_cells.py --base /tmp/base-6ae7f56 --rounds 3
    python benchmarks/cpu_cells.py --sizes "32,500,50,100" --align 180000,8000,30

Sizes are ``B,T,C,L`` for CTC; ``--align`` takes ``T,L,C`` (``''`` for none).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

if __package__ in (None, ""):  # ``python benchmarks/cpu_cells.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SIZES = [(1, 50, 20, 10), (32, 500, 50, 100), (16, 1000, 100, 200)]
QUICK_SIZES = [(2, 30, 10, 5)]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
kind, size, reps = sys.argv[2], [int(v) for v in sys.argv[3].split(",")], int(sys.argv[4])
rng = np.random.default_rng(0)
if kind == "ctc":
    from duoloss.core.losses import ctc as K
    b, t, c, l = size
    x = rng.standard_normal((t, b, c))
    x = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = rng.integers(1, c, size=(b, l)).astype(np.int64)
    il = np.full(b, t, np.int64); tl = np.full(b, l, np.int64)
    order = np.arange(b, dtype=np.int64)
    losses = np.empty(b); grad = np.empty_like(x); pending = np.zeros(b, np.int8)
    def call():
        K._ctc_batch_serial(order, x, tg, il, tl, 0, True, False, np.zeros(0), losses, grad,
                            pending)
    cells = b * t * (2 * l + 1)
else:
    from duoloss.core.losses.align import ctc_align
    t, l, c = size
    x = rng.standard_normal((t, 1, c))
    x = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = rng.integers(1, c, size=(1, l)); il = np.array([t]); tl = np.array([l])
    def call():
        ctc_align(x, tg, il, tl)
    cells = t * (2 * l + 1)
call()  # compile (or load from the cache)
times = []
for _ in range(reps):
    t0 = time.perf_counter(); call(); times.append(time.perf_counter() - t0)
print(json.dumps({"ns_per_cell": min(times) / cells * 1e9, "s": min(times), "cells": cells}))
"""


def _child(path, kind, size, reps):
    env = H.child_env(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD, path, kind, ",".join(map(str, size)),
                          str(reps)], env=env, cwd=path, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=3, quick_rounds=1)
    p.add_argument("--align", default="180000,8000,30",
                   help="T,L,C of one ctc_align case ('' for none); default one hour")
    p.add_argument("--base", default="", help="another checkout to pair with (a path)")
    args = H.finish_args(p.parse_args(argv), "cpu_cells")
    cases = [("ctc", tuple(s)) for s in args.sizes]
    if args.align and not args.quick:
        cases.append(("align", tuple(int(v) for v in args.align.split(","))))
    paths = {"now": ROOT}
    if args.base:
        paths["base"] = os.path.abspath(args.base)
    results, rows = [], []
    for i, (kind, size) in enumerate(cases):
        got = {k: [] for k in paths}
        for r in range(args.rounds):
            for name in (paths if r % 2 == 0 else list(paths)[::-1]):
                H.progress(f"[{i + 1}/{len(cases)}] {kind} {size} {name} round {r + 1}")
                reps = 1 if kind == "align" else 5
                got[name].append(_child(paths[name], kind, size, reps)["ns_per_cell"])
        med = {k: statistics.median(v) for k, v in got.items()}
        row = [kind, H.format_size(size), f"{med['now']:.2f}"]
        extra = {"ns_per_cell": got}
        if "base" in med:
            ratios = [a / b for a, b in zip(got["now"], got["base"])]
            extra["ratio_now_base"] = ratios
            row += [f"{med['base']:.2f}", f"{statistics.median(ratios):.2f}x"]
        rows.append(row)
        results.append(H.result(size, case=kind, extra=extra))
    H.progress_done()
    headers = ["kernel", "size", "ns/cell now"] + (["ns/cell base", "now/base"] if args.base
                                                    else [])
    H.emit(args, results, H.table(headers, rows))


if __name__ == "__main__":
    main()
