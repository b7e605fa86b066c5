"""The full RNN-T loss from the joiner, in bounded memory, for JAX: ``rnnt_loss_from_joiner``.

The joiner runs on chunks of frames inside a ``lax.scan`` whose body is
``jax.checkpoint``-ed: the forward keeps of each chunk only the two lattice values
per cell (`duoloss.jax._rnnt._lattice`), the transducer recursion runs once on
the whole lattice, and the backward recomputes one chunk per scan step, so the
``(N, T, U + 1, V)`` joiner output and its gradient never exist at once.  The joiner
is any traceable function; gradients reach whatever it closes over (e.g. the
``params`` of a flax module applied inside it) like any JAX code.
"""
from __future__ import annotations

from typing import Callable, Literal, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from duoloss.core.losses.joiner import check_chunk_size, check_joiner_output
from duoloss.core.losses.transducer import (TRANSDUCER_KERNEL, check_rnnt_args,
                                            check_rnnt_options)

from ._adapter import apply_kernel
from ._args import as_array, as_int_array, is_concrete, reduce_losses
from ._rnnt import _clamp_grad, _lattice

__all__ = ["rnnt_loss_from_joiner"]

#: The default chunk holds about this many joiner outputs (64 MiB of float32).
CHUNK_ELEMENTS = 1 << 24


def _joined(fn, joiner, enc, pred, n_cls=None, frames=None):
    out = joiner(enc[:, :, None], pred[:, None])
    shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
    check_joiner_output(fn, shape, (enc.shape[0], enc.shape[1], pred.shape[1]), n_cls, "array",
                        frames)
    return out


def _boundary(targets, il, tl, t_max, u_max, n_cls, blank):
    tg = targets.astype(jnp.int32)
    in_len = jnp.arange(u_max)[None, :] < tl[:, None]
    bad = in_len & ((tg < 0) | (tg >= n_cls) | (tg == blank))
    valid = (il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= u_max) & ~bad.any(axis=1)
    zero = jnp.zeros_like(il)
    return jnp.stack([zero, zero, jnp.where(valid, tl, -1), jnp.where(valid, il, -1)], axis=1)


def rnnt_loss_from_joiner(joiner: Callable, encoder_out: ArrayLike, predictor_out: ArrayLike,
                          targets: ArrayLike, logit_lengths: ArrayLike, target_lengths: ArrayLike,
                          *, blank: int = -1, clamp: float = -1,
                          reduction: Literal["none", "sum", "mean"] = "mean",
                          fused_log_softmax: bool = True, fastemit_lambda: float = 0.0,
                          delay_penalty: float = 0.0, chunk_size: Optional[int] = None
                          ) -> jax.Array:
    r"""The RNN-T loss of ``joiner(encoder_out[:, :, None], predictor_out[:, None])``
    without holding that ``(N, T, U + 1, V)`` output or its gradient; same
    arguments and numbers as [`duoloss.torch.rnnt_loss_from_joiner`][duoloss.torch.rnnt_loss_from_joiner].

    Equal to [`duoloss.jax.rnnt_loss`][duoloss.jax.rnnt_loss] on the whole joiner output, in value and
    gradient.  The frames go through the joiner in chunks of ``chunk_size``: a
    ``lax.scan`` over the chunks with a ``jax.checkpoint``-ed body keeps only the
    two lattice values per cell, and ``grad`` recomputes one chunk at a time.

    Args:
      joiner: a traceable function mapping ``(N, t, 1, D)`` and ``(N, 1, U + 1, D')``
        to logits ``(N, t, U + 1, V)`` by broadcasting.  Parameters are whatever
        it closes over: differentiate with respect to them by closing over the
        traced value, e.g. ``jax.grad(lambda p: rnnt_loss_from_joiner(lambda e, q:
        model.apply(p, e, q), enc, pred, ...))(params)``.
      encoder_out: ``(N, T, D)``.
      predictor_out: ``(N, U + 1, D')``.
      targets: ``(N, U)`` integer targets, as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      logit_lengths: ``(N,)`` frame counts, as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      target_lengths: ``(N,)`` target lengths, as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      blank: the blank index (``-1``: the last class), as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      clamp: gradient clamp (``< 0``: none), as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      fused_log_softmax: as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      fastemit_lambda: FastEmit regularisation, as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      delay_penalty: as in [`rnnt_loss`][duoloss.jax.rnnt_loss].
      chunk_size: frames per chunk (static); ``None``: about ``2**24`` joiner
        outputs per chunk.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    NB: works under ``jit``, ``grad`` and ``value_and_grad``; the joiner is traced
    (not run) once more by ``jax.eval_shape`` to learn ``V``.

    Examples:
        >>> import jax.numpy as jnp
        >>> import duoloss.jax as d
        >>> enc, pred = jnp.ones((1, 2, 3)), jnp.ones((1, 2, 3))  # (N, T, D), (N, U + 1, D)
        >>> joiner = lambda e, p: 0 * (e + p)  # uniform logits over V = D = 3 classes
        >>> loss = d.rnnt_loss_from_joiner(joiner, enc, pred, jnp.array([[1]]), jnp.array([2]), jnp.array([1]), blank=0, chunk_size=1)
        >>> round(float(loss), 4)  # 2 alignments of 3 moves at 1/3 each: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_from_joiner"
    check_rnnt_options(fn, reduction, clamp, fused_log_softmax, fastemit_lambda, delay_penalty)
    if not callable(joiner):
        raise TypeError(f"{fn}: argument 'joiner' must be callable, got {type(joiner).__name__}")
    chunk_size = check_chunk_size(fn, chunk_size)
    enc = as_array(fn, "encoder_out", encoder_out)
    pred = as_array(fn, "predictor_out", predictor_out)
    targets = as_array(fn, "targets", targets)
    if enc.ndim != 3:
        raise ValueError(f"{fn}: argument 'encoder_out' must be an (N, T, D)-array, "
                         f"got shape {tuple(enc.shape)}")
    if pred.ndim != 3 or pred.shape[0] != enc.shape[0]:
        raise ValueError(f"{fn}: argument 'predictor_out' must be an (N, U + 1, D')-array "
                         f"with N = {enc.shape[0]}, got shape {tuple(pred.shape)}")
    n, t_max, _ = enc.shape
    u1 = pred.shape[1]
    probe = jax.eval_shape(lambda e, p: _joined(fn, joiner, e, p), enc[:, :1], pred)
    shape_only = jax.ShapeDtypeStruct((n, t_max, u1, probe.shape[3]), probe.dtype)
    il = as_int_array(fn, "logit_lengths", logit_lengths)
    tl = as_int_array(fn, "target_lengths", target_lengths)
    blank = check_rnnt_args(fn, shape_only, targets, il, tl, blank,
                            concrete=is_concrete(targets, il, tl))
    il, tl = il.reshape(-1), tl.reshape(-1)
    n_cls = probe.shape[3]
    if chunk_size is None:
        chunk_size = max(1, CHUNK_ELEMENTS // max(1, n * u1 * n_cls))
    chunk_size = min(chunk_size, max(t_max, 1))
    bound = 0.0
    if clamp > 0:
        bound = float(clamp) / max(n, 1) if reduction == "mean" else float(clamp)
    fused, lam = bool(fused_log_softmax), float(fastemit_lambda)
    il = il.astype(jnp.int32)
    tl = tl.astype(jnp.int32)

    def chunk(enc_c, t0):
        c = enc_c.shape[1]
        x = _joined(fn, joiner, enc_c, pred, n_cls)   # every chunk's V checked (at trace time)
        if bound > 0:
            x = _clamp_grad(x, bound)
        px, py, _ = _lattice(x, targets, jnp.clip(il - t0, 0, c), tl, blank, fused, lam, 0.0)
        return px[..., :c], py

    chunk = jax.checkpoint(chunk)
    n_full = t_max // chunk_size
    pxs, pys = [], []
    if n_full:
        head = enc[:, :n_full * chunk_size]
        head = jnp.moveaxis(head.reshape(n, n_full, chunk_size, enc.shape[2]), 1, 0)
        starts = jnp.arange(n_full, dtype=jnp.int32) * chunk_size

        def step(carry, xs):
            return carry, chunk(*xs)

        _, (px, py) = jax.lax.scan(step, None, (head, starts))
        # (chunks, N, U(+1), c) -> (N, U(+1), chunks * c)
        pxs.append(jnp.moveaxis(px, 0, 2).reshape(n, u1 - 1, n_full * chunk_size))
        pys.append(jnp.moveaxis(py, 0, 2).reshape(n, u1, n_full * chunk_size))
    if t_max > n_full * chunk_size:
        px, py = chunk(enc[:, n_full * chunk_size:], jnp.int32(n_full * chunk_size))
        pxs.append(px)
        pys.append(py)
    if pxs:
        px = jnp.concatenate(pxs, axis=2)
        py = jnp.concatenate(pys, axis=2)
    else:
        dt = jnp.float32 if jnp.dtype(probe.dtype).itemsize < 4 else probe.dtype
        px = jnp.zeros((n, u1 - 1, 0), dt)
        py = jnp.zeros((n, u1, 0), dt)
    px = jnp.pad(px, ((0, 0), (0, 0), (0, 1)), constant_values=-jnp.inf)
    if delay_penalty > 0:
        frame = jnp.arange(t_max + 1)
        offset = (il.astype(px.dtype) - 1) / 2
        px = px + jnp.asarray(delay_penalty, px.dtype) * (
            offset[:, None, None] - frame.astype(px.dtype)[None, None])
    boundary = _boundary(targets, il, tl, t_max, u1 - 1, n_cls, blank)
    losses = apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), rnnt_type="regular")
    if fastemit_lambda > 0:
        losses = losses + lam * jax.lax.stop_gradient(losses)
    return reduce_losses(losses, reduction)
