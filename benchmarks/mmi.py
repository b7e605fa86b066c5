"""LF-MMI cost: graph_loss fwd+bwd with a denominator vs without (PyTorch, CPU).

B=8, T=200, 30 classes (blank + 29 tokens), CTC numerators of 40 tokens, and
a back-off token bigram over the 30 classes estimated from random strings, as
denominator in three forms:

* ``bigram``: the bigram itself as a frame-level graph (one arc per frame, an
  HMM with one state per token; epsilon back-off arcs);
* ``topo o bigram (modified)``: ``compose(ctc_topo(30, modified=True), bigram)``;
* ``topo o bigram (standard)``: ``compose(ctc_topo(30), bigram)``.

The shared denominator is packed once (``pack_graphs([den])``) outside the
timed loop, as a training loop would.  Prints median milliseconds of
alternating blocks and the ratio to the numerator-only loss.

Run::

    python benchmarks/mmi.py [--repeats 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import duoloss.torch as dt
from duoloss import gtn
from duoloss.core._graph_loss import pack_graphs
from duoloss.graphs import ctc_graph, ctc_topo, token_ngram_graph


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = ap.parse_args(argv)
    b, t, c, l = 8, 200, 30, 40
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, b, c))
    lp = torch.tensor(x - np.log(np.exp(x).sum(-1, keepdims=True)),
                      dtype=getattr(torch, args.dtype))
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

    cases = {"numerator only": None, **packed}
    for den in cases.values():  # warm-up (compiles)
        run(den)
    times = {k: [] for k in cases}
    for _ in range(args.repeats):  # alternate cases: load drifts hit all of them alike
        for k, den in cases.items():
            t0 = time.perf_counter()
            run(den)
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["numerator only"])
    print(f"graph_loss fwd+bwd, B={b} T={t} C={c} L={l}, {args.dtype}, "
          f"{torch.get_num_threads()} torch threads, median of {args.repeats}")
    print(f"{'denominator':28s} {'nodes':>6s} {'arcs':>6s} {'ms':>8s} {'ratio':>6s}")
    num_arcs = int(nums.arc_off[-1]) // b
    print(f"{'numerator only':28s} {'':>6s} {num_arcs:6d} {base * 1e3:8.2f} {1.0:6.2f}")
    for k, g in dens.items():
        ms = statistics.median(times[k])
        print(f"{k:28s} {g.num_nodes():6d} {g.num_arcs():6d} {ms * 1e3:8.2f} {ms / base:6.2f}")


if __name__ == "__main__":
    main()
