"""``rnnt_loss``'s device path: the launches of `duoloss.torch._triton._rnnt_kernels`
and their autograd.

The forward (`rnnt_forward_impl`) launches the normaliser, the alpha/beta recursion
and, for a reduced loss, the reduction; it returns the loss and the per-sequence
workspace (blank and label log-probs, alpha, beta, normaliser, ``log Z``).  The
backward (`rnnt_grad_impl`) launches one kernel that writes the gradient w.r.t. the
logits with the cotangent folded in: the host work of a training step is two
allocations and three or four launches, whatever the shape.

As the other device operators (`duoloss.torch._triton._ops`): eager code and
``torch.func`` go through ``torch.autograd.Function`` s in ``setup_context`` form
(`_RNNT`, whose backward is `_RNNTGrad`: differentiating it again raises), whose
``vmap`` rules fold the vmapped dimension into the batch (one forward and one
backward launch group per vmap); under ``torch.compile`` the ``torch.library``
operators ``duoloss::triton_rnnt`` and ``duoloss::triton_rnnt_grad`` are called
(fake rules give the shapes, ``register_autograd`` the backward).
"""
from __future__ import annotations

import struct
import sys
from typing import Tuple

import torch

from .._ops import FastApply, fold, second_order_message
from ._ops import _launch_device, _no_grad_error, _ptr, _want, launch

__all__ = ["check_lattice", "kernels_interpreted", "rnnt", "rnnt_forward_impl", "rnnt_grad_impl",
           "workspace_width"]


def kernels_interpreted():
    """None before the kernels are imported, else whether they were defined under the
    Triton interpreter."""
    mod = sys.modules.get(__package__ + "._rnnt_kernels")
    return None if mod is None else mod.INTERPRETED


def _kernels():
    from . import _rnnt_kernels
    return _rnnt_kernels


def f64_bits(x: float) -> int:
    """``x`` as the int64 bits of a float64, for the kernels' `_f64` (a Python float
    argument would reach a kernel as float32)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _interpreted() -> bool:
    from . import _rnnt_kernels
    return _rnnt_kernels.INTERPRETED


def _pow2(n: int, lo: int = 1) -> int:
    b = lo
    while b < n:
        b *= 2
    return b


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def workspace_width(t_max: int, u1: int) -> int:
    """Entries per sequence of the workspace: five ``(T, U + 1)`` planes and three
    scalars (`duoloss.torch._triton._rnnt_kernels`)."""
    return 5 * t_max * u1 + 3


def check_lattice(fn: str, x) -> None:
    """``ValueError`` when one sequence's workspace row (`workspace_width`) exceeds the
    kernels' 32-bit in-sequence offsets (the batch and the logits' total size are not
    limited: per-sequence bases are 64-bit).  Shapes only: no host synchronisation."""
    t_max, u1 = x.shape[1], x.shape[2]
    if workspace_width(t_max, u1) > 2 ** 31 - 1:
        raise ValueError(f"{fn}: argument 'logits' of shape {tuple(x.shape)} has a lattice "
                         f"of T * (U + 1) = {t_max * u1} cells per sequence; the device path "
                         f"supports 5 * T * (U + 1) + 3 <= {2 ** 31 - 1} (use impl='host' or "
                         f"shorter sequences)")


#: Values per program of the two cell-parallel kernels (normaliser, gradient): rows
#: of ``BLOCK_V`` classes, ``ROWS`` cells; 4 warps (4 per thread in float32: at most 114 registers on sm_90 in the AOT table, where 2048 spilled).
_TILE = 512
_TILE_WARPS = 4
#: The largest class block; longer rows are read in chunks (an online max and sum).
_MAX_BLOCK_V = 2048


def _tiles(v: int, dtype: torch.dtype) -> Tuple[int, int]:
    block_v = min(_pow2(v, 2), _MAX_BLOCK_V)
    tile = _TILE if dtype != torch.float64 else _TILE // 2
    return max(1, tile // block_v), block_v


def _recursion_warps(block: int) -> int:
    """Warps of the recursion: one while a level fits 64 lanes (its shift a warp
    shuffle), then one per 64 lanes (2 values per thread), at most 16."""
    return max(1, min(16, block // 64))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rnnt_forward_impl(x, targets, il, tl, blank: int, reduction: str, fused: bool,
                      lam: float, delay: float, want_grad: bool):
    """``(out, work)``: ``out`` the reduced loss ``()`` (``'sum'``/``'mean'``) or the
    ``(N,)`` losses, in the compute dtype (float64 for float64 logits, else
    float32); ``work`` ``(N, W)`` the workspace.  ``x`` ``(N, T, U + 1, V)`` with
    contiguous classes, any float dtype; ``targets`` ``(N, U)``, ``il``/``tl``
    ``(N,)`` integer tensors of any integer dtype on ``x``'s device (invalid
    sequences: NaN loss)."""
    n, t_max, u1, v = x.shape
    cd = _compute_dtype(x)
    p = t_max * u1
    w = workspace_width(t_max, u1)
    dev = x.device
    work = torch.empty((n, w), dtype=cd, device=dev)
    reduced = reduction != "none"
    out = torch.empty(() if reduced else (n,), dtype=cd, device=dev)
    k = _kernels()
    rows, block_v = _tiles(v, cd)
    block = _pow2(u1, 16)
    tg = _ptr(targets)
    sy_b = targets.stride(0) if targets.dim() == 2 else 0
    sy_u = targets.stride(1) if targets.dim() == 2 else 0
    with _launch_device(x):
        if n * p:
            launch(k.rnnt_norm_kernel, (_cdiv(n * p, rows),), (
                x, x.stride(0), x.stride(1), x.stride(2), tg, sy_b, sy_u, il, tl,
                work, w, p, n * p, t_max, u1, v, blank, f64_bits(delay)),
                dict(FUSED=bool(fused), DELAY=delay != 0.0, ROWS=rows, BLOCK_V=block_v,
                     num_warps=_TILE_WARPS))
        if n:
            launch(k.rnnt_alpha_beta_kernel, (n, 2 if want_grad else 1), (
                work, w, p, tg, sy_b, sy_u, il, tl, t_max, u1 - 1, v, blank,
                f64_bits(1.0 + float(lam)), _ptr(out), 0 if reduced else out.stride(0)),
                dict(REDUCED=reduced, BLOCK=block, num_warps=_recursion_warps(block)))
        if reduced:
            inv = 1.0 / max(n, 1) if reduction == "mean" else 1.0
            launch(k.rnnt_reduce_kernel, (1,), (_ptr(work), w, p, n, out, f64_bits(inv)),
                   dict(BLOCK=128, num_warps=1))  # (one variant for every N)
    return out, work


def rnnt_grad_impl(x, work, targets, il, tl, cot, blank: int, reduction: str, fused: bool,
                   lam: float, bound: float):
    """The gradient w.r.t. ``x`` of ``sum_b c_b loss_b`` (one new buffer, ``x``'s dtype
    and strides): ``c_b = cot`` (a reduced loss's cotangent, times ``1 / N`` for
    ``'mean'``) or ``cot[b]``; ``bound > 0``: clamped to ``[-bound, bound]``."""
    n, t_max, u1, v = x.shape
    g = torch.empty_like(x)
    p = t_max * u1
    if n * p == 0:
        return g
    cd = work.dtype
    rows, block_v = _tiles(v, cd)
    reduced = reduction != "none"
    scale = 1.0 / max(n, 1) if reduction == "mean" else 1.0
    s_cot = 0 if reduced else cot.stride(0)
    sy_b = targets.stride(0) if targets.dim() == 2 else 0
    sy_u = targets.stride(1) if targets.dim() == 2 else 0
    k = _kernels()
    with _launch_device(x):
        launch(k.rnnt_grad_kernel, (_cdiv(n * p, rows),), (
            x, x.stride(0), x.stride(1), x.stride(2), g, g.stride(0), g.stride(1),
            g.stride(2), work, work.stride(0), p, _ptr(targets), sy_b, sy_u, il, tl,
            cot, s_cot, f64_bits(scale), n * p, t_max, u1, v, blank,
            f64_bits(1.0 + float(lam)), f64_bits(bound)),
            dict(FUSED=bool(fused), CLAMP=bound > 0, ROWS=rows, BLOCK_V=block_v,
                 num_warps=_TILE_WARPS))
    return g


# ------------------------------------------------------------ eager / torch.func
def _fold_all(m, dims, tensors):
    return [fold(t, d, 0, m) for t, d in zip(tensors, dims)]


class _RNNTGrad(FastApply, torch.autograd.Function):
    """The backward's launch as a node of its own: under ``torch.func`` it sees plain
    tensors (its ``vmap`` rule folds), and differentiating it raises."""

    @staticmethod
    def forward(x, work, targets, il, tl, cot, cfg):
        blank, reduction, fused, lam, _delay, bound = cfg
        return rnnt_grad_impl(x, work, targets, il, tl, cot, blank, reduction, fused, lam,
                              bound)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(second_order_message("rnnt_loss"))

    @staticmethod
    def vmap(info, in_dims, x, work, targets, il, tl, cot, cfg):
        m = info.batch_size
        x, work, targets, il, tl = _fold_all(m, in_dims[:5], (x, work, targets, il, tl))
        n = x.shape[0] // m
        blank, reduction, fused, lam, delay, bound = cfg
        if reduction != "none":  # one cotangent per instance: per sequence, weighted
            c = cot.movedim(in_dims[5], 0) if in_dims[5] is not None else cot.expand(m)
            if reduction == "mean":
                c = c / max(n, 1)
            cot = c[:, None].expand(m, n).reshape(-1)
        else:
            cot = fold(cot, in_dims[5], 0, m)
        g = rnnt_grad_impl(x.contiguous(), work, targets, il, tl, cot, blank, "none", fused,
                           lam, bound)
        return g.reshape(m, n, *g.shape[1:]), 0


class _RNNT(FastApply, torch.autograd.Function):
    @staticmethod
    def forward(x, targets, il, tl, cfg, want):
        blank, reduction, fused, lam, delay, _bound = cfg
        return rnnt_forward_impl(x, targets, il, tl, blank, reduction, fused, lam, delay,
                                 want)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, targets, il, tl, cfg, want = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # (no zeros for the workspace's cotangent)
        ctx.cfg, ctx.want = cfg, want
        ctx.save_for_backward(x, targets, il, tl, output[1])

    @staticmethod
    def backward(ctx, g, _unused):
        if not ctx.want:
            raise _no_grad_error("rnnt_loss")
        if g is None:
            return None, None, None, None, None, None
        x, targets, il, tl, work = ctx.saved_tensors
        return (_RNNTGrad.apply(x, work, targets, il, tl, g, ctx.cfg),
                None, None, None, None, None)

    @staticmethod
    def vmap(info, in_dims, x, targets, il, tl, cfg, want):
        m = info.batch_size
        xs = _fold_all(m, in_dims[:4], (x, targets, il, tl))
        n = xs[0].shape[0] // m
        blank, reduction, fused, lam, delay, bound = cfg
        losses, work = _RNNT.apply(xs[0].contiguous(), *xs[1:],
                                   (blank, "none", fused, lam, delay, bound), want)
        losses = losses.reshape(m, n)
        if reduction != "none":
            total = losses.to(torch.float64).sum(1)
            if reduction == "mean":
                total = total / max(n, 1)
            losses = total.to(losses.dtype)
        return (losses, work.reshape(m, n, work.shape[1])), (0, 0)


# ---------------------------------------------------------------- torch.compile
@torch.library.custom_op("duoloss::triton_rnnt", mutates_args=())
def rnnt_op(x: torch.Tensor, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor,
            blank: int, reduction: str, fused: bool, lam: float, delay: float, bound: float,
            want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """`rnnt_forward_impl` as an operator (``torch.compile``)."""
    return rnnt_forward_impl(x, targets, il, tl, blank, reduction, fused, lam, delay,
                             want_grad)


@rnnt_op.register_fake
def _rnnt_fake(x, targets, il, tl, blank, reduction, fused, lam, delay, bound, want_grad):
    n, t_max, u1, _ = x.shape
    cd = _compute_dtype(x)
    out = x.new_empty(() if reduction != "none" else (n,), dtype=cd)
    return out, x.new_empty((n, workspace_width(t_max, u1)), dtype=cd)


@torch.library.custom_op("duoloss::triton_rnnt_grad", mutates_args=())
def rnnt_grad_op(x: torch.Tensor, work: torch.Tensor, targets: torch.Tensor,
                 il: torch.Tensor, tl: torch.Tensor, cot: torch.Tensor, blank: int,
                 reduction: str, fused: bool, lam: float, bound: float) -> torch.Tensor:
    """`rnnt_grad_impl` as an operator (``torch.compile``)."""
    return rnnt_grad_impl(x, work, targets, il, tl, cot, blank, reduction, fused, lam, bound)


@rnnt_grad_op.register_fake
def _rnnt_grad_fake(x, work, targets, il, tl, cot, blank, reduction, fused, lam, bound):
    return torch.empty_like(x)


def _op_setup(ctx, inputs, output):
    x, targets, il, tl, blank, reduction, fused, lam, delay, bound, want = inputs
    ctx.cfg = (blank, reduction, fused, lam, bound)
    ctx.want = want
    ctx.save_for_backward(x, targets, il, tl, output[1])


def _op_backward(ctx, g, _unused):
    if not ctx.want:
        raise _no_grad_error("rnnt_loss")
    x, targets, il, tl, work = ctx.saved_tensors
    grad = rnnt_grad_op(x, work, targets, il, tl, g, *ctx.cfg)
    return grad, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("duoloss::triton_rnnt", _op_backward, setup_context=_op_setup)


# ------------------------------------------------------------------- the entry
def rnnt(x, targets, il, tl, *, blank: int, reduction: str, fused: bool, lam: float,
         delay: float, bound: float) -> torch.Tensor:
    """The device path of ``rnnt_loss`` after validation: the reduced loss (or ``(N,)``
    losses) in the compute dtype, differentiable w.r.t. ``x``."""
    check_lattice("rnnt_loss", x)
    if x.dim() == 4 and x.stride(3) != 1:
        x = x.contiguous()  # the kernels read (and write) the classes contiguously
    want = _want(x)
    if x.device.type == "cpu" and not torch.compiler.is_compiling() \
            and not _interpreted():
        raise RuntimeError("rnnt_loss: impl='device' on CPU tensors needs TRITON_INTERPRET=1 "
                           "in the environment before the first device call (the kernels "
                           "were defined for a GPU)")
    if torch.compiler.is_compiling():
        return rnnt_op(x, targets, il, tl, blank, reduction, bool(fused), float(lam),
                       float(delay), float(bound), want)[0]
    cfg = (int(blank), reduction, bool(fused), float(lam), float(delay), float(bound))
    return _RNNT.apply(x, targets, il, tl, cfg, want)[0]
