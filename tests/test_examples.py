"""The training examples and the demo run end to end (CI-sized) and their loss goes down.

Each script exits non-zero when its loss did not fall; the flax one runs data
parallel over 4 host devices.  ``python -m duoloss`` (``make demo``) runs with both
frameworks, with torch or jax hidden (a ``sys.modules[name] = None`` shim in the
subprocess), and writes its PNG only when matplotlib is importable.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


# --- python -m duoloss (what `make demo` runs) ------------------------------------------

_BLOCK = "import sys\n{blocks}\nimport runpy\nsys.argv = ['duoloss'] + sys.argv[1:]\n" \
         "runpy.run_module('duoloss', run_name='__main__', alter_sys=True)\n"


def run_demo(tmp_path, *args, hide=()):
    """Run ``python -m duoloss`` with the modules in ``hide`` made unimportable."""
    blocks = "\n".join(f"sys.modules[{m!r}] = None" for m in hide)
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _BLOCK.format(blocks=blocks), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc


def _losses(out, column):
    """Column ``column`` of the demo's table (rows made of numbers only)."""
    def numeric(tokens):
        try:
            return [float(t) for t in tokens]
        except ValueError:
            return None
    rows = [numeric(ln.split()) for ln in out.splitlines() if ln.split()]
    return [r[column] for r in rows if r]


@pytest.mark.parametrize("hide, names", [
    ((), ("torch", "jax")),
    (("torch",), ("jax",)),
    (("jax",), ("torch",)),
], ids=["both", "jax_only", "torch_only"])
def test_demo_runs_with_what_is_installed(tmp_path, hide, names):
    png = tmp_path / "demo.png"
    proc = run_demo(tmp_path, "--steps", "12", "--batch", "8", "--plot", str(png), hide=hide)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"in {' and '.join(names)}" in out, out
    header = next(ln for ln in out.splitlines() if ln.lstrip().startswith("step"))
    assert [h for h in header.split() if h not in ("step", "loss", "|diff|")] == list(names)
    for col in range(1, len(names) + 1):
        losses = _losses(out, col)
        assert len(losses) == 7 and losses[-1] < 0.5 * losses[0], out   # it trains
    if len(names) == 2:   # same core: the frameworks agree to float32 rounding at every step
        np.testing.assert_allclose(_losses(out, 1), _losses(out, 2), rtol=1e-5)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "matplotlib is not installed" in out
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        assert f"figure: {png}" in out


def test_demo_without_matplotlib_writes_no_figure(tmp_path):
    png = tmp_path / "demo.png"
    proc = run_demo(tmp_path, "--steps", "3", "--batch", "4", "--plot", str(png),
                    hide=("matplotlib", "torch"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "matplotlib is not installed" in proc.stdout and not png.exists()


def test_demo_without_any_framework_says_what_to_install(tmp_path):
    proc = run_demo(tmp_path, "--steps", "1", hide=("torch", "jax"))
    assert proc.returncode == 2
    assert "needs PyTorch or JAX" in proc.stderr and "duoloss[torch]" in proc.stderr
