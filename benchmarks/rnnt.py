"""Full RNN-T loss, forward + backward w.r.t. the joiner logits, float32.

Compares, in one process and on the same inputs:

* ``duoloss.torch.rnnt_loss`` (eager autograd) and ``duoloss.jax.rnnt_loss``
  (``jit(value_and_grad)``): the normaliser and gathers run in the framework
  (one fused custom backward), only the two ``(N, U(+1), T(+1))`` lattices cross
  to the host core;
* two straightforward pure-JAX transducers written here, both
  ``jit(value_and_grad)`` of ``log_softmax``, the two gathers and a ``lax.scan``,
  differentiated by JAX, neither hand-optimised: "pure-JAX scan" scans over
  frames with an inner ``lax.scan`` over target positions (the textbook row
  recursion), "pure-JAX diag" scans once over anti-diagonals, each step a
  vectorised ``logaddexp`` over ``(N, U + 1)``;
* ``warprnnt_numba`` (NeMo's numba port of warp-transducer, CPU path, torch
  autograd), when importable.

Every implementation is warmed up (compiles), then timed in alternating rounds
(each round calls each once, in rotating order); a ratio is the median over
rounds of the per-round ratio, so drifting load on a shared machine cancels.
Also printed: the bytes that duoloss moves to and from the host per call
(independent of ``V``) next to the size of the logits.

    python -m benchmarks.rnnt                       # the three default sizes
    python -m benchmarks.rnnt --sizes 32,150,40,28 --rounds 9 --threads 1
    python -m benchmarks.rnnt --skip jax_scan       # leave a peer out
    python benchmarks/rnnt.py --quick               # a smoke run

Sizes are ``N,T,U,V`` (batch, frames, target length, classes with the blank).  The two large default sizes hold
1.6-2 GB of logits: each implementation needs a few times that in memory.
"""
from __future__ import annotations

import gc
import os
import sys

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/rnnt.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

#: warprnnt-numba's CPU path is very slow (4.3 s per fwd+bwd at 8,50,10,28 on
#: this project's 2-core machine): skipped above this many lattice cells.
WARP_MAX_CELLS = 20_000
DEFAULT_SIZES = [(32, 150, 40, 28), (32, 150, 20, 5000), (16, 500, 100, 500)]
QUICK_SIZES = [(2, 12, 4, 6)]
PEERS = ("pure-JAX scan", "pure-JAX diag", "warprnnt-numba")


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


def jax_diag_rnnt(logits, targets, il, tl, blank):
    """Pure-JAX RNN-T NLL per sequence, one ``lax.scan`` over anti-diagonals.

    ``log_softmax`` and the two gathers as in :func:`jax_scan_rnnt`; the lattice
    is skewed once (``blk``/``emit`` read at ``t = d - u``), then each of the
    ``T + U - 1`` scan steps updates a whole anti-diagonal ``(N, U + 1)`` with
    one ``logaddexp``.
    """
    import jax
    import jax.numpy as jnp

    lp = jax.nn.log_softmax(logits, axis=-1)
    n, t_max, u1, _ = lp.shape
    emit = jnp.take_along_axis(lp[:, :, :-1], targets[:, None, :, None], axis=3)[..., 0]
    emit = jnp.pad(emit, ((0, 0), (0, 0), (1, 0)), constant_values=-jnp.inf)  # u-1 -> u
    blk = lp[..., blank]                                                       # (N, T, U+1)
    n_diag = t_max + u1 - 1
    d = jnp.arange(n_diag)[:, None]
    u = jnp.arange(u1)[None, :]
    t = d - u                                                                  # (D, U+1)
    ok = (t >= 0) & (t < t_max)
    tc = jnp.clip(t, 0, t_max - 1)
    # skewed: blk_s[d, :, u] = blk[:, d - u, u], emit_s[d, :, u] = emit[:, d - u, u]
    blk_s = jnp.where(ok[:, None], jnp.moveaxis(blk[:, tc, u], 0, 1), -jnp.inf)
    emit_s = jnp.where(ok[:, None], jnp.moveaxis(emit[:, tc, u], 0, 1), -jnp.inf)
    a0 = jnp.full((n, u1), -jnp.inf).at[:, 0].set(0.0)

    def step(prev, xs):
        b_prev, e_cur, ok_cur = xs          # blk at diagonal d-1, emit at d
        from_t = prev + b_prev              # alpha[t-1, u] + blank
        from_u = jnp.pad(prev[:, :-1], ((0, 0), (1, 0)), constant_values=-jnp.inf) + e_cur
        a = jnp.where(ok_cur[None], jnp.logaddexp(from_t, from_u), -jnp.inf)
        return a, a

    _, diags = jax.lax.scan(step, a0, (blk_s[:-1], emit_s[1:], ok[1:]))
    diags = jnp.concatenate([a0[None], diags], axis=0)                         # (D, N, U+1)
    b = jnp.arange(n)
    last = diags[il - 1 + tl, b, tl] + blk[b, il - 1, tl]
    return -last


def bench(n, t, u, v, rounds, skip, label="", notes=None):
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
    fns, losses = {}, {}

    # the host part alone: the core lattice recursion, fwd+bwd, on lattices of this size
    from duoloss.core import transducer_loss_and_grad
    lpx = np.log(rng.uniform(0.01, 1.0, (n, u, t + 1))).astype(np.float32)
    lpy = np.log(rng.uniform(0.01, 1.0, (n, u + 1, t))).astype(np.float32)
    bd = np.stack([np.zeros(n), np.zeros(n), tl, il], 1).astype(np.int64)
    fns["core lattice only"] = lambda: transducer_loss_and_grad(lpx, lpy, bd)

    xt = torch.from_numpy(logits).requires_grad_()
    args_t = (torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl))

    def torch_run():
        xt.grad = None
        loss = dt.rnnt_loss(xt, *args_t, blank=blank, reduction="sum")
        loss.backward()
        return loss.detach()

    fns["duoloss torch"] = torch_run
    xj = jnp.asarray(logits)
    if "duoloss_jax" not in skip:
        f = jax.jit(jax.value_and_grad(
            lambda x: dj.rnnt_loss(x, tg, il, tl, blank=blank, reduction="sum")))
        fns["duoloss jax"] = lambda: jax.block_until_ready(f(xj))[0]
    targs = (jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl), blank)
    if "jax_scan" not in skip:
        g = jax.jit(jax.value_and_grad(lambda x: jax_scan_rnnt(x, *targs).sum()))
        fns["pure-JAX scan"] = lambda: jax.block_until_ready(g(xj))[0]
    if "jax_diag" not in skip:
        h = jax.jit(jax.value_and_grad(lambda x: jax_diag_rnnt(x, *targs).sum()))
        fns["pure-JAX diag"] = lambda: jax.block_until_ready(h(xj))[0]
    if "warprnnt" not in skip and n * t * (u + 1) > WARP_MAX_CELLS:
        msg = (f"warprnnt-numba skipped at {n},{t},{u},{v}: its CPU path took 4.3 s per call "
               f"already at 8,50,10,28 here; N*T*(U+1) = {n * t * (u + 1)} > {WARP_MAX_CELLS}")
        print("# " + msg, file=sys.stderr)
        if notes is not None:
            notes.append(msg)
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
                return loss.detach().sum()

            fns["warprnnt-numba"] = warp_run
    for k, fn in fns.items():
        H.progress(f"{label}{k} first call")
        losses[k] = float("nan") if k == "core lattice only" else float(fn())
    timing = H.paired(fns, rounds, warmup=1, label=label)
    gc.collect()

    # host crossing of duoloss per call (float32): lattices in, losses + grads out
    lattice = 4 * (n * u * (t + 1) + n * (u + 1) * t) + 8 * 4 * n
    to_host, from_host = lattice, lattice - 8 * 4 * n + 4 * n
    return timing, losses, to_host, from_host, 4 * logits.size


def main(argv=None):
    ap = H.parser(__doc__, names="N,T,U,V", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                  rounds=5, threads=None,
                  threads_help="threads for torch, numba and XLA (default: all cores)")
    ap.add_argument("--thp", action="store_true",
                    help="set THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator asks for "
                         "transparent huge pages: far fewer page faults on fresh GB buffers)")
    ap.add_argument("--skip", nargs="*", default=(),
                    choices=("duoloss_jax", "jax_scan", "jax_diag", "warprnnt"))
    a = H.finish_args(ap.parse_args(argv), "rnnt")
    if a.thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read once, before torch allocates
    if a.threads:
        # before jax/torch/numba start their pools
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false"
                                   f" intra_op_parallelism_threads={a.threads}")
        os.environ["NUMBA_NUM_THREADS"] = str(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
        import torch
        torch.set_num_threads(a.threads)
    import torch
    rows, results, notes = [], [], []
    for i, size in enumerate(a.sizes):
        tm, losses, to_h, from_h, lbytes = bench(*size, a.rounds, set(a.skip),
                                                 label=H.size_label(i, len(a.sizes)), notes=notes)
        refs = [r for r in PEERS if r in tm.rounds_ms]
        ratios = [tm.ratio(name, r) for name in tm.rounds_ms for r in refs]
        for name in tm.rounds_ms:
            cells = [H.fmt_ratio(tm.ratio(name, r)) for r in refs]
            rows.append((size, name, tm.median(name), cells, losses[name], refs))
        results.append(H.result(size, tm, ratios=ratios, extra={
            "logits_mib": lbytes / 2**20, "host_mib_in": to_h / 2**20,
            "host_mib_out": from_h / 2**20, "losses": losses}))
    text = (f"RNN-T, torch threads {torch.get_num_threads()}, float32, fwd+bwd w.r.t. logits; "
            f"median ms over {a.rounds} alternating rounds; ratio = median of per-round ratios "
            f"(interquartile range in brackets)\n")
    for res in results:
        size = tuple(res["size"])
        e = res["extra"]
        sub = [r for r in rows if r[0] == size]
        refs = sub[0][5]
        text += (f"\nN,T,U,V = {H.format_size(size)}: logits {e['logits_mib']:.0f} MiB; duoloss "
                 f"host crossing {e['host_mib_in']:.2f} MiB in + {e['host_mib_out']:.2f} MiB "
                 f"out per call\n\n")
        text += H.table(["implementation", "ms"] + [f"x of {r}" for r in refs] + ["loss"],
                        [[name, H.fmt_ms(ms)] + cells + [f"{loss:.6g}"]
                         for _, name, ms, cells, loss, _ in sub]) + "\n"
    if notes:
        text += "\n" + "\n".join(f"({n})" for n in notes) + "\n"
    H.emit(a, results, text.rstrip("\n"))


if __name__ == "__main__":
    main()
