"""k2's simple and pruned RNN-T losses for PyTorch (drop-ins for ``k2.rnnt_loss_simple``,
``k2.get_rnnt_prune_ranges``, ``k2.do_rnnt_pruning`` and ``k2.rnnt_loss_pruned``).

Same names, argument order, shapes, maths and reductions as k2, so an icefall
recipe ports by changing the import.  The log-probabilities ``(px, py)`` of the
recursion, the pruning ranges and the pruned joiner inputs come from
`duoloss._xp.k2` (the same code as the JAX frontend's) run on torch
operations, so autograd flows through them to ``lm``/``am``/``logits``; this
module keeps only argument checks and the autograd wiring.  The recursion
itself, its gradient and the occupation probabilities run in duoloss's
transducer core, the same code as `duoloss.jax.rnnt_loss_pruned`.

Typical pruned training step (icefall's ``Transducer.forward``)::

    simple_loss, (px_grad, py_grad) = rnnt_loss_simple(
        lm=simple_lm, am=simple_am, symbols=y, termination_symbol=blank,
        boundary=boundary, reduction="sum", return_grad=True)
    ranges = get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=5)
    am_pruned, lm_pruned = do_rnnt_pruning(am, lm, ranges)
    logits = joiner(am_pruned, lm_pruned)            # (B, T, s_range, C)
    pruned_loss = rnnt_loss_pruned(logits, y, ranges, blank, boundary, reduction="sum")
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from duoloss._xp import k2 as _maths
from duoloss._xp import TorchOps
from duoloss.core.losses import rnnt_k2 as _k
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL

from ._adapter import apply_kernel, is_concrete, to_numpy
from ._args import check_tensor
from ._ops import kernel_id, kernel_loss_op, static_json
from ._triton import resolve_impl, transducer_losses, transducer_losses_and_grads

__all__ = [
    "do_rnnt_pruning",
    "get_rnnt_logprobs",
    "get_rnnt_logprobs_pruned",
    "get_rnnt_logprobs_smoothed",
    "get_rnnt_prune_ranges",
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
]

_xp = TorchOps()  # the array vocabulary of duoloss._xp, for torch


def _boundary(fn, boundary, b, s, t, device, rnnt_type, check_values):
    """The ``(B, 4)`` int64 boundary (``[0, 0, S, T]`` rows when None), checked."""
    if boundary is None:
        if rnnt_type != "regular" and s > t:
            raise ValueError(f"{fn}: rnnt_type={rnnt_type!r} needs T >= S without a boundary "
                             f"(one symbol per frame at most), got T={t} and S={s}")
        row = torch.tensor([0, 0, s, t], dtype=torch.int64, device=device)
        return row.expand(b, 4).contiguous()
    check_tensor(fn, "boundary", boundary)
    _k.check_boundary_static(fn, boundary.shape, boundary.dtype, b)
    if check_values and is_concrete(boundary):
        _k.check_boundary_values(fn, to_numpy(boundary), s, t, rnnt_type)
    return boundary.to(torch.int64)


def _finish_px(px, py, boundary, rnnt_type, delay_penalty, t):
    """k2's common tail (`duoloss._xp.k2.finish_px`): -inf at each regular
    sequence's t_end, constrained's forced blank, the delay penalty."""
    return _maths.finish_px(_xp, px, py, boundary, rnnt_type, delay_penalty)


def get_rnnt_logprobs(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor,
                      termination_symbol: int, rnnt_type: str = "regular",
                      boundary: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """k2's ``(px, py)`` of the simple (additive) joiner, differentiable.

    $$
    \\log Z_{b,s,t} = \\log \\sum_c \\exp(am_{b,t,c} + lm_{b,s,c}), \\quad
    px_{b,s,t} = am_{b,t,y_s} + lm_{b,s,y_s} - \\log Z_{b,s,t}, \\quad
    py_{b,s,t} = am_{b,t,\\varnothing} + lm_{b,s,\\varnothing} - \\log Z_{b,s,t}
    $$

    Args and shapes as [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple]; returns ``px`` ``(B, S, T+1)``
    (regular) or ``(B, S, T)``, and ``py`` ``(B, S+1, T)``, exactly k2's lattice:
    for 'regular' ``px[b, :, t_end[b]] = -inf`` (no symbol on a sequence's
    one-past-the-last frame), for 'constrained' ``px`` already includes the
    forced blank ``py[:, 1:, :]``.  So the transducer recursion of the
    [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple] docstring run on ``(px, py, boundary)`` gives
    ``rnnt_loss_simple(..., reduction='none')`` (k2's ``rnnt_loss_test.py``
    identity; ``delay_penalty`` is added by the losses, not here).  ``log Z`` is
    a matrix product of ``exp(lm - max)`` and ``exp(am - max)``: no
    ``(B, T, S+1, C)`` tensor is formed.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C)
        >>> px, py = d.get_rnnt_logprobs(lm, am, torch.tensor([[1]]), termination_symbol=0)
        >>> tuple(px.shape), tuple(py.shape)  # (B, S, T + 1) and (B, S + 1, T) for 'regular'
        ((1, 1, 3), (1, 2, 2))
        >>> round(float(py[0, 0, 0]), 4)  # log(1/3): every class equally likely
        -1.0986
    """
    fn = "get_rnnt_logprobs"
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary)
    return _finish_px(px, py, boundary, rnnt_type, 0.0, am.shape[1]), py


def get_rnnt_logprobs_smoothed(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor,
                               termination_symbol: int, lm_only_scale: float = 0.1,
                               am_only_scale: float = 0.1,
                               boundary: Optional[torch.Tensor] = None,
                               rnnt_type: str = "regular"
                               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """k2's ``get_rnnt_logprobs_smoothed``: the lattice of [`rnnt_loss_smoothed`][duoloss.torch.rnnt_loss_smoothed].

    The ``(px, py)`` of [`get_rnnt_logprobs`][duoloss.torch.get_rnnt_logprobs] with every arc
    log-probability interpolated with its LM-only and AM-only (unigram) versions
    (formula in [`rnnt_loss_smoothed`][duoloss.torch.rnnt_loss_smoothed]), then k2's two final
    steps ('regular': ``px[b, :, t_end[b]] = -inf``; 'constrained': ``px +
    py[:, 1:, :]``), so the recursion on it gives ``rnnt_loss_smoothed(...,
    reduction='none')``.  Same argument order and defaults as k2.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C)
        >>> px, py = d.get_rnnt_logprobs_smoothed(lm, am, torch.tensor([[1]]), 0)
        >>> tuple(px.shape), tuple(py.shape)  # (B, S, T + 1) and (B, S + 1, T) for 'regular'
        ((1, 1, 3), (1, 2, 2))
        >>> round(float(py[0, 0, 0]), 4)  # uniform: joint, LM-only and AM-only all log(1/3)
        -1.0986
    """
    fn = "get_rnnt_logprobs_smoothed"
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary, scales=(lm_only_scale, am_only_scale))
    return _finish_px(px, py, boundary, rnnt_type, 0.0, am.shape[1]), py


def _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type, boundary,
                     delay_penalty=0.0, reduction="mean", scales=None):
    """``(px, py, boundary)`` of the additive joiner; with ``scales = (lm_only_scale,
    am_only_scale)`` k2's smoothed interpolation (see `rnnt_loss_smoothed`)."""
    for arg, x in (("lm", lm), ("am", am), ("symbols", symbols)):
        check_tensor(fn, arg, x)
    b, s, t, c = _k.check_simple_static(fn, lm.shape, lm.dtype, am.shape, am.dtype,
                                        symbols.shape, symbols.dtype)
    _k.check_common_scalars(fn, termination_symbol, c, rnnt_type, delay_penalty, reduction)
    if scales is not None:
        scales = (_k.check_float_scalar(fn, "lm_only_scale", scales[0]),
                  _k.check_float_scalar(fn, "am_only_scale", scales[1]))
    if is_concrete(symbols):
        _k.check_symbols_values(fn, to_numpy(symbols), c)
    boundary = _boundary(fn, boundary, b, s, t, am.device, rnnt_type, True)
    px, py = _maths.simple_logprobs(_xp, lm, am, symbols, termination_symbol, rnnt_type, scales)
    return px, py, boundary


def _reduce(losses, reduction):
    if reduction == "none":
        return losses
    return losses.mean() if reduction == "mean" else losses.sum()


def _recursion(px, py, boundary, rnnt_type, return_grad, device=False):
    """Per-sequence losses (and, with ``return_grad``, k2's occupation grads);
    ``device``: on the Triton device path."""
    kind = "regular" if rnnt_type == "regular" else "modified"
    if device and not return_grad:
        return transducer_losses(px, py, boundary, kind), None
    if device:
        losses, gx, gy = transducer_losses_and_grads(px, py, boundary, kind)
        return losses, (-gx, -gy)
    if not return_grad:
        return apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), rnnt_type=kind), None
    # One core call for the losses (differentiable through the operator's
    # autograd rule) and their gradients, whose negation is k2's occupation
    # probabilities d(-loss)/d(px, py).
    static = {"rnnt_type": kind}
    losses, gx, gy = kernel_loss_op(kernel_id(TRANSDUCER_KERNEL),
                                    static_json(TRANSDUCER_KERNEL, static), [0, 0, 0],
                                    [True, True, False], None, [px, py, boundary])
    return losses, (-gx.detach(), -gy.detach())


def rnnt_loss_simple(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor,
                     termination_symbol: int, boundary: Optional[torch.Tensor] = None,
                     rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: Optional[str] = "mean", return_grad: bool = False, *,
                     impl: str = "auto") -> Union[torch.Tensor, Tuple[torch.Tensor, Tuple[torch.Tensor,
                                                                         torch.Tensor]]]:
    """RNN-T loss with the trivial additive joiner ``logits = am[:, :, None] + lm[:, None]``.

    Equals the full RNN-T loss of those logits (without ever forming them) and
    ``k2.rnnt_loss_simple`` for the same arguments.

    With ``rnnt_type='regular'`` a symbol keeps the frame and the termination
    (blank) symbol moves to the next one; ``'modified'`` moves to the next frame
    on every emission (at most one symbol per frame); ``'constrained'`` is
    'modified' where emitting ``y_s`` also pays the blank of context ``s+1`` on
    the same frame.  With $\\alpha_{b,0,0} = 0$ the loss is
    $-\\alpha_{b,S,T}$ of

    $$
    \\alpha_{s,t} = \\mathrm{logaddexp}(\\alpha_{s-1,t'} + px_{s-1,t'},
    \\alpha_{s,t-1} + py_{s,t-1})
    $$

    with $t' = t$ (regular) or $t - 1$ (otherwise), on the
    sub-lattice ``boundary[b]``.

    Args:
      lm: ``(B, S+1, C)`` prediction-network part of the logits.
      am: ``(B, T, C)`` encoder part (same dtype).
      symbols: ``(B, S)`` integer symbols, all (padding too) in ``[0, C)``.
      termination_symbol: the blank, in ``[0, C)``.
      boundary: ``(B, 4)`` int rows ``[s_begin, t_begin, s_end, t_end]``;
        None means ``[0, 0, S, T]`` for every sequence.
      rnnt_type: 'regular' | 'modified' | 'constrained'.
      delay_penalty: adds ``delay_penalty * ((t_end - 1) / 2 - t)`` to every
        symbol emitted at frame ``t`` (k2 issue #955; 0 disables it).
      reduction: 'none' (``(B,)``) | 'mean' (mean over the batch, k2's
        ``torch.mean``; *not* divided by target lengths) | 'sum'.
      return_grad: also return ``(px_grad, py_grad)``, the occupation
        probabilities ``d(-loss_b)/d(px, py)`` of each lattice arc (k2's
        "fake gradient"), for [`get_rnnt_prune_ranges`][duoloss.torch.get_rnnt_prune_ranges].
      impl: ``'auto'`` (CUDA tensors: the recursion in the Triton device
        kernel; else on the host), ``'host'`` or ``'device'`` (CPU tensors only
        under ``TRITON_INTERPRET=1``), as [`rnnt_loss`][duoloss.torch.rnnt_loss].

    Returns:
      the loss, or ``(loss, (px_grad, py_grad))`` with ``return_grad``.

    NB: ``return_grad=True`` runs the core through the ``duoloss::kernel_loss``
    operator (eager and ``torch.compile``); ``torch.func`` transforms need
    ``return_grad=False``.  Losses are ``+inf`` where no path survives.

    References:
      Graves, *Sequence transduction with recurrent neural networks*, 2012;
      Kuang et al., *Pruned RNN-T for fast, memory-efficient ASR training*,
      Interspeech 2022 (arXiv:2206.13236).

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C): a uniform joiner
        >>> symbols, boundary = torch.tensor([[1]]), torch.tensor([[0, 0, 1, 2]])  # S=1 symbol, T=2 frames
        >>> loss = d.rnnt_loss_simple(lm, am, symbols, termination_symbol=2, boundary=boundary)
        >>> round(float(loss), 4)  # the RNN-T loss of uniform logits: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_simple"
    device = resolve_impl(fn, impl, am)
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary, delay_penalty, reduction)
    if not isinstance(return_grad, bool):
        raise TypeError(f"{fn}: argument 'return_grad' must be a bool, "
                        f"got {type(return_grad).__name__}")
    px = _finish_px(px, py, boundary, rnnt_type, float(delay_penalty), am.shape[1])
    losses, grads = _recursion(px, py, boundary, rnnt_type, return_grad, device)
    loss = _reduce(losses, reduction)
    return (loss, grads) if return_grad else loss


def rnnt_loss_smoothed(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor,
                       termination_symbol: int, lm_only_scale: float = 0.1,
                       am_only_scale: float = 0.1, boundary: Optional[torch.Tensor] = None,
                       rnnt_type: str = "regular", delay_penalty: float = 0.0,
                       reduction: Optional[str] = "mean", return_grad: bool = False, *,
                       impl: str = "auto"
                       ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    r"""[`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple] with k2's LM-only / AM-only smoothing (``k2.rnnt_loss_smoothed``).

    Every arc log-probability of the simple loss is replaced by the interpolation

    $$
    (1 - \lambda_{lm} - \lambda_{am})\, \log p(\cdot) + \lambda_{lm} \log p_{lm}(\cdot)
    + \lambda_{am} \log p_{am}(\cdot)
    $$

    where $p_{lm} = \mathrm{softmax}(lm_{b,s})$ ignores the acoustics and
    $p_{am} \propto \exp(am_{b,t}) \cdot u$ uses instead of ``lm`` the
    unigram ``u``: ``softmax(lm)`` averaged over every batch entry and position
    (padding included, as k2).  A scale of exactly 0 is taken as ``1e-20``
    (as k2, so that ``-inf * 0`` never appears).  Other arguments and the return
    value as [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple] (icefall's recipes call this one with
    ``return_grad=True``).

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C): a uniform joiner
        >>> symbols, boundary = torch.tensor([[1]]), torch.tensor([[0, 0, 1, 2]])  # S=1 symbol, T=2 frames
        >>> loss = d.rnnt_loss_smoothed(lm, am, symbols, 2, lm_only_scale=0.0, am_only_scale=0.0,
        ...                           boundary=boundary)
        >>> round(float(loss), 4)  # no smoothing: the RNN-T loss of uniform logits: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_smoothed"
    device = resolve_impl(fn, impl, am)
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary, delay_penalty, reduction,
                                        (lm_only_scale, am_only_scale))
    if not isinstance(return_grad, bool):
        raise TypeError(f"{fn}: argument 'return_grad' must be a bool, "
                        f"got {type(return_grad).__name__}")
    px = _finish_px(px, py, boundary, rnnt_type, float(delay_penalty), am.shape[1])
    losses, grads = _recursion(px, py, boundary, rnnt_type, return_grad, device)
    loss = _reduce(losses, reduction)
    return (loss, grads) if return_grad else loss


def get_rnnt_logprobs_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor,
                             termination_symbol: int, boundary: Optional[torch.Tensor] = None,
                             rnnt_type: str = "regular") -> Tuple[torch.Tensor, torch.Tensor]:
    """k2's ``(px, py)`` from pruned joiner logits ``(B, T, s_range, C)``.

    ``px[b, s, t] = log_softmax(logits[b, t, k])[symbols[b, s]]`` and ``py[b, s,
    t] = log_softmax(logits[b, t, k])[termination_symbol]`` where ``s =
    ranges[b, t, k]``; every position outside the frame's range is ``-inf``.
    As k2 (and [`get_rnnt_logprobs`][duoloss.torch.get_rnnt_logprobs]): 'regular' sets ``px[b, :, t_end[b]] =
    -inf`` and 'constrained' adds ``py[:, 1:, :]`` to ``px``, so the recursion on
    ``(px, py, boundary)`` gives [`rnnt_loss_pruned`][duoloss.torch.rnnt_loss_pruned]'s per-sequence losses.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C), S=1
        >>> symbols, boundary = torch.tensor([[1]]), torch.tensor([[0, 0, 1, 2]])
        >>> ranges = torch.tensor([[[0, 1], [0, 1]]])  # s_range = S + 1: nothing pruned
        >>> am_p, lm_p = d.do_rnnt_pruning(am, lm, ranges)
        >>> px, py = d.get_rnnt_logprobs_pruned(am_p + lm_p, symbols, ranges, 2, boundary)
        >>> tuple(px.shape), tuple(py.shape)  # k2's lattice: (B, S, T + 1), (B, S + 1, T)
        ((1, 1, 3), (1, 2, 2))
    """
    fn = "get_rnnt_logprobs_pruned"
    px, py, boundary = _pruned_logprobs(fn, logits, symbols, ranges, termination_symbol,
                                        boundary, rnnt_type)
    return _finish_px(px, py, boundary, rnnt_type, 0.0, logits.shape[1]), py


def _pruned_logprobs(fn, logits, symbols, ranges, termination_symbol, boundary, rnnt_type,
                     delay_penalty=0.0, reduction="mean", device=False):
    for arg, x in (("logits", logits), ("symbols", symbols), ("ranges", ranges)):
        check_tensor(fn, arg, x)
    b, s, t, r, c = _k.check_pruned_static(fn, logits.shape, logits.dtype, symbols.shape,
                                           symbols.dtype, ranges.shape, ranges.dtype)
    _k.check_common_scalars(fn, termination_symbol, c, rnnt_type, delay_penalty, reduction)
    if is_concrete(symbols, ranges):
        _k.check_symbols_values(fn, to_numpy(symbols), c)
        _k.check_ranges_values(fn, to_numpy(ranges), s)
    boundary = _boundary(fn, boundary, b, s, t, logits.device, rnnt_type, True)
    if device:  # the same values in bounded memory (duoloss.torch._triton._pruned)
        from ._triton._pruned import pruned_logprobs
        px, py = pruned_logprobs(logits, symbols, ranges, termination_symbol, rnnt_type)
    else:
        px, py = _maths.pruned_logprobs(_xp, logits, symbols, ranges, termination_symbol,
                                        rnnt_type)
    return px, py, boundary


def rnnt_loss_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor,
                     termination_symbol: int, boundary: Optional[torch.Tensor] = None,
                     rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: Optional[str] = "mean", *, impl: str = "auto") -> torch.Tensor:
    """RNN-T loss on the lattice kept by ``ranges`` (k2's ``rnnt_loss_pruned``).

    Only the ``s_range`` symbol positions ``ranges[b, t]`` of each frame carry
    arcs (their log-probabilities from ``log_softmax(logits[b, t, k])``); all
    other arcs are ``-inf``.  With ``s_range = S + 1`` nothing is pruned and the
    loss equals the full RNN-T loss of the corresponding ``(B, T, S+1, C)``
    logits; the recursion is that of [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].

    Args:
      logits: ``(B, T, s_range, C)`` joiner output on the pruned positions.
      symbols: ``(B, S)`` integer symbols in ``[0, C)``.
      ranges: ``(B, T, s_range)`` int positions from [`get_rnnt_prune_ranges`][duoloss.torch.get_rnnt_prune_ranges]:
        each row ``r0, r0+1, ..., r0+s_range-1`` with ``0 <= r0 <= S+1-s_range``.
      termination_symbol: the blank symbol, as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].
      boundary: optional ``(B, 4)`` sequence extents, as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].
      rnnt_type: ``'regular'``, ``'modified'`` or ``'constrained'``, as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].
      delay_penalty: as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].
      impl: ``'auto'``, ``'host'`` or ``'device'``, as in [`rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple].

    Returns:
      ``(B,)`` losses (reduction 'none') or a scalar.

    NB: the loss is ``+inf`` for a sequence whose kept lattice has no complete
    path (e.g. ranges that skip a symbol).

    References:
      Kuang et al., *Pruned RNN-T for fast, memory-efficient ASR training*,
      Interspeech 2022 (arXiv:2206.13236).

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 2, 3)), torch.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C), S=1
        >>> symbols, boundary = torch.tensor([[1]]), torch.tensor([[0, 0, 1, 2]])
        >>> ranges = torch.tensor([[[0, 1], [0, 1]]])  # s_range = S + 1: nothing pruned
        >>> am_p, lm_p = d.do_rnnt_pruning(am, lm, ranges)
        >>> loss = d.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 2, boundary)
        >>> round(float(loss), 4)  # = the full RNN-T loss of uniform logits, log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_pruned"
    device = resolve_impl(fn, impl, logits)
    px, py, boundary = _pruned_logprobs(fn, logits, symbols, ranges, termination_symbol,
                                        boundary, rnnt_type, delay_penalty, reduction,
                                        device=device)
    px = _finish_px(px, py, boundary, rnnt_type, float(delay_penalty), logits.shape[1])
    losses, _ = _recursion(px, py, boundary, rnnt_type, False, device)
    return _reduce(losses, reduction)


def get_rnnt_prune_ranges(px_grad: torch.Tensor, py_grad: torch.Tensor, boundary: torch.Tensor,
                          s_range: int) -> torch.Tensor:
    """Per frame, the ``s_range`` consecutive symbol positions to keep (k2's algorithm).

    For each frame ``t`` the window start ``r0`` maximises the occupation mass
    inside the window, ``sum_{k<s_range} py_grad[r0+k, t] - px_grad[r0-1, t]``
    (blank arcs inside, minus the symbol arc entering from below); frames at
    or after ``t_end - 1`` take the last window ``s_end + 1 - s_range``.  The
    starts are then made non-decreasing, starting at 0 and rising by less than
    ``s_range`` per frame (less than 2 for 'modified'/'constrained', told
    apart by ``px_grad``'s last axis ``T`` vs ``T+1``), so no symbol is skipped.

    Args:
      px_grad: ``(B, S, T+1)`` (regular) or ``(B, S, T)`` occupation of symbol arcs.
      py_grad: ``(B, S+1, T)`` occupation of blank arcs (from
        ``rnnt_loss_simple(..., return_grad=True)``).
      boundary: ``(B, 4)`` int rows ``[s_begin, t_begin, s_end, t_end]``.
      s_range: symbols kept per frame; as k2, raised (with a warning) to
        ``(s_end - 1) // t_end + 2`` for regular and lowered to ``S + 1``.

    Returns:
      ``(B, T, s_range)`` int64 ranges, ``ranges[b, t] = r0 + arange(s_range)``.

    References:
      Kuang et al., 2022 (arXiv:2206.13236), section 3.2.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 4, 3)), torch.zeros((1, 3, 3))  # (B, T, C), (B, S + 1, C)
        >>> symbols, boundary = torch.tensor([[1, 2]]), torch.tensor([[0, 0, 2, 4]])
        >>> _, (px_grad, py_grad) = d.rnnt_loss_simple(lm, am, symbols, 0, boundary, return_grad=True)
        >>> ranges = d.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=2)
        >>> tuple(ranges.shape), bool((ranges[..., 1] == ranges[..., 0] + 1).all())  # (B, T, s_range), consecutive
        ((1, 4, 2), True)
    """
    fn = "get_rnnt_prune_ranges"
    for arg, x in (("px_grad", px_grad), ("py_grad", py_grad), ("boundary", boundary)):
        check_tensor(fn, arg, x)
    b, s, t, regular = _k.check_prune_ranges_static(fn, px_grad.shape, px_grad.dtype,
                                                    py_grad.shape, py_grad.dtype,
                                                    boundary.shape, boundary.dtype, s_range)
    host_b = to_numpy(boundary) if is_concrete(boundary) else None
    if host_b is not None:
        _k.check_boundary_values(fn, host_b, s, t, "regular" if regular else "modified")
    s_range = _k.prune_s_range(fn, int(s_range), s, regular, host_b)
    return _maths.prune_ranges(_xp, px_grad, py_grad, boundary.to(torch.int64), s_range,
                               regular)


def do_rnnt_pruning(am: torch.Tensor, lm: torch.Tensor, ranges: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The joiner inputs on the kept positions: ``(am_pruned, lm_pruned)``.

    ``am_pruned[b, t, k] = am[b, t]`` (an expanded view) and ``lm_pruned[b, t,
    k] = lm[b, ranges[b, t, k]]``, both ``(B, T, s_range, D)``; differentiable.

    Args:
      am: ``(B, T, encoder_dim)``; lm: ``(B, S+1, decoder_dim)``; ranges:
        ``(B, T, s_range)`` from [`get_rnnt_prune_ranges`][duoloss.torch.get_rnnt_prune_ranges].

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> am, lm = torch.zeros((1, 4, 3)), torch.zeros((1, 3, 3))  # (B, T, C), (B, S + 1, C)
        >>> ranges = torch.tensor([[[0, 1], [0, 1], [1, 2], [1, 2]]])  # (B, T, s_range)
        >>> am_pruned, lm_pruned = d.do_rnnt_pruning(am, lm, ranges)
        >>> tuple(am_pruned.shape), tuple(lm_pruned.shape)  # both (B, T, s_range, C): add, then joiner
        ((1, 4, 2, 3), (1, 4, 2, 3))
    """
    fn = "do_rnnt_pruning"
    for arg, x in (("am", am), ("lm", lm), ("ranges", ranges)):
        check_tensor(fn, arg, x)
    _k.check_pruning_static(fn, am.shape, lm.shape, ranges.shape, ranges.dtype)
    if is_concrete(ranges):
        _k.check_ranges_values(fn, to_numpy(ranges), int(lm.shape[1]) - 1)
    return _maths.do_pruning(_xp, am, lm, ranges)
