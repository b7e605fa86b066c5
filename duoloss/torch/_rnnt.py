"""RNN-T for PyTorch: ``rnnt_loss``, ``RNNTLoss`` and ``rnnt_align``.

The joiner output never crosses to another device: the normaliser
(``log_softmax`` as a ``logsumexp``) and the gathers of the target and blank
log-probabilities run where the logits live (CPU: the core's one-pass kernels
on zero-copy views, `duoloss.torch._joiner`; GPU: torch ops), and only the
two ``(N, U(+1), T(+1))`` lattices cross to the host for the core recursion
(`duoloss.core.losses.transducer`); one custom backward
(`_LogProbGather`) takes their gradients back through the gathers and
the normaliser.  A reduced loss of CPU logits in plain eager mode (a training
step) skips the crossing altogether: `_FusedRNNT` runs the whole loss
and its gradient one sequence at a time in the core, with the same numbers.
"""
from __future__ import annotations

from typing import Literal, Sequence, Tuple

import numba
import numpy as np
import torch

from duoloss.core import _pool
from duoloss.core._validate import check_int_type as _check_int_type
from duoloss.core._reduce import reduction_weights, weighted_sum
from duoloss.core.losses.joiner import INACTIVE, NO_LABEL, rnnt_loss_from_logits
from duoloss.core.losses.transducer import (TRANSDUCER_KERNEL, check_rnnt_args, check_rnnt_options,
                                      rnnt_alignment, transducer_viterbi)

from . import _joiner, _private
from ._adapter import apply_kernel, is_concrete, to_numpy
from ._args import check_bool, check_tensor, host_ints, int_tensor
from ._ops import second_order_message
from ._device_align import rnnt_tokens, transducer_viterbi_regular
from ._triton import check_impl, int_to, ints_on, resolve_impl, rnnt_device_tail
from ._weights import flush_subnormals, unit_cotangent

__all__ = ["rnnt_loss", "RNNTLoss", "rnnt_align"]


class _ClampGrad(torch.autograd.Function):
    """Identity whose backward clamps the gradient to ``[-bound, bound]``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, bound):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.bound = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g.clamp(-ctx.bound, ctx.bound), None


class _ScaleGrad(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by ``factor`` (FastEmit)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, factor):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.factor = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class _LatticeGrad(torch.autograd.Function):
    """The CPU backward of `_LatticeLogProbs` as a node of its own: run
    inside ``forward`` it sees plain tensors under every ``torch.func``
    transform, and differentiating it raises (no second derivatives)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, lse, targets, il, tl, g_px, g_py, blank):
        return _joiner.lattice_backward(x, lse, targets, il, tl, g_px, g_py, blank)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(second_order_message("rnnt_loss"))


class _LatticeLogProbs(torch.autograd.Function):
    """CPU tensors: ``(px (N, U, T + 1), py (N, U + 1, T))`` straight from the
    logits in one pass each way (`duoloss.torch._joiner.lattice_forward`):
    what `_LogProbGather` and the transposes, pads and masks of
    `_lattice` compute, without their intermediate tensors."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, targets, il, tl, blank):
        return _joiner.lattice_forward(x, targets, il, tl, blank)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, targets, il, tl, blank = inputs
        ctx.blank = blank
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(x, targets, il, tl, output[2])

    @staticmethod
    def backward(ctx, gpx, gpy, unused):
        x, targets, il, tl, lse = ctx.saved_tensors
        return (_LatticeGrad.apply(x, lse, targets, il, tl, gpx, gpy, ctx.blank),
                None, None, None, None)


class _FusedRNNT(torch.autograd.Function):
    """The reduced (``'sum'``/``'mean'``) loss of CPU logits in plain eager mode,
    computed one sequence at a time with its gradient
    (`duoloss.core.losses.joiner.rnnt_loss_from_logits`): each sequence's
    logits are read from memory once, and the gradient for the cotangent that
    ``loss.backward()`` sends (1) is ready before the backward.

    Same numbers as the general path (`_LatticeLogProbs`, the lattice
    kernel reduced by the core, `duoloss.core._reduce`): the loss is the
    core's correctly rounded weighted sum, and the gradient is computed for the
    per-sequence cotangent the core applies (the weight ``1`` or ``1 / N``
    rounded to the logits' dtype, subnormal products flushed).  Any other
    cotangent (a scaled loss, ``create_graph=True``, a second backward with
    ``retain_graph=True``) recomputes it the general way from the saved
    normaliser and lattice gradients.
    """

    @staticmethod
    def forward(ctx, x, targets, il, tl, boundary, blank, mean):
        n = x.shape[0]
        w = reduction_weights("mean" if mean else "sum", n)
        # the cotangent of each sequence's loss as the general path's core
        # reduction applies it: the float64 weight rounded to the logits' dtype
        xv = _joiner._view(x, x.shape)
        scale = float(w[0].astype(xv.dtype)) if n else 1.0
        previous = _pool.openmp_wanted(True)
        try:
            losses, lse, gx, gy, grad = rnnt_loss_from_logits(
                xv, targets.numpy(), il.numpy(), tl.numpy(), blank, boundary.numpy(), scale)
        finally:
            _pool.openmp_wanted(previous)
        ctx.save_for_backward(x, targets, il, tl, torch.from_numpy(lse), torch.from_numpy(gx),
                              torch.from_numpy(gy))
        # not a saved tensor: handed out once, it is the caller's to change in place
        ctx.grad = torch.from_numpy(grad)
        ctx.blank, ctx.mean, ctx.scale = blank, mean, scale
        return torch.from_numpy(weighted_sum(losses.astype(xv.dtype, copy=False), w))

    @staticmethod
    def backward(ctx, g):
        x, targets, il, tl, lse, gx, gy = ctx.saved_tensors
        graph = torch.is_grad_enabled()
        if ctx.grad is not None and not graph and unit_cotangent(g):
            grad, ctx.grad = ctx.grad, None  # a retained graph's next backward recomputes
            return grad, None, None, None, None, None, None
        # as the general path: the weighted lattice gradients (subnormals
        # flushed), then the cotangent g (subnormal products flushed)
        g = g.to(gx.dtype)
        gxw = flush_subnormals(flush_subnormals(gx * ctx.scale) * g)
        gyw = flush_subnormals(flush_subnormals(gy * ctx.scale) * g)
        args = (x, lse, targets, il, tl, gxw, gyw, ctx.blank)
        out = _LatticeGrad.apply(*args) if graph else _joiner.lattice_backward(*args)
        return out, None, None, None, None, None, None


def _weights(reduction, n):
    """The core's per-sequence weights of the batch reduction (None for 'none'):
    a numpy array, or the same float64 values as a tensor while torch.compile traces."""
    if reduction == "none":
        return None
    if torch.compiler.is_compiling():
        return torch.full((n,), 1.0 if reduction == "sum" else 1.0 / max(n, 1),
                          dtype=torch.float64)
    return reduction_weights(reduction, n)


def _fusable(logits, reduction, fused_log_softmax, fastemit_lambda, delay_penalty):
    """Whether `_FusedRNNT` takes the call (a reduced loss of CPU
    float32/float64 logits that need a gradient, in plain eager mode, at least
    one sequence per numba thread, no FastEmit or delay penalty).

    The cheap checks that dynamo can trace come first: under ``torch.compile``
    (and ``torch.func``) the answer is False before numba's thread count (which
    takes numba's init lock, a context manager dynamo rejects) is asked for."""
    if (torch.compiler.is_compiling() or _private.transforms_active()
            or reduction == "none" or not fused_log_softmax or fastemit_lambda > 0
            or delay_penalty > 0):
        return False
    return (_joiner.supported(logits) and logits.shape[0] > 0
            and logits.requires_grad and torch.is_grad_enabled()
            and logits.shape[0] >= numba.get_num_threads())


class _LogProbGather(torch.autograd.Function):
    """``log_softmax`` over ``V`` and the two gathers of the lattice, in one node.

    ``x`` ``(N, T, U + 1, V)``, ``labels`` ``(N, T, U + 1)`` int64: the target
    label of each cell, ``NO_LABEL`` (the last position) or ``INACTIVE`` (a cell
    the lattice never reads: past the frames or the target of its sequence).
    Forward: ``px = logp[..., labels]`` ``(N, T, U)`` and ``py = logp[...,
    blank]`` ``(N, T, U + 1)`` with ``logp = log_softmax(x)``.  Backward, with
    ``c = -(g_px + g_py)`` per cell: ``d x = softmax(x) * c + onehot-scatter(g)``.

    The path of tensors the CPU operators do not take (GPU; CPU tensors take
    `_LatticeLogProbs`): torch ops on the input's device, the backward
    recomputing the softmax in one pass.  The softmax term is exactly 0 in
    cells with ``c = 0`` (no ``0 * NaN``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, labels, blank):
        u_max = x.shape[2] - 1
        logp = torch.log_softmax(x, dim=-1)
        idx = labels[..., :u_max].clamp(min=0).unsqueeze(-1)
        px, py = torch.gather(logp, 3, idx)[..., 0], logp[..., blank]
        # a row of -inf logits only: no move leaves the cell (-inf, where log_softmax
        # gives NaN), as the core's joiner kernels; its softmax term is zeroed below
        dead = x.amax(dim=-1) == float("-inf")
        px = px.masked_fill(dead[..., :u_max], float("-inf"))
        return px, py.masked_fill(dead, float("-inf")), logp.new_empty(0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, labels, blank = inputs
        ctx.blank = blank
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(x, labels, output[1])

    @staticmethod
    def backward(ctx, gpx, gpy, unused):
        x, labels, py = ctx.saved_tensors
        gpx = torch.nn.functional.pad(gpx, (0, 1))            # (N, T, U + 1)
        # c = 0 - (g_blank + g_label): +0.0 (not -0.0) in cells without cotangent
        c = torch.sub(0.0, gpy) - gpx
        out = torch.softmax(x, dim=-1)  # one pass: no log_softmax + exp
        out.mul_(c.unsqueeze(-1))
        # softmax(x) is NaN only in rows with a non-finite normaliser, where py is
        # NaN or -inf; zero those rows where no cotangent arrives
        # (always: asking whether any row is dead would synchronise with the device)
        dead = (c == 0) & ~torch.isfinite(py)
        out.masked_fill_(dead.unsqueeze(-1), 0.0)
        idx = labels.clamp(min=0).unsqueeze(-1)
        out.scatter_add_(3, idx, (gpx * (labels >= 0)).unsqueeze(-1))
        out[..., ctx.blank] += gpy
        return out, None, None


def _on_device(x, checked: np.ndarray, dev) -> torch.Tensor:
    """Checked lengths as a tensor on ``dev``: the caller's own 1-D integer tensor
    when it already lives there (the device kernels read any integer dtype: no copy,
    no host round trip), else the checked host values copied over (`int_to`)."""
    if (isinstance(x, torch.Tensor) and x.device == dev and x.dim() == 1
            and not x.is_floating_point() and x.dtype != torch.bool):
        return x
    return int_to(checked.astype(np.int64, copy=False), dev).reshape(-1)


def _validate(fn, logits, targets, logit_lengths, target_lengths, blank, device=False):
    """All checks before any computation; returns (blank, il, tl) as int64 tensors
    (with ``device``: integer tensors on the logits' device, the caller's own when
    they are already there).

    Values are read and checked whenever they are concrete (eager, torch.func
    without vmap over the ints); while torch.compile traces only shapes/dtypes.
    """
    check_tensor(fn, "logits", logits)
    check_tensor(fn, "targets", targets)
    dev = logits.device
    tensors = [x for x in (logits, targets, logit_lengths, target_lengths)
               if isinstance(x, torch.Tensor)]
    if is_concrete(*tensors):
        tg, il, tl = host_ints(fn, targets, logit_lengths, target_lengths, device, dev)
        blank = check_rnnt_args(fn, logits, tg, il, tl, blank)
        if device:
            return blank, _on_device(logit_lengths, il, dev), _on_device(target_lengths, tl, dev)
        il = int_to(il.astype(np.int64, copy=False), dev).reshape(-1)
        tl = int_to(tl.astype(np.int64, copy=False), dev).reshape(-1)
        return blank, il, tl
    il = int_tensor(fn, "logit_lengths", logit_lengths, dev)
    tl = int_tensor(fn, "target_lengths", target_lengths, dev)
    blank = check_rnnt_args(fn, logits, targets, il, tl, blank, concrete=False)
    if not torch.compiler.is_compiling():
        il, tl = ints_on(dev, il, tl)
    return blank, il.reshape(-1).to(torch.int64), tl.reshape(-1).to(torch.int64)


def _boundary(logits, targets, il, tl, blank):
    """``(targets as int64, boundary (N, 4))``: the lattice kernel's box per
    sequence, ``-1`` entries for an invalid one (its loss is NaN)."""
    n, t_max, u1, n_cls = logits.shape
    u_max = u1 - 1
    tg = int_to(targets, logits.device)  # (host targets with CUDA logits: pinned, no sync)
    pos = torch.arange(u_max, device=logits.device)
    in_len = pos[None, :] < tl[:, None]
    bad_label = in_len & ((tg < 0) | (tg >= n_cls) | (tg == blank))
    valid = ((il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= u_max)
             & ~bad_label.any(dim=1))
    zero = torch.zeros_like(il)
    neg = torch.full_like(il, -1)
    return tg, torch.stack([zero, zero, torch.where(valid, tl, neg),
                            torch.where(valid, il, neg)], dim=1)


def _lattice(logits, targets, il, tl, blank, fused_log_softmax, fastemit_lambda=0.0,
             delay_penalty=0.0):
    """``(px (N, U, T + 1), py (N, U + 1, T), boundary (N, 4))`` in the core's layout."""
    n, t_max, u1, n_cls = logits.shape
    u_max = u1 - 1
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    tg, boundary = _boundary(logits, targets, il, tl, blank)
    idx = tg.clamp(0, n_cls - 1)
    if fused_log_softmax and _joiner.supported(logits):
        px, py, _ = _LatticeLogProbs.apply(logits, tg, il, tl, blank)
        if fastemit_lambda > 0:
            px = _ScaleGrad.apply(px, 1.0 + float(fastemit_lambda))
        if delay_penalty > 0:
            px = px + _delay(il, t_max, delay_penalty, px)
        return px, py, boundary
    # px[b, s, t] = logp[b, t, s, y_s];  py[b, s, t] = logp[b, t, s, blank]
    if fused_log_softmax:
        # per cell: its label, NO_LABEL on the last position, INACTIVE where never read
        labels = torch.nn.functional.pad(idx, (0, 1), value=NO_LABEL)[:, None, :].expand(
            n, t_max, u1)
        read = ((torch.arange(t_max, device=logits.device)[None, :, None] < il[:, None, None])
                & (torch.arange(u1, device=logits.device)[None, None, :] <= tl[:, None, None]))
        labels = torch.where(read, labels, torch.full((), INACTIVE, dtype=labels.dtype,
                                                       device=labels.device))
        px, py, _ = _LogProbGather.apply(logits, labels, blank)
    else:
        gidx = idx[:, None, :, None].expand(n, t_max, u_max, 1)
        px = torch.gather(logits[:, :, :u_max], 3, gidx)[..., 0]
        py = logits[..., blank]
    if fastemit_lambda > 0:
        px = _ScaleGrad.apply(px, 1.0 + float(fastemit_lambda))
    px = px.transpose(1, 2)
    py = py.transpose(1, 2)
    px = torch.nn.functional.pad(px, (0, 1), value=float("-inf"))
    frame = torch.arange(t_max + 1, device=logits.device)
    if delay_penalty > 0:
        px = px + _delay(il, t_max, delay_penalty, px)
    # No symbol on the one-past-the-last frame T_b (k2's fix_for_boundary)
    px = torch.where(frame[None, None, :] < il[:, None, None], px,
                     torch.full((), float("-inf"), dtype=px.dtype, device=px.device))
    return px, py, boundary


def _delay(il, t_max, delay_penalty, px):
    """k2's delay penalty on ``px`` ``(N, U, T + 1)``: symbols emitted early are
    rewarded, late ones penalised (``(N, 1, T + 1)``)."""
    frame = torch.arange(t_max + 1, device=px.device, dtype=px.dtype)
    offset = (il.to(px.dtype) - 1) / 2
    return float(delay_penalty) * (offset[:, None, None] - frame[None, None])


def rnnt_loss(logits: torch.Tensor, targets: torch.Tensor,
              logit_lengths: torch.Tensor | Sequence[int],
              target_lengths: torch.Tensor | Sequence[int], blank: int = -1, clamp: float = -1,
              reduction: Literal["none", "sum", "mean"] = "mean", fused_log_softmax: bool = True, *,
              fastemit_lambda: float = 0.0, delay_penalty: float = 0.0, impl: str = "auto"
              ) -> torch.Tensor:
    r"""RNN Transducer loss, with the signature of ``torchaudio.functional.rnnt_loss``.

    ``N`` sequences, ``T`` padded frames, ``U`` padded target length, ``V``
    classes including the blank.  With $\ell_{t,u} =
    \log\operatorname{softmax}(\text{logits}_{b,t,u})$ the loss of sequence ``b``
    is the negative log-likelihood of its target over every alignment
    ($T_b$ blanks and the $U_b$ labels interleaved, any number of
    labels per frame, the last move a blank):

    $$
    \alpha_{t,u} = \operatorname{logaddexp}\left(\alpha_{t-1,u} +
    \ell_{t-1,u}(\varnothing),\; \alpha_{t,u-1} + \ell_{t,u-1}(y_u)\right),
    \qquad \text{loss}_b = -\left(\alpha_{T_b-1,U_b} +
    \ell_{T_b-1,U_b}(\varnothing)\right).
    $$

    Args:
      logits: ``(N, T, U + 1, V)`` joiner output (float16/bfloat16 are upcast
        to float32 for the computation).
      targets: ``(N, U)`` integer tensor of padded targets (labels in
        ``[0, V)``, never the blank).
      logit_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, U]``.
      blank: the blank class; negative values count from the end (``-1`` is ``V - 1``).
      clamp: if ``> 0``, the gradient w.r.t. ``logits`` is clamped to
        ``[-clamp, clamp]``.
      reduction: ``'none'`` (``(N,)`` losses), ``'sum'``, or ``'mean'`` (the
        batch mean, as torchaudio; not divided by target lengths).
      fused_log_softmax: ``False`` when ``logits`` already are log-probabilities
        (no normalisation is applied; the gradient is then w.r.t. those values).
      fastemit_lambda: FastEmit regularisation (Yu et al. 2021) with NeMo's /
        warprnnt-numba's semantics: the gradient of every label emission is
        scaled by ``1 + fastemit_lambda`` (blank emissions unchanged), and the
        reported loss is ``(1 + fastemit_lambda) * NLL`` (so, as in NeMo, the
        gradient is not the derivative of the reported value).
      delay_penalty: k2's delay penalty: ``delay_penalty * ((T_b - 1) / 2 - t)``
        is added to the log-probability of emitting a label on frame ``t``
        (changes the loss value; 0 disables it).
      impl: ``'auto'`` (CUDA tensors: the Triton device path; else the host
        path), ``'host'`` (the numba core) or ``'device'`` (the Triton kernels
        anywhere; CPU tensors only under ``TRITON_INTERPRET=1``).  See the
        Devices page.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``, in the
      dtype of ``logits`` (float32 for half inputs).

    NB: the gradient w.r.t. ``logits`` is $\operatorname{softmax} \cdot
    \gamma_{t,u} - \text{(posterior of each move)}$ as in torchaudio. ``clamp``
    bounds the gradient that reaches ``logits``; with ``reduction='mean'`` it is
    applied as ``clamp / N`` so that, as in torchaudio and NeMo, it bounds each
    sequence's own gradient when the mean is the objective (torchaudio's CPU/CUDA
    kernels in fact only apply the lower bound ``-clamp``; duoloss clamps both
    sides, as NeMo).  ``T_b = 0`` with ``U_b = 0`` gives loss 0; ``T_b = 0`` with
    ``U_b > 0`` gives ``+inf`` (no frame to emit on) with zero gradient.  Under
    ``torch.compile`` values are not checked: an invalid label or length makes
    that sequence's loss NaN.

    References:
      Graves, "Sequence Transduction with Recurrent Neural Networks",
      arXiv:1211.3711, 2012.
      Yu et al., "FastEmit: Low-latency Streaming ASR with Sequence-level
      Emission Regularization", arXiv:2010.11148, 2021.
      Kang et al., "Delay-penalized transducer for low-latency streaming ASR",
      arXiv:2211.00490, 2022.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> logits = torch.zeros(1, 2, 2, 3)  # (N, T, U + 1, V): uniform over V=3, blank = V - 1
        >>> targets, logit_lengths, target_lengths = torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1])
        >>> loss = dt.rnnt_loss(logits, targets, logit_lengths, target_lengths)
        >>> round(loss.item(), 4)  # 2 alignments of 3 moves, each (1/3)**3: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss"
    check_rnnt_options(fn, reduction, clamp, fused_log_softmax, fastemit_lambda, delay_penalty)
    device = resolve_impl(fn, impl, logits)
    blank, il, tl = _validate(fn, logits, targets, logit_lengths, target_lengths, blank,
                              device)
    n = logits.shape[0]
    x = logits
    bound = -1.0
    if clamp > 0:
        bound = float(clamp) / max(n, 1) if reduction == "mean" else float(clamp)
    if device:
        # the fused kernels: the logits read as they are, the clamp in the gradient's pass
        return rnnt_device_tail(x, targets, il, tl, blank, reduction, bound,
                                bool(fused_log_softmax), float(fastemit_lambda),
                                float(delay_penalty))
    if clamp > 0:
        x = _ClampGrad.apply(x, bound)
    if not device and _fusable(x, reduction, fused_log_softmax, fastemit_lambda, delay_penalty):
        tg, boundary = _boundary(x, targets, il, tl, blank)
        return _FusedRNNT.apply(x, tg, il, tl, boundary, blank, reduction == "mean")
    px, py, boundary = _lattice(x, targets, il, tl, blank, bool(fused_log_softmax),
                                float(fastemit_lambda), float(delay_penalty))
    # reduced in the core (float64 weights, a correctly rounded sum), as in JAX
    losses = apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary),
                          weights=_weights(reduction, n), rnnt_type="regular")
    if fastemit_lambda > 0:
        # NeMo reports (1 + lambda) * NLL; its gradient is the FastEmit one above
        losses = losses + float(fastemit_lambda) * losses.detach()
    return losses


class RNNTLoss(torch.nn.Module):
    """Module form of [`rnnt_loss`][duoloss.torch.rnnt_loss] (as ``torchaudio.transforms.RNNTLoss``).

    Args:
      blank: the blank index (``-1``: the last class), as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      clamp: gradient clamp (``< 0``: none), as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      fused_log_softmax: as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      fastemit_lambda: FastEmit regularisation, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      delay_penalty: as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      impl: ``'auto'``, ``'host'`` or ``'device'``, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> logits = torch.zeros(1, 2, 2, 3)  # (N, T, U + 1, V): uniform over V=3, blank = V - 1
        >>> targets, logit_lengths, target_lengths = torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1])
        >>> loss = dt.RNNTLoss()(logits, targets, logit_lengths, target_lengths)
        >>> round(loss.item(), 4)  # 2 alignments of 3 moves, each (1/3)**3: log(27 / 2)
        2.6027
    """

    def __init__(self, blank: int = -1, clamp: float = -1.0,
                 reduction: Literal["none", "sum", "mean"] = "mean", fused_log_softmax: bool = True,
                 *, fastemit_lambda: float = 0.0, delay_penalty: float = 0.0, impl: str = "auto"
                 ) -> None:
        super().__init__()
        check_impl("RNNTLoss", impl)
        self.impl = impl
        check_rnnt_options("RNNTLoss", reduction, clamp, fused_log_softmax, fastemit_lambda,
                           delay_penalty)
        _check_int_type("RNNTLoss", "blank", blank)  # its range needs the logits' V
        self.blank = blank
        self.clamp = clamp
        self.reduction = reduction
        self.fused_log_softmax = fused_log_softmax
        self.fastemit_lambda = fastemit_lambda
        self.delay_penalty = delay_penalty

    def forward(self, logits: torch.Tensor, targets: torch.Tensor,
                logit_lengths: torch.Tensor | Sequence[int],
                target_lengths: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=self.blank,
                         clamp=self.clamp, reduction=self.reduction,
                         fused_log_softmax=self.fused_log_softmax,
                         fastemit_lambda=self.fastemit_lambda,
                         delay_penalty=self.delay_penalty, impl=self.impl)

    def extra_repr(self) -> str:
        return (f"blank={self.blank}, clamp={self.clamp}, reduction={self.reduction!r}, "
                f"fused_log_softmax={self.fused_log_softmax}, "
                f"fastemit_lambda={self.fastemit_lambda}, delay_penalty={self.delay_penalty}")


def rnnt_align(logits: torch.Tensor, targets: torch.Tensor,
               logit_lengths: torch.Tensor | Sequence[int],
               target_lengths: torch.Tensor | Sequence[int], blank: int = -1,
               fused_log_softmax: bool = True, *, impl: str = "auto"
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Viterbi RNN-T alignment: the single best alignment of each target.

    $$
    \text{score}_b = \max_{\text{alignments}} \sum_{\text{moves}} \ell_{t,u}(k)
    $$

    over the same alignments as [`rnnt_loss`][duoloss.torch.rnnt_loss] (labels emitted within a
    frame, one blank to move to the next frame, the last move a blank).

    Args:
      logits: ``(N, T, U + 1, C)`` joiner output, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      targets: ``(N, U)`` integer targets, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      logit_lengths: ``(N,)`` frame counts, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      target_lengths: ``(N,)`` target lengths, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      blank: the blank index (``-1``: the last class), as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      fused_log_softmax: as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      impl: ``'auto'`` (default: the device path for CUDA tensors, else the
        host), ``'device'`` (a max-plus loop over the lattice's anti-diagonals in
        torch operations on ``logits``' device, any device, no Triton) or
        ``'host'`` (the numba core); both give the same results bit for bit; see
        the Devices page.

    Returns:
      ``(alignment, label_frames, scores)``:

      * ``alignment``: ``(N, T + U)`` int64 tokens of the best path in order: for
        each frame ``t < T_b`` the labels emitted on it, then the blank
        (``T_b + U_b`` tokens), padded with ``-1``;
      * ``label_frames``: ``(N, U)`` int64, the frame on which each target label
        is emitted (``-1`` beyond ``U_b``);
      * ``scores``: ``(N,)`` best path log-probabilities in the dtype of
        ``logits`` (float32 for halves).

    NB: not differentiable.  Ties go to the label move at the later point of
    the path (labels as late as possible among equal-score paths).  A sequence
    with no finite path (``T_b = 0 < U_b``) gets score ``-inf`` and ``-1``
    everywhere.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> logits = torch.zeros((1, 2, 2, 3))  # uniform: every alignment ties; labels go as late as possible
        >>> alignment, label_frames, scores = d.rnnt_align(logits, torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1]))
        >>> alignment.tolist(), label_frames.tolist(), round(float(scores[0]), 4)  # blank, '0' on frame 1, blank; 3 log(1/3)
        ([[2, 0, 2]], [[1]], -3.2958)
    """
    fn = "rnnt_align"
    check_impl(fn, impl)
    check_bool(fn, "fused_log_softmax", fused_log_softmax)
    blank, il, tl = _validate(fn, logits, targets, logit_lengths, target_lengths, blank)
    with torch.no_grad():
        px, py, boundary = _lattice(logits.detach(), targets, il, tl, blank,
                                    bool(fused_log_softmax))
    if impl == "device" or (impl == "auto" and logits.device.type == "cuda"):
        scores, frames = transducer_viterbi_regular(px, py, tl, il)
        align = rnnt_tokens(scores, frames, targets, il, tl, blank, logits.shape[1])
        return align, frames, scores.to(px.dtype)
    with torch.no_grad():
        scores, frames = transducer_viterbi(to_numpy(px), to_numpy(py), to_numpy(boundary),
                                            "regular")
    il_h, tl_h = to_numpy(il), to_numpy(tl)
    align = rnnt_alignment(scores, frames, to_numpy(targets).astype(np.int64), il_h, tl_h,
                           blank, logits.shape[1])
    dev = logits.device
    return (torch.from_numpy(align).to(dev), torch.from_numpy(frames).to(dev),
            torch.from_numpy(scores.astype(to_numpy(px).dtype)).to(dev))
