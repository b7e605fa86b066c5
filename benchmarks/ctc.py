"""CTC forward+backward: duoloss vs torch's F.ctc_loss and optax.ctc_loss.

All four run in one process on the same data; each peer is timed in paired
rounds with its duoloss counterpart (alternating blocks of calls, about 20 ms
each), and the ratio is the median of the per-round paired ratios (with the
rounds' interquartile range), so drifting machine load cancels.  Each call is a
full training step's worth of loss work: logits -> log_softmax -> CTC ->
backward to the logits (optax and duoloss.jax under ``jax.jit``).

    python benchmarks/ctc.py                       # the default grid
    python benchmarks/ctc.py --sizes 8,200,30,40 --rounds 30
    python benchmarks/ctc.py --cold-start          # also: first call in a new process
    python benchmarks/ctc.py --sizes 16,500,8000,100   # a large vocabulary (gathered crossing)
    python -m benchmarks.ctc --quick               # a smoke run

Sizes are ``B,T,C,L`` (batch, frames, classes with the blank, target length).
The "host MB" column is what duoloss moves between the framework and the core
per call (float32 scores in, their gradient out): ``(T, N, C)`` both ways, or
``(T, N, S+1)`` when the frontends gather a large vocabulary's used columns.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/ctc.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(1, 50, 20, 10), (8, 200, 30, 40), (32, 500, 50, 100), (16, 1000, 100, 200),
                 (16, 500, 8000, 100)]
QUICK_SIZES = [(2, 30, 10, 5)]
PAIRS = (("torch F.ctc_loss", "duoloss.torch"), ("optax.ctc_loss", "duoloss.jax"))


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
    env = H.child_env()
    H.progress("cold start: warming the numba cache in a new process")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
    H.progress("cold start: timing a new process")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env)
    H.progress_done()
    core, torch_call = (float(v) for v in out.stdout.split())
    return core, torch_call


def host_bytes(b, t, c, l):
    """Score bytes crossing to the host and back per fwd+bwd call (float32)."""
    from duoloss.core.losses.ctc import ctc_gather_worthwhile

    width = l + 1 if ctc_gather_worthwhile(t, b, c, l) else c
    return 2 * t * b * width * 4, 2 * t * b * c * 4


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=15, threads=2, threads_help="torch intra-op threads (default 2)")
    p.add_argument("--reps", dest="rounds", type=int, help="alias of --rounds")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per implementation")
    p.add_argument("--cold-start", action="store_true",
                   help="also time import + first call in a new process")
    args = H.finish_args(p.parse_args(argv), "ctc")

    import torch

    torch.set_num_threads(args.threads)
    rows, results = [], []
    for i, size in enumerate(args.sizes):
        fns = _make_fns(*size)
        med, ratios, impls = {}, [], {}
        # each framework's pair alone: JAX's and torch's worker threads would otherwise
        # compete for the cores inside one round
        for peer, ours in PAIRS:
            tm = H.paired({k: fns[k] for k in (peer, ours)}, args.rounds, warmup=args.warmup,
                          block_s=0.02, label=H.size_label(i, len(args.sizes)))
            med.update(tm.medians())
            impls.update(tm.impls())
            ratios.append(tm.ratio(ours, peer))
        sent, full = host_bytes(*size)
        rows.append([H.format_size(size), H.fmt_ms(med["torch F.ctc_loss"]),
                     H.fmt_ms(med["duoloss.torch"]), H.fmt_ratio(ratios[0]),
                     H.fmt_ms(med["optax.ctc_loss"]), H.fmt_ms(med["duoloss.jax"]),
                     H.fmt_ratio(ratios[1]), f"{sent / 2**20:.2f} ({full / 2**20:.2f})"])
        results.append(H.result(size, impls=impls, ratios=ratios,
                                extra={"host_mb": sent / 2**20, "host_mb_full_width": full / 2**20}))
    text = (f"CTC fwd+bwd (logits -> log_softmax -> loss -> grad), float32, median ms per call "
            f"over {args.rounds} paired rounds, {args.threads} threads; ratio = median of the "
            f"rounds' paired ratios (duoloss / peer), interquartile range in brackets\n\n"
            + H.table(["B,T,C,L", "torch F.ctc_loss", "duoloss.torch", "ratio", "optax (jit)",
                       "duoloss.jax (jit)", "ratio", "host MB (full width)"], rows))
    if args.cold_start:
        core, torch_call = cold_start()
        text += (f"\n\nnew process, numba cache warm: import + first core call {core:.2f} s; "
                 f"first duoloss.torch call {torch_call:.2f} s (after importing torch)")
        results.append(H.result(None, case="cold start",
                                extra={"import_and_first_core_call_s": core,
                                       "first_duoloss_torch_call_s": torch_call}))
    H.emit(args, results, text)


if __name__ == "__main__":
    main()
