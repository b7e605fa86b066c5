"""ASG and the all-alignments loss for JAX: ``asg_loss``."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from duoloss.core.losses.asg import ASG_KERNEL, ASG_NO_TRANSITIONS_KERNEL, check_asg_args
from duoloss.core._validate import check_reduction

from ._adapter import apply_kernel
from ._args import (as_array, as_int_array, check_bool, is_concrete, padded_targets,
                    per_sequence)

__all__ = ["asg_loss"]


def _prepare(fn, emissions, transitions, start_transitions, targets, input_lengths,
             target_lengths):
    emissions = as_array(fn, "emissions", emissions)
    transitions = as_array(fn, "transitions", transitions, optional=True)
    start_transitions = as_array(fn, "start_transitions", start_transitions, optional=True)
    targets = as_array(fn, "targets", targets)
    input_lengths = per_sequence(as_int_array(fn, "input_lengths", input_lengths), emissions)
    target_lengths = per_sequence(as_int_array(fn, "target_lengths", target_lengths), emissions)
    concrete = is_concrete(targets, input_lengths, target_lengths)
    padded = check_asg_args(fn, emissions, transitions, start_transitions, targets,
                            input_lengths, target_lengths, concrete=concrete)
    targets = padded_targets(targets, target_lengths, padded)
    return emissions, transitions, start_transitions, targets, input_lengths, target_lengths


def asg_loss(emissions: ArrayLike, transitions: ArrayLike | None, targets: ArrayLike,
             input_lengths: ArrayLike, target_lengths: ArrayLike, *,
             start_transitions: ArrayLike | None = None,
             reduction: Literal["none", "sum", "mean"] = "mean", zero_infinity: bool = False
             ) -> jax.Array:
    r"""Auto Segmentation Criterion (ASG), or the all-alignments loss without transitions.

    Same arguments, maths and numbers as [`duoloss.torch.asg_loss`][duoloss.torch.asg_loss] (both run
    the same core), as a differentiable JAX function that works under ``jit``,
    ``grad`` and ``vmap``.  ``T`` frames, ``N`` sequences, ``C`` tokens:

    $$
    \text{loss}_b = \log \sum_{\pi} e^{w(\pi)} - \log \sum_{\pi \in
    \text{align}(y_b)} e^{w(\pi)}, \quad
    w(\pi) = s_{\pi_1} + \sum_t e_t(\pi_t) + \sum_{t \ge 2} A_{\pi_t \pi_{t-1}}.
    $$

    Args:
      emissions: ``(T, N, C)``-array of unnormalised scores, float16, bfloat16,
        float32 (or float64
        with ``jax_enable_x64``).
      transitions: ``(C, C)``-array, ``[i, j]`` = score of ``i`` right after ``j``, or ``None``.
      targets: ``(N, S)`` integer padded targets or 1-D concatenated targets of size
        ``sum(target_lengths)``; tokens in ``[0, C)``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      start_transitions: ``(C,)``-array of first-token scores, or ``None`` (zeros).
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (loss / clamp(target length, 1), then mean).
      zero_infinity: infeasible sequences get loss 0 and zero gradients.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    Gradients are posteriors / expected transition counts (all labellings minus
    the target's alignments), zero on padded frames; see
    [`duoloss.torch.asg_loss`][duoloss.torch.asg_loss].

    NB: shapes and dtypes are validated at trace time; label and length values
    whenever they are concrete.  Under ``jit`` an out-of-range value makes that
    sequence's loss and gradient NaN (never an out-of-bounds read).

    References:
      Collobert, Puhrsch, Synnaeve, "Wav2Letter", arXiv:1609.03193, 2016.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as dj
        >>> emissions = np.zeros((3, 1, 2), np.float32)  # (T, N, C): 3 frames, 2 tokens, all scores 0
        >>> loss = dj.asg_loss(emissions, np.zeros((2, 2), np.float32), np.array([[0, 1]]), np.array([3]),
        ...                    np.array([2]), reduction="sum")
        >>> round(float(loss), 4)  # log(2**3 labellings / 2 segmentations of '0 1') = log 4
        1.3863
    """
    fn = "asg_loss"
    check_reduction(fn, reduction)
    check_bool(fn, "zero_infinity", zero_infinity)
    em, tr, sv, tg, il, tl = _prepare(fn, emissions, transitions, start_transitions, targets,
                                      input_lengths, target_lengths)
    if sv is None:
        sv = jnp.zeros(em.shape[2], em.dtype)
    # the reduction in the core, as in the torch frontend (same bits)
    if tr is None:
        return apply_kernel(ASG_NO_TRANSITIONS_KERNEL, (em, sv, tg, il, tl), reduction=reduction,
                            lengths=tl, zero_infinity=bool(zero_infinity))
    return apply_kernel(ASG_KERNEL, (em, tr, sv, tg, il, tl), reduction=reduction, lengths=tl,
                        zero_infinity=bool(zero_infinity))
