"""The training examples run end to end (CI-sized) and their loss goes down.

Each script exits non-zero when its loss did not fall; the flax one runs data
parallel over 4 host devices.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script, *args, env=None):
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("script, args, env, devices", [
    ("torch_train.py", ("--steps", "60"), {}, "cpu"),
    ("flax_train.py", ("--steps", "80"),
     {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"},
     "4 device(s)"),
], ids=["torch", "flax_4_devices"])
def test_example_trains(script, args, env, devices):
    out = run(script, *args, env=env)
    assert "mean loss first 5 steps" in out and devices in out, out
