"""The JAX device path (``impl='device'``: the losses in XLA, duoloss/jax/_xla) against
the host path (the numba core is the oracle), optax and closed forms.

Every function runs both ways on the same inputs: float32 with ``jax_enable_x64``
off and on, float64 with it on; random lengths with zero-length targets, zero
frames, infeasible sequences, repeated labels, NaN frames and ``-inf`` scores;
``grad``/``value_and_grad``, ``jit`` (whose jaxpr must hold no callback), ``vmap``
and ``shard_map`` on 2 CPU devices (in a subprocess).  Tolerances: float64 1e-12
relative (plus a few ulps absolute), float32 1e-5.
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
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL
from duoloss.jax._adapter import apply_kernel
from duoloss.jax._xla.transducer import transducer_losses

ROOT = Path(__file__).resolve().parents[1]
# (dtype, jax_enable_x64): float32 in both modes, float64 needs x64
MODES = [(np.float32, False), (np.float32, True), (np.float64, True)]
MODE_IDS = ["f32-x64off", "f32-x64on", "f64"]


def tol(dtype):
    return (1e-12, 1e-13) if dtype == np.float64 else (1e-5, 1e-6)


def assert_close(got, ref, dtype, scale=1.0):
    rtol, atol = tol(dtype)
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=rtol, atol=atol * scale)


def both(f, *args):
    """``f(*args, impl=...)`` for host and device: ``(host, device)``."""
    return f(*args, impl="host"), f(*args, impl="device")


# ---------------------------------------------------------------- CTC
def ctc_case(dtype, seed=0, t=9, n=6, c=5, s=4):
    rng = np.random.default_rng(seed)
    lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((t, n, c)), dtype), axis=-1)
    tg = rng.integers(1, c, (n, s))
    tg[0, 1] = tg[0, 0]                           # a repeat: needs a blank in between
    il = np.array([t, t - 2, 3, 0, 0, 2])[:n]     # zero frames with and without targets
    tl = np.array([s, 2, 0, 0, 1, 2])[:n]         # seq 5: 2 labels in 2 frames; seq 4 infeasible
    tg[5, :2] = [2, 2]                            # ... with a repeat: infeasible (needs 3)
    return lp, jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl)


def _ctc_weighted(x, tg, il, tl, impl, reduction="none", zero_infinity=False):
    out = dj.ctc_loss(x, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity,
                      impl=impl)
    w = jnp.arange(1.0, 1.0 + out.size, dtype=out.dtype).reshape(out.shape)
    return (jnp.where(jnp.isinf(out), 0, out) * w).sum(), out


# one compiled function per (shapes, dtype, options): tests share them
_CTC_VG = jax.jit(jax.value_and_grad(_ctc_weighted, has_aux=True),
                  static_argnames=("impl", "reduction", "zero_infinity"))


@pytest.mark.parametrize("dtype,x64", MODES, ids=MODE_IDS)
def test_ctc_device_equals_host(dtype, x64):
    with jax.enable_x64(x64):
        lp, tg, il, tl = ctc_case(dtype)
        (_, lh), gh = _CTC_VG(lp, tg, il, tl, impl="host")
        (_, ld), gd = _CTC_VG(lp, tg, il, tl, impl="device")
        assert ld.dtype == lh.dtype == dtype and gd.dtype == dtype
        assert_close(ld, lh, dtype, 10.0)
        assert_close(gd, gh, dtype)
        assert np.isposinf(lh[4]) and np.isposinf(lh[5])
        assert np.asarray(lh)[3] == 0.0                  # zero frames, zero targets
        assert not np.any(np.asarray(gd)[:, 4:])          # infeasible: zero gradient


@pytest.mark.parametrize("reduction,zero_infinity", [("sum", True), ("mean", False),
                                                     ("mean", True)])
def test_ctc_device_reductions_and_zero_infinity_equal_host(reduction, zero_infinity):
    with jax.enable_x64(True):
        lp, tg, il, tl = ctc_case(np.float64)
        kw = {"reduction": reduction, "zero_infinity": zero_infinity}
        (_, lh), gh = _CTC_VG(lp, tg, il, tl, impl="host", **kw)
        (_, ld), gd = _CTC_VG(lp, tg, il, tl, impl="device", **kw)
        assert_close(ld, lh, np.float64, 10.0)
        assert_close(gd, gh, np.float64)


def test_ctc_large_vocabulary_gradient_equals_host():
    """Above 512 classes the label gather's backward is a scatter-add, not a one-hot matmul."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(8)
        lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((5, 3, 600))), axis=-1)
        tg = jnp.asarray([[7, 420], [599, 599], [3, 3]])   # repeats of the last class
        il, tl = jnp.asarray([5, 4, 2]), jnp.asarray([2, 2, 1])
        (_, lh), gh = _CTC_VG(lp, tg, il, tl, impl="host")
        (_, ld), gd = _CTC_VG(lp, tg, il, tl, impl="device")
        assert_close(ld, lh, np.float64, 10.0)
        assert_close(gd, gh, np.float64)


def test_ctc_single_alignment_closed_form():
    """T == S and no repeats: one alignment, loss = -sum of its log-probs, gradient -onehot."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((4, 1, 6))), -1)
        tg = jnp.asarray([[1, 3, 2, 5]])
        loss, g = jax.jit(jax.value_and_grad(lambda x: dj.ctc_loss(
            x, tg, jnp.asarray([4]), jnp.asarray([4]), reduction="sum", impl="device")))(lp)
        want = -sum(float(lp[t, 0, k]) for t, k in enumerate([1, 3, 2, 5]))
        np.testing.assert_allclose(float(loss), want, rtol=1e-14)
        onehot = np.zeros((4, 1, 6))
        onehot[np.arange(4), 0, [1, 3, 2, 5]] = 1.0
        np.testing.assert_allclose(np.asarray(g), -onehot, atol=1e-14)


def test_optax_ctc_loss_device_equals_optax():
    optax = pytest.importorskip("optax")
    with jax.enable_x64(False):
        rng = np.random.default_rng(2)
        b, t, k, n = 3, 10, 6, 4
        logits = jnp.asarray(rng.standard_normal((b, t, k)), jnp.float32)
        lpad = jnp.asarray((np.arange(t)[None] >= np.array([10, 7, 5])[:, None]), jnp.float32)
        labels = jnp.asarray(rng.integers(1, k, (b, n)))
        bpad = jnp.asarray((np.arange(n)[None] >= np.array([4, 2, 0])[:, None]), jnp.float32)
        ref, gref = jax.value_and_grad(lambda x: optax.ctc_loss(x, lpad, labels, bpad).sum())(
            logits)
        f = jax.jit(jax.value_and_grad(
            lambda x: dj.optax_ctc_loss(x, lpad, labels, bpad, impl="device").sum()))
        got, g = f(logits)
        np.testing.assert_allclose(float(got), float(ref), rtol=2e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(gref), atol=2e-6)


def test_ctc_nan_frame_poisons_only_its_sequence_and_padding_is_never_read():
    with jax.enable_x64(True):
        lp, tg, il, tl = ctc_case(np.float64, seed=3)
        lp = lp.at[2, 1, :].set(jnp.nan)           # inside sequence 1
        lp = lp.at[8, 2, :].set(jnp.nan)           # past sequence 2's 3 frames
        lp = lp.at[:, 0, 4].set(-jnp.inf)          # a class nobody may ever use
        tg = tg.at[0].set(jnp.asarray([1, 1, 2, 3]))
        (_, lh), gh = _CTC_VG(lp, tg, il, tl, impl="host")
        (_, ld), gd = _CTC_VG(lp, tg, il, tl, impl="device")
        assert np.isnan(ld[1]) and np.all(np.isfinite(np.asarray(ld)[[0, 2, 3]]))
        assert_close(ld, lh, np.float64, 10.0)
        assert not np.any(np.isnan(np.asarray(gd)[:, [0, 2, 3]]))
        assert_close(gd[:, [0, 2, 3]], gh[:, [0, 2, 3]], np.float64)


# ---------------------------------------------------------------- RNN-T
def rnnt_case(dtype, seed=0, n=5, t=6, u=3, v=5):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, t, u + 1, v)) * 2, dtype)
    tg = jnp.asarray(rng.integers(0, v - 1, (n, u)))         # blank = V - 1
    il = jnp.asarray([t, 4, 0, 0, 1][:n])                    # zero frames with/without targets
    tl = jnp.asarray([u, 0, 0, 2, u][:n])
    return x, tg, il, tl


def _rnnt_weighted(x, tg, il, tl, impl, opts=(("reduction", "none"),)):
    out = dj.rnnt_loss(x, tg, il, tl, impl=impl, **dict(opts))
    w = jnp.arange(1.0, 1.0 + out.size, dtype=out.dtype).reshape(out.shape)
    return (jnp.where(jnp.isinf(out), 0, out) * w).sum(), out


_RNNT_VG = jax.jit(jax.value_and_grad(_rnnt_weighted, has_aux=True),
                   static_argnames=("impl", "opts"))


@pytest.mark.parametrize("dtype,x64,opts", [
    (np.float32, False, (("reduction", "none"),)),
    (np.float64, True, (("reduction", "none"),)),
    (np.float64, True, (("reduction", "mean"), ("clamp", 0.05))),
    (np.float64, True, (("reduction", "sum"), ("fastemit_lambda", 0.1), ("delay_penalty", 0.2))),
    (np.float64, True, (("reduction", "sum"), ("fused_log_softmax", False)))],
    ids=["f32-x64off", "f64", "mean-clamp", "fastemit-delay", "unfused"])
def test_rnnt_loss_device_equals_host(dtype, x64, opts):
    with jax.enable_x64(x64):
        x, tg, il, tl = rnnt_case(dtype)
        if not dict(opts).get("fused_log_softmax", True):
            x = jax.nn.log_softmax(x, -1)
        (_, lh), gh = _RNNT_VG(x, tg, il, tl, impl="host", opts=opts)
        (_, ld), gd = _RNNT_VG(x, tg, il, tl, impl="device", opts=opts)
        assert ld.dtype == lh.dtype and gd.dtype == gh.dtype == dtype
        assert_close(ld, lh, dtype, 10.0)
        assert_close(gd, gh, dtype)
        if dict(opts)["reduction"] == "none":
            assert np.asarray(lh)[2] == 0.0 and np.isposinf(lh[3])   # zero frames


def test_rnnt_nan_row_poisons_only_its_sequence():
    with jax.enable_x64(True):
        x, tg, il, tl = rnnt_case(np.float64, seed=4)
        x = x.at[0, 2, 1, 3].set(jnp.nan).at[1, 5, 0, 0].set(jnp.nan)   # seq 1: past its frames
        keep = jnp.arange(5) == tg[4, 0]
        x = x.at[4, 0, 0, :].set(jnp.where(keep, 0.0, -jnp.inf))     # -inf scores, no NaN
        (_, lh), gh = _RNNT_VG(x, tg, il, tl, impl="host")
        (_, ld), gd = _RNNT_VG(x, tg, il, tl, impl="device")
        assert np.isnan(ld[0]) and np.all(np.isfinite(np.asarray(ld)[[1, 2, 4]]))
        assert_close(ld, lh, np.float64, 10.0)
        assert not np.any(np.isnan(np.asarray(gd)[1:]))
        assert_close(gd[1:], gh[1:], np.float64)


@pytest.mark.parametrize("kind", ["regular", "modified"])
def test_transducer_recursion_boxes_equal_core(kind):
    """Boxes that do not start at (0, 0), an infeasible modified box, -inf moves."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        n, s, t = 5, 4, 6
        px = -np.abs(rng.standard_normal((n, s, t + 1 if kind == "regular" else t)))
        py = -np.abs(rng.standard_normal((n, s + 1, t)))
        px[1, 2, :] = -np.inf
        px[3, :, :] = np.nan                               # outside box 3: never read
        px[3, 1, 2] = -0.5
        bd = np.array([[0, 0, 4, 6], [1, 2, 4, 6], [0, 1, 3, 5], [1, 2, 2, 3], [0, 0, 4, 2]])
        px, py, bd = jnp.asarray(px), jnp.asarray(py), jnp.asarray(bd)
        w = jnp.arange(1.0, n + 1.0)

        def host(a, b):
            return apply_kernel(TRANSDUCER_KERNEL, (a, b, bd), rnnt_type=kind)

        def dev(a, b):
            return transducer_losses(a, b, bd, kind)

        lh, ld = host(px, py), dev(px, py)
        assert_close(ld, lh, np.float64, 10.0)
        if kind == "modified":
            assert np.isposinf(ld[4])                     # 4 symbols in 2 frames
        g = lambda f: jax.grad(lambda a, b: (jnp.where(jnp.isinf(f(a, b)), 0, f(a, b)) * w).sum(),
                               (0, 1))(px, py)
        for a, b in zip(g(dev), g(host)):
            assert_close(a, b, np.float64)


def _k2_all(lm, am, logits, sym, ranges, bd, impl, rnnt_type):
    """Loss and gradients of the simple, smoothed (with return_grad) and pruned losses."""
    kw = {"boundary": bd, "rnnt_type": rnnt_type, "impl": impl}
    simple = jax.value_and_grad(
        lambda a, b: dj.rnnt_loss_simple(a, b, sym, 0, reduction="sum", **kw), (0, 1))(lm, am)
    smoothed = dj.rnnt_loss_smoothed(lm, am, sym, 0, reduction="none", return_grad=True, **kw)
    pruned = jax.value_and_grad(
        lambda x: dj.rnnt_loss_pruned(x, sym, ranges, 0, reduction="sum", **kw))(logits)
    return simple, smoothed, pruned


_K2_ALL = jax.jit(_k2_all, static_argnames=("impl", "rnnt_type"))


@pytest.mark.parametrize("dtype,x64,rnnt_type", [
    (np.float32, False, "regular"), (np.float32, False, "modified"),
    (np.float32, False, "constrained"), (np.float64, True, "regular")])
def test_k2_losses_device_equal_host(dtype, x64, rnnt_type):
    with jax.enable_x64(x64):
        rng = np.random.default_rng(6)
        b, s, t, c, r = 3, 3, 6, 5, 2
        lm = jnp.asarray(rng.standard_normal((b, s + 1, c)), dtype)
        am = jnp.asarray(rng.standard_normal((b, t, c)), dtype)
        sym = jnp.asarray(rng.integers(1, c, (b, s)))
        bd = jnp.asarray([[0, 0, 3, 6], [0, 0, 1, 4], [0, 0, 0, 3]])
        logits = jnp.asarray(rng.standard_normal((b, t, r, c)), dtype)
        ranges = jnp.asarray(np.minimum(np.arange(t) // 2, s + 1 - r)[None, :, None]
                             + np.arange(r)[None, None, :]).repeat(b, 0)
        args = (lm, am, logits, sym, ranges, bd)
        host = jax.tree_util.tree_leaves(_K2_ALL(*args, impl="host", rnnt_type=rnnt_type))
        dev = jax.tree_util.tree_leaves(_K2_ALL(*args, impl="device", rnnt_type=rnnt_type))
        assert len(host) == len(dev) == 8
        for a, b_ in zip(dev, host):
            assert a.dtype == b_.dtype == dtype
            assert_close(a, b_, dtype, 10.0)


# ---------------------------------------------------------------- transforms, dispatch
def _device_calls():
    lp, tg, il, tl = ctc_case(np.float32)
    x, rt, ril, rtl = rnnt_case(np.float32)
    rng = np.random.default_rng(7)
    lm = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
    am = jnp.asarray(rng.standard_normal((2, 5, 4)), jnp.float32)
    sym = jnp.asarray([[1, 2], [3, 1]])
    logits = jnp.asarray(rng.standard_normal((2, 5, 2, 4)), jnp.float32)
    ranges = jnp.asarray(np.minimum(np.arange(5) // 2, 1)[None, :, None]
                         + np.arange(2)[None, None, :]).repeat(2, 0)
    lpad = jnp.zeros((2, 5))
    return {
        "ctc_loss": (lambda a, impl: dj.ctc_loss(a, tg, il, tl, impl=impl), lp),
        "optax_ctc_loss": (lambda a, impl: dj.optax_ctc_loss(
            a, lpad, sym, jnp.zeros((2, 2)), impl=impl).sum(), logits[:, :, 0]),
        "rnnt_loss": (lambda a, impl: dj.rnnt_loss(a, rt, ril, rtl, impl=impl), x),
        "rnnt_loss_simple": (lambda a, impl: dj.rnnt_loss_simple(lm, a, sym, 0, impl=impl), am),
        "rnnt_loss_smoothed": (lambda a, impl: dj.rnnt_loss_smoothed(lm, a, sym, 0, impl=impl),
                               am),
        "rnnt_loss_pruned": (lambda a, impl: dj.rnnt_loss_pruned(a, sym, ranges, 0, impl=impl),
                             logits),
    }


@pytest.mark.parametrize("name", ["ctc_loss", "optax_ctc_loss", "rnnt_loss", "rnnt_loss_simple",
                                  "rnnt_loss_smoothed", "rnnt_loss_pruned"])
def test_jitted_device_path_has_no_callback_and_auto_stays_on_host(name):
    f, a = _device_calls()[name]
    text = str(jax.make_jaxpr(jax.jit(jax.value_and_grad(lambda a: f(a, "device"))))(a))
    assert "callback" not in text
    # on CPU, 'auto' is the host path (CPU users see no change)
    text = str(jax.make_jaxpr(jax.jit(lambda a: f(a, "auto")))(a))
    assert "callback" in text
    with pytest.raises(ValueError, match=f"{name}: argument 'impl' must be one of"):
        f(a, "gpu")


def test_auto_takes_the_device_path_under_an_accelerator_backend(monkeypatch):
    """No accelerator here: pretend the default backend is a GPU; traced inputs then take
    the XLA path, concrete CPU arrays still the host."""
    from duoloss.jax._xla import use_device
    lp, tg, il, tl = ctc_case(np.float32)
    assert not use_device("f", "auto", lp) and not use_device("f", "auto", np.zeros(2))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not use_device("f", "auto", lp)                   # committed to the CPU
    from duoloss.jax import _pallas
    assert "cuda" in _pallas.DEVICE_PALLAS_PLATFORMS          # validated on an H200
    monkeypatch.setattr(_pallas, "DEVICE_PALLAS_PLATFORMS", frozenset())
    text = str(jax.make_jaxpr(lambda x: dj.ctc_loss(x, tg, il, tl, impl="auto"))(lp))
    # a platform not validated: the XLA scan (DEVICE_PALLAS_PLATFORMS)
    assert "callback" not in text and "scan" in text and "pallas_call" not in text
    text = str(jax.make_jaxpr(lambda x: dj.ctc_loss(x, tg, il, tl, impl="pallas"))(lp))
    assert "callback" not in text and "pallas_call" in text
    monkeypatch.setattr(_pallas, "DEVICE_PALLAS_PLATFORMS", frozenset({"cuda"}))
    text = str(jax.make_jaxpr(lambda x: dj.ctc_loss(x, tg, il, tl, impl="auto"))(lp))
    assert "callback" not in text and "pallas_call" in text    # once validated: Pallas
    text = str(jax.make_jaxpr(lambda x: dj.ctc_loss(x, tg, il, tl, impl="xla"))(lp))
    assert "callback" not in text and "scan" in text


def test_second_derivatives_raise_as_on_the_host_path():
    lp, tg, il, tl = ctc_case(np.float32)
    x, rt, ril, rtl = rnnt_case(np.float32)
    f = lambda a: dj.ctc_loss(a, tg, il, tl, reduction="sum", impl="device")
    h = lambda a: dj.rnnt_loss(a, rt, ril, rtl, reduction="sum", impl="device")
    for fn, arg in ((f, lp), (h, x)):
        with pytest.raises(NotImplementedError, match="second derivatives are not implemented"):
            jax.grad(lambda a, fn=fn: jax.grad(fn)(a).sum())(arg)


def test_bad_impl_is_rejected_before_anything_runs():
    with pytest.raises(ValueError, match="ctc_loss: argument 'impl'"):
        dj.ctc_loss(None, None, None, None, impl=None)     # impl checked first


def test_vmap_of_device_path_equals_loop():
    with jax.enable_x64(True):
        lps = jnp.stack([ctc_case(np.float64, seed=i)[0] for i in range(3)])
        _, tg, il, tl = ctc_case(np.float64)
        f = lambda x: dj.ctc_loss(x, tg, il, tl, reduction="sum", impl="device")
        got = jax.jit(jax.vmap(jax.value_and_grad(f)))(lps)
        one = jax.jit(jax.value_and_grad(f))
        for i in range(3):
            v, g = one(lps[i])
            np.testing.assert_allclose(got[0][i], v, rtol=1e-13)
            np.testing.assert_allclose(got[1][i], g, atol=1e-13)


SHARD_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import duoloss.jax as dj
assert len(jax.devices()) == 2
mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((7, 4, 5)), jnp.float32), -1)
tg = jnp.asarray(rng.integers(1, 5, (4, 3))); il = jnp.asarray([7, 5, 3, 0]); tl = jnp.asarray([3, 1, 2, 0])
x = jnp.asarray(rng.standard_normal((4, 5, 3, 4)), jnp.float32)
rt = jnp.asarray(rng.integers(0, 3, (4, 2))); ril = jnp.asarray([5, 4, 2, 1]); rtl = jnp.asarray([2, 1, 0, 2])
def ctc(lp, tg, il, tl):
    return dj.ctc_loss(lp, tg, il, tl, reduction="none", impl="device")
def rnnt(x, rt, ril, rtl):
    return dj.rnnt_loss(x, rt, ril, rtl, reduction="none", impl="device")
cases = [(ctc, (lp, tg, il, tl), (P(None, "d"), P("d"), P("d"), P("d"))),
         (rnnt, (x, rt, ril, rtl), (P("d"),) * 4)]
for f, args, specs in cases:
    def both(a, *r):
        return f(a, *r), jax.grad(lambda a: f(a, *r).sum())(a)
    ref, gref = jax.jit(both)(*args)
    sm = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=specs, out_specs=(P("d"), specs[0])))
    assert "callback" not in str(jax.make_jaxpr(sm)(*args))
    got, g = sm(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(g, gref, rtol=1e-6, atol=1e-7)
    sharded = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    v, gg = jax.jit(jax.value_and_grad(lambda a, *r: f(a, *r).sum()))(*sharded)
    np.testing.assert_allclose(v, ref.sum(), rtol=1e-6)
    np.testing.assert_allclose(gg, gref, rtol=1e-6, atol=1e-7)
print("SHARD OK")
"""


def test_shard_map_and_sharded_jit_on_two_cpu_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", SHARD_SCRIPT], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "SHARD OK" in proc.stdout, proc.stderr[-4000:]
