"""The device path's two ``torch.library`` operators and their autograd.

``duoloss::triton_ctc`` and ``duoloss::triton_transducer`` launch the Triton
kernels (`duoloss.torch._triton._kernels`, imported on the first launch)
and return the per-sequence losses with their per-sequence gradients; the
backward only scales the saved gradients by the cotangent.  As for the host
operator (`duoloss.torch._ops`): under ``torch.compile`` the operators
are called directly (fake rules give the output shapes, ``register_autograd``
the backward); eager code and ``torch.func`` go through a
``torch.autograd.Function`` in ``setup_context`` form (``torch.func.grad``
rejects custom operators with ``register_autograd``, pytorch#168393).
Under ``torch.func.vmap`` the Functions' ``vmap`` rules fold the vmapped
dimension into the batch axis (the host path's `duoloss.torch._ops.vmap_fold`):
one launch per vmap, nested ones included.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Tuple

import numpy as np
import torch

from .._adapter import _requires_grad
from .._private import transforms_active
from .._ops import second_order_message, vmap_fold
from . import int_to  # noqa: F401  (re-exported for the launchers)

__all__ = ["ctc", "int_to", "kernels_interpreted", "transducer", "transducer_with_grads"]


def kernels_interpreted():
    """None before the kernels are imported, else whether they were defined
    under the Triton interpreter."""
    mod = sys.modules.get(__package__ + "._kernels")
    return None if mod is None else mod.INTERPRETED


def _kernels():
    from . import _kernels
    return _kernels


def _block(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return max(b, 2)


def warps(block: int, per_thread: int = 2) -> int:
    """``num_warps`` of a one-program-per-sequence kernel whose levels are vectors of
    ``block`` lanes: ``per_thread`` values per thread, 1 to 32 warps (so ``num_warps *
    32 <= max(block, 32)``: no warp computes values another warp also computes).

    Per kernel, the value with no register spill at any ``BLOCK <= 2048`` in float32
    and float64 on sm_80/sm_90 (``benchmarks/aot_table.py``): CTC 4 up to ``block =
    512`` and 2 above (16 warps at 1024, 32 from 2048), TDT 4 (8 warps at 1024, 16 at
    2048); k2's recursion has its own rule (`k2_block`)."""
    return max(1, min(32, block // (32 * per_thread)))


def _ptr(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a one-element stand-in when it is empty (a zero-size CUDA tensor
    has no address for Triton; the kernels never read it then)."""
    return t if t.numel() else t.new_zeros(1)


#: While not None, `launch` appends ``(kernel, grid, args, kwargs)`` here instead of
#: launching: `duoloss.torch._triton._aot` runs the launchers on meta tensors to list
#: the kernel variants they produce.
RECORD = None


def launch(kernel, grid, args, kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` (or, while `RECORD` is a list, recorded)."""
    if RECORD is not None:
        RECORD.append((kernel, grid, args, kwargs))
        return
    kernel[grid](*args, **kwargs)


def _launch_device(t: torch.Tensor):
    """The device context of a launch (CUDA: the inputs' device; the kernels run
    on its current stream)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device)
    if t.device.type == "meta":
        return contextlib.nullcontext()
    # the interpreter evaluates the kernels with numpy: log(0) = -inf is intended
    return np.errstate(all="ignore")


# --------------------------------------------------------------------------- CTC
#: ``C`` up to which the CTC kernel writes the gradient's zeros itself (above it the
#: gradient starts as one ``zeros`` fill and the kernel writes only the classes
#: each target uses).
CTC_ZERO_ROWS_MAX_C = 1024
#: ``BLOCK`` up to which the CTC kernel shifts its rows in registers
#: (``tl.gather``, one warp) instead of through scratch with a barrier per frame.
CTC_GATHER_MAX_BLOCK = 64


#: ``BLOCK`` from which the CTC loss runs as two launches, alpha and beta concurrent
#: (`_ctc_kernels.ctc_ab_kernel`) then the gradient rows in parallel
#: (`_ctc_kernels.ctc_post_kernel`), instead of the one fused program per sequence.
#: Timed on an H200 (full float32 step): at commit 20c42f3 (emissions prefetched two
#: frames ahead; ``benchmarks/ctc_device_sweep.py``) the split form took 0.79x the
#: fused kernel's step at ``BLOCK`` 128 (``(8,200,30,40)``); in afa5a25's interleaved
#: race (``benchmarks.device --check``) the fused kernel took 0.89x the split form's
#: there (both under ``F.ctc_loss``'s: a host-bound step), and the split form 0.52x,
#: 0.42x and 0.66x the fused kernel's at the issue's three larger sizes.
#: The fused kernel stays below ``BLOCK`` 128, where it shifts its rows in registers
#: (``CTC_GATHER_MAX_BLOCK``), untimed against the split form.
CTC_SPLIT_MIN_BLOCK = 128


def ctc_config(block: int, n_cls: int, dtype: torch.dtype):
    """``(GATHER, ZERO_ROWS, num_warps)`` of a CTC launch on ``dtype`` log-probabilities
    (``benchmarks/ctc_device_sweep.py`` times the alternatives on a GPU).  Warps: 4
    values per thread up to ``BLOCK = 512`` (2 in float64, which spilled on sm_80 at
    4), 2 above; one warp for the ``tl.gather`` rows."""
    gather = block <= CTC_GATHER_MAX_BLOCK
    per_thread = 2 if block > 512 or dtype == torch.float64 else 4
    nw = 1 if gather else warps(block, per_thread)
    return gather, n_cls <= CTC_ZERO_ROWS_MAX_C, nw


@torch.library.custom_op("duoloss::triton_ctc", mutates_args=())
def ctc_op(lp: torch.Tensor, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor,
           blank: int, zero_infinity: bool, weights: int, reduce: bool, n_div: int,
           s_cap: int, concat: bool, out_f32: bool,
           want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, grad)`` of CTC on ``lp`` ``(T, N, C)``; see `_ctc_impl`."""
    return _ctc_impl(lp, targets, il, tl, blank, zero_infinity, weights, reduce, n_div,
                     s_cap, concat, out_f32, want_grad)


def _ctc_out_dtype(lp, out_f32):
    return torch.float32 if out_f32 else lp.dtype


def _ctc_impl(lp, targets, il, tl, blank, zero_infinity, weights, reduce, n_div, s_cap,
              concat, out_f32, want_grad):
    """One launch of the CTC kernel (`duoloss.torch._triton._ctc_kernels`).

    ``targets``: padded ``(N, S)`` or, with ``concat``, 1-D concatenated; lengths
    ``(N,)``; all integer tensors of any integer dtype on ``lp``'s device, read as
    they are.  ``s_cap``: a bound of the target lengths (``S`` when padded).
    ``weights`` 0/1/2: none, 'sum', 'mean' (over ``n_div`` sequences).  Returns
    ``out``: the ``(N,)`` losses (``weights`` 0), the reduced scalar (``reduce``),
    or the ``(N,)`` weighted losses in float64; and ``grad`` ``(T, N, C)`` =
    ``w_b d loss_b / d lp`` in ``lp``'s dtype (``(0,)`` without ``want_grad``).
    Rows with lengths or labels out of range: NaN (loss and gradient).
    """
    t_max, n, n_cls = lp.shape
    if lp.stride(2) != 1 and n_cls > 1:  # the kernel reads classes contiguously
        lp = lp.contiguous()
    if targets.dim() and targets.stride(-1) != 1 and targets.shape[-1] > 1:
        targets = targets.contiguous()
    il = il if il.stride(0) == 1 or n <= 1 else il.contiguous()
    tl = tl if tl.stride(0) == 1 or n <= 1 else tl.contiguous()
    out_dtype = _ctc_out_dtype(lp, out_f32)
    acc = torch.float32 if lp.dtype in (torch.float16, torch.bfloat16) else lp.dtype
    block = _block(2 * s_cap + 1)
    gather, zero_rows, nw = ctc_config(block, n_cls, lp.dtype)
    out = lp.new_empty((n,), dtype=out_dtype if weights == 0 else torch.float64)
    if not want_grad:
        grad = lp.new_empty((0,))
    elif zero_rows:
        grad = lp.new_empty(lp.shape)
    else:
        grad = lp.new_zeros(lp.shape)
    if n and block >= CTC_SPLIT_MIN_BLOCK:
        _ctc_split(lp, targets, il, tl, blank, zero_infinity, weights, n_div, s_cap, concat,
                   want_grad, out, grad, block, gather, zero_rows, nw, acc)
    elif n:
        rows = max(t_max, 1)
        scratch = lp.new_empty((n * (rows + 2) * block,), dtype=acc)
        g = grad if want_grad else lp
        with _launch_device(lp):
            launch(_kernels().ctc_kernel, (n,), (
                _ptr(lp), lp.stride(0), lp.stride(1), n_cls, blank,
                _ptr(targets), targets.stride(0) if targets.dim() == 2 else 0, il, tl,
                s_cap, rows, scratch, out, _ptr(g), g.stride(0), g.stride(1),
                max(n_div, 1), int(bool(zero_infinity))),
                dict(CONCAT=bool(concat), MODE=int(weights), WANT_GRAD=bool(want_grad),
                     ZERO_ROWS=zero_rows, GATHER=gather, BLOCK=block,
                     BLOCK_C=min(_block(n_cls), 128 * nw), num_warps=nw))
    if weights and reduce:
        out = out.sum()
        if out_dtype != torch.float64:
            out = out.to(out_dtype)
    return out, grad


def _ctc_split(lp, targets, il, tl, blank, zero_infinity, weights, n_div, s_cap, concat,
               want_grad, out, grad, block, gather, zero_rows, nw, acc):
    """`_ctc_impl`'s two-launch form (``CTC_SPLIT_MIN_BLOCK``): alpha and beta of each
    sequence as two concurrent programs, then one program per gradient row."""
    t_max, n, n_cls = lp.shape
    rows = max(t_max, 1)
    tables = lp.new_empty((2 * n * rows * block,), dtype=acc)
    ints = lp.new_empty((n * 2 * block,), dtype=torch.int32)
    stat = lp.new_empty((n * 3,), dtype=torch.float64)
    k = _kernels()
    with _launch_device(lp):
        launch(k.ctc_ab_kernel, (n, 2 if want_grad else 1), (
            _ptr(lp), lp.stride(0), lp.stride(1), n_cls, blank,
            _ptr(targets), targets.stride(0) if targets.dim() == 2 else 0, il, tl,
            s_cap, rows, tables, ints, stat, out, max(n_div, 1), int(bool(zero_infinity))),
            dict(CONCAT=bool(concat), MODE=int(weights), GATHER=bool(gather), BLOCK=block,
                 num_warps=nw, maxnreg=min(255, 65536 // (32 * nw))))
        if want_grad and t_max:
            launch(k.ctc_post_kernel, (t_max, n), (
                _ptr(lp), lp.stride(0), lp.stride(1), n_cls, blank, il, rows, tables, ints,
                stat, grad, grad.stride(0), grad.stride(1)),
                dict(ZERO_ROWS=zero_rows, BLOCK=block, BLOCK_C=min(_block(n_cls), 128 * nw),
                     num_warps=nw))


@ctc_op.register_fake
def _ctc_fake(lp, targets, il, tl, blank, zero_infinity, weights, reduce, n_div, s_cap,
              concat, out_f32, want_grad):
    if weights and reduce:
        out = lp.new_empty((), dtype=_ctc_out_dtype(lp, out_f32))
    else:
        out = lp.new_empty((lp.shape[1],),
                           dtype=torch.float64 if weights else _ctc_out_dtype(lp, out_f32))
    return out, lp.new_empty(lp.shape if want_grad else (0,))


def _ctc_setup(ctx, inputs, output):
    ctx.want_grad = inputs[-1]
    ctx.save_for_backward(output[1])


def _no_grad_error(name: str) -> RuntimeError:
    # the inputs looked constant when the call was traced: under torch.compile
    # that happens to a torch.func.vmap, whose batched tensors hide requires_grad
    return RuntimeError(
        f"{name}: the device path computed no gradient (its input did not require grad "
        f"when traced); differentiating torch.compile(torch.func.vmap(loss)) is not "
        f"supported on the device path: differentiate the uncompiled vmap, or compile a "
        f"batched call")


def _ctc_cotangent(g, grad):
    """The cotangent shaped to scale the saved ``(T, N, C)`` gradient."""
    g = g.to(grad.dtype)
    return g if g.dim() == 0 else g.view(1, -1, 1)


def _ctc_backward(ctx, g, _unused):
    if not ctx.want_grad:
        raise _no_grad_error("ctc_loss")
    (grad,) = ctx.saved_tensors
    return (grad * _ctc_cotangent(g, grad),) + (None,) * 12


torch.library.register_autograd("duoloss::triton_ctc", _ctc_backward, setup_context=_ctc_setup)


def _ctc_vmap_rule(info, in_dims, apply, lp, targets, il, tl, blank, zero_infinity, weights,
                   reduce, n_div, s_cap, concat, out_f32, want_grad):
    """`_vmap` for CTC: the folded call unreduced (weighted per sequence when
    reducing), each vmapped row reduced after."""
    outs, dims = _vmap(info, in_dims, (lp, targets, il, tl), (1, 0, 0, 0), 1, want_grad,
                       lambda *t: apply(*t, blank, zero_infinity, weights, False, n_div,
                                        s_cap, concat, out_f32, want_grad))
    if weights and reduce:
        outs = (outs[0].sum(1).to(_ctc_out_dtype(lp, out_f32)),) + tuple(outs[1:])
    return tuple(outs), tuple(dims)


@ctc_op.register_vmap
def _ctc_vmap(info, in_dims, *args):
    # torch.compile of a torch.func.vmap (eager vmap goes through _CTC.vmap)
    return _ctc_vmap_rule(info, in_dims, ctc_op, *args)


class _GradScale(torch.autograd.Function):
    """``saved * cotangent`` as a node of its own, so that a second derivative raises.

    ``anchor`` (the loss's input) only ties the node into a ``create_graph``
    backward's graph: differentiating the gradient again reaches this backward."""

    generate_vmap_rule = True  # (a vmap of the backward: saved * g batches as is)

    @staticmethod
    def forward(saved, g, anchor):
        return saved * g

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(second_order_message("the device path"))


def _vmap(info, in_dims, tensors, batch_axes, n_grads: int, want_grad: bool, apply):
    """The ``vmap`` rule of `_CTC` and `_Transducer`: `vmap_fold` over the
    tensor arguments (``batch_axes`` their batch axes), one ``apply(*tensors)``
    on the folded batch.  ``apply`` returns the Function's outputs: the losses,
    then the per-sequence gradients of the first ``n_grads`` tensors (``(0,)``
    placeholders without ``want_grad``, returned unbatched)."""
    k = len(tensors)
    want = [want_grad and i < n_grads for i in range(k)]

    def call(w, args):
        out = apply(*args)
        return list(out) if want_grad else [out[0]]

    outs, dims = vmap_fold(info.batch_size, in_dims[:k], None, batch_axes, want, None,
                           tensors, call)
    if not want_grad:
        outs = outs + [tensors[0].new_empty((0,))] * n_grads
        dims = dims + [None] * n_grads
    return tuple(outs), tuple(dims)


class _CTC(torch.autograd.Function):
    @staticmethod
    def forward(lp, targets, il, tl, *static):
        return _ctc_impl(lp, targets, il, tl, *static)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # (no zeros for the gradient output's cotangent)
        ctx.save_for_backward(output[1], inputs[0])
        # what a second backward (retain_graph=True) needs to compute the gradient
        # again: the first one scaled the saved gradient in place (no logits-sized copy)
        ctx.again = (inputs[0], inputs[0]._version) + tuple(inputs[1:])

    @staticmethod
    def backward(ctx, g, _unused):
        try:
            grad, lp = ctx.saved_tensors
        except RuntimeError as e:
            if "inplace operation" not in str(e):
                raise
            lp, version, *args = ctx.again
            if lp._version != version:  # the input itself changed since the forward
                raise
            # a later backward of a retained graph: the kernel once more (its
            # gradient, a fresh tensor, is this backward's to scale)
            grad = _ctc_impl(lp.detach(), *args)[1]
        scale = _ctc_cotangent(g, grad)
        if torch.is_grad_enabled() or transforms_active() or type(g) is not torch.Tensor:
            # create_graph (the second derivative must raise) or a torch.func transform
            return (_GradScale.apply(grad, scale, lp),) + (None,) * 12
        # the saved gradient is this backward's result: scaled in place, handed on
        # (the engine releases the saved tensors before the gradient is accumulated)
        return (grad.mul_(scale),) + (None,) * 12

    @staticmethod
    def vmap(info, in_dims, *args):
        return _ctc_vmap_rule(info, in_dims, _CTC.apply, *args)


def _want(*xs) -> bool:
    if not torch.is_grad_enabled():
        return False
    if torch.compiler.is_compiling():
        return any(x.requires_grad for x in xs)
    # (a tensor batched by torch.func.vmap hides a grad transform's requires_grad)
    return any(_requires_grad(x) for x in xs)


class _CTCEager(torch.autograd.Function):
    """`_CTC` for plain eager calls (no ``torch.func`` transform alive): the same
    forward and backward without ``setup_context``, whose ``apply`` binds the
    arguments through ``inspect.signature`` on every call (tens of microseconds)."""

    @staticmethod
    def forward(ctx, lp, targets, il, tl, *static):
        out = _ctc_impl(lp, targets, il, tl, *static)
        _CTC.setup_context(ctx, (lp, targets, il, tl) + static, out)
        return out

    backward = _CTC.backward


_WEIGHTS = {"none": 0, "sum": 1, "mean": 2}


def ctc(lp, targets, il, tl, zero_infinity: bool, blank: int = 0, reduction: str = "none",
        s_cap=None, concat: bool = False, out_f32: bool = False) -> torch.Tensor:
    """The CTC loss of ``lp`` ``(T, N, C)``, reduced (``reduction``) in the
    kernel's launch: differentiable w.r.t. ``lp``; see `_ctc_impl`."""
    if s_cap is None:
        s_cap = targets.shape[1]
    static = (int(blank), bool(zero_infinity), _WEIGHTS[reduction], reduction != "none",
              lp.shape[1], int(s_cap), bool(concat), bool(out_f32), _want(lp))
    if torch.compiler.is_compiling():
        return ctc_op(lp, targets, il, tl, *static)[0]
    if transforms_active():
        return _CTC.apply(lp, targets, il, tl, *static)[0]
    return _CTCEager.apply(lp, targets, il, tl, *static)[0]


# ----------------------------------------------------------------- transducer
@torch.library.custom_op("duoloss::triton_transducer", mutates_args=())
def transducer_op(px: torch.Tensor, py: torch.Tensor, boundary: torch.Tensor, modified: bool,
                  want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(losses (N,), gx, gy)``: the per-sequence gradients w.r.t. ``px``/``py``
    (``(0,)`` without ``want_grad``).  Invalid boundary rows: NaN."""
    return _transducer_impl(px, py, boundary, modified, want_grad)


#: Cells per program of the k2 gradient kernel.
_K2_ROWS = 256


def k2_block(s1: int) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` of the k2 recursion for ``S + 1`` states: one warp while a
    level fits 64 lanes (its shift a warp shuffle), then one per 64 lanes, at most 16."""
    block = max(_block(s1), 16)
    return block, max(1, min(16, block // 64))


def check_k2_lattice(fn: str, py) -> None:
    """``ValueError`` when one sequence's workspace row (two ``(S + 1, T + 1)`` planes)
    exceeds the kernels' 32-bit in-sequence offsets.  Shapes only."""
    s1, t_max = py.shape[1], py.shape[2]
    if 2 * s1 * (t_max + 1) + 1 > 2 ** 31 - 1:
        raise ValueError(f"{fn}: a lattice of (S + 1) * (T + 1) = {s1 * (t_max + 1)} cells "
                         f"per sequence is too large for the device path (at most "
                         f"{(2 ** 31 - 2) // 2}); use impl='host'")


def _transducer_impl(px, py, boundary, modified, want_grad):
    """The k2 recursion's launches (`duoloss.torch._triton._kernels`): ``(losses,
    gx, gy)`` in the inputs' dtypes, computed in float32 (float64 for float64 inputs);
    ``px``/``py``/``boundary`` read where they lie, invalid boxes marked NaN by the
    kernels."""
    n, s1, t_max = py.shape
    t_x = px.shape[2]
    p = s1 * (t_max + 1)
    w = 2 * p + 1
    cd = torch.float64 if py.dtype == torch.float64 else torch.float32
    losses = py.new_empty((n,))
    gx = px.new_empty((0,))
    gy = py.new_empty((0,))
    if n:
        k = _kernels()
        work = py.new_empty((n, w), dtype=cd)
        block, nw = k2_block(s1)
        common = (px, px.stride(0), px.stride(1), px.stride(2), py, py.stride(0),
                  py.stride(1), py.stride(2))
        with _launch_device(py):
            launch(k.k2_alpha_beta_kernel, (n, 2 if want_grad else 1), common + (
                boundary, boundary.stride(0), boundary.stride(1), work, w, p, s1 - 1, t_max,
                losses, losses.stride(0)),
                dict(MODIFIED=bool(modified), BLOCK=block, num_warps=nw))
            if want_grad:
                gx = px.new_empty(px.shape)
                gy = py.new_empty(py.shape)
                cells = n * p
                launch(k.k2_grad_kernel, (-(-cells // _K2_ROWS),), common + (
                    gx, gy, boundary, boundary.stride(0), boundary.stride(1), work, w, p,
                    s1 - 1, t_max, t_x, cells),
                    dict(MODIFIED=bool(modified), ROWS=_K2_ROWS, num_warps=4))
    elif want_grad:
        gx, gy = px.new_zeros(px.shape), py.new_zeros(py.shape)
    return losses, gx, gy


@transducer_op.register_fake
def _transducer_fake(px, py, boundary, modified, want_grad):
    return (py.new_empty((py.shape[0],)), px.new_empty(px.shape if want_grad else (0,)),
            py.new_empty(py.shape if want_grad else (0,)))


def _tr_setup(ctx, inputs, output):
    ctx.want_grad = inputs[-1]
    ctx.save_for_backward(output[1], output[2])


def _tr_backward(ctx, g, _gx, _gy):
    if not ctx.want_grad:
        raise _no_grad_error("the transducer loss")
    gx, gy = ctx.saved_tensors
    gl = g.reshape(-1, 1, 1)
    return gx * gl.to(gx.dtype), gy * gl.to(gy.dtype), None, None, None


torch.library.register_autograd("duoloss::triton_transducer", _tr_backward,
                                setup_context=_tr_setup)


@transducer_op.register_vmap
def _transducer_vmap(info, in_dims, px, py, boundary, modified, want_grad):
    return _vmap(info, in_dims, (px, py, boundary), (0, 0, 0), 2, want_grad,
                 lambda x, y, bd: transducer_op(x, y, bd, modified, want_grad))


class _Transducer(torch.autograd.Function):
    @staticmethod
    def forward(px, py, boundary, modified, want_grad):
        return transducer_op(px, py, boundary, modified, want_grad)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.save_for_backward(output[1], output[2], inputs[0], inputs[1])

    @staticmethod
    def backward(ctx, g, _gx, _gy):
        gx, gy, px, py = ctx.saved_tensors
        gl = g.reshape(-1, 1, 1)
        return (_GradScale.apply(gx, gl.to(gx.dtype), px),
                _GradScale.apply(gy, gl.to(gy.dtype), py), None, None, None)

    @staticmethod
    def vmap(info, in_dims, px, py, boundary, modified, want_grad):
        return _vmap(info, in_dims, (px, py, boundary), (0, 0, 0), 2, want_grad,
                     lambda x, y, bd: _Transducer.apply(x, y, bd, modified, want_grad))


def transducer(px, py, boundary, modified: bool) -> torch.Tensor:
    # (the kernels read px and py with their strides and write contiguous gradients)
    check_k2_lattice("the k2 transducer loss (impl='device')", py)
    want = _want(px, py)
    if torch.compiler.is_compiling():
        return transducer_op(px, py, boundary, modified, want)[0]
    return _Transducer.apply(px, py, boundary, modified, want)[0]


def transducer_with_grads(px, py, boundary, modified: bool):
    check_k2_lattice("the k2 transducer loss (impl='device')", py)
    if torch.compiler.is_compiling():
        out = transducer_op(px, py, boundary, modified, True)
    else:
        out = _Transducer.apply(px, py, boundary, modified, True)
    return out[0], out[1].detach(), out[2].detach()
