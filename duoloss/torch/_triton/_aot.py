"""Ahead-of-time compilation of the device path's kernel variants (no GPU needed).

The launchers (`duoloss.torch._triton._ops`, `_rnnt_ops`, `_dur_ops`) are run
on ``meta`` tensors of a given shape with `duoloss.torch._triton._ops.RECORD` set:
every launch they would make is recorded instead, with its arguments.  Triton's own
binder (``create_function_from_signature`` + ``JITFunction._pack_args``, what a
launch runs) turns each into the signature, constants, attributes and options of
the variant a GPU would compile, and ``triton.compile`` builds it for a
``GPUTarget`` with the ``ptxas`` inside the Triton wheel.  ``ptxas -v`` (the flags
Triton passes) gives registers and spills; Triton's metadata the shared memory; the
TTIR says whether every pointer offset is 64-bit.

Used by ``tests/test_aot_compile.py`` and ``benchmarks/aot_table.py``; it must be
imported in a process where ``TRITON_INTERPRET`` is unset (the kernels must be
defined for a GPU).  Not part of the public API.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from typing import Callable, Dict, Iterable, List, Tuple

import torch

from . import _ops

__all__ = ["compile_variant", "record", "variants", "ctc_launches", "transducer_launches",
           "rnnt_loss_launches", "dur_launches"]

_META = torch.device("meta")


def record(fn: Callable[[], object]) -> List[tuple]:
    """The launches ``fn()`` makes, as ``(kernel, grid, args, kwargs)``, none run."""
    old = _ops.RECORD
    _ops.RECORD = []
    try:
        fn()
        return _ops.RECORD
    finally:
        _ops.RECORD = old


# ------------------------------------------------------------- the launchers
def ctc_launches(n: int, t: int, c: int, s: int, dtype: torch.dtype, want_grad: bool,
                 zero_infinity: bool = False, split: bool = False) -> List[tuple]:
    """Launches of the CTC operator for ``log_probs`` ``(T, N, C)`` and padded
    targets ``(N, S)`` (reduction ``'mean'``) in one form whatever the block
    (``_ops.CTC_SPLIT_MIN_BLOCK``): the two-launch form (``split``) or the fused
    kernel."""
    lp = torch.empty((t, n, c), dtype=dtype, device=_META)
    tg = torch.empty((n, s), dtype=torch.int64, device=_META)
    il = torch.empty((n,), dtype=torch.int64, device=_META)
    old = _ops.CTC_SPLIT_MIN_BLOCK
    _ops.CTC_SPLIT_MIN_BLOCK = 0 if split else 1 << 30
    try:
        return record(lambda: _ops._ctc_impl(lp, tg, il, il, 0, zero_infinity, 2, True, n,
                                             s, False, False, want_grad))
    finally:
        _ops.CTC_SPLIT_MIN_BLOCK = old


def transducer_launches(n: int, t: int, u: int, dtype: torch.dtype, want_grad: bool,
                        modified: bool = False) -> List[tuple]:
    """Launches of the transducer operator for ``px`` ``(N, U, T + 1)`` (``T``
    modified) and ``py`` ``(N, U + 1, T)``."""
    px = torch.empty((n, u, t if modified else t + 1), dtype=dtype, device=_META)
    py = torch.empty((n, u + 1, t), dtype=dtype, device=_META)
    bd = torch.empty((n, 4), dtype=torch.int64, device=_META)
    return record(lambda: _ops._transducer_impl(px, py, bd, modified, want_grad))


def rnnt_loss_launches(n: int, t: int, u: int, v: int, dtype: torch.dtype, want_grad: bool,
                       reduction: str = "mean") -> List[tuple]:
    """Launches of ``rnnt_loss``'s fused device path for logits ``(N, T, U + 1, V)``:
    the forward's (normaliser, recursion, reduction) and, with ``want_grad``, the
    backward's gradient kernel."""
    from . import _rnnt_ops
    x = torch.empty((n, t, u + 1, v), dtype=dtype, device=_META)
    tg = torch.empty((n, u), dtype=torch.int64, device=_META)
    il = torch.empty((n,), dtype=torch.int64, device=_META)

    def run():
        out, work = _rnnt_ops.rnnt_forward_impl(x, tg, il, il, v - 1, reduction, True, 0.0,
                                                0.0, want_grad)
        if want_grad:
            _rnnt_ops.rnnt_grad_impl(x, work, tg, il, il, out, v - 1, reduction, True, 0.0,
                                     -1.0)
    return record(run)


def dur_launches(n: int, t: int, u: int, v: int, family: str, durations: Tuple[int, ...],
                 dtype: torch.dtype, want_grad: bool, reduction: str = "mean") -> List[tuple]:
    """Launches of the fused ``tdt_loss`` (``family='tdt'``: ``V`` token classes then
    the durations) or ``multiblank_rnnt_loss`` (``'multiblank'``: ``durations`` the big
    blanks' durations) device path, forward and (``want_grad``) backward."""
    from . import _dur_ops
    if family == "tdt":
        spec = _dur_ops.tdt_spec(durations, 0.1, len(durations))
        width = v + len(durations)
    else:
        spec = _dur_ops.multiblank_spec(durations, 0.1)
        width = v
    x = torch.empty((n, t, u + 1, width), dtype=dtype, device=_META)
    tg = torch.empty((n, u), dtype=torch.int64, device=_META)
    il = torch.empty((n,), dtype=torch.int64, device=_META)

    def run():
        out, work = _dur_ops.forward_impl(x, tg, il, il, spec, v - 1, reduction, 0.0, want_grad)
        if want_grad:
            _dur_ops.grad_impl(x, work, tg, il, il, out, spec, v - 1, reduction, 0.0, 0.5)
    return record(run)


# ------------------------------------------------------------ the variants
def _binder(kernel, target):
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(target)
    return backend, create_function_from_signature(kernel.signature, kernel.params, backend)


def variant(launch: tuple, target) -> dict:
    """What a launch compiles on ``target``: ``{"kernel", "signature", "constexprs",
    "attrs", "options"}`` from Triton's own binder."""
    kernel, _grid, args, kwargs = launch
    backend, binder = _binder(kernel, target)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec,
                                                              options)
    return {"kernel": kernel, "signature": signature, "constexprs": constexprs,
            "attrs": attrs, "options": options}


def key(v: dict) -> str:
    """A stable identity of a variant (kernel, signature, constants, attributes,
    warps and stages)."""
    o = v["options"]
    text = repr((v["kernel"].fn.__name__, sorted(v["signature"].items()),
                 sorted(v["constexprs"].items()), sorted(v["attrs"].items()),
                 o.num_warps, o.num_stages))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def variants(launches: Iterable[tuple], target) -> Dict[str, dict]:
    """The distinct variants of ``launches`` on ``target``, by `key`."""
    out: Dict[str, dict] = {}
    for launch in launches:
        v = variant(launch, target)
        out.setdefault(key(v), v)
    return out


_PTXAS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")
# a pointer offset in TTIR: `tt.addptr %p, %off : <ptr type>, <offset type>`


def _ptxas_v(ptx: str, capability: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    ptxas = get_ptxas(capability).path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, "-v", "--regAllocOptLevel=2",
                               f"--gpu-name={sm_arch_from_capability(capability)}", src,
                               "-o", os.path.join(d, "k.o")],
                              capture_output=True, text=True, check=True)
    return done.stderr


def offset_widths(ttir: str) -> Dict[str, int]:
    """Counts of the pointer offsets (``tt.addptr``) in TTIR: ``"i32"``, ``"i64"``
    (all), ``"scalar_i32"`` (32-bit offsets of a scalar pointer other than a
    literal constant: a per-sequence or per-frame base computed in 32 bits)."""
    counts = {"i32": 0, "i64": 0, "scalar_i32": 0}
    for line in ttir.splitlines():
        if "tt.addptr" not in line:
            continue
        ty = line.split(" loc(")[0].rsplit(",", 1)[-1].strip()
        m = re.search(r"i(32|64)", ty)
        if m:
            counts["i" + m.group(1)] += 1
            operand = line.split(":")[0].rsplit(",", 1)[-1].strip()
            constant = re.fullmatch(r"%c-?\d+_i32(_\d+)?", operand) is not None
            if m.group(1) == "32" and not ty.startswith("tensor") and not constant:
                counts["scalar_i32"] += 1
    return counts


def compile_variant(v: dict, target) -> dict:
    """Compile ``v`` for ``target``: ``{"regs", "spill_stores", "spill_loads",
    "stack", "shared", "num_warps", "offsets": {"i32", "i64"}}``."""
    import triton
    from triton.compiler import ASTSource
    src = ASTSource(fn=v["kernel"], signature=v["signature"], constexprs=v["constexprs"],
                    attrs=v["attrs"])
    k = triton.compile(src, target=target, options=v["options"].__dict__)
    log = _ptxas_v(k.asm["ptx"], target.arch)
    regs = max(int(x) for x in _PTXAS.findall(log))
    spills = [(int(a), int(b)) for a, b in _SPILL.findall(log)]
    return {"regs": regs,
            "spill_stores": max(a for a, _ in spills), "spill_loads": max(b for _, b in spills),
            "stack": max(int(x) for x in _STACK.findall(log)),
            "shared": int(k.metadata.shared), "num_warps": int(k.metadata.num_warps),
            "offsets": offset_widths(k.asm["ttir"])}
