"""TDT and multi-blank on the JAX device path (``impl='device'``: pure XLA,
duoloss/jax/_xla/tdt.py) against the host path (the numba core is the oracle;
the core itself is pinned to brute force and NeMo's reference in
tests/test_tdt.py and tests/test_multiblank.py).

float64 (x64 on) to 1e-12, float32 with x64 off and on to 1e-5; durations with
and without 0, ``sigma``, FastEmit, clamp, ``omega``, zero frames, infeasible
sequences (+inf, zero gradient), NaN in one sequence, reductions, ``vmap`` and
a jitted jaxpr without callback.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp

import duoloss.jax as dj

ROOT = Path(__file__).resolve().parents[1]
MODES = [(np.float32, False), (np.float32, True), (np.float64, True)]
MODE_IDS = ["f32-x64off", "f32-x64on", "f64"]


def assert_close(got, ref, dtype):
    rtol, atol = (1e-12, 1e-13) if dtype == np.float64 else (1e-5, 1e-6)
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=rtol, atol=atol)


def tdt_case(seed, n_dur, t=8, u=3, v=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, t, u + 1, v + n_dur)) * 2
    tg = rng.integers(0, v - 1, (4, u))          # blank = v - 1 never a label
    il = np.array([t, t - 2, 0, 4])
    tl = np.array([u, 1, 0, 2])
    return x, tg, il, tl


def value_and_grad(f, x, impl):
    """Per-sequence losses and the gradient of their weighted sum (distinct weights
    catch a gradient assigned to the wrong sequence), jitted."""
    w = jnp.arange(1.0, x.shape[0] + 1.0, dtype=x.dtype)
    fn = jax.jit(jax.value_and_grad(lambda z: (f(z, impl) * w).sum(), has_aux=False))
    _, g = fn(x)
    return np.asarray(f(x, impl)), np.asarray(g)


@pytest.mark.parametrize("dtype,x64,durations,opts", [
    (np.float64, True, [0, 1, 2], {"sigma": 0.05}),
    (np.float32, False, [0, 1, 2], {"sigma": 0.05}),
    (np.float32, True, [0, 1, 2], {"sigma": 0.05}),
    (np.float64, True, [1, 2, 3, 4, 5], {"fastemit_lambda": 0.3, "clamp": 0.2}),
    (np.float32, False, [1, 2, 3, 4, 5], {"fastemit_lambda": 0.3, "clamp": 0.2}),
    (np.float64, True, [0, 2], {"omega": 0.3, "sigma": 0.1}),
    (np.float64, True, [0, 1], {"omega": 1.0, "fastemit_lambda": 0.5}),
], ids=["d012-sigma-f64", "d012-sigma-f32-x64off", "d012-sigma-f32-x64on",
        "d12345-fastemit-clamp-f64", "d12345-fastemit-clamp-f32", "d02-omega-f64",
        "omega1-f64"])
def test_tdt_device_equals_host(dtype, x64, durations, opts):
    with jax.enable_x64(x64):
        x, tg, il, tl = tdt_case(len(durations), len(durations))
        x = jnp.asarray(x, dtype)

        def f(z, impl):
            return dj.tdt_loss(z, tg, il, tl, -1, durations, reduction="none", impl=impl,
                               **opts)

        lh, gh = value_and_grad(f, x, "host")
        ld, gd = value_and_grad(f, x, "device")
        assert ld.dtype == lh.dtype == gd.dtype == dtype
        assert_close(ld, lh, dtype)
        assert_close(gd, gh, dtype)
        assert np.isfinite(lh).all() and np.abs(gh).sum() > 0


@pytest.mark.parametrize("dtype,x64", [MODES[0], MODES[2]], ids=[MODE_IDS[0], MODE_IDS[2]])
def test_multiblank_device_equals_host(dtype, x64):
    with jax.enable_x64(x64):
        rng = np.random.default_rng(5)
        x = jnp.asarray(rng.standard_normal((4, 9, 3, 7)) * 2, dtype)
        tg = rng.integers(0, 4, (4, 2))           # blank 6, big blanks 5 and 4
        il, tl = np.array([9, 5, 0, 8]), np.array([2, 1, 0, 2])

        def f(z, impl):
            return dj.multiblank_rnnt_loss(z, tg, il, tl, 6, [2, 4], reduction="none",
                                           sigma=0.05, fastemit_lambda=0.2, clamp=0.3,
                                           impl=impl)

        lh, gh = value_and_grad(f, x, "host")
        ld, gd = value_and_grad(f, x, "device")
        assert_close(ld, lh, dtype)
        assert_close(gd, gh, dtype)


def test_closed_forms_on_device():
    """The docstring examples' hand counts, on the device path."""
    with jax.enable_x64(True):
        # TDT, uniform tokens (V=3) and durations [0, 1]: 3 paths of 3 moves, each 1/6
        loss = dj.tdt_loss(np.zeros((1, 2, 2, 5)), np.array([[0]]), np.array([2]),
                           np.array([1]), blank=2, durations=[0, 1], impl="device")
        np.testing.assert_allclose(float(loss), np.log(27), rtol=1e-14)
        # multi-blank, uniform over 4: '0' ∅ ∅ and ∅ '0' ∅ (1/64 each), '0' big-∅ (1/16)
        loss = dj.multiblank_rnnt_loss(np.zeros((1, 2, 2, 4)), np.array([[0]]), np.array([2]),
                                       np.array([1]), blank=3, big_blank_durations=[2],
                                       impl="device")
        np.testing.assert_allclose(float(loss), -np.log(2 / 64 + 1 / 16), rtol=1e-14)


def test_infeasible_nan_and_reductions():
    with jax.enable_x64(True):
        x, tg, il, tl = tdt_case(11, 1, t=7)
        il = np.array([7, 4, 0, 6])           # durations [2]: odd T_b has no path
        x[1, 0, 0, 2] = np.nan                # a cell sequence 1 reads
        x[3, 6:] = np.nan                     # outside sequence 3's box: never read
        x = jnp.asarray(x)

        def f(z, impl, reduction="none"):
            return dj.tdt_loss(z, tg, il, tl, -1, [2], reduction=reduction, impl=impl)

        lh, gh = value_and_grad(f, x, "host")
        ld, gd = value_and_grad(f, x, "device")
        assert np.isposinf(ld[0]) and np.isnan(ld[1]) and ld[2] == 0 and np.isfinite(ld[3])
        assert not gd[0].any() and np.isnan(gd[1]).any() and np.isfinite(gd[3]).all()
        assert_close(ld, lh, np.float64)
        assert_close(gd, gh, np.float64)
        xs, tgs, _, tls = tdt_case(12, 2)
        xs = jnp.asarray(xs)
        ils = np.array([8, 5, 0, 4])          # durations [1, 2]: every T_b has a path
        for reduction in ("sum", "mean"):
            def g(z, impl, reduction=reduction):
                return dj.tdt_loss(z, tgs, ils, tls, -1, [1, 2], reduction=reduction, impl=impl)

            np.testing.assert_allclose(float(g(xs, "device")), float(g(xs, "host")), rtol=1e-13)
            assert_close(jax.grad(g)(xs, "device"), jax.grad(g)(xs, "host"), np.float64)


def test_vmap_jit_no_callback_and_traced_bad_label():
    with jax.enable_x64(True):
        x, tg, il, tl = tdt_case(3, 3)
        x = jnp.asarray(x)

        def f(z, t, impl):
            return dj.tdt_loss(z, t, il, tl, -1, [0, 1, 2], reduction="sum", impl=impl)

        text = str(jax.make_jaxpr(jax.jit(jax.value_and_grad(
            lambda z: f(z, tg, "device"))))(x))
        assert "callback" not in text and "scan" in text
        xb = jnp.stack([x, x * 0.5])
        vd = jax.vmap(jax.grad(lambda z: f(z, tg, "device")))(xb)
        for i in range(2):
            assert_close(vd[i], jax.grad(lambda z: f(z, tg, "host"))(xb[i]), np.float64)
        # a traced invalid label (the blank): NaN for that sequence only, no OOB read
        bad = tg.copy()
        bad[0, 0] = 4
        losses = jax.jit(lambda z, t: dj.tdt_loss(z, t, il, tl, -1, [0, 1, 2],
                                                  reduction="none", impl="device"))(x, bad)
        assert np.isnan(losses[0]) and np.isfinite(losses[1:]).all()



@pytest.mark.parametrize("shape,tg,il,tl", [
    ((2, 0, 3, 8), [[1, 2], [0, 0]], [0, 0], [2, 0]),   # no frames: +inf and 0
    ((0, 4, 3, 8), np.zeros((0, 2), int), [], []),        # empty batch
    ((2, 4, 1, 8), np.zeros((2, 0), int), [4, 2], [0, 0]),  # no targets
], ids=["T0", "N0", "U0"])
def test_empty_shapes(shape, tg, il, tl):
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(2).standard_normal(shape))
        tg, il, tl = np.asarray(tg, int), np.asarray(il, int), np.asarray(tl, int)

        def f(z, impl):
            return dj.tdt_loss(z, tg, il, tl, -1, [0, 1, 2], reduction="none", impl=impl)

        assert_close(f(x, "device"), f(x, "host"), np.float64)
        assert_close(jax.grad(lambda z: f(z, "device").sum())(x),
                     jax.grad(lambda z: f(z, "host").sum())(x), np.float64)

SHARD_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import duoloss.jax as dj
assert len(jax.devices()) == 2
mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((4, 6, 3, 5 + 3)), jnp.float32)
tg = jnp.asarray(rng.integers(0, 4, (4, 2))); il = jnp.asarray([6, 4, 0, 5]); tl = jnp.asarray([2, 1, 0, 2])
def tdt(x, tg, il, tl):
    return dj.tdt_loss(x, tg, il, tl, -1, [0, 1, 2], reduction="none", omega=0.25, impl="device")
def mb(x, tg, il, tl):
    return dj.multiblank_rnnt_loss(x, tg, il, tl, 7, [2, 3], reduction="none", impl="device")
for f in (tdt, mb):
    def both(a, *r):
        return f(a, *r), jax.grad(lambda a: f(a, *r).sum())(a)
    ref, gref = jax.jit(both)(x, tg, il, tl)
    sm = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=(P("d"),) * 4, out_specs=(P("d"), P("d"))))
    assert "callback" not in str(jax.make_jaxpr(sm)(x, tg, il, tl))
    got, g = sm(x, tg, il, tl)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(g, gref, rtol=1e-6, atol=1e-7)
print("SHARD OK")
"""


def test_shard_map_on_two_cpu_devices():
    """The scan carries are marked varying: shard_map (check_vma on) == one device."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", SHARD_SCRIPT], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "SHARD OK" in proc.stdout, proc.stderr[-4000:]
