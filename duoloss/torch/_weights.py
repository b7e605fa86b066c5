"""Reductions as per-sequence weights, and the scaling of saved gradients.

Every path of the frontend (the eager / ``torch.func`` autograd Function, the
``duoloss::kernel_loss`` operator under ``torch.compile``, their ``vmap``
rule) reduces and differentiates with the helpers here, so they give the same
numbers:

* a batch reduction is a weight vector ``w`` (`reduction_weights`); the
  loss is ``sum_b w_b loss_b`` and the per-sequence gradients are weighted in
  the same core call (`duoloss.core._reduce.run_reduced`, which the JAX
  frontend calls too: one fixed-order float64 reduction for both), so a
  reduced loss is one autograd node;
* a backward only scales the saved gradients by the cotangent
  (`scale_cotangent`), flushing subnormal products to zero as XLA does
  (a cotangent of exactly 1 returns the core's bits);
* no backward turns a tensor into a Python value: tensors batched by
  ``torch.func.vmap`` or by the legacy vmap of ``gradcheck(...,
  check_batched_grad=True)``, traced tensors and tensors on a device always
  take the tensor-op formulas; only a plain CPU cotangent is compared with 1
  on the host (`unit_cotangent`: CPU memory, no device synchronisation), to
  skip work whose result is known;
* under ``vmap`` the weights of each instance apply to its own row
  (`weigh_batched`).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core._reduce import reduction_weights as reduction_weights_host

from ._private import maybe_legacy_batched, transforms_active

__all__ = ["flush_subnormals", "reduction_weights", "scale_cotangent", "unit_cotangent",
           "weigh_batched"]

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
        # traced lengths (torch.compile): the same IEEE operations as the core's
        # (an exact product, one correctly rounded division)
        tl = target_lengths.reshape(-1).to(torch.float64)
        if reduction == "sum":
            return torch.ones_like(tl)
        return 1.0 / (tl.shape[0] * torch.clamp(tl, min=1.0))
    n = target_lengths.shape[0]
    if reduction == "sum":
        ones = _ONES.get(n)
        if ones is None:
            ones = _ONES[n] = reduction_weights_host("sum", n)
        return ones
    return reduction_weights_host(reduction, n, target_lengths)


def flush_subnormals(t: torch.Tensor) -> torch.Tensor:
    """Subnormal entries as zeros of the same sign (what XLA on CPU returns)."""
    if not t.is_floating_point():
        return t
    tiny = torch.finfo(t.dtype).tiny
    return torch.where(t.abs() < tiny, t * 0, t)


def unit_cotangent(g: torch.Tensor) -> bool:
    """True when ``g`` is known to hold exactly 1 in every entry (``loss.backward()``).

    Read on the host only for a plain CPU tensor (no device synchronisation)
    that no vmap batches (``torch.func.vmap`` or the legacy vmap of
    ``gradcheck(..., check_batched_grad=True)``), that no transform wraps and
    that ``torch.compile`` does not trace; False (unknown) for anything else.
    Callers use it only to skip work whose result is then known: False always
    gives the same bits, through tensor ops.
    """
    if (torch.compiler.is_compiling() or type(g) is not torch.Tensor or not g.is_cpu
            or g.requires_grad or transforms_active() or maybe_legacy_batched(g)):
        return False
    if g.numel() == 1:  # (a reduced loss's scalar: one read, no array built)
        return g.item() == 1
    return bool((g.numpy() == 1).all())


def _flushed(out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``out = grad * g`` with subnormals flushed, unless ``g`` is all ones (then
    ``out`` holds the core's bits, which have none: no pass over the gradient)."""
    if unit_cotangent(g):
        return out
    return flush_subnormals(out)


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
        return _flushed(grad * g, g)
    if axis is None or axis < 0:
        return flush_subnormals(torch.tensordot(g, grad, dims=1))
    shape = [1] * grad.dim()
    shape[axis] = -1
    return _flushed(grad * g.reshape(shape), g)


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
