"""JAX Pallas CTC on a GPU: the kernel against the XLA scan, and its ``num_warps``.

``python -m benchmarks.pallas_ctc_sweep`` (from the repository root, on a CUDA machine)

1. checks ``jit(value_and_grad)`` of ``ctc_loss(impl="pallas")`` against
   ``impl="xla"`` (the scan, itself tested against the numba core) in float64 and
   float32 at each size: relative loss difference and largest gradient difference;
2. times the float32 full step (logits -> ``log_softmax`` -> ``ctc_loss`` -> gradient,
   median of 30 after 2 warm-up calls) for the Pallas kernel with the default warp rule
   (``W/64`` warps, 1 to 8) and with 1, 2, 4 and 8 warps
   (``duoloss.jax._pallas.ctc.NUM_WARPS``), with the posteriors formed inside the beta
   kernel instead of in one XLA pass after it (``POSTERIOR_IN_KERNEL``), the XLA scan,
   and the Pallas forward alone;

and prints one JSON object ``{"device": ..., "rows": [...]}`` at the end (each row also
as it is measured).  ``--dry`` runs the same on CPU at a tiny size (the kernel in Pallas'
interpreter): a test of this script, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

SIZES = [(32, 500, 50, 100), (16, 1000, 100, 200)]  # (N, T, C, S)
DRY_SIZES = [(2, 20, 8, 5)]


def _inputs(size, dtype):
    import jax.numpy as jnp
    import numpy as np
    n, t, c, s = size
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((n, t, c)).astype(dtype))
    tg = jnp.asarray(rng.integers(1, c, (n, s)))
    il = np.full(n, t)
    il[1::2] = max(t - t // 5, 2 * s + 1)          # as benchmarks/_device_speed.py
    return logits, tg, jnp.asarray(il), jnp.full((n,), s)


def _step(impl, tg, il, tl, grad=True):
    import jax

    import duoloss.jax as dj

    def loss(z):
        lp = jax.nn.log_softmax(z, -1).transpose(1, 0, 2)
        return dj.ctc_loss(lp, tg, il, tl, reduction="sum", impl=impl)
    return jax.jit(jax.value_and_grad(loss) if grad else loss)


def _median_ms(f, x, rounds):
    import jax
    jax.block_until_ready(f(x))
    jax.block_until_ready(f(x))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="tiny sizes on CPU (a script test)")
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    from duoloss.jax._pallas import ctc as pc

    sizes, rounds = (DRY_SIZES, 2) if args.dry else (SIZES, 30)
    device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, jax {jax.__version__})"
    rows = []

    def row(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    for size in sizes:
        for dtype in ("float64", "float32"):
            logits, tg, il, tl = _inputs(size, dtype)
            for in_kernel in (False, True):
                pc.POSTERIOR_IN_KERNEL = in_kernel
                (lp_, gp), (lx, gx) = (_step(i, tg, il, tl)(logits) for i in ("pallas", "xla"))
                row(size=size, dtype=dtype, check="pallas vs xla",
                    posteriors_in_kernel=in_kernel,
                    loss_rel=abs(float(lp_) - float(lx)) / max(abs(float(lx)), 1e-300),
                    grad_max_abs=float(jnp.max(jnp.abs(gp - gx))))
            pc.POSTERIOR_IN_KERNEL = False
        logits, tg, il, tl = _inputs(size, "float32")
        try:
            for warps in (None, 1, 2, 4, 8):
                pc.NUM_WARPS = warps
                row(size=size, case=f"pallas num_warps={warps or 'auto'}",
                    ms=_median_ms(_step("pallas", tg, il, tl), logits, rounds))
            pc.NUM_WARPS = None
            pc.POSTERIOR_IN_KERNEL = True
            row(size=size, case="pallas posteriors in the kernel",
                ms=_median_ms(_step("pallas", tg, il, tl), logits, rounds))
        finally:
            pc.NUM_WARPS = None
            pc.POSTERIOR_IN_KERNEL = False
        row(size=size, case="xla", ms=_median_ms(_step("xla", tg, il, tl), logits, rounds))
        row(size=size, case="pallas forward only",
            ms=_median_ms(_step("pallas", tg, il, tl, grad=False), logits, rounds))
    print(json.dumps({"device": device, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
