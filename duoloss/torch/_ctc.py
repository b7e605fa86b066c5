"""CTC for PyTorch: a drop-in for ``torch.nn.functional.ctc_loss`` / ``nn.CTCLoss``."""
from __future__ import annotations

import numpy as np
import torch

from duoloss.core import _validate as _v
from duoloss.core._ctc import CTC_KERNEL, check_ctc_static, check_ctc_values

from ._adapter import apply_kernel, reduction_weights, to_numpy

__all__ = ["ctc_loss", "CTCLoss"]


def _as_int_array(x, fn, arg):
    """Lengths as a host array: a tensor, a numpy array, an int or a tuple/list of ints."""
    if isinstance(x, torch.Tensor):
        return to_numpy(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return np.asarray(x, np.int64)
    if isinstance(x, (list, tuple)):
        return _v.int_list(fn, arg, x, "a torch.Tensor")
    if isinstance(x, np.ndarray):
        return x
    raise _v.not_an_array(fn, arg, x, "a torch.Tensor or a tuple/list of ints")


def ctc_loss(log_probs: torch.Tensor, targets, input_lengths, target_lengths, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> torch.Tensor:
    r"""Connectionist Temporal Classification loss, same API as ``F.ctc_loss``.

    Same output as ``torch.nn.functional.ctc_loss`` given the same input (up to
    float rounding: duoloss computes in float64 internally, so float32 results
    are *more* accurate), with the exact gradient w.r.t. ``log_probs``.

    Args:
      log_probs: ``(T, N, C)``-tensor (or unbatched ``(T, C)``) of log-probabilities
        (e.g. ``log_softmax`` outputs), float32 or float64, any device.  ``T``
        frames, ``N`` sequences, ``C`` classes including the blank.
      targets: ``(N, S)`` padded integer targets, or 1-D concatenated targets of size
        ``sum(target_lengths)``; ``(S,)`` for unbatched input.  Labels in ``[0, C)``,
        never ``blank``.
      input_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, S]``.
      blank: index of the blank class.
      reduction: ``'none'`` (``(N,)`` losses), ``'sum'``, or ``'mean'`` (each loss
        divided by its target length clamped to >= 1, then averaged).
      zero_infinity: replace infinite losses (infeasible targets) and their
        gradients by zero.

    Returns:
      The reduced loss (scalar), or ``(N,)`` losses for ``reduction='none'``
      (a scalar for unbatched input).

    NB: the gradient is the true ``d loss / d log_probs = -posterior`` (zero on
    padded frames), not torch's ``exp(log_probs) - posterior`` shortcut; both
    give the same gradient w.r.t. logits fed through ``log_softmax``, and ours
    also passes ``gradcheck`` on leaf ``log_probs``.  An infeasible target gives
    ``+inf`` with a zero gradient; a NaN in a sequence's frames makes only that
    sequence NaN.  Inputs are validated (label range, blank inside targets,
    lengths, dtypes) with a ``ValueError``/``TypeError`` before any computation.
    The math: see :mod:`duoloss.core._ctc`.

    References:
      Graves et al., "Connectionist Temporal Classification", ICML 2006.
    """
    fn = "ctc_loss"
    if not isinstance(log_probs, torch.Tensor):
        raise TypeError(f"{fn}: argument 'log_probs' must be a torch.Tensor, "
                        f"got {type(log_probs).__name__}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{fn}: argument 'targets' must be a torch.Tensor, "
                        f"got {type(targets).__name__}")
    il = _as_int_array(input_lengths, fn, "input_lengths")
    tl = _as_int_array(target_lengths, fn, "target_lengths")
    batched, concatenated = check_ctc_static(
        fn, tuple(log_probs.shape), log_probs.dtype, tuple(targets.shape), targets.dtype,
        il.shape, il.dtype, tl.shape, tl.dtype, blank, reduction)
    if not isinstance(zero_infinity, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument 'zero_infinity' must be a bool, "
                        f"got {type(zero_infinity).__name__}")
    tg = to_numpy(targets).astype(np.int64, copy=False)
    il = il.astype(np.int64, copy=False).reshape(-1)
    tl = tl.astype(np.int64, copy=False).reshape(-1)
    lp = log_probs if batched else log_probs.unsqueeze(1)
    if not batched:
        tg = tg.reshape(1, -1)
    padded = check_ctc_values(fn, tg, il, tl, lp.shape[0], lp.shape[2], blank, concatenated)
    weights = reduction_weights(reduction, tl)
    out = apply_kernel(
        CTC_KERNEL,
        (lp, padded, il, tl),
        weights=weights, blank=int(blank), zero_infinity=bool(zero_infinity))
    return out[0] if (not batched and reduction == "none") else out


class CTCLoss(torch.nn.Module):
    """Module form of :func:`ctc_loss`; a drop-in for ``torch.nn.CTCLoss``."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__()
        self.blank = blank
        self.reduction = reduction
        self.zero_infinity = zero_infinity

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                        self.reduction, self.zero_infinity)

    def extra_repr(self) -> str:
        return f"blank={self.blank}, reduction={self.reduction!r}, zero_infinity={self.zero_infinity}"
