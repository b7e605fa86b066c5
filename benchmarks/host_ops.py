"""Host work per training step of every torch device loss, beside ``F.ctc_loss``.

A GPU step costs the kernels plus what the host dispatches around them: at roughly
5–15 µs of dispatch and launch per aten op on a GPU host, a few dozen ops are the
millisecond by which a device loss can trail a native one at every length.  This
counts that work on a CPU-only machine: with ``TRITON_INTERPRET=1`` and
``triton.runtime.interpreter.InterpretedFunction.run`` replaced by a no-op (the Triton
kernels launch nothing), a ``TorchDispatchMode`` records every aten op a step
dispatches — forward and ``backward()`` from a leaf input, the ops inside duoloss's
own ``torch.library`` operators included (the mode is re-entered inside them) — and
the host time of the same step is timed (median µs; the kernels cost nothing, the
small tensors' arithmetic little).

Each step's integer arguments (targets, lengths) already lie on the input's device,
as in a training loop and in ``benchmarks.device``'s CUDA timings.

    python -m benchmarks.host_ops              # the table
    python -m benchmarks.host_ops --json       # one JSON line (tests/test_device_op_counts.py)

It sets ``TRITON_INTERPRET=1`` and stubs the interpreter in its own process: run it as
a script, not inside another test process.  CPU µs are indicative only (a loaded
machine); the op counts are exact.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

#: (T, N, C, S) of the CTC step; (N, T, U, V) of the transducer steps
CTC_SHAPE = (50, 4, 20, 10)
TRANSDUCER_SHAPE = (4, 12, 5, 8)

__all__ = ["CTC_SHAPE", "TRANSDUCER_SHAPE", "count_step", "main", "steps", "stub_kernels"]


def stub_kernels() -> None:
    """``TRITON_INTERPRET=1`` and every Triton launch a no-op (this process only)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as ti
    ti.InterpretedFunction.run = lambda self, *args, **kwargs: None


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        """Every op dispatched while active; inside a ``duoloss::`` operator too."""

        def __init__(self):
            super().__init__()
            self.ops: List[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            if func.namespace == "duoloss":
                with self:
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    return Count


def count_step(make_input: Callable[[], "object"], loss: Callable[["object"], "object"],
               warm: int = 2) -> List[str]:
    """The aten ops of ``loss(x).backward()`` for a fresh leaf ``x = make_input()``
    (after ``warm`` uncounted steps: first-call caches filled)."""
    count = _counter()
    for _ in range(warm):
        loss(make_input()).backward()
    x = make_input()
    with count() as c:
        loss(x).backward()
    return c.ops


def _time_step(make_input, loss, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        x = make_input()
        t0 = time.perf_counter()
        loss(x).backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def steps() -> Dict[str, tuple]:
    """``name -> (make_input, loss)``: one step of each torch device loss and of
    ``F.ctc_loss`` (the reference), float32, reduction ``'mean'``."""
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    g = torch.Generator().manual_seed(0)
    t, n, c, s = CTC_SHAPE
    lp0 = torch.randn(t, n, c, generator=g).log_softmax(-1)
    tg = torch.randint(1, c, (n, s), generator=g)
    il = torch.full((n,), t, dtype=torch.int64)
    tl = torch.full((n,), s, dtype=torch.int64)

    def lp():
        return lp0.clone().requires_grad_()

    nn, tt, u, v = TRANSDUCER_SHAPE
    x0 = torch.randn(nn, tt, u + 1, v + 2, generator=g)
    y = torch.randint(1, v - 1, (nn, u), generator=g)
    ll = torch.full((nn,), tt, dtype=torch.int64)
    yl = torch.full((nn,), u, dtype=torch.int64)

    def logits(extra=0):
        return lambda: x0[..., :v + extra].clone().requires_grad_()

    return {
        "F.ctc_loss": (lp, lambda z: F.ctc_loss(z, tg, il, tl)),
        "ctc_loss": (lp, lambda z: dt.ctc_loss(z, tg, il, tl, impl="device")),
        "ctc_loss sum": (lp, lambda z: dt.ctc_loss(z, tg, il, tl, reduction="sum",
                                                    impl="device")),
        "ctc_loss none": (lp, lambda z: dt.ctc_loss(z, tg, il, tl, reduction="none",
                                                     impl="device").sum()),
        "rnnt_loss": (logits(), lambda z: dt.rnnt_loss(z, y, ll, yl, blank=0,
                                                       impl="device")),
        "tdt_loss": (logits(2), lambda z: dt.tdt_loss(z, y, ll, yl, 0, [0, 1],
                                                      impl="device")),
        "multiblank_rnnt_loss": (logits(1), lambda z: dt.multiblank_rnnt_loss(
            z, y, ll, yl, v, [2], impl="device")),
    }


def run(rounds: int = 200) -> List[dict]:
    """One row per step: ``{"loss", "ops", "us", "by_op"}``."""
    rows = []
    for name, (make, loss) in steps().items():
        try:
            ops = count_step(make, loss)
            us = _time_step(make, loss, rounds)
        except Exception as e:  # noqa: BLE001 (a loss under repair: reported, not fatal)
            rows.append({"loss": name, "ops": None, "us": None, "error": repr(e)[:300]})
            continue
        rows.append({"loss": name, "ops": len(ops), "us": us,
                     "by_op": dict(collections.Counter(ops).most_common())})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line of rows")
    p.add_argument("--rounds", type=int, default=200, help="timed steps per loss")
    p.add_argument("--verbose", action="store_true", help="the ops of each step")
    args = p.parse_args(argv)
    stub_kernels()
    rows = run(args.rounds)
    if args.json:
        print(json.dumps(rows))
        return 0
    t, n, c, s = CTC_SHAPE
    print(f"host work per step (forward + backward, kernels stubbed); CTC (T,N,C,S)="
          f"{CTC_SHAPE}, transducers (N,T,U,V)={TRANSDUCER_SHAPE}, float32")
    print("(F.ctc_loss's us include its own CPU kernels, which no stub removes)")
    print(f"{'loss':24s} {'aten ops':>8s} {'host us':>9s}")
    for r in rows:
        if r["ops"] is None:
            print(f"{r['loss']:24s} {'error':>8s}  {r['error']}")
            continue
        print(f"{r['loss']:24s} {r['ops']:8d} {r['us']:9.1f}")
        if args.verbose:
            print("    " + ", ".join(f"{k} {v}" for k, v in r["by_op"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
