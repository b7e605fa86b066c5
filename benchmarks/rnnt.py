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
    python -m benchmarks.rnnt --joiner              # the bounded-memory loss (below)

``--joiner`` times instead the full loss from a joiner, forward + backward w.r.t. the
joiner's parameters, ``encoder_out`` and ``predictor_out`` (float32; joiner
``Linear(H, V)(tanh(enc + pred))`` with ``H = --hidden``): ``rnnt_loss`` on
``joiner(enc[:, :, None], pred[:, None])`` against ``rnnt_loss_from_joiner`` (chunked,
recomputing backward), in torch (eager autograd) and JAX (``jit(value_and_grad)``, the
compiling call untimed; ``--joiner-frameworks`` picks).  Each implementation runs in a fresh process (``--rounds`` calls
after one warm-up call on a tiny input) so that its peak resident set size
(``ru_maxrss``) is its own; default size ``16,500,100,500``.

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


JOINER_SIZES = [(16, 500, 100, 500)]
JOINER_IMPLS = ("torch rnnt_loss(joiner(enc, pred))", "torch rnnt_loss_from_joiner",
                "jax rnnt_loss(joiner(enc, pred))", "jax rnnt_loss_from_joiner")


def _rss_now():
    with open("/proc/self/statm") as f:  # resident pages now
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def joiner_child_jax(impl, n, t, u, v, hidden, rounds, chunk_size):
    """The JAX pair: ``jit(value_and_grad)`` w.r.t. the joiner's parameters (closed over),
    ``enc`` and ``pred``; the first call (compilation at this shape) is not timed."""
    import json
    import resource
    import time

    import jax
    import jax.numpy as jnp

    import duoloss.jax as dj

    rng = np.random.default_rng(1)
    params = (jnp.asarray(0.1 * rng.standard_normal((hidden, v), dtype=np.float32)),
              jnp.zeros(v, jnp.float32))
    enc = jnp.asarray(rng.standard_normal((n, t, hidden), dtype=np.float32))
    pred = jnp.asarray(rng.standard_normal((n, u + 1, hidden), dtype=np.float32))
    tg = rng.integers(1, v, (n, u))
    il = np.full(n, t)
    il[::2] = max(1, t - t // 5)
    tl = np.full(n, u)
    tl[1::2] = max(0, u - u // 4)

    def loss(p, e, q):
        def joiner(a, c):
            return jnp.tanh(a + c) @ p[0] + p[1]
        if impl == 2:
            return dj.rnnt_loss(joiner(e[:, :, None], q[:, None]), tg, il, tl, blank=0)
        return dj.rnnt_loss_from_joiner(joiner, e, q, tg, il, tl, blank=0, chunk_size=chunk_size)

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    before = _rss_now()
    jax.block_until_ready(f(params, enc, pred))  # compile (not timed)
    seconds, out = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        out = jax.block_until_ready(f(params, enc, pred))
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "loss": float(out[0]), "peak_bytes": peak,
                      "before_bytes": before}))


def joiner_child(impl, n, t, u, v, hidden, rounds, chunk_size):
    """One implementation in this (fresh) process: prints a JSON line with per-call
    seconds, the loss and the peak RSS."""
    if impl >= 2:
        return joiner_child_jax(impl, n, t, u, v, hidden, rounds, chunk_size)
    import json
    import resource
    import time

    import torch

    import duoloss.torch as dt

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, v)

    def joiner(e, p):
        return head(torch.tanh(e + p))

    def call(enc, pred, tg, il, tl):
        if impl == 0:
            loss = dt.rnnt_loss(joiner(enc[:, :, None], pred[:, None]), tg, il, tl, blank=0)
        else:
            loss = dt.rnnt_loss_from_joiner(joiner, enc, pred, tg, il, tl, blank=0,
                                            chunk_size=chunk_size)
        loss.backward()
        return loss.item()

    def inputs(n, t, u):
        g = torch.Generator().manual_seed(1)
        enc = torch.randn(n, t, hidden, generator=g).requires_grad_()
        pred = torch.randn(n, u + 1, hidden, generator=g).requires_grad_()
        tg = torch.randint(1, v, (n, u), generator=g)
        il = torch.full((n,), t)
        il[::2] = max(1, t - t // 5)
        tl = torch.full((n,), u)
        tl[1::2] = max(0, u - u // 4)
        return enc, pred, tg, il, tl

    call(*inputs(2, 6, 3))  # compile (not timed)
    args = inputs(n, t, u)
    before = _rss_now()  # before the first call
    seconds, loss = [], None
    for _ in range(rounds):
        for x in (args[0], args[1], *head.parameters()):
            x.grad = None
        start = time.perf_counter()
        loss = call(*args)
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "loss": loss, "peak_bytes": peak,
                      "before_bytes": before}))


def joiner_main(a):
    import json
    import statistics
    import subprocess

    sizes = a.sizes if a.sizes_given else (QUICK_SIZES if a.quick else JOINER_SIZES)
    rows, results = [], []
    for i, size in enumerate(sizes):
        runs = {}
        for k, name in enumerate(JOINER_IMPLS):
            if name.split()[0] not in a.joiner_frameworks:
                continue
            H.progress(f"{H.size_label(i, len(sizes))}{name}: fresh process, {a.rounds} calls")
            cmd = [sys.executable, "-m", "benchmarks.rnnt", "--joiner-child", str(k),
                   ",".join(map(str, size)), str(a.hidden), str(a.rounds), str(a.chunk_size)]
            env = H.child_env(**({"OMP_NUM_THREADS": a.threads, "NUMBA_NUM_THREADS": a.threads}
                                 if a.threads else {}))
            proc = subprocess.run(cmd, cwd=H.ROOT, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"rnnt --joiner child failed:\n{proc.stderr[-3000:]}")
            runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        H.progress_done()
        own = {name: r["peak_bytes"] - r["before_bytes"] for name, r in runs.items()}
        ratios, extra = [], {"hidden": a.hidden, "chunk_size": a.chunk_size,
                             "rss_before_call_bytes": {k: r["before_bytes"]
                                                       for k, r in runs.items()}}
        for whole, chunked in ((JOINER_IMPLS[0], JOINER_IMPLS[1]),
                               (JOINER_IMPLS[2], JOINER_IMPLS[3])):
            if whole not in runs:
                continue
            base, ours = runs[whole], runs[chunked]
            per = [b / c for b, c in zip(ours["seconds"], base["seconds"])]
            ratios.append({"num": chunked, "den": whole, "median": statistics.median(per),
                           "q25": min(per), "q75": max(per), "min": min(per), "max": max(per),
                           "rounds": per})
            extra[f"peak_rss_ratio {whole.split()[0]}"] = base["peak_bytes"] / ours["peak_bytes"]
            extra[f"own_peak_ratio {whole.split()[0]}"] = own[whole] / max(own[chunked], 1)
            for name, r in ((whole, base), (chunked, ours)):
                rows.append([H.format_size(size), name,
                             H.fmt_ms(1e3 * statistics.median(r["seconds"])),
                             f"{r['peak_bytes'] / 2**20:.0f}", f"{own[name] / 2**20:.0f}",
                             f"{r['loss']:.6g}"])
            rows.append([H.format_size(size), f"{whole.split()[0]}: from_joiner / whole",
                         f"{ratios[-1]['median']:.2f}x",
                         f"1/{base['peak_bytes'] / ours['peak_bytes']:.2f}",
                         f"1/{own[whole] / max(own[chunked], 1):.2f}", ""])
        impls = {name: {"median_ms": 1e3 * statistics.median(r["seconds"]),
                        "rounds_ms": [1e3 * x for x in r["seconds"]],
                        "peak_rss_bytes": r["peak_bytes"], "loss": r["loss"]}
                 for name, r in runs.items()}
        results.append({"size": list(size), "case": "joiner", "impls": impls, "ratios": ratios,
                        "extra": extra})
    text = (f"RNN-T from a joiner Linear({a.hidden}, V)(tanh(enc + pred)), float32, fwd+bwd "
            f"w.r.t. joiner parameters, enc, pred; median ms over {a.rounds} calls in one fresh "
            f"process per implementation; peak RSS of that process, and the calls' own peak "
            f"(peak RSS - RSS before the first call, inputs allocated)\n\n")
    text += H.table(["N,T,U,V", "implementation", "ms", "peak RSS MiB", "calls' own MiB",
                     "loss"], rows)
    H.emit(a, results, text)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--joiner-child"]:
        k, size, hidden, rounds, chunk = argv[1:6]
        joiner_child(int(k), *(int(x) for x in size.split(",")), int(hidden), int(rounds),
                     None if chunk == "None" else int(chunk))
        return
    ap = H.parser(__doc__, names="N,T,U,V", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                  rounds=5, threads=None,
                  threads_help="threads for torch, numba and XLA (default: all cores)")
    ap.add_argument("--thp", action="store_true",
                    help="set THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator asks for "
                         "transparent huge pages: far fewer page faults on fresh GB buffers)")
    ap.add_argument("--skip", nargs="*", default=(),
                    choices=("duoloss_jax", "jax_scan", "jax_diag", "warprnnt"))
    ap.add_argument("--joiner", action="store_true",
                    help="time rnnt_loss_from_joiner against rnnt_loss on the whole joiner "
                         "output instead (peak memory per implementation in a fresh process)")
    ap.add_argument("--hidden", type=int, default=64, help="--joiner: the joiner's width H")
    ap.add_argument("--joiner-frameworks", default="torch,jax",
                    help="--joiner: which frontends to time (default torch,jax)")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="--joiner: rnnt_loss_from_joiner's chunk_size (default: its own)")
    a = H.finish_args(ap.parse_args(argv), "rnnt")
    a.sizes_given = any(x == "--sizes" or x.startswith("--sizes=") for x in argv)
    if a.joiner:
        if not any(x == "--rounds" or x.startswith("--rounds=") for x in argv):
            a.rounds = 2 if a.quick else 3
        return joiner_main(a)
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
