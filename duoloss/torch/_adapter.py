"""Turns a core :class:`~duoloss.core.LossKernel` into a torch autograd function.

The forward runs the core once on host numpy views of the inputs (CUDA tensors
make one round trip through the host) and, when a gradient is needed, keeps the
per-sequence gradients it returns; the backward only scales them by the
upstream gradient.  A batch reduction given as per-sequence weights is folded
into the same autograd node (one node per loss call).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core import LossKernel

__all__ = ["apply_kernel", "reduction_weights", "to_numpy"]

try:  # torch >= 2.0: what Function.apply does before running a single-level function
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers
except ImportError:  # pragma: no cover
    def _unwrap_dead_wrappers(args):
        return args


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


def _weigh(grad: np.ndarray, weights: np.ndarray, axis: Optional[int]) -> np.ndarray:
    """sum_b weights[b] * d loss_b / d x, from the per-sequence gradients."""
    if axis is None:
        return np.tensordot(weights.astype(grad.dtype), grad, axes=1)
    shape = [1] * grad.ndim
    shape[axis] = -1
    grad *= weights.astype(grad.dtype).reshape(shape)
    return grad


def _device(tensors) -> torch.device:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


class _KernelFunction(torch.autograd.Function):
    """loss = kernel(*tensors) (or sum_b w_b loss_b); gradients from the same core call."""

    @staticmethod
    def forward(kernel: LossKernel, static: Tuple, want: Tuple[bool, ...], weights, *tensors):
        arrays = tuple(to_numpy(t) if isinstance(t, torch.Tensor) else t for t in tensors)
        losses, grads = kernel.run(arrays, want, **dict(static))
        if weights is not None:
            # Reduce on the host in float64, and fold the weights into the
            # gradients now: the backward is then a single multiply.
            losses = np.asarray(np.dot(weights, losses.astype(np.float64)), losses.dtype)
            grads = tuple(g if g is None else _weigh(g, weights, kernel.batch_axes[i])
                          for i, g in enumerate(grads))
        device = _device(tensors)
        out = [torch.from_numpy(losses).to(device)]
        for i, g in enumerate(grads):
            if want[i]:
                out.append(torch.from_numpy(g).to(device))
        return tuple(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        kernel, _, want, weights = inputs[:4]
        ctx.kernel = kernel
        ctx.want = want
        ctx.weights = weights
        grads = output[1:]
        ctx.mark_non_differentiable(*grads)
        ctx.save_for_backward(*grads)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *unused):
        saved = iter(ctx.saved_tensors)
        result = [None, None, None, None]
        for i, wanted in enumerate(ctx.want):
            if not wanted:
                result.append(None)
            elif ctx.weights is not None:  # scalar output, weights already applied
                g = next(saved)
                result.append(g * grad_loss.to(g.dtype))
            else:
                result.append(_scale(next(saved), grad_loss, ctx.kernel.batch_axes[i]))
        return tuple(result)

    @classmethod
    def apply(cls, *args):
        # Function.apply binds default arguments with inspect.signature on every
        # call (tens of microseconds); forward has no defaults, so outside
        # functorch transforms go straight to the C++ implementation.
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers(args))


def apply_kernel(kernel: LossKernel, tensors: Sequence[torch.Tensor], *,
                 weights: Optional[np.ndarray] = None, **static) -> torch.Tensor:
    """Losses of ``kernel``: ``(N,)`` per sequence, or ``sum_b weights[b] * loss_b``.

    Differentiable w.r.t. the floating inputs that require grad.
    """
    grad_on = torch.is_grad_enabled()
    want = tuple(
        bool(d and grad_on and t.requires_grad) for d, t in zip(kernel.differentiable, tensors)
    )  # non-differentiable inputs may be passed as numpy arrays
    static_items = tuple(sorted(static.items()))
    return _KernelFunction.apply(kernel, static_items, want, weights, *tensors)[0]


def reduction_weights(reduction: str, target_lengths: np.ndarray) -> Optional[np.ndarray]:
    """Per-sequence weights of a reduction: None for 'none', ones for 'sum', and
    ``1 / (N * max(target_length, 1))`` for 'mean' (ctc_loss's convention)."""
    if reduction == "none":
        return None
    n = target_lengths.shape[0]
    if reduction == "sum":
        return np.ones(n)
    if n == 0:
        return np.zeros(0)
    return 1.0 / (n * np.maximum(target_lengths.astype(np.float64), 1.0))
