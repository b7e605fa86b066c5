"""``python -m benchmarks.device --check``: the one-shot GPU check of the device paths.

One script for the first session on a GPU (issue 27 point 6), under 8 minutes on one
card, nothing to install beyond the pinned packages (a peer that is not importable is
skipped with a message).  In order:

1. **validation**: every device function (torch: ``ctc_loss``, ``ctc_align``,
   ``rnnt_loss``, ``rnnt_align``, ``rnnt_loss_simple`` regular and modified,
   ``rnnt_loss_smoothed``, ``rnnt_loss_pruned``, ``tdt_loss``, ``multiblank_rnnt_loss``;
   JAX: ``ctc_loss``, ``optax_ctc_loss``, ``rnnt_loss``, ``rnnt_loss_simple``,
   ``tdt_loss``, ``multiblank_rnnt_loss``, ``ctc_align``) with ``impl='device'`` on the
   GPU against ``impl='host'`` (the numba core) on the same inputs: losses and gradients
   (for a random cotangent), float32 and float64, at sizes that reach the multi-warp
   kernel variants (CTC ``BLOCK = 2048``, RNN-T ``BLOCK = 512``);
2. **host syncs**: each torch device loss, forward and backward, under
   ``torch.cuda.set_sync_debug_mode("error")`` with its integer arguments on the host
   (the validation copy done), and the number of synchronisations with them on the GPU;
3. **CUDA graphs**: each torch device loss captured (forward + backward) in a
   ``torch.cuda.CUDAGraph`` and replayed on new logits, against eager;
4. **memory**: extra peak memory (``torch.cuda.max_memory_allocated``) of forward +
   backward beyond the logits and their gradient, in units of the logits' size;
5. **speed**: full steps (logits -> log_softmax -> loss -> backward), median ms and peak
   MiB: CTC against ``F.ctc_loss`` (native, and cuDNN where it applies); RNN-T against
   warprnnt-numba's CUDA kernel (skipped if not importable) and a materialised-joiner
   baseline (``log_softmax`` of the whole ``(N, T, U+1, V)`` joiner output, gathers and
   the anti-diagonal recursion in torch ops, differentiated by autograd); JAX CTC against
   ``optax.ctc_loss`` (``jit(value_and_grad)``).

Everything is printed as it runs, then one table.  ``--dry`` runs the same steps on CPU
at tiny sizes (the torch kernels in Triton's interpreter, JAX on its CPU backend; no
sync, graph or GPU-memory step), in well under a minute: a test of this script, not a
measurement.  No GPU figure is ever printed that was not measured.

    python -m benchmarks.device --check            # on a GPU machine (PYTHONPATH=.)
    python -m benchmarks.device --check --dry      # anywhere
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from typing import Dict, List, Optional

ROWS: List[dict] = []
T0 = time.perf_counter()
#: ``--json``: the file the rows are rewritten to after every row (a run killed at its
#: time limit keeps what it measured), and the header written with them
JSON_OUT: Dict[str, object] = {"path": "", "head": {}}


def _say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def _row(section: str, case: str, status: str, detail: str = "", ms: Optional[float] = None,
         peak: Optional[float] = None) -> None:
    ROWS.append({"section": section, "case": case, "status": status, "detail": detail,
                 "ms": ms, "peak_mib": peak})
    extra = "" if ms is None else f" {ms:.3f} ms"
    extra += "" if peak is None else f" peak {peak:.1f} MiB"
    _say(f"{section:<10} {case:<44} {status:<5}{extra} {detail}")
    _dump()


def _dump() -> None:
    if JSON_OUT["path"]:
        with open(str(JSON_OUT["path"]), "w") as f:
            json.dump(dict(JSON_OUT["head"], rows=ROWS), f, indent=1)


def _commit() -> str:
    """The checkout's commit (and ``+dirty`` with uncommitted changes), or ``""``."""
    import subprocess
    if os.environ.get("DUOLOSS_COMMIT"):  # (a copy of the tree without .git)
        return os.environ["DUOLOSS_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 (no git there)
        return ""


def _short(e: BaseException) -> str:
    """The exception and the innermost duoloss frame (where a sync happened)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "duoloss" in f.filename]
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}{where}"


# ------------------------------------------------------------------ comparison
def _err(a, b):
    """Max abs difference relative to max(|b|, 1) over finite entries, or a string
    when the NaN/inf positions differ."""
    import torch
    a = torch.as_tensor(a).detach().double().cpu()
    b = torch.as_tensor(b).detach().double().cpu()
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return "NaN positions differ"
    if not torch.equal(torch.isinf(a), torch.isinf(b)) or not torch.equal(
            a[torch.isinf(a)], b[torch.isinf(b)]):
        return "inf positions differ"
    fin = torch.isfinite(b)
    if not fin.any():
        return 0.0
    scale = max(b[fin].abs().max().item(), 1.0)
    return (a[fin] - b[fin]).abs().max().item() / scale


TOL = {"float32": 2e-4, "float64": 1e-9}


def _tol(case: str, dtype_name: str) -> float:
    """float64: 1e-9.  float32: the device path computes in float32 (the host in
    float64), so the error grows with the recursion's length: ``5e-6 (T + U)``,
    at least 2e-4 (``T``, ``U`` read from the case's size)."""
    if dtype_name == "float64":
        return TOL["float64"]
    import re
    m = re.search(r"\((\d+), (\d+), (\d+), (\d+)\)", case)
    steps = int(m.group(2)) + int(m.group(3 if "ctc" not in case else 4)) if m else 0
    return max(TOL["float32"], 5e-6 * steps)


def _judge(section, case, dtype_name, errs: Dict[str, object]):
    tol = _tol(case, dtype_name)
    bad = [f"{k}: {v}" for k, v in errs.items() if isinstance(v, str) or v > tol]
    detail = " ".join(f"{k} {v:.1e}" if not isinstance(v, str) else f"{k} {v}"
                      for k, v in errs.items())
    _row(section, f"{case} {dtype_name}", "FAIL" if bad else "ok", detail)


# ------------------------------------------------------------------ torch inputs
class Sizes:
    def __init__(self, dry: bool):
        self.dry = dry
        # (N, T, C, S) CTC; (N, T, U, V) transducers; big ones reach multi-warp variants
        self.ctc = [(3, 12, 6, 4)] if dry else [(8, 150, 30, 40), (2, 1300, 60, 600)]
        self.rnnt = [(2, 6, 3, 5)] if dry else [(4, 50, 16, 20), (2, 24, 300, 8)]
        self.k2 = (2, 6, 3, 5) if dry else (4, 60, 20, 12)
        self.tdt = (2, 6, 3, 5) if dry else (3, 40, 12, 10)
        # the issues' sizes (33: CTC and transducers against their peers; 34: JAX)
        self.speed_ctc = [(2, 20, 8, 5)] if dry else [
            (8, 200, 30, 40), (32, 500, 50, 100), (16, 1000, 100, 200), (16, 500, 8000, 100)]
        self.speed_rnnt = [(2, 8, 3, 6)] if dry else [
            (32, 150, 40, 28), (16, 300, 60, 256), (16, 500, 100, 500)]
        self.speed_jax_ctc = [(2, 20, 8, 5)] if dry else [(32, 500, 50, 100),
                                                          (16, 1000, 100, 200)]
        self.speed_jax_rnnt = [(2, 8, 3, 6)] if dry else [(32, 150, 40, 28), (16, 300, 60, 256)]
        self.rounds = 1 if dry else 25


def _gen(seed):
    import torch
    return torch.Generator().manual_seed(seed)


def _ctc_inputs(size, dtype, dev, seed=0):
    import torch
    n, t, c, s = size
    g = _gen(seed)
    x = torch.randn(t, n, c, generator=g, dtype=torch.float64)
    tg = torch.randint(1, c, (n, s), generator=g)
    il = torch.randint(max(2 * s + 1, t // 2), t + 1, (n,), generator=g).clamp(max=t)
    il[0] = t
    tl = torch.randint(max(s // 2, 0), s + 1, (n,), generator=g)
    tl[0] = s
    return x.log_softmax(-1).to(dtype).to(dev), tg, il, tl


def _rnnt_inputs(size, dtype, dev, seed=0, extra=0):
    import torch
    n, t, u, v = size
    g = _gen(seed)
    x = torch.randn(n, t, u + 1, v + extra, generator=g, dtype=torch.float64).to(dtype).to(dev)
    tg = torch.randint(1, v, (n, u), generator=g)
    il = torch.full((n,), t, dtype=torch.int64)
    il[1:] = torch.randint(max(t // 2, 1), t + 1, (n - 1,), generator=g)
    tl = torch.full((n,), u, dtype=torch.int64)
    tl[1:] = torch.randint(0, u + 1, (n - 1,), generator=g)
    return x, tg, il, tl


def _both(fn, floats, dev, n_out=1):
    """``fn(impl, *floats)`` -> per-sequence losses; losses and gradients for a random
    cotangent, device and host."""
    import torch
    out = {}
    for impl in ("device", "host"):
        xs = [f.detach().clone().requires_grad_() for f in floats]
        loss = fn(impl, *xs)
        cot = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=loss.device)
        (loss.reshape(-1) * cot).sum().backward()
        out[impl] = (loss.detach(), [x.grad for x in xs])
    errs = {"loss": _err(out["device"][0], out["host"][0])}
    for i, (gd, gh) in enumerate(zip(out["device"][1], out["host"][1])):
        errs[f"grad{i}" if len(floats) > 1 else "grad"] = _err(gd, gh)
    return errs


def ctc_split(thunk, split: bool = True):
    """``thunk()`` with the torch CTC launcher's two-launch form forced (``split``)
    or its one fused program per sequence forced (``split=False``), whatever the
    block (`duoloss.torch._triton._ops.CTC_SPLIT_MIN_BLOCK`)."""
    from duoloss.torch._triton import _ops
    old = _ops.CTC_SPLIT_MIN_BLOCK
    _ops.CTC_SPLIT_MIN_BLOCK = 0 if split else 1 << 30
    try:
        return thunk()
    finally:
        _ops.CTC_SPLIT_MIN_BLOCK = old


def torch_cases(sz: Sizes, dev):
    """``[(name, dtype_name, thunk -> errs)]`` of the torch validation."""
    import torch

    import duoloss.torch as dt
    cases = []
    for dtype in (torch.float32, torch.float64):
        dn = str(dtype).split(".")[1]
        for size in sz.ctc:
            lp, tg, il, tl = _ctc_inputs(size, dtype, dev)
            tgd, ild, tld = tg.to(dev), il.to(dev), tl.to(dev)
            cases.append((f"torch ctc_loss {size}", dn, lambda lp=lp, a=(tgd, ild, tld), d=dev:
                          _both(lambda impl, x: dt.ctc_loss(x, *a, reduction="none",
                                                           impl=impl), [lp], d)))
            # both forms whatever the size: the two-launch form (alpha/beta
            # concurrent, then the gradient rows) and the fused program per sequence
            for split in (True, False):
                cases.append((f"torch ctc_loss {'split' if split else 'fused'} {size}", dn,
                              lambda lp=lp, a=(tgd, ild, tld), d=dev, sp=split: ctc_split(
                                  lambda: _both(lambda impl, x: dt.ctc_loss(
                                      x, *a, reduction="none", impl=impl), [lp], d), sp)))

            def align(lp=lp, a=(tgd, ild, tld)):
                outs = [dt.ctc_align(lp, *a, impl=impl) for impl in ("device", "host")]
                return {"path": _err(outs[0][0], outs[1][0]),
                        "score": _err(outs[0][1], outs[1][1])}
            cases.append((f"torch ctc_align {size}", dn, align))
        for size in sz.rnnt:
            x, tg, il, tl = _rnnt_inputs(size, dtype, dev)
            a = (tg.to(dev), il.to(dev), tl.to(dev))
            cases.append((f"torch rnnt_loss {size}", dn, lambda x=x, a=a, d=dev: _both(
                lambda impl, z: dt.rnnt_loss(z, *a, blank=0, reduction="none", impl=impl),
                [x], d)))

            def ralign(x=x, a=a):
                outs = [dt.rnnt_align(x, *a, blank=0, impl=impl) for impl in ("device", "host")]
                return {f"out{i}": _err(p, q) for i, (p, q) in enumerate(zip(*outs))}
            cases.append((f"torch rnnt_align {size}", dn, ralign))
        n, t, u, v = sz.k2
        g = _gen(3)
        lm = torch.randn(n, u + 1, v, generator=g, dtype=torch.float64).to(dtype).to(dev)
        am = torch.randn(n, t, v, generator=g, dtype=torch.float64).to(dtype).to(dev)
        sym = torch.randint(1, v, (n, u), generator=g).to(dev)
        bd = torch.tensor([[0, 0, u, t]] + [[0, 0, max(u - 1 - i % u, 0), t - 1 - i]
                                            for i in range(n - 1)]).to(dev)
        for rt in ("regular", "modified"):
            cases.append((f"torch rnnt_loss_simple {rt} {sz.k2}", dn,
                          lambda rt=rt, lm=lm, am=am: _both(
                              lambda impl, a, b: dt.rnnt_loss_simple(
                                  a, b, sym, 0, bd, rt, reduction="none", impl=impl),
                              [lm, am], dev)))
        cases.append((f"torch rnnt_loss_smoothed {sz.k2}", dn, lambda lm=lm, am=am: _both(
            lambda impl, a, b: dt.rnnt_loss_smoothed(a, b, sym, 0, 0.1, 0.2, bd,
                                                     reduction="none", impl=impl),
            [lm, am], dev)))

        def pruned(lm=lm, am=am):
            _, (gx, gy) = dt.rnnt_loss_simple(lm, am, sym, 0, bd, reduction="sum",
                                              return_grad=True, impl="host")
            ranges = dt.get_rnnt_prune_ranges(gx, gy, bd, 3)
            am_p, lm_p = dt.do_rnnt_pruning(am, lm, ranges)
            logits = (am_p + lm_p).detach()
            return _both(lambda impl, z: dt.rnnt_loss_pruned(z, sym, ranges, 0, bd,
                                                             reduction="none", impl=impl),
                         [logits], dev)
        cases.append((f"torch rnnt_loss_pruned {sz.k2}", dn, pruned))
        durs = (0, 1, 2, 3, 4)
        x, tg, il, tl = _rnnt_inputs(sz.tdt, dtype, dev, seed=5, extra=len(durs))
        a = (tg.to(dev), il.to(dev), tl.to(dev))
        cases.append((f"torch tdt_loss {sz.tdt} d={durs}", dn, lambda x=x, a=a: _both(
            lambda impl, z: dt.tdt_loss(z, *a, 0, durs, reduction="none", impl=impl),
            [x], dev)))
        x, tg, il, tl = _rnnt_inputs(sz.tdt, dtype, dev, seed=6)
        v = sz.tdt[3]
        tg = tg.clamp(max=v - 4)  # big blanks at v-2, v-3; the blank v-1
        a = (tg.to(dev), il.to(dev), tl.to(dev))
        cases.append((f"torch multiblank_rnnt_loss {sz.tdt}", dn, lambda x=x, a=a: _both(
            lambda impl, z: dt.multiblank_rnnt_loss(z, *a, v - 1, (2, 4), reduction="none",
                                                    impl=impl), [x], dev)))
    return cases


def jax_cases(sz: Sizes):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import duoloss.jax as dj

    # the Pallas kernels on the GPU (forced: 'device' takes them only once validated,
    # duoloss.jax._pallas.DEVICE_PALLAS_PLATFORMS) and the XLA scan, each against the
    # host path; the dry run's "device" is the scan (its Pallas kernels run interpreted
    # in tests/test_pallas_*.py)
    fast = "device" if sz.dry else "pallas"
    # (on CPU 'device' is the scan: the dry run checks it once)
    pairs = ((fast, ""),) if sz.dry else ((fast, ""), ("xla", "xla "))

    def both(fn, floats):
        out = {}
        for impl in [p for p, _ in pairs] + ["host"]:
            def total(*xs):
                loss = fn(impl, *xs)
                cot = jnp.linspace(0.5, 1.5, loss.size, dtype=loss.dtype)
                return (loss.reshape(-1) * cot).sum(), loss
            (_, loss), grads = jax.value_and_grad(total, argnums=tuple(range(len(floats))),
                                                  has_aux=True)(*floats)
            out[impl] = (np.asarray(loss), [np.asarray(g) for g in grads])
        errs = {}
        for impl, tag in pairs:
            errs[f"{tag}loss"] = _err(out[impl][0], out["host"][0])
            for i, (gd, gh) in enumerate(zip(out[impl][1], out["host"][1])):
                errs[f"{tag}grad{i}" if len(floats) > 1 else f"{tag}grad"] = _err(gd, gh)
        return errs

    cases = []
    for dtype in ("float32", "float64"):
        size = sz.ctc[0]
        lp, tg, il, tl = _ctc_inputs(size, __import__("torch").float64, "cpu")
        lpj = jnp.asarray(lp.numpy().astype(dtype))
        tgj, ilj, tlj = (jnp.asarray(z.numpy()) for z in (tg, il, tl))
        cases.append((f"jax ctc_loss {size}", dtype, lambda lpj=lpj: both(
            lambda impl, z: dj.ctc_loss(z, tgj, ilj, tlj, reduction="none", impl=impl),
            [lpj])))
        n, t, _c, s = size
        logits = jnp.asarray(np.transpose(lp.numpy(), (1, 0, 2)).astype(dtype))
        lpad = jnp.asarray((np.arange(t)[None] >= il.numpy()[:, None]).astype(dtype))
        bpad = jnp.asarray((np.arange(s)[None] >= tl.numpy()[:, None]).astype(dtype))
        cases.append((f"jax optax_ctc_loss {size}", dtype, lambda logits=logits, lpad=lpad,
                      bpad=bpad: both(lambda impl, z: dj.optax_ctc_loss(
                          z, lpad, tgj, bpad, impl=impl), [logits])))

        def calign(lpj=lpj):
            outs = [dj.ctc_align(lpj, tgj, ilj, tlj, impl=impl) for impl in ("device", "host")]
            return {"path": _err(np.asarray(outs[0][0]), np.asarray(outs[1][0])),
                    "score": _err(np.asarray(outs[0][1]), np.asarray(outs[1][1]))}
        cases.append((f"jax ctc_align {size}", dtype, calign))
        size = sz.rnnt[0]
        x, tg, il, tl = _rnnt_inputs(size, __import__("torch").float64, "cpu")
        xj = jnp.asarray(x.numpy().astype(dtype))
        a = tuple(jnp.asarray(z.numpy()) for z in (tg, il, tl))
        cases.append((f"jax rnnt_loss {size}", dtype, lambda xj=xj, a=a: both(
            lambda impl, z: dj.rnnt_loss(z, *a, blank=0, reduction="none", impl=impl), [xj])))
        n, t, u, v = sz.k2
        rng = np.random.default_rng(3)
        lm = jnp.asarray(rng.standard_normal((n, u + 1, v)).astype(dtype))
        am = jnp.asarray(rng.standard_normal((n, t, v)).astype(dtype))
        sym = jnp.asarray(rng.integers(1, v, (n, u)))
        cases.append((f"jax rnnt_loss_simple {sz.k2}", dtype, lambda lm=lm, am=am: both(
            lambda impl, p, q: dj.rnnt_loss_simple(p, q, sym, 0, reduction="none", impl=impl),
            [lm, am])))
        durs = (0, 1, 2, 3, 4)
        x, tg, il, tl = _rnnt_inputs(sz.tdt, __import__("torch").float64, "cpu", seed=5,
                                     extra=len(durs))
        xj = jnp.asarray(x.numpy().astype(dtype))
        a = tuple(jnp.asarray(z.numpy()) for z in (tg, il, tl))
        cases.append((f"jax tdt_loss {sz.tdt}", dtype, lambda xj=xj, a=a: both(
            lambda impl, z: dj.tdt_loss(z, *a, 0, durs, reduction="none", impl=impl), [xj])))
        x, tg, il, tl = _rnnt_inputs(sz.tdt, __import__("torch").float64, "cpu", seed=6)
        v = sz.tdt[3]
        xj = jnp.asarray(x.numpy().astype(dtype))
        a = (jnp.asarray(tg.clamp(max=v - 4).numpy()),) + tuple(
            jnp.asarray(z.numpy()) for z in (il, tl))
        cases.append((f"jax multiblank_rnnt_loss {sz.tdt}", dtype, lambda xj=xj, a=a: both(
            lambda impl, z: dj.multiblank_rnnt_loss(z, *a, v - 1, (2, 4), reduction="none",
                                                    impl=impl), [xj])))
    return cases


# --------------------------------------------------- syncs, graphs and memory
def _device_losses(sz: Sizes, dev, host_ints: bool):
    """``[(name, logits tensor, fn(logits) -> scalar loss)]``, float32, one per torch
    device loss; integer arguments on the host (``host_ints``) or on ``dev``."""
    import torch

    import duoloss.torch as dt
    idev = "cpu" if host_ints else dev
    out = []
    lp, tg, il, tl = _ctc_inputs(sz.ctc[0], torch.float32, dev)
    a = tuple(z.to(idev) for z in (tg, il, tl))
    out.append(("ctc_loss", lp, lambda z, a=a: dt.ctc_loss(z.log_softmax(-1), *a,
                                                           impl="device")))
    x, tg, il, tl = _rnnt_inputs(sz.rnnt[0], torch.float32, dev)
    a = tuple(z.to(idev) for z in (tg, il, tl))
    out.append(("rnnt_loss", x, lambda z, a=a: dt.rnnt_loss(z, *a, blank=0, impl="device")))
    n, t, u, v = sz.k2
    g = _gen(3)
    am = torch.randn(n, t, v, generator=g).to(dev)
    lm = torch.randn(n, u + 1, v, generator=g).to(dev)
    # (k2's functions take symbols and boundary on the lattice's device, as k2 does)
    sym = torch.randint(1, v, (n, u), generator=g).to(dev)
    bd = torch.tensor([[0, 0, u, t]] * n).to(dev)
    out.append(("rnnt_loss_simple", am, lambda z, lm=lm, sym=sym, bd=bd: dt.rnnt_loss_simple(
        lm, z, sym, 0, bd, impl="device")))
    durs = (0, 1, 2, 4)
    x, tg, il, tl = _rnnt_inputs(sz.tdt, torch.float32, dev, seed=5, extra=len(durs))
    a = tuple(z.to(idev) for z in (tg, il, tl))
    out.append(("tdt_loss", x, lambda z, a=a: dt.tdt_loss(z, *a, 0, durs, impl="device")))
    x, tg, il, tl = _rnnt_inputs(sz.tdt, torch.float32, dev, seed=6)
    vv = sz.tdt[3]
    a = (tg.clamp(max=vv - 4).to(idev), il.to(idev), tl.to(idev))
    out.append(("multiblank_rnnt_loss", x, lambda z, a=a: dt.multiblank_rnnt_loss(
        z, *a, vv - 1, (2, 4), impl="device")))
    return out


class _SyncLog:
    """Under ``set_sync_debug_mode("warn")``: each synchronisation's innermost duoloss
    frame (the warning is raised while the Python stack is still that of the call)."""

    def __enter__(self):
        import torch
        self.where: List[str] = []
        self._old = warnings.showwarning
        warnings.simplefilter("always")

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                frames = [f for f in traceback.extract_stack() if "duoloss" in f.filename
                          and "benchmarks" not in f.filename]
                self.where.append(f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"
                                  if frames else "(outside duoloss)")
        warnings.showwarning = show
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        import torch
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = self._old
        return False

    def summary(self) -> str:
        if not self.where:
            return "none"
        counts: Dict[str, int] = {}
        for w in self.where:
            counts[w] = counts.get(w, 0) + 1
        # (the place is the innermost duoloss frame when torch reported the warning:
        # exact for host-to-device copies, sometimes a later line for device-to-host)
        return f"{len(self.where)} (" + ", ".join(
            f"{k} x{v}" if v > 1 else k for k, v in counts.items()) + ")"


def check_syncs(sz, dev):
    """Forward: the synchronisations of an eager call (the validation copy of GPU
    integer arguments, as ``F.ctc_loss``'s; with host integers, their copies to the
    GPU), listed by place; backward: none allowed (``set_sync_debug_mode("error")``)."""
    import torch
    for host_ints in (False, True):
        for name, x, fn in _device_losses(sz, dev, host_ints=host_ints):
            label = name + (" (host ints)" if host_ints else " (GPU ints)")
            try:
                x = x.detach().requires_grad_()
                fn(x).backward()  # first-call work (compiles)
                x.grad = None
                with warnings.catch_warnings():
                    with _SyncLog() as log:
                        loss = fn(x)
                fwd = log.summary()
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    loss.backward()
                    bwd = None
                except Exception as e:  # noqa: BLE001
                    bwd = _short(e)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                _row("sync", label, "ok" if bwd is None else "FAIL",
                     f"forward syncs: {fwd}; backward: {'none' if bwd is None else bwd}")
            except Exception as e:  # noqa: BLE001
                torch.cuda.set_sync_debug_mode(0)
                _row("sync", label, "FAIL", _short(e))


def capture_step(fn, x):
    """``(graph, loss)``: one step, ``fn(x).backward()``, captured in a
    ``torch.cuda.CUDAGraph`` after two warm-up steps on a side stream (``x.grad``
    holds the captured gradient; ``graph.replay()`` recomputes both)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            x.grad = None
            fn(x).backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        loss = fn(x)
        loss.backward()
    return graph, loss


def check_graphs(sz, dev):
    import torch
    for host_ints in (False, True):
        for name, x0, fn in _device_losses(sz, dev, host_ints=host_ints):
            label = name + (" (host ints)" if host_ints else " (GPU ints)")
            try:
                x = x0.detach().clone().requires_grad_()
                graph, loss = capture_step(fn, x)
                new = x0 + 0.1 * torch.randn_like(x0)
                with torch.no_grad():
                    x.copy_(new)
                graph.replay()
                torch.cuda.synchronize()
                y = new.detach().clone().requires_grad_()
                ref = fn(y)
                ref.backward()
                errs = {"loss": _err(loss, ref), "grad": _err(x.grad, y.grad)}
                bad = [k for k, v in errs.items() if isinstance(v, str) or v > 1e-5]
                _row("graph", label, "FAIL" if bad else "ok",
                     " ".join(f"{k} {v}" for k, v in errs.items()))
            except Exception as e:  # noqa: BLE001
                _row("graph", label, "FAIL", _short(e))
                torch.cuda.synchronize()


def check_memory(dev, dry):
    """Extra peak memory of forward + backward beyond the logits and their gradient."""
    import torch

    import duoloss.torch as dt
    if dry:
        _row("memory", "(GPU only)", "skip", "torch.cuda.max_memory_allocated needs a GPU; "
             "python -m benchmarks.device_memory measures peak RSS on CPU")
        return
    cases = []
    n, t, u, v = 16, 200, 60, 512
    x, tg, il, tl = _rnnt_inputs((n, t, u, v), torch.float32, dev)
    a = tuple(z.to(dev) for z in (tg, il, tl))
    cases.append(("rnnt_loss (16,200,60,512)", x,
                  lambda z: dt.rnnt_loss(z, *a, blank=0, impl="device")))
    durs = (0, 1, 2, 3, 4)
    xd, tg, il, tl = _rnnt_inputs((n, t, u, v), torch.float32, dev, extra=len(durs))
    ad = tuple(z.to(dev) for z in (tg, il, tl))
    cases.append(("tdt_loss (16,200,60,512+5)", xd,
                  lambda z: dt.tdt_loss(z, *ad, 0, durs, impl="device")))
    cases.append(("multiblank_rnnt_loss (16,200,60,512)", x,
                  lambda z: dt.multiblank_rnnt_loss(z, a[0].clamp(max=v - 4), a[1], a[2],
                                                    v - 1, (2, 4), impl="device")))
    g = _gen(9)
    r = 5
    xp = torch.randn(n, t, r, v, generator=g).to(dev)
    symp = torch.randint(1, v, (n, u), generator=g).to(dev)
    start = torch.clamp(torch.arange(t) * u // t, max=u - r + 1)
    rng = (start[:, None] + torch.arange(r)[None, :]).expand(n, t, r).contiguous().to(dev)
    bdp = torch.tensor([[0, 0, u, t]] * n).to(dev)
    cases.append(("rnnt_loss_pruned (16,200,60,512) s_range=5", xp,
                  lambda z: dt.rnnt_loss_pruned(z, symp, rng, 0, bdp, impl="device")))
    lp, tg, il, tl = _ctc_inputs((32, 500, 1000, 100), torch.float32, dev)
    ac = tuple(z.to(dev) for z in (tg, il, tl))
    cases.append(("ctc_loss (32,500,1000,100)", lp,
                  lambda z: dt.ctc_loss(z, *ac, impl="device")))
    for name, x0, fn in cases:
        try:
            x = x0.detach().clone().requires_grad_()
            fn(x).backward()
            x.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(x).backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            size = x.numel() * x.element_size()
            extra = peak - size  # beyond the gradient (allocated during the call)
            _row("memory", name, "ok" if extra <= size else "FAIL",
                 f"extra {extra / size:.2f}x logits ({extra / 2**20:.0f} MiB; logits "
                 f"{size / 2**20:.0f} MiB)", peak=peak / 2**20)
        except Exception as e:  # noqa: BLE001
            _row("memory", name, "FAIL", _short(e))


# ------------------------------------------------------------------ timing
def _time(fn, dev, rounds):
    import torch
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    fn()
    peak = None
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), peak


def _timed(case, name, fn, dev, rounds):
    try:
        ms, peak = _time(fn, dev, rounds)
        _row("speed", f"{case} {name}", "ok", "", ms=ms, peak=peak)
    except Exception as e:  # noqa: BLE001
        _row("speed", f"{case} {name}", "skip", _short(e))


def materialised_rnnt(logits, targets, il, tl, blank):
    """The materialised-joiner baseline: ``log_softmax`` over the whole ``(N, T, U+1,
    V)`` joiner output, the blank and label columns gathered, then the forward
    variables over the anti-diagonals ``t + u`` in torch ops, each level one vector
    of ``U + 1`` states (autograd differentiates it all)."""
    import torch
    n, t, u1, _v = logits.shape
    dev = logits.device
    lp = logits.log_softmax(-1)
    blank_lp = lp[..., blank].transpose(1, 2)                            # (N, U+1, T)
    idx = targets.to(torch.int64).clamp(min=0)[:, None, :, None].expand(n, t, u1 - 1, 1)
    emit_lp = lp[:, :, :-1].gather(-1, idx)[..., 0].transpose(1, 2)      # (N, U, T)
    m = t + u1 - 1                                                       # levels
    uu = torch.arange(u1, device=dev)[:, None]
    tt = torch.arange(m, device=dev)[None, :] - uu                       # t = level - u
    ok = (tt >= 0) & (tt < t)
    tix = tt.clamp(0, t - 1)
    neg = torch.tensor(float("-inf"), dtype=lp.dtype, device=dev)
    blank_sk = torch.where(ok, blank_lp.gather(2, tix.expand(n, u1, m)), neg)  # (N, U+1, M)
    emit_sk = torch.where(ok[:-1], emit_lp.gather(2, tix[:-1].expand(n, u1 - 1, m)), neg)
    alpha = torch.full((n, u1), float("-inf"), dtype=lp.dtype, device=dev)
    alpha = torch.where(torch.arange(u1, device=dev) == 0, 0.0, alpha)
    levels = [alpha]
    pad = torch.full((n, 1), float("-inf"), dtype=lp.dtype, device=dev)
    for lev in range(1, m):
        # blank from (u, t - 1): level lev - 1, lane u; label from (u - 1, t): lane u - 1
        stay = alpha + blank_sk[:, :, lev - 1]
        move = torch.cat([pad, alpha[:, :-1] + emit_sk[:, :, lev - 1]], 1)
        alpha = torch.logaddexp(stay, move)
        alpha = torch.where(ok[:, lev], alpha, neg)
        levels.append(alpha)
    table = torch.stack(levels, 1)                                       # (N, M, U+1)
    b = torch.arange(n, device=dev)
    il, tl = il.to(dev).long(), tl.to(dev).long()
    last = il - 1 + tl
    return -(table[b, last, tl] + blank_lp[b, tl, il - 1])


def speed(sz: Sizes, dev, skip_jax: bool, skip=()):
    """Full steps side by side (`benchmarks._device_speed`): torch CTC and transducers
    against their peers, the host work per step, then JAX against optax and torch."""
    from benchmarks import _device_speed as S
    rounds = sz.rounds
    torch_ms = {}
    if "torch-speed" in skip:
        S.jax_speed(sz.speed_jax_ctc, sz.speed_jax_rnnt, rounds, _row, _short, torch_ms)
        return
    S.host_work(dev, _row, _short, sz.dry)
    torch_ms = {("ctc", k): v for k, v in S.torch_ctc(sz.speed_ctc, dev, rounds, _row,
                                                       _short).items()}
    torch_ms.update({("rnnt", k): v for k, v in S.torch_transducers(
        sz.speed_rnnt, dev, rounds, _row, _short, sz.dry).items()})
    if not skip_jax:
        S.jax_speed(sz.speed_jax_ctc, sz.speed_jax_rnnt, rounds, _row, _short, torch_ms)


# ------------------------------------------------------------------ main
def _table() -> str:
    head = f"{'section':<8} {'case':<52} {'result':<6} {'ms':>9} {'peak MiB':>9}  detail"
    lines = [head, "-" * len(head)]
    for r in ROWS:
        ms = "" if r["ms"] is None else f"{r['ms']:.3f}"
        pk = "" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        lines.append(f"{r['section']:<8} {r['case'][:52]:<52} {r['status']:<6} {ms:>9} "
                     f"{pk:>9}  {r['detail'][:110]}")
    return "\n".join(lines)


def device_for(dry: bool):
    """The device a GPU script runs on: CUDA, or with ``dry`` the CPU under Triton's
    interpreter (set here, before the kernels are imported); None (and a message)
    when there is no CUDA device and no ``dry``."""
    if dry:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing measured (use --dry to test the script on CPU)")
        return None
    return torch.device("cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device --check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="(this check)")
    p.add_argument("--dry", action="store_true",
                   help="CPU, tiny sizes, Triton interpreter: a test of the script")
    p.add_argument("--skip", action="append", default=[],
                   choices=("validate", "torch", "jax", "sync", "graph", "memory", "speed",
                            "torch-speed"),
                   help="leave out a step (repeatable); 'validate' leaves out the device "
                        "against host comparisons, 'torch'/'jax' a whole framework")
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    dev = device_for(args.dry)
    if dev is None:
        return 2
    import torch
    cuda = dev.type == "cuda"
    sz = Sizes(args.dry)
    import triton
    info = [f"torch {torch.__version__}", f"triton {triton.__version__}"]
    if cuda:
        info.append(torch.cuda.get_device_name(dev))
    if args.json:
        JSON_OUT.update(path=args.json, head={"info": info, "dry": args.dry,
                                              "commit": _commit()})
    _say("device check: " + ", ".join(info) + (" (DRY RUN: CPU, interpreter, tiny sizes)"
                                               if args.dry else ""))
    warnings.filterwarnings("ignore", message=".*non-writable.*")
    skip = set(args.skip)
    jax_ok = "jax" not in skip
    if jax_ok:
        try:
            import jax
            jax.config.update("jax_enable_x64", True)
            _say(f"jax {jax.__version__} backend {jax.default_backend()} "
                 f"({jax.devices()[0].device_kind})")
        except Exception as e:  # noqa: BLE001
            _row("jax", "import", "skip", f"jax not importable: {e}")
            jax_ok = False
    groups = []
    if "validate" in skip:
        pass
    elif "torch" not in skip:
        groups.append(("torch", lambda: torch_cases(sz, dev)))
    if jax_ok and "validate" not in skip:
        groups.append(("jax", lambda: jax_cases(sz)))
    for section, make in groups:
        try:
            cases = make()
        except Exception as e:  # noqa: BLE001
            _row(section, "inputs", "FAIL", _short(e))
            continue
        for name, dn, thunk in cases:
            try:
                _judge(section, name, dn, thunk())
            except Exception as e:  # noqa: BLE001
                _row(section, f"{name} {dn}", "FAIL", _short(e))
    if cuda:
        if "sync" not in skip:
            check_syncs(sz, dev)
        if "graph" not in skip:
            check_graphs(sz, dev)
    else:
        _row("sync", "(GPU only)", "skip", "set_sync_debug_mode and CUDA graphs need a GPU")
    if "memory" not in skip:
        check_memory(dev, args.dry)
    if "speed" not in skip:
        speed(sz, dev, not jax_ok, skip)
    print("\n" + _table())
    fails = sum(r["status"] == "FAIL" for r in ROWS)
    _say(f"done: {len(ROWS)} rows, {fails} FAIL")
    _dump()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
