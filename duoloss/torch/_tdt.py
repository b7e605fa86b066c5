"""Duration transducers for PyTorch: ``tdt_loss`` / ``TDTLoss`` and
``multiblank_rnnt_loss`` / ``MultiblankRNNTLoss`` (NeMo's semantics).

Thin: argument checks (`duoloss.core.losses.tdt`), then the whole loss
and its gradient w.r.t. the logits in one core call
(`duoloss.torch._adapter.apply_kernel`), or, on the device path
(``impl='device'``, ``'auto'`` on CUDA), the fused Triton kernels of
`duoloss.torch._triton._dur_ops` (the logits read as they are, one gradient
pass in the backward; TDT with ``0 < omega < 1`` runs the TDT and the RNN-T
kernels and mixes the two losses).  Calls traced by ``torch.compile`` take
the host path.
"""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

from duoloss.core._validate import check_impl
from duoloss.core._validate import check_int_type as _check_int_type
from duoloss.core.losses.tdt import (MULTIBLANK_KERNEL, TDT_KERNEL, check_duration_options,
                                     check_multiblank_args, check_tdt_args, durations_key)

from ._adapter import apply_kernel, is_concrete
from ._args import check_tensor, host_ints, int_tensor
from ._triton import int_to, ints_on, resolve_impl

__all__ = ["tdt_loss", "TDTLoss", "multiblank_rnnt_loss", "MultiblankRNNTLoss"]

def _lengths(fn, logits, targets, logit_lengths, target_lengths, check, device=False):
    """``(il, tl, concrete)``: lengths as int64 tensors (with ``device``: integer
    tensors on the logits' device, the caller's own when they already live there);
    ``check(concrete)`` validates."""
    check_tensor(fn, "logits", logits)
    check_tensor(fn, "targets", targets)
    dev = logits.device
    tensors = [x for x in (logits, targets, logit_lengths, target_lengths)
               if isinstance(x, torch.Tensor)]
    if is_concrete(*tensors):
        tg, il, tl = host_ints(fn, targets, logit_lengths, target_lengths, device, dev)
        out = check(tg, il, tl, True)
        if device:
            from ._rnnt import _on_device
            return out, _on_device(logit_lengths, np.asarray(il), dev), _on_device(
                target_lengths, np.asarray(tl), dev)
        il = int_to(np.asarray(il).astype(np.int64), dev).reshape(-1)
        tl = int_to(np.asarray(tl).astype(np.int64), dev).reshape(-1)
        return out, il, tl
    il = int_tensor(fn, "logit_lengths", logit_lengths, dev)
    tl = int_tensor(fn, "target_lengths", target_lengths, dev)
    out = check(targets, il, tl, False)
    if not torch.compiler.is_compiling():
        il, tl = ints_on(dev, il, tl)
    return out, il.reshape(-1).to(torch.int64), tl.reshape(-1).to(torch.int64)


def _device(fn, impl, logits) -> bool:
    """Whether the call takes the Triton path (`resolve_impl`; never while
    ``torch.compile`` traces: the host operator compiles)."""
    check_impl(fn, impl)
    return resolve_impl(fn, impl, logits) and not torch.compiler.is_compiling()


def _weights(logits, reduction):
    """A reduction as per-sequence weights (folded into the kernel's gradient
    stores: no pass over the gradient in the backward): None for ``'none'``,
    ones for ``'sum'``, ``1 / N`` for ``'mean'`` (the batch mean)."""
    n = logits.shape[0]
    if reduction == "none":
        return None
    return np.ones(n) if reduction == "sum" else np.full(n, 1.0 / max(n, 1))


def tdt_loss(logits: torch.Tensor, targets: torch.Tensor,
             logit_lengths: torch.Tensor | Sequence[int],
             target_lengths: torch.Tensor | Sequence[int], blank: int, durations: Sequence[int], *,
             reduction: Literal["none", "sum", "mean"] = "mean", fastemit_lambda: float = 0.0,
             clamp: float = -1.0, sigma: float = 0.0, omega: float = 0.0,
             impl: str = "auto") -> torch.Tensor:
    r"""Token-and-Duration Transducer loss (Xu et al. 2023), NeMo's ``TDTLossNumba``.

    ``N`` sequences, ``T`` padded frames, ``U`` padded target length, ``V``
    token classes (the blank among them), ``D = len(durations)``.  Per cell,
    token log-probs $\ell_{t,u} = \log\operatorname{softmax}(x_{t,u,:V}) -
    \sigma$ and duration log-probs $\delta_{t,u} =
    \log\operatorname{softmax}(x_{t,u,V:})$.  From lattice node ``(t, u)``
    (``t < T_b``) a path emits $y_{u+1}$ with duration $d_i$ to
    ``(t + d_i, u + 1)`` (``t + d_i < T_b``; ``d_i = 0`` when listed) with
    weight $\ell_{t,u}(y_{u+1}) + \delta_{t,u,i}$, or the blank with a
    duration $d_i > 0$ to ``(t + d_i, u)`` with weight
    $\ell_{t,u}(\varnothing) + \delta_{t,u,i}$; paths start at ``(0, 0)``
    and end with a blank of duration $d_i > 0$ from
    ``(T_b - d_i, U_b)``, landing exactly on ``T_b``:

    $$
    \text{tdt}_b = -\log \sum_{\text{paths}} \exp \sum_{\text{moves}} w,
    \qquad \text{loss}_b = (1 + \lambda)\left((1 - \omega)\, \text{tdt}_b
    + \omega\, \text{rnnt}_b\right),
    $$

    with $\text{rnnt}_b$ the standard RNN-T loss of the token logits
    ``x[..., :V]`` (no $\sigma$, as NeMo; [`rnnt_loss`][duoloss.torch.rnnt_loss] on them).

    Args:
      logits: ``(N, T, U + 1, V + D)`` joiner output: ``V`` token logits, then
        the ``D`` duration logits in the order of ``durations`` (float16/bfloat16
        run in float32).
      targets: ``(N, U)`` integer padded targets (labels in ``[0, V)``, never the blank).
      logit_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, U]``.
      blank: the blank's index among the ``V`` token classes (negative values
        count from ``V``: ``-1`` is ``V - 1``, NeMo's usual layout).
      durations: distinct ints ``>= 0`` with at least one positive, e.g.
        ``[0, 1, 2, 3, 4]`` (NeMo's recommended set) or ``[1, 2, 3, 4, 5]``.
      reduction: ``'none'`` (``(N,)``), ``'sum'`` or ``'mean'`` (batch mean, as
        [`rnnt_loss`][duoloss.torch.rnnt_loss]; NeMo's numba loss means the same).
      fastemit_lambda: FastEmit (NeMo's kernel): the gradient through every
        label emission's *token* log-prob is scaled by ``1 + lambda``
        (duration logits unchanged); the loss reported is ``(1 + lambda)`` times
        the NLL.
      clamp: if ``> 0``, each sequence's gradient w.r.t. the *token* logits is
        clamped to ``[-clamp, clamp]`` (before the reduction scales it, as NeMo).
      sigma: logit under-normalisation: subtracted from every token (label and
        blank) log-prob, never from the durations'.
      omega: weight of the standard RNN-T loss.  NeMo draws, on each call, the
        RNN-T loss with probability ``omega`` instead of TDT for the whole
        batch; duoloss returns the expectation ``(1 - omega) * tdt + omega *
        rnnt`` (the same expected loss and gradient, the same number on every call).
      impl: ``'auto'`` (default): the device path for CUDA tensors when Triton
        is installed, else the host path; ``'host'``: the numba core (CUDA
        tensors make one round trip through the host); ``'device'``: Triton
        kernels on the tensors' device (CUDA; CPU only under
        ``TRITON_INTERPRET=1``), the same numbers as the host path.  Calls
        traced by ``torch.compile`` take the host path.

    Returns:
      The reduced loss, or ``(N,)`` losses, in the dtype of ``logits``.

    NB: ``T_b = 0`` gives 0 when ``U_b = 0`` and ``+inf`` otherwise; a sequence
    without a path (e.g. ``durations=[2]`` and an odd ``T_b``) gets ``+inf``
    and zero gradient.  The gradient is first order only.  TDT is not
    [`rnnt_loss`][duoloss.torch.rnnt_loss] in general, whatever the duration logits (one duration
    softmax per cell serves both the label, which would need ``d = 0``, and the blank, which
    needs ``d > 0``); what holds exactly: ``omega=1`` is [`rnnt_loss`][duoloss.torch.rnnt_loss] on
    ``logits[..., :V]``, and with ``durations=[0, 1]``, duration logits
    ``(0, -inf)`` on cells ``u < U_b`` and ``(-inf, 0)`` on ``u = U_b`` and the
    blank's logit ``-inf`` on ``u < U_b``, both losses keep the one path
    "every label on frame 0, then ``T_b`` blanks" and agree up to
    ``(T_b + U_b) * sigma``.

    Examples:
      >>> import torch
      >>> from duoloss.torch import tdt_loss
      >>> logits = torch.randn(2, 6, 3, 5 + 3, requires_grad=True)   # V = 5, D = 3
      >>> targets = torch.tensor([[1, 2], [3, 0]])
      >>> loss = tdt_loss(logits, targets, (6, 4), (2, 1), blank=4, durations=[0, 1, 2],
      ...                 sigma=0.05)
      >>> loss.backward()
      >>> import duoloss.torch as d
      >>> logits = torch.zeros((1, 2, 2, 3 + 2))  # (N, T, U + 1, V + D): uniform tokens (V=3) and durations [0, 1]
      >>> loss = d.tdt_loss(logits, torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1]), blank=2, durations=[0, 1])
      >>> round(float(loss), 4)  # 3 paths ('0'@d=0 ∅ ∅, '0'@d=1 ∅, ∅ '0'@d=0 ∅), each move 1/3 * 1/2: log 27
      3.2958

    References:
      Xu, Jia, Zhang, Hershey, Ginsburg, "Efficient Sequence Transduction by
      Jointly Predicting Tokens and Durations", ICML 2023, arXiv:2304.06795.
    """
    fn = "tdt_loss"
    check_duration_options(fn, reduction, clamp, fastemit_lambda, sigma, omega)
    device = _device(fn, impl, logits)

    def check(tg, il, tl, concrete):
        return check_tdt_args(fn, logits, tg, il, tl, blank, durations, concrete=concrete)

    (blank_, durs), il, tl = _lengths(fn, logits, targets, logit_lengths, target_lengths, check,
                                      device)
    if device:
        # the fused kernels: the logits read as they are, one gradient pass per spec
        from ._triton import _dur_ops
        n_dur, omega = len(durs), float(omega)
        tdt = _dur_ops.tdt_spec(tuple(int(d) for d in durs), float(sigma), n_dur)
        rnnt = _dur_ops.rnnt_on_tokens_spec(n_dur)
        spec = tdt if omega == 0.0 else rnnt if omega == 1.0 else [(tdt, 1.0 - omega),
                                                                   (rnnt, omega)]
        return _dur_ops.dur_loss(fn, logits, targets, il, tl, spec, blank=blank_,
                                 reduction=reduction, lam=float(fastemit_lambda),
                                 clamp=float(clamp))
    return apply_kernel(TDT_KERNEL, (logits, targets, il, tl),
                        weights=_weights(logits, reduction), blank=blank_,
                        durations=durations_key(durs), sigma=float(sigma),
                        fastemit_lambda=float(fastemit_lambda), clamp=float(clamp),
                        omega=float(omega))


def multiblank_rnnt_loss(logits: torch.Tensor, targets: torch.Tensor,
                         logit_lengths: torch.Tensor | Sequence[int],
                         target_lengths: torch.Tensor | Sequence[int], blank: int,
                         big_blank_durations: Sequence[int], *,
                         reduction: Literal["none", "sum", "mean"] = "mean",
                         fastemit_lambda: float = 0.0, clamp: float = -1.0, sigma: float = 0.0,
                         impl: str = "auto") -> torch.Tensor:
    r"""Multi-blank RNN-T loss (Xu et al. 2022), NeMo's ``MultiblankRNNTLossNumba``.

    ``logits`` ``(N, T, U + 1, V)`` with $\ell_{t,u} =
    \log\operatorname{softmax}(x_{t,u}) - \sigma$.  The standard blank sits at
    ``blank`` (duration 1), big blank ``i`` at index ``blank - 1 - i`` with
    duration ``big_blank_durations[i]``.  From ``(t, u)`` a path emits
    $y_{u+1}$ to ``(t, u + 1)`` or a blank of duration ``d`` to
    ``(t + d, u)``; the last move is a blank (of any duration) from
    ``(T_b - d, U_b)`` landing exactly on ``T_b``:

    $$
    \text{loss}_b = -(1 + \lambda) \log \sum_{\text{paths}}
    \exp \sum_{\text{moves}} \ell_{t,u}(k).
    $$

    Args:
      logits: ``(N, T, U + 1, V)`` joiner output (float16/bfloat16 run in float32).
      targets: ``(N, U)`` integer padded targets: labels in ``[0, V)``, never a
        blank or big blank.
      logit_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, U]``.
      blank: the standard blank (negative values count from ``V``); NeMo puts
        it last (``V - 1``) and the big blanks just before it.
      big_blank_durations: ints ``>= 1``, e.g. ``[2, 4, 8]``; ``blank - len(...)
        >= 0``.
      reduction: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      fastemit_lambda: as in [`tdt_loss`][duoloss.torch.tdt_loss] (here on the gradient w.r.t. every logit).
      clamp: as in [`tdt_loss`][duoloss.torch.tdt_loss] (here on the gradient w.r.t. every logit).
      sigma: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      impl: as in [`tdt_loss`][duoloss.torch.tdt_loss].

    Returns:
      The reduced loss, or ``(N,)`` losses, in the dtype of ``logits``.

    NB: with ``big_blank_durations=[]`` and ``sigma=0`` this is exactly
    [`rnnt_loss`][duoloss.torch.rnnt_loss].

    Examples:
      >>> import torch
      >>> from duoloss.torch import multiblank_rnnt_loss
      >>> logits = torch.randn(2, 8, 3, 7, requires_grad=True)   # big blanks 4, 5; blank 6
      >>> targets = torch.tensor([[1, 2], [3, 0]])
      >>> loss = multiblank_rnnt_loss(logits, targets, (8, 5), (2, 1), blank=6,
      ...                             big_blank_durations=[2, 4], sigma=0.05)
      >>> loss.backward()
      >>> import duoloss.torch as d
      >>> logits = torch.zeros((1, 2, 2, 4))  # (N, T, U + 1, V): uniform; blank 3, big blank 2 of duration 2
      >>> loss = d.multiblank_rnnt_loss(logits, torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1]), blank=3,
      ...                            big_blank_durations=[2])
      >>> round(float(loss), 4)  # '0' ∅ ∅, '0' big-∅, ∅ '0' ∅; each move 1/4: -log(2/64 + 1/16)
      2.3671

    References:
      Xu, Jia, Zhang, Hershey, Ginsburg, "Multi-blank Transducers for Speech
      Recognition", ICASSP 2023, arXiv:2211.03541.
    """
    fn = "multiblank_rnnt_loss"
    check_duration_options(fn, reduction, clamp, fastemit_lambda, sigma)
    device = _device(fn, impl, logits)

    def check(tg, il, tl, concrete):
        return check_multiblank_args(fn, logits, tg, il, tl, blank, big_blank_durations,
                                     concrete=concrete)

    (blank_, big), il, tl = _lengths(fn, logits, targets, logit_lengths, target_lengths, check,
                                     device)
    if device:
        from ._triton import _dur_ops
        spec = _dur_ops.multiblank_spec(tuple(int(d) for d in big), float(sigma))
        return _dur_ops.dur_loss(fn, logits, targets, il, tl, spec, blank=blank_,
                                 reduction=reduction, lam=float(fastemit_lambda),
                                 clamp=float(clamp))
    return apply_kernel(MULTIBLANK_KERNEL, (logits, targets, il, tl),
                        weights=_weights(logits, reduction), blank=blank_,
                        big_blank_durations=durations_key(big), sigma=float(sigma),
                        fastemit_lambda=float(fastemit_lambda), clamp=float(clamp))


class TDTLoss(torch.nn.Module):
    """Module form of [`tdt_loss`][duoloss.torch.tdt_loss] (NeMo's ``TDTLossNumba`` arguments).

    Args:
      blank: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      durations: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      reduction: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      fastemit_lambda: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      clamp: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      sigma: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      omega: as in [`tdt_loss`][duoloss.torch.tdt_loss].
      impl: as in [`tdt_loss`][duoloss.torch.tdt_loss].

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> logits = torch.zeros((1, 2, 2, 3 + 2))  # (N, T, U + 1, V + D): uniform tokens (V=3) and durations [0, 1]
        >>> loss = d.TDTLoss(blank=2, durations=[0, 1])(logits, torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1]))
        >>> round(float(loss), 4)  # 3 paths ('0'@d=0 ∅ ∅, '0'@d=1 ∅, ∅ '0'@d=0 ∅), each move 1/3 * 1/2: log 27
        3.2958
    """

    def __init__(self, blank: int, durations: Sequence[int], *,
                 reduction: Literal["none", "sum", "mean"] = "mean", fastemit_lambda: float = 0.0,
                 clamp: float = -1.0, sigma: float = 0.0, omega: float = 0.0,
                 impl: str = "auto") -> None:
        super().__init__()
        from duoloss.core.losses.tdt import check_tdt_durations
        check_duration_options("TDTLoss", reduction, clamp, fastemit_lambda, sigma, omega)
        self.impl = check_impl("TDTLoss", impl)
        _check_int_type("TDTLoss", "blank", blank)  # its range needs the logits' V
        self.blank = blank
        self.durations = list(check_tdt_durations("TDTLoss", durations))
        self.reduction = reduction
        self.fastemit_lambda = fastemit_lambda
        self.clamp = clamp
        self.sigma = sigma
        self.omega = omega

    def forward(self, logits: torch.Tensor, targets: torch.Tensor,
                logit_lengths: torch.Tensor | Sequence[int],
                target_lengths: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return tdt_loss(logits, targets, logit_lengths, target_lengths, self.blank,
                        self.durations, reduction=self.reduction,
                        fastemit_lambda=self.fastemit_lambda, clamp=self.clamp, sigma=self.sigma,
                        omega=self.omega, impl=self.impl)

    def extra_repr(self) -> str:
        return (f"blank={self.blank}, durations={self.durations}, reduction={self.reduction!r}, "
                f"fastemit_lambda={self.fastemit_lambda}, clamp={self.clamp}, "
                f"sigma={self.sigma}, omega={self.omega}")


class MultiblankRNNTLoss(torch.nn.Module):
    """Module form of [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss] (NeMo's ``MultiblankRNNTLossNumba``).

    Args:
      blank: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      big_blank_durations: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      reduction: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      fastemit_lambda: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      clamp: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      sigma: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      impl: as in [`multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> logits = torch.zeros((1, 2, 2, 4))  # (N, T, U + 1, V): uniform; blank 3, big blank 2 of duration 2
        >>> loss = d.MultiblankRNNTLoss(blank=3, big_blank_durations=[2])(logits, torch.tensor([[0]]),
        ...                                                        torch.tensor([2]), torch.tensor([1]))
        >>> round(float(loss), 4)  # '0' ∅ ∅, '0' big-∅, ∅ '0' ∅; each move 1/4: -log(2/64 + 1/16)
        2.3671
    """

    def __init__(self, blank: int, big_blank_durations: Sequence[int], *,
                 reduction: Literal["none", "sum", "mean"] = "mean", fastemit_lambda: float = 0.0,
                 clamp: float = -1.0, sigma: float = 0.0, impl: str = "auto") -> None:
        super().__init__()
        from duoloss.core.losses.tdt import check_big_blank_durations
        check_duration_options("MultiblankRNNTLoss", reduction, clamp, fastemit_lambda, sigma)
        self.impl = check_impl("MultiblankRNNTLoss", impl)
        _check_int_type("MultiblankRNNTLoss", "blank", blank)  # its range needs the logits' V
        self.blank = blank
        self.big_blank_durations = list(check_big_blank_durations("MultiblankRNNTLoss",
                                                                  big_blank_durations))
        self.reduction = reduction
        self.fastemit_lambda = fastemit_lambda
        self.clamp = clamp
        self.sigma = sigma

    def forward(self, logits: torch.Tensor, targets: torch.Tensor,
                logit_lengths: torch.Tensor | Sequence[int],
                target_lengths: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return multiblank_rnnt_loss(logits, targets, logit_lengths, target_lengths, self.blank,
                                    self.big_blank_durations, reduction=self.reduction,
                                    fastemit_lambda=self.fastemit_lambda, clamp=self.clamp,
                                    sigma=self.sigma, impl=self.impl)

    def extra_repr(self) -> str:
        return (f"blank={self.blank}, big_blank_durations={self.big_blank_durations}, "
                f"reduction={self.reduction!r}, fastemit_lambda={self.fastemit_lambda}, "
                f"clamp={self.clamp}, sigma={self.sigma}")
