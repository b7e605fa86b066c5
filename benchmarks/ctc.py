"""CTC forward+backward: duoloss vs torch's F.ctc_loss and optax.ctc_loss.

All four run in one process on the same data; each peer is timed interleaved
with its duoloss counterpart (alternating blocks of calls), and the ratio is
the median of the per-round paired ratios, so drifting machine load cancels.
Each call is a full training step's worth of loss work: logits -> log_softmax
-> CTC -> backward to the logits (optax and duoloss.jax under ``jax.jit``).

    python benchmarks/ctc.py                       # the default grid
    python benchmarks/ctc.py --sizes 8,200,30,40 --reps 30
    python benchmarks/ctc.py --cold-start          # also: first call in a new process
    python benchmarks/ctc.py --sizes 16,500,8000,100   # a large vocabulary (gathered crossing)

The "host MB" column is what duoloss moves between the framework and the core
per call (float32 scores in, their gradient out): ``(T, N, C)`` both ways, or
``(T, N, S+1)`` when the frontends gather a large vocabulary's used columns.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

DEFAULT_SIZES = "1,50,20,10;8,200,30,40;32,500,50,100;16,1000,100,200;16,500,8000,100"


def _parse_sizes(text):
    return [tuple(int(v) for v in item.split(",")) for item in text.split(";") if item]


def _make_fns(b, t, c, l, seed=0):
    import jax
    import jax.numpy as jnp
    import optax
    import torch
    import torch.nn.functional as F

    import duoloss.jax as dj
    import duoloss.torch as dt

    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, t, c)).astype(np.float32)
    labels = rng.integers(1, c, size=(b, l)).astype(np.int32)
    in_len = np.full(b, t, np.int32)
    tg_len = np.full(b, l, np.int32)

    x = torch.tensor(logits.transpose(1, 0, 2).copy(), requires_grad=True)
    tg, il, tl = (torch.from_numpy(a.astype(np.int64)) for a in (labels, in_len, tg_len))

    def torch_step(fn):
        def step():
            x.grad = None
            loss = fn(x.log_softmax(-1), tg, il, tl, reduction="sum")
            loss.backward()
            return loss.item()
        return step

    lpad = np.zeros((b, t), np.float32)
    labpad = np.zeros((b, l), np.float32)
    z = jnp.asarray(logits)

    def jax_step(fn):
        vg = jax.jit(jax.value_and_grad(lambda q: fn(q, lpad, labels, labpad).sum()))

        def step():
            v, g = vg(z)
            g.block_until_ready()
            return float(v)
        return step

    return {
        "torch F.ctc_loss": torch_step(F.ctc_loss),
        "duoloss.torch": torch_step(dt.ctc_loss),
        "optax.ctc_loss": jax_step(optax.ctc_loss),
        "duoloss.jax": jax_step(dj.optax_ctc_loss),
    }


def _interleaved(fns, reps, warmup, block_s=0.02):
    """Per-call medians (ms) of each function and the median paired ratio of
    the second function to the first.

    The functions take turns in blocks of about ``block_s`` seconds (one call
    per block for slow ones), ``reps`` rounds.  Blocks rather than single
    alternating calls: a library's worker threads keep spinning for a while
    after each parallel region (OpenMP's wait policy), and right after a call
    of the other library they would be timed as part of this one's call, a
    cost no training loop that uses one library pays.  The ratio is the median
    over rounds of (second's block median / first's block median): both blocks
    of a round see the same machine, so drifting load cancels.
    """
    block = {}
    for k, f in fns.items():
        for _ in range(warmup):
            f()
        t0 = time.perf_counter()
        f()  # warm now: the block length comes from a warm call
        per_call = time.perf_counter() - t0
        block[k] = max(1, min(200, int(block_s / max(per_call, 1e-9))))
    times = {k: [] for k in fns}
    rounds = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            ts = []
            for _ in range(block[k]):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            times[k].extend(ts)
            rounds[k].append(np.median(ts))
    first, second = list(fns)[:2]
    ratio = float(np.median(np.asarray(rounds[second]) / np.asarray(rounds[first])))
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}, ratio


def bench(sizes, reps, warmup):
    """Each framework's pair runs interleaved (torch pair, then JAX pair): JAX's and
    torch's worker threads would otherwise compete for the cores inside one rep."""
    rows = []
    for size in sizes:
        fns = _make_fns(*size)
        med = {}
        ratios = []
        for pair in (("torch F.ctc_loss", "duoloss.torch"), ("optax.ctc_loss", "duoloss.jax")):
            m, r = _interleaved({k: fns[k] for k in pair}, reps, warmup)
            med.update(m)
            ratios.append(r)
        rows.append((size, med, ratios))
    return rows


def cold_start():
    """Seconds for import + first call in a fresh process (numba cache warm)."""
    code = (
        "import time, numpy as np; t0 = time.perf_counter();"
        "from duoloss.core import ctc_loss_and_grad;"
        "lp = np.log(np.full((50, 2, 20), 0.05, np.float32));"
        "ctc_loss_and_grad(lp, np.ones((2, 5), np.int64), [50, 50], [5, 5]);"
        "t1 = time.perf_counter();"
        "import duoloss.torch, torch; t2 = time.perf_counter();"
        "duoloss.torch.ctc_loss(torch.from_numpy(lp).requires_grad_(), torch.ones(2, 5, dtype=torch.long), [50, 50], [5, 5]).backward();"
        "t3 = time.perf_counter(); print(f'{t1 - t0:.3f} {t3 - t2:.3f}')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm cache
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    core, torch_call = (float(v) for v in out.stdout.split())
    return core, torch_call


def host_bytes(b, t, c, l):
    """Score bytes crossing to the host and back per fwd+bwd call (float32)."""
    from duoloss.core._ctc import ctc_gather_worthwhile

    width = l + 1 if ctc_gather_worthwhile(t, b, c, l) else c
    return 2 * t * b * width * 4, 2 * t * b * c * 4


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="'B,T,C,L;B,T,C,L;...'")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--cold-start", action="store_true")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rows = bench(_parse_sizes(args.sizes), args.reps, args.warmup)
    print(f"CTC fwd+bwd (logits -> log_softmax -> loss -> grad), float32, median ms per call "
          f"over {args.reps} alternating rounds, {args.threads} threads; ratio = median of the "
          f"rounds' paired ratios (duoloss / peer)")
    print("| B,T,C,L | torch F.ctc_loss | duoloss.torch | ratio | optax (jit) | duoloss.jax (jit) "
          "| ratio | host MB (full width) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size, m, (r_torch, r_jax) in rows:
        sent, full = host_bytes(*size)
        print(f"| {','.join(map(str, size))} | {m['torch F.ctc_loss']:.2f} | {m['duoloss.torch']:.2f} "
              f"| {r_torch:.2f}x | {m['optax.ctc_loss']:.2f} | {m['duoloss.jax']:.2f} "
              f"| {r_jax:.2f}x | {sent / 2**20:.2f} ({full / 2**20:.2f}) |")
    if args.cold_start:
        core, torch_call = cold_start()
        print(f"\nnew process, numba cache warm: import + first core call {core:.2f} s; "
              f"first duoloss.torch call {torch_call:.2f} s (after importing torch)")


if __name__ == "__main__":
    main()
