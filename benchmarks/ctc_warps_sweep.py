"""CTC device kernel: full-step time on a GPU for each ``num_warps`` rule (CUDA only).

``python -m benchmarks.ctc_warps_sweep`` times a full float32 step (logits ->
``log_softmax`` -> ``ctc_loss(impl="device")`` -> backward; CUDA events, median of 30
after 5 warm-up steps) at three sizes with the launcher's ``warps(block, per_thread)``
rule patched to 1, 2, 4 and 8 values per thread, beside ``F.ctc_loss`` (native) and the
unpatched rule, and prints one JSON object ``{size: {label: ms}}``.  The H100 run of
2026-11-27 is ``benchmarks/results/device-ctc-warps-h100-7b36cf0.json`` (discussed in
docs/devices.md, "GPU numbers").
"""
from __future__ import annotations

import json
import statistics

SIZES = [(8, 200, 30, 40), (32, 500, 50, 100), (16, 1000, 100, 200)]  # (N, T, C, S)


def _inputs(n, t, c, s, dev):
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, n, c, generator=g).to(dev)
    tg = torch.randint(1, c, (n, s), generator=g).to(dev)
    il = torch.full((n,), t, dtype=torch.long).to(dev)
    tl = torch.full((n,), s, dtype=torch.long).to(dev)
    return x, tg, il, tl


def _median_ms(fn, x, reps=30, warmup=5):
    import torch
    times = []
    for i in range(reps + warmup):
        y = x.detach().requires_grad_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(y).backward()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    from duoloss.torch._triton import _ops
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing measured")
        return 2
    out = {}
    rule = _ops.warps
    for size in SIZES:
        x, tg, il, tl = _inputs(*size, "cuda")
        row = {"native": _median_ms(lambda y: F.ctc_loss(y.log_softmax(-1), tg, il, tl), x)}
        for per_thread in (1, 2, 4, 8):
            _ops.warps = lambda block, _pt=2, p=per_thread: rule(block, p)
            try:
                row[f"pt{per_thread}"] = _median_ms(
                    lambda y: dt.ctc_loss(y.log_softmax(-1), tg, il, tl, impl="device"), x)
            finally:
                _ops.warps = rule
        row["head"] = _median_ms(
            lambda y: dt.ctc_loss(y.log_softmax(-1), tg, il, tl, impl="device"), x)
        out[str(size)] = row
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
