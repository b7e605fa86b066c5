"""duoloss's batch threads: CTC and ASG (fwd+bwd) on 1 thread against its thread pool.

A large batch runs on a pool of Python threads over one nogil kernel
(``duoloss.core._pool``); ``NUMBA_NUM_THREADS`` sets how many.  Every thread count
runs in its own worker process; the workers take turns on each case, round after
round, so that load from other jobs falls on all of them alike.  For each setting
and size this prints the median milliseconds of one core call (forward + backward,
float32) from a single Python thread, and the wall time per call when 4 Python
threads call at once, plus whether a forked child can still run a threaded batch
after the parent did (``fork ok``; a killed or hung child reads ``no``).

    python benchmarks/threads.py                          # 1 and 2 threads, default sizes
    python benchmarks/threads.py --thread-counts 1,2,4 --sizes 8,200,30,40 --rounds 3
    python -m benchmarks.threads --quick                  # a smoke run

Sizes are ``B,T,C,L`` (batch, frames, classes, target length).  Ratios to the
first setting are medians over rounds of the per-round ratio (interquartile range
in brackets); a round's time is the median of its calls.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time


if __package__ in (None, ""):  # ``python benchmarks/threads.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(8, 200, 30, 40), (32, 500, 50, 100)]
QUICK_SIZES = [(4, 200, 12, 25)]  # above the core's serial cut-off: a threaded batch


def _inputs(b, t, c, l):
    return H.synthetic_inputs(b, t, c, l)[1:]


def _kernels(size):
    from duoloss.core import asg_loss_and_grad, ctc_loss_and_grad

    x, lp, tg, il, tl, tr = _inputs(*size)
    return {
        "ctc": lambda: ctc_loss_and_grad(lp, tg, il, tl),
        "asg": lambda: asg_loss_and_grad(x, tr, tg, il, tl),
    }


def _single(fn, calls):
    """Milliseconds of each of ``calls`` back-to-back calls from one thread."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def _concurrent(fn, callers, calls):
    """Wall milliseconds per call while ``callers`` Python threads each make ``calls`` calls."""
    barrier = threading.Barrier(callers + 1)

    def work():
        barrier.wait()
        for _ in range(calls):
            fn()

    threads = [threading.Thread(target=work) for _ in range(callers)]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    return [1e3 * (time.perf_counter() - t0) / (callers * calls)]


def _quiet(fn):
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the child's error (or numba's "Terminating: ...") is expected
    fn()


def _child_runs_kernel(fn, timeout):
    """Fork; the child runs ``fn``.  True if it exits cleanly within ``timeout`` s."""
    proc = multiprocessing.get_context("fork").Process(target=_quiet, args=(fn,))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return False
    return proc.exitcode == 0


def _worker(fork_timeout):
    """Serve timing requests (one JSON line each on stdin) with this process's threads."""
    from duoloss.core import _pool

    kernels = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "hello":
            out = {"threads": _pool.num_threads()}
        elif req["op"] == "fork":
            fn = next(iter(kernels.values()))
            out = {"fork_ok": _child_runs_kernel(fn, fork_timeout)}
        else:
            size = tuple(req["size"])
            if size not in kernels:
                for name, fn in _kernels(size).items():
                    fn()  # compile or load from the cache; start the thread pool
                    kernels[size, name] = fn
            fn = kernels[size, req["kernel"]]
            fn()
            callers, calls = req["callers"], req["calls"]
            out = {"ms": _single(fn, calls) if callers == 1 else _concurrent(fn, callers, calls)}
            out["threads"] = _pool.num_threads()
        print(json.dumps(out), flush=True)


class _Worker:
    """A long-lived worker process with one thread count (``NUMBA_NUM_THREADS``)."""

    def __init__(self, threads, args):
        # Time this checkout's duoloss, not whichever one is installed.
        env = H.child_env(NUMBA_NUM_THREADS=threads)
        self.name = f"{threads} thread" + ("s" if int(threads) > 1 else "")
        self.loaded = None
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker",
             "--fork-timeout", str(args.fork_timeout)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker died (see its stderr above)")
        out = json.loads(line)
        self.loaded = out.get("threads") or self.loaded
        return out

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=5)
    p.add_argument("--thread-counts", default="1,2",
                   help="NUMBA_NUM_THREADS of each worker (default 1,2)")
    p.add_argument("--callers", default="1,4", help="numbers of concurrent Python threads")
    p.add_argument("--calls", type=int, default=None,
                   help="calls per caller per round (default 10; --quick: 2)")
    p.add_argument("--fork-timeout", type=float, default=60.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.fork_timeout)
        return
    args = H.finish_args(args, "threads")
    if args.calls is None:
        args.calls = 2 if args.quick else 10
    sizes = args.sizes
    callers = [int(v) for v in args.callers.split(",")]
    cases = [(size, kernel, c) for size in sizes for kernel in ("ctc", "asg") for c in callers]

    layers = [_Worker(k, args) for k in args.thread_counts.split(",")]
    times = {(layer.name, case): [] for layer in layers for case in cases}  # every call
    rounds = {(layer.name, case): [] for layer in layers for case in cases}  # round medians
    try:
        for layer in layers:
            layer.ask(op="hello")
        for r in range(args.rounds):
            for case in cases:
                # Every worker in turn on the same case, in rotating order, so that
                # the other jobs on a shared machine hit all of them alike.
                for layer in layers[r % len(layers):] + layers[:r % len(layers)]:
                    size, kernel, c = case
                    H.progress(f"[size {sizes.index(size) + 1}/{len(sizes)}] {layer.name} "
                               f"{kernel} {c} caller(s) round {r + 1}/{args.rounds}")
                    out = layer.ask(op="time", size=size, kernel=kernel, callers=c,
                                    calls=args.calls)
                    times[layer.name, case] += out["ms"]
                    rounds[layer.name, case].append(statistics.median(out["ms"]))
        H.progress("fork check")
        fork_ok = {layer.name: layer.ask(op="fork")["fork_ok"] for layer in layers}
        H.progress_done()
    finally:
        for layer in layers:
            layer.close()

    base = layers[0].name
    cols = ["1 caller" if c == 1 else f"{c} callers" for c in callers]
    rows, results = [], []
    for size in sizes:
        for kernel in ("ctc", "asg"):
            impls, ratios = {}, []
            for layer in layers:
                cells = []
                for c in callers:
                    case = (size, kernel, c)
                    ms = statistics.median(times[layer.name, case])
                    r = H.ratio_stats(f"{layer.name}, {c} callers", f"{base}, {c} callers",
                                      rounds[layer.name, case], rounds[base, case])
                    impls[f"{layer.name}, {c} callers"] = {
                        "median_ms": ms, "rounds_ms": rounds[layer.name, case],
                        "calls_per_round": args.calls * c, "threads": layer.loaded}
                    ratios.append(r)
                    cells.append(f"{ms:.2f} ({r['median']:.2f}x)")
                rows.append([f"{kernel} ({H.format_size(size)})", layer.name] + cells
                            + ["yes" if fork_ok[layer.name] else "no"])
            results.append(H.result(size, case=kernel, impls=impls, ratios=ratios, extra={
                "fork_ok": fork_ok, "threads": {la.name: la.loaded for la in layers}}))
    text = (f"duoloss's batch threads (NUMBA_NUM_THREADS per worker), float32 fwd+bwd, "
            f"median ms per call over {args.rounds} interleaved rounds (ratio to {base}: median "
            f"of per-round ratios); N callers: wall time / calls with N Python threads calling "
            f"at once\n\n"
            + H.table(["kernel (B,T,C,L)", "threads"] + cols + ["fork ok"], rows,
                      align="ll" + "r" * len(cols) + "l"))
    H.emit(args, results, text)


if __name__ == "__main__":
    main()
