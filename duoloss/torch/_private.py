"""Every private torch API that ``duoloss.torch`` relies on, each behind one name.

No other module of the package touches ``torch._*`` (or private attributes of
public torch objects): when a torch release moves one of these, this is the one
file to fix.  Each entry says which torch versions it was checked on and what
happens when it is absent (the fallback is chosen once, at import).

Checked on: torch 2.13.0 (CPU).

Why each is needed:

* functorch introspection (``transforms_active``, ``is_wrapped``, ``unwrap``,
  ``is_batched_level``, ``clear_interpreter_stack``, ``maybe_legacy_batched``): the kernels read input
  values on the host, so the frontend must tell a tensor whose values it may
  read (a ``torch.func.grad`` wrapper: read its innermost tensor) from one
  whose values are unknown (a ``torch.func.vmap`` batch, handled by the vmap
  rule instead).  torch has no public API for "is this tensor batched".
* ``unwrap_dead_wrappers`` and ``function_apply``: the fast eager call of an
  ``autograd.Function`` (what ``Function.apply`` does, minus its
  ``inspect.signature`` binding, tens of microseconds per call).
* ``mark_constant_result``: ``torch.compiler.assume_constant_result`` without
  importing ``torch._dynamo`` at ``import duoloss.torch`` (1.7-4 s).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

__all__ = ["clear_interpreter_stack", "function_apply", "is_batched_level", "is_wrapped",
           "mark_constant_result", "maybe_legacy_batched", "transforms_active", "unwrap",
           "unwrap_dead_wrappers"]


def _false(*unused) -> bool:
    return False


# ``torch._C._are_functorch_transforms_active()``: True while a torch.func
# transform (grad, vjp, vmap, ...) is running.  Checked on 2.13.0.  Absent:
# always False (torch.func transforms are then seen as plain eager code, which
# the functorch-aware paths below also handle through Function.apply).
transforms_active: Callable[[], bool] = getattr(
    torch._C, "_are_functorch_transforms_active", _false)

_functorch = getattr(torch._C, "_functorch", None)

# ``torch._C._functorch.is_functorch_wrapped_tensor(t)``: t is a functorch
# wrapper (GradTrackingTensor or BatchedTensor).  Checked on 2.13.0.  Absent:
# False (no wrapper is ever unwrapped).
is_wrapped: Callable[[torch.Tensor], bool] = getattr(
    _functorch, "is_functorch_wrapped_tensor", _false)

# ``torch._C._functorch.is_batchedtensor(t)``: this wrapper level is a vmap
# batch.  Checked on 2.13.0.  Absent: False.
is_batched_level: Callable[[torch.Tensor], bool] = getattr(
    _functorch, "is_batchedtensor", _false)


def _true(*unused) -> bool:
    return True


# ``torch._C._functorch.is_legacy_batchedtensor(t)``: t is batched by the legacy
# vmap (``torch._vmap_internals.vmap``), which ``gradcheck(...,
# check_batched_grad=True)`` runs over a backward with no functorch transform
# active, so ``transforms_active`` does not see it.  Checked on 2.13.0.
# Absent: True (every tensor may be batched: the backward paths then take their
# tensor-op formulas, which give the same bits, never a host read).
maybe_legacy_batched: Callable[[torch.Tensor], bool] = getattr(
    _functorch, "is_legacy_batchedtensor", _true)


def _identity(t):
    return t


# ``torch._C._functorch.get_unwrapped(t)``: the tensor one functorch level down.
# Checked on 2.13.0.  Absent: the tensor itself (only reached when is_wrapped
# is True, i.e. never without it).
unwrap: Callable[[torch.Tensor], torch.Tensor] = getattr(_functorch, "get_unwrapped", _identity)

try:
    # ``torch._functorch.pyfunctorch.temporarily_clear_interpreter_stack()``:
    # context in which plain tensor code runs as if no transform were active
    # (to read the innermost values of a grad-wrapped tensor).  Checked on
    # 2.13.0.  Absent: a no-op context.
    from torch._functorch.pyfunctorch import (
        temporarily_clear_interpreter_stack as clear_interpreter_stack)
except ImportError:  # pragma: no cover
    clear_interpreter_stack = contextlib.nullcontext

try:
    # ``torch._functorch.utils.unwrap_dead_wrappers(args)``: what Function.apply
    # does to functorch wrappers whose transform has exited (e.g. the outputs
    # of a finished torch.func.vjp) before an eager call.  Checked on 2.13.0.
    # Absent: the arguments unchanged.
    from torch._functorch.utils import unwrap_dead_wrappers
except ImportError:  # pragma: no cover
    def unwrap_dead_wrappers(args):
        return args


def function_apply(cls):
    """``cls.apply`` of an ``autograd.Function`` without ``Function.apply``'s Python
    layer (its ``inspect.signature`` binding of default arguments and its
    functorch dispatch): ``torch._C._FunctionBase.apply`` bound to ``cls``.

    Only for plain eager calls (no ``torch.func`` transform active, arguments
    already free of dead functorch wrappers) of a ``forward`` without default
    arguments.  Checked on 2.13.0 (it handles ``setup_context``-style
    Functions).  Absent (no ``_FunctionBase.apply``): ``cls.apply`` of
    ``torch.autograd.Function`` itself.
    """
    if getattr(getattr(torch._C, "_FunctionBase", None), "apply", None) is None:
        return functools.partial(torch.autograd.Function.apply.__func__, cls)  # pragma: no cover
    return super(torch.autograd.Function, cls).apply


def mark_constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo``.

    That decorator imports dynamo only to set the private attribute
    ``_dynamo_marked_constant`` on ``fn``; setting it here keeps ``import
    duoloss.torch`` free of dynamo until compile is used.  Checked on 2.13.0.
    If dynamo stops reading the attribute, compiling still works but traces
    into ``fn`` (tests/test_compile_torch.py would show a graph break).
    """
    fn._dynamo_marked_constant = True
    return fn
