"""ASG, all-alignments and graph_loss speed against duoloss's CTC kernel (fwd+bwd).

Times the core kernels (numpy in, numpy out) and the torch frontends, float32,
and prints medians and ratios to the CTC kernel at the same (B, T, C, L).
GTN cannot be installed here: its all-alignments loss via graphs took
~100 ms at B=8, T=200, C=30, L=40 on this project's machines (NOTES.md) and is
quoted as a reference number only.

    python benchmarks/asg.py                       # default sizes
    python benchmarks/asg.py --sizes 8,200,30,40 --repeats 30
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from duoloss.graphs import ctc_graph

GTN_REFERENCE_MS = {(8, 200, 30, 40): 100.0}


def bench(b, t, c, l, repeats, frontends):
    from duoloss.core import asg_loss_and_grad, ctc_loss_and_grad
    from duoloss.core._graph_loss import check_graph_args, graph_loss_and_grad

    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, b, c)).astype(np.float32)
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = rng.integers(1, c, (b, l))
    il = np.full(b, t)
    tl = np.full(b, l)
    tr = (0.5 * rng.standard_normal((c, c))).astype(np.float32)
    sv = rng.standard_normal(c).astype(np.float32)
    graphs = [ctc_graph(tg[i]) for i in range(b)]

    def graph_core():
        packed = check_graph_args("graph_loss", lp, graphs, il, None, None)
        graph_loss_and_grad(lp, packed, il)

    fns = {
        "ctc (core)": lambda: ctc_loss_and_grad(lp, tg, il, tl),
        "asg (core)": lambda: asg_loss_and_grad(x, tr, tg, il, tl, start_transitions=sv),
        "all-alignments (core)": lambda: asg_loss_and_grad(x, None, tg, il, tl),
        "graph_loss, CTC graphs (core)": graph_core,
    }
    if frontends:
        import torch

        import duoloss.torch as dt
        xt = torch.tensor(x, requires_grad=True)
        lpt = torch.tensor(lp, requires_grad=True)
        trt = torch.tensor(tr, requires_grad=True)
        tgt, ilt, tlt = torch.tensor(tg), torch.tensor(il), torch.tensor(tl)

        fns["ctc_loss (torch)"] = lambda: dt.ctc_loss(lpt, tgt, ilt, tlt).backward()
        fns["asg_loss (torch)"] = lambda: dt.asg_loss(xt, trt, tgt, ilt, tlt).backward()
        fns["graph_loss, CTC graphs (torch)"] = (
            lambda: dt.graph_loss(lpt, graphs, ilt, target_lengths=tlt).backward())
    return interleaved_medians(fns, repeats)


def interleaved_medians(fns, repeats, warmup=2):
    """Median ms of each function, timed round-robin so load drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="*", default=["1,50,20,10", "8,200,30,40", "16,500,50,100"],
                   help="B,T,C,L tuples")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--no-frontends", action="store_true", help="core kernels only")
    p.add_argument("--threads", type=int, default=0,
                   help="numba (and torch) threads; 0 = default. 1 gives stable ratios on a "
                        "shared machine")
    args = p.parse_args()
    if args.threads:
        import numba
        numba.set_num_threads(args.threads)
        try:
            import torch
            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    print(f"{'B,T,C,L':>14} | {'loss':<32} | {'median ms':>9} | {'vs ctc core':>11} | "
          f"{'GTN ~ms':>8}")
    print("-" * 88)
    for s in args.sizes:
        b, t, c, l = (int(v) for v in s.split(","))
        rows = bench(b, t, c, l, args.repeats, not args.no_frontends)
        base = rows["ctc (core)"]
        gtn = GTN_REFERENCE_MS.get((b, t, c, l))
        for name, ms in rows.items():
            ref = f"{gtn:8.0f}" if gtn and name.startswith("all-alignments") else f"{'':8}"
            print(f"{s:>14} | {name:<32} | {ms:9.3f} | {ms / base:10.2f}x | {ref}")
        print("-" * 88)


if __name__ == "__main__":
    main()
