"""Full RNN-T loss, forward + backward w.r.t. the joiner logits, float32.

Compares, in one process and on the same inputs:

* ``duoloss.torch.rnnt_loss`` (eager autograd) and ``duoloss.jax.rnnt_loss``
  (``jit(value_and_grad)``): the normaliser and gathers run in the framework,
  only the two ``(N, U(+1), T(+1))`` lattices cross to the host core;
* a straightforward pure-JAX transducer written here: ``log_softmax``, gathers,
  then ``lax.scan`` over frames with an inner ``lax.scan`` over target positions,
  differentiated by JAX (``jit(value_and_grad)``);
* ``warprnnt_numba`` (NeMo's numba port of warp-transducer, CPU path, torch
  autograd), when importable.

Prints median milliseconds, ratios to the pure-JAX scan and to warprnnt-numba,
and the bytes that duoloss moves to and from the host per call (independent of
``V``) next to the size of the logits.

    python benchmarks/rnnt.py                       # the three default sizes
    python benchmarks/rnnt.py --sizes 32,150,40,28 --repeats 5
    python benchmarks/rnnt.py --skip jax_scan       # leave a peer out

Sizes are ``N,T,U,V`` (batch, frames, target length, classes with the blank).
The two large default sizes hold 1.6-2 GB of logits: each implementation needs
a few times that in memory.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import numpy as np

#: warprnnt-numba's CPU path is very slow (4.3 s per fwd+bwd at 8,50,10,28 on
#: this project's 2-core machine): skipped above this many lattice cells.
WARP_MAX_CELLS = 20_000
DEFAULT_SIZES = ((32, 150, 40, 28), (32, 150, 20, 5000), (16, 500, 100, 500))


def _timeit(fn, repeats):
    fn()  # warm-up: compiles (numba cache, XLA)
    if repeats <= 0:
        return float("nan")
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def jax_scan_rnnt(logits, targets, il, tl, blank):
    """Pure-JAX RNN-T NLL per sequence (the straightforward scan formulation)."""
    import jax
    import jax.numpy as jnp

    lp = jax.nn.log_softmax(logits, axis=-1)                     # (N, T, U+1, V)
    n, t_max, u1, _ = lp.shape
    emit = jnp.take_along_axis(lp[:, :, :-1], targets[:, None, :, None], axis=3)[..., 0]
    blk = lp[..., blank]                                          # (N, T, U+1)
    emit = jnp.pad(emit, ((0, 0), (0, 0), (0, 1)), constant_values=-jnp.inf)

    def along_u(prev_row, e_row):
        # alpha[t, u] = logaddexp(prev_row[u], alpha[t, u-1] + e_row[u-1])
        def step(carry, xs):
            p, e_prev = xs
            a = jnp.logaddexp(p, carry + e_prev)
            return a, a
        first = prev_row[:, 0]
        _, rest = jax.lax.scan(step, first, (prev_row[:, 1:].T, e_row[:, :-1].T))
        return jnp.concatenate([first[:, None], rest.T], axis=1)

    a0 = jnp.concatenate([jnp.zeros((n, 1)), jnp.cumsum(emit[:, 0, :-1], axis=1)], axis=1)

    def over_t(alpha, t):
        prev = alpha + blk[:, t - 1]
        new = along_u(prev, emit[:, t])
        return new, new

    _, alphas = jax.lax.scan(over_t, a0, jnp.arange(1, t_max))
    alphas = jnp.concatenate([a0[None], alphas], axis=0)          # (T, N, U+1)
    b = jnp.arange(n)
    last = alphas[il - 1, b, tl] + blk[b, il - 1, tl]
    return -last


def bench(n, t, u, v, repeats, skip):
    import jax
    import jax.numpy as jnp
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((n, t, u + 1, v), dtype=np.float32)
    blank = 0
    tg = rng.integers(1, v, (n, u)).astype(np.int32)
    il = np.full(n, t, np.int32)
    il[::2] = max(1, t - t // 5)
    tl = np.full(n, u, np.int32)
    tl[1::2] = max(0, u - u // 4)
    res, losses = {}, {}

    # the host part alone: the core lattice recursion, fwd+bwd, on lattices of this size
    from duoloss.core import transducer_loss_and_grad
    lpx = np.log(rng.uniform(0.01, 1.0, (n, u, t + 1))).astype(np.float32)
    lpy = np.log(rng.uniform(0.01, 1.0, (n, u + 1, t))).astype(np.float32)
    bd = np.stack([np.zeros(n), np.zeros(n), tl, il], 1).astype(np.int64)
    res["core lattice only"] = _timeit(lambda: transducer_loss_and_grad(lpx, lpy, bd), repeats)
    losses["core lattice only"] = float("nan")

    xt = torch.from_numpy(logits).requires_grad_()
    args_t = (torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl))

    def torch_run():
        xt.grad = None
        loss = dt.rnnt_loss(xt, *args_t, blank=blank, reduction="sum")
        loss.backward()
        return loss

    res["duoloss torch"] = _timeit(torch_run, repeats)
    losses["duoloss torch"] = float(torch_run().detach())
    xt.grad = None
    gc.collect()

    xj = jnp.asarray(logits)
    if "duoloss_jax" not in skip:
        f = jax.jit(jax.value_and_grad(
            lambda x: dj.rnnt_loss(x, tg, il, tl, blank=blank, reduction="sum")))
        res["duoloss jax"] = _timeit(lambda: jax.block_until_ready(f(xj)), repeats)
        losses["duoloss jax"] = float(f(xj)[0])
        del f
        gc.collect()
    if "jax_scan" not in skip:
        g = jax.jit(jax.value_and_grad(
            lambda x: jax_scan_rnnt(x, jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl),
                                    blank).sum()))
        res["pure-JAX scan"] = _timeit(lambda: jax.block_until_ready(g(xj)), repeats)
        losses["pure-JAX scan"] = float(g(xj)[0])
        del g
        gc.collect()
    if "warprnnt" not in skip and n * t * (u + 1) > WARP_MAX_CELLS:
        print(f"  (warprnnt-numba skipped: its CPU path took 4.3 s per call already at "
              f"8,50,10,28 here; N*T*(U+1) = {n * t * (u + 1)} > {WARP_MAX_CELLS})")
    elif "warprnnt" not in skip:
        try:
            from warprnnt_numba.rnnt_loss.rnnt_pytorch import rnnt_loss as warp
        except ImportError:
            warp = None
        if warp is not None:
            def warp_run():
                xt.grad = None
                loss = warp(xt, *args_t, blank=blank, reduction="sum")
                loss.backward()
                return loss

            res["warprnnt-numba"] = _timeit(warp_run, repeats)
            losses["warprnnt-numba"] = float(warp_run().detach().sum())
            xt.grad = None
            gc.collect()

    # host crossing of duoloss per call (float32): lattices in, losses + grads out
    lattice = 4 * (n * u * (t + 1) + n * (u + 1) * t) + 8 * 4 * n
    to_host, from_host = lattice, lattice - 8 * 4 * n + 4 * n
    return res, losses, to_host, from_host, 4 * logits.size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="*", default=None, help="N,T,U,V (several allowed)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for torch, numba and XLA (default: all cores)")
    ap.add_argument("--skip", nargs="*", default=(),
                    choices=("duoloss_jax", "jax_scan", "warprnnt"))
    a = ap.parse_args()
    if a.threads:
        # before jax/torch/numba start their pools
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false"
                                   f" intra_op_parallelism_threads={a.threads}")
        os.environ["NUMBA_NUM_THREADS"] = str(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
        import torch
        torch.set_num_threads(a.threads)
    sizes = ([tuple(int(x) for x in s.split(",")) for s in a.sizes] if a.sizes
             else DEFAULT_SIZES)
    import torch
    print(f"torch threads {torch.get_num_threads()}, float32, fwd+bwd w.r.t. logits, "
          f"median of {a.repeats} (ms)")
    for size in sizes:
        res, losses, to_h, from_h, lbytes = bench(*size, a.repeats, set(a.skip))
        print(f"\nN,T,U,V = {size}: logits {lbytes / 2**20:.0f} MiB; duoloss host crossing "
              f"{to_h / 2**20:.2f} MiB in + {from_h / 2**20:.2f} MiB out per call")
        scan = res.get("pure-JAX scan")
        warp = res.get("warprnnt-numba")
        for name, ms in res.items():
            line = f"  {name:16s} {ms:10.1f} ms"
            if scan:
                line += f"   x{ms / scan:6.2f} of pure-JAX scan"
            if warp:
                line += f"   x{ms / warp:6.2f} of warprnnt-numba"
            line += f"   loss {losses[name]:.6g}"
            print(line)


if __name__ == "__main__":
    main()
