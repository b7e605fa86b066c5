"""The JAX Pallas path: kernels written with ``jax.experimental.pallas`` and the
one decision of which JAX path a call takes.

`backend_for` turns a call's ``impl`` word and inputs into one of

* ``"host"``: the numba core through one callback;
* ``"xla"``: the ``lax.scan`` device path (`duoloss.jax._xla`), any platform;
* ``"pallas-gpu"``: a Pallas kernel lowered through Triton (CUDA GPUs);
* ``"pallas-tpu"``: a Pallas kernel lowered through Mosaic (TPUs);
* ``"pallas-interpret"``: the Pallas kernel run by Pallas' interpreter
  (``interpret=True``) on any other platform (CPU): slow, for tests and debugging.

The words: ``'host'`` and ``'xla'`` force theirs; ``'pallas'`` forces Pallas
(interpreted where it does not lower); ``'device'`` picks Pallas on the platforms of
`DEVICE_PALLAS_PLATFORMS` (those where the kernels have been validated on the
hardware: CUDA) and the XLA scan elsewhere (CPU, ROCm, and TPUs until validated);
``'auto'`` is ``'device'`` when an input lives on an accelerator and ``'host'``
otherwise (CPU users keep the numba core).

Where a call runs is decided at trace time, from its inputs: a concrete
``jax.Array`` runs on the platform of its devices; a traced value (inside
``jit``, ``vmap``, ``shard_map``, ``grad``) or a numpy array on the default
backend's (``jax.default_backend()``): a ``jit`` whose inputs are committed to
another platform than the default one, or a ``jax.export`` for another
platform, should trace inside `lowering_for` (``with lowering_for("tpu"):``).

`pallas_call_options` gives the keyword arguments of ``pl.pallas_call`` for a
Pallas backend (the Triton compiler parameters on a GPU, none on a TPU, the
interpreter elsewhere), across the JAX versions this package supports.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax
import numpy as np

from duoloss.core._validate import IMPLS
from duoloss.core._validate import check_impl as _check_impl

__all__ = ["BACKENDS", "backend_for", "check_impl", "interpret_as", "interpret_target",
           "is_pallas", "lowering_for", "pallas_call_options", "pallas_target"]

#: What `backend_for` returns.
BACKENDS = ("host", "xla", "pallas-gpu", "pallas-tpu", "pallas-interpret")

_ACCELERATORS = ("gpu", "tpu", "cuda", "rocm", "metal")
_GPU = ("gpu", "cuda", "rocm")


#: The platforms on which ``impl='device'`` (and ``'auto'`` with inputs there) takes the
#: Pallas kernels rather than the XLA scan: those whose kernels have passed
#: ``python -m benchmarks.device --check`` on the real hardware.  CUDA: every Pallas
#: kernel (CTC, ``optax_ctc_loss``, RNN-T, k2's lattice, TDT, multi-blank) equalled the
#: host path in float32 and float64 on an H200 (Triton lowering, 2026-11-28, commit
#: cd734a0, ``benchmarks/results/device-check-h200-cd734a0.json``), at 0.05x
#: ``optax.ctc_loss``'s step.  TPUs are not listed: the kernels lower for them
#: (tests/test_pallas_export.py) but have never run on one, so a TPU user keeps the XLA
#: scan unless they ask for ``impl='pallas'``.
DEVICE_PALLAS_PLATFORMS: frozenset = frozenset({"cuda"})


def check_impl(fn: str, impl) -> str:
    """``impl`` if it is one of the JAX words (`IMPLS`), else the frontends' ``ValueError``."""
    return _check_impl(fn, impl, IMPLS)


@functools.cache
def _gpu_is_rocm() -> bool:
    try:
        return "rocm" in str(jax.devices("gpu")[0].client.platform_version).lower()
    except (RuntimeError, IndexError, AttributeError):  # no GPU backend (as here)
        return False


def _concrete_platforms(arrays) -> list:
    out = []
    for x in arrays:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            try:
                out.extend(d.platform for d in x.devices())
            except (AttributeError, RuntimeError):  # pragma: no cover - deleted arrays
                pass
    return out


# A platform named by `lowering_for` (trace for it whatever the inputs' placement).
_TARGET: list = []


@contextlib.contextmanager
def lowering_for(platform: str) -> Iterator[None]:
    """Within the block, calls are traced as if they ran on ``platform`` (``'cuda'``,
    ``'rocm'``, ``'tpu'`` or ``'cpu'``) whatever their inputs' placement: for
    ``jax.export(..., platforms=[platform])`` from another machine, or a ``jit``
    whose inputs live on another platform than the default backend's.  Trace-time
    state, as `interpret_as`: a ``jit`` traced inside the block keeps its kernels
    when called outside it (use a fresh ``jit`` per platform)."""
    if platform not in ("cuda", "rocm", "tpu", "cpu"):
        raise ValueError(f"lowering_for: argument 'platform' must be 'cuda', 'rocm', 'tpu' "
                         f"or 'cpu', got {platform!r}")
    _TARGET.append(platform)
    try:
        yield
    finally:
        _TARGET.pop()


def _platform(arrays) -> str:
    """The platform the call runs on: `lowering_for`'s, else that of the first
    concrete ``jax.Array``'s devices, else the default backend's (traced values,
    numpy arrays)."""
    if _TARGET:
        return _TARGET[-1]
    plats = _concrete_platforms(arrays)
    plat = plats[0] if plats else jax.default_backend()
    if plat in ("cuda", "rocm"):
        return plat
    if plat == "gpu":
        return "rocm" if _gpu_is_rocm() else "cuda"
    return plat


def _on_accelerator(arrays) -> bool:
    """``impl='auto'``'s test: an input committed to an accelerator, or a traced
    input while the default backend is one (numpy arrays: host memory)."""
    if _TARGET:
        return _TARGET[-1] != "cpu"
    for x in arrays:
        if isinstance(x, jax.core.Tracer):
            if jax.default_backend() in _ACCELERATORS:
                return True
        elif isinstance(x, jax.Array):
            try:
                if any(d.platform in _ACCELERATORS for d in x.devices()):
                    return True
            except (AttributeError, RuntimeError):  # pragma: no cover - deleted arrays
                pass
    return False


def backend_for(fn: str, impl, *arrays, dtype=None, has_pallas: bool = True) -> str:
    """Which path runs ``fn`` (one of `BACKENDS`); see the module's docstring.

    Args:
      fn: the public function's name, for messages.
      impl: the user's ``impl`` word (validated here: ``ValueError`` otherwise).
      *arrays: the inputs whose placement decides (``None`` skipped).
      dtype: the dtype the kernel computes in; float64 refuses ``'pallas'`` on a
        TPU (``ValueError``) and sends ``'device'`` to the XLA scan there.
      has_pallas: ``False`` for a function with no Pallas kernel: ``'device'`` and
        ``'auto'`` then mean the XLA scan and ``'pallas'`` raises
        ``NotImplementedError``.
    """
    impl = check_impl(fn, impl)
    arrays = [x for x in arrays if x is not None]
    if impl == "host":
        return "host"
    if impl == "xla":
        return "xla"
    if impl == "auto" and not _on_accelerator(arrays):
        return "host"
    if impl == "pallas" and not has_pallas:
        raise NotImplementedError(
            f"{fn}: impl='pallas' is not available: this function has no Pallas kernel; "
            f"impl='device' or 'xla' run its XLA scan on any platform")
    if not has_pallas:
        return "xla"
    plat = _platform(arrays)
    wide = dtype is not None and np.dtype(dtype) == np.float64
    chosen = impl == "pallas" or plat in DEVICE_PALLAS_PLATFORMS
    if plat == "tpu":
        if wide:
            if impl == "pallas":
                raise ValueError(
                    f"{fn}: impl='pallas' computes in float32 or narrower on a TPU (Mosaic "
                    f"has no float64), got float64 inputs; use impl='xla' (or 'device', "
                    f"which takes the XLA scan for float64 on a TPU)")
            return "xla"
        return "pallas-tpu" if chosen else "xla"
    if plat == "cuda":
        return "pallas-gpu" if chosen else "xla"
    # CPU, ROCm (Triton lowering untested there), anything else
    return "pallas-interpret" if impl == "pallas" else "xla"


def is_pallas(backend: str) -> bool:
    """Whether `backend_for`'s answer is one of the Pallas paths."""
    return backend.startswith("pallas")


# Which kernel form ("gpu": the Triton-style kernel, "tpu": the Mosaic-style one) the
# interpreter runs; the GPU form by default, switched by tests with `interpret_as`.
_INTERPRET = ["gpu"]


def interpret_target() -> str:
    """The kernel form ``'pallas-interpret'`` runs (``'gpu'`` unless `interpret_as`)."""
    return _INTERPRET[-1]


@contextlib.contextmanager
def interpret_as(target: str) -> Iterator[None]:
    """Within the block, ``'pallas-interpret'`` runs the ``target`` (``'gpu'`` or
    ``'tpu'``) form of each kernel (for tests: the TPU form on a CPU).  Trace-time
    state: calls traced inside the block keep the form they were traced with."""
    if target not in ("gpu", "tpu"):
        raise ValueError(f"interpret_as: argument 'target' must be 'gpu' or 'tpu', "
                         f"got {target!r}")
    _INTERPRET.append(target)
    try:
        yield
    finally:
        _INTERPRET.pop()


def pallas_target(backend: str) -> tuple:
    """``(form, interpret)``: the kernel form (``'gpu'``/``'tpu'``) and whether
    it runs in the interpreter, for a Pallas `backend_for` answer."""
    if backend == "pallas-gpu":
        return "gpu", False
    if backend == "pallas-tpu":
        return "tpu", False
    if backend == "pallas-interpret":
        return interpret_target(), True
    raise ValueError(f"pallas_target: {backend!r} is not a Pallas backend")


def _triton_params_class():
    """The Triton lowering's compiler-parameter class: ``plgpu.CompilerParams``
    (jax >= 0.7, including 0.10.2 and 0.11.2), ``TritonCompilerParams`` before."""
    from jax.experimental.pallas import triton as plgpu
    cls = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams", None)
    if cls is None:  # pragma: no cover - a JAX without the Triton lowering
        raise RuntimeError("duoloss: this JAX has no Pallas Triton lowering "
                           "(jax.experimental.pallas.triton.CompilerParams)")
    return cls


def pallas_call_options(backend: str, *, num_warps: int = 4, num_stages: int = 1) -> dict:
    """Keyword arguments of ``pl.pallas_call`` for a Pallas backend.

    ``pallas-gpu``: the Triton lowering (chosen by its compiler parameters; JAX's
    default GPU lowering, Mosaic GPU, is not used), with ``num_warps`` and
    ``num_stages``.  ``pallas-tpu``: Mosaic's defaults.  ``pallas-interpret``:
    ``interpret=True`` (the TPU form runs in the same generic interpreter)."""
    if backend == "pallas-gpu":
        return {"compiler_params": _triton_params_class()(num_warps=num_warps,
                                                          num_stages=num_stages)}
    if backend == "pallas-tpu":
        return {}
    if backend == "pallas-interpret":
        return {"interpret": True}
    raise ValueError(f"pallas_call_options: {backend!r} is not a Pallas backend")
