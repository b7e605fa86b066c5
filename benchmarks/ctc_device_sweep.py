"""The CTC device kernel's knobs on a GPU: full-step time per launch configuration (CUDA only).

`sweep` times a float32 step (logits -> ``log_softmax`` -> ``ctc_loss(impl="device")``
-> backward; CUDA events, median of ``reps`` after 3 warm-up steps, and the wall time of
the same steps) at each size for each configuration of
`duoloss.torch._triton._ops.ctc_config`, beside ``F.ctc_loss`` (native, cuDNN off) and
the unpatched launcher (``head``).  Configurations (``CONFIGS``):

* ``scratch ptV``: rows shifted through the alpha table, one barrier per frame,
  ``num_warps = warps(BLOCK, V)``;
* ``gather w1``: rows shifted in registers with ``tl.gather`` in one warp (shuffles,
  no barrier), at every ``BLOCK`` up to 256 (beyond: the head's choice);
* ``gather ptV``: ``tl.gather`` across ``warps(BLOCK, V)`` warps (shared memory);
* ``zero``/``fill``: the head's shifts with the gradient's zeros written by the kernel
  (``zero``) or by one ``zeros`` fill before the launch (``fill``) at every ``C``.

Each new configuration compiles a kernel variant (a few seconds the first time).  Prints
one JSON object ``{"sweep": {size: {config: {"ms", "wall_ms"}}}, "half": check_half()}``
(``head bf16``: the head on bfloat16 logits; `check_half`: bfloat16/float16 errors against
the float64 host path); ``quick=True`` (``--quick``) times only ``head``, ``scratch pt4``,
``gather w1``, ``zero`` and ``fill``.

    python -m benchmarks.ctc_device_sweep [--quick] [--reps 20]

From another script: ``from benchmarks.ctc_device_sweep import sweep; sweep(quick=True)``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Dict, Optional, Sequence

#: (N, T, C, S): the issue's sizes
SIZES = [(8, 200, 30, 40), (32, 500, 50, 100), (16, 1000, 100, 200), (16, 500, 8000, 100)]


def _configs(ops):
    """``label -> ctc_config replacement`` (None: the launcher unpatched)."""
    head = ops.ctc_config

    def scratch(pt):
        return lambda block, n_cls, dtype: (False, head(block, n_cls, dtype)[1],
                                            ops.warps(block, pt))

    def gather(pt):
        def cfg(block, n_cls, dtype):
            if block > 256:
                return head(block, n_cls, dtype)
            return (True, head(block, n_cls, dtype)[1],
                    1 if pt is None else ops.warps(block, pt))
        return cfg

    def zero(on):
        return lambda block, n_cls, dtype: (head(block, n_cls, dtype)[0], on,
                                            head(block, n_cls, dtype)[2])

    def split(cfg):
        # the two-launch form (alpha/beta concurrent, then the gradient rows): the
        # launcher's rule with CTC_SPLIT_MIN_BLOCK forced to 0 while the config is set
        def run(block, n_cls, dtype):
            ops.CTC_SPLIT_MIN_BLOCK = 0
            return (head if cfg is None else cfg)(block, n_cls, dtype)
        return run

    return {"head": None, "split": split(None), "split scratch pt4": split(scratch(4)),
            "scratch pt1": scratch(1), "scratch pt2": scratch(2),
            "scratch pt4": scratch(4), "scratch pt8": scratch(8), "gather w1": gather(None),
            "gather pt4": gather(4), "gather pt8": gather(8), "zero": zero(True),
            "fill": zero(False)}


QUICK = ("head", "split", "scratch pt4", "gather w1", "zero", "fill")


def _time(fn, x, reps: int, warmup: int = 3) -> Dict[str, float]:
    import torch
    times, walls = [], []
    for i in range(reps + warmup):
        y = x.detach().requires_grad_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn(y).backward()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
            walls.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "wall_ms": statistics.median(walls)}


def sweep(sizes: Sequence[tuple] = SIZES, quick: bool = False, reps: int = 20,
          only: Optional[Sequence[str]] = None) -> dict:
    """``{str(size): {config: {"ms", "wall_ms"}}}`` (empty without CUDA)."""
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    from duoloss.torch._triton import _ops
    if not torch.cuda.is_available():
        return {}
    configs = _configs(_ops)
    names = list(only or (QUICK if quick else configs))
    head = _ops.ctc_config
    split_min = _ops.CTC_SPLIT_MIN_BLOCK
    out = {}
    for n, t, c, s in sizes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(t, n, c, generator=g).cuda()
        tg = torch.randint(1, c, (n, s), generator=g).cuda()
        il = torch.full((n,), t, dtype=torch.int64).cuda()
        tl = torch.full((n,), s, dtype=torch.int64).cuda()
        with torch.backends.cudnn.flags(enabled=False):
            row = {"F.ctc_loss": _time(lambda y: F.ctc_loss(y.log_softmax(-1), tg, il, tl),
                                       x, reps)}
        for name in names:
            cfg = configs[name]
            _ops.ctc_config = head if cfg is None else cfg
            try:
                row[name] = _time(lambda y: dt.ctc_loss(y.log_softmax(-1), tg, il, tl,
                                                        impl="device"), x, reps)
            except Exception as e:  # noqa: BLE001 (a variant that fails to compile: reported)
                row[name] = {"error": repr(e)[:300]}
            finally:
                _ops.ctc_config = head
                _ops.CTC_SPLIT_MIN_BLOCK = split_min
        if not only and "head" in names:
            # the head's step on bfloat16 logits (read as they are by the kernel)
            xb = x.to(torch.bfloat16)
            row["head bf16"] = _time(lambda y: dt.ctc_loss(y.log_softmax(-1), tg, il, tl,
                                                           impl="device"), xb, reps)
        out[str((n, t, c, s))] = row
    return out


def check_half(size=(8, 200, 30, 40), device: str = "cuda") -> dict:
    """Errors of the device path on bfloat16 and float16 log-probabilities against the
    float64 host path on the same rounded inputs: ``{dtype: {"loss_rel", "grad_abs",
    "ok"}}`` with the tolerances of tests/test_device_ctc_torch.py (bfloat16 2e-2,
    float16 2e-3)."""
    import torch

    import duoloss.torch as dt
    n, t, c, s = size
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t, n, c, generator=g, dtype=torch.float64).log_softmax(-1)
    tg = torch.randint(1, c, (n, s), generator=g)
    il = torch.full((n,), t, dtype=torch.int64)
    tl = torch.full((n,), s, dtype=torch.int64)
    out = {}
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        half = x.to(dtype)
        ref = half.double().requires_grad_()
        lh = dt.ctc_loss(ref, tg, il, tl, impl="host", reduction="none")
        lh.sum().backward()
        z = half.to(device).requires_grad_()
        ld = dt.ctc_loss(z, tg.to(device), il.to(device), tl.to(device), impl="device",
                         reduction="none")
        ld.sum().backward()
        loss_rel = ((ld.double().cpu() - lh.detach()).abs()
                    / lh.detach().abs().clamp(min=1)).max().item()
        grad_abs = (z.grad.double().cpu() - ref.grad).abs().max().item()
        out[str(dtype)] = {"loss_rel": loss_rel, "grad_abs": grad_abs,
                           "dtypes": [str(ld.dtype), str(z.grad.dtype)],
                           "ok": loss_rel <= tol and grad_abs <= tol}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    res = sweep(quick=args.quick, reps=args.reps)
    if not res:
        print("no CUDA device here: nothing measured")
        return 2
    print(json.dumps({"sweep": res, "half": check_half()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
