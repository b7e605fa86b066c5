"""The Pallas CTC kernels lower for the accelerators without one: ``jax.export`` of
``jit(value_and_grad(ctc_loss(..., impl=...)))`` for TPU (Mosaic) and for CUDA (the
Triton lowering) on this CPU-only machine, traced with
`duoloss.jax._pallas.lowering_for`.  The lowered modules hold the two kernels and no
host callback (``jax.export`` itself refuses to serialise one, and the
custom-call targets are checked as well).

What this holds and what it does not: the TPU export runs Pallas' lowering to
Mosaic MLIR (layouts, shapes, the primitives' TPU rules), not libtpu's compiler; the
CUDA export runs Pallas' lowering to Triton IR — ``jax.export`` refuses the Triton
custom call by default (no compatibility guarantee: the IR is tied to the jaxlib
that made it), so the test disables that one check, as a user exporting this kernel
would have to — and that IR is then compiled to PTX and cubin for sm_80 and sm_90 by
this machine's Triton (not the Triton inside a GPU jaxlib, which compiles it there).
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp
from jax import export

import duoloss.jax as dj
from duoloss.jax._pallas import lowering_for

TRITON = "__gpu$xla.gpu.triton"


def _case(dtype=np.float32):
    rng = np.random.default_rng(0)
    lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((6, 3, 5)), dtype), axis=-1)
    return (lp, jnp.asarray([[1, 1, 2], [3, 4, 0], [2, 3, 2]]), jnp.asarray([6, 5, 4]),
            jnp.asarray([3, 2, 3]))


def _exported(platform, impl, args, vmapped=False, **kw):
    lp, tg, il, tl = args

    def step(x):
        return jax.value_and_grad(
            lambda x: dj.ctc_loss(x, tg, il, tl, reduction="mean", impl=impl))(x)

    f = jax.vmap(step) if vmapped else step
    x = jnp.stack([lp, lp]) if vmapped else lp
    with lowering_for(platform):
        exp = export.export(jax.jit(f), platforms=[platform], **kw)(x)
    return exp.mlir_module()


def _targets(text):
    return re.findall(r"stablehlo\.custom_call @([\w$.\-]+)", text)


def _no_callback(text):
    """No custom call to a host callback (``xla_python_cpu_callback``,
    ``xla_ffi_python_gpu_callback``, ...); the test itself checks it can see one."""
    assert not [t for t in _targets(text) if "callback" in t.lower()]


def test_the_callback_check_sees_a_host_callback():
    def f(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    text = jax.jit(f).lower(jnp.zeros(3)).as_text()   # (jax.export refuses callbacks)
    with pytest.raises(AssertionError):
        _no_callback(text)
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        export.export(jax.jit(f), platforms=["cpu"])(jnp.zeros(3))


@pytest.mark.parametrize("impl", ["pallas", "device", "auto"])
def test_tpu_export_holds_the_two_mosaic_kernels(impl, monkeypatch):
    # 'device'/'auto' take the kernels once the TPU is listed as validated (not yet)
    from duoloss.jax import _pallas
    monkeypatch.setattr(_pallas, "DEVICE_PALLAS_PLATFORMS", frozenset({"tpu"}))
    text = _exported("tpu", impl, _case())
    _no_callback(text)
    assert _targets(text).count("tpu_custom_call") == 2
    assert "duoloss_ctc_alpha_tpu" in text and "duoloss_ctc_beta_tpu" in text


@pytest.mark.parametrize("impl", ["device", "auto"])
def test_tpu_export_with_device_is_the_scan_until_validated(impl):
    """No TPU (or GPU) has run the kernels yet: 'device' keeps the XLA scan there."""
    text = _exported("tpu", impl, _case())
    _no_callback(text)
    assert "tpu_custom_call" not in _targets(text) and "stablehlo.while" in text


def test_tpu_export_of_a_vmapped_step_is_still_two_kernels():
    text = _exported("tpu", "pallas", _case(), vmapped=True)
    _no_callback(text)
    assert _targets(text).count("tpu_custom_call") == 2


def test_tpu_float64_takes_the_scan_with_device_and_is_refused_with_pallas():
    with jax.enable_x64(True):
        args = _case(np.float64)
        text = _exported("tpu", "device", args)
        _no_callback(text)
        assert "tpu_custom_call" not in _targets(text) and "stablehlo.while" in text
        with pytest.raises(ValueError, match="ctc_loss: impl='pallas' computes in float32 "
                                             "or narrower on a TPU"):
            _exported("tpu", "pallas", args)


@pytest.mark.parametrize("dtype,x64", [(np.float32, False), (np.float64, True)])
def test_cuda_export_holds_the_two_triton_kernels(dtype, x64):
    with jax.enable_x64(x64):
        with pytest.raises(ValueError, match="custom calls whose targets have no "
                                             "compatibility guarantees"):
            _exported("cuda", "pallas", _case(dtype))
        text = _exported("cuda", "pallas", _case(dtype), disabled_checks=[
            export.DisabledSafetyCheck.custom_call(TRITON)])
    _no_callback(text)
    assert _targets(text).count(TRITON) == 2
    assert "num_warps = 1" in text           # W = 8 states: one warp (ctc._num_warps)


@pytest.mark.parametrize("in_kernel", [False, True])
def test_triton_ir_compiles_to_ptx_for_ampere_and_hopper(in_kernel, monkeypatch):
    """The Triton IR that Pallas writes for the two GPU kernels, compiled by this
    machine's Triton (ptxas included) for sm_80 and sm_90: a kernel Triton refuses
    fails here rather than on the GPU.  (On a GPU, XLA compiles the IR with the Triton
    inside jaxlib, not this one.)"""
    triton = pytest.importorskip("triton")
    from jax._src.pallas.triton import lowering as tl_lowering
    from triton.backends.compiler import GPUTarget
    if not hasattr(tl_lowering, "lower_jaxpr_to_triton_module"):  # pragma: no cover
        pytest.skip("this JAX lowers Pallas-Triton differently")
    from duoloss.jax._pallas import ctc as pctc
    monkeypatch.setattr(pctc, "POSTERIOR_IN_KERNEL", in_kernel)   # both beta variants
    modules = []
    orig = tl_lowering.lower_jaxpr_to_triton_module

    def capture(*a, **k):
        out = orig(*a, **k)
        modules.append(out.module.operation.get_asm(enable_debug_info=False))
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(tl_lowering, "lower_jaxpr_to_triton_module", capture)
    try:
        _exported("cuda", "pallas", _case(), disabled_checks=[
            export.DisabledSafetyCheck.custom_call(TRITON)])
    finally:
        mp.undo()
    assert len(modules) == 2 and "tt.func" in modules[0]
    mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        for i, text in enumerate(modules):
            path = Path(tempfile.mkdtemp()) / f"k{i}.ttir"
            path.write_text(text)
            for cc in (80, 90):
                k = triton.compile(str(path), target=GPUTarget("cuda", cc, 32),
                                   options={"num_warps": 1, "num_stages": 1})
                assert "bar.sync" in k.asm["ptx"] and len(k.asm["cubin"]) > 0
    finally:
        mp.undo()


def test_cpu_export_of_pallas_is_the_interpreter_without_callbacks():
    text = _exported("cpu", "pallas", _case())
    _no_callback(text)
    assert _targets(text) == [] and "stablehlo.while" in text


def test_lowering_for_rejects_unknown_platforms():
    with pytest.raises(ValueError, match="lowering_for: argument 'platform'"), \
            lowering_for("gpu"):
        pass
