"""The frontends' device-path tails: from validated arguments to the reduced loss.

The callers (`duoloss.torch.ctc_loss`, `duoloss.torch.rnnt_loss`,
the k2 losses) validate exactly as on the host path and then hand over here
instead of to the core; everything below runs in torch operations on the
inputs' device and the Triton kernels (`duoloss.torch._triton._ops`).
"""
from __future__ import annotations

import torch

from . import _ops

__all__ = ["ctc_device", "reduce_batch", "rnnt_device_tail"]

_HALF = (torch.float16, torch.bfloat16)


def ctc_device(lp: torch.Tensor, targets, input_lengths, target_lengths, blank: int,
               reduction: str, zero_infinity: bool, s_cap=None,
               concat: bool = False) -> torch.Tensor:
    """CTC on the device, reduced: ``lp`` ``(T, N, C)`` as given (float64, float32,
    bfloat16 or float16: halves are read as they are and accumulated in float32,
    the loss returned in their dtype, or float32 under autocast as the host path);
    ``targets`` padded ``(N, S)`` (or, with ``concat``, 1-D concatenated, ``s_cap``
    bounding the target lengths), lengths ``(N,)``: integer tensors on ``lp``'s
    device, read by the kernel in their own dtype, all already validated (or,
    while traced, shape-checked only: an invalid label or length then gives that
    sequence a NaN loss, as on the host path).

    One kernel launch computes the losses, the reduction's weights and the
    weighted gradient ``(T, N, C)`` (`duoloss.torch._triton._ctc_kernels`); the
    backward scales it by the cotangent.
    """
    out_f32 = lp.dtype in _HALF and torch.is_autocast_enabled(lp.device.type)
    return _ops.ctc(lp, targets, input_lengths, target_lengths, bool(zero_infinity),
                    blank=int(blank), reduction=reduction, s_cap=s_cap, concat=concat,
                    out_f32=out_f32)


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
