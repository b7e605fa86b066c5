"""The frontends' device-path tails: from validated arguments to the reduced loss.

The callers (`duoloss.torch.ctc_loss`, `duoloss.torch.rnnt_loss`,
the k2 losses) validate exactly as on the host path and then hand over here
instead of to the core; everything below runs in torch operations on the
inputs' device and the Triton kernels (`duoloss.torch._triton._ops`).
"""
from __future__ import annotations

import torch

from duoloss._xp import ctc as _xp_ctc
from duoloss._xp import TorchOps

from .._weights import reduction_weights
from . import _ops

__all__ = ["ctc_device", "reduce_batch", "reduce_weighted", "rnnt_device_tail"]

_HALF = (torch.float16, torch.bfloat16)
_XP = TorchOps()  # duoloss._xp's array vocabulary for torch


def reduce_weighted(losses: torch.Tensor, weights) -> torch.Tensor:
    """``sum_b w_b loss_b`` in float64, returned in the losses' dtype (the host
    path's `weigh_host` arithmetic); ``weights``
    None: the losses unchanged."""
    if weights is None:
        return losses
    return (losses.to(torch.float64) * weights).sum().to(losses.dtype)


def ctc_device(lp: torch.Tensor, targets, input_lengths, target_lengths, blank: int,
               reduction: str, zero_infinity: bool) -> torch.Tensor:
    """CTC on the device: ``lp`` ``(T, N, C)``, ``targets`` ``(N, S)`` padded
    (numpy array or tensor), lengths ``(N,)`` (numpy or tensors), all already
    validated (or, while traced, shape-checked only: an invalid label or length
    then gives that sequence a NaN loss, as on the host path).

    The blank and each sequence's labels are gathered to ``(T, N, S + 1)`` on the
    device; autograd scatters the kernel's gradient back (zero on every class
    the target does not use and on frames past ``T_b``).
    """
    dev = lp.device
    out_dtype = None
    if lp.dtype in _HALF:  # as the host path: computed in float32, loss in the input's dtype
        out_dtype = torch.float32 if torch.is_autocast_enabled(dev.type) else lp.dtype
        lp = lp.float()
    tg = _ops.int_to(targets, dev)
    il = _ops.int_to(input_lengths, dev).reshape(-1)
    tl = _ops.int_to(target_lengths, dev).reshape(-1)
    # the host path's gather plan (duoloss._xp.ctc): column 0 the blank, column
    # 1 + i label i; column_targets name each label by the column of its first
    # occurrence (equal labels, equal columns: the kernel's skip rule compares
    # them), -1 for an invalid label (that sequence's loss is NaN)
    columns, column_targets = _xp_ctc.gather_plan(_XP, tg, tl, lp.shape[2], blank)
    bad = (column_targets < 0).any(dim=1)
    gathered = _xp_ctc.gathered(_XP, lp, columns)
    losses = _ops.ctc(gathered, column_targets, torch.where(bad, -1, il), tl,
                      bool(zero_infinity))
    out = reduce_weighted(losses, reduction_weights(reduction, tl))
    return out if out_dtype is None else out.to(out_dtype)


def reduce_batch(losses: torch.Tensor, reduction) -> torch.Tensor:
    """``'none'``/``'sum'``/``'mean'`` (batch mean) of ``(N,)`` losses, summed in
    float64 as the host path (k2's and torchaudio's conventions)."""
    if reduction == "none":
        return losses
    total = losses.to(torch.float64).sum()
    if reduction == "mean":
        total = total / max(losses.shape[0], 1)
    return total.to(losses.dtype)


def rnnt_device_tail(logits, targets, il, tl, blank: int, reduction: str, bound: float,
                     fused_log_softmax: bool, fastemit_lambda: float,
                     delay_penalty: float) -> torch.Tensor:
    """`duoloss.torch.rnnt_loss` after its validation: the fused device kernels of
    `duoloss.torch._triton._rnnt_ops` on the logits as they are (no ``log_softmax``
    copy, no lattice gathered in torch operations); ``bound > 0`` clamps the
    gradient w.r.t. the logits (already divided by ``N`` for ``'mean'``)."""
    from . import _rnnt_ops
    if targets.device != logits.device:
        targets = _ops.int_to(targets, logits.device)
    return _rnnt_ops.rnnt(logits, targets, il, tl, blank=blank, reduction=reduction,
                          fused=fused_log_softmax, lam=fastemit_lambda, delay=delay_penalty,
                          bound=bound)
