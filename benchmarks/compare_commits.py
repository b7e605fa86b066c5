"""CTC training-step time of this checkout against an earlier commit, paired and alternating.

A regression guard: the step of ``benchmarks/ctc.py`` (logits -> log_softmax ->
``ctc_loss`` -> backward to the logits; JAX: ``optax_ctc_loss`` under
``jax.jit(jax.value_and_grad(...))``), float32, timed for two source trees in the
same environment (same Python, torch, JAX, numba):

* ``old``: the commit named by ``--base`` (default ``a88fa4c``, the previous release
  of the host path), exported with ``git archive`` into a temporary directory (the
  repository, its index and its worktree list are not touched);
* ``new``: this checkout as it is on disk (uncommitted changes included).

Each tree gets its own numba cache (``NUMBA_CACHE_DIR``), warmed by one untimed
process first.  Then fresh processes alternate, ``old, new, new, old, old, new, ...``
(``--rounds`` pairs, each pair's order flipped), each importing its tree
(``PYTHONPATH``), warming every step up and timing many calls of each size and
framework.  Reported per size and framework: the median over processes of each
process's median ms per call, the smallest per-call time seen, and ``new/old``, the
median over pairs of the pair's ratio of medians (with its smallest and largest); the
same for the process's CPU time per call (``time.process_time``, all its threads),
which other jobs' load on a shared machine does not inflate.

It measures *relative* cost: on a shared machine absolute times drift with the load,
which the alternation, the pairing and the medians cancel; compare ratios, and
rerun (``--repeat 2`` does it in reverse order) before trusting a few percent.

    python benchmarks/compare_commits.py                  # a88fa4c vs this checkout
    python benchmarks/compare_commits.py --base a88fa4c --rounds 8 --repeat 2
    python benchmarks/compare_commits.py --frameworks torch --sizes "8,200,30,40"
    python benchmarks/compare_commits.py --quick          # a smoke run (tiny size)

Sizes are ``B,T,C,L`` (batch, frames, classes with the blank, target length).

``--frameworks rnnt`` times instead ``duoloss.torch.rnnt_loss`` (float32 joiner logits
``(N, T, U + 1, V)``, ``reduction='sum'``, forward and backward to the logits: the host
path's full step), with ``--sizes`` read as ``N,T,U,V``:

    python benchmarks/compare_commits.py --base 6ae7f56 --frameworks rnnt \
        --sizes "32,150,40,28;16,300,60,256"
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # ``python benchmarks/compare_commits.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(1, 50, 20, 10), (8, 200, 30, 40), (32, 500, 50, 100)]
QUICK_SIZES = [(2, 30, 10, 5)]
FRAMEWORKS = ("torch", "jax", "rnnt")

# One timing process: argv = JSON {"sizes", "frameworks", "threads", "budget_s", "min_calls",
# "warmup_s"};
# prints one JSON line {"torch": {"B,T,C,L": {"wall": [ms, ...], "cpu": [ms, ...]}}, "jax": ...,
# "duoloss": path}: per call, wall-clock ms and the process's CPU ms (all its threads).
CHILD = r'''
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
out = {"duoloss": None}

def per_call(step, budget_s, min_calls, max_calls=2000):
    t_end = time.perf_counter() + cfg["warmup_s"]  # (a new process runs slow at first)
    for i in range(100000):
        step()
        if i >= 2 and time.perf_counter() > t_end:
            break
    times, cpu = [], []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_calls or (time.perf_counter() < t_end and len(times) < max_calls):
        c0 = time.process_time()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return {"wall": times, "cpu": cpu}

def data(b, t, c, l):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(b, t, c)).astype(np.float32)
    labels = rng.integers(1, c, size=(b, l)).astype(np.int32)
    return logits, labels

for fw in cfg["frameworks"]:
    res = out[fw] = {}
    if fw == "torch":
        import torch
        import duoloss.torch as dt
        torch.set_num_threads(cfg["threads"])
        out["duoloss"] = dt.__file__
        for b, t, c, l in cfg["sizes"]:
            logits, labels = data(b, t, c, l)
            x = torch.tensor(logits.transpose(1, 0, 2).copy(), requires_grad=True)
            tg = torch.from_numpy(labels.astype(np.int64))
            il = torch.full((b,), t, dtype=torch.int64)
            tl = torch.full((b,), l, dtype=torch.int64)

            def step():
                x.grad = None
                loss = dt.ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="sum")
                loss.backward()
                return loss.item()

            res["%d,%d,%d,%d" % (b, t, c, l)] = per_call(step, cfg["budget_s"], cfg["min_calls"])
    elif fw == "rnnt":  # sizes are N,T,U,V
        import torch
        import duoloss.torch as dt
        torch.set_num_threads(cfg["threads"])
        out["duoloss"] = dt.__file__
        for n, t, u, v in cfg["sizes"]:
            rng = np.random.default_rng(0)
            x = torch.tensor(rng.normal(size=(n, t, u + 1, v)).astype(np.float32),
                             requires_grad=True)
            tg = torch.from_numpy(rng.integers(1, v, size=(n, u)).astype(np.int32))
            il = torch.full((n,), t, dtype=torch.int32)
            tl = torch.full((n,), u, dtype=torch.int32)

            def step():
                x.grad = None
                loss = dt.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum")
                loss.backward()
                return loss.item()

            res["%d,%d,%d,%d" % (n, t, u, v)] = per_call(step, cfg["budget_s"], cfg["min_calls"])
    else:
        import jax
        import duoloss.jax as dj
        out["duoloss"] = dj.__file__
        for b, t, c, l in cfg["sizes"]:
            logits, labels = data(b, t, c, l)
            lpad = np.zeros((b, t), np.float32)
            labpad = np.zeros((b, l), np.float32)
            z = jax.numpy.asarray(logits)
            vg = jax.jit(jax.value_and_grad(
                lambda q: dj.optax_ctc_loss(q, lpad, labels, labpad).sum()))

            def step():
                v, g = vg(z)
                g.block_until_ready()
                return float(v)

            res["%d,%d,%d,%d" % (b, t, c, l)] = per_call(step, cfg["budget_s"], cfg["min_calls"])
print("RESULT " + json.dumps(out))
'''


def export_tree(commit: str, dest: str) -> str:
    """``commit``'s files (``git archive``) under ``dest``; returns its full hash."""
    full = subprocess.run(["git", "-C", H.ROOT, "rev-parse", "--verify", commit + "^{commit}"],
                          capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"compare_commits: argument '--base': not a commit: {commit!r}")
    os.makedirs(dest)
    archive = subprocess.Popen(["git", "-C", H.ROOT, "archive", "--format=tar", commit],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"compare_commits: git archive {commit} failed")
    return full.stdout.strip()


def run_child(tree: str, cache: str, cfg: dict, threads: int) -> dict:
    """One fresh process timing ``tree``; its parsed result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)
    env["NUMBA_CACHE_DIR"] = cache
    env["NUMBA_NUM_THREADS"] = str(threads)
    env["DUOLOSS_QUIET_COMPILE"] = "1"
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], env=env,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((s for s in proc.stdout.splitlines() if s.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"compare_commits: the timing process for {tree} failed:\n"
                         f"{proc.stderr[-3000:]}")
    out = json.loads(line[len("RESULT "):])
    where = out.pop("duoloss")
    if not os.path.realpath(where).startswith(os.path.realpath(tree)):
        raise SystemExit(f"compare_commits: the process for {tree} imported duoloss from "
                         f"{where} (is duoloss installed non-editable?)")
    return out


def summarise(runs, frameworks, sizes):
    """Rows of the table and JSON results from ``runs`` = [(old, new), ...] per pair."""
    rows, results = [], []
    med = statistics.median
    for fw in frameworks:
        for size in sizes:
            key = H.format_size(size)
            stats = {}
            for kind in ("wall", "cpu"):
                per = {k: [med(r[i][fw][key][kind]) for r in runs]
                       for i, k in enumerate(("old", "new"))}
                low = {k: min(min(r[i][fw][key][kind]) for r in runs)
                       for i, k in enumerate(("old", "new"))}
                ratios = [n / o if o > 0 else float("nan") for o, n in zip(per["old"], per["new"])]
                stats[kind] = (per, low, ratios)
            (w, wl, wr), (c, _, cr) = stats["wall"], stats["cpu"]
            rows.append([fw, key, f"{med(w['old']):.3f}", f"{wl['old']:.3f}",
                         f"{med(w['new']):.3f}", f"{wl['new']:.3f}",
                         f"{med(wr):.2f} ({min(wr):.2f}-{max(wr):.2f})",
                         f"{med(c['old']):.3f}", f"{med(c['new']):.3f}",
                         f"{med(cr):.2f} ({min(cr):.2f}-{max(cr):.2f})"])
            results.append(H.result(size, case=fw, extra={
                "old_median_ms": med(w["old"]), "old_min_ms": wl["old"],
                "new_median_ms": med(w["new"]), "new_min_ms": wl["new"],
                "ratio_new_old": med(wr), "pair_ratios": wr,
                "old_process_medians_ms": w["old"], "new_process_medians_ms": w["new"],
                "old_cpu_median_ms": med(c["old"]), "new_cpu_median_ms": med(c["new"]),
                "cpu_ratio_new_old": med(cr), "cpu_pair_ratios": cr}))
    return rows, results


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,L", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=6, quick_rounds=1, threads=2,
                 threads_help="torch and numba threads (default 2)")
    p.add_argument("--base", default="a88fa4c", help="the earlier commit (default a88fa4c)")
    p.add_argument("--frameworks", default="torch,jax",
                   help="comma-separated: torch, jax (CTC), rnnt (torch rnnt_loss, sizes "
                      "N,T,U,V) (default torch,jax)")
    p.add_argument("--budget", type=float, default=0.6,
                   help="seconds of timed calls per size and framework in each process "
                        "(default 0.6; at least --min-calls calls)")
    p.add_argument("--min-calls", type=int, default=10)
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of untimed calls per size and framework in each process "
                        "before timing (default 1.0; at least 3 calls)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure the whole comparison this many times, each in the "
                        "reverse order of the last (default 1)")
    args = H.finish_args(p.parse_args(argv), "compare_commits")
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    bad = [f for f in frameworks if f not in FRAMEWORKS]
    if bad or not frameworks:
        raise SystemExit(f"compare_commits: argument '--frameworks' must name torch, jax "
                         f"and/or rnnt, got {args.frameworks!r}")
    if args.quick:
        args.budget, args.min_calls, args.warmup = 0.05, 3, 0.0
    cfg = {"sizes": [list(s) for s in args.sizes], "frameworks": frameworks,
           "threads": args.threads, "budget_s": args.budget, "min_calls": args.min_calls,
           "warmup_s": args.warmup}
    tmp = tempfile.mkdtemp(prefix="duoloss-compare-")
    try:
        base = export_tree(args.base, os.path.join(tmp, "old"))
        trees = {"old": os.path.join(tmp, "old"), "new": H.ROOT}
        caches = {k: os.path.join(tmp, "numba-cache-" + k) for k in trees}
        for k in ("old", "new"):  # compile and cache every kernel once, untimed
            H.progress(f"warming {k} ({trees[k]})")
            run_child(trees[k], caches[k], dict(cfg, budget_s=0.0, min_calls=1, warmup_s=0.0),
                      args.threads)
        texts, results = [], []
        first = "old"
        for rep in range(args.repeat):
            runs = []
            for r in range(args.rounds):
                order = ("old", "new") if (r % 2 == 0) == (first == "old") else ("new", "old")
                pair = {}
                for k in order:
                    H.progress(f"measurement {rep + 1}/{args.repeat}: round {r + 1}/"
                               f"{args.rounds} {k}")
                    pair[k] = run_child(trees[k], caches[k], cfg, args.threads)
                runs.append((pair["old"], pair["new"]))
            H.progress_done()
            rows, res = summarise(runs, frameworks, args.sizes)
            for x in res:
                x["extra"]["measurement"] = rep + 1
                x["extra"]["first"] = first
            results += res
            texts.append(
                f"measurement {rep + 1} (pairs alternate, starting with {first}):\n\n"
                + H.table(["framework", "N,T,U,V" if frameworks == ["rnnt"] else "B,T,C,L",
                           "old median ms", "old min",
                           "new median ms", "new min", "new/old (range)", "old CPU ms",
                           "new CPU ms", "CPU new/old (range)"], rows))
            first = "new" if first == "old" else "old"
        what = ("RNN-T step (rnnt_loss on joiner logits, sum, -> backward; sizes N,T,U,V)"
                if frameworks == ["rnnt"] else
                "CTC step (logits -> log_softmax -> ctc_loss -> backward; JAX: "
                "jit(value_and_grad))")
        text = (f"{what}, float32, {args.threads} threads; old = {args.base} "
                f"({base[:10]}), new = {H.ROOT} (working tree); {args.rounds} alternating "
                f"pairs of fresh processes; median = median over processes of each process's "
                f"median per call; new/old = median over pairs of the pair's ratio; CPU ms = the "
                f"process's CPU time per call (all threads: robust to other jobs' load, "
                f"counts spinning threads)\n\n"
                + "\n\n".join(texts))
        H.emit(args, results, text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
