"""One ``torch.library`` custom operator for every core loss: what ``torch.compile`` sees.

``duoloss::kernel_loss`` runs any :class:`~duoloss.core.LossKernel` on host
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
pytorch#168393); :mod:`duoloss.torch._adapter` picks the path.

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

__all__ = ["GRAD_OP_NAME", "OP_NAME", "fold", "kernel_grad_op", "kernel_id", "kernel_loss_op",
           "second_order_message", "static_json", "unfold", "weigh_batched"]

OP_NAME = "duoloss::kernel_loss"


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo``.

    That decorator imports dynamo (1.7-4 s) only to set this attribute; setting
    it here keeps ``import duoloss.torch`` free of dynamo until compile is used
    (tests/test_compile_torch.py checks that compiling still works).
    """
    fn._dynamo_marked_constant = True
    return fn


# Kernel names by kernel id, for the operators' error messages.
_NAMES: dict = {}


@_assume_constant_result  # dynamo misreads function.__qualname__
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

    Written by hand rather than with :func:`json.dumps`, which dynamo cannot trace.
    """
    parts = []
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


def _host(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.numpy()


@torch.library.custom_op(OP_NAME, mutates_args=())
def kernel_loss_op(run: str, static: str, batch_axes: List[int], want: List[bool],
                   weights: Optional[torch.Tensor], inputs: List[torch.Tensor]
                   ) -> List[torch.Tensor]:
    """Losses and wanted per-sequence gradients of the kernel ``run`` (see module doc)."""
    fn = _resolve(run)
    device = inputs[0].device
    arrays = tuple(_host(t) for t in inputs)
    losses, grads = fn(arrays, tuple(bool(w) for w in want), **json.loads(static))
    if weights is not None:
        w = _host(weights).astype(np.float64)
        losses = np.asarray(np.dot(w, losses.astype(np.float64)), losses.dtype)
        folded = []
        for i, g in enumerate(grads):
            if g is None or not want[i]:
                folded.append(None)
            elif batch_axes[i] < 0:
                folded.append(np.tensordot(w.astype(g.dtype), g, axes=1))
            else:
                shape = [1] * g.ndim
                shape[batch_axes[i]] = -1
                folded.append(g * w.astype(g.dtype).reshape(shape))
        grads = folded
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
    if weighted:  # scalar loss, weights already applied
        return grad * grad_loss.to(grad.dtype)
    if axis < 0:  # shared input: (N, *shape) per-sequence gradients
        return torch.tensordot(grad_loss.to(grad.dtype), grad, dims=1)
    shape = [1] * grad.dim()
    shape[axis] = -1
    return grad * grad_loss.to(grad.dtype).reshape(shape)


@kernel_grad_op.register_fake
def _grad_fake(name, grad, grad_loss, x, axis, weighted):
    return grad.new_empty(x.shape)


def _grad_setup_context(ctx, inputs, output):
    ctx.name = inputs[0]


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
    """Inverse of :func:`fold` on a gradient, with the vmapped dimension first."""
    if axis is None:  # (m * n, *shape) per-sequence gradients of a shared input
        return g.reshape(m, n, *g.shape[1:])
    g = g.reshape(*g.shape[:axis], m, n, *g.shape[axis + 1:])
    return g.movedim(axis, 0)


def weigh_batched(losses, grads, weights, m: int, n: int):
    """Apply per-instance reduction weights ``(m, n)`` to vmapped losses ``(m, n)`` and
    per-sequence gradients (vmapped dimension first; ``grads`` are (tensor, axis) pairs)."""
    losses = (losses * weights.to(losses.dtype)).sum(-1)
    out = []
    for g, axis in grads:
        w = weights.to(g.dtype)
        if axis is None:  # (m, n, *shape) -> (m, *shape)
            out.append(torch.einsum("mn,mn...->m...", w, g))
        else:
            shape = [1] * g.dim()
            shape[0], shape[axis + 1] = m, n
            out.append(g * w.reshape(shape))
    return losses, out


def _vmap_rule(info, in_dims, run, static, batch_axes, want, weights, inputs):
    """``vmap`` of the operator (e.g. ``torch.compile`` of a ``torch.func.vmap``): the
    vmapped dimension is folded into the batch, one core call (a vmapped shared input
    is run copy by copy)."""
    wdim, dims = in_dims[4], in_dims[5]
    m = info.batch_size
    axes = [None if a < 0 else a for a in batch_axes]
    if any(a is None and d is not None for a, d in zip(axes, dims)):
        outs = []
        for j in range(m):
            args = [t.select(d, j) if d is not None else t for t, d in zip(inputs, dims)]
            w = weights.select(wdim, j) if wdim is not None else weights
            outs.append(kernel_loss_op(run, static, batch_axes, want, w, args))
        return [torch.stack(o) for o in zip(*outs)], [0] * len(outs[0])
    n = next(t.shape[a + (d is not None and d <= a)]
             for t, d, a in zip(inputs, dims, axes) if a is not None)
    folded = [fold(t, d, a, m) for t, d, a in zip(inputs, dims, axes)]
    out = kernel_loss_op(run, static, batch_axes, want, None, folded)
    losses = out[0].reshape(m, n)
    grads = [(unfold(g, axes[i], m, n), axes[i])
             for g, i in zip(out[1:], [i for i, w in enumerate(want) if w])]
    if weights is None:
        return [losses] + [g for g, _ in grads], [0] * (1 + len(grads))
    w = weights.unsqueeze(0).expand(m, n) if wdim is None else weights.movedim(wdim, 0)
    losses, weighted = weigh_batched(losses, grads, w, m, n)
    return [losses] + weighted, [0] * (1 + len(weighted))


kernel_loss_op.register_vmap(_vmap_rule)
