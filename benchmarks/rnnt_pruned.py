"""Pruned RNN-T (k2 recipe) vs the full RNN-T: time and peak memory, torch, CPU.

One training step's loss work on the additive joiner ``logits = am + lm`` (a
stand-in for a real joiner, so both sides do the same joiner work per kept
position), forward + backward to ``am`` and ``lm``:

* full:   ``logits`` ``(N, T, U+1, V)`` -> ``duoloss.torch.rnnt_loss``;
* pruned: ``rnnt_loss_simple(..., return_grad=True)`` -> ``get_rnnt_prune_ranges``
  -> ``do_rnnt_pruning`` -> ``logits`` ``(N, T, s_range, V)`` ->
  ``rnnt_loss_pruned`` (the whole icefall pipeline, simple loss included).

Time: median wall time of ``--rounds`` steps after one warm-up step.
Peak memory: each case runs in a fresh process (numba cache warm); the number
reported is that process's peak resident set size (``ru_maxrss``) minus its RSS
just before the first step (imports done, inputs built), i.e. the extra memory
the loss step needed at its peak.  (torch's CPU allocator is invisible to
``tracemalloc``, so RSS is the honest measure on CPU.)

    python benchmarks/rnnt_pruned.py                     # (16, 500, 100, 500), s_range 5
    python benchmarks/rnnt_pruned.py --sizes 4,100,20,50 --rounds 3
    python -m benchmarks.rnnt_pruned --quick             # a smoke run

Sizes are ``N,T,U,V`` (batch, frames, target length, classes with the blank).
The two cases run in separate processes, so the ratio full / pruned is the
median over steps of step i's ratio, not a ratio of rounds paired in time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/rnnt_pruned.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(16, 500, 100, 500)]
QUICK_SIZES = [(2, 20, 5, 10)]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _case(kind, n, t, u, v, s_range, reps, threads):
    import torch

    if threads:
        torch.set_num_threads(threads)

    import duoloss.torch as dt

    rng = np.random.default_rng(0)
    am = torch.tensor(rng.standard_normal((n, t, v)).astype(np.float32), requires_grad=True)
    lm = torch.tensor(rng.standard_normal((n, u + 1, v)).astype(np.float32), requires_grad=True)
    symbols = torch.from_numpy(rng.integers(1, v, (n, u)))
    t_len = torch.full((n,), t, dtype=torch.int32)
    u_len = torch.full((n,), u, dtype=torch.int32)
    boundary = torch.zeros((n, 4), dtype=torch.int64)
    boundary[:, 2] = u
    boundary[:, 3] = t

    def full():
        logits = am[:, :, None, :] + lm[:, None, :, :]
        loss = dt.rnnt_loss(logits, symbols.to(torch.int32), t_len, u_len, blank=0,
                            reduction="sum")
        loss.backward()
        return loss.item()

    def pruned():
        simple, (px_grad, py_grad) = dt.rnnt_loss_simple(lm, am, symbols, 0, boundary,
                                                         reduction="sum", return_grad=True)
        ranges = dt.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range)
        am_p, lm_p = dt.do_rnnt_pruning(am, lm, ranges)
        loss = dt.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, boundary, reduction="sum")
        (simple + loss).backward()
        return loss.item()

    step = full if kind == "full" else pruned
    base = _rss_mib()
    step()  # warm-up (numba cache load); its peak counts too
    times = []
    for _ in range(reps):
        am.grad = lm.grad = None
        t0 = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - t0)
    return dict(kind=kind, torch=torch.__version__, ms=1e3 * float(np.median(times)),
                peak_mib=_peak_mib() - base,
                loss=value, steps_ms=[1e3 * x for x in times])


def main(argv=None):
    ap = H.parser(__doc__, names="N,T,U,V", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                  rounds=3, quick_rounds=2, threads=0,
                  threads_help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--reps", dest="rounds", type=int, help="alias of --rounds")
    ap.add_argument("--s-range", type=int, default=5)
    ap.add_argument("--case", choices=("full", "pruned"), help=argparse.SUPPRESS)
    args = H.finish_args(ap.parse_args(argv), "rnnt_pruned")
    if args.case:
        n, t, u, v = args.sizes[0]
        print(json.dumps(_case(args.case, n, t, u, v, args.s_range, args.rounds, args.threads)))
        return
    parts, results = [], []
    for i, size in enumerate(args.sizes):
        res = {}
        for kind in ("pruned", "full"):
            H.progress(f"{H.size_label(i, len(args.sizes))}{kind} (fresh process, "
                       f"{args.rounds} steps)")
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--sizes",
                                  H.format_size(size), "--s-range", str(args.s_range),
                                  "--rounds", str(args.rounds), "--threads", str(args.threads),
                                  "--case", kind, "--json", ""],
                                 check=True, capture_output=True, text=True, env=H.child_env())
            res[kind] = json.loads(out.stdout.strip().splitlines()[-1])
        H.progress_done()
        f, p = res["full"], res["pruned"]
        ratio = H.ratio_stats("full", "pruned", f["steps_ms"], p["steps_ms"])
        n, t, u, v = size
        parts.append(
            f"(N,T,U,V)=({n},{t},{u},{v}) s_range={args.s_range}, torch {f['torch']}, "
            f"{os.cpu_count()} cpus, torch threads {args.threads or 'default'}, "
            f"median of {args.rounds}\n\n"
            + H.table(["case", "fwd+bwd ms", "peak extra RSS MiB"],
                      [[r["kind"], f"{r['ms']:.0f}", f"{r['peak_mib']:.0f}"] for r in (f, p)]
                      + [["full / pruned", f"{f['ms'] / p['ms']:.1f}x",
                          f"{f['peak_mib'] / p['peak_mib']:.1f}x" if p["peak_mib"] > 0
                          else "n/a"]], align="lll"))
        results.append(H.result(size, ratios=[ratio], impls={
            r["kind"]: {"median_ms": r["ms"], "rounds_ms": r["steps_ms"], "calls_per_round": 1,
                        "peak_extra_rss_mib": r["peak_mib"], "loss": r["loss"]} for r in (f, p)},
            extra={"s_range": args.s_range, "paired": False}))
    H.emit(args, results, "\n\n".join(parts))


if __name__ == "__main__":
    main()
