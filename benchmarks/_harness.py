"""The one harness behind every script in ``benchmarks/`` (private: the scripts are the
entry points).

What every script shares:

* one command line (:func:`parser`): ``--sizes``, ``--rounds``, ``--threads``, ``--json``,
  ``--quick``;
* one paired-rounds timer (:func:`paired`): warm-up, then rounds in which every
  implementation runs once (or one block of calls) in rotating order; a ratio is the median
  over rounds of the per-round ratio, so drifting load on a shared machine cancels;
* progress on stderr (``[size 2/3] duoloss.jax round 4/7``);
* one table printer (:func:`table`) and one JSON writer (:func:`write_json`).

``--sizes`` has one syntax in every script: comma-separated integers per size, sizes
separated by ``;`` (quote it in a shell), e.g. ``--sizes "8,200,30,40;32,500,50,100"``.
What the integers mean (``B,T,C,L`` or ``N,T,U,V``) is in each script's ``--help``.

JSON (``--json PATH``; default ``benchmarks/results/<script>-<UTC time>.json``, ``--json ''``
writes none): ``{"schema": 1, "script", "date", "argv", "args", "machine": {...},
"results": [{"size", "case", "impls": {name: {"median_ms", "rounds_ms", ...}},
"ratios": [{"num", "den", "median", "q25", "q75", "min", "max", "rounds"}], "extra"}],
"table"}``.  ``machine`` records the CPU count, load average, numba's threading layer and
thread count, the versions of python, numpy, numba, torch, jax, jaxlib and optax, and which
duoloss ran (``duoloss_path``, ``git_commit``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time

#: The repository root (so that scripts and their child processes time this checkout).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
SIZES_HELP = ("sizes as comma-separated integers, several separated by ';' "
              "(quote it in a shell): e.g. \"{example}\"; default: \"{default}\"")


def synthetic_inputs(b, t, c, l):
    """The loss benchmarks' synthetic batch (seed 0): ``(rng, x, log_probs, targets,
    input_lengths, target_lengths, transitions)``; ``x`` is ``(T, B, C)`` float32 logits,
    ``log_probs`` their float32 log-softmax, and ``rng`` the generator, positioned after
    these draws, for any further inputs a script needs."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, b, c)).astype(np.float32)
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = rng.integers(1, c, (b, l))
    il = np.full(b, t)
    tl = np.full(b, l)
    tr = (0.5 * rng.standard_normal((c, c))).astype(np.float32)
    return rng, x, lp, tg, il, tl, tr


def parse_sizes(text, names):
    """``"8,200,30,40;1,50,20,10"`` -> ``[(8, 200, 30, 40), (1, 50, 20, 10)]``.

    Raises ``argparse.ArgumentTypeError`` when a size does not have ``len(names)`` positive
    integers.
    """
    n = len(names.split(","))
    sizes = []
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        try:
            size = tuple(int(v) for v in item.split(","))
        except ValueError:
            size = ()
        if len(size) != n or min(size) < 0:
            raise argparse.ArgumentTypeError(
                f"--sizes: expected {n} non-negative integers {names} per size, "
                f"sizes separated by ';'; got {item!r}")
        sizes.append(size)
    if not sizes:
        raise argparse.ArgumentTypeError(f"--sizes: no size in {text!r}")
    return sizes


def format_size(size):
    return ",".join(str(v) for v in size)


def parser(doc, *, names, sizes, quick_sizes, rounds, quick_rounds=2, threads=None,
           threads_help="threads for torch and numba (default: the libraries' own)"):
    """The common command line; scripts add their own flags to the returned parser.

    ``doc`` is the script's module docstring (the ``--help`` description); ``names`` says
    what a size's integers are (``"B,T,C,L"``); ``sizes``/``quick_sizes`` are lists of
    tuples (the default and ``--quick`` grids); ``rounds``/``quick_rounds`` likewise.
    After ``parse_args``, call :func:`finish_args`.
    """
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(_names=names, _sizes=list(sizes), _quick_sizes=list(quick_sizes),
                   _rounds=rounds, _quick_rounds=quick_rounds)
    default = ";".join(format_size(s) for s in sizes)
    p.add_argument("--sizes", default=None, metavar=names + "[;...]",
                   help=SIZES_HELP.format(example=format_size(sizes[0]), default=default))
    p.add_argument("--rounds", type=int, default=None,
                   help=f"timed rounds (default {rounds}; --quick: {quick_rounds})")
    p.add_argument("--threads", type=int, default=threads, help=threads_help)
    p.add_argument("--json", default=None, metavar="PATH",
                   help="where to write the JSON results (default: "
                        "benchmarks/results/<script>-<UTC time>.json; '' for none)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny smoke configuration: tiny sizes, few rounds")
    return p


def finish_args(args, script):
    """Resolve ``--sizes``/``--rounds``/``--quick``/``--json`` into ``args.sizes`` (tuples),
    ``args.rounds`` and ``args.json``; remember the script's name."""
    if args.sizes is not None:
        try:
            args.sizes = parse_sizes(args.sizes, args._names)
        except argparse.ArgumentTypeError as exc:
            raise SystemExit(f"{script}: {exc}") from None
    else:
        args.sizes = args._quick_sizes if args.quick else args._sizes
    if args.rounds is None:
        args.rounds = args._quick_rounds if args.quick else args._rounds
    if args.rounds < 1:
        raise SystemExit(f"{script}: --rounds must be >= 1, got {args.rounds}")
    if args.json is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        args.json = os.path.join(RESULTS_DIR, f"{script}-{stamp}.json")
    args.script = script
    return args


def child_env(**extra):
    """Environment for a child Python process that imports this checkout's duoloss."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def progress(msg):
    """One progress line on stderr (overwritten in place on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + msg)
    else:
        sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def progress_done():
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


class Timing:
    """Per-round times (ms) of several implementations measured by :func:`paired`."""

    def __init__(self, rounds_ms, calls):
        self.rounds_ms = rounds_ms
        self.calls = calls

    def median(self, name):
        return statistics.median(self.rounds_ms[name])

    def medians(self):
        return {k: self.median(k) for k in self.rounds_ms}

    def ratio(self, num, den):
        """Median over rounds of ``num / den``, with its spread (see :func:`ratio_stats`)."""
        return ratio_stats(num, den, self.rounds_ms[num], self.rounds_ms[den])

    def impls(self):
        return {k: {"median_ms": self.median(k), "rounds_ms": v, "calls_per_round": self.calls[k]}
                for k, v in self.rounds_ms.items()}


def ratio_stats(num, den, a, b):
    """Per-round ratios ``a[i] / b[i]``: median, quartiles, min and max."""
    r = sorted(x / y for x, y in zip(a, b))
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    return {"num": num, "den": den, "median": statistics.median(r), "q25": q[0], "q75": q[2],
            "min": r[0], "max": r[-1], "rounds": len(r)}


def paired(fns, rounds, *, warmup=1, block_s=0.0, label=""):
    """Time ``fns`` (name -> callable) in paired rounds.

    Every function is first called ``warmup`` times (compiles, caches).  With
    ``block_s > 0`` it is called once more to size its block: a round calls it
    ``block_s / (time per call)`` times in a row (1 to 200) and records the block's
    median; with ``block_s = 0`` (the default) a round calls it once.  Each of the
    ``rounds`` rounds runs every function's block, in an order
    rotated by one each round, so that no function always runs right after the same other.
    Blocks rather than single calls where libraries keep worker threads spinning after a
    call (OpenMP's wait policy): the next call of the *other* library would pay for it,
    which no training loop does.

    Returns a :class:`Timing`; its ratios are medians over rounds of per-round ratios, so
    that both sides of a ratio see the same machine load.
    """
    names = list(fns)
    calls = {}
    for k in names:
        progress(f"{label}{k} warm-up")
        for _ in range(warmup):
            fns[k]()
        calls[k] = 1
        if block_s:
            t0 = time.perf_counter()
            fns[k]()  # warm now: the block length comes from a warm call
            per_call = time.perf_counter() - t0
            calls[k] = max(1, min(200, int(block_s / max(per_call, 1e-9))))
    per = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            progress(f"{label}{k} round {r + 1}/{rounds}")
            ts = []
            for _ in range(calls[k]):
                t0 = time.perf_counter()
                fns[k]()
                ts.append(1e3 * (time.perf_counter() - t0))
            per[k].append(statistics.median(ts))
    progress_done()
    return Timing(per, calls)


def size_label(i, n):
    return f"[size {i + 1}/{n}] "


def fmt_ms(ms):
    if ms is None or ms != ms:
        return "n/a"
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}"


def fmt_ratio(r):
    """``0.42x (0.40-0.45)``: median ratio and the rounds' interquartile range."""
    if r is None:
        return "n/a"
    return f"{r['median']:.2f}x ({r['q25']:.2f}-{r['q75']:.2f})"


def table(headers, rows, align=None):
    """A Markdown table as a string; ``align`` is a string of ``l``/``r`` per column
    (default: first column left, the rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    rows = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _version(dist):
    """Installed version of a distribution, without importing it (None if absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info():
    """CPU count, load, duoloss's batch threads (and numba's layer), library versions."""
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    for mod in ("numpy", "numba", "torch", "jax", "jaxlib", "optax"):
        info[mod] = _version(mod)
    try:
        import duoloss

        info["duoloss"] = getattr(duoloss, "__version__", None)
        info["duoloss_path"] = os.path.dirname(os.path.abspath(duoloss.__file__))
    except Exception:
        info["duoloss"] = info["duoloss_path"] = None
    try:
        info["git_commit"] = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True, timeout=10).stdout.strip() or None
    except Exception:
        info["git_commit"] = None
    try:
        from duoloss.core import _pool, threading_layer

        # duoloss's batch threads (NUMBA_NUM_THREADS; numba's own layer stays unstarted)
        info["numba_num_threads"] = _pool.num_threads()
        info["numba_threading_layer"] = threading_layer()
    except Exception:
        info.setdefault("numba_num_threads", None)
        info["numba_threading_layer"] = None
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def result(size, timing=None, *, case=None, ratios=(), impls=None, extra=None):
    """One entry of the JSON's ``results``: a size (and optional case label), the
    implementations' timings, ratios with spread, and extra columns."""
    out = {"size": list(size) if size is not None else None, "case": case,
           "impls": dict(impls or {}), "ratios": list(ratios), "extra": dict(extra or {})}
    if timing is not None:
        out["impls"].update(timing.impls())
    return out


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        return v.item()
    if isinstance(v, float) and v != v:
        return None
    return v


def write_json(args, results, text):
    """Write the run's JSON (see the module docstring) to ``args.json``; say where on stderr."""
    if not args.json:
        return None
    args_out = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    doc = {"schema": 1, "script": args.script,
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "argv": sys.argv[1:], "args": args_out, "machine": machine_info(),
           "results": results, "table": text}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(_jsonable(doc), f, indent=1)
        f.write("\n")
    print(f"# JSON written to {args.json}", file=sys.stderr)
    return args.json


def emit(args, results, text):
    """Print the table (stdout) and write the JSON beside it."""
    print(text, flush=True)
    write_json(args, results, text)
