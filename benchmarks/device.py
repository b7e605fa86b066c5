"""Device paths: duoloss's XLA path (``impl='device'``) against the pure-JAX peers, and
the torch/Triton path on CUDA.

JAX part (every backend; the numbers are for the backend JAX runs on, printed in the
header): ``jit(value_and_grad)`` of the summed losses, forward + backward, float32.

* CTC ``(B, T, C, L)``: duoloss ``ctc_loss(impl='device')`` on log-probabilities vs
  ``optax.ctc_loss`` on logits (which differentiates through its own ``log_softmax`` and
  scan); also duoloss ``ctc_loss(impl='device')`` behind the same ``log_softmax`` (the
  like-for-like column) and duoloss's host path (``impl='host'``).
* RNN-T ``(N, T, U, V)``: duoloss ``rnnt_loss(impl='device')`` vs the pure-JAX
  anti-diagonal scan of ``benchmarks/rnnt.py`` (``jax_diag_rnnt``, differentiated by
  JAX) and duoloss's host path.
* pruned ``(N, T, U, V)`` with ``s_range=5``: k2's simple-then-pruned recipe
  (``rnnt_loss_smoothed(return_grad=True)``, ranges, ``do_rnnt_pruning``, an additive
  joiner, ``rnnt_loss_pruned``) with ``impl='device'`` vs ``impl='host'``.

CUDA part: ``benchmarks/_device_torch.run_torch_cases`` (Triton device path vs host path,
``F.ctc_loss``, torchaudio, warp-rnnt, k2, with peak memory) when torch sees a CUDA
device; otherwise the script says the CUDA part was skipped.

``--check`` (``benchmarks/_device_check.py``): every device function on the GPU against
the host path (values and gradients, float32/float64), host syncs under
``torch.cuda.set_sync_debug_mode``, CUDA graph capture, extra memory, and full-step
timings against ``F.ctc_loss`` (native, cuDNN), warprnnt-numba's CUDA kernel, a
materialised-joiner baseline and ``optax.ctc_loss``, printed as one table; ``--dry`` runs
it on CPU (Triton interpreter, tiny sizes) as a test of the script.

Targets on CPU (issue 20): ``ctc_loss`` device <= 1x ``optax.ctc_loss``; ``rnnt_loss``
device <= 0.7x the pure-JAX diagonal scan.

    python -m benchmarks.device --check         # the one-shot GPU check (see below)
    python -m benchmarks.device --check --dry   # the same steps on CPU, tiny sizes
    python -m benchmarks.device                 # the issue's sizes
    python -m benchmarks.device --quick         # smoke test
    python -m benchmarks.device --only ctc --ctc-sizes "32,500,50,100"
"""
from __future__ import annotations

import gc
import sys

import numpy as np

from benchmarks import _harness as H

CTC_SIZES = [(32, 500, 50, 100), (16, 1000, 100, 200), (16, 500, 8000, 100)]
RNNT_SIZES = [(32, 150, 40, 28), (16, 500, 100, 500)]
PRUNED_SIZES = [(16, 500, 100, 500)]
QUICK = {"ctc": [(4, 50, 20, 10)], "rnnt": [(4, 20, 5, 8)], "pruned": [(4, 20, 5, 8)]}
S_RANGE = 5


def _ctc(size, rounds, label):
    import jax
    import jax.numpy as jnp
    import optax

    import duoloss.jax as dj

    b, t, c, l = size
    _, x, _, tg, il, tl, _ = H.synthetic_inputs(b, t, c, l)
    logits = jnp.asarray(np.ascontiguousarray(x.transpose(1, 0, 2)))     # (B, T, C)
    lp = jax.nn.log_softmax(jnp.asarray(x), -1)                           # (T, B, C)
    tgj, ilj, tlj = jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl)
    lpad = jnp.zeros((b, t), jnp.float32)
    bpad = jnp.zeros((b, l), jnp.float32)

    def duo(impl):
        f = jax.jit(jax.value_and_grad(
            lambda a: dj.ctc_loss(a, tgj, ilj, tlj, reduction="sum", impl=impl)))
        return lambda: jax.block_until_ready(f(lp))[0]

    g_ls = jax.jit(jax.value_and_grad(lambda z: dj.ctc_loss(
        jax.nn.log_softmax(z, -1).transpose(1, 0, 2), tgj, ilj, tlj, reduction="sum",
        impl="device")))
    g_opt = jax.jit(jax.value_and_grad(lambda z: optax.ctc_loss(z, lpad, tgj, bpad).sum()))
    fns = {"duoloss device": duo("device"),
           "duoloss device+log_softmax": lambda: jax.block_until_ready(g_ls(logits))[0],
           "optax.ctc_loss": lambda: jax.block_until_ready(g_opt(logits))[0],
           "duoloss host": duo("host")}
    losses = {k: float(fn()) for k, fn in fns.items()}
    timing = H.paired(fns, rounds, label=label)
    ratios = [timing.ratio("duoloss device", "optax.ctc_loss"),
              timing.ratio("duoloss device+log_softmax", "optax.ctc_loss"),
              timing.ratio("duoloss device", "duoloss host")]
    rel = abs(losses["duoloss device"] - losses["duoloss host"]) / abs(losses["duoloss host"])
    return H.result(size, timing, case="ctc", ratios=ratios,
                    extra={"loss_rel_diff_device_host": rel})


def _rnnt(size, rounds, label):
    import jax
    import jax.numpy as jnp

    import duoloss.jax as dj
    from benchmarks.rnnt import jax_diag_rnnt

    n, t, u, v = size
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((n, t, u + 1, v), dtype=np.float32))
    tg = rng.integers(1, v, (n, u)).astype(np.int32)
    il = np.full(n, t, np.int32)
    il[::2] = max(1, t - t // 5)
    tl = np.full(n, u, np.int32)
    tl[1::2] = max(0, u - u // 4)
    tg, il, tl = jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl)

    def duo(impl):
        f = jax.jit(jax.value_and_grad(
            lambda x: dj.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum", impl=impl)))
        return lambda: jax.block_until_ready(f(logits))[0]

    h = jax.jit(jax.value_and_grad(lambda x: jax_diag_rnnt(x, tg, il, tl, 0).sum()))
    fns = {"duoloss device": duo("device"),
           "pure-JAX diag": lambda: jax.block_until_ready(h(logits))[0],
           "duoloss host": duo("host")}
    losses = {k: float(fn()) for k, fn in fns.items()}
    timing = H.paired(fns, rounds, label=label)
    gc.collect()
    ratios = [timing.ratio("duoloss device", "pure-JAX diag"),
              timing.ratio("duoloss device", "duoloss host")]
    rel = abs(losses["duoloss device"] - losses["pure-JAX diag"]) / abs(losses["pure-JAX diag"])
    return H.result(size, timing, case="rnnt", ratios=ratios,
                    extra={"loss_rel_diff_device_diag": rel})


def _pruned(size, rounds, label):
    import jax
    import jax.numpy as jnp

    import duoloss.jax as dj

    n, t, u, v = size
    rng = np.random.default_rng(0)
    am = jnp.asarray(rng.standard_normal((n, t, v), dtype=np.float32))
    lm = jnp.asarray(rng.standard_normal((n, u + 1, v), dtype=np.float32))
    sym = jnp.asarray(rng.integers(1, v, (n, u)))
    bd = jnp.asarray(np.stack([np.zeros(n), np.zeros(n), np.full(n, u), np.full(n, t)], 1)
                     .astype(np.int32))

    def loss(am, lm, impl):
        simple, (px_grad, py_grad) = dj.rnnt_loss_smoothed(
            lm, am, sym, 0, boundary=bd, reduction="sum", return_grad=True, impl=impl)
        ranges = dj.get_rnnt_prune_ranges(px_grad, py_grad, bd, S_RANGE)
        am_p, lm_p = dj.do_rnnt_pruning(am, lm, ranges)
        pruned = dj.rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, boundary=bd,
                                     reduction="sum", impl=impl)
        return 0.5 * simple + pruned

    def duo(impl):
        f = jax.jit(jax.value_and_grad(lambda a, b: loss(a, b, impl), (0, 1)))
        return lambda: jax.block_until_ready(f(am, lm))[0]

    fns = {"duoloss device": duo("device"), "duoloss host": duo("host")}
    for fn in fns.values():
        fn()
    timing = H.paired(fns, rounds, label=label)
    return H.result(size, timing, case=f"pruned s_range={S_RANGE}",
                    ratios=[timing.ratio("duoloss device", "duoloss host")])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--check" in argv:  # the one-shot GPU check (issue 27): benchmarks/_device_check.py
        from benchmarks import _device_check
        return _device_check.main(argv)
    p = H.parser(__doc__, names="B,T,C,L", sizes=CTC_SIZES, quick_sizes=QUICK["ctc"],
                 rounds=5, quick_rounds=2)
    p.add_argument("--rnnt-sizes", default=None, metavar="N,T,U,V[;...]")
    p.add_argument("--pruned-sizes", default=None, metavar="N,T,U,V[;...]")
    p.add_argument("--only", choices=("ctc", "rnnt", "pruned", "torch"), action="append",
                   help="run only these parts (repeatable)")
    args = H.finish_args(p.parse_args(argv), "device")
    ctc_sizes = args.sizes
    rnnt_sizes = (H.parse_sizes(args.rnnt_sizes, "N,T,U,V") if args.rnnt_sizes
                  else QUICK["rnnt"] if args.quick else RNNT_SIZES)
    pruned_sizes = (H.parse_sizes(args.pruned_sizes, "N,T,U,V") if args.pruned_sizes
                    else QUICK["pruned"] if args.quick else PRUNED_SIZES)
    parts = set(args.only or ("ctc", "rnnt", "pruned", "torch"))
    import jax
    backend = jax.default_backend()
    print(f"# JAX backend: {backend} ({jax.devices()[0].device_kind}); "
          f"load average {H.machine_info()['loadavg']}")
    results, rows = [], []
    jobs = ([("ctc", s, _ctc) for s in ctc_sizes if "ctc" in parts]
            + [("rnnt", s, _rnnt) for s in rnnt_sizes if "rnnt" in parts]
            + [("pruned", s, _pruned) for s in pruned_sizes if "pruned" in parts])
    for i, (kind, size, fn) in enumerate(jobs):
        r = fn(size, args.rounds, H.size_label(i, len(jobs)))
        results.append(r)
        impls = r["impls"]
        rows.append([f"{kind} {H.format_size(size)}"]
                    + [f"{k}: {H.fmt_ms(impls[k]['median_ms'])}" for k in impls]
                    + ["; ".join(f"{x['num']}/{x['den']} = {H.fmt_ratio(x)}"
                                 for x in r["ratios"])])
    width = max((len(r) for r in rows), default=2)
    rows = [r[:-1] + [""] * (width - len(r)) + r[-1:] for r in rows]
    text = H.table(["case"] + ["ms (median)"] * (width - 2) + ["ratios"], rows) if rows else ""
    torch_rows = []
    if "torch" in parts:
        try:
            import torch
            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if cuda:
            from benchmarks._device_torch import run_torch_cases
            args.ctc_sizes, args.rnnt_sizes, args.pruned_sizes = (ctc_sizes, rnnt_sizes,
                                                                  pruned_sizes)
            torch_rows = run_torch_cases(args)
            results.extend(torch_rows)
            text += "\n\n# CUDA (torch/Triton): see the JSON for the rows\n"
        else:
            text += ("\n\n# CUDA part skipped: torch sees no CUDA device here "
                     "(benchmarks/_device_torch.py runs it on a GPU machine)")
    print(text)
    H.write_json(args, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
