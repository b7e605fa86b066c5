"""Time the fused torch transducer kernels on a GPU: a full step (logits -> loss ->
backward), median of ``--reps`` after warm-up, side by side in one process.

Rows: ``rnnt_loss(impl='device')`` against torchaudio's CUDA ``rnnt_loss`` (when
importable) at ``(N, T, U, V) = (32,150,40,28), (16,300,60,256), (16,500,100,500)`` in
float32 and bfloat16 (duoloss reads bfloat16 logits as they are; torchaudio gets
float32), ``tdt_loss`` (durations 0-4) and ``multiblank_rnnt_loss`` (big blanks 2, 4, 8)
at the same shapes (their ratio to ``rnnt_loss``); the kernel knobs
(`duoloss.torch._triton._rnnt_ops._TILE`, ``_TILE_WARPS`` and ``_recursion_warps``)
swept at ``(16,300,60,256)``, whose kernels (not the host) set the step's time: the
eager step and the step's GPU time replayed as a CUDA graph; peak extra memory per
step.  Prints one JSON line per row.

    python -m benchmarks.transducer_fused_sweep            # on a GPU
    python -m benchmarks.transducer_fused_sweep --dry      # CPU interpreter smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _step_timer(fn, x, reps, cuda):
    import torch

    def once():
        x.grad = None
        fn(x).backward()

    for _ in range(3):
        once()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graph_timer(fn, x, reps):
    """Median GPU ms of one step (forward + backward) captured as a CUDA graph and
    replayed: the kernels' time without the host's dispatch and launches."""
    import torch

    from benchmarks._device_check import capture_step
    graph, _ = capture_step(fn, x)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del graph  # its memory pool goes back before the next variant's capture
    x.grad = None
    torch.cuda.empty_cache()
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry", action="store_true", help="tiny shapes on CPU (interpreter)")
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args(argv)
    if a.dry:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import duoloss.torch as dt
    from duoloss.torch._triton import _dur_ops, _rnnt_ops
    cuda = torch.cuda.is_available() and not a.dry
    dev = torch.device("cuda" if cuda else "cpu")
    shapes = [(2, 6, 3, 5)] if a.dry else [(32, 150, 40, 28), (16, 300, 60, 256),
                                          (16, 500, 100, 500)]
    reps = 2 if a.dry else a.reps
    try:
        import torchaudio.functional as taf
    except Exception:  # noqa: BLE001 (any import failure: the row is skipped)
        taf = None

    def emit(**row):
        print(json.dumps(row), flush=True)

    for (n, t, u, v) in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        base = torch.randn(n, t, u + 1, v, generator=g).to(dev)
        y = torch.randint(0, v - 4, (n, u), generator=g).to(device=dev, dtype=torch.int32)
        il = torch.full((n,), t, dtype=torch.int32, device=dev)
        tl = torch.full((n,), u, dtype=torch.int32, device=dev)
        shape = [n, t, u, v]
        rnnt_ms = {}
        for dtype in (torch.float32, torch.bfloat16):
            x = base.to(dtype).requires_grad_()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            ms = _step_timer(lambda z: dt.rnnt_loss(z, y, il, tl, impl="device"), x, reps, cuda)
            extra = ((torch.cuda.max_memory_allocated() - before) / (2 * x.numel()
                     * x.element_size()) - 1) if cuda else None
            rnnt_ms[dtype] = ms
            emit(loss="rnnt_loss", impl="duoloss", dtype=str(dtype)[6:], shape=shape,
                 ms=round(ms, 4), extra_x_logits=extra)
        if taf is not None and cuda:
            x = base.clone().requires_grad_()
            ms = _step_timer(lambda z: taf.rnnt_loss(z, y, il, tl, blank=v - 1), x, reps, cuda)
            emit(loss="rnnt_loss", impl="torchaudio", dtype="float32", shape=shape,
                 ms=round(ms, 4), duoloss_ratio=round(rnnt_ms[torch.float32] / ms, 3))
        xt = torch.randn(n, t, u + 1, v + 5, generator=g).to(dev).requires_grad_()
        ms = _step_timer(lambda z: dt.tdt_loss(z, y, il, tl, blank=v - 1,
                                               durations=[0, 1, 2, 3, 4], impl="device"),
                         xt, reps, cuda)
        emit(loss="tdt_loss", impl="duoloss", dtype="float32", shape=shape, ms=round(ms, 4),
             vs_rnnt=round(ms / rnnt_ms[torch.float32], 3))
        xm = base.clone().requires_grad_()
        ms = _step_timer(lambda z: dt.multiblank_rnnt_loss(z, y, il, tl, blank=v - 1,
                                                           big_blank_durations=[2, 4, 8],
                                                           impl="device"), xm, reps, cuda)
        emit(loss="multiblank_rnnt_loss", impl="duoloss", dtype="float32", shape=shape,
             ms=round(ms, 4), vs_rnnt=round(ms / rnnt_ms[torch.float32], 3))
        if (n, t, u, v) == shapes[min(1, len(shapes) - 1)]:
            # the knobs at a shape whose step is kernel-bound: GPU time of the step
            # replayed as a CUDA graph (no host work in it), and the eager step
            old = (_rnnt_ops._TILE, _rnnt_ops._TILE_WARPS, _rnnt_ops._recursion_warps)
            graphs_ok = True
            try:
                for tile in (512, 1024, 2048, 4096):
                    for tile_warps in (4, 8):
                        for per_warp in (64, 128):
                            _rnnt_ops._TILE, _rnnt_ops._TILE_WARPS = tile, tile_warps
                            _rnnt_ops._recursion_warps = (
                                lambda block, k=per_warp: max(1, min(16, block // k)))
                            x = base.clone().requires_grad_()
                            f = lambda z: dt.rnnt_loss(z, y, il, tl, impl="device")  # noqa: E731
                            knob = dict(tile=tile, tile_warps=tile_warps,
                                        lanes_per_warp=per_warp)
                            try:
                                ms = _step_timer(f, x, reps, cuda)
                            except Exception as e:  # noqa: BLE001 (a variant that fails)
                                emit(loss="rnnt_loss", knob=knob, shape=shape,
                                     error=f"{type(e).__name__}: {e}"[:200])
                                continue
                            gms = graph_error = None
                            if cuda and graphs_ok:
                                try:
                                    gms = _graph_timer(f, base.clone().requires_grad_(), reps)
                                except Exception as e:  # noqa: BLE001
                                    # (a failed capture leaves the stream unusable for
                                    # more captures: the later variants time eagerly)
                                    graphs_ok = False
                                    graph_error = f"{type(e).__name__}: {e}"[:160]
                            emit(loss="rnnt_loss", knob=knob, shape=shape, ms=round(ms, 4),
                                 graph_ms=None if gms is None else round(gms, 4),
                                 graph_error=graph_error)
                            if cuda:   # (an H200 ran out of memory at the 16th variant)
                                del x
                                torch.cuda.empty_cache()
            finally:
                _rnnt_ops._TILE, _rnnt_ops._TILE_WARPS, _rnnt_ops._recursion_warps = old
            # the duration transducers' cell-parallel tiles (normaliser, gradient), eager
            old = (_dur_ops._TILE, _dur_ops._GRAD_TILE)
            try:
                for tile in (256, 512, 1024):
                    for grad_tile in (128, 256, 512, 1024):
                        _dur_ops._TILE, _dur_ops._GRAD_TILE = tile, grad_tile
                        xt2 = xt.detach().clone().requires_grad_()
                        try:
                            ms = _step_timer(lambda z: dt.tdt_loss(
                                z, y, il, tl, blank=v - 1, durations=[0, 1, 2, 3, 4],
                                impl="device"), xt2, reps, cuda)
                        except Exception as e:  # noqa: BLE001 (a variant that fails)
                            emit(loss="tdt_loss", knob=dict(tile=tile, grad_tile=grad_tile),
                                 shape=shape, error=f"{type(e).__name__}: {e}"[:200])
                            continue
                        emit(loss="tdt_loss", knob=dict(tile=tile, grad_tile=grad_tile),
                             shape=shape, ms=round(ms, 4))
                        if cuda:
                            del xt2
                            torch.cuda.empty_cache()
            finally:
                _dur_ops._TILE, _dur_ops._GRAD_TILE = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
