"""The Pallas transducer kernels (duoloss/jax/_pallas/transducer.py and tdt.py) in
interpret mode against the host path (the numba core is the oracle).

Both kernel forms run here: the GPU form (Triton-style: shifts through stored rows)
by default, the TPU form (Mosaic-style: ``pltpu.roll``) under ``interpret_as('tpu')``.
Cases are the device suite's (tests/test_device_jax.py, test_device_tdt.py): zero
frames with and without targets, infeasible sequences, boxes not starting at (0, 0),
``-inf`` moves, NaN inside and outside a box, every loss option; float32 with
``jax_enable_x64`` off and on, float64.  Tolerances: float64 1e-10 relative (a few
ulps absolute), float32 1e-5 relative (1e-6 absolute: the kernels' arithmetic is
the XLA path's, in another order).  Lowering: each kernel exported for TPU
(Mosaic) and CUDA (Triton) on this CPU-only machine, with no host callback in the
module.  Shapes are tiny: interpret mode compiles each kernel into an XLA loop.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp
from jax.extend.core import jaxprs_in_params

import duoloss.jax as dj
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL
from duoloss.jax._adapter import apply_kernel
from duoloss.jax._pallas import interpret_as
from duoloss.jax._pallas.transducer import transducer_losses
from duoloss.jax._xla.tdt import multiblank_losses, tdt_losses

ROOT = Path(__file__).resolve().parents[1]
MODES = [(np.float32, False), (np.float32, True), (np.float64, True)]
MODE_IDS = ["f32-x64off", "f32-x64on", "f64"]


def assert_close(got, ref, dtype, scale=1.0):
    rtol, atol = (1e-10, 1e-13) if dtype == np.float64 else (1e-5, 1e-6)
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=rtol, atol=atol * scale)


def _weighted(out):
    w = jnp.arange(1.0, 1.0 + out.size, dtype=out.dtype).reshape(out.shape)
    return (jnp.where(jnp.isinf(out), 0, out) * w).sum()


# ---------------------------------------------------------------- the recursion itself
def _boxes(kind, dtype):
    rng = np.random.default_rng(5)
    n, s, t = 5, 4, 6
    px = -np.abs(rng.standard_normal((n, s, t + 1 if kind == "regular" else t)))
    py = -np.abs(rng.standard_normal((n, s + 1, t)))
    px[1, 2, :] = -np.inf
    px[3, :, :] = np.nan                               # outside box 3: never read
    px[3, 1, 2] = -0.5
    bd = np.array([[0, 0, 4, 6], [1, 2, 4, 6], [0, 1, 3, 5], [1, 2, 2, 3], [0, 0, 4, 2]])
    return jnp.asarray(px, dtype), jnp.asarray(py, dtype), jnp.asarray(bd)


def _recursion_vs_core(kind, dtype):
    px, py, bd = _boxes(kind, dtype)

    def host(a, b):
        return apply_kernel(TRANSDUCER_KERNEL, (a, b, bd), rnnt_type=kind)

    def pallas(a, b):
        return transducer_losses(a, b, bd, kind, backend="pallas-interpret")

    lh, lp = host(px, py), jax.jit(pallas)(px, py)
    assert lp.dtype == dtype
    assert_close(lp, lh, dtype, 10.0)
    if kind == "modified":
        assert np.isposinf(lp[4])                     # 4 symbols in 2 frames
    assert np.isnan(lp[3]) == (kind == "regular")     # regular box 3 reads px[3, 1, 2:4]
    g = lambda f: jax.jit(jax.grad(lambda a, b: _weighted(f(a, b)), (0, 1)))(px, py)
    for a, b in zip(g(pallas), g(host)):
        assert a.dtype == dtype
        assert_close(a, b, dtype)


@pytest.mark.parametrize("kind", ["regular", "modified"])
def test_recursion_boxes_equal_core(kind):
    """Boxes that do not start at (0, 0), an infeasible modified box, -inf moves, NaN."""
    with jax.enable_x64(True):
        _recursion_vs_core(kind, np.float64)


def test_recursion_tpu_form_equals_core():
    """The modified lattice (rnnt_loss's test below runs the regular one in this form)."""
    with jax.enable_x64(False), interpret_as("tpu"):
        _recursion_vs_core("modified", np.float32)


def test_float64_is_refused_by_the_tpu_form():
    with jax.enable_x64(True):
        px, py, bd = _boxes("regular", np.float64)
        with pytest.raises(ValueError, match=r"transducer loss \(impl='pallas'\): the TPU "
                                             r"kernel computes in float32.*float64"):
            transducer_losses(px, py, bd, "regular", backend="pallas-tpu")


# ---------------------------------------------------------------- rnnt_loss
def rnnt_case(dtype, seed=0, n=5, t=6, u=3, v=5):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, t, u + 1, v)) * 2, dtype)
    tg = jnp.asarray(rng.integers(0, v - 1, (n, u)))         # blank = V - 1
    il = jnp.asarray([t, 4, 0, 0, 1][:n])                    # zero frames with/without targets
    tl = jnp.asarray([u, 0, 0, 2, u][:n])                    # 3 symbols in 1 frame: fine
    return x, tg, il, tl


def _rnnt_weighted(x, tg, il, tl, impl, opts=(("reduction", "none"),)):
    out = dj.rnnt_loss(x, tg, il, tl, impl=impl, **dict(opts))
    return _weighted(out), out


_RNNT_VG = jax.jit(jax.value_and_grad(_rnnt_weighted, has_aux=True),
                   static_argnames=("impl", "opts"))


def _rnnt_vs_host(x, tg, il, tl, dtype, opts=(("reduction", "none"),)):
    (_, lh), gh = _RNNT_VG(x, tg, il, tl, impl="host", opts=opts)
    (_, lp), gp = _RNNT_VG(x, tg, il, tl, impl="pallas", opts=opts)
    assert lp.dtype == lh.dtype and gp.dtype == gh.dtype == dtype
    assert_close(lp, lh, dtype, 10.0)
    assert_close(gp, gh, dtype)
    return lp, gp


@pytest.mark.parametrize("dtype,x64,opts", [
    (np.float32, False, (("reduction", "none"),)),
    (np.float32, True, (("reduction", "none"),)),
    (np.float64, True, (("reduction", "none"),)),
    (np.float64, True, (("reduction", "mean"), ("clamp", 0.05), ("fastemit_lambda", 0.1),
                        ("delay_penalty", 0.2)))],
    ids=MODE_IDS + ["mean-clamp-fastemit-delay"])
def test_rnnt_loss_pallas_equals_host(dtype, x64, opts):
    with jax.enable_x64(x64):
        x, tg, il, tl = rnnt_case(dtype)
        if not dict(opts).get("fused_log_softmax", True):
            x = jax.nn.log_softmax(x, -1)
        lp, _ = _rnnt_vs_host(x, tg, il, tl, dtype, opts)
        if dict(opts)["reduction"] == "none":
            assert np.asarray(lp)[2] == 0.0 and np.isposinf(lp[3])   # zero frames


def test_rnnt_nan_row_poisons_only_its_sequence():
    with jax.enable_x64(True):
        x, tg, il, tl = rnnt_case(np.float64, seed=4)
        x = x.at[0, 2, 1, 3].set(jnp.nan).at[1, 5, 0, 0].set(jnp.nan)   # seq 1: past its frames
        keep = jnp.arange(5) == tg[4, 0]
        x = x.at[4, 0, 0, :].set(jnp.where(keep, 0.0, -jnp.inf))     # -inf scores, no NaN
        (_, lh), gh = _RNNT_VG(x, tg, il, tl, impl="host")
        (_, lp), gp = _RNNT_VG(x, tg, il, tl, impl="pallas")
        assert np.isnan(lp[0]) and np.all(np.isfinite(np.asarray(lp)[[1, 2, 4]]))
        assert_close(lp, lh, np.float64, 10.0)
        assert not np.any(np.isnan(np.asarray(gp)[1:]))
        assert_close(gp[1:], gh[1:], np.float64)


@pytest.mark.parametrize("t,u", [(0, 2), (3, 0)], ids=["T0", "U0"])
def test_rnnt_edge_shapes_equal_host(t, u):
    """No frames at all, no target positions at all (one frame: in `rnnt_case`)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(9)
        n, v = 3, 4
        x = jnp.asarray(rng.standard_normal((n, t, u + 1, v)))
        tg = jnp.asarray(rng.integers(0, v - 1, (n, u)))
        il = jnp.asarray([t, max(t - 1, 0), 0])
        tl = jnp.asarray([u, 0, max(u - 1, 0)])
        _rnnt_vs_host(x, tg, il, tl, np.float64)


def test_half_inputs_run_in_float32_and_second_derivatives_raise():
    with jax.enable_x64(False):
        x, tg, il, tl = rnnt_case(np.float32, seed=3)
        x = x.astype(jnp.bfloat16)
        f = lambda a, impl: dj.rnnt_loss(a, tg, il, tl, reduction="sum", impl=impl)
        vp, gp = jax.jit(jax.value_and_grad(f), static_argnums=1)(x, "pallas")
        vh, gh = jax.jit(jax.value_and_grad(f), static_argnums=1)(x, "host")
        assert gp.dtype == jnp.bfloat16 and vp.dtype == vh.dtype
        assert_close(vp, vh, np.float32, 10.0)
        assert_close(gp.astype(np.float32), gh.astype(np.float32), np.float32)
        x32 = x.astype(jnp.float32)
        for h in (f, lambda a, impl: dj.tdt_loss(
                jnp.concatenate([a, a[..., :2]], -1), tg, il, tl, 4, [0, 1], impl=impl)):
            with pytest.raises(NotImplementedError,
                               match="second derivatives are not implemented"):
                jax.eval_shape(jax.grad(lambda a, h=h: jax.grad(h)(a, "pallas").sum()), x32)


def test_rnnt_tpu_form_equals_host():
    with jax.enable_x64(False), interpret_as("tpu"):
        x, tg, il, tl = rnnt_case(np.float32, seed=2)
        f = jax.jit(jax.value_and_grad(lambda a: _weighted(
            dj.rnnt_loss(a, tg, il, tl, reduction="none", fastemit_lambda=0.1, impl="pallas"))))
        v, g = f(x)
        vh, gh = jax.value_and_grad(lambda a: _weighted(
            dj.rnnt_loss(a, tg, il, tl, reduction="none", fastemit_lambda=0.1, impl="host")))(x)
        assert_close(v, vh, np.float32, 10.0)
        assert_close(g, gh, np.float32)


# ---------------------------------------------------------------- k2's losses
def test_k2_losses_pallas_equal_host():
    """The simple loss (modified lattice, float32, with return_grad) and the pruned loss
    (regular, float64): losses and gradients, as the host path."""
    rng = np.random.default_rng(6)
    b, s, t, c, r = 3, 3, 6, 5, 2
    sym = jnp.asarray(rng.integers(1, c, (b, s)))
    bd = jnp.asarray([[0, 0, 3, 6], [0, 0, 1, 4], [0, 0, 0, 3]])
    lm, am = rng.standard_normal((b, s + 1, c)), rng.standard_normal((b, t, c))
    logits = rng.standard_normal((b, t, r, c))
    ranges = jnp.asarray(np.minimum(np.arange(t) // 2, s + 1 - r)[None, :, None]
                         + np.arange(r)[None, None, :]).repeat(b, 0)
    with jax.enable_x64(False):
        lm32, am32 = jnp.asarray(lm, jnp.float32), jnp.asarray(am, jnp.float32)
        simple = jax.jit(lambda a, b, impl: dj.rnnt_loss_simple(
            a, b, sym, 0, bd, "modified", reduction="none", return_grad=True, impl=impl),
            static_argnames="impl")
        for got, ref in zip(jax.tree_util.tree_leaves(simple(lm32, am32, impl="pallas")),
                            jax.tree_util.tree_leaves(simple(lm32, am32, impl="host"))):
            assert got.dtype == ref.dtype == np.float32
            assert_close(got, ref, np.float32, 10.0)
    with jax.enable_x64(True):
        pruned = jax.jit(jax.value_and_grad(lambda x, impl: dj.rnnt_loss_pruned(
            x, sym, ranges, 0, bd, reduction="sum", impl=impl)), static_argnames="impl")
        x = jnp.asarray(logits)
        for got, ref in zip(pruned(x, impl="pallas"), pruned(x, impl="host")):
            assert_close(got, ref, np.float64, 10.0)


# ---------------------------------------------------------------- TDT, multi-blank
def tdt_case(seed, n_dur, t=8, u=3, v=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, t, u + 1, v + n_dur)) * 2
    tg = rng.integers(0, v - 1, (4, u))          # blank = v - 1 never a label
    il = np.array([t, t - 2, 0, 4])
    tl = np.array([u, 1, 0, 2])
    return x, tg, il, tl


def _per_sequence_vg(f, x, impl):
    """Per-sequence losses and the gradient of their weighted sum, jitted."""
    fn = jax.jit(jax.value_and_grad(lambda z: _weighted(f(z, impl)), has_aux=False))
    _, g = fn(x)
    return jax.jit(lambda z: f(z, impl))(x), g


def _vs_host(f, x, dtype):
    lh, gh = _per_sequence_vg(f, x, "host")
    lp, gp = _per_sequence_vg(f, x, "pallas")
    assert lp.dtype == lh.dtype == gp.dtype == dtype
    assert_close(lp, lh, dtype, 10.0)
    assert_close(gp, gh, dtype)
    return lp, gp


@pytest.mark.parametrize("dtype,x64,durations,opts", [
    (np.float64, True, [0, 1, 2], {"sigma": 0.05}),
    (np.float32, True, [0, 1, 2], {"sigma": 0.05}),
    (np.float32, False, [1, 2, 3, 4, 5], {"fastemit_lambda": 0.3, "clamp": 0.2}),
    (np.float64, True, [0, 2], {"omega": 0.3, "sigma": 0.1})],
    ids=["d012-sigma-f64", "d012-sigma-f32-x64on", "d12345-fastemit-clamp-f32-x64off",
         "d02-omega-f64"])
def test_tdt_pallas_equals_host(dtype, x64, durations, opts):
    with jax.enable_x64(x64):
        x, tg, il, tl = tdt_case(len(durations), len(durations))

        def f(z, impl):
            return dj.tdt_loss(z, tg, il, tl, -1, durations, reduction="none", impl=impl,
                               **opts)

        lp, gp = _vs_host(f, jnp.asarray(x, dtype), dtype)
        assert np.isfinite(lp).all() and np.abs(gp).sum() > 0


def test_multiblank_pallas_equals_host():
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        x = jnp.asarray(rng.standard_normal((4, 9, 3, 7)) * 2)
        tg = rng.integers(0, 4, (4, 2))           # blank 6, big blanks 5 and 4
        il, tl = np.array([9, 5, 0, 8]), np.array([2, 1, 0, 2])

        def f(z, impl):
            return dj.multiblank_rnnt_loss(z, tg, il, tl, 6, [2, 4], reduction="none",
                                           sigma=0.05, fastemit_lambda=0.2, clamp=0.3,
                                           impl=impl)

        _vs_host(f, x, np.float64)


def test_tdt_infeasible_nan_and_no_targets_equal_host():
    """Durations [2]: an odd ``T_b`` has no path (+inf, zero gradient); a NaN a sequence
    reads poisons it, one outside its box is never read; no target positions at all."""
    with jax.enable_x64(True):
        x, tg, il, tl = tdt_case(11, 1, t=7)
        il = np.array([7, 4, 0, 6])
        x[1, 0, 0, 2] = np.nan
        x[3, 6:] = np.nan

        def f(z, impl):
            return dj.tdt_loss(z, tg, il, tl, -1, [2], reduction="none", impl=impl)

        lp, gp = _vs_host(f, jnp.asarray(x), np.float64)
        assert np.isposinf(lp[0]) and np.isnan(lp[1]) and lp[2] == 0 and np.isfinite(lp[3])
        assert not np.asarray(gp[0]).any() and np.isfinite(gp[3]).all()
        x0 = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 1, 8)))

        def g(z, impl):
            return dj.tdt_loss(z, np.zeros((2, 0), int), np.array([4, 2]), np.array([0, 0]),
                               -1, [0, 1, 2], reduction="none", impl=impl)

        _vs_host(g, x0, np.float64)


def test_tdt_and_multiblank_tpu_form_equal_host():
    with jax.enable_x64(False), interpret_as("tpu"):
        x, tg, il, tl = tdt_case(3, 3)

        def f(z, impl):
            return dj.tdt_loss(z, tg, il, tl, -1, [0, 1, 2], reduction="none", impl=impl,
                               omega=0.25)

        _vs_host(f, jnp.asarray(x, np.float32), np.float32)


# ---------------------------------------------------------------- transforms, lowering
def _pallas_grids(jaxpr):
    """The grids of the ``pallas_call`` equations run by ``jaxpr`` (custom_vjp's forward)."""
    grids = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            grids.append(tuple(eqn.params["grid_mapping"].grid))
        for sub in jaxprs_in_params(eqn.params):
            grids += _pallas_grids(sub)
    return grids


def test_vmap_is_one_launch_and_equals_host():
    """``vmap`` batches into the kernel's grid (no loop of launches)."""
    with jax.enable_x64(True):
        x, tg, il, tl = rnnt_case(np.float64, n=3)
        xs = jnp.stack([x, 0.5 * x])

        def f(impl):
            return jax.vmap(jax.value_and_grad(lambda a: _weighted(
                dj.rnnt_loss(a, tg, il, tl, reduction="none", impl=impl))))

        jaxpr = jax.make_jaxpr(f("pallas"))(xs)
        assert "callback" not in str(jaxpr) and " while[" not in str(jaxpr).split("pallas_call")[0]
        assert set(_pallas_grids(jaxpr.jaxpr)) == {(2, 3)}     # (vmapped, batch)
        got, ref = jax.jit(f("pallas"))(xs), jax.jit(f("host"))(xs)
        assert_close(got[0], ref[0], np.float64, 10.0)
        assert_close(got[1], ref[1], np.float64)


def _custom_calls(module_text):
    """The targets of the module's custom calls."""
    return set(re.findall(r"stablehlo\.custom_call @([\w$.]+)", module_text))


def _export_text(f, args, platform):
    from jax import export
    checks = []
    if platform == "cuda":  # the Triton call's target has no compatibility guarantee
        checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    return export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(
        *args).mlir_module()


@pytest.mark.parametrize("platform,backend,marker", [
    ("tpu", "pallas-tpu", "tpu_custom_call"), ("cuda", "pallas-gpu", "__gpu$xla.gpu.triton")])
def test_kernels_lower_for_tpu_and_cuda_without_a_callback(platform, backend, marker):
    """Each kernel (transducer regular and modified, TDT, multi-blank; loss only, loss and
    gradients) lowers on this CPU-only machine: Mosaic for TPU, Triton for CUDA; the
    module holds no host callback."""
    for kind in ("regular", "modified"):
        n, s, t = 2, 3, 5
        px = jnp.zeros((n, s, t + 1 if kind == "regular" else t), jnp.float32)
        py = jnp.zeros((n, s + 1, t), jnp.float32)
        bd = jnp.asarray([[0, 0, s, t], [0, 0, 1, 3]])

        def loss(a, b, bd=bd, kind=kind):
            return transducer_losses(a, b, bd, kind, backend=backend)

        for f in (loss, jax.value_and_grad(lambda a, b: loss(a, b).sum(), (0, 1))):
            targets = _custom_calls(_export_text(f, (px, py), platform))
            assert marker in targets and not any("callback" in c for c in targets), targets
    x = jnp.zeros((2, 5, 3, 6 + 3), jnp.float32)
    tg, il, tl = jnp.asarray([[1, 2], [3, 0]]), jnp.asarray([5, 3]), jnp.asarray([2, 1])
    for f in (lambda z: tdt_losses(z, tg, il, tl, blank=5, durations=(0, 1, 2), sigma=0.0,
                                   fastemit_lambda=0.0, clamp=-1.0, omega=0.0, path=backend),
              lambda z: multiblank_losses(z, tg, il, tl, blank=8, big_blank_durations=(2, 4),
                                          sigma=0.0, fastemit_lambda=0.0, clamp=-1.0,
                                          path=backend)):
        for h in (f, jax.value_and_grad(lambda z, f=f: f(z).sum())):
            targets = _custom_calls(_export_text(h, (x,), platform))
            assert marker in targets and not any("callback" in c for c in targets), targets


@pytest.mark.parametrize("platform,marker", [("tpu", "tpu_custom_call"),
                                             ("cuda", "__gpu$xla.gpu.triton")])
def test_device_picks_the_kernels_on_tpu_and_cuda(platform, marker):
    """``impl='device'`` traced for a TPU or a CUDA GPU (`lowering_for`) exports the
    Pallas kernels for RNN-T and TDT; float64 on a TPU exports the XLA scan instead."""
    from jax import export

    from duoloss.jax._pallas import lowering_for
    checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    x = jnp.zeros((2, 5, 3, 6 + 2), jnp.float32)
    tg, il, tl = jnp.asarray([[1, 2], [3, 0]]), jnp.asarray([5, 3]), jnp.asarray([2, 1])

    def exported(f, z):
        with lowering_for(platform):
            return _custom_calls(export.export(jax.jit(jax.value_and_grad(f)),
                                               platforms=[platform], disabled_checks=checks)(
                z).mlir_module())

    for f in (lambda z: dj.rnnt_loss(z[..., :6], tg, il, tl, impl="pallas"),
              lambda z: dj.tdt_loss(z, tg, il, tl, 5, [0, 1], impl="pallas")):
        assert marker in exported(f, x)
    if platform == "tpu":
        with jax.enable_x64(True):
            targets = exported(lambda z: dj.rnnt_loss(z, tg, il, tl, impl="device"),
                               jnp.zeros((2, 5, 3, 6), jnp.float64))
            assert marker not in targets and not any("callback" in c for c in targets)


def test_triton_ir_compiles_to_ptx_for_ampere_and_hopper():
    """The Triton IR Pallas writes for the GPU kernels (the transducer's -- the same body
    for both lattices -- and the duration transducers', with gradients), compiled by this
    machine's Triton for sm_80 and sm_90: a kernel Triton refuses fails here, not on a
    GPU (where XLA compiles the IR with the Triton inside jaxlib)."""
    triton = pytest.importorskip("triton")
    from jax import export
    from jax._src.pallas.triton import lowering as tl_lowering
    from triton.backends.compiler import GPUTarget

    from duoloss.jax._pallas import lowering_for
    if not hasattr(tl_lowering, "lower_jaxpr_to_triton_module"):  # pragma: no cover
        pytest.skip("this JAX lowers Pallas-Triton differently")
    texts = []
    lower = tl_lowering.lower_jaxpr_to_triton_module

    def keep(*a, **k):
        out = lower(*a, **k)
        texts.append(out.module.operation.get_asm(enable_debug_info=False))
        return out

    x = jnp.zeros((2, 5, 3, 6 + 3), jnp.float32)
    tg, il, tl = jnp.asarray([[1, 2], [3, 0]]), jnp.asarray([5, 3]), jnp.asarray([2, 1])
    steps = (lambda z: dj.rnnt_loss(z[..., :6], tg, il, tl, impl="pallas"),
             lambda z: dj.tdt_loss(z, tg, il, tl, 5, [0, 1, 2], impl="pallas"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tl_lowering, "lower_jaxpr_to_triton_module", keep)
        for f in steps:
            with lowering_for("cuda"):
                export.export(jax.jit(jax.value_and_grad(f)), platforms=["cuda"],
                              disabled_checks=[export.DisabledSafetyCheck.custom_call(
                                  "__gpu$xla.gpu.triton")])(x)
    assert [re.search(r"tt\.func public @(\w+)", t).group(1) for t in texts] == [
        "duoloss_transducer_regular_grad", "duoloss_duration_transducer_grad"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")
        for i, text in enumerate(texts):
            path = Path(tempfile.mkdtemp()) / f"kernel{i}.ttir"
            path.write_text(text)
            for cc in (80, 90):
                k = triton.compile(str(path), target=GPUTarget("cuda", cc, 32),
                                   options={"num_warps": 1, "num_stages": 1})
                assert "bar.sync" in k.asm["ptx"] and len(k.asm["cubin"]) > 0


def test_jitted_pallas_path_has_no_callback():
    x, tg, il, tl = rnnt_case(np.float32)
    f = jax.jit(jax.value_and_grad(lambda a: dj.rnnt_loss(a, tg, il, tl, impl="pallas")))
    text = str(jax.make_jaxpr(f)(x))
    assert "callback" not in text and "pallas_call" in text


SHARD_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import duoloss.jax as dj
assert len(jax.devices()) == 2
mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((4, 5, 3, 4)), jnp.float32)
rt = jnp.asarray(rng.integers(0, 3, (4, 2)))
ril, rtl = jnp.asarray([5, 4, 2, 1]), jnp.asarray([2, 1, 0, 2])
def rnnt(x, rt, ril, rtl):
    return dj.rnnt_loss(x, rt, ril, rtl, reduction="none", impl="pallas")
specs = (P("d"),) * 4
def both(a, *r):
    return rnnt(a, *r), jax.grad(lambda a: rnnt(a, *r).sum())(a)
args = (x, rt, ril, rtl)
ref, gref = jax.jit(both)(*args)
sm = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=specs, out_specs=(P("d"), specs[0])))
# check_vma=True (the default) traces: the kernels' outputs vary over the mesh as their inputs
text = str(jax.make_jaxpr(sm)(*args))
assert "callback" not in text and "pallas_call" in text
# Pallas' interpreter itself trips the varying-axes check (its ref slicing mixes varying
# refs with invariant indices); compiled kernels do not run it
sm = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=specs, out_specs=(P("d"), specs[0]),
                           check_vma=False))
got, g = sm(*args)
np.testing.assert_allclose(got, ref, rtol=1e-6)
np.testing.assert_allclose(g, gref, rtol=1e-6, atol=1e-7)
sharded = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
v, gg = jax.jit(jax.value_and_grad(lambda a, *r: rnnt(a, *r).sum()))(*sharded)
np.testing.assert_allclose(v, ref.sum(), rtol=1e-6)
np.testing.assert_allclose(gg, gref, rtol=1e-6, atol=1e-7)
tdt = lambda a, *r: dj.tdt_loss(a, *r, -1, [0, 1, 2], reduction="none", omega=0.25,
                                impl="pallas")
xt = jnp.asarray(rng.standard_normal((4, 5, 3, 4 + 3)), jnp.float32)
both_t = lambda a, *r: (tdt(a, *r), jax.grad(lambda a: tdt(a, *r).sum())(a))
# the duration kernel traces with check_vma=True too (run: the recursion's test above)
assert "pallas_call" in str(jax.make_jaxpr(jax.shard_map(
    both_t, mesh=mesh, in_specs=specs, out_specs=(P("d"), specs[0])))(xt, rt, ril, rtl))
print("SHARD OK")
"""


def test_shard_map_and_sharded_jit_on_two_cpu_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", SHARD_SCRIPT], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "SHARD OK" in proc.stdout, proc.stderr[-4000:]
