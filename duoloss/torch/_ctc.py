"""CTC for PyTorch: a drop-in for ``torch.nn.functional.ctc_loss`` / ``nn.CTCLoss``."""
from __future__ import annotations

from typing import Sequence
import numpy as np
import torch

from duoloss.core._validate import check_int_scalar as _check_int_scalar
from duoloss.core._validate import check_reduction as _check_reduction
from duoloss._xp import ctc as _xp_ctc
from duoloss._xp import TorchOps
from duoloss.core.losses.ctc import (CTC_KERNEL, _first_invalid, check_ctc_static, check_ctc_values,
                               ctc_gather_plan, ctc_gather_worthwhile)

from ._adapter import (apply_kernel, apply_kernel_eager, check_not_torchscript, is_concrete,
                       reduction_weights, to_numpy, torchscript_error)
from ._args import (check_bool, check_tensor, int_lengths, padded_targets_traced,
                    read_ints_together, read_together_applies)
from ._private import transforms_active
from ._triton import check_impl, ctc_device, int_to, ints_on, resolve_impl

__all__ = ["ctc_loss", "CTCLoss"]

_xp = TorchOps()  # duoloss._xp's array vocabulary for torch


def _gathered(log_probs, targets, target_lengths, blank):
    """``(log_probs, targets, blank)`` for the kernel: with a large vocabulary only
    the columns each sequence reads, gathered here on the input's device (see
    `duoloss.core.losses.ctc`, "the gathered crossing"); else unchanged.
    ``targets``/``target_lengths``: host int64 arrays, or tensors when traced."""
    t_max, n, n_cls = log_probs.shape
    s = targets.shape[1]
    if not ctc_gather_worthwhile(t_max, n, n_cls, s):
        return log_probs, targets, blank
    if isinstance(targets, np.ndarray):
        columns, column_targets = ctc_gather_plan(targets, target_lengths, n_cls, blank)
        columns = torch.from_numpy(columns).to(log_probs.device)
    else:  # values that cannot be read (torch.compile tracing, vmap): the plan in torch ops
        columns, column_targets = _xp_ctc.gather_plan(_xp, targets, target_lengths, n_cls,
                                                      blank)
    return _xp_ctc.gathered(_xp, log_probs, columns), column_targets, 0


def _ctc_traced(fn, log_probs, targets, input_lengths, target_lengths, blank, reduction,
                zero_infinity, device=False):
    """ctc_loss when target/length values cannot be read on the host (torch.compile
    tracing, or a torch.func.vmap over them): shapes and dtypes are checked here, an
    invalid sequence gets a NaN loss from the kernel instead of a ValueError."""
    il = int_lengths(fn, "input_lengths", input_lengths, log_probs, traced=True)
    tl = int_lengths(fn, "target_lengths", target_lengths, log_probs, traced=True)
    batched, concatenated = check_ctc_static(
        fn, tuple(log_probs.shape), log_probs.dtype, tuple(targets.shape), targets.dtype,
        tuple(il.shape), il.dtype, tuple(tl.shape), tl.dtype, blank, reduction,
        cache=not torch.compiler.is_compiling())
    check_bool(fn, "zero_infinity", zero_infinity)
    lp = log_probs if batched else log_probs.unsqueeze(1)
    il = il.reshape(-1).to(torch.int64)
    tl = tl.reshape(-1).to(torch.int64)
    tg = targets.to(torch.int64)
    if concatenated:
        tg = padded_targets_traced(tg, tl)
    elif not batched:
        tg = tg.reshape(1, -1)
    if device:
        if not torch.compiler.is_compiling():
            tg, il, tl = ints_on(lp.device, tg, il, tl)
        out = ctc_device(lp, tg, il, tl, int(blank), reduction, bool(zero_infinity))
        return out[0] if (not batched and reduction == "none") else out
    lp, tg, blank = _gathered(lp, tg, tl, int(blank))
    out = apply_kernel(CTC_KERNEL, (lp, tg, il, tl), weights=reduction_weights(reduction, tl),
                       blank=int(blank), zero_infinity=bool(zero_infinity))
    return out[0] if (not batched and reduction == "none") else out


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor,
             input_lengths: torch.Tensor | Sequence[int],
             target_lengths: torch.Tensor | Sequence[int], blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False, *, impl: str = "auto") -> torch.Tensor:
    r"""Connectionist Temporal Classification loss, same API as ``F.ctc_loss``.

    Same output as ``torch.nn.functional.ctc_loss`` given the same input (up to
    float rounding: duoloss computes in float64 internally, so float32 results
    are *more* accurate), with the exact gradient w.r.t. ``log_probs``.

    Args:
      log_probs: ``(T, N, C)``-tensor (or unbatched ``(T, C)``) of log-probabilities
        (e.g. ``log_softmax`` outputs), float32 or float64, any device; float16 and
        bfloat16 are computed in float64 and the loss and gradient returned in
        their dtype (under ``torch.autocast``: float32, as ``F.ctc_loss``).  ``T``
        frames, ``N`` sequences, ``C`` classes including the blank.
      targets: ``(N, S)`` padded integer targets, or 1-D concatenated targets of size
        ``sum(target_lengths)``; ``(S,)`` for unbatched input.  Labels in ``[0, C)``,
        never ``blank``.
      input_lengths: ``(N,)`` tensor or tuple of ints (or of 0-d tensors) in
        ``[0, T]``; a 0-d tensor or int when ``N = 1``, as ``F.ctc_loss`` accepts.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, S]`` (same forms).
      blank: index of the blank class.
      reduction: ``'none'`` (``(N,)`` losses), ``'sum'``, or ``'mean'`` (each loss
        divided by its target length clamped to >= 1, then averaged).
      zero_infinity: replace infinite losses (infeasible targets) and their
        gradients by zero.
      impl: ``'auto'`` (CUDA tensors: the Triton device path; else the host
        path), ``'host'`` (the numba core) or ``'device'`` (the Triton kernels
        anywhere; CPU tensors only under ``TRITON_INTERPRET=1``).  See the
        Devices page.

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
    The gradient is first order only: differentiating it again (a second
    ``grad`` after ``create_graph=True``, ``torch.func.hessian``, ``jvp``)
    raises ``NotImplementedError``, as torch's own CTC does.  TorchScript is not
    supported (``RuntimeError``); ``torch.compile`` and ``torch.export`` are.
    The math: see `duoloss.core.losses.ctc`.

    References:
      Graves et al., "Connectionist Temporal Classification", ICML 2006.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> log_probs = torch.full((2, 1, 3), -math.log(3))  # (T, N, C): T=2 uniform frames over C=3
        >>> targets, input_lengths, target_lengths = torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1])
        >>> loss = dt.ctc_loss(log_probs, targets, input_lengths, target_lengths)
        >>> round(loss.item(), 4)  # 3 of the 9 frame paths spell '1': -log(3/9) = log 3
        1.0986
    """
    fn = "ctc_loss"
    check_not_torchscript(fn)
    check_tensor(fn, "log_probs", log_probs)
    check_tensor(fn, "targets", targets)
    # (the default on a CPU tensor needs none of resolve_impl's work: the host path)
    device = (False if type(impl) is str and impl == "auto" and not log_probs.is_cuda
              else resolve_impl(fn, impl, log_probs))
    if not is_concrete(targets, input_lengths, target_lengths):
        return _ctc_traced(fn, log_probs, targets, input_lengths, target_lengths, blank,
                           reduction, zero_infinity, device)
    if (not device and isinstance(input_lengths, torch.Tensor) and isinstance(target_lengths, torch.Tensor)
            and targets.dim() == 2 and log_probs.dim() == 3 and input_lengths.dim() == 1
            and target_lengths.dim() == 1):
        out = _ctc_padded(fn, log_probs, targets, input_lengths, target_lengths, blank,
                          reduction, zero_infinity)
        if out is not None:
            return out
    tg_in, il_in, tl_in = targets, input_lengths, target_lengths
    ints = (targets, input_lengths, target_lengths)
    if device and read_together_applies(log_probs.device, ints):
        tg_in, il_in, tl_in = read_ints_together(ints)  # (one device-to-host copy)
    il = int_lengths(fn, "input_lengths", il_in, log_probs)
    tl = int_lengths(fn, "target_lengths", tl_in, log_probs)
    batched, concatenated = check_ctc_static(
        fn, tuple(log_probs.shape), log_probs.dtype, tuple(targets.shape), targets.dtype,
        il.shape, il.dtype, tl.shape, tl.dtype, blank, reduction)
    check_bool(fn, "zero_infinity", zero_infinity)
    tg = (tg_in if tg_in is not targets else to_numpy(targets)).astype(np.int64, copy=False)
    il = il.astype(np.int64, copy=False).reshape(-1)
    tl = tl.astype(np.int64, copy=False).reshape(-1)
    lp = log_probs if batched else log_probs.unsqueeze(1)
    if not batched:
        tg = tg.reshape(1, -1)
    padded = check_ctc_values(fn, tg, il, tl, lp.shape[0], lp.shape[2], blank, concatenated)
    if device:
        tg_d, il_d, tl_d, s_cap, concat = _device_ints(
            lp, targets, input_lengths, target_lengths, padded, il, tl, batched, concatenated)
        out = ctc_device(lp, tg_d, il_d, tl_d, int(blank), reduction, bool(zero_infinity),
                         s_cap, concat)
        return out[0] if (not batched and reduction == "none") else out
    weights = reduction_weights(reduction, tl)
    lp, padded, blank = _gathered(lp, padded, tl, int(blank))
    out = apply_kernel(
        CTC_KERNEL,
        (lp, padded, il, tl),
        weights=weights, blank=int(blank), zero_infinity=bool(zero_infinity))
    return out[0] if (not batched and reduction == "none") else out


def _on_device(x, device) -> bool:
    return isinstance(x, torch.Tensor) and x.device == device


def _device_ints(lp, targets, input_lengths, target_lengths, padded, il, tl, batched,
                 concatenated):
    """``(targets, input_lengths, target_lengths)`` for the device kernel, all
    validated, then ``s_cap`` and ``concat`` (see `ctc_device`): the caller's own
    tensors where they already lie on ``lp``'s device (read by the kernel as they
    are: no conversion, no copy), the rest from the validated host arrays in one
    upload."""
    dev = lp.device
    if transforms_active():  # (a vmap folds padded rows)
        targets = input_lengths = target_lengths = None
    up = []
    if not (_on_device(input_lengths, dev) and _on_device(target_lengths, dev)):
        up += [il, tl]
    if not _on_device(targets, dev):
        up.append(padded.reshape(-1))
    packed = int_to(np.concatenate(up), dev) if up else None
    n, s = padded.shape
    if packed is not None and len(up) != 1:
        il_d, tl_d = packed[:n], packed[n:2 * n]
    else:
        il_d = input_lengths if input_lengths.dim() == 1 else input_lengths.reshape(-1)
        tl_d = target_lengths if target_lengths.dim() == 1 else target_lengths.reshape(-1)
    if not _on_device(targets, dev):
        return packed[len(packed) - n * s:].view(n, s), il_d, tl_d, s, False
    if batched and not concatenated:
        return targets, il_d, tl_d, targets.shape[1], False
    # concatenated, or one unbatched (S,) row: each start summed in the kernel
    s_cap = targets.shape[0] if not batched else max(map(int, tl), default=0)
    return targets, il_d, tl_d, s_cap, True


def _int64(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 else a.astype(np.int64)


def _ctc_padded(fn, log_probs, targets, input_lengths, target_lengths, blank, reduction,
                zero_infinity):
    """The common case in few steps: ``(T, N, C)`` log_probs, padded ``(N, S)``
    targets and tensor lengths on the host.  None when it does not apply or
    the values are invalid (the general path then runs and raises)."""
    if not (log_probs.is_cpu and targets.is_cpu and input_lengths.is_cpu
            and target_lengths.is_cpu) or transforms_active():
        return None
    check_ctc_static(fn, log_probs.shape, log_probs.dtype, targets.shape, targets.dtype,
                     input_lengths.shape, input_lengths.dtype, target_lengths.shape,
                     target_lengths.dtype, blank, reduction)
    if not isinstance(zero_infinity, (bool, np.bool_)):
        return None
    tg = _int64(targets.numpy())
    il = _int64(input_lengths.numpy())
    tl = _int64(target_lengths.numpy())
    t_max, _, n_cls = log_probs.shape
    if _first_invalid(tg, il, tl, t_max, n_cls, blank)[0]:
        return None
    want = (torch.is_grad_enabled() and log_probs.requires_grad, False, False, False)
    log_probs, tg, blank = _gathered(log_probs, tg, tl, int(blank))
    return apply_kernel_eager(CTC_KERNEL, (log_probs, tg, il, tl), want,
                              reduction_weights(reduction, tl),
                              {"blank": int(blank), "zero_infinity": bool(zero_infinity)})


class CTCLoss(torch.nn.Module):
    """Module form of [`ctc_loss`][duoloss.torch.ctc_loss]; a drop-in for ``torch.nn.CTCLoss``.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> log_probs = torch.full((2, 1, 3), -math.log(3))  # (T, N, C): T=2 uniform frames over C=3
        >>> targets, input_lengths, target_lengths = torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1])
        >>> loss = dt.CTCLoss(blank=0)(log_probs, targets, input_lengths, target_lengths)
        >>> round(loss.item(), 4)  # 3 of the 9 frame paths spell '1': -log(3/9) = log 3
        1.0986
    """

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False, *,
                 impl: str = "auto") -> None:
        super().__init__()
        check_impl("CTCLoss", impl)
        self.impl = impl
        _check_int_scalar("CTCLoss", "blank", blank, 0)  # < C is checked per call
        _check_reduction("CTCLoss", reduction)
        check_bool("CTCLoss", "zero_infinity", zero_infinity)
        self.blank = blank
        self.reduction = reduction
        self.zero_infinity = zero_infinity

    def forward(self, log_probs: torch.Tensor, targets: torch.Tensor,
                input_lengths: torch.Tensor | Sequence[int],
                target_lengths: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                        self.reduction, self.zero_infinity, impl=self.impl)

    def __prepare_scriptable__(self):
        raise torchscript_error("CTCLoss")

    def extra_repr(self) -> str:
        return f"blank={self.blank}, reduction={self.reduction!r}, zero_infinity={self.zero_infinity}"
