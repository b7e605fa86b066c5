"""Smoke test of ``benchmarks/``: every script runs with ``--quick`` and writes the documented JSON.

Each script runs in a subprocess (tiny sizes, two rounds), once as ``python benchmarks/X.py``
or ``python -m benchmarks.X``; the test checks the JSON's documented keys, that the timings
are positive, that each ratio is the median of the per-round ratios of the timings it names,
and that the script timed this checkout's duoloss.  Scripts whose peers are not installed
are skipped.  The harness's pure helpers are checked on hand-computed values.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _harness as H  # noqa: E402

sys.path.remove(str(ROOT))

#: script -> (modules it needs, extra arguments, run as a module?)
SCRIPTS = {
    "ctc": (("torch", "jax", "optax"), [], False),
    "decode": (("torch",), [], True),
    "decode_wfst": ((), [], True),
    "asg": (("torch",), [], True),
    "graphs": (("torch",), [], False),
    "mmi": (("torch",), [], True),
    "rnnt": (("torch", "jax"), ["--skip", "warprnnt", "jax_scan"], True),
    "rnnt_pruned": (("torch",), [], False),
    "threads": ((), ["--thread-counts", "1,2", "--callers", "1,2"], True),
}
MACHINE_KEYS = {"cpu_count", "loadavg", "python", "numpy", "numba", "torch", "jax", "jaxlib",
                "optax", "numba_threading_layer", "numba_num_threads", "duoloss_path",
                "git_commit"}
RATIO_KEYS = {"num", "den", "median", "q25", "q75", "min", "max", "rounds"}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_quick_writes_json(script, tmp_path):
    needs, extra, as_module = SCRIPTS[script]
    for mod in needs:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed")
    out = tmp_path / f"{script}.json"
    cmd = ([sys.executable, "-m", f"benchmarks.{script}"] if as_module
           else [sys.executable, str(ROOT / "benchmarks" / f"{script}.py")])
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the script itself must find this checkout
    proc = subprocess.run(cmd + ["--quick", "--json", str(out)] + extra, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round 1/" in proc.stderr or script == "rnnt_pruned", proc.stderr[-2000:]

    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["script"] == script
    assert {"date", "argv", "args", "machine", "results", "table"} <= set(doc)
    assert doc["args"]["quick"] is True and doc["args"]["rounds"] == 2
    assert MACHINE_KEYS <= set(doc["machine"])
    assert doc["machine"]["cpu_count"] >= 1
    # the script timed this checkout, not an installed duoloss
    assert Path(doc["machine"]["duoloss_path"]) == ROOT / "duoloss"
    assert doc["table"].strip() and doc["table"] in proc.stdout

    assert doc["results"]
    for res in doc["results"]:
        assert {"size", "case", "impls", "ratios", "extra"} <= set(res)
        assert res["impls"]
        for name, imp in res["impls"].items():
            assert imp["median_ms"] > 0, (name, imp)
            assert len(imp["rounds_ms"]) == 2 and min(imp["rounds_ms"]) > 0, (name, imp)
            assert imp["median_ms"] > 0
        assert res["ratios"]
        for r in res["ratios"]:
            assert RATIO_KEYS <= set(r)
            a, b = res["impls"][r["num"]]["rounds_ms"], res["impls"][r["den"]]["rounds_ms"]
            expect = statistics.median([x / y for x, y in zip(a, b)])
            assert r["median"] == pytest.approx(expect, rel=1e-12)
            assert 0 < r["min"] <= r["q25"] <= r["median"] <= r["q75"] <= r["max"]


def test_bad_sizes_exit_with_a_clear_message():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.asg", "--sizes", "8,200,30",
                           "--json", ""], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--sizes: expected 4 non-negative integers B,T,C,L per size" in proc.stderr
    assert "'8,200,30'" in proc.stderr


def test_parse_sizes_one_syntax():
    assert H.parse_sizes("8,200,30,40; 1,50,20,10;", "B,T,C,L") == [(8, 200, 30, 40),
                                                                  (1, 50, 20, 10)]
    for bad in ("8,200,30", "8,200,30,x", "", "1,2,3,-4"):
        with pytest.raises(argparse.ArgumentTypeError, match="--sizes"):
            H.parse_sizes(bad, "B,T,C,L")


def test_ratio_stats_hand_computed():
    # per-round ratios 2/1, 3/1, 4/2, 10/2, 1/4 = 2, 3, 2, 5, 0.25 -> sorted 0.25 2 2 3 5
    r = H.ratio_stats("a", "b", [2, 3, 4, 10, 1], [1, 1, 2, 2, 4])
    assert (r["median"], r["q25"], r["q75"], r["min"], r["max"], r["rounds"]) == (
        2.0, 2.0, 3.0, 0.25, 5.0, 5)
    one = H.ratio_stats("a", "b", [3.0], [2.0])
    assert one["median"] == one["q25"] == one["q75"] == 1.5


def test_paired_rotates_order_and_counts_rounds():
    calls = []
    tm = H.paired({k: (lambda k=k: calls.append(k)) for k in "abc"}, 3, warmup=1)
    assert calls[:3] == ["a", "b", "c"]                      # warm-up
    assert calls[3:] == list("abc" "bca" "cab")             # rotated each round
    assert all(len(v) == 3 and min(v) >= 0 for v in tm.rounds_ms.values())


def test_table_markdown():
    assert H.table(["x", "ms"], [["a", 1.5]]) == "| x | ms |\n|---|---:|\n| a | 1.5 |"


def test_device_check_dry_run(tmp_path):
    """``python -m benchmarks.device --check --dry``: the one-shot GPU check's own steps on
    CPU (the torch kernels in Triton's interpreter, JAX on its CPU backend, tiny sizes):
    every device function against the host path, losses and gradients, float32 and
    float64 -- no row may FAIL, and the GPU-only steps say they were skipped."""
    pytest.importorskip("triton")
    pytest.importorskip("jax")
    out = tmp_path / "check.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device", "--check", "--dry",
                           "--skip", "speed", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if r["status"] == "FAIL"], rows
    checked = {r["case"] for r in rows if r["section"] in ("torch", "jax") and r["status"] == "ok"}
    for name in ("torch ctc_loss", "torch rnnt_loss", "torch tdt_loss", "torch multiblank_rnnt_loss",
                 "torch rnnt_loss_pruned", "jax ctc_loss", "jax rnnt_loss", "jax tdt_loss"):
        assert any(c.startswith(name + " ") for c in checked), name
    assert {r["section"] for r in rows if r["status"] == "skip"} >= {"sync", "memory"}


def test_device_speed_race_and_ratios():
    """The GPU check's side-by-side timer: every candidate that runs gets one row, one
    that raises is a ``skip`` row with its reason, and a ratio row compares two that ran
    against its target."""
    import torch

    from benchmarks import _device_speed as S
    rows = []

    def row(section, case, status, detail="", ms=None, peak=None):
        rows.append((section, case, status, detail, ms))

    def boom():
        raise ValueError("nope")
    ms = S.race({"a": lambda: sum(range(1000)), "b": lambda: sum(range(10)), "c": boom},
                torch.device("cpu"), 3, row, "case", lambda e: f"{type(e).__name__}: {e}")
    assert set(ms) == {"a", "b"}
    assert [r[2] for r in rows if r[1] == "case c"] == ["skip"]
    S.ratios("case", {"a": 2.0, "b": 4.0}, [("a", "b", 0.6), ("b", "a", 1.0), ("a", "z", 1.0)],
             row)
    rat = {r[1]: (r[2], r[3]) for r in rows if r[0] == "ratio"}
    assert rat == {"case a / b": ("ok", "0.500x (target <= 0.6)"),
                   "case b / a": ("MISS", "2.000x (target <= 1.0)")}
