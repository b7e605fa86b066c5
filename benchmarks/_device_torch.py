"""The torch half of ``benchmarks/device.py``: CUDA timings of the Triton device path.

:func:`run_torch_cases` times, forward + backward in one process, duoloss's device path
(``impl='device'``) against its host path (``impl='host'``: the numba core, one round trip
through the host per call) and the peers that are importable: ``F.ctc_loss`` (native CUDA
kernel and cuDNN, where cuDNN applies) for CTC; ``torchaudio.functional.rnnt_loss``,
``warp_rnnt.rnnt_loss`` and ``k2.rnnt_loss`` for RNN-T; k2's simple + pruned pipeline
for the pruned case.  Each implementation also reports its peak device memory
(``torch.cuda.max_memory_allocated`` above what the inputs already hold).

Without CUDA it returns no rows (the caller says the CUDA part was skipped); no GPU number
is ever made up.  ``device='cpu'`` (with ``TRITON_INTERPRET=1``) runs the same code on
CPU tensors at the sizes given, which is only a smoke test of this script.

Sizes: CTC ``(B, T, C, L)``, RNN-T ``(N, T, U, V)``; the pruned case uses ``s_range=5``.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

CTC_SIZES = [(32, 500, 50, 100), (16, 1000, 100, 200), (16, 500, 8000, 100)]
RNNT_SIZES = [(32, 150, 40, 28), (16, 500, 100, 500)]
PRUNED_SIZES = [(16, 500, 100, 500)]
S_RANGE = 5

__all__ = ["CTC_SIZES", "PRUNED_SIZES", "RNNT_SIZES", "run_torch_cases"]


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn: Callable[[], None], device, rounds: int) -> Dict[str, object]:
    """Median wall time of ``fn`` (synchronised) over ``rounds`` after one warm-up
    call, and the peak memory of one call above the memory in use before it."""
    import torch
    fn()
    _sync(device)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "rounds_ms": times, "peak_bytes": peak}


def _row(kind: str, size, impls: Dict[str, Dict[str, object]], base: str) -> dict:
    ratios = []
    if base in impls:
        for name, r in impls.items():
            if name != base:
                ratios.append({"num": name, "den": base,
                               "median": r["median_ms"] / impls[base]["median_ms"]})
    return {"size": ",".join(map(str, size)), "case": kind, "impls": impls, "ratios": ratios}


def _ctc_cases(size, device, rounds):
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    b, t, c, l = size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, b, c, generator=g).to(device).requires_grad_()
    targets = torch.randint(1, c, (b, l), generator=g)
    il = torch.full((b,), t, dtype=torch.int64)
    tl = torch.full((b,), l, dtype=torch.int64)
    tg_dev, il_dev, tl_dev = targets.to(device), il.to(device), tl.to(device)

    def step(loss_fn):
        def run():
            x.grad = None
            loss_fn(x.log_softmax(-1)).backward()
        return run

    impls = {}
    for impl in ("device", "host"):
        impls[f"duoloss.{impl}"] = _measure(step(lambda lp, impl=impl: dt.ctc_loss(
            lp, tg_dev, il_dev, tl_dev, impl=impl)), device, rounds)
    with torch.backends.cudnn.flags(enabled=False):
        impls["F.ctc_loss"] = _measure(step(lambda lp: F.ctc_loss(lp, tg_dev, il_dev, tl_dev)),
                                       device, rounds)
    if device.type == "cuda" and l <= 256:
        # cuDNN's conditions: int32 concatenated targets and lengths on the host,
        # every input length = T, blank 0, float32
        flat = targets.reshape(-1).to(torch.int32)
        il32, tl32 = il.to(torch.int32), tl.to(torch.int32)
        impls["F.ctc_loss (cudnn)"] = _measure(step(lambda lp: F.ctc_loss(lp, flat, il32, tl32)),
                                               device, rounds)
    return _row("ctc", size, impls, "F.ctc_loss")


def _optional(name):
    try:
        return __import__(name)
    except Exception:  # noqa: BLE001 (a peer that fails to import is skipped)
        return None


def _rnnt_cases(size, device, rounds):
    import torch

    import duoloss.torch as dt
    n, t, u, v = size
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, t, u + 1, v, generator=g).to(device).requires_grad_()
    y = torch.randint(0, v - 1, (n, u), generator=g).to(device)
    ll = torch.full((n,), t, dtype=torch.int32, device=device)
    yl = torch.full((n,), u, dtype=torch.int32, device=device)
    blank = v - 1

    def step(loss_fn):
        def run():
            logits.grad = None
            loss_fn().backward()
        return run

    impls = {}
    for impl in ("device", "host"):
        impls[f"duoloss.{impl}"] = _measure(step(lambda impl=impl: dt.rnnt_loss(
            logits, y, ll, yl, blank=blank, reduction="mean", impl=impl)), device, rounds)
    torchaudio = _optional("torchaudio")
    if torchaudio is not None:
        import torchaudio.functional as taf
        impls["torchaudio"] = _measure(step(lambda: taf.rnnt_loss(
            logits, y.to(torch.int32), ll, yl, blank=blank, reduction="mean")), device, rounds)
    warp_rnnt = _optional("warp_rnnt")
    if warp_rnnt is not None and device.type == "cuda":
        impls["warp_rnnt"] = _measure(step(lambda: warp_rnnt.rnnt_loss(
            logits.log_softmax(-1), y.to(torch.int32), ll, yl, reduction="mean",
            blank=blank)), device, rounds)
    k2 = _optional("k2")
    if k2 is not None:
        boundary = torch.zeros(n, 4, dtype=torch.int64, device=device)
        boundary[:, 2] = u
        boundary[:, 3] = t
        impls["k2"] = _measure(step(lambda: k2.rnnt_loss(
            logits, y.to(torch.int64), blank, boundary, reduction="mean")), device, rounds)
    return _row("rnnt", size, impls, "torchaudio" if "torchaudio" in impls else "duoloss.host")


def _pruned_cases(size, device, rounds):
    import torch

    import duoloss.torch as dt
    n, t, u, v = size
    g = torch.Generator().manual_seed(0)
    am = torch.randn(n, t, v, generator=g).to(device).requires_grad_()
    lm = torch.randn(n, u + 1, v, generator=g).to(device).requires_grad_()
    y = torch.randint(1, v, (n, u), generator=g).to(device)
    boundary = torch.zeros(n, 4, dtype=torch.int64, device=device)
    boundary[:, 2] = u
    boundary[:, 3] = t

    def pipeline(mod, **kw):
        def run():
            am.grad = lm.grad = None
            simple, (gx, gy) = mod.rnnt_loss_simple(lm, am, y, 0, boundary, reduction="sum",
                                                    return_grad=True, **kw)
            ranges = mod.get_rnnt_prune_ranges(gx, gy, boundary, S_RANGE)
            am_p, lm_p = mod.do_rnnt_pruning(am, lm, ranges)
            pruned = mod.rnnt_loss_pruned(am_p + lm_p, y, ranges, 0, boundary,
                                          reduction="sum", **kw)
            (0.5 * simple + pruned).backward()
        return run

    impls = {f"duoloss.{impl}": _measure(pipeline(dt, impl=impl), device, rounds)
             for impl in ("device", "host")}
    k2 = _optional("k2")
    if k2 is not None:
        impls["k2"] = _measure(pipeline(k2), device, rounds)
    return _row(f"rnnt_pruned(s_range={S_RANGE})", size, impls,
                "k2" if "k2" in impls else "duoloss.host")


def run_torch_cases(args=None, device: Optional[str] = None) -> List[dict]:
    """CUDA rows for ``benchmarks/device.py`` (``[]`` when CUDA is unavailable).

    ``args`` (an ``argparse.Namespace`` or None) may carry ``rounds`` (default 5),
    ``ctc_sizes``, ``rnnt_sizes`` and ``pruned_sizes`` (lists of tuples; defaults:
    the module's ``*_SIZES``).  Each row: ``{"size", "case", "impls": {name:
    {"median_ms", "rounds_ms", "peak_bytes"}}, "ratios": [{"num", "den", "median"}]}``.
    """
    import torch
    dev = torch.device(device or "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        return []
    rounds = int(getattr(args, "rounds", None) or 5)
    rows = []
    for size in getattr(args, "ctc_sizes", None) or CTC_SIZES:
        rows.append(_ctc_cases(size, dev, rounds))
    for size in getattr(args, "rnnt_sizes", None) or RNNT_SIZES:
        rows.append(_rnnt_cases(size, dev, rounds))
    for size in getattr(args, "pruned_sizes", None) or PRUNED_SIZES:
        rows.append(_pruned_cases(size, dev, rounds))
    return rows


if __name__ == "__main__":
    import json
    rows = run_torch_cases()
    print(json.dumps(rows, indent=1) if rows else "no CUDA device: nothing measured")
