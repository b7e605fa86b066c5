"""One ``torch.library`` custom operator for every core loss: what ``torch.compile`` sees.

``duoloss::kernel_loss`` runs any `LossKernel` on host
buffers.  The kernel travels as a *string* (``"module:qualname"`` of its
``run`` function) and its static arguments as a JSON string, so the operator
is registered once, at import, under a deterministic name, and every loss
added to the core works under ``torch.compile`` without a line of frontend
code.  Its fake (meta) rule derives every output shape from the input shapes,
and its autograd rule only scales the per-sequence gradients the forward
already returned, so ``torch.compile(model + loss + backward, fullgraph=True)``
traces through it with no graph break.  Its vmap rule folds a vmapped
dimension into the batch, so ``torch.compile(torch.func.vmap(loss))`` makes one
core call.

Eager code and ``torch.func`` transforms do *not* go through this operator (a
``custom_op`` with ``register_autograd`` fails under ``torch.func.grad``,
pytorch#168393); `duoloss.torch._adapter` picks the path.

Schema::

    duoloss::kernel_loss(str run, str static, int[] batch_axes, bool[] want,
                         Tensor? weights, Tensor[] inputs) -> Tensor[]

``batch_axes`` uses ``-1`` for shared inputs.  The outputs are the losses
(``(N,)``, or a scalar ``sum_b weights[b] * loss_b`` when ``weights`` is
given) followed by one per-sequence gradient per input with ``want`` set:
same shape as a batched input, ``(N, *shape)`` for a shared one, or the
input's shape when ``weights`` is given (weights already folded in).
"""
from __future__ import annotations

import functools
import importlib
import json
from typing import List, Optional, Sequence

import numpy as np
import torch

from duoloss.core import LossKernel
from duoloss.core import _pool

from . import _private
from ._private import mark_constant_result
from duoloss.core._reduce import run_reduced

from ._weights import scale_cotangent, weigh_batched

__all__ = ["FastApply", "GRAD_OP_NAME", "OP_NAME", "fold", "host", "kernel_grad_op", "kernel_id",
           "kernel_loss_op", "run_on_host", "second_order_message", "static_json", "unfold",
           "vmap_fold"]

OP_NAME = "duoloss::kernel_loss"

# torch's CPU wheels load GNU OpenMP for their intra-op threads: the host losses run
# their batches on that team (duoloss.core._pool: its threads busy-wait after every torch
# operator, and duoloss's own threads beside them ran a CTC step 1.6x slower)
_pool.attach_openmp()

# Key of the static JSON that carries LossKernel.weighted to the operator, so
# the compiled path folds the reduction weights exactly as the eager one.
_WEIGHTED_KEY = "__weighted__"


# Kernel names by kernel id, for the operators' error messages.
_NAMES: dict = {}


@mark_constant_result  # dynamo misreads function.__qualname__
def kernel_id(kernel: LossKernel) -> str:
    """``"module:qualname"`` of ``kernel.run``: how the operator names a kernel."""
    run_id = f"{kernel.run.__module__}:{kernel.run.__qualname__}"
    _NAMES[run_id] = kernel.name
    return run_id


@functools.lru_cache(maxsize=None)
def _resolve(run_id: str):
    """The ``run`` function named by ``run_id`` (must be reachable by import)."""
    module, _, qualname = run_id.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        obj = None
    if not callable(obj):
        raise ValueError(
            f"{OP_NAME}: cannot find the kernel function {run_id!r}; under torch.compile a "
            f"LossKernel's run must be a module-level function (found by import)")
    return obj


def static_json(kernel: LossKernel, static: dict) -> str:
    """The static arguments as a JSON object string (bool/int/float/str/None values).

    Written by hand rather than with `json.dumps`, which dynamo cannot trace.
    """
    parts = ['"' + _WEIGHTED_KEY + '": true'] if kernel.weighted else []
    for key in sorted(static):
        value = static[key]
        if value is None:
            text = "null"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif isinstance(value, str) and value.isidentifier():
            text = '"' + value + '"'
        else:
            raise TypeError(
                f"{kernel.name}: under torch.compile, static argument '{key}' must be a bool, "
                f"int, float, identifier-like str or None, got {value!r}")
        parts.append('"' + key + '": ' + text)
    return "{" + ", ".join(parts) + "}"


def _loss_dtype(inputs: Sequence[torch.Tensor]) -> torch.dtype:
    for t in inputs:
        if t.is_floating_point():
            return t.dtype
    raise TypeError(f"{OP_NAME}: no floating-point input")


def _batch_size(batch_axes: Sequence[int], inputs: Sequence[torch.Tensor]):
    for axis, t in zip(batch_axes, inputs):
        if axis >= 0:
            return t.shape[axis]
    raise ValueError(f"{OP_NAME}: the kernel has no batched input")


def host(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (CPU: no copy) of a plain (not functorch-wrapped) tensor."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    return t.numpy()


def run_on_host(run, weighted: bool, batch_axes: Sequence[Optional[int]], arrays, want,
                weights: Optional[np.ndarray], static: dict):
    """One core call on host arrays: ``(losses, grads)``, every path's forward.

    `duoloss.core._reduce.run_reduced` (the JAX frontend calls the same):
    ``grads`` has one entry per input (None where not wanted: the
    `LossKernel` contract), subnormals flushed.  With
    ``weights`` (float64 ``(N,)``) the losses are reduced to ``sum_b w_b
    loss_b`` (correctly rounded, in no framework's order) and the gradients are
    those of that sum; a kernel that takes ``grad_weights`` (``weighted``)
    weighs them in its own stores.
    """
    previous = _pool.openmp_wanted(True)
    try:
        return run_reduced(run, weighted, batch_axes, arrays, want, weights, static)
    finally:
        _pool.openmp_wanted(previous)


@torch.library.custom_op(OP_NAME, mutates_args=())
def kernel_loss_op(run: str, static: str, batch_axes: List[int], want: List[bool],
                   weights: Optional[torch.Tensor], inputs: List[torch.Tensor]
                   ) -> List[torch.Tensor]:
    """Losses and wanted per-sequence gradients of the kernel ``run`` (see module doc)."""
    fn = _resolve(run)
    device = inputs[0].device
    arrays = tuple(host(t) for t in inputs)
    axes = tuple(None if a < 0 else a for a in batch_axes)
    w = None if weights is None else host(weights).astype(np.float64)
    static = json.loads(static)
    weighted = bool(static.pop(_WEIGHTED_KEY, False))
    losses, grads = run_on_host(fn, weighted, axes, arrays, tuple(bool(x) for x in want), w,
                                static)
    out = [torch.from_numpy(np.array(losses, copy=True)).to(device)]
    for i, g in enumerate(grads):
        if want[i]:
            out.append(torch.from_numpy(np.ascontiguousarray(g)).to(device))
    return out


@kernel_loss_op.register_fake
def _fake(run, static, batch_axes, want, weights, inputs):
    _resolve(run)  # fail at trace time, not at run time, on an unknown kernel
    n = _batch_size(batch_axes, inputs)
    ref = inputs[0]
    out = [ref.new_empty(() if weights is not None else (n,), dtype=_loss_dtype(inputs))]
    for i, t in enumerate(inputs):
        if want[i]:
            shared = batch_axes[i] < 0 and weights is None
            out.append(t.new_empty(((n,) if shared else ()) + tuple(t.shape)))
    return out


def _setup_context(ctx, inputs, output):
    run, _, batch_axes, want, weights, tensors = inputs
    ctx.name = _NAMES.get(run, run)
    ctx.batch_axes = tuple(batch_axes)
    ctx.want = tuple(want)
    ctx.weighted = weights is not None
    # The wanted inputs too: the backward passes them to kernel_grad_op, so a
    # compiled create_graph=True backward stays linked to them and a second
    # differentiation raises instead of treating the gradient as a constant.
    ctx.save_for_backward(*output[1:], *[t for t, w in zip(tensors, want) if w])


def _backward(ctx, grads):
    g = grads[0]
    if g is not None and not any(ctx.want):
        # autograd reached a loss that computed no gradient: its inputs looked
        # constant when it was traced (torch.compile of a torch.func.vmap hides
        # requires_grad); returning None would silently drop the gradient
        raise RuntimeError(
            f"{ctx.name}: the loss computed no gradient (its inputs did not require grad "
            f"when traced); differentiating torch.compile(torch.func.vmap(loss)) is not "
            f"supported: differentiate the uncompiled vmap, or compile a batched call")
    saved = ctx.saved_tensors
    k = len(saved) // 2
    grads_in, inputs = iter(saved[:k]), iter(saved[k:])
    result = []
    for wanted, axis in zip(ctx.want, ctx.batch_axes):
        if not wanted:
            result.append(None)
            continue
        gr, x = next(grads_in), next(inputs)
        if g is None:
            result.append(None)
        else:
            result.append(kernel_grad_op(ctx.name, gr, g, x, axis, ctx.weighted))
    return None, None, None, None, None, result


GRAD_OP_NAME = "duoloss::kernel_grad"


@torch.library.custom_op(GRAD_OP_NAME, mutates_args=())
def kernel_grad_op(name: str, grad: torch.Tensor, grad_loss: torch.Tensor, x: torch.Tensor,
                   axis: int, weighted: bool) -> torch.Tensor:
    """An input's gradient: its per-sequence gradient ``grad`` scaled by the cotangent.

    ``x`` (the loss's input) is not read: it links the gradient to the input, so
    differentiating the gradient raises (AOTAutograd's "does not currently
    support double backward", or this operator's own error) instead of silently
    returning a Hessian without the loss's term.
    """
    return scale_cotangent(grad, grad_loss, axis, weighted)


@kernel_grad_op.register_fake
def _grad_fake(name, grad, grad_loss, x, axis, weighted):
    return grad.new_empty(x.shape)


def _grad_setup_context(ctx, inputs, output):
    ctx.name = inputs[0]


class FastApply:
    """Mixin (listed before ``torch.autograd.Function``) for a ``setup_context``-style
    Function whose ``forward`` has no default arguments: a plain eager ``apply`` goes
    straight to torch's C++ implementation (`_private.function_apply`), without
    ``Function.apply``'s ``inspect.signature`` binding, about 40 µs per call on a
    2-core VM: the device losses' hot path.  Under ``torch.func`` transforms or a
    ``torch.compile`` trace, ``Function.apply`` itself."""

    @classmethod
    def apply(cls, *args):
        if _private.transforms_active() or torch.compiler.is_compiling():
            return torch.autograd.Function.apply.__func__(cls, *args)
        for a in args:
            if isinstance(a, torch.Tensor) and _private.is_wrapped(a):
                args = _private.unwrap_dead_wrappers(args)
                break
        fast = _FAST_APPLY.get(cls)
        if fast is None:
            fast = _FAST_APPLY[cls] = _private.function_apply(cls)
        return fast(*args)


#: `FastApply`'s C++ ``apply`` bound to each class, made on its first call.
_FAST_APPLY: dict = {}


def second_order_message(name: str) -> str:
    """The error of every attempt to differentiate a duoloss gradient."""
    return (f"{name}: second derivatives are not implemented (the gradient is computed by "
            f"duoloss's kernel and is not itself differentiable)")


def _grad_backward(ctx, *unused):
    raise NotImplementedError(second_order_message(ctx.name))


kernel_grad_op.register_autograd(_grad_backward, setup_context=_grad_setup_context)


kernel_loss_op.register_autograd(_backward, setup_context=_setup_context)


def fold(x, d: Optional[int], axis: Optional[int], m: int):
    """Fold a vmapped dimension ``d`` of ``x`` into its batch axis ``axis`` (``m``
    copies of an input that is not vmapped); shared inputs pass through."""
    if axis is None:
        return x
    if d is None:
        if isinstance(x, torch.Tensor):
            x = x.unsqueeze(axis).expand(*x.shape[:axis], m, *x.shape[axis:])
        else:
            x = np.asarray(x)
            x = np.broadcast_to(np.expand_dims(x, axis), x.shape[:axis] + (m,) + x.shape[axis:])
        return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])
    x = x.movedim(d, axis)
    return x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])


def unfold(g: torch.Tensor, axis: Optional[int], m: int, n: int) -> torch.Tensor:
    """Inverse of `fold` on a gradient, with the vmapped dimension first."""
    if axis is None:  # (m * n, *shape) per-sequence gradients of a shared input
        return g.reshape(m, n, *g.shape[1:])
    g = g.reshape(*g.shape[:axis], m, n, *g.shape[axis + 1:])
    return g.movedim(axis, 0)


def vmap_fold(m: int, dims, wdim, batch_axes: Sequence[Optional[int]], want, weights,
              tensors, call):
    """The ``vmap`` rule of every path: fold the vmapped dimension into the batch axis.

    ``call(weights, tensors)`` runs the loss once on unbatched tensors and returns
    ``[losses, *wanted gradients]``; ``dims``/``wdim`` are the vmapped dimensions of
    ``tensors``/``weights`` (None: not vmapped), ``m`` the vmap size.  One call for
    all ``m`` instances (nested vmaps arrive one level at a time, each folding into
    the same call); only when a shared input (``batch_axes[i]`` None, e.g. a
    transition matrix) is itself vmapped are the instances run one by one.  Returns
    ``(outputs, out_dims)`` as lists, the vmapped dimension first.
    """
    if any(a is None and d is not None for a, d in zip(batch_axes, dims)):
        outs = []
        for j in range(m):
            args = [t.select(d, j) if d is not None else t for t, d in zip(tensors, dims)]
            w = weights.select(wdim, j) if wdim is not None else weights
            outs.append(call(w, args))
        return [torch.stack(o) for o in zip(*outs)], [0] * len(outs[0])
    n = next(t.shape[a + (d is not None and d <= a)]
             for t, d, a in zip(tensors, dims, batch_axes) if a is not None)
    folded = [fold(t, d, a, m) for t, d, a in zip(tensors, dims, batch_axes)]
    out = call(None, folded)
    losses = out[0].reshape(m, n)
    grads = [(unfold(g, batch_axes[i], m, n), batch_axes[i])
             for g, i in zip(out[1:], [i for i, w in enumerate(want) if w])]
    if weights is None:
        return [losses] + [g for g, _ in grads], [0] * (1 + len(grads))
    w = torch.as_tensor(weights, device=losses.device)
    w = w.unsqueeze(0).expand(m, n) if wdim is None else w.movedim(wdim, 0)
    losses, weighted = weigh_batched(losses, grads, w, m, n)
    return [losses] + weighted, [0] * (1 + len(weighted))


def _vmap_rule(info, in_dims, run, static, batch_axes, want, weights, inputs):
    """``vmap`` of the operator (e.g. ``torch.compile`` of a ``torch.func.vmap``)."""
    axes = [None if a < 0 else a for a in batch_axes]
    return vmap_fold(info.batch_size, in_dims[5], in_dims[4], axes, want, weights, inputs,
                     lambda w, args: kernel_loss_op(run, static, batch_axes, want, w, args))


kernel_loss_op.register_vmap(_vmap_rule)
