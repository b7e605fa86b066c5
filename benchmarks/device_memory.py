"""Extra memory of the torch device path's losses, forward + backward, on CPU.

Issue 27 point 5: beyond the logits and their gradient, a device loss may use at most
1x the logits' size.  Each case runs in a fresh process (``TRITON_INTERPRET=1``: the
same torch operations as on a GPU, the Triton kernels in the interpreter): the logits
are made, one warm-up call (imports, first-call work) runs and is released, the
kernel's peak-RSS counter is reset (``/proc/self/clear_refs``), then one forward +
backward runs; ``extra = peak RSS - RSS before the call - size of the gradient``
(glibc's mmap threshold fixed at 64 KiB in the child, so that freed tensors leave the
RSS).
On a GPU the same number comes from ``torch.cuda.max_memory_allocated``
(``python -m benchmarks.device --check``, section ``memory``).

    python -m benchmarks.device_memory              # every case, the default sizes
    python -m benchmarks.device_memory --quick      # small sizes (a smoke test)
    python -m benchmarks.device_memory --case tdt --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: case -> (shape of the logits parameters, quick shape); transducers (N, T, U, V),
#: CTC (N, T, C, S)
CASES = {
    "tdt": ((4, 40, 20, 3000), (2, 12, 4, 300)),
    "multiblank": ((4, 40, 20, 3000), (2, 12, 4, 300)),
    "rnnt": ((4, 40, 20, 3000), (2, 12, 4, 300)),
    "pruned": ((4, 100, 30, 8000), (2, 20, 6, 300)),
    "ctc": ((8, 200, 5000, 30), (2, 30, 300, 6)),
}

_CHILD = r"""
import gc, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import torch
import duoloss.torch as dt
case, shape = sys.argv[2], tuple(int(v) for v in sys.argv[3].split(","))

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

g = torch.Generator().manual_seed(0)
if case == "ctc":
    n, t, c, s = shape
    x = torch.randn(t, n, c, generator=g).log_softmax(-1)   # the log-probabilities are the leaf
    a = (torch.randint(1, c, (n, s), generator=g), torch.full((n,), t), torch.full((n,), s))
    fn = lambda z: dt.ctc_loss(z, *a, impl="device")
else:
    n, t, u, v = shape
    extra = 5 if case == "tdt" else 0
    if case == "pruned":
        r = 4
        x = torch.randn(n, t, r, v, generator=g)
        sym = torch.randint(1, v, (n, u), generator=g)
        start = torch.clamp(torch.arange(t) * u // t, max=u - r + 1)     # non-decreasing
        ranges = (start[:, None] + torch.arange(r)[None, :]).expand(n, t, r).contiguous()
        bd = torch.tensor([[0, 0, u, t]] * n)
        fn = lambda z: dt.rnnt_loss_pruned(z, sym, ranges, 0, bd, impl="device")
    else:
        x = torch.randn(n, t, u + 1, v + extra, generator=g)
        a = (torch.randint(1, v - 4, (n, u), generator=g), torch.full((n,), t), torch.full((n,), u))
        if case == "tdt":
            fn = lambda z: dt.tdt_loss(z, *a, 0, (0, 1, 2, 3, 4), impl="device")
        elif case == "multiblank":
            fn = lambda z: dt.multiblank_rnnt_loss(z, *a, v - 1, (2, 4), impl="device")
        else:
            fn = lambda z: dt.rnnt_loss(z, *a, blank=0, impl="device")
x.requires_grad_()
fn(x).backward()          # warm-up: imports, first-call work
x.grad = None
gc.collect()
before = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")          # reset the peak-RSS counter (VmHWM) to the current RSS
fn(x).backward()
peak = rss("VmHWM")
size = x.numel() * x.element_size()
print(json.dumps({"case": case, "shape": shape, "logits_bytes": size,
                  "extra_bytes": peak - before - size}))
"""


def measure(case: str, shape) -> dict:
    # glibc: every large block mmapped and returned on free (no dynamic threshold), so
    # that RSS follows the live tensors
    env = dict(os.environ, TRITON_INTERPRET="1", DUOLOSS_QUIET_COMPILE="1",
               MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    done = subprocess.run([sys.executable, "-c", _CHILD, ROOT, case,
                           ",".join(map(str, shape))], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{case} {shape}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", choices=sorted(CASES))
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    p.add_argument("--json", default="", help="write the rows to this JSON file")
    args = p.parse_args(argv)
    rows = []
    for case in args.case or list(CASES):
        shape = CASES[case][1 if args.quick else 0]
        r = measure(case, shape)
        r["ratio"] = r["extra_bytes"] / r["logits_bytes"]
        rows.append(r)
        print(f"{case:<11} {str(tuple(shape)):<22} logits {r['logits_bytes'] / 2**20:8.1f} MiB  "
              f"extra {r['extra_bytes'] / 2**20:8.1f} MiB = {r['ratio']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ratio"] <= 1.0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
