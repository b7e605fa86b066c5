"""Host work per step of the torch device losses: aten ops counted on CPU (issue 33).

On a GPU host each aten op a step dispatches costs roughly 5–15 µs of dispatch and
launch, whatever the kernels do.  A child process (``benchmarks/host_ops.py --json``:
``TRITON_INTERPRET=1`` and every Triton launch a no-op there, so nothing leaks into
this process) counts, with a ``TorchDispatchMode``, the ops of one forward +
``backward()`` step from a leaf input, the ops inside duoloss's own operators
included.  ``F.ctc_loss``'s count is the independent reference (16 at the time the
bounds were set, counted without the ops inside operators; 12 with this counter).
Bounds: ``ctc_loss`` at most 24 ops per step, the transducer losses at most 30.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
CTC_BOUND = 24
TRANSDUCER_BOUND = 30


@pytest.fixture(scope="module")
def counts():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "benchmarks.host_ops", "--json",
                           "--rounds", "3"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {r["loss"]: r for r in rows}


def _ops(counts, name):
    row = counts[name]
    assert row["ops"] is not None, f"{name}: {row.get('error')}"
    return row["ops"]


def test_reference_f_ctc_loss_is_counted(counts):
    ref = _ops(counts, "F.ctc_loss")
    print(f"F.ctc_loss: {ref} aten ops per step")
    assert 5 <= ref <= 40  # the counter sees a whole step (forward and backward)
    assert counts["F.ctc_loss"]["by_op"].get("aten._ctc_loss_backward.Tensor") == 1


@pytest.mark.parametrize("name", ["ctc_loss", "ctc_loss sum", "ctc_loss none"])
def test_ctc_device_step_ops(counts, name):
    ops = _ops(counts, name)
    print(f"{name}: {ops} aten ops per step (F.ctc_loss {counts['F.ctc_loss']['ops']})")
    assert ops <= CTC_BOUND, counts[name]["by_op"]
    by_op = counts[name]["by_op"]
    # one pass writes the gradient: no zero fill + scatter, no NaN `where`, no gather
    for op in ("aten.scatter_add.default", "aten.where.self", "aten.gather.default"):
        assert op not in by_op, by_op


@pytest.mark.parametrize("name", ["rnnt_loss", "tdt_loss", "multiblank_rnnt_loss"])
def test_transducer_device_step_ops(counts, name):
    ops = _ops(counts, name)
    print(f"{name}: {ops} aten ops per step")
    assert ops <= TRANSDUCER_BOUND, counts[name]["by_op"]
