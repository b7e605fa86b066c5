"""Where a device step's time goes: every GPU kernel of one training step, timed by
``torch.profiler`` (CUPTI), beside the step's wall time (issue 33: "for any target
missed, the profile that shows where the time goes").

For each case (the issue's sizes where a target was missed) and each candidate
(duoloss's device path and its peer), after two warm-up steps, ``STEPS`` steps run
under the profiler; per step it reports

* ``wall``: the median wall time of a synchronised step, measured outside the
  profiler (as ``benchmarks.device --check``'s speed rows);
* ``host``: the median time until the step's Python call returns (no sync): the
  host's share (dispatch, launches, validation reads);
* ``gpu``: the summed device time of its kernels and copies (from the profiler);
* each kernel's name, launches per step and µs per step, largest first.

``wall`` well above ``gpu`` means a host-bound step (launch/dispatch latency,
synchronisations); ``gpu`` near ``wall`` means the kernels themselves are the cost.

    python -m benchmarks.device_profile [--json FILE]   # on a GPU machine
    python -m benchmarks.device_profile --dry            # CPU, Triton interpreter, tiny
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

STEPS = 5
ROUNDS = 10


def _cases(dry):
    """``[(case, {candidate: step_fn})]`` built lazily (one case's tensors at a time)."""
    if dry:
        return [("ctc", (2, 20, 8, 5)), ("rnnt", (2, 8, 3, 6))]
    return [("ctc", (32, 500, 50, 100)), ("ctc", (16, 1000, 100, 200)),
            ("rnnt", (32, 150, 40, 28)), ("rnnt", (16, 300, 60, 256)),
            ("tdt", (16, 300, 60, 256))]


def _ctc_fns(size, dev):
    import torch
    import torch.nn.functional as F

    import duoloss.torch as dt
    b, t, c, s = size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, b, c, generator=g).to(dev).requires_grad_()
    tg = torch.randint(1, c, (b, s), generator=g).to(dev)
    il = torch.full((b,), t, dtype=torch.int64)
    il[1::2] = max(t - t // 5, 2 * s + 1)
    il = il.to(dev)
    tl = torch.full((b,), s, dtype=torch.int64, device=dev)

    def step(f):
        def run():
            x.grad = None
            f(x.log_softmax(-1)).backward()
        return run

    def native(lp):
        with torch.backends.cudnn.flags(enabled=False):
            return F.ctc_loss(lp, tg, il, tl)
    return {"duoloss device": step(lambda lp: dt.ctc_loss(lp, tg, il, tl, impl="device")),
            "F.ctc_loss native": step(native)}


def _rnnt_fns(size, dev, kind):
    import torch

    import duoloss.torch as dt
    n, t, u, v = size
    g = torch.Generator().manual_seed(0)
    extra = 5 if kind == "tdt" else 0
    x = torch.randn(n, t, u + 1, v + extra, generator=g).to(dev).requires_grad_()
    y = torch.randint(1, v - 3, (n, u), generator=g).to(dev)
    ll = torch.full((n,), t, dtype=torch.int32, device=dev)
    yl = torch.full((n,), u, dtype=torch.int32, device=dev)
    ll[1::2] = max(t - t // 5, 1)
    yl[1::2] = max(u - u // 4, 0)

    def step(f, z):
        def run():
            z.grad = None
            f(z).sum().backward()
        return run
    if kind == "tdt":
        return {"duoloss tdt_loss": step(lambda z: dt.tdt_loss(
                    z, y, ll, yl, 0, (0, 1, 2, 3, 4), reduction="sum", impl="device"), x),
                "duoloss multiblank_rnnt_loss": step(lambda z: dt.multiblank_rnnt_loss(
                    z[..., :v], y, ll, yl, v - 1, (2, 4), reduction="sum", impl="device"), x)}
    xh = x.detach().to(torch.bfloat16).requires_grad_()
    fns = {"duoloss device": step(lambda z: dt.rnnt_loss(
               z, y, ll, yl, blank=0, reduction="sum", impl="device"), x),
           "duoloss device bf16": step(lambda z: dt.rnnt_loss(
               z, y, ll, yl, blank=0, reduction="sum", impl="device"), xh)}
    try:
        import torchaudio.functional as TAF
        fns["torchaudio rnnt_loss"] = step(lambda z: TAF.rnnt_loss(
            z, y.to(torch.int32), ll, yl, blank=0, reduction="sum"), x)
    except Exception:  # noqa: BLE001 (not on the machine: left out)
        pass
    return fns


def _sync(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _kernels(prof, steps, cuda):
    """``[(name, launches per step, µs per step)]`` of the profiled device events."""
    from torch.autograd import DeviceType
    acc = {}
    for e in prof.key_averages():
        dt_us = getattr(e, "device_time_total", None)
        if dt_us is None:
            dt_us = getattr(e, "cuda_time_total", 0)
        if cuda:
            # device-side events only (kernels, memcpy/memset): a CPU op's device time
            # is its kernels' again (counted twice before 2026-11-28's second run)
            if e.device_type == DeviceType.CPU or not dt_us:
                continue
            acc[e.key] = (e.count / steps, dt_us / steps)
        else:
            acc[e.key] = (e.count / steps, e.self_cpu_time_total / steps)
    return sorted(((k, c, us) for k, (c, us) in acc.items()), key=lambda r: -r[2])


def profile_case(kind, size, dev, dry):
    from torch.profiler import ProfilerActivity, profile
    if kind == "ctc":
        fns = _ctc_fns(size, dev)
    else:
        fns = _rnnt_fns(size, dev, kind)
    cuda = dev.type == "cuda"
    rows = []
    for name, fn in fns.items():
        try:
            for _ in range(2):
                fn()
            _sync(dev)
            walls, hosts = [], []
            for _ in range(1 if dry else ROUNDS):
                _sync(dev)
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                _sync(dev)
                walls.append((time.perf_counter() - t0) * 1e3)
                hosts.append((t1 - t0) * 1e3)
            row = {"case": f"{kind} {size}", "impl": name,
                   "wall_ms": statistics.median(walls),
                   "host_ms": statistics.median(hosts), "gpu_ms": None, "kernels": []}
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            steps = 1 if dry else STEPS
            try:
                with profile(activities=acts) as prof:
                    for _ in range(steps):
                        fn()
                    _sync(dev)
                ks = _kernels(prof, steps, cuda)
                row["gpu_ms"] = sum(us for _, _, us in ks) / 1e3 if cuda else None
                row["kernels"] = [{"name": k[:90], "per_step": c, "us": us}
                                  for k, c, us in ks[:12]]
            except Exception as e:  # noqa: BLE001 (no CUPTI: the timings stay)
                row["profile_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
        except Exception as e:  # noqa: BLE001
            rows.append({"case": f"{kind} {size}", "impl": name,
                         "error": f"{type(e).__name__}: {str(e)[:200]}"})
        _print(rows[-1])
    return rows


def _print(r):
    if "error" in r:
        print(f"{r['case']:<24} {r['impl']:<30} skipped: {r['error']}", flush=True)
        return
    gpu = "" if r["gpu_ms"] is None else f" gpu {r['gpu_ms']:.3f} ms"
    print(f"{r['case']:<24} {r['impl']:<30} wall {r['wall_ms']:.3f} ms host "
          f"{r['host_ms']:.3f} ms{gpu}", flush=True)
    for k in r["kernels"][:8]:
        print(f"    {k['us']:9.1f} us  x{k['per_step']:<5.1f} {k['name']}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_profile",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry", action="store_true", help="CPU, Triton interpreter, tiny sizes")
    p.add_argument("--json", default="", help="write the rows to this JSON file")
    args = p.parse_args(argv)
    from benchmarks._device_check import device_for
    dev = device_for(args.dry)
    if dev is None:
        return 2
    import torch
    cuda = dev.type == "cuda"
    head = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu (dry run)",
            "torch": torch.__version__, "commit": os.environ.get("DUOLOSS_COMMIT", ""),
            "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "steps": STEPS}
    print(json.dumps(head), flush=True)
    rows = []
    for kind, size in _cases(args.dry):
        rows += profile_case(kind, size, dev, args.dry)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"info": head, "rows": rows}, f, indent=1)
        if cuda:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
