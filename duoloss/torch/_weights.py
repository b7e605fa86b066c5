"""Reductions as per-sequence weights, and the scaling of saved gradients.

Every path of the frontend (the eager / ``torch.func`` autograd Function, the
``duoloss::kernel_loss`` operator under ``torch.compile``, their ``vmap``
rule) reduces and differentiates with the helpers here, so they give the same
numbers:

* a batch reduction is a weight vector ``w`` (:func:`reduction_weights`); the
  loss is ``sum_b w_b loss_b`` and the per-sequence gradients are weighted in
  the same core call (:func:`weigh_host`), so a reduced loss is one autograd
  node;
* a backward only scales the saved gradients by the cotangent
  (:func:`scale_cotangent`);
* under ``vmap`` the weights of each instance apply to its own row
  (:func:`weigh_batched`).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["reduction_weights", "scale_cotangent", "weigh_batched", "weigh_host"]

# 'sum' weights per batch size, shared by every call (never written to).
_ONES = {}


def reduction_weights(reduction: str, target_lengths):
    """Per-sequence weights of a reduction: None for 'none', ones for 'sum', and
    ``1 / (N * max(target_length, 1))`` for 'mean' (ctc_loss's convention).

    ``target_lengths`` is a numpy array (numpy weights) or a tensor (float64
    tensor weights on its device, e.g. while ``torch.compile`` traces).
    """
    if reduction == "none":
        return None
    if isinstance(target_lengths, torch.Tensor):
        tl = target_lengths.reshape(-1).to(torch.float64)
        if reduction == "sum":
            return torch.ones_like(tl)
        return 1.0 / (tl.shape[0] * torch.clamp(tl, min=1.0))
    n = target_lengths.shape[0]
    if reduction == "sum":
        ones = _ONES.get(n)
        if ones is None:
            ones = _ONES[n] = np.ones(n)
        return ones
    if n == 0:
        return np.zeros(0)
    return 1.0 / (n * np.maximum(target_lengths.astype(np.float64), 1.0))


def weigh_host(losses: np.ndarray, grads: Sequence[Optional[np.ndarray]], weights: np.ndarray,
               batch_axes: Sequence[Optional[int]], prescaled: bool = False
               ) -> Tuple[np.ndarray, Tuple[Optional[np.ndarray], ...]]:
    """``(sum_b w_b loss_b, sum_b w_b d loss_b / d x)`` from a core call's outputs.

    The loss is reduced in float64 and returned as a 0-d array in the losses'
    dtype.  ``prescaled``: the kernel already weighted its gradients
    (``LossKernel.weighted``, ``grad_weights=weights``), so a batched input's
    gradient is final and a shared input's ``(N, *shape)`` one is summed; else
    a batched gradient is multiplied along its batch axis (in place: the core's
    fresh buffer) and a shared one contracted with ``w``.
    """
    out = []
    for g, axis in zip(grads, batch_axes):
        if g is None:
            out.append(None)
        elif axis is None:  # shared input: (N, *shape) per-sequence gradients
            out.append(g.sum(axis=0) if prescaled
                       else np.tensordot(weights.astype(g.dtype), g, axes=1))
        elif prescaled:
            out.append(g)
        else:
            shape = [1] * g.ndim
            shape[axis] = -1
            g *= weights.astype(g.dtype).reshape(shape)
            out.append(g)
    total = np.array(np.dot(weights, losses.astype(np.float64, copy=False)), losses.dtype)
    return total, tuple(out)


def scale_cotangent(grad: torch.Tensor, grad_loss: torch.Tensor, axis: Optional[int],
                    weighted: bool) -> torch.Tensor:
    """An input's gradient from its saved one and the cotangent of the loss.

    ``weighted`` (a reduced, scalar loss): ``grad`` already holds the weighted
    sum, so it is multiplied by the scalar cotangent.  Else the cotangent
    ``(N,)`` of the per-sequence losses is broadcast along the batch ``axis``,
    or, for a shared input (``axis`` None) with ``(N, *shape)`` gradients,
    contracted with their leading axis.
    """
    g = grad_loss.to(grad.dtype)
    if weighted:
        return grad * g
    if axis is None or axis < 0:
        return torch.tensordot(g, grad, dims=1)
    shape = [1] * grad.dim()
    shape[axis] = -1
    return grad * g.reshape(shape)


def weigh_batched(losses: torch.Tensor, grads, weights: torch.Tensor, m: int, n: int):
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
