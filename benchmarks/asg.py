"""ASG, all-alignments and graph_loss speed against duoloss's CTC kernel (fwd+bwd).

Times the core kernels (numpy in, numpy out) and the torch frontends, float32,
in paired rounds (each round calls every implementation once, in rotating
order), and prints medians and ratios to the CTC kernel at the same
(B, T, C, L): the median over rounds of the per-round ratio, with the rounds'
interquartile range.
GTN cannot be installed here: its all-alignments loss via graphs took
~100 ms at B=8, T=200, C=30, L=40 on this project's machines (NOTES.md) and is
quoted as a reference number only.

    python benchmarks/asg.py                       # default sizes
    python benchmarks/asg.py --sizes 8,200,30,40 --rounds 30
    python benchmarks/asg.py --sizes 8,200,30,40 --no-frontends --threads 1
    python -m benchmarks.asg --quick               # a smoke run

Sizes are ``B,T,C,L`` (batch, frames, classes, target length).
"""
from __future__ import annotations

import os
import sys

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/asg.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

GTN_REFERENCE_MS = {(8, 200, 30, 40): 100.0}
DEFAULT_SIZES = [(1, 50, 20, 10), (8, 200, 30, 40), (16, 500, 50, 100)]
QUICK_SIZES = [(2, 30, 10, 5)]
BASE = "ctc (core)"


def bench(b, t, c, l, rounds, frontends, label=""):
    from duoloss.core import asg_loss_and_grad, ctc_loss_and_grad
    from duoloss.core.losses.graph_loss import check_graph_args, graph_loss_and_grad
    from duoloss.graphs import ctc_graph

    rng, x, lp, tg, il, tl, tr = H.synthetic_inputs(b, t, c, l)
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
    return H.paired(fns, rounds, warmup=2, label=label)


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=20, threads=0,
                 threads_help="numba (and torch) threads; 0 = default. 1 gives stable ratios "
                              "on a shared machine")
    p.add_argument("--repeats", dest="rounds", type=int, help="alias of --rounds")
    p.add_argument("--no-frontends", action="store_true", help="core kernels only")
    args = H.finish_args(p.parse_args(argv), "asg")
    if args.threads:
        import numba
        numba.set_num_threads(args.threads)
        try:
            import torch
            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    rows, results = [], []
    for i, size in enumerate(args.sizes):
        tm = bench(*size, args.rounds, not args.no_frontends,
                   label=H.size_label(i, len(args.sizes)))
        gtn = GTN_REFERENCE_MS.get(tuple(size))
        ratios = [tm.ratio(name, BASE) for name in tm.rounds_ms]
        for name, r in zip(tm.rounds_ms, ratios):
            ref = f"{gtn:.0f}" if gtn and name.startswith("all-alignments") else ""
            rows.append([H.format_size(size), name, H.fmt_ms(tm.median(name)), H.fmt_ratio(r), ref])
        results.append(H.result(size, tm, ratios=ratios,
                                extra={"gtn_reference_ms": gtn}))
    text = (f"fwd+bwd, float32, median ms over {args.rounds} paired rounds; ratio to the CTC "
            f"core kernel = median of per-round ratios (interquartile range in brackets); "
            f"GTN ~ms: quoted reference, not measured here\n\n"
            + H.table(["B,T,C,L", "loss", "median ms", "vs ctc core", "GTN ~ms"], rows,
                      align="llrrr"))
    H.emit(args, results, text)


if __name__ == "__main__":
    main()
