"""The fused device path of ``tdt_loss`` and ``multiblank_rnnt_loss``: launches of
`duoloss.torch._triton._dur_kernels` and their autograd (the design of
`duoloss.torch._triton._rnnt_ops`: the normaliser, the alpha/beta recursion and the
reduction in the forward, one gradient kernel in the backward with the cotangent
folded in; ``torch.func`` through ``autograd.Function`` s with ``vmap`` rules).

A loss is a *spec*: the move tables (label moves ``(d, i)``, blank moves ``(k, d, i)``
with ``k`` the blank symbol's rank: class ``blank - k``; ``i`` the duration logit or
``None``), ``sigma``, whether the duration columns get a gradient, and the number of
duration planes (`tdt_spec`, `rnnt_on_tokens_spec`, `multiblank_spec`).
"""
from __future__ import annotations

import sys

import torch

from .._ops import FastApply, fold, second_order_message
from ._rnnt_ops import f64_bits
from ._ops import _launch_device, _no_grad_error, _ptr, _want, launch, warps

__all__ = ["dur_loss", "kernels_interpreted", "multiblank_spec", "rnnt_on_tokens_spec",
           "tdt_spec"]

_NONE = 4095
#: values per program of the normaliser and of the gradient kernel (float32; half of it
#: in float64): the gradient kernel holds a row's posteriors per move and duration, and
#: spilled at 512 (up to 728 B with 8 durations in float64 on sm_80).  At V = 256 on an
#: H200, 512 and 512 (commit afa5a25) took the TDT normaliser from 638 to 824 us and its
#: gradient from 2190 to 2568 us against these (commit 20c42f3; raw rows
#: benchmarks/results/device-profile-h200-*.json)
_TILE = 256
_GRAD_TILE = 128
_TILE_WARPS = 4


def kernels_interpreted():
    mod = sys.modules.get(__package__ + "._dur_kernels")
    return None if mod is None else mod.INTERPRETED


def _kernels():
    from . import _dur_kernels
    return _dur_kernels


def _pow2(n: int, lo: int = 1) -> int:
    b = lo
    while b < n:
        b *= 2
    return b


def _pack(values, fn: str = "tdt_loss") -> int:
    out = 0
    for m, d in enumerate(values):
        if not 0 <= d < 4096:
            raise ValueError(f"{fn}: argument 'durations' must hold values below 4095 on "
                             f"the device path, got {d}")
        out |= int(d) << (12 * m)
    return out


def tdt_spec(durations, sigma: float, n_dur: int):
    lab = tuple((d, i) for i, d in enumerate(durations))
    blk = tuple((0, d, i) for i, d in enumerate(durations) if d > 0)
    return (lab, blk, float(sigma), True, n_dur, n_dur, 1)


def rnnt_on_tokens_spec(n_dur: int):
    """Standard RNN-T on the token logits (TDT's ``omega`` part): no ``sigma``, no
    duration planes, zero gradient on the ``n_dur`` duration columns."""
    return (((0, None),), ((0, 1, None),), 0.0, False, 0, n_dur, 1)


def multiblank_spec(big, sigma: float):
    blk = ((0, 1, None),) + tuple((1 + i, d, None) for i, d in enumerate(big))
    return (((0, None),), blk, float(sigma), False, 0, 0, 1 + len(big))


def _consts(spec):
    lab, blk, _sigma, dur_grad, d_planes, d_cols, nb = spec
    pos = [(d, i) for d, i in lab if d > 0]
    zero = [i for d, i in lab if d == 0]
    idx = (lambda i: _NONE if i is None else i)
    return dict(
        LAB_D=_pack([d for d, _ in pos]), LAB_I=_pack([idx(i) for _, i in pos]), L=len(pos),
        BLK_K=_pack([k for k, _, _ in blk]), BLK_D=_pack([d for _, d, _ in blk]),
        BLK_I=_pack([idx(i) for _, _, i in blk]), J=len(blk), NB=nb, D=d_planes,
        ZERO_I=idx(zero[0]) if zero else _NONE, HAS_ZERO=1 if zero else 0)


def workspace_width(t_max: int, u1: int, spec) -> int:
    return (5 + spec[6] + spec[4]) * t_max * u1 + 3


def _compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _tiles(v: int, dtype, tile: int = 0):
    block_v = min(_pow2(v, 2), 2048)
    tile = tile or _TILE
    tile = tile if dtype != torch.float64 else tile // 2
    return max(1, tile // block_v), block_v


#: Tiles per frame up to which `dur_alpha_beta_kernel` unrolls them (their loads all in
#: flight together); more run as a loop, which keeps fewer registers live.
UNROLL_TILES = 2


def recursion_tiles(block: int, moves: int, dtype):
    """``(num_warps, dict(MB, MC, PREFETCH, UNROLL))`` of `dur_alpha_beta_kernel` at
    ``BLOCK`` lanes and ``moves`` moves per frame: the moves padded to ``MB``, read
    ``MC`` at a time as ``(MC, BLOCK)`` tiles of at most 16 values per thread in float32
    (8 in float64; half that from 16 warps), with up to 4 warps (at least
    `warps(block, 4)`) to fit all of them in one tile; when they fit, each frame's
    weights are loaded a frame ahead (``PREFETCH``), else the tiles are unrolled up to
    `UNROLL_TILES` (``UNROLL``).
    Spill-free at every ``BLOCK <= 2048`` on sm_80/sm_90 (``benchmarks/aot_table.py``)."""
    per = 16 if dtype != torch.float64 else 8
    mb = _pow2(moves, 2)
    nw = max(warps(block, 4), min(4, _pow2(-(-mb * block // (32 * per)))))
    if nw >= 16:    # (maxnreg 128 at 16 warps: half the values per thread)
        per //= 2
    each = max(1, mb * block // (32 * nw))
    mc = mb if each <= per else max(1, mb * per // each)
    return nw, dict(MB=mb, MC=mc, PREFETCH=mc == mb, UNROLL=mb // mc <= UNROLL_TILES)


def forward_impl(x, targets, il, tl, spec, blank: int, reduction: str, lam: float,
                 want_grad: bool):
    """``(out, work)``: the reduced loss (``()``) or ``(N,)`` losses in the compute
    dtype, and the workspace; ``x`` ``(N, T, U + 1, V + D)`` with contiguous classes."""
    n, t_max, u1, width = x.shape
    lab, blk, sigma, dur_grad, d_planes, d_cols, nb = spec
    n_lab = width - d_cols
    cd = _compute_dtype(x)
    p = t_max * u1
    w = workspace_width(t_max, u1, spec)
    work = torch.empty((n, w), dtype=cd, device=x.device)
    reduced = reduction != "none"
    out = torch.empty(() if reduced else (n,), dtype=cd, device=x.device)
    k = _kernels()
    rows, block_v = _tiles(n_lab, cd)
    block_d = _pow2(max(d_cols, nb, 1), 2)
    block = _pow2(u1, 2)
    consts = _consts(spec)
    nw, tile = recursion_tiles(block, consts["L"] + consts["J"], cd)
    tg = _ptr(targets)
    sy = (targets.stride(0), targets.stride(1)) if targets.dim() == 2 else (0, 0)
    with _launch_device(x):
        if n * p:
            launch(k.dur_norm_kernel, (-(-(n * p) // rows),), (
                x, x.stride(0), x.stride(1), x.stride(2), tg, *sy, il, tl, work, w, p,
                n * p, t_max, u1, n_lab, f64_bits(sigma), blank),
                dict(NB=nb, D=d_planes, ROWS=rows, BLOCK_V=block_v, BLOCK_D=block_d,
                     num_warps=_TILE_WARPS, maxnreg=255))  # (4 B spilled at V=28 on sm_80)
        if n:
            launch(k.dur_alpha_beta_kernel, (n, 2 if want_grad else 1), (
                work, w, p, tg, *sy, il, tl, t_max, u1 - 1, n_lab, blank,
                f64_bits(1.0 + float(lam)),
                _ptr(out), 0 if reduced else out.stride(0)),
                dict(REDUCED=reduced, BLOCK=block, num_warps=nw, **tile,
                     maxnreg=min(255, 65536 // (32 * nw)), **consts))
        if reduced:
            inv = 1.0 / max(n, 1) if reduction == "mean" else 1.0
            launch(k.dur_reduce_kernel, (1,), (_ptr(work), w, w - 2, n, out, f64_bits(inv)),
                   dict(BLOCK=128, num_warps=1))
    return out, work


def grad_unroll(moves: int, dtype) -> bool:
    """Whether `dur_grad_kernel` unrolls its move loops (each cell's loads of every
    move in flight together): up to 10 moves in float32 and 5 in float64, spill-free
    on sm_80/sm_90 (``benchmarks/aot_table.py``)."""
    return moves <= (10 if dtype != torch.float64 else 5)


def grad_impl(x, work, targets, il, tl, cot, spec, blank: int, reduction: str, lam: float,
              clamp: float):
    n, t_max, u1, width = x.shape
    lab, blk, sigma, dur_grad, d_planes, d_cols, nb = spec
    n_lab = width - d_cols
    g = torch.empty_like(x)
    p = t_max * u1
    if n * p == 0:
        return g
    cd = work.dtype
    rows, block_v = _tiles(n_lab, cd, _GRAD_TILE)
    block_d = _pow2(max(d_cols, nb, 1), 2)
    reduced = reduction != "none"
    scale = 1.0 / max(n, 1) if reduction == "mean" else 1.0
    sy = (targets.stride(0), targets.stride(1)) if targets.dim() == 2 else (0, 0)
    k = _kernels()
    with _launch_device(x):
        launch(k.dur_grad_kernel, (-(-(n * p) // rows),), (
            x, x.stride(0), x.stride(1), x.stride(2), g, g.stride(0), g.stride(1),
            g.stride(2), work, work.stride(0), p, _ptr(targets), *sy, il, tl, cot,
            0 if reduced else cot.stride(0), f64_bits(scale), n * p, t_max, u1, n_lab, blank,
            f64_bits(lam), f64_bits(clamp)),
            dict(DUR_GRAD=bool(dur_grad), DC=d_cols, CLAMP=clamp > 0, ROWS=rows,
                 BLOCK_V=block_v, BLOCK_D=block_d, num_warps=_TILE_WARPS,
                 UNROLL=grad_unroll(len(blk) + len(lab), cd),
                 maxnreg=255, **_consts(spec)))  # (ptxas chose 128 and spilled in float64)
    return g


class _DurGrad(FastApply, torch.autograd.Function):
    @staticmethod
    def forward(x, work, targets, il, tl, cot, cfg):
        spec, blank, reduction, lam, clamp, _fn = cfg
        return grad_impl(x, work, targets, il, tl, cot, spec, blank, reduction, lam, clamp)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[-1][-1]

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(second_order_message(ctx.fn))

    @staticmethod
    def vmap(info, in_dims, x, work, targets, il, tl, cot, cfg):
        m = info.batch_size
        x, work, targets, il, tl = [fold(t, d, 0, m) for t, d in
                                    zip((x, work, targets, il, tl), in_dims[:5])]
        n = x.shape[0] // m
        spec, blank, reduction, lam, clamp, fn = cfg
        if reduction != "none":
            c = cot.movedim(in_dims[5], 0) if in_dims[5] is not None else cot.expand(m)
            if reduction == "mean":
                c = c / max(n, 1)
            cot = c[:, None].expand(m, n).reshape(-1)
        else:
            cot = fold(cot, in_dims[5], 0, m)
        g = grad_impl(x.contiguous(), work, targets, il, tl, cot, spec, blank, "none", lam,
                      clamp)
        return g.reshape(m, n, *g.shape[1:]), 0


class _Dur(FastApply, torch.autograd.Function):
    @staticmethod
    def forward(x, targets, il, tl, cfg, want):
        spec, blank, reduction, lam, _clamp, _fn = cfg
        return forward_impl(x, targets, il, tl, spec, blank, reduction, lam, want)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, targets, il, tl, cfg, want = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.cfg, ctx.want = cfg, want
        ctx.save_for_backward(x, targets, il, tl, output[1])

    @staticmethod
    def backward(ctx, g, _unused):
        if g is None:
            return None, None, None, None, None, None
        if not ctx.want:
            raise _no_grad_error(ctx.cfg[-1])
        x, targets, il, tl, work = ctx.saved_tensors
        return (_DurGrad.apply(x, work, targets, il, tl, g, ctx.cfg),
                None, None, None, None, None)

    @staticmethod
    def vmap(info, in_dims, x, targets, il, tl, cfg, want):
        m = info.batch_size
        xs = [fold(t, d, 0, m) for t, d in zip((x, targets, il, tl), in_dims[:4])]
        n = xs[0].shape[0] // m
        spec, blank, reduction, lam, clamp, fn = cfg
        losses, work = _Dur.apply(xs[0].contiguous(), *xs[1:],
                                  (spec, blank, "none", lam, clamp, fn), want)
        losses = losses.reshape(m, n)
        if reduction != "none":
            total = losses.to(torch.float64).sum(1)
            if reduction == "mean":
                total = total / max(n, 1)
            losses = total.to(losses.dtype)
        return (losses, work.reshape(m, n, work.shape[1])), (0, 0)


def check_lattice(fn: str, x, spec) -> None:
    """Refuse logits whose per-sequence workspace outgrows the kernels' 32-bit
    in-sequence offsets (shapes only; the per-sequence bases are 64-bit, so the batch
    as a whole is not limited)."""
    widest = max(workspace_width(x.shape[1], x.shape[2], sp)
                 for sp in ([w[0] for w in spec] if isinstance(spec, list) else [spec]))
    if widest > 2 ** 31 - 1:
        raise ValueError(f"{fn}: argument 'logits' of shape {tuple(x.shape)} has a lattice of "
                         f"T * (U + 1) = {x.shape[1] * x.shape[2]} cells per sequence, too "
                         f"many for the device path's 32-bit in-sequence offsets (use "
                         f"impl='host' or shorter sequences)")


def dur_loss(fn: str, x, targets, il, tl, spec, *, blank: int, reduction: str, lam: float,
             clamp: float) -> torch.Tensor:
    """The reduced loss (or ``(N,)`` losses) of one spec (or of a list of ``(spec,
    weight)``: their weighted sum), in ``x``'s dtype,
    differentiable w.r.t. ``x``; arguments validated (traced values: the kernels mark
    invalid sequences NaN)."""
    from . import _dur_kernels
    if x.device.type == "cpu" and not _dur_kernels.INTERPRETED:
        raise RuntimeError(f"{fn}: impl='device' on CPU tensors needs TRITON_INTERPRET=1 in "
                           f"the environment before the first device call (the kernels were "
                           f"defined for a GPU)")
    if x.stride(3) != 1:
        x = x.contiguous()
    if targets.device != x.device:
        from . import int_to
        targets = int_to(targets, x.device)
    check_lattice(fn, x, spec)
    want = _want(x)
    if isinstance(spec, list):
        return _mixture(x, targets, il, tl, spec, want, blank, reduction, lam, clamp, fn)
    cfg = (spec, int(blank), reduction, float(lam), float(clamp), fn)
    out = _Dur.apply(x, targets, il, tl, cfg, want)[0]
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _mixture(x, targets, il, tl, weighted, want, blank, reduction, lam, clamp, fn):
    """``sum_k w_k loss_k`` of weighted specs (TDT's ``omega``): each spec's kernels
    once, the mixture in torch operations; a sequence whose mixture is infinite gets
    no gradient (the core's rule), through a ``torch.where`` on the detached value."""
    total = None
    for spec, weight in weighted:
        cfg = (spec, int(blank), "none", float(lam), float(clamp), fn)
        part = _Dur.apply(x, targets, il, tl, cfg, want)[0] * weight
        total = part if total is None else total + part
    total = torch.where(torch.isinf(total), total.detach(), total)
    if reduction != "none":
        out = total.to(torch.float64).sum()
        if reduction == "mean":
            out = out / max(total.shape[0], 1)
        total = out.to(total.dtype)
    return total if total.dtype == x.dtype else total.to(x.dtype)
