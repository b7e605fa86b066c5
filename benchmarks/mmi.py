"""LF-MMI cost: graph_loss fwd+bwd with a denominator vs without (PyTorch, CPU).

B=8, T=200, 30 classes (blank + 29 tokens), CTC numerators of 40 tokens, and
a back-off token bigram over the 30 classes estimated from random strings, as
denominator in three forms:

* ``bigram``: the bigram itself as a frame-level graph (one arc per frame, an
  HMM with one state per token; epsilon back-off arcs);
* ``topo o bigram (modified)``: ``compose(ctc_topo(30, modified=True), bigram)``;
* ``topo o bigram (standard)``: ``compose(ctc_topo(30), bigram)``.

The shared denominator is packed once (``pack_graphs([den])``) outside the
timed loop, as a training loop would.  Prints median milliseconds over paired
rounds (every case once per round, rotating order) and the ratio to the
numerator-only loss (median of per-round ratios, interquartile range).

Run::

    python benchmarks/mmi.py [--rounds 15]
    python -m benchmarks.mmi --quick               # a smoke run

Sizes are ``B,T,C,L`` (batch, frames, classes with the blank, numerator length).
"""
from __future__ import annotations

import os
import sys

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/mmi.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(8, 200, 30, 40)]
QUICK_SIZES = [(2, 30, 10, 5)]
BASE = "numerator only"


def bench(b, t, c, l, rounds, dtype, label=""):
    import torch

    import duoloss.torch as dt
    from duoloss import gtn
    from duoloss.core.losses.graph_loss import pack_graphs
    from duoloss.graphs import ctc_graph, ctc_topo, token_ngram_graph

    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, b, c))
    lp = torch.tensor(x - np.log(np.exp(x).sum(-1, keepdims=True)), dtype=getattr(torch, dtype))
    nums = pack_graphs(ctc_graph([list(rng.integers(1, c, l)) for _ in range(b)]))
    il = np.full(b, t)
    lm = token_ngram_graph([list(rng.integers(0, c, 60)) for _ in range(200)], c, order=2)
    tokens = token_ngram_graph([list(rng.integers(1, c, 60)) for _ in range(200)], c, order=2)
    dens = {
        "bigram": lm,
        "topo o bigram (modified)": gtn.compose(ctc_topo(c, modified=True), tokens),
        "topo o bigram (standard)": gtn.compose(ctc_topo(c), tokens),
    }
    packed = {k: pack_graphs([g]) for k, g in dens.items()}

    def run(den):
        e = lp.detach().requires_grad_(True)
        loss = dt.graph_loss(e, nums, il, reduction="sum", denominator=den)
        loss.backward()

    cases = {BASE: None, **packed}
    # every case once per round, rotating order: load drifts hit all of them alike
    timing = H.paired({k: (lambda den=den: run(den)) for k, den in cases.items()}, rounds,
                      label=label)
    sizes = {BASE: ("", int(nums.arc_off[-1]) // b)}
    sizes.update({k: (g.num_nodes(), g.num_arcs()) for k, g in dens.items()})
    return timing, sizes


def main(argv=None):
    ap = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                  rounds=15, threads=None, threads_help="torch threads (default: torch's)")
    ap.add_argument("--repeats", dest="rounds", type=int, help="alias of --rounds")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = H.finish_args(ap.parse_args(argv), "mmi")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    parts, results = [], []
    for i, size in enumerate(args.sizes):
        tm, graph_sizes = bench(*size, args.rounds, args.dtype,
                                label=H.size_label(i, len(args.sizes)))
        ratios = [tm.ratio(k, BASE) for k in tm.rounds_ms]
        rows = [[k, graph_sizes[k][0], graph_sizes[k][1], H.fmt_ms(tm.median(k)), H.fmt_ratio(r)]
                for k, r in zip(tm.rounds_ms, ratios)]
        b, t, c, l = size
        parts.append(f"graph_loss fwd+bwd, B={b} T={t} C={c} L={l}, {args.dtype}, "
                     f"{torch.get_num_threads()} torch threads, median of {args.rounds} paired "
                     f"rounds (numerator arcs: per graph)\n\n"
                     + H.table(["denominator", "nodes", "arcs", "ms", "ratio"], rows))
        results.append(H.result(size, tm, ratios=ratios, extra={
            "graphs": {k: {"nodes": n or None, "arcs": a} for k, (n, a) in graph_sizes.items()}}))
    H.emit(args, results, "\n\n".join(parts))


if __name__ == "__main__":
    main()
