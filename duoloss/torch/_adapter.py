"""Turns a core :class:`~duoloss.core.LossKernel` into a torch autograd function.

The forward runs the core once on host numpy views of the inputs (CUDA tensors
make one round trip through the host) and, when a gradient is needed, returns
the per-sequence gradients with it; the backward only scales them by the
upstream gradient, so ``backward`` costs one multiply.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core import LossKernel

__all__ = ["apply_kernel", "reduce_losses", "to_numpy"]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (CPU: no copy) of a tensor."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.numpy()


def _scale(grad: torch.Tensor, g: torch.Tensor, axis: Optional[int]) -> torch.Tensor:
    if axis is None:  # shared input: (N, *shape) per-sequence gradients
        return torch.tensordot(g.to(grad.dtype), grad, dims=1)
    shape = [1] * grad.dim()
    shape[axis] = -1
    return grad * g.to(grad.dtype).reshape(shape)


class _KernelFunction(torch.autograd.Function):
    """losses = kernel(*tensors); d losses / d tensors come from the same core call."""

    @staticmethod
    def forward(kernel: LossKernel, static: Tuple, want: Tuple[bool, ...], *tensors):
        arrays = tuple(to_numpy(t) for t in tensors)
        losses, grads = kernel.run(arrays, want, **dict(static))
        device = tensors[0].device
        out = [torch.from_numpy(losses).to(device)]
        for i, g in enumerate(grads):
            if want[i] and g is not None:
                out.append(torch.from_numpy(g).to(device))
        return tuple(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        kernel, _, want = inputs[:3]
        ctx.kernel = kernel
        ctx.want = want
        grads = output[1:]
        ctx.mark_non_differentiable(*grads)
        ctx.save_for_backward(*grads)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_losses, *unused):
        saved = iter(ctx.saved_tensors)
        result = [None, None, None]
        for i, wanted in enumerate(ctx.want):
            if wanted:
                result.append(_scale(next(saved), grad_losses, ctx.kernel.batch_axes[i]))
            else:
                result.append(None)
        return tuple(result)


def apply_kernel(kernel: LossKernel, tensors: Sequence[torch.Tensor], **static) -> torch.Tensor:
    """Per-sequence losses ``(N,)`` of ``kernel``, differentiable where inputs require grad."""
    grad_on = torch.is_grad_enabled()
    want = tuple(
        bool(d and grad_on and t.requires_grad) for d, t in zip(kernel.differentiable, tensors)
    )
    static_items = tuple(sorted(static.items()))
    if not any(want):
        arrays = tuple(to_numpy(t) for t in tensors)
        losses, _ = kernel.run(arrays, want, **static)
        return torch.from_numpy(losses).to(tensors[0].device)
    return _KernelFunction.apply(kernel, static_items, want, *tensors)[0]


def reduce_losses(losses: torch.Tensor, target_lengths: torch.Tensor, reduction: str):
    """'none' | 'sum' | 'mean' (each loss over its target length clamped to >= 1, then mean)."""
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    denom = target_lengths.to(device=losses.device, dtype=losses.dtype).clamp(min=1)
    return (losses / denom).mean()
