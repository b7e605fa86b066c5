"""The JAX Pallas CTC (``impl='pallas'``, duoloss/jax/_pallas/ctc.py) in Pallas'
interpreter against the host path (the numba core is the oracle), optax and closed
forms, in both kernel forms: the GPU one (Triton-style: pointer gather, shifted
loads of a guard-padded row) and the TPU one (Mosaic-style: sublane blocks,
``pltpu.roll``), and the ``impl`` words' dispatch (`duoloss.jax._pallas.backend_for`).

Cases: lengths at their limits (``T`` frames, ``S`` labels, exactly as many frames as
the labels with their repeats need), empty targets, zero frames with and without
targets, ``T = 0``, infeasible targets, repeated labels, NaN frames, ``-inf`` scores,
every reduction with and without ``zero_infinity``; float32 with ``jax_enable_x64``
off and on, float64; ``jit`` (no callback), ``grad``, ``vmap`` (one launch) and
``shard_map`` on two CPU devices.  Tolerances: float64 1e-12 relative (the issue
asks 1e-9), float32 1e-5 relative for losses and 1e-6 absolute for gradients
(posteriors, in [0, 1]) in the interpreter.
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
from duoloss.jax import _pallas
from duoloss.jax._pallas import backend_for, interpret_as

ROOT = Path(__file__).resolve().parents[1]
# (dtype, jax_enable_x64, kernel form): the TPU form computes in float32 only
MODES = [(np.float32, False, "gpu"), (np.float32, True, "gpu"), (np.float64, True, "gpu"),
         (np.float32, False, "tpu")]
MODE_IDS = ["f32-x64off-gpu", "f32-x64on-gpu", "f64-gpu", "f32-tpu"]


def assert_close(got, ref, dtype, grad=False):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    ok = np.isfinite(ref)
    if dtype == np.float64:
        rtol, atol = 1e-12, 1e-13
    else:
        rtol, atol = (1e-5, 1e-6) if grad else (1e-5, 1e-5)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=rtol, atol=atol)


def case(dtype, seed=0, t=8, c=6, s=3):
    """Lengths at the limits: seq 0 uses all ``t`` frames and ``s`` labels; seq 1 has
    exactly the frames its labels and repeat need (2 + 1 + 1 = 4... with ``[2, 2, 3]``:
    3 labels + 1 blank between the repeat); seq 2 empty targets; seq 3 zero frames and
    no target; seq 4 zero frames with a target (infeasible); seq 5 infeasible by repeats;
    seq 6 a single frame and a single label."""
    rng = np.random.default_rng(seed)
    n = 7
    lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((t, n, c)), dtype), axis=-1)
    tg = rng.integers(1, c, (n, s))
    tg[1] = [2, 2, 3]
    tg[5] = [4, 4, 4]
    il = np.array([t, 4, 5, 0, 0, 4, 1])
    tl = np.array([s, 3, 0, 0, 2, 3, 1])
    return lp, jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl)


def _weighted(x, tg, il, tl, impl, reduction="none", zero_infinity=False):
    out = dj.ctc_loss(x, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity,
                      impl=impl)
    w = jnp.arange(1.0, 1.0 + out.size, dtype=out.dtype).reshape(out.shape)
    return (jnp.where(jnp.isinf(out), 0, out) * w).sum(), out


# one compiled function per kernel form: the form is read when a call is traced, and
# is not part of jit's cache key
_VG = {form: jax.jit(jax.value_and_grad(_weighted, has_aux=True),
                     static_argnames=("impl", "reduction", "zero_infinity"))
       for form in ("gpu", "tpu")}


def _run(form, *args, **kw):
    with interpret_as(form):
        (_, loss), grad = _VG[form](*args, **kw)
    return loss, grad


def test_each_form_runs_its_own_kernels():
    lp, tg, il, tl = case(np.float32)
    for form, name in (("gpu", "duoloss_ctc_alpha"), ("tpu", "duoloss_ctc_alpha_tpu")):
        with interpret_as(form):
            names = [_call_name(c) for c in _pallas_calls(
                jax.make_jaxpr(lambda x: dj.ctc_loss(x, tg, il, tl, impl="pallas"))(lp))]
        assert names == [name], names


@pytest.mark.parametrize("dtype,x64,form", MODES, ids=MODE_IDS)
def test_pallas_equals_host(dtype, x64, form):
    with jax.enable_x64(x64):
        lp, tg, il, tl = case(dtype)
        lh, gh = _run(form, lp, tg, il, tl, impl="host")
        lpl, gpl = _run(form, lp, tg, il, tl, impl="pallas")
        assert lpl.dtype == lh.dtype == dtype and gpl.dtype == dtype
        assert_close(lpl, lh, dtype)
        assert_close(gpl, gh, dtype, grad=True)
        assert np.isposinf(lh[4]) and np.isposinf(lh[5]) and np.isfinite(lh[1])
        assert np.asarray(lpl)[3] == 0.0                     # zero frames, zero targets
        assert not np.any(np.asarray(gpl)[:, [3, 4, 5]])      # infeasible or empty: zero


@pytest.mark.parametrize("reduction,zero_infinity", [("sum", True), ("mean", False),
                                                     ("mean", True), ("none", True)])
def test_reductions_and_zero_infinity_equal_host(reduction, zero_infinity):
    with jax.enable_x64(True):
        lp, tg, il, tl = case(np.float64, seed=1)
        kw = {"reduction": reduction, "zero_infinity": zero_infinity}
        lh, gh = _run("gpu", lp, tg, il, tl, impl="host", **kw)
        lpl, gpl = _run("gpu", lp, tg, il, tl, impl="pallas", **kw)
        assert_close(lpl, lh, np.float64)
        assert_close(gpl, gh, np.float64, grad=True)


def test_gpu_form_with_the_posteriors_in_the_kernel_equals_host(monkeypatch):
    """The GPU beta kernel's other variant (``POSTERIOR_IN_KERNEL``): the posteriors
    formed frame by frame inside the kernel, not in one XLA pass after it."""
    from duoloss.jax._pallas import ctc as pctc
    monkeypatch.setattr(pctc, "POSTERIOR_IN_KERNEL", True)
    with jax.enable_x64(True):
        lp, tg, il, tl = case(np.float64, seed=6)
        lp = lp.at[1, 2, :].set(jnp.nan)                  # a NaN read by sequence 2
        f = jax.jit(jax.value_and_grad(_weighted, has_aux=True),
                    static_argnames=("impl", "zero_infinity"))
        for zi in (False, True):
            (_, lh), gh = f(lp, tg, il, tl, impl="host", zero_infinity=zi)
            (_, lpl), gpl = f(lp, tg, il, tl, impl="pallas", zero_infinity=zi)
            assert_close(lpl, lh, np.float64)
            keep = [0, 1, 3, 4, 5, 6]
            assert np.all(np.isnan(np.asarray(gpl)[:2, 2]))
            assert_close(gpl[:, keep], gh[:, keep], np.float64, grad=True)


def test_tpu_form_carries_the_rows_across_frame_blocks(monkeypatch):
    """Frames in blocks of 3 (8 frames: 3 blocks, one padded frame): alpha's carry goes
    forward through the VMEM scratch, beta's backward through the reversed blocks."""
    from duoloss.jax._pallas import ctc as pctc
    monkeypatch.setattr(pctc, "_frame_block", lambda t_max, w: 3)
    lp, tg, il, tl = case(np.float32, seed=5)
    f = jax.jit(jax.value_and_grad(_weighted, has_aux=True), static_argnames=("impl",))
    (_, lh), gh = f(lp, tg, il, tl, impl="host")
    with interpret_as("tpu"):
        (_, lpl), gpl = f(lp, tg, il, tl, impl="pallas")
        calls = _pallas_calls(jax.make_jaxpr(lambda x: f(x, tg, il, tl, impl="pallas"))(lp))
    assert [tuple(c.params["grid_mapping"].grid) for c in calls] == [(1, 3), (1, 3)]
    assert_close(lpl, lh, np.float32)
    assert_close(gpl, gh, np.float32, grad=True)


@pytest.mark.parametrize("form", ["gpu", "tpu"])
def test_zero_frames_batch(form):
    """``T = 0``: no kernel runs; the empty target has loss 0, any other +inf, and the
    gradient is an empty array."""
    lp = jnp.zeros((0, 2, 4), jnp.float32)
    tg, il, tl = jnp.asarray([[1], [0]]), jnp.asarray([0, 0]), jnp.asarray([1, 0])
    with interpret_as(form):
        loss = dj.ctc_loss(lp, tg, il, tl, reduction="none", impl="pallas")
        g = jax.grad(lambda x: dj.ctc_loss(x, tg, il, tl, reduction="sum",
                                           zero_infinity=True, impl="pallas"))(lp)
    np.testing.assert_array_equal(np.asarray(loss), [np.inf, 0.0])
    assert g.shape == (0, 2, 4)


def test_nan_frame_poisons_only_its_sequence_and_padding_is_never_read():
    with jax.enable_x64(True):
        lp, tg, il, tl = case(np.float64, seed=3)
        lp = lp.at[2, 1, :].set(jnp.nan)           # inside sequence 1
        lp = lp.at[6, 2, :].set(jnp.nan)           # past sequence 2's 5 frames
        lp = lp.at[:, 0, 5].set(-jnp.inf)          # a class sequence 0 never reads
        tg = tg.at[0].set(jnp.asarray([1, 1, 2]))
        lh, gh = _run("gpu", lp, tg, il, tl, impl="host")
        lpl, gpl = _run("gpu", lp, tg, il, tl, impl="pallas")
        assert np.isnan(lpl[1]) and np.all(np.isfinite(np.asarray(lpl)[[0, 2, 3, 6]]))
        assert_close(lpl, lh, np.float64)
        keep = [0, 2, 3, 4, 5, 6]
        assert not np.any(np.isnan(np.asarray(gpl)[:, keep]))
        assert_close(gpl[:, keep], gh[:, keep], np.float64, grad=True)


def test_large_vocabulary_gradient_equals_host():
    """Above 512 classes the gradient's scatter is a scatter-add, not a one-hot product."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(8)
        lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((5, 3, 600))), axis=-1)
        tg = jnp.asarray([[7, 420], [599, 599], [3, 3]])   # repeats of the last class
        il, tl = jnp.asarray([5, 4, 2]), jnp.asarray([2, 2, 1])
        lh, gh = _run("gpu", lp, tg, il, tl, impl="host")
        lpl, gpl = _run("gpu", lp, tg, il, tl, impl="pallas")
        assert_close(lpl, lh, np.float64)
        assert_close(gpl, gh, np.float64, grad=True)


@pytest.mark.parametrize("form", ["gpu", "tpu"])
def test_single_alignment_closed_form(form):
    """T == S and no repeats: one alignment, loss = -sum of its log-probs, gradient -onehot."""
    rng = np.random.default_rng(1)
    lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((4, 1, 6)), jnp.float32), -1)
    path = [1, 3, 2, 5]
    with interpret_as(form):
        loss, g = jax.value_and_grad(lambda x: dj.ctc_loss(
            x, jnp.asarray([path]), jnp.asarray([4]), jnp.asarray([4]), reduction="sum",
            impl="pallas"))(lp)
    want = -sum(float(lp[t, 0, k]) for t, k in enumerate(path))
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
    onehot = np.zeros((4, 1, 6))
    onehot[np.arange(4), 0, path] = 1.0
    np.testing.assert_allclose(np.asarray(g), -onehot, atol=1e-6)


def test_half_precision_is_accumulated_in_float32():
    lp, tg, il, tl = case(np.float32, seed=4)
    for half in (jnp.bfloat16, jnp.float16):
        x = lp.astype(half)
        lpl, gpl = _run("gpu", x, tg, il, tl, impl="pallas")
        lh, gh = _run("gpu", x.astype(jnp.float32), tg, il, tl, impl="host")
        assert lpl.dtype == half and gpl.dtype == half
        np.testing.assert_allclose(np.asarray(lpl, np.float32)[[0, 1, 2, 6]],
                                   np.asarray(lh)[[0, 1, 2, 6]], rtol=1e-2)
        np.testing.assert_allclose(np.asarray(gpl, np.float32), np.asarray(gh), atol=1e-2)


def test_optax_ctc_loss_pallas_equals_optax():
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
        got, g = jax.jit(jax.value_and_grad(
            lambda x: dj.optax_ctc_loss(x, lpad, labels, bpad, impl="pallas").sum()))(logits)
        np.testing.assert_allclose(float(got), float(ref), rtol=2e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(gref), atol=2e-6)


def _pallas_calls(jaxpr):
    """The ``pallas_call`` equations of a closed jaxpr, nested ones included."""
    out = []

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "pallas_call":
                out.append(eqn)
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (list, tuple)) else [p]):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None and hasattr(inner, "eqns"):
                        walk(inner)
                    elif hasattr(sub, "eqns"):
                        walk(sub)

    walk(jaxpr.jaxpr)
    return out


def _call_name(eqn):
    info = eqn.params.get("name_and_src_info")       # (older JAX)
    return getattr(info, "name", None) or eqn.params.get("name")


def test_vmap_is_one_launch_over_the_folded_batch_and_equals_a_loop():
    with jax.enable_x64(True):
        lps = jnp.stack([case(np.float64, seed=i)[0] for i in range(3)])
        _, tg, il, tl = case(np.float64)
        f = lambda x: dj.ctc_loss(x, tg, il, tl, reduction="sum", zero_infinity=True,
                                  impl="pallas")
        vg = jax.vmap(jax.value_and_grad(f))
        calls = _pallas_calls(jax.make_jaxpr(vg)(lps))
        # one alpha and one beta launch, each over 3 x 7 sequences
        assert len(calls) == 2, [_call_name(c) for c in calls]
        for c in calls:
            grid = c.params["grid_mapping"].grid
            assert tuple(grid) == (21,), grid
        got = jax.jit(vg)(lps)
        one = jax.jit(jax.value_and_grad(f))
        for i in range(3):
            v, g = one(lps[i])
            np.testing.assert_allclose(got[0][i], v, rtol=1e-13)
            np.testing.assert_allclose(got[1][i], g, atol=1e-13)


def test_jitted_pallas_path_has_no_callback_and_device_on_cpu_is_the_scan():
    lp, tg, il, tl = case(np.float32)
    f = lambda impl: jax.make_jaxpr(jax.jit(jax.value_and_grad(
        lambda a: dj.ctc_loss(a, tg, il, tl, reduction="sum", impl=impl))))(lp)
    text = str(f("pallas"))
    assert "callback" not in text and "pallas_call" in text
    text = str(f("device"))                                  # on CPU: the XLA scan
    assert "callback" not in text and "pallas_call" not in text and "scan" in text
    assert "pallas_call" not in str(f("xla"))
    assert "callback" in str(f("host"))


def test_second_derivatives_raise():
    lp, tg, il, tl = case(np.float32)
    f = lambda a: dj.ctc_loss(a, tg, il, tl, reduction="sum", impl="pallas")
    with pytest.raises(NotImplementedError, match="second derivatives are not implemented"):
        jax.grad(lambda a: jax.grad(f)(a).sum())(lp)


# ---------------------------------------------------------------- dispatch


def test_backend_for_on_this_cpu():
    x = jnp.zeros((2, 3), jnp.float32)
    want = {"auto": "host", "host": "host", "device": "xla", "xla": "xla",
            "pallas": "pallas-interpret"}
    for impl, backend in want.items():
        assert backend_for("f", impl, x) == backend
        traced: list = []
        jax.make_jaxpr(lambda a, impl=impl, traced=traced:
                       traced.append(backend_for("f", impl, a)) or a)(x)
        assert traced == [backend]
    assert backend_for("f", "pallas", np.zeros(2)) == "pallas-interpret"
    assert backend_for("f", "device", x, has_pallas=False) == "xla"
    with pytest.raises(NotImplementedError, match="f: impl='pallas' is not available"):
        backend_for("f", "pallas", x, has_pallas=False)
    with pytest.raises(ValueError, match="f: argument 'impl' must be one of 'auto', 'host', "
                                         "'device', 'xla', 'pallas', got 'gpu'"):
        backend_for("f", "gpu", x)


@pytest.mark.parametrize("validated", [False, True])
@pytest.mark.parametrize("platform,backend", [("gpu", "pallas-gpu"), ("tpu", "pallas-tpu")])
def test_backend_for_traced_values_follow_the_default_backend(monkeypatch, platform, backend,
                                                              validated):
    """'pallas' takes the kernel on the accelerator; 'device' and 'auto' take it only on
    a platform listed as validated on the hardware (CUDA; else the XLA scan)."""
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    monkeypatch.setattr(_pallas, "_gpu_is_rocm", lambda: False)
    plat = "cuda" if platform == "gpu" else platform
    monkeypatch.setattr(_pallas, "DEVICE_PALLAS_PLATFORMS",
                        frozenset({plat}) if validated else frozenset())
    x = jnp.zeros((2, 3), jnp.float32)
    seen = []
    jax.make_jaxpr(lambda a: [seen.append(backend_for("f", w, a, dtype=a.dtype))
                              for w in ("auto", "device", "pallas", "xla")] and a)(x)
    picked = backend if validated else "xla"
    assert seen == [picked, picked, backend, "xla"]
    # a concrete array committed to the CPU runs on the CPU whatever the default backend
    assert backend_for("f", "device", x) == "xla"
    assert backend_for("f", "auto", x) == "host"


def test_float64_on_a_tpu_takes_the_scan_or_is_refused(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    seen = []
    with jax.enable_x64(True):
        x = jnp.zeros((2, 3), jnp.float64)
        jax.make_jaxpr(lambda a: seen.append(backend_for("f", "device", a, dtype=a.dtype))
                       or a)(x)
        assert seen == ["xla"]
        with pytest.raises(ValueError, match="f: impl='pallas' computes in float32 or "
                                             "narrower on a TPU"):
            jax.make_jaxpr(lambda a: backend_for("f", "pallas", a, dtype=a.dtype) and a)(x)
        lp, tg, il, tl = case(np.float64)
        with interpret_as("tpu"), pytest.raises(ValueError, match="float64"):
            dj.ctc_loss(lp, tg, il, tl, impl="pallas")


def test_rocm_gpus_take_the_scan(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_pallas, "_gpu_is_rocm", lambda: True)
    seen = []
    jax.make_jaxpr(lambda a: [seen.append(backend_for("f", w, a)) for w in
                              ("device", "pallas")] and a)(jnp.zeros(2))
    assert seen == ["xla", "pallas-interpret"]


def test_functions_without_a_pallas_kernel_refuse_pallas():
    lp, tg, il, tl = case(np.float32)
    with pytest.raises(NotImplementedError, match="ctc_align: impl='pallas' is not available"):
        dj.ctc_align(lp[:, 0], tg[0], il[0], tl[0], impl="pallas")


def test_pallas_call_options_pick_the_triton_lowering():
    opts = _pallas.pallas_call_options("pallas-gpu", num_warps=8)
    params = opts["compiler_params"]
    assert type(params).__module__.startswith("jax") and params.num_warps == 8
    assert _pallas.pallas_call_options("pallas-interpret") == {"interpret": True}
    assert _pallas.pallas_call_options("pallas-tpu") == {}
    with pytest.raises(ValueError, match="not a Pallas backend"):
        _pallas.pallas_call_options("xla")
    with pytest.raises(ValueError, match="interpret_as: argument 'target'"), \
            interpret_as("cpu"):
        pass


SHARD_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import duoloss.jax as dj
assert len(jax.devices()) == 2
mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((7, 4, 5)), jnp.float32), -1)
tg = jnp.asarray(rng.integers(1, 5, (4, 3))); il = jnp.asarray([7, 5, 3, 0])
tl = jnp.asarray([3, 1, 2, 0])
specs = (P(None, "d"), P("d"), P("d"), P("d"))
def both(impl):
    def f(a, *r):
        return (dj.ctc_loss(a, *r, reduction="none", impl=impl),
                jax.grad(lambda a: dj.ctc_loss(a, *r, reduction="sum", impl=impl))(a))
    return f
ref, gref = jax.jit(both("host"))(lp, tg, il, tl)
sm = jax.jit(jax.shard_map(both("pallas"), mesh=mesh, in_specs=specs,
                           out_specs=(P("d"), specs[0])))
# check_vma=True (the default): the kernels' outputs vary over the mesh as their inputs
text = str(jax.make_jaxpr(sm)(lp, tg, il, tl))
assert "callback" not in text and "pallas_call" in text
# Pallas' interpreter itself trips the varying-axes check (its block slicing mixes
# varying refs with invariant grid indices); compiled kernels do not run it
sm = jax.jit(jax.shard_map(both("pallas"), mesh=mesh, in_specs=specs,
                           out_specs=(P("d"), specs[0]), check_vma=False))
got, g = sm(lp, tg, il, tl)
np.testing.assert_allclose(got, ref, rtol=1e-5)
np.testing.assert_allclose(g, gref, rtol=1e-5, atol=1e-6)
sharded = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((lp, tg, il, tl), specs)]
v, gg = jax.jit(jax.value_and_grad(
    lambda a, *r: dj.ctc_loss(a, *r, reduction="sum", impl="pallas")))(*sharded)
np.testing.assert_allclose(v, ref.sum(), rtol=1e-5)
np.testing.assert_allclose(gg, gref, rtol=1e-5, atol=1e-6)
print("SHARD OK")
"""


def test_shard_map_and_sharded_jit_on_two_cpu_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", SHARD_SCRIPT], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "SHARD OK" in proc.stdout, proc.stderr[-4000:]
