"""ASG and the all-alignments loss for PyTorch: ``asg_loss`` and ``ASGLoss``."""
from __future__ import annotations

from typing import Literal, Optional, Sequence

import numpy as np
import torch

from duoloss.core.losses.asg import ASG_KERNEL, ASG_NO_TRANSITIONS_KERNEL, check_asg_args
from duoloss.core._validate import check_reduction

from ._adapter import (apply_kernel, autocast_inputs, check_not_torchscript, is_concrete,
                       reduction_weights, to_numpy, torchscript_error)
from ._args import (check_bool, check_same_device, check_tensor, int_lengths,
                    padded_targets_traced)

__all__ = ["asg_loss", "ASGLoss"]


def _prepare(fn, emissions, transitions, start_transitions, targets, input_lengths,
             target_lengths, allow_traced=False):
    """Validate everything before the kernel; return host int arrays (int64 tensors
    when ``allow_traced`` and the values cannot be read: torch.compile, vmap)."""
    check_not_torchscript(fn)
    check_tensor(fn, "emissions", emissions)
    check_tensor(fn, "transitions", transitions, optional=True)
    check_tensor(fn, "start_transitions", start_transitions, optional=True)
    check_tensor(fn, "targets", targets)
    if allow_traced and not is_concrete(targets, input_lengths, target_lengths):
        # torch.compile tracing or torch.func.vmap over the ints: shapes and dtypes
        # only; an invalid sequence gets a NaN loss from the kernel.
        il = int_lengths(fn, "input_lengths", input_lengths, emissions, traced=True)
        tl = int_lengths(fn, "target_lengths", target_lengths, emissions, traced=True)
        check_asg_args(fn, emissions, transitions, start_transitions, targets, il, tl,
                       concrete=False)
        check_same_device(fn, "emissions", emissions, transitions=transitions,
                          start_transitions=start_transitions)
        tl = tl.reshape(-1).to(torch.int64)
        tg = targets.to(torch.int64)
        if tg.dim() == 1:
            tg = padded_targets_traced(tg, tl)
        return tg, il.reshape(-1).to(torch.int64), tl
    il = int_lengths(fn, "input_lengths", input_lengths, emissions)
    tl = int_lengths(fn, "target_lengths", target_lengths, emissions)
    tg = check_asg_args(fn, emissions, transitions, start_transitions, to_numpy(targets), il, tl)
    check_same_device(fn, "emissions", emissions, transitions=transitions,
                      start_transitions=start_transitions)
    return (tg.astype(np.int64, copy=False), il.astype(np.int64, copy=False).reshape(-1),
            tl.astype(np.int64, copy=False).reshape(-1))


def asg_loss(emissions: torch.Tensor, transitions: Optional[torch.Tensor], targets: torch.Tensor,
             input_lengths: torch.Tensor | Sequence[int],
             target_lengths: torch.Tensor | Sequence[int], *,
             start_transitions: Optional[torch.Tensor] = None,
             reduction: Literal["none", "sum", "mean"] = "mean", zero_infinity: bool = False
             ) -> torch.Tensor:
    r"""Auto Segmentation Criterion (ASG), or the all-alignments loss without transitions.

    ``T`` frames, ``N`` sequences, ``C`` tokens (no blank), ``S`` padded target length.

    $$
    \text{loss}_b = \log \sum_{\pi} e^{w(\pi)} - \log \sum_{\pi \in
    \text{align}(y_b)} e^{w(\pi)}, \quad
    w(\pi) = s_{\pi_1} + \sum_{t=1}^{T_b} e_t(\pi_t)
    + \sum_{t=2}^{T_b} A_{\pi_t \pi_{t-1}},
    $$

    where $\pi$ runs over all frame labellings and $\text{align}(y)$
    over those that spell the target with every token on >= 1 consecutive frames
    (repeats need no separator).  Same numbers as GTN's ASG
    (``forward_score(compose(E, Trans)) - forward_score(compose(compose(FAL,
    Trans), E))``); with ``transitions=None`` and no start scores it is GTN's
    all-alignments example loss.

    Args:
      emissions: ``(T, N, C)``-tensor of unnormalised scores (no softmax is
        applied, as in GTN), float32 or float64; float16/bfloat16 are computed in
        float64 and returned in their dtype (float32 under ``torch.autocast``).
      transitions: ``(C, C)``-tensor, ``transitions[i, j]`` = score of token ``i``
        right after token ``j`` (row = to, column = from), or ``None``.
      targets: ``(N, S)`` integer tensor of padded targets, or 1-D concatenated
        targets of size ``sum(target_lengths)``; tokens in ``[0, C)``.
      input_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, S]``.
      start_transitions: ``(C,)``-tensor of first-token scores, or ``None`` (zeros).
      reduction: ``'none'`` (``(N,)`` losses), ``'sum'``, or ``'mean'`` (each loss
        divided by its target length clamped to >= 1, then averaged, as ``ctc_loss``).
      zero_infinity: infeasible sequences get loss 0 and zero gradients.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    Gradients: w.r.t. emissions, the posterior of each token at each frame under
    all labellings minus that under the target's alignments (zero on padded
    frames); w.r.t. ``transitions[i, j]`` the expected number of ``j -> i``
    transitions (all minus target); w.r.t. ``start_transitions[k]`` the
    probability of starting with ``k`` (all minus target).

    NB: an infeasible target (``T_b < L_b``, an empty target with ``T_b > 0``,
    or every alignment ``-inf``, e.g. through a ``-inf`` transition) gives
    ``+inf`` with the normaliser's gradient (GTN's convention), unless
    ``zero_infinity``.  Inputs are validated before any computation. The maths
    and numerics: `duoloss.core.losses.asg`.

    References:
      Collobert, Puhrsch, Synnaeve, "Wav2Letter", arXiv:1609.03193, 2016.
      Hannun et al., "Differentiable Weighted Finite-State Transducers",
      arXiv:2010.01003, 2020.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> emissions = torch.zeros(3, 1, 2)  # (T, N, C): 3 frames, 2 tokens, all scores 0
        >>> targets, input_lengths, target_lengths = torch.tensor([[0, 1]]), torch.tensor([3]), torch.tensor([2])
        >>> loss = dt.asg_loss(emissions, torch.zeros(2, 2), targets, input_lengths, target_lengths,
        ...                   reduction="sum")
        >>> round(loss.item(), 4)  # log(2**3 labellings / 2 segmentations of '0 1') = log 4
        1.3863
    """
    fn = "asg_loss"
    check_reduction(fn, reduction)
    check_bool(fn, "zero_infinity", zero_infinity)
    if isinstance(emissions, torch.Tensor):  # autocast: bfloat16 emissions, float32 parameters
        emissions, transitions, start_transitions = autocast_inputs(
            emissions, transitions, start_transitions)
    tg, il, tl = _prepare(fn, emissions, transitions, start_transitions, targets,
                          input_lengths, target_lengths, allow_traced=True)
    start = start_transitions
    if start is None:
        start = torch.zeros(emissions.shape[2], dtype=emissions.dtype, device=emissions.device)
    ints = (tg if isinstance(tg, torch.Tensor) else np.ascontiguousarray(tg), il, tl)
    weights = reduction_weights(reduction, tl)
    if transitions is None:
        return apply_kernel(ASG_NO_TRANSITIONS_KERNEL, (emissions, start) + ints,
                            weights=weights, zero_infinity=bool(zero_infinity))
    return apply_kernel(ASG_KERNEL, (emissions, transitions, start) + ints,
                        weights=weights, zero_infinity=bool(zero_infinity))


class ASGLoss(torch.nn.Module):
    """Module form of [`asg_loss`][duoloss.torch.asg_loss] holding learnable transitions.

    Args:
      num_classes: ``C``, the number of tokens.
      learn_start: also learn ``(C,)`` start scores (``start_transitions``).
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`asg_loss`][duoloss.torch.asg_loss].
      zero_infinity: as in [`asg_loss`][duoloss.torch.asg_loss].
      dtype: of the parameters (zeros at initialisation, as in
        wav2letter/flashlight); ``None``: torch's default dtype.
      device: of the parameters.

    Attributes:
      transitions: ``(C, C)`` ``nn.Parameter``; ``[i, j]`` = score of ``i`` after ``j``.
      start_transitions: ``(C,)`` ``nn.Parameter`` or ``None``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> emissions = torch.zeros(3, 1, 2)  # (T, N, C): 3 frames, 2 tokens, all scores 0
        >>> targets, input_lengths, target_lengths = torch.tensor([[0, 1]]), torch.tensor([3]), torch.tensor([2])
        >>> loss = dt.ASGLoss(num_classes=2, reduction="sum")(emissions, targets, input_lengths, target_lengths)
        >>> round(loss.item(), 4)  # transitions start at 0: log(2**3 labellings / 2 segmentations of '0 1') = log 4
        1.3863
    """

    def __init__(self, num_classes: int, *, learn_start: bool = False,
                 reduction: Literal["none", "sum", "mean"] = "mean", zero_infinity: bool = False,
                 dtype: Optional[torch.dtype] = None, device: torch.device | str | None = None
                 ) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"ASGLoss: argument 'num_classes' must be an int >= 1, "
                             f"got {num_classes!r}")
        check_reduction("ASGLoss", reduction)
        check_bool("ASGLoss", "learn_start", learn_start)
        check_bool("ASGLoss", "zero_infinity", zero_infinity)
        kw = {"dtype": dtype, "device": device}
        self.transitions = torch.nn.Parameter(torch.zeros(num_classes, num_classes, **kw))
        self.start_transitions = (torch.nn.Parameter(torch.zeros(num_classes, **kw))
                                  if learn_start else None)
        self.num_classes = num_classes
        self.reduction = reduction
        self.zero_infinity = zero_infinity

    def forward(self, emissions: torch.Tensor, targets: torch.Tensor,
                input_lengths: torch.Tensor | Sequence[int],
                target_lengths: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return asg_loss(emissions, self.transitions, targets, input_lengths, target_lengths,
                        start_transitions=self.start_transitions, reduction=self.reduction,
                        zero_infinity=self.zero_infinity)

    def __prepare_scriptable__(self):
        raise torchscript_error("ASGLoss")

    def extra_repr(self) -> str:
        learn_start = self.start_transitions is not None
        return (f"num_classes={self.num_classes}, learn_start={learn_start}, "
                f"reduction={self.reduction!r}, zero_infinity={self.zero_infinity}")
