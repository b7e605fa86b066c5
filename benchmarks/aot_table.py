"""Ahead-of-time compile table of the torch device path's Triton kernels (no GPU needed).

Every kernel variant the launchers produce for a table of representative shapes (CTC
``(N, T, C, S) = (32, 500, 50, S)`` with ``S`` up to 4000, i.e. every ``BLOCK`` from 2
to 8192; RNN-T ``(32, 150, U, 28)`` with ``U`` up to 2000, regular and modified;
``rnnt_loss``'s fused kernels for ``(U, V)`` up to ``(1000, 8000)``; the fused TDT and
multi-blank kernels with 1 to 8 durations and ``U`` up to 2047;
float32 and float64; with and without gradient) is compiled for sm_80
and sm_90 with the ``ptxas`` inside the Triton wheel (`duoloss.torch._triton._aot`),
and one row per variant gives registers, spills, stack, shared memory, warps and how many
pointer offsets are 32- and 64-bit.  The checks that ``tests/test_aot_compile.py`` runs
on a subset are applied to every row: no spill at ``BLOCK <= 2048``; no 32-bit scalar
pointer offset (per-sequence and per-frame bases are 64-bit, so no tensor's size is
limited to 2**31 elements; vector offsets within a row stay 32-bit).

    python -m benchmarks.aot_table                      # the full table (minutes)
    python -m benchmarks.aot_table --subset             # the test's subset
    python -m benchmarks.aot_table --markdown docs/aot.md --json out.json

Run it with ``TRITON_INTERPRET`` unset.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Tuple

CTC_S = (0, 1, 3, 7, 15, 31, 63, 100, 250, 500, 1000, 2000, 4000)
RNNT_U = (1, 3, 7, 15, 28, 63, 127, 255, 511, 1000, 2000)
#: rnnt_loss's fused kernels: (U, V) with the class block from 2 to 2048 (chunked above)
RNNT_LOSS = ((1, 2), (40, 28), (60, 256), (100, 500), (255, 1024), (1000, 8000), (2000, 28))
#: the fused tdt_loss / multiblank_rnnt_loss kernels: (family, U, V, durations)
DUR = (("tdt", 40, 28, (0, 1, 2, 3, 4)), ("tdt", 127, 28, (1, 2, 3, 4, 5, 6, 7, 8)),
       ("tdt", 1023, 28, (0, 1, 2)), ("tdt", 2047, 1024, (0, 1, 2, 3, 4, 5, 6, 7)),
       ("multiblank", 40, 500, (2, 4, 8)), ("multiblank", 1023, 28, (2,)))
CAPABILITIES = (80, 90)

# the test's subset: (family, shape parameter, dtype name, grad, extra); the duration
# rows span BLOCK 64 to 2048, 1 to 8 durations, float32 and float64, grad and no grad
SUBSET = (("ctc", 100, "float32", True, None), ("ctc", 1000, "float32", True, None),
          ("ctc_split", 100, "float32", True, None), ("ctc_split", 1000, "float64", True, None),
          ("ctc", 20, "float64", True, None), ("ctc", 100, "bfloat16", True, None),
          ("rnnt", 28, "float32", True, False), ("rnnt", 1000, "float64", True, True),
          ("rnnt_loss", 40, "float32", True, 28), ("rnnt_loss", 100, "float64", True, 500),
          ("rnnt_loss", 1000, "bfloat16", True, 8000),
          ("dur", 127, "float64", True, ("tdt", 28, (1, 2, 3, 4, 5, 6, 7, 8))),
          ("dur", 40, "float32", True, ("multiblank", 500, (2, 4, 8))),
          ("dur", 1023, "float32", False, ("tdt", 28, (1, 2))),
          ("dur", 2047, "float64", True, ("tdt", 28, (0, 1, 2, 3, 4))))


def cases(subset: bool = False) -> List[tuple]:
    """``(family, size parameter, dtype name, grad, extra)`` rows of the table."""
    if subset:
        return list(SUBSET)
    out = [("ctc", s, "bfloat16", True, None) for s in (31, 100, 1000)]
    for dt in ("float32", "float64"):
        for grad in (True, False):
            out += [("ctc", s, dt, grad, None) for s in CTC_S]
            out += [("ctc_split", s, dt, grad, None) for s in CTC_S]
            out += [("rnnt", u, dt, grad, m) for u in RNNT_U for m in (False, True)]
            out += [("rnnt_loss", u, dt, grad, v) for u, v in RNNT_LOSS]
            out += [("dur", u, dt, grad, (f, v, d)) for f, u, v, d in DUR]
    return out


def launches(case) -> list:
    import torch

    from duoloss.torch._triton import _aot
    family, p, dt, grad, extra = case
    dtype = getattr(torch, dt)
    if family in ("ctc", "ctc_split"):
        return _aot.ctc_launches(32, 500, 50, p, dtype, grad, split=family == "ctc_split")
    if family == "rnnt":
        return _aot.transducer_launches(32, 150, p, dtype, grad, modified=bool(extra))
    if family == "rnnt_loss":
        return _aot.rnnt_loss_launches(16, 150, p, extra, dtype, grad)
    return _aot.dur_launches(4, 40, p, extra[1], extra[0], tuple(extra[2]), dtype, grad)


def describe(case) -> str:
    family, p, dt, grad, extra = case
    if family in ("ctc", "ctc_split"):
        what = f"CTC S={p}" + (" split" if family == "ctc_split" else "")
    elif family == "rnnt":
        what = f"RNN-T U={p}" + (" modified" if extra else "")
    elif family == "rnnt_loss":
        what = f"rnnt_loss U={p} V={extra}"
    else:
        what = f"{extra[0]} fused U={p} V={extra[1]} d={','.join(map(str, extra[2]))}"
    return f"{what} {dt} {'grad' if grad else 'no grad'}"


def run(subset: bool = False, capabilities=CAPABILITIES, progress=True,
        shard=(0, 1)) -> List[dict]:
    """One row per (case, kernel variant, capability); variants compiled once each
    (``shard = (k, n)``: only every n-th case from the k-th, for parallel runs)."""
    from triton.backends.compiler import GPUTarget

    from duoloss.torch._triton import _aot
    rows: List[dict] = []
    done: Dict[Tuple[str, int], dict] = {}
    todo = cases(subset)[shard[0]::shard[1]]
    for i, case in enumerate(todo):
        recorded = launches(case)
        for cap in capabilities:
            target = GPUTarget("cuda", cap, 32)
            for k, v in _aot.variants(recorded, target).items():
                if (k, cap) not in done:
                    t0 = time.perf_counter()
                    r = _aot.compile_variant(v, target)
                    r["compile_s"] = time.perf_counter() - t0
                    done[(k, cap)] = r
                r = done[(k, cap)]
                names = v["kernel"].arg_names  # (the cell-parallel kernels: BLOCK_V, ROWS)
                block_arg = next(b for b in ("BLOCK", "BLOCK_V", "ROWS") if b in names)
                block = int(v["constexprs"].get((names.index(block_arg),), 0))
                rows.append({"case": describe(case), "family": case[0], "kernel":
                             v["kernel"].fn.__name__, "variant": k, "sm": cap, "block": block,
                             **{x: r[x] for x in ("regs", "spill_stores", "spill_loads",
                                                  "stack", "shared", "num_warps")},
                             "offsets_i32": r["offsets"]["i32"],
                             "offsets_i64": r["offsets"]["i64"],
                             "scalar_i32": r["offsets"]["scalar_i32"]})
        if progress:
            print(f"[{i + 1}/{len(todo)}] {describe(case)}", file=sys.stderr, flush=True)
    return rows


def problems(rows: List[dict]) -> List[str]:
    """The rows that break the checks: spills at ``BLOCK <= 2048``; 32-bit scalar
    pointer offsets."""
    out = []
    for r in rows:
        where = f"{r['case']} sm_{r['sm']} {r['kernel']} BLOCK={r['block']}"
        if r["block"] <= 2048 and (r["spill_stores"] or r["spill_loads"]):
            out.append(f"{where}: spills {r['spill_stores']}/{r['spill_loads']} bytes")
        if r["scalar_i32"]:
            out.append(f"{where}: {r['scalar_i32']} 32-bit scalar pointer offsets")
    return out


def markdown(rows: List[dict]) -> str:
    """The table, one line per distinct (kernel variant, capability)."""
    seen, lines = set(), []
    lines.append("| kernel | case | sm | BLOCK | warps | registers | spill st/ld (B) "
                  "| stack (B) | shared (B) | 32-bit scalar offsets |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        k = (r["variant"], r["sm"])
        if k in seen:
            continue
        seen.add(k)
        lines.append(f"| {r['kernel']} | {r['case']} | {r['sm']} | {r['block']} | "
                     f"{r['num_warps']} | {r['regs']} | {r['spill_stores']}/{r['spill_loads']} | "
                     f"{r['stack']} | {r['shared']} | {r['scalar_i32']} |")
    return "\n".join(lines)


def compare(before: List[dict], after: List[dict]) -> str:
    """A markdown summary of two tables of the same cases: one line per (kernel,
    BLOCK), over dtypes, gradient variants, duration sets and sm_80/sm_90: warps,
    the largest register count of the float32 and float64 gradient variants at
    sm_90, the largest spill (stores/loads, bytes) and the most 32-bit scalar pointer
    offsets of any variant, before -> after."""
    def groups(rows):
        out: Dict[Tuple[str, int], dict] = {}
        for r in rows:
            g = out.setdefault((r["kernel"], r["block"]), {
                "warps": set(), "f32": 0, "f64": 0, "spill": (0, 0), "i32": 0})
            g["warps"].add(r["num_warps"])
            if r["sm"] == 90 and r["case"].endswith(" grad") and "no grad" not in r["case"]:
                k = "f64" if "float64" in r["case"] else "f32"
                g[k] = max(g[k], r["regs"])
            g["spill"] = max(g["spill"], (r["spill_stores"], r["spill_loads"]))
            g["i32"] = max(g["i32"], r["scalar_i32"])
        return out

    b, a = groups(before), groups(after)
    lines = ["| kernel | BLOCK | warps | registers f32 (grad, sm_90) | registers f64 "
             "(grad, sm_90) | worst spill st/ld (B) | 32-bit scalar offsets |",
             "|---|---:|---|---|---|---|---|"]
    for key in sorted(set(b) | set(a), key=lambda k: (k[0], k[1])):
        x, y = b.get(key), a.get(key)

        def pair(f):
            return f"{f(x) if x else '-'} → {f(y) if y else '-'}"
        lines.append(
            f"| {key[0]} | {key[1]} | {pair(lambda g: '/'.join(map(str, sorted(g['warps']))))} "
            f"| {pair(lambda g: g['f32'] or '-')} | {pair(lambda g: g['f64'] or '-')} "
            f"| {pair(lambda g: '/'.join(map(str, g['spill'])))} | {pair(lambda g: g['i32'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subset", action="store_true", help="only the test's subset")
    p.add_argument("--json", default="", help="write the rows to this JSON file")
    p.add_argument("--markdown", default="", help="write the markdown table to this file")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="only every N-th case from the K-th (run N processes, then --merge)")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="concatenate the rows of --json files (shards) into --json, with "
                        "--markdown, and exit")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                   help="print the before/after summary of two --json files and exit")
    args = p.parse_args(argv)
    if args.merge:
        rows = []
        for path in args.merge:
            with open(path) as f:
                rows += json.load(f)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(rows) + "\n")
        bad = problems(rows)
        print(f"{len({(r['variant'], r['sm']) for r in rows})} variants; {len(bad)} problems"
              + "".join(f"\n  {b}" for b in bad))
        return 0
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            print(compare(json.load(f), json.load(g)))
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        p.error("run with TRITON_INTERPRET unset (the kernels must be defined for a GPU)")
    k, n = (int(v) for v in args.shard.split("/"))
    rows = run(args.subset, shard=(k, n))
    text = markdown(rows)
    print(text)
    bad = problems(rows)
    print(f"\n{len({(r['variant'], r['sm']) for r in rows})} variants compiled; "
          f"{len(bad)} problems" + "".join(f"\n  {b}" for b in bad))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
