"""CTC forced alignment of long audio: peak memory and time against ``ctc_loss`` without gradient.

Each measurement runs in a fresh Python process (``--child``), so that its peak resident
set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is the peak of that one call and
its inputs, not of an earlier case.  The child imports duoloss (torch frontend), compiles
the kernels on a tiny input, then builds the synthetic float32 log-probabilities
``(T, 1, C)`` of one sequence and a random target of ``L`` labels (seed 0), and times one
call of:

* ``align``: ``duoloss.torch.ctc_align`` (sequences above
  ``duoloss.core.losses.align.CTC_CHECKPOINT_CELLS`` trellis cells take the bounded-memory
  path: checkpointed rows and a windowed recomputing traceback);
* ``align-full``: the same with the full-table path forced (``_checkpoint_cells`` huge;
  only run where its ``8 T (2L + 1)`` bytes fit in ``--full-max-gb``);
* ``loss``: ``duoloss.torch.ctc_loss(..., reduction='none')`` under ``torch.no_grad()``
  (it holds a full forward table too, so it runs only where ``align-full`` does).

Reported per case: each implementation's median seconds and peak RSS over ``--rounds``
fresh processes, the RSS of a child that only imports and compiles (the baseline), and
the ratio align / loss (median over rounds of the per-round ratios).

    python -m benchmarks.align_long                         # the default sizes
    python -m benchmarks.align_long --sizes 360000,20000,30 --rounds 1
    python benchmarks/align_long.py --quick                 # a smoke run

Sizes are ``T,L,C`` (frames, target labels, classes with the blank).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

if __package__ in (None, ""):  # ``python benchmarks/align_long.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(60000, 3000, 30), (360000, 20000, 30)]
QUICK_SIZES = [(2000, 100, 10)]
IMPLS = ("loss", "align", "align-full")


def child(impl, t, l, c):
    """One measurement in this (fresh) process; prints a JSON line."""
    import resource
    import time

    import numpy as np
    import torch

    import duoloss.torch as dt

    # compile on a tiny input first (not timed)
    lp0 = torch.log_softmax(torch.randn(8, 1, 4), -1)
    tg0 = torch.tensor([[1, 2]])
    dt.ctc_align(lp0, tg0, (8,), (2,))
    with torch.no_grad():
        dt.ctc_loss(lp0, tg0, (8,), (2,), reduction="none")
    from duoloss.core.losses import align as core_align
    core_align.ctc_align(lp0.numpy(), tg0.numpy(), [8], [2], _checkpoint_cells=0)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if impl == "baseline":
        print(json.dumps({"seconds": 0.0, "peak_bytes": base}))
        return
    rng = np.random.default_rng(0)
    lp = torch.from_numpy(rng.standard_normal((t, 1, c), dtype=np.float32))
    lp = torch.log_softmax(lp, -1)
    tg = torch.from_numpy(rng.integers(1, c, (1, l)))
    start = time.perf_counter()
    if impl == "loss":
        with torch.no_grad():
            out = dt.ctc_loss(lp, tg, (t,), (l,), reduction="none")
        score = -float(out[0])
    elif impl == "align":
        labels, scores = dt.ctc_align(lp, tg, (t,), (l,))
        score = float(scores[0])
    else:
        labels, scores = core_align.ctc_align(lp.numpy(), tg.numpy(), [t], [l],
                                              _checkpoint_cells=1 << 62)
        score = float(scores[0])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_bytes": peak, "score": score}))


def run_child(impl, size, threads):
    env = H.child_env()
    if threads:
        env["NUMBA_NUM_THREADS"] = str(threads)
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "benchmarks.align_long", "--child", impl,
           ",".join(str(x) for x in size)]
    proc = subprocess.run(cmd, cwd=H.ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"align_long child {impl} {size} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], *(int(x) for x in argv[2].split(",")))
        return
    p = H.parser(__doc__, names="T,L,C", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=1, quick_rounds=2)
    p.add_argument("--full-max-gb", type=float, default=4.0,
                   help="run align-full and loss (both hold a full table) only where the table "
                        "fits in this many GB (default 4)")
    args = p.parse_args(argv)
    H.finish_args(args, "align_long")
    results, rows = [], []
    for i, size in enumerate(args.sizes):
        t, l, c = size
        base = run_child("baseline", size, args.threads)["peak_bytes"]
        fits = 8 * t * (2 * l + 1) <= args.full_max_gb * 1e9
        impls = [m for m in IMPLS if m == "align" or fits]
        runs = {m: [] for m in impls}
        for r in range(args.rounds):
            for m in impls:
                H.progress(f"[size {i + 1}/{len(args.sizes)}] {m} round {r + 1}/{args.rounds}")
                runs[m].append(run_child(m, size, args.threads))
        H.progress_done()
        scores = {m: runs[m][0]["score"] for m in impls}
        impl_out = {m: {"median_ms": 1e3 * statistics.median(x["seconds"] for x in runs[m]),
                        "rounds_ms": [1e3 * x["seconds"] for x in runs[m]],
                        "peak_rss_bytes": max(x["peak_bytes"] for x in runs[m]),
                        "score": scores[m]} for m in impls}
        ratios = []
        for num in [m for m in impls if m != "loss" and "loss" in impls]:
            per = [a["seconds"] / b["seconds"] for a, b in zip(runs[num], runs["loss"])]
            q = statistics.quantiles(per, n=4) if len(per) > 1 else [per[0], per[0], per[0]]
            ratios.append({"num": num, "den": "loss", "median": statistics.median(per),
                           "q25": q[0], "q75": q[2], "min": min(per), "max": max(per),
                           "rounds": per})
        results.append({"size": list(size), "case": "ctc", "impls": impl_out, "ratios": ratios,
                        "extra": {"baseline_rss_bytes": base,
                                  "full_table_bytes": 8 * t * (2 * l + 1)}})
        for m in impls:
            ratio = next((x["median"] for x in ratios if x["num"] == m),
                         1.0 if m == "loss" else None)
            rows.append([H.format_size(size), m, f"{impl_out[m]['median_ms'] / 1e3:.2f}",
                         "-" if ratio is None else f"{ratio:.2f}", f"{impl_out[m]['peak_rss_bytes'] / 2**20:.0f}",
                         f"{base / 2**20:.0f}", f"{8 * t * (2 * l + 1) / 2**30:.1f}"])
    text = H.table(["T,L,C", "call", "s", "/ loss", "peak RSS MiB", "baseline MiB",
                    "full table GiB"], rows, "llrrrrr")
    print(text)
    H.write_json(args, results, text)


if __name__ == "__main__":
    main()
