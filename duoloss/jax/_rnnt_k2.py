"""k2's simple and pruned RNN-T losses for JAX, with the names, arguments and numbers
of `duoloss.torch._rnnt_k2` (itself a drop-in for k2's functions).

``(px, py)``, the pruning ranges and the pruned joiner inputs come from
`duoloss._xp.k2`, the same code as the torch frontend's, run on
``jax.numpy`` (differentiable; this module keeps only argument checks and the
``custom_vjp`` wiring); the recursion runs in duoloss's transducer core
through one host callback (``jit``, ``grad``, ``vmap`` and ``shard_map`` work
as for every duoloss loss).  Arguments that set output
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

from duoloss._xp import k2 as _maths
from duoloss._xp import JaxOps
from duoloss.core.losses import rnnt_k2 as _k
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL

from ._adapter import _call, apply_kernel, scale_by_cotangent
from ._pallas import backend_for, check_impl, is_pallas
from ._pallas.transducer import transducer_losses as _pallas_transducer_losses
from ._xla.transducer import transducer_losses as _device_transducer_losses
from ._args import as_array, check_bool, is_concrete, reduce_losses

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


_xp = JaxOps()  # the array vocabulary of duoloss._xp, for jax.numpy


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
    return _maths.finish_px(_xp, px, py, boundary, rnnt_type, delay_penalty)


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
    px, py = _maths.simple_logprobs(_xp, lm, am, symbols, termination_symbol, rnnt_type, scales)
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


def get_rnnt_logprobs_smoothed(lm: ArrayLike, am: ArrayLike, symbols: ArrayLike,
                               termination_symbol: int, lm_only_scale: float = 0.1,
                               am_only_scale: float = 0.1, boundary: ArrayLike | None = None,
                               rnnt_type: str = "regular") -> Tuple[jax.Array, jax.Array]:
    """k2's smoothed ``(px, py)`` (see [`duoloss.torch.get_rnnt_logprobs_smoothed`][duoloss.torch.get_rnnt_logprobs_smoothed]).

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> am, lm = np.zeros((1, 2, 3)), np.zeros((1, 2, 3))  # (B, T, C), (B, S + 1, C)
        >>> px, py = d.get_rnnt_logprobs_smoothed(lm, am, np.array([[1]]), 0)
        >>> tuple(px.shape), tuple(py.shape)  # (B, S, T + 1) and (B, S + 1, T) for 'regular'
        ((1, 1, 3), (1, 2, 2))
        >>> round(float(py[0, 0, 0]), 4)  # uniform: joint, LM-only and AM-only all log(1/3)
        -1.0986
    """
    px, py, boundary = _simple_logprobs("get_rnnt_logprobs_smoothed", lm, am, symbols,
                                        termination_symbol, rnnt_type, boundary,
                                        scales=(lm_only_scale, am_only_scale))
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


def _recursion(px, py, boundary, rnnt_type, return_grad, path="host"):
    kind = "regular" if rnnt_type == "regular" else "modified"
    if path != "host":  # on the device (duoloss.jax._pallas, ._xla), no callback
        if is_pallas(path):
            def losses_of(a, b):
                return _pallas_transducer_losses(a, b, boundary, kind, backend=path)
        else:
            def losses_of(a, b):
                return _device_transducer_losses(a, b, boundary, kind)
        if not return_grad:
            return losses_of(px, py), None
        losses, vjp = jax.vjp(losses_of, px, py)
        gx, gy = vjp(jnp.ones_like(losses))
        return losses, (jax.lax.stop_gradient(-gx), jax.lax.stop_gradient(-gy))
    if not return_grad:
        return apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), rnnt_type=kind), None
    # One callback for the losses and their gradients (= minus k2's occupations).
    losses, ox, oy = _losses_and_occupation((("rnnt_type", kind),), px, py, boundary)
    return losses, (jax.lax.stop_gradient(ox), jax.lax.stop_gradient(oy))


def _lattice_loss(fn, px, py, boundary, rnnt_type, delay_penalty, reduction, return_grad,
                  path="host"):
    """The reduced loss of the lattice ``(px, py)`` (``(loss, (px_grad, py_grad))``
    with ``return_grad``), shared by the simple, smoothed and pruned losses."""
    check_bool(fn, "return_grad", return_grad, numpy_bool=False)
    px = _finish_px(px, py, boundary, rnnt_type, float(delay_penalty))
    losses, grads = _recursion(px, py, boundary, rnnt_type, return_grad, path)
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
    ``impl``: ``'auto'`` | ``'host'`` | ``'device'`` | ``'pallas'`` | ``'xla'`` (the
    recursion on the device, no callback), as in [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

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
                         backend_for(fn, impl, lm, am, dtype=px.dtype))


def rnnt_loss_smoothed(lm: ArrayLike, am: ArrayLike, symbols: ArrayLike, termination_symbol: int,
                       lm_only_scale: float = 0.1, am_only_scale: float = 0.1,
                       boundary: ArrayLike | None = None, rnnt_type: str = "regular",
                       delay_penalty: float = 0.0, reduction: Optional[str] = "mean",
                       return_grad: bool = False, *, impl: str = "auto"
                       ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """k2's smoothed simple loss; see [`duoloss.torch.rnnt_loss_smoothed`][duoloss.torch.rnnt_loss_smoothed].

    ``impl``: ``'auto'`` | ``'host'`` | ``'device'`` | ``'pallas'`` | ``'xla'``, as in
    [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

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
                         backend_for(fn, impl, lm, am, dtype=px.dtype))


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
    px, py = _maths.pruned_logprobs(_xp, logits, symbols, ranges, termination_symbol, rnnt_type)
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

    ``impl``: ``'auto'`` | ``'host'`` | ``'device'`` | ``'pallas'`` | ``'xla'``, as in
    [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss].

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
                         backend_for(fn, impl, logits, dtype=px.dtype))


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
    return _maths.prune_ranges(_xp, px_grad, py_grad, boundary, s_range, regular)


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
    return _maths.do_pruning(_xp, am, lm, ranges)
