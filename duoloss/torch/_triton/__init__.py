"""The torch device path: Triton kernels for CTC and the transducer recursion.

`resolve_impl` picks the path of a call (``impl="auto" | "host" |
"device"``); `ctc_losses` and `transducer_losses` run the device
path on already-validated, framework-side inputs and return differentiable
per-sequence losses.  Nothing crosses to the host: the kernels are launched on
the caller's CUDA stream (Triton's launcher uses the current stream) and write
their outputs into tensors allocated on the inputs' device.

Importing this package does not import Triton; the kernels
(`duoloss.torch._triton._kernels`) are imported on the first device call.
On CPU tensors they run under the Triton interpreter, which must be selected
with ``TRITON_INTERPRET=1`` in the environment *before* that first call.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from typing import List, Tuple

import torch

from duoloss.core._validate import IMPLS, check_impl

__all__ = ["IMPLS", "check_impl", "ctc_losses", "resolve_impl", "transducer_losses",
           "transducer_losses_and_grads", "triton_available", "ctc_device",
           "rnnt_device_tail", "int_to", "ints_on"]

_WARNED: List[str] = []


def triton_available() -> Tuple[bool, str]:
    """``(True, "")`` when Triton is importable, else ``(False, reason)``."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'duoloss[cuda]')"
    return True, ""


# looked up once: resolve_impl runs inside torch.compile traces
_AVAILABLE = triton_available()


def int_to(x, device: torch.device) -> torch.Tensor:
    """Integer arguments (numpy array, list or tensor) as an int64 tensor on ``device``.

    From the host to a CUDA device the copy goes through pinned memory with
    ``non_blocking=True``: a copy from pageable memory waits for the stream (a host
    synchronisation) and is refused inside a CUDA graph capture; the pinned
    staging copy is the call's own, so the caller may reuse its array at once.
    """
    t = torch.as_tensor(x)
    if t.device.type == "cpu" and device.type == "cuda":
        if t.dtype != torch.int64:
            t = t.to(torch.int64)
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device=device, dtype=torch.int64)


def ints_on(device: torch.device, *xs) -> tuple:
    """Integer tensors on ``device``: those already there as they are (the kernels read
    any integer dtype), the others through `int_to`.  For the traced paths (a CUDA
    graph capture, a ``vmap``), whose integers were not read on the host: host
    integers then reach the kernels through pinned memory (no sync, allowed while
    capturing), never as host pointers."""
    return tuple(x if x.device == device else int_to(x, device) for x in xs)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _is_cuda(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cuda"


def resolve_impl(fn: str, impl, tensor: torch.Tensor) -> bool:
    """Whether the call takes the device path (True) or the host path (False).

    ``'auto'``: the device path for CUDA tensors when Triton is importable (else
    the host path, with one warning per process naming the reason); the host
    path for everything else.  ``'device'``: the Triton kernels anywhere; on CPU
    tensors only under the Triton interpreter (``TRITON_INTERPRET=1``), else a
    ``RuntimeError`` saying so.  Raises ``ValueError`` for any other ``impl``.
    """
    check_impl(fn, impl)
    if impl == "host" or not isinstance(tensor, torch.Tensor):
        return False  # (not a tensor: the host path's validation raises)
    ok, reason = _AVAILABLE
    if impl == "auto":
        if not _is_cuda(tensor):
            return False
        if not ok:
            if not _WARNED:
                _WARNED.append(reason)
                warnings.warn(f"duoloss: the device path is unavailable ({reason}); "
                              f"{fn} and the other losses run on the host (a copy of the "
                              f"lattice to the host and back per call)", RuntimeWarning,
                              stacklevel=3)
            return False
        return True
    if not ok:
        raise RuntimeError(f"{fn}: impl='device' needs Triton, but {reason}")
    if tensor.device.type == "cpu":
        if torch.compiler.is_compiling():
            return True  # not checked while tracing (Triton refuses CPU tensors itself)
        from . import _ops
        # the interpreter is needed both when the kernels are defined and when they run
        if not (_interpreting() and _ops.kernels_interpreted() is not False):
            raise RuntimeError(
                f"{fn}: impl='device' on CPU tensors runs the Triton kernels in Triton's "
                f"interpreter, which needs TRITON_INTERPRET=1 in the environment before the "
                f"first device call (for testing; use impl='host' or 'auto' on CPU)")
    elif tensor.device.type != "cuda":
        raise RuntimeError(f"{fn}: impl='device' supports CUDA tensors (and CPU tensors under "
                           f"TRITON_INTERPRET=1), got a tensor on {tensor.device}")
    return True


def ctc_losses(lp: torch.Tensor, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor,
               zero_infinity: bool) -> torch.Tensor:
    """``(N,)`` CTC losses on the gathered lattice, differentiable w.r.t. ``lp``.

    ``lp`` ``(T, N, S + 1)`` (column 0 the blank, column ``1 + i`` label ``i``);
    ``targets`` ``(N, S)`` int64, only compared with each other for the skip rule
    (labels, or the gather plan's first-occurrence columns);
    ``il``/``tl`` ``(N,)`` int64 on the same device.  Invalid rows (lengths out
    of range) get NaN.
    """
    from . import _ops
    return _ops.ctc(lp, targets, il, tl, bool(zero_infinity))


def rnnt_device_tail(*args):
    """`duoloss.torch._triton._frontend.rnnt_device_tail`."""
    from . import _frontend
    return _frontend.rnnt_device_tail(*args)


def ctc_device(*args):
    """`duoloss.torch._triton._frontend.ctc_device`."""
    from . import _frontend
    return _frontend.ctc_device(*args)


def transducer_losses(px: torch.Tensor, py: torch.Tensor, boundary: torch.Tensor,
                      rnnt_type: str) -> torch.Tensor:
    """``(N,)`` transducer losses (the core's ``TRANSDUCER_KERNEL`` maths),
    differentiable w.r.t. ``px`` and ``py``; invalid boundary rows get NaN."""
    from . import _ops
    return _ops.transducer(px, py, boundary, rnnt_type != "regular")


def transducer_losses_and_grads(px, py, boundary, rnnt_type):
    """``(losses, gx, gy)``: differentiable losses and their per-sequence
    gradients w.r.t. ``px``/``py`` (detached), for k2's ``return_grad``."""
    from . import _ops
    return _ops.transducer_with_grads(px, py, boundary, rnnt_type != "regular")
