"""The speed section of ``python -m benchmarks.device --check`` (issues 33 and 34).

Every case times its candidates *side by side*: after two warm-up calls each, the
candidates run interleaved, one call each per round, ``ROUNDS`` rounds, and the median
of each is reported with the peak memory of one call above what was allocated before
it.  Ratios against the named peer of each case are printed as rows of their own
(``ratio`` section), so that a table row and the target it answers sit together.

Torch (full step: logits -> ``log_softmax`` -> loss -> backward, unless a row says
otherwise):

* CTC ``(N, T, C, S)`` at the issue's four sizes: duoloss ``impl='device'`` float32 and
  bf16 logits, the launcher's other form at that size (``duoloss device (split)``: alpha
  and beta concurrent, then the gradient rows, or ``(fused)``: one program per sequence;
  ``CTC_SPLIT_MIN_BLOCK`` picks the default), ``F.ctc_loss`` native,
  ``F.ctc_loss`` under cuDNN's conditions, duoloss host (small sizes only);
* RNN-T ``(N, T, U, V)``: duoloss device (float32, bf16), torchaudio's CUDA
  ``rnnt_loss``, warprnnt-numba's CUDA kernel (carried as a wheel), the materialised
  joiner (small sizes), ``tdt_loss`` (durations 0..4) and ``multiblank_rnnt_loss``
  (big blanks 2, 4) at the same shape, and at ``V >= 500`` the pruned loss
  (``s_range = 5``) alone and k2's whole simple -> prune -> pruned recipe;
* host work: the aten ops one device step dispatches (``TorchDispatchMode``) and the
  host time of a step (the call returns without synchronising), beside ``F.ctc_loss``.

JAX (``jit(value_and_grad)``, float32): CTC with ``impl='pallas'``, ``'xla'`` and
``'device'`` against ``optax.ctc_loss``; RNN-T, TDT and multi-blank with ``'pallas'`` and
``'xla'``.  A row whose call raises is printed as ``skip`` with the reason; nothing that
did not run is given a number.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

ROUNDS = 25


def _sync(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize()


def race(fns: Dict[str, Callable[[], object]], dev, rounds: int, row, case: str,
         short) -> Dict[str, float]:
    """Time ``fns`` interleaved; one ``speed`` row each; ``{name: median ms}`` of those
    that ran."""
    import torch
    ok: Dict[str, Callable] = {}
    peaks: Dict[str, Optional[float]] = {}
    for name, fn in fns.items():
        try:
            fn()
            _sync(dev)
            peak = None
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            fn()
            _sync(dev)
            if dev.type == "cuda":
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            ok[name], peaks[name] = fn, peak
        except Exception as e:  # noqa: BLE001
            row("speed", f"{case} {name}", "skip", short(e))
    times: Dict[str, List[float]] = {k: [] for k in ok}
    for _ in range(rounds):
        for name, fn in ok.items():
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            times[name].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for name in ok:
        ms = statistics.median(times[name])
        out[name] = ms
        row("speed", f"{case} {name}", "ok", f"median of {rounds}", ms=ms, peak=peaks[name])
    return out


def ratios(case: str, ms: Dict[str, float], pairs: List[Tuple[str, str, Optional[float]]],
           row) -> None:
    """A ``ratio`` row per ``(ours, peer, target)`` that both ran: ``ours / peer``,
    ``ok`` when at or under the target (no target: ``info``)."""
    for ours, peer, target in pairs:
        if ours in ms and peer in ms and ms[peer] > 0:
            r = ms[ours] / ms[peer]
            status = "info" if target is None else ("ok" if r <= target else "MISS")
            tgt = "" if target is None else f" (target <= {target})"
            row("ratio", f"{case} {ours} / {peer}", status, f"{r:.3f}x{tgt}")


# ------------------------------------------------------------------ torch CTC
def _form(f, split):
    """``f`` run with the torch CTC launcher's two-launch form (``split``) or its fused
    kernel forced."""
    from benchmarks._device_check import ctc_split
    return lambda: ctc_split(f, split)


def torch_ctc(sizes, dev, rounds, row, short):
    """``{size: {name: ms}}``."""
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    from duoloss.torch._triton import _ops
    out = {}
    for size in sizes:
        b, t, c, s = size
        g = torch.Generator().manual_seed(0)
        x = torch.randn(t, b, c, generator=g).to(dev).requires_grad_()
        xh = x.detach().to(torch.bfloat16).requires_grad_()
        other = ("duoloss device (fused)" if _ops._block(2 * s + 1) >= _ops.CTC_SPLIT_MIN_BLOCK
                 else "duoloss device (split)")
        tg = torch.randint(1, c, (b, s), generator=g)
        il = torch.full((b,), t, dtype=torch.int64)
        il[1::2] = max(t - t // 5, 2 * s + 1)
        tl = torch.full((b,), s, dtype=torch.int64)
        tgd, ild, tld = tg.to(dev), il.to(dev), tl.to(dev)

        def step(f, z=x):
            def run():
                z.grad = None
                f(z.log_softmax(-1)).backward()
            return run
        fns = {
            "duoloss device": step(lambda lp: dt.ctc_loss(lp, tgd, ild, tld, impl="device")),
            "F.ctc_loss native": None,
            # the launcher's other form at this block (CTC_SPLIT_MIN_BLOCK)
            other: _form(step(lambda lp: dt.ctc_loss(lp, tgd, ild, tld, impl="device")),
                         other == "duoloss device (split)"),
            "duoloss device bf16": step(lambda lp: dt.ctc_loss(lp, tgd, ild, tld,
                                                               impl="device"), xh),
        }

        def native():
            with torch.backends.cudnn.flags(enabled=False):
                step(lambda lp: F.ctc_loss(lp, tgd, ild, tld))()
        fns["F.ctc_loss native"] = native
        if dev.type == "cuda" and s <= 256:
            # cuDNN's conditions: blank 0, float32, labels <= 256, int32 targets and
            # lengths (host for the classic API, GPU for the newer one); every input
            # length T for the classic API: the first form that runs is timed
            ilT = torch.full((b,), t, dtype=torch.int32)
            forms = (("host int32", (tg.reshape(-1).to(torch.int32), ilT,
                                     tl.to(torch.int32))),
                     ("GPU int32", (tg.to(torch.int32).to(dev), ilT.to(dev),
                                    tl.to(torch.int32).to(dev))))
            for what, a in forms:
                try:
                    step(lambda lp, a=a: F.ctc_loss(lp, *a))()
                except Exception:  # noqa: BLE001 (the next form)
                    continue
                fns[f"F.ctc_loss cuDNN ({what}, all T)"] = step(
                    lambda lp, a=a: F.ctc_loss(lp, *a))
                fns["duoloss device (all T)"] = step(
                    lambda lp, a=a: dt.ctc_loss(lp, *a, impl="device"))
                break
        if c <= 1000:
            fns["duoloss host"] = step(lambda lp: dt.ctc_loss(lp, tgd, ild, tld, impl="host"))
        case = f"ctc {size}"
        ms = race(fns, dev, rounds, row, case, short)
        target = 0.6 if size == (32, 500, 50, 100) else 1.0
        pairs = [("duoloss device", "F.ctc_loss native", target),
                 (other, "F.ctc_loss native", target),
                 (other, "duoloss device", None),
                 ("duoloss device bf16", "duoloss device", None)]
        cud = [k for k in ms if k.startswith("F.ctc_loss cuDNN")]
        if cud:
            pairs.append(("duoloss device (all T)", cud[0], 1.0))
        ratios(case, ms, pairs, row)
        out[size] = ms
        del x, xh
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    return out


# ------------------------------------------------------------------ torch transducers
def _warp():
    import numpy as np
    if not hasattr(np, "row_stack"):  # removed in numpy 2.5; the peer still calls it
        np.row_stack = np.vstack
    from warprnnt_numba.rnnt_loss.rnnt_pytorch import rnnt_loss
    return rnnt_loss


def torch_transducers(sizes, dev, rounds, row, short, dry):
    """``{size: {name: ms}}``."""
    import torch

    import duoloss.torch as dt
    try:
        warp = _warp()
    except Exception as e:  # noqa: BLE001
        warp = None
        row("speed", "rnnt warprnnt-numba", "skip", f"not importable ({short(e)})")
    try:
        import torchaudio.functional as TAF
        ta = TAF.rnnt_loss
    except Exception as e:  # noqa: BLE001
        ta = None
        row("speed", "rnnt torchaudio", "skip", f"not importable ({short(e)})")
    durs = (0, 1, 2, 3, 4)
    out = {}
    for size in sizes:
        n, t, u, v = size
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, t, u + 1, v, generator=g).to(dev).requires_grad_()
        xh = x.detach().to(torch.bfloat16).requires_grad_()
        xd = torch.randn(n, t, u + 1, v + len(durs), generator=g).to(dev).requires_grad_()
        y = torch.randint(1, v - 3, (n, u), generator=g).to(dev)
        ll = torch.full((n,), t, dtype=torch.int32, device=dev)
        yl = torch.full((n,), u, dtype=torch.int32, device=dev)
        ll[1::2] = max(t - t // 5, 1)
        yl[1::2] = max(u - u // 4, 0)

        def step(f, z=x):
            def run():
                z.grad = None
                f(z).sum().backward()
            return run
        fns = {"duoloss device": step(lambda z: dt.rnnt_loss(
            z, y, ll, yl, blank=0, reduction="sum", impl="device"))}
        if ta is not None and dev.type == "cuda":
            fns["torchaudio rnnt_loss"] = step(lambda z: ta(z, y.to(torch.int32), ll, yl,
                                                            blank=0, reduction="sum"))
        if warp is not None and dev.type == "cuda":
            fns["warprnnt-numba CUDA"] = step(lambda z: warp(
                z, y.to(torch.int32), ll, yl, blank=0, reduction="sum"))
        fns["duoloss device bf16"] = step(lambda z: dt.rnnt_loss(
            z, y, ll, yl, blank=0, reduction="sum", impl="device"), xh)
        if ta is not None and dev.type == "cuda":
            xf = x.detach().half().requires_grad_()
            fns["torchaudio rnnt_loss fp16"] = step(lambda z: ta(
                z, y.to(torch.int32), ll, yl, blank=0, reduction="sum"), xf)
        fns["duoloss tdt_loss"] = step(lambda z: dt.tdt_loss(
            z, y, ll, yl, 0, durs, reduction="sum", impl="device"), xd)
        fns["duoloss multiblank_rnnt_loss"] = step(lambda z: dt.multiblank_rnnt_loss(
            z, y, ll, yl, v - 1, (2, 4), reduction="sum", impl="device"))
        if n * t * (u + 1) * v <= 2e7:
            from benchmarks._device_check import materialised_rnnt
            fns["materialised joiner (torch ops)"] = step(
                lambda z: materialised_rnnt(z, y, ll, yl, 0))
        case = f"rnnt {size}"
        ms = race(fns, dev, rounds, row, case, short)
        pairs = [("duoloss device", "torchaudio rnnt_loss", 1.0),
                 ("duoloss device", "warprnnt-numba CUDA", 1.0),
                 ("duoloss device bf16", "duoloss device",
                  0.6 if size == (16, 300, 60, 256) else None),
                 ("duoloss tdt_loss", "duoloss device", 1.3),
                 ("duoloss multiblank_rnnt_loss", "duoloss device", 1.3)]
        ratios(case, ms, pairs, row)
        if size == (32, 150, 40, 28) and "duoloss device" in ms:
            st = "ok" if ms["duoloss device"] <= 0.5 else "MISS"
            row("ratio", f"{case} duoloss device ms", st,
                f"{ms['duoloss device']:.3f} ms (target <= 0.5 ms)")
        if v >= 500 or dry:
            _pruned(size, x, y, ll, yl, dev, rounds, row, short, ms)
        out[size] = ms
        del x, xh, xd
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    return out


def _pruned(size, x, y, ll, yl, dev, rounds, row, short, ms_full):
    """The pruned loss at ``s_range = 5`` (logits ``(N, T, 5, V)``) and k2's recipe
    (simple loss with gradients -> ranges -> pruning -> additive joiner -> pruned loss)
    against the full loss of the same shape."""
    import torch

    import duoloss.torch as dt
    n, t, u, v = size
    r = min(5, u + 1)  # (the dry run's tiny U)
    g = torch.Generator().manual_seed(9)
    am = torch.randn(n, t, v, generator=g).to(dev).requires_grad_()
    lm = torch.randn(n, u + 1, v, generator=g).to(dev).requires_grad_()
    bd = torch.stack([torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64),
                      yl.long().cpu(), ll.long().cpu()], 1).to(dev)
    yy = y.long()
    start = torch.clamp(torch.arange(t) * u // t, max=u - r + 1)
    rng = (start[:, None] + torch.arange(r)[None, :]).expand(n, t, r).contiguous().to(dev)
    xp = torch.randn(n, t, r, v, generator=g).to(dev).requires_grad_()

    def pruned_only():
        xp.grad = None
        dt.rnnt_loss_pruned(xp, yy, rng, 0, bd, reduction="sum", impl="device").backward()

    def recipe():
        am.grad = lm.grad = None
        simple, (gx, gy) = dt.rnnt_loss_smoothed(lm, am, yy, 0, 0.0, 0.0, bd,
                                                 reduction="sum", return_grad=True,
                                                 impl="device")
        ranges = dt.get_rnnt_prune_ranges(gx, gy, bd, r)
        am_p, lm_p = dt.do_rnnt_pruning(am, lm, ranges)
        pr = dt.rnnt_loss_pruned(am_p + lm_p, yy, ranges, 0, bd, reduction="sum",
                                 impl="device")
        (0.5 * simple + pr).backward()

    case = f"rnnt {size} s_range=5"
    ms = race({"duoloss rnnt_loss_pruned": pruned_only,
               "duoloss k2 recipe (simple+prune+pruned)": recipe}, dev, rounds, row, case,
              short)
    ms.update({f"full {k}": val for k, val in ms_full.items()})
    ratios(case, ms, [("duoloss rnnt_loss_pruned", "full duoloss device", 1.0),
                      ("duoloss k2 recipe (simple+prune+pruned)", "full duoloss device",
                       None)], row)


# ------------------------------------------------------------------ host work
def host_work(dev, row, short, dry):
    """Aten ops per device step (forward + backward) and the host time of a step (the
    call returns before the GPU finishes), beside ``F.ctc_loss``."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    import duoloss.torch as dt

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    b, t, c, s = (2, 20, 8, 5) if dry else (32, 500, 50, 100)
    x = torch.randn(t, b, c, generator=g).log_softmax(-1).to(dev).requires_grad_()
    tg = torch.randint(1, c, (b, s), generator=g).to(dev)
    il = torch.full((b,), t, device=dev)
    tl = torch.full((b,), s, device=dev)
    n, tt, u, v = (2, 8, 3, 6) if dry else (32, 150, 40, 28)
    durs = (0, 1, 2, 3, 4)
    xr = torch.randn(n, tt, u + 1, v, generator=g).to(dev).requires_grad_()
    xd = torch.randn(n, tt, u + 1, v + len(durs), generator=g).to(dev).requires_grad_()
    y = torch.randint(1, v - 3, (n, u), generator=g).to(dev)
    ll = torch.full((n,), tt, device=dev)
    yl = torch.full((n,), u, device=dev)
    cases = [
        ("F.ctc_loss", x, lambda z: F.ctc_loss(z, tg, il, tl)),
        ("ctc_loss", x, lambda z: dt.ctc_loss(z, tg, il, tl, impl="device")),
        ("rnnt_loss", xr, lambda z: dt.rnnt_loss(z, y, ll, yl, blank=0, impl="device")),
        ("tdt_loss", xd, lambda z: dt.tdt_loss(z, y, ll, yl, 0, durs, impl="device")),
        ("multiblank_rnnt_loss", xr, lambda z: dt.multiblank_rnnt_loss(
            z, y, ll, yl, v - 1, (2, 4), impl="device")),
    ]
    for name, z, fn in cases:
        try:
            z.grad = None
            fn(z).backward()
            _sync(dev)
            z.grad = None
            with Count() as cnt:
                fn(z).backward()
            _sync(dev)
            host = []
            for _ in range(20):
                z.grad = None
                _sync(dev)
                t0 = time.perf_counter()
                fn(z).backward()
                host.append((time.perf_counter() - t0) * 1e6)
            _sync(dev)
            limit = 24 if name == "ctc_loss" else (30 if name != "F.ctc_loss" else None)
            status = "info" if limit is None else ("ok" if cnt.n <= limit else "MISS")
            row("host", f"{name} step", status,
                f"{cnt.n} aten ops{'' if limit is None else f' (target <= {limit})'}; "
                f"host {statistics.median(host):.0f} us/step (median of 20, no sync)")
        except Exception as e:  # noqa: BLE001
            row("host", f"{name} step", "skip", short(e))


# ------------------------------------------------------------------ JAX
def jax_speed(ctc_sizes, rnnt_sizes, rounds, row, short, torch_ms=None):
    """JAX steps; ``torch_ms`` (``{("ctc" | "rnnt", size): {name: ms}}``) from the torch
    part of the same run gives the cross-framework ratios of issue 34."""
    torch_ms = torch_ms or {}
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax

        import duoloss.jax as dj
    except Exception as e:  # noqa: BLE001
        row("speed", "jax", "skip", f"jax/optax not importable: {e}")
        return

    def timed(fns, case):
        ok = {}
        for name, f in fns.items():
            try:
                jax.block_until_ready(f())
                jax.block_until_ready(f())
                ok[name] = f
            except Exception as e:  # noqa: BLE001
                row("speed", f"{case} {name}", "skip", short(e))
        times = {k: [] for k in ok}
        for _ in range(rounds):
            for name, f in ok.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                times[name].append((time.perf_counter() - t0) * 1e3)
        ms = {}
        for name in ok:
            ms[name] = statistics.median(times[name])
            row("speed", f"{case} {name}", "ok", f"median of {rounds}", ms=ms[name])
        return ms

    for size in ctc_sizes:
        b, t, c, s = size
        rng = np.random.default_rng(0)
        logits = jnp.asarray(rng.standard_normal((b, t, c)).astype(np.float32))
        tg = jnp.asarray(rng.integers(1, c, (b, s)))
        il_np = np.full(b, t)
        il_np[1::2] = max(t - t // 5, 2 * s + 1)   # as the torch rows
        il = jnp.asarray(il_np)
        tl = jnp.full((b,), s)
        lpad = jnp.asarray((np.arange(t)[None] >= il_np[:, None]).astype(np.float32))
        bpad = jnp.zeros((b, s), jnp.float32)

        def duo(impl):
            f = jax.jit(jax.value_and_grad(lambda z: dj.ctc_loss(
                jax.nn.log_softmax(z, -1).transpose(1, 0, 2), tg, il, tl, reduction="sum",
                impl=impl)))
            return lambda: f(logits)
        f_opt = jax.jit(jax.value_and_grad(lambda z: optax.ctc_loss(z, lpad, tg, bpad).sum()))
        fns = {"jax pallas": duo("pallas"), "jax xla": duo("xla"), "jax device": duo("device"),
               "optax.ctc_loss": lambda: f_opt(logits)}
        case = f"jax ctc {size}"
        ms = timed(fns, case)
        ms.update({f"torch {k}": val for k, val in torch_ms.get(("ctc", size), {}).items()})
        ratios(case, ms, [("jax pallas", "jax xla", None),
                          ("jax pallas", "optax.ctc_loss", None),
                          ("jax pallas", "torch F.ctc_loss native", 1.5),
                          ("jax device", "torch F.ctc_loss native", None),
                          ("jax device", "torch duoloss device", None)], row)
    for size in rnnt_sizes:
        n, t, u, v = size
        durs = (0, 1, 2, 3, 4)
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((n, t, u + 1, v)).astype(np.float32))
        xd = jnp.asarray(rng.standard_normal((n, t, u + 1, v + len(durs))).astype(np.float32))
        y = jnp.asarray(rng.integers(1, v - 3, (n, u)))
        ll_np, yl_np = np.full(n, t), np.full(n, u)
        ll_np[1::2] = max(t - t // 5, 1)           # as the torch rows
        yl_np[1::2] = max(u - u // 4, 0)
        ll, yl = jnp.asarray(ll_np), jnp.asarray(yl_np)

        def mk(fn, z):
            f = jax.jit(jax.value_and_grad(fn))
            return lambda: f(z)
        fns = {}
        for impl in ("pallas", "xla"):
            fns[f"jax rnnt {impl}"] = mk(lambda z, impl=impl: dj.rnnt_loss(
                z, y, ll, yl, blank=0, reduction="sum", impl=impl), x)
            fns[f"jax tdt {impl}"] = mk(lambda z, impl=impl: dj.tdt_loss(
                z, y, ll, yl, 0, durs, reduction="sum", impl=impl), xd)
            fns[f"jax multiblank {impl}"] = mk(lambda z, impl=impl: dj.multiblank_rnnt_loss(
                z, y, ll, yl, v - 1, (2, 4), reduction="sum", impl=impl), x)
        case = f"jax rnnt {size}"
        ms = timed(fns, case)
        ms.update({f"torch {k}": val for k, val in torch_ms.get(("rnnt", size), {}).items()})
        ratios(case, ms, [("jax rnnt pallas", "jax rnnt xla", None),
                          ("jax rnnt pallas", "torch duoloss device", 1.5),
                          ("jax tdt pallas", "jax rnnt pallas", 1.3),
                          ("jax multiblank pallas", "jax rnnt pallas", 1.3)], row)
