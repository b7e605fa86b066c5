"""k2's simple and pruned RNN-T losses for JAX, with the names, arguments and numbers
of :mod:`duoloss.torch._rnnt_k2` (itself a drop-in for k2's functions).

``(px, py)`` are built with ``jax.numpy`` (differentiable); the recursion runs in
duoloss's transducer core through one host callback (``jit``, ``grad``, ``vmap``
and ``shard_map`` work as for every duoloss loss).  Arguments that set output
shapes (``s_range``, ``termination_symbol``, ``rnnt_type``, ``reduction``,
``return_grad``) are static Python values.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core.losses import rnnt_k2 as _k
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL

from ._adapter import _call, apply_kernel, scale_by_cotangent
from ._xla import check_impl, use_device
from ._xla.transducer import transducer_losses as _device_transducer_losses
from ._args import as_array, check_bool, is_concrete, reduce_losses

__all__ = [
    "do_rnnt_pruning",
    "get_rnnt_logprobs",
    "get_rnnt_logprobs_pruned",
    "get_rnnt_prune_ranges",
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
]


def _array(fn, arg, x):
    return as_array(fn, arg, x, arrays_only=True)


def _host(x):
    return np.asarray(x)


def _boundary(fn, boundary, b, s, t, rnnt_type):
    if boundary is None:
        if rnnt_type != "regular" and s > t:
            raise ValueError(f"{fn}: rnnt_type={rnnt_type!r} needs T >= S without a boundary "
                             f"(one symbol per frame at most), got T={t} and S={s}")
        return jnp.broadcast_to(jnp.asarray([0, 0, s, t], jnp.int32), (b, 4))
    boundary = _array(fn, "boundary", boundary)
    _k.check_boundary_static(fn, boundary.shape, boundary.dtype, b)
    if is_concrete(boundary):
        _k.check_boundary_values(fn, _host(boundary), s, t, rnnt_type)
    return boundary


def _finish_px(px, py, boundary, rnnt_type, delay_penalty):
    b, s, t0 = px.shape
    if rnnt_type == "regular":
        col = jnp.arange(t0)[None, None, :]
        px = jnp.where(col == boundary[:, 3].reshape(b, 1, 1), -jnp.inf, px)
    elif rnnt_type == "constrained":
        px = px + py[:, 1:, :]
    if delay_penalty > 0.0:
        offset = (boundary[:, 3].astype(px.dtype) - 1) / 2
        penalty = offset.reshape(b, 1, 1) - jnp.arange(t0, dtype=px.dtype)
        px = px + (penalty * delay_penalty).astype(px.dtype)
    return px


def _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type, boundary,
                     delay_penalty=0.0, reduction="mean", scales=None):
    lm, am, symbols = (_array(fn, a, x) for a, x in (("lm", lm), ("am", am),
                                                      ("symbols", symbols)))
    b, s, t, c = _k.check_simple_static(fn, lm.shape, lm.dtype, am.shape, am.dtype,
                                        symbols.shape, symbols.dtype)
    _k.check_common_scalars(fn, termination_symbol, c, rnnt_type, delay_penalty, reduction)
    if scales is not None:
        scales = (_k.check_float_scalar(fn, "lm_only_scale", scales[0]),
                  _k.check_float_scalar(fn, "am_only_scale", scales[1]))
    if is_concrete(symbols):
        _k.check_symbols_values(fn, _host(symbols), c)
    boundary = _boundary(fn, boundary, b, s, t, rnnt_type)

    am_max = jax.lax.stop_gradient(am.max(axis=2, keepdims=True))
    lm_max = jax.lax.stop_gradient(lm.max(axis=2, keepdims=True))
    am_max = jnp.where(jnp.isfinite(am_max), am_max, 0)
    lm_max = jnp.where(jnp.isfinite(lm_max), lm_max, 0)
    am_probs = jnp.exp(am - am_max)
    lm_probs = jnp.exp(lm - lm_max)
    tiny = jnp.finfo(am.dtype).tiny
    prod = jnp.matmul(lm_probs, jnp.swapaxes(am_probs, 1, 2))
    log_z = jnp.log(prod + tiny) + lm_max + jnp.swapaxes(am_max, 1, 2)

    px_am = jnp.take_along_axis(jnp.swapaxes(am, 1, 2), symbols[:, :, None], axis=1,
                                mode="clip")  # (B, S, T)
    px_lm = jnp.take_along_axis(lm[:, :s], symbols[:, :, None], axis=2, mode="clip")
    px = px_am + px_lm - log_z[:, :s, :]
    py_am = am[:, None, :, termination_symbol]
    py_lm = lm[:, :, termination_symbol, None]
    py = py_am + py_lm - log_z
    if scales is not None:
        lm_scale, am_scale = scales
        lm_sum = lm_probs.sum(axis=2, keepdims=True)
        lm_only_norm = jnp.log(lm_sum) + lm_max
        unigram = (lm_probs / lm_sum).mean(axis=(0, 1)) + tiny
        am_only_norm = (jnp.log(jnp.matmul(am_probs, unigram))[:, None, :]
                        + jnp.swapaxes(am_max, 1, 2))
        log_unigram = jnp.log(unigram)
        px_am_only = px_am + jnp.take(log_unigram, symbols, mode="clip")[:, :, None] \
            - am_only_norm
        px_lm_only = px_lm - lm_only_norm[:, :s]
        py_am_only = py_am + log_unigram[termination_symbol] - am_only_norm
        py_lm_only = py_lm - lm_only_norm
        combined = 1.0 - lm_scale - am_scale
        lm_scale = lm_scale if lm_scale != 0.0 else 1e-20
        am_scale = am_scale if am_scale != 0.0 else 1e-20
        px = px * combined + px_lm_only * lm_scale + px_am_only * am_scale
        py = py * combined + py_lm_only * lm_scale + py_am_only * am_scale
    if rnnt_type == "regular":
        px = jnp.concatenate([px, jnp.full((b, s, 1), -jnp.inf, px.dtype)], axis=2)
    return px, py, boundary


def get_rnnt_logprobs(lm: ArrayLike, am: ArrayLike, symbols: ArrayLike, termination_symbol: int,
                      rnnt_type: str = "regular", boundary: ArrayLike | None = None
                      ) -> Tuple[jax.Array, jax.Array]:
    """k2's ``(px, py)`` of the additive joiner (see [`duoloss.torch.get_rnnt_logprobs`][duoloss.torch.get_rnnt_logprobs]).

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C)
        >>> px, py = d.get_rnnt_logprobs(lm, am, np.array([[1]]), termination_symbol=0)
        >>> tuple(px.shape), tuple(py.shape)  # (B, S, T + 1) and (B, S + 1, T) for 'regular'
        ((1, 1, 3), (1, 2, 2))
        >>> round(float(py[0, 0, 0]), 4)  # log(1/3): every class equally likely
        -1.0986
    """
    px, py, boundary = _simple_logprobs("get_rnnt_logprobs", lm, am, symbols,
                                        termination_symbol, rnnt_type, boundary)
    return _finish_px(px, py, boundary, rnnt_type, 0.0), py


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _losses_and_occupation(static, px, py, boundary):
    losses, gx, gy = _call(TRANSDUCER_KERNEL, static, (True, True, False), (px, py, boundary))
    return losses, -gx, -gy


def _occ_fwd(static, px, py, boundary):
    out = _losses_and_occupation(static, px, py, boundary)
    return out, (out[1], out[2])


def _occ_bwd(static, res, cts):
    # d loss_b / d px = -occupation; the occupations themselves are constants (as in k2)
    ox, oy = res
    return scale_by_cotangent(-ox, cts[0], 0), scale_by_cotangent(-oy, cts[0], 0), None


_losses_and_occupation.defvjp(_occ_fwd, _occ_bwd)


def _recursion(px, py, boundary, rnnt_type, return_grad, device=False):
    kind = "regular" if rnnt_type == "regular" else "modified"
    if device:  # the recursion in XLA (duoloss.jax._xla), no callback
        if not return_grad:
            return _device_transducer_losses(px, py, boundary, kind), None
        losses, vjp = jax.vjp(lambda a, b: _device_transducer_losses(a, b, boundary, kind),
                              px, py)
        gx, gy = vjp(jnp.ones_like(losses))
        return losses, (jax.lax.stop_gradient(-gx), jax.lax.stop_gradient(-gy))
    if not return_grad:
        return apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), rnnt_type=kind), None
    # One callback for the losses and their gradients (= minus k2's occupations).
    losses, ox, oy = _losses_and_occupation((("rnnt_type", kind),), px, py, boundary)
    return losses, (jax.lax.stop_gradient(ox), jax.lax.stop_gradient(oy))


def _lattice_loss(fn, px, py, boundary, rnnt_type, delay_penalty, reduction, return_grad,
                  device=False):
    """The reduced loss of the lattice ``(px, py)`` (``(loss, (px_grad, py_grad))``
    with ``return_grad``), shared by the simple, smoothed and pruned losses."""
    check_bool(fn, "return_grad", return_grad, numpy_bool=False)
    px = _finish_px(px, py, boundary, rnnt_type, float(delay_penalty))
    losses, grads = _recursion(px, py, boundary, rnnt_type, return_grad, device)
    loss = reduce_losses(losses, reduction, k2_mean=True)
    return (loss, grads) if return_grad else loss


def rnnt_loss_simple(lm: ArrayLike, am: ArrayLike, symbols: ArrayLike, termination_symbol: int,
                     boundary: ArrayLike | None = None, rnnt_type: str = "regular",
                     delay_penalty: float = 0.0, reduction: Optional[str] = "mean",
                     return_grad: bool = False, *, impl: str = "auto"
                     ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """RNN-T loss with the additive joiner; see [`duoloss.torch.rnnt_loss_simple`][duoloss.torch.rnnt_loss_simple]
    (same arguments, shapes and numbers).

    ``return_grad=True`` gives ``(loss, (px_grad, py_grad))`` from the same single
    host callback; the occupations are constants for differentiation (as in k2).
    ``impl``: ``'auto'`` | ``'host'`` | ``'device'`` (the recursion in XLA, no
    callback), as in [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C): a uniform joiner
        >>> symbols, boundary = np.array([[1]]), np.array([[0, 0, 1, 2]])  # S=1 symbol, T=2 frames
        >>> loss = d.rnnt_loss_simple(lm, am, symbols, termination_symbol=2, boundary=boundary)
        >>> round(float(loss), 4)  # the RNN-T loss of uniform logits: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_simple"
    check_impl(fn, impl)
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary, delay_penalty, reduction)
    return _lattice_loss(fn, px, py, boundary, rnnt_type, delay_penalty, reduction, return_grad,
                         use_device(fn, impl, lm, am))


def rnnt_loss_smoothed(lm: ArrayLike, am: ArrayLike, symbols: ArrayLike, termination_symbol: int,
                       lm_only_scale: float = 0.1, am_only_scale: float = 0.1,
                       boundary: ArrayLike | None = None, rnnt_type: str = "regular",
                       delay_penalty: float = 0.0, reduction: Optional[str] = "mean",
                       return_grad: bool = False, *, impl: str = "auto"
                       ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """k2's smoothed simple loss; see [`duoloss.torch.rnnt_loss_smoothed`][duoloss.torch.rnnt_loss_smoothed].

    ``impl``: ``'auto'`` | ``'host'`` | ``'device'``, as in [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C): a uniform joiner
        >>> symbols, boundary = np.array([[1]]), np.array([[0, 0, 1, 2]])  # S=1 symbol, T=2 frames
        >>> loss = d.rnnt_loss_smoothed(lm, am, symbols, 2, lm_only_scale=0.0, am_only_scale=0.0,
        ...                           boundary=boundary)
        >>> round(float(loss), 4)  # no smoothing: the RNN-T loss of uniform logits: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_smoothed"
    check_impl(fn, impl)
    px, py, boundary = _simple_logprobs(fn, lm, am, symbols, termination_symbol, rnnt_type,
                                        boundary, delay_penalty, reduction,
                                        (lm_only_scale, am_only_scale))
    return _lattice_loss(fn, px, py, boundary, rnnt_type, delay_penalty, reduction, return_grad,
                         use_device(fn, impl, lm, am))


def _pruned_logprobs(fn, logits, symbols, ranges, termination_symbol, boundary, rnnt_type,
                     delay_penalty=0.0, reduction="mean"):
    logits, symbols, ranges = (_array(fn, a, x) for a, x in (
        ("logits", logits), ("symbols", symbols), ("ranges", ranges)))
    b, s, t, r, c = _k.check_pruned_static(fn, logits.shape, logits.dtype, symbols.shape,
                                           symbols.dtype, ranges.shape, ranges.dtype)
    _k.check_common_scalars(fn, termination_symbol, c, rnnt_type, delay_penalty, reduction)
    if is_concrete(symbols, ranges):
        _k.check_symbols_values(fn, _host(symbols), c)
        _k.check_ranges_values(fn, _host(ranges), s)
    boundary = _boundary(fn, boundary, b, s, t, rnnt_type)
    sym = jnp.concatenate([symbols, jnp.full((b, 1), termination_symbol, symbols.dtype)], 1)
    pruned_sym = jnp.take_along_axis(sym[:, None, :], ranges, axis=2, mode="clip")  # (B,T,r)
    log_z = jax.nn.logsumexp(logits, axis=3)
    px_r = jnp.take_along_axis(logits, pruned_sym[..., None], axis=3, mode="clip")[..., 0]
    px_r = px_r - log_z
    py_r = logits[..., termination_symbol] - log_z
    bi = jnp.arange(b)[:, None, None]
    ti = jnp.arange(t)[None, :, None]
    ninf = jnp.full((b, t, s + 1), -jnp.inf, logits.dtype)
    px = jnp.swapaxes(ninf.at[bi, ti, ranges].set(px_r, mode="drop")[:, :, :s], 1, 2)
    py = jnp.swapaxes(ninf.at[bi, ti, ranges].set(py_r, mode="drop"), 1, 2)
    if rnnt_type == "regular":
        px = jnp.concatenate([px, jnp.full((b, s, 1), -jnp.inf, px.dtype)], axis=2)
    return px, py, boundary


def get_rnnt_logprobs_pruned(logits: ArrayLike, symbols: ArrayLike, ranges: ArrayLike,
                             termination_symbol: int, boundary: ArrayLike | None = None,
                             rnnt_type: str = "regular") -> Tuple[jax.Array, jax.Array]:
    """k2's ``(px, py)`` from pruned logits (see [`duoloss.torch.get_rnnt_logprobs_pruned`][duoloss.torch.get_rnnt_logprobs_pruned]).

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C), S=1
        >>> symbols, boundary = np.array([[1]]), np.array([[0, 0, 1, 2]])
        >>> ranges = np.array([[[0, 1], [0, 1]]])  # s_range = S + 1: nothing pruned
        >>> am_p, lm_p = d.do_rnnt_pruning(am, lm, ranges)
        >>> px, py = d.get_rnnt_logprobs_pruned(am_p + lm_p, symbols, ranges, 2, boundary)
        >>> tuple(px.shape), tuple(py.shape)  # k2's lattice: (B, S, T + 1), (B, S + 1, T)
        ((1, 1, 3), (1, 2, 2))
    """
    px, py, boundary = _pruned_logprobs("get_rnnt_logprobs_pruned", logits, symbols, ranges,
                                        termination_symbol, boundary, rnnt_type)
    return _finish_px(px, py, boundary, rnnt_type, 0.0), py


def rnnt_loss_pruned(logits: ArrayLike, symbols: ArrayLike, ranges: ArrayLike,
                     termination_symbol: int, boundary: ArrayLike | None = None,
                     rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: Optional[str] = "mean", *, impl: str = "auto") -> jax.Array:
    """RNN-T loss on the kept lattice; see [`duoloss.torch.rnnt_loss_pruned`][duoloss.torch.rnnt_loss_pruned].

    ``impl``: ``'auto'`` | ``'host'`` | ``'device'``, as in [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C), S=1
        >>> symbols, boundary = np.array([[1]]), np.array([[0, 0, 1, 2]])
        >>> ranges = np.array([[[0, 1], [0, 1]]])  # s_range = S + 1: nothing pruned
        >>> am_p, lm_p = d.do_rnnt_pruning(am, lm, ranges)
        >>> loss = d.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 2, boundary)
        >>> round(float(loss), 4)  # = the full RNN-T loss of uniform logits, log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_pruned"
    check_impl(fn, impl)
    px, py, boundary = _pruned_logprobs(fn, logits, symbols, ranges, termination_symbol,
                                        boundary, rnnt_type, delay_penalty, reduction)
    return _lattice_loss(fn, px, py, boundary, rnnt_type, delay_penalty, reduction, False,
                         use_device(fn, impl, logits))


def _lower_bound_reversed(x):
    return jax.lax.cummin(x, axis=x.ndim - 1, reverse=True)


def get_rnnt_prune_ranges(px_grad: ArrayLike, py_grad: ArrayLike, boundary: ArrayLike, s_range: int
                          ) -> jax.Array:
    """k2's pruning ranges ``(B, T, s_range)``; see [`duoloss.torch.get_rnnt_prune_ranges`][duoloss.torch.get_rnnt_prune_ranges].

    NB: ``s_range`` is static.  Under ``jit`` (traced ``boundary``) k2's
    regular minimum ``(s_end - 1) // t_end + 2`` cannot be read and is not
    applied; pass a large enough ``s_range``.  The result is int32 unless
    ``jax_enable_x64`` is on.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 4, 3)), np.zeros((1, 3, 3))  # (B, T, C), (B, S + 1, C)
        >>> symbols, boundary = np.array([[1, 2]]), np.array([[0, 0, 2, 4]])
        >>> _, (px_grad, py_grad) = d.rnnt_loss_simple(lm, am, symbols, 0, boundary, return_grad=True)
        >>> ranges = d.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=2)
        >>> tuple(ranges.shape), bool((ranges[..., 1] == ranges[..., 0] + 1).all())  # (B, T, s_range), consecutive
        ((1, 4, 2), True)
    """
    fn = "get_rnnt_prune_ranges"
    px_grad, py_grad, boundary = (_array(fn, a, x) for a, x in (
        ("px_grad", px_grad), ("py_grad", py_grad), ("boundary", boundary)))
    b, s, t, regular = _k.check_prune_ranges_static(fn, px_grad.shape, px_grad.dtype,
                                                    py_grad.shape, py_grad.dtype,
                                                    boundary.shape, boundary.dtype, s_range)
    host_b = _host(boundary) if is_concrete(boundary) else None
    if host_b is not None:
        _k.check_boundary_values(fn, host_b, s, t, "regular" if regular else "modified")
    s_range = _k.prune_s_range(fn, int(s_range), s, regular, host_b)
    n_win = s + 1 - s_range + 1
    blk = py_grad[:, 0:n_win, :]
    for k in range(1, s_range):
        blk = blk + py_grad[:, k:k + n_win, :]
    px_pad = jnp.concatenate([jnp.zeros((b, 1, px_grad.shape[2]), px_grad.dtype), px_grad], 1)
    final = blk - px_pad[:, :n_win, :t]
    s_begin = jnp.argmax(final, axis=1)
    idt = s_begin.dtype
    frames = jnp.arange(t, dtype=idt)[None, :]
    mask = frames < (boundary[:, 3:4].astype(idt) - 1)
    pad = jnp.maximum(boundary[:, 2:3].astype(idt) - s_range + 1, 0)
    s_begin = jnp.where(mask, s_begin, pad)
    step = (s_range if regular else 2) - 1
    s_begin = _lower_bound_reversed(s_begin)
    shifted = jnp.maximum(_lower_bound_reversed(step * frames - s_begin), 0)
    s_begin = step * frames - shifted
    return s_begin[:, :, None] + jnp.arange(s_range, dtype=idt)


def do_rnnt_pruning(am: ArrayLike, lm: ArrayLike, ranges: ArrayLike) -> Tuple[jax.Array, jax.Array]:
    """``(am_pruned, lm_pruned)`` ``(B, T, s_range, D)``; see
    [`duoloss.torch.do_rnnt_pruning`][duoloss.torch.do_rnnt_pruning].

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 4, 3)), np.zeros((1, 3, 3))  # (B, T, C), (B, S + 1, C)
        >>> ranges = np.array([[[0, 1], [0, 1], [1, 2], [1, 2]]])  # (B, T, s_range)
        >>> am_pruned, lm_pruned = d.do_rnnt_pruning(am, lm, ranges)
        >>> tuple(am_pruned.shape), tuple(lm_pruned.shape)  # both (B, T, s_range, C): add, then joiner
        ((1, 4, 2, 3), (1, 4, 2, 3))
    """
    fn = "do_rnnt_pruning"
    am, lm, ranges = (_array(fn, a, x) for a, x in (("am", am), ("lm", lm),
                                                     ("ranges", ranges)))
    _k.check_pruning_static(fn, am.shape, lm.shape, ranges.shape, ranges.dtype)
    if is_concrete(ranges):
        _k.check_ranges_values(fn, _host(ranges), int(lm.shape[1]) - 1)
    b, t, r = ranges.shape
    am_pruned = jnp.broadcast_to(am[:, :, None, :], (b, t, r, am.shape[2]))
    lm_pruned = lm[jnp.arange(b)[:, None, None], ranges]
    return am_pruned, lm_pruned
