"""duoloss in locked-down installs: read-only package and home, no loadable thread-safe layer.

Each case runs in a fresh interpreter, and first checks inside it that the
lock-down really holds (writes fail, the shared library does not load), so a
broken simulation fails the test instead of passing it.

Read-only folders: as a normal user, ``chmod -R a-w``; as root (who writes
through permission bits), a private mount namespace where the folder is
bind-mounted read-only (``unshare --mount``), skipped where that is not allowed.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux file system set-up")

TIMEOUT = 600

# One alignment per sequence: input length == target length and no label repeats
# next to itself, so loss_b = -sum_t log_probs[t, b, y_bt] exactly.  With N = 12,
# T*(2S+1)*N = 60*121*12 cells: the batch runs on threads; with N = 2 on the
# calling thread alone.
T, C = 60, 10
N_PARALLEL, N_SERIAL = 12, 2


def _one_alignment_batch(N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, N, C))
    lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    targets = np.empty((N, T), np.int64)
    for b in range(N):
        prev = 0
        for t in range(T):
            prev = int(rng.choice([k for k in range(1, C) if k != prev]))
            targets[b, t] = prev
    loss = -np.take_along_axis(lp, targets.T[:, :, None], 2)[:, :, 0].sum(0)
    return lp, targets, loss


def _batch(N):
    """The same batch as _one_alignment_batch(N), built inside the subprocess."""
    return textwrap.dedent(f"""
    import numpy as np
    T, N, C = {T}, {N}, {C}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, C))
    lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    targets = np.empty((N, T), np.int64)
    for b in range(N):
        prev = 0
        for t in range(T):
            prev = int(rng.choice([k for k in range(1, C) if k != prev]))
            targets[b, t] = prev
    lengths = np.full(N, T)
    """)


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "NUMBA_THREADING_LAYER",
                        "PYTHONPATH")}
    env.update(extra)
    return env


def _read_only_prefix(folder):
    """Command prefix (list) that runs its tail with ``folder`` read-only, or skip."""
    if os.geteuid() != 0:
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return []
    unshare = shutil.which("unshare")
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    if unshare is None:
        pytest.skip("running as root without unshare: cannot make a folder read-only")
    probe = subprocess.run([unshare, "--mount", "sh", "-c", script, str(folder), "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root and cannot bind-mount read-only: {probe.stderr.strip()}")
    return [unshare, "--mount", "sh", "-c", script, str(folder)]


def _make_writable_again(folder):
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def locked_install(tmp_path):
    """A copy of the package and a home folder, both read-only; a writable TMPDIR."""
    ro = tmp_path / "ro"
    site = ro / "site"
    shutil.copytree(ROOT / "duoloss", site / "duoloss",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    (ro / "home").mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    prefix = _read_only_prefix(ro)
    yield prefix, site, ro / "home", tmp
    _make_writable_again(ro)


def _run(prefix, code, env, cwd):
    proc = subprocess.run([*prefix, sys.executable, "-c", code], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CHECK_LOCKED = textwrap.dedent("""
    import json, os, sys, tempfile, warnings

    def writable(folder):
        try:
            with open(os.path.join(folder, "probe"), "w"):
                pass
        except OSError:
            return False
        os.remove(os.path.join(folder, "probe"))
        return True
""")


def test_read_only_package_and_home_torch_and_jax(locked_install):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    prefix, site, home, tmp = locked_install
    code = _CHECK_LOCKED + _batch(N_SERIAL) + textwrap.dedent(f"""
        site, home = {str(site)!r}, {str(home)!r}
        locked = not writable(os.path.join(site, "duoloss", "core")) and not writable(home)
        lp = lp.astype(np.float32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import duoloss.torch as dt
            import duoloss.jax as dj
        import numba, torch
        from duoloss.core import _numba_setup
        tg, ln = torch.from_numpy(targets), torch.from_numpy(lengths)
        torch_loss = dt.ctc_loss(torch.from_numpy(lp), tg, ln, ln, reduction="none")
        jax_loss = dj.ctc_loss(lp, targets.astype(np.int32),
                               lengths.astype(np.int32), lengths.astype(np.int32),
                               reduction="none")
        print(json.dumps(dict(
            locked=locked, file=dt.__file__, choice=_numba_setup.cache_choice,
            cache_dir=numba.config.CACHE_DIR,
            warnings=[str(w.message) for w in caught if "duoloss" in str(w.message)],
            torch=torch_loss.tolist(), jax=np.asarray(jax_loss).tolist())))
    """)
    env = _env(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(site))
    out = _run(prefix, code, env, cwd=tmp)
    assert out["locked"], "the package copy or HOME is writable: the set-up is broken"
    assert out["file"].startswith(str(site))
    _, _, expected = _one_alignment_batch(N_SERIAL)
    np.testing.assert_allclose(out["torch"], expected, rtol=1e-5)
    np.testing.assert_allclose(out["jax"], expected, rtol=1e-5)
    # The kernels were cached in a private folder of the temporary directory.
    assert out["choice"] == "temporary" and out["warnings"] == []
    cache = Path(out["cache_dir"])
    assert cache.parent == tmp
    assert stat.S_IMODE(cache.stat().st_mode) & 0o077 == 0
    assert list(cache.rglob("*.nbi")), "no numba cache index written"


def test_nothing_writable_compiles_without_cache_and_warns_once(locked_install):
    prefix, site, home, tmp = locked_install
    ro_tmp = home  # read-only as well
    code = _CHECK_LOCKED + _batch(N_SERIAL) + textwrap.dedent(f"""
        site, home = {str(site)!r}, {str(home)!r}
        # The temporary directory is read-only too (tempfile.tempdir overrides the
        # search of TMPDIR, /tmp, ... that tempfile.gettempdir() would do).
        tempfile.tempdir = {str(ro_tmp)!r}
        locked = not any(writable(d) for d in (os.path.join(site, "duoloss", "core"), home))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from duoloss.core import _numba_setup, ctc_loss_and_grad
            losses, grad = ctc_loss_and_grad(lp, targets, lengths, lengths)
        print(json.dumps(dict(
            locked=locked, choice=_numba_setup.cache_choice,
            warnings=[str(w.message) for w in caught if "duoloss" in str(w.message)],
            losses=losses.tolist(), grad_ok=bool(np.allclose(
                grad, -np.eye(C)[targets.T], rtol=0, atol=1e-12)))))
    """)
    env = _env(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(site))
    out = _run(prefix, code, env, cwd=tmp)
    assert out["locked"]
    assert out["choice"] == "none"
    assert len(out["warnings"]) == 1 and "NUMBA_CACHE_DIR" in out["warnings"][0]
    _, _, expected = _one_alignment_batch(N_SERIAL)
    np.testing.assert_allclose(out["losses"], expected, rtol=1e-12)
    assert out["grad_ok"]  # one alignment: the gradient is -onehot(path)


@pytest.fixture
def no_threading_libs(tmp_path):
    """LD_LIBRARY_PATH folder where libgomp and libtbb exist but cannot be loaded."""
    libs = tmp_path / "broken-libs"
    libs.mkdir()
    for name in ("libgomp.so.1", "libgomp.so.1.0.0", "libtbb.so.12"):
        (libs / name).write_text("not a shared library\n")
    return libs


def _threading_code(calls):
    return _CHECK_LOCKED + _batch(N_PARALLEL) + textwrap.dedent(f"""
        try:
            from numba.np.ufunc import omppool
            omp_loads = True
        except ImportError:
            omp_loads = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from duoloss.core import ctc_loss_and_grad, threading_layer
            results = [ctc_loss_and_grad(lp, targets, lengths, lengths) for _ in range({calls})]
        losses, grad = results[0]
        print(json.dumps(dict(
            omp_loads=omp_loads, layer=threading_layer(),
            warnings=[str(w.message) for w in caught if "threading layer" in str(w.message)],
            same=all(np.array_equal(l, losses) and np.array_equal(g, grad)
                     for l, g in results),
            losses=losses.tolist(), grad_ok=bool(np.allclose(
                grad, -np.eye(C)[targets.T], rtol=0, atol=1e-12)))))
    """)


@pytest.mark.parametrize("forced", [None, "omp", "threadsafe"])
def test_no_thread_safe_layer_loads(no_threading_libs, forced):
    # libgomp (and libtbb) present but not loadable, as on a system without them,
    # even with a layer forced that cannot load: duoloss's batches run on its own
    # Python threads and never need numba's threading layer (no error, no warning).
    extra = {"LD_LIBRARY_PATH": str(no_threading_libs), "PYTHONPATH": str(ROOT),
             "NUMBA_NUM_THREADS": "2"}
    if forced:
        extra["NUMBA_THREADING_LAYER"] = forced
    out = _run([], _threading_code(calls=3), _env(**extra), cwd=ROOT)
    assert not out["omp_loads"], "libgomp still loads: the simulation is broken"
    assert out["layer"] == "unknown"
    assert out["warnings"] == []
    _, _, expected = _one_alignment_batch(N_PARALLEL)
    np.testing.assert_allclose(out["losses"], expected, rtol=1e-12)
    assert out["grad_ok"] and out["same"]
