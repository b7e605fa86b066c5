"""RNN-T for JAX: ``rnnt_loss`` and ``rnnt_align``.

The normaliser (``logsumexp``) and the gathers of the target and blank
log-probabilities are jnp code on the input's device, with one fused custom
backward (softmax times the per-cell cotangent plus the two one-hot terms); one
``pure_callback`` carries only the two lattices ``(N, U, T + 1)`` and
``(N, U + 1, T)`` to the core recursion (`duoloss.core.losses.transducer`).
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core.losses.transducer import (TRANSDUCER_KERNEL, check_rnnt_args, check_rnnt_options,
                                      rnnt_alignment, transducer_viterbi)

from ._adapter import apply_kernel
from ._args import (as_array, as_int_array, check_bool, index_dtype, is_concrete, is_half,
                    reduce_losses)
from ._callback import pure_callback
from ._pallas import backend_for, is_pallas
from ._pallas.transducer import transducer_losses as _pallas_transducer_losses
from ._xla import check_impl, use_device
from ._xla.transducer import transducer_losses as _device_transducer_losses
from ._xla.align import rnnt_tokens, transducer_viterbi_regular

__all__ = ["rnnt_loss", "rnnt_align"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _clamp_grad(x, bound):
    return x


def _clamp_fwd(x, bound):
    return x, None


def _clamp_bwd(bound, _, g):
    return (jnp.clip(g, -bound, bound),)


_clamp_grad.defvjp(_clamp_fwd, _clamp_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _scale_grad(x, factor):
    return x


def _scale_fwd(x, factor):
    return x, None


def _scale_bwd(factor, _, g):
    return (g * jnp.asarray(factor, g.dtype),)


_scale_grad.defvjp(_scale_fwd, _scale_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _log_probs_gather(x, idx, blank):
    """``log_softmax`` over ``V`` and the two lattice gathers, with one fused backward.

    ``x`` ``(N, T, U + 1, V)``, ``idx`` ``(N, U)`` target labels already clipped
    to ``[0, V)``.  Returns ``px = logp[:, :, :U, idx]`` ``(N, T, U)`` and
    ``py = logp[..., blank]`` ``(N, T, U + 1)`` with ``logp = (x - m) - ls``
    (`_normaliser`);
    the full-size ``logp`` is never stored.

    Backward: with ``c = -(g_px + g_py)`` per cell, ``d x = softmax(x) * c +
    onehot(idx) * g_px + onehot(blank) * g_py``, written as one elementwise
    expression over ``V`` that XLA fuses into a single pass (no full-size zero
    scatter for the gathers).  The softmax term is exactly 0 where ``c = 0``
    (padded cells), so a NaN there stays out of the gradient.
    """
    return _log_probs_gather_fwd(x, idx, blank)[0]


def _logsumexp(x):
    """``logsumexp`` over the last axis: ``m + ls`` of `_normaliser`."""
    m, ls = _normaliser(x)
    return m + ls


def _normaliser(x):
    """``(m, ls)`` per row over the last axis, ``log_softmax(x) = (x - m) - ls``.

    In one pass over ``x`` when every row
    allows it: the *unshifted* exponentials (clamped above) summed, as the
    core's joiner kernels do (`duoloss.core.losses.joiner._forward_block`):
    exact to the dtype's rounding when each row's normaliser lies in
    ``[-16, 80]`` (float32; ``[-500, 690]`` for float64).  Any other row (NaN,
    ``inf``, very large or very negative logits) takes ``jax.nn.logsumexp``
    (a max pass, then the shifted sum), computed only when there is one; a
    row's value never depends on the other rows.  Fast rows: ``m = 0``, ``ls``
    their ``logsumexp``.  Other rows: ``m`` the row's max (0 when it is not
    finite, as ``jax.nn.logsumexp``), ``ls = log sum exp(x - m)``, kept apart
    so that ``(x - m) - ls`` keeps every digit of ``ls`` when ``|m|`` is
    large: ``x - (m + ls)`` rounded lost them (three tied logits at 3e5 in
    float32 gave -1.09375 for -log 3, and 0 at 1e8)."""
    if x.dtype == jnp.float64:
        clamp, lo, hi = 700.0, -500.0, 690.0
    else:
        clamp, lo, hi = 88.0, -16.0, 80.0
    fast = jnp.log(jnp.exp(jnp.minimum(x, clamp)).sum(axis=-1))
    ok = (fast >= lo) & (fast <= hi)

    def shifted():
        m = jnp.max(x, axis=-1)
        m = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
        ls = jnp.log(jnp.exp(x - m[..., None]).sum(axis=-1))
        return jnp.where(ok, jnp.zeros_like(m), m), jnp.where(ok, fast, ls)

    return jax.lax.cond(jnp.all(ok), lambda: (jnp.zeros_like(fast), fast), shifted)


def _log_probs_gather_fwd(x, idx, blank):
    u_max = x.shape[2] - 1
    m, ls = _normaliser(x)  # the max subtracted first: (x - m) - ls
    px = jnp.take_along_axis(x[:, :, :u_max], idx[:, None, :, None], axis=3)[..., 0]
    # a row of -inf logits only (ls = -inf, nothing else gives it): no move leaves the
    # cell, every log-probability -inf (not NaN), as the core's joiner kernels
    dead = ls == -jnp.inf
    px = jnp.where(dead[:, :, :u_max], -jnp.inf, (px - m[:, :, :u_max]) - ls[:, :, :u_max])
    py = jnp.where(dead, -jnp.inf, (x[..., blank] - m) - ls)
    return (px, py), (x, idx, m, ls)


def _log_probs_gather_bwd(blank, res, g):
    x, idx, m, ls = res
    gpx, gpy = g
    n, t_max, u1, n_cls = x.shape
    gpx = jnp.pad(gpx, ((0, 0), (0, 0), (0, 1)))                    # (N, T, U + 1)
    lab = jnp.pad(idx, ((0, 0), (0, 1)), constant_values=-1)[:, None, :, None]
    c = -(gpx + gpy)[..., None]
    v = jax.lax.broadcasted_iota(jnp.int32, (1, 1, 1, n_cls), 3)
    live = (c != 0) & (ls != -jnp.inf)[..., None]     # -inf rows: a zero softmax term
    dx = jnp.where(live, jnp.exp((x - m[..., None]) - ls[..., None]) * c, 0.0)
    dx = dx + jnp.where(v == lab, gpx[..., None], 0.0) + jnp.where(v == blank, gpy[..., None], 0.0)
    return dx.astype(x.dtype), None


_log_probs_gather.defvjp(_log_probs_gather_fwd, _log_probs_gather_bwd)


def _validate(fn, logits, targets, logit_lengths, target_lengths, blank):
    logits = as_array(fn, "logits", logits)
    targets = as_array(fn, "targets", targets)
    il = as_int_array(fn, "logit_lengths", logit_lengths)
    tl = as_int_array(fn, "target_lengths", target_lengths)
    concrete = is_concrete(targets, il, tl)
    blank = check_rnnt_args(fn, logits, targets, il, tl, blank, concrete=concrete)
    return logits, targets, blank, il.reshape(-1), tl.reshape(-1)


def _lattice(logits, targets, il, tl, blank, fused_log_softmax, fastemit_lambda=0.0,
             delay_penalty=0.0):
    """``(px (N, U, T + 1), py (N, U + 1, T), boundary (N, 4))`` in the core's layout."""
    n, t_max, u1, n_cls = logits.shape
    u_max = u1 - 1
    if is_half(logits.dtype):
        logits = logits.astype(jnp.float32)
    tg = targets.astype(jnp.int32)
    il = il.astype(jnp.int32)
    tl = tl.astype(jnp.int32)
    pos = jnp.arange(u_max)
    in_len = pos[None, :] < tl[:, None]
    bad_label = in_len & ((tg < 0) | (tg >= n_cls) | (tg == blank))
    valid = (il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= u_max) & ~bad_label.any(axis=1)
    idx = jnp.clip(tg, 0, n_cls - 1)
    if fused_log_softmax:
        px, py = _log_probs_gather(logits, idx, blank)
    else:
        px = jnp.take_along_axis(logits[:, :, :u_max], idx[:, None, :, None], axis=3)[..., 0]
        py = logits[..., blank]
    if fastemit_lambda > 0:
        px = _scale_grad(px, 1.0 + float(fastemit_lambda))
    px = jnp.swapaxes(px, 1, 2)
    py = jnp.swapaxes(py, 1, 2)
    px = jnp.pad(px, ((0, 0), (0, 0), (0, 1)), constant_values=-jnp.inf)
    frame = jnp.arange(t_max + 1)
    if delay_penalty > 0:
        offset = (il.astype(px.dtype) - 1) / 2
        px = px + jnp.asarray(delay_penalty, px.dtype) * (
            offset[:, None, None] - frame.astype(px.dtype)[None, None])
    px = jnp.where(frame[None, None, :] < il[:, None, None], px, -jnp.inf)
    zero = jnp.zeros_like(il)
    boundary = jnp.stack([zero, zero, jnp.where(valid, tl, -1), jnp.where(valid, il, -1)],
                         axis=1)
    return px, py, boundary


def rnnt_loss(logits: ArrayLike, targets: ArrayLike, logit_lengths: ArrayLike,
              target_lengths: ArrayLike, blank: int = -1, clamp: float = -1,
              reduction: Literal["none", "sum", "mean"] = "mean", fused_log_softmax: bool = True, *,
              fastemit_lambda: float = 0.0, delay_penalty: float = 0.0, impl: str = "auto"
              ) -> jax.Array:
    r"""RNN Transducer loss (``torchaudio.functional.rnnt_loss``'s signature) for JAX.

    Same arguments, maths and numbers as [`duoloss.torch.rnnt_loss`][duoloss.torch.rnnt_loss] (both
    run the same core on the same lattices), as a differentiable JAX function
    that works under ``jit``, ``grad`` and ``vmap``.  ``N`` sequences, ``T``
    frames, ``U`` target positions, ``V`` classes:

    $$
    \text{loss}_b = -\log \sum_{\text{alignments of } y_b}
    \prod_{\text{moves}} \operatorname{softmax}(\text{logits}_{b,t,u})_k.
    $$

    Args:
      logits: ``(N, T, U + 1, V)`` joiner output (halves are upcast to float32).
      targets: ``(N, U)`` integer padded targets (never the blank).
      logit_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, U]``.
      blank: the blank class (``-1`` is ``V - 1``).
      clamp: if ``> 0``, clamp the gradient w.r.t. ``logits`` to
        ``[-clamp, clamp]`` (``clamp / N`` with ``'mean'``; see the torch docs).
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (batch mean, as torchaudio).
      fused_log_softmax: ``False`` when ``logits`` already are log-probabilities.
      fastemit_lambda: FastEmit (NeMo's semantics): label-emission gradients
        scaled by ``1 + fastemit_lambda``, reported loss ``(1 + lambda) * NLL``.
      delay_penalty: k2's delay penalty ``delay_penalty * ((T_b - 1) / 2 - t)``
        added to each label emission on frame ``t``.
      impl: ``'auto'`` (default: ``'device'`` when ``logits`` live on a GPU/TPU,
        else the host core), ``'device'`` (the lattice recursion on the device, no
        callback: the Pallas kernel on a CUDA GPU or a TPU, the XLA scan
        elsewhere), ``'pallas'`` (the Pallas kernel; interpreted on a CPU: slow,
        for tests), ``'xla'`` (the ``lax.scan`` recursion on any platform) or
        ``'host'`` (the numba core through one callback); see the Devices page.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    NB: shapes and dtypes are validated at trace time; label and length values
    whenever they are concrete.  Under ``jit`` an invalid value makes that
    sequence's loss and gradient NaN (never an out-of-bounds read).

    References:
      Graves, "Sequence Transduction with Recurrent Neural Networks",
      arXiv:1211.3711, 2012.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as dj
        >>> logits = np.zeros((1, 2, 2, 3), np.float32)  # (N, T, U + 1, V): uniform, blank = V - 1
        >>> loss = dj.rnnt_loss(logits, np.array([[0]]), np.array([2]), np.array([1]))
        >>> round(float(loss), 4)  # 2 alignments of 3 moves, each (1/3)**3: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss"
    check_impl(fn, impl)
    check_rnnt_options(fn, reduction, clamp, fused_log_softmax, fastemit_lambda, delay_penalty)
    logits, targets, blank, il, tl = _validate(fn, logits, targets, logit_lengths,
                                               target_lengths, blank)
    n = logits.shape[0]
    x = logits
    if clamp > 0:
        x = _clamp_grad(x, float(clamp) / max(n, 1) if reduction == "mean" else float(clamp))
    px, py, boundary = _lattice(x, targets, il, tl, blank, bool(fused_log_softmax),
                                float(fastemit_lambda), float(delay_penalty))
    path = backend_for(fn, impl, logits, dtype=px.dtype)
    if is_pallas(path):   # the Pallas kernel (duoloss/jax/_pallas/transducer.py)
        losses = reduce_losses(_pallas_transducer_losses(px, py, boundary, "regular",
                                                         backend=path), reduction)
    elif path == "xla":   # the lax.scan recursion (duoloss/jax/_xla/transducer.py)
        losses = reduce_losses(_device_transducer_losses(px, py, boundary, "regular"), reduction)
    else:  # reduced in the core (float64 weights, a correctly rounded sum), as in torch
        losses = apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), reduction=reduction,
                              rnnt_type="regular")
    if fastemit_lambda > 0:
        # NeMo reports (1 + lambda) * NLL; its gradient is the FastEmit one above
        losses = losses + float(fastemit_lambda) * jax.lax.stop_gradient(losses)
    return losses


def rnnt_align(logits: ArrayLike, targets: ArrayLike, logit_lengths: ArrayLike,
               target_lengths: ArrayLike, blank: int = -1, fused_log_softmax: bool = True, *,
               impl: str = "auto") -> tuple[jax.Array, jax.Array, jax.Array]:
    """Viterbi RNN-T alignment; see [`duoloss.torch.rnnt_align`][duoloss.torch.rnnt_align].

    ``impl``: ``'auto'`` (default: the XLA device path when ``logits`` lives on an
    accelerator, else the host), ``'device'`` (a max-plus scan over anti-diagonals
    with one-byte back-pointers, no callback) or ``'host'`` (the numba core); both
    give the same alignments, and the same scores bit for bit under
    ``jax_enable_x64``; see the Devices page.

    Returns:
      ``(alignment (N, T + U), label_frames (N, U), scores (N,))``: integer
      arrays (int32 unless ``jax_enable_x64``) and the best path scores.  Works
      under ``jit`` and ``vmap`` (sequential callbacks); not differentiable.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> logits = np.zeros((1, 2, 2, 3))  # uniform: every alignment ties; labels go as late as possible
        >>> alignment, label_frames, scores = d.rnnt_align(logits, np.array([[0]]), np.array([2]), np.array([1]))
        >>> alignment.tolist(), label_frames.tolist(), round(float(scores[0]), 4)  # blank, '0' on frame 1, blank; 3 log(1/3)
        ([[2, 0, 2]], [[1]], -3.2958)
    """
    fn = "rnnt_align"
    check_impl(fn, impl)
    check_bool(fn, "fused_log_softmax", fused_log_softmax)
    logits, targets, blank, il, tl = _validate(fn, logits, targets, logit_lengths,
                                               target_lengths, blank)
    n, t_max, u1, _ = logits.shape
    px, py, boundary = _lattice(jax.lax.stop_gradient(logits), targets, il, tl, blank,
                                bool(fused_log_softmax))
    idt = index_dtype()
    if use_device(fn, impl, logits):
        scores, frames = transducer_viterbi_regular(px, py, boundary)
        align = rnnt_tokens(scores, frames, targets, il, tl, blank, t_max)
        return align.astype(idt), frames.astype(idt), scores.astype(px.dtype)
    specs = (jax.ShapeDtypeStruct((n, t_max + u1 - 1), idt),
             jax.ShapeDtypeStruct((n, u1 - 1), idt),
             jax.ShapeDtypeStruct((n,), px.dtype))

    def host(px, py, bd, tg, il, tl):
        scores, frames = transducer_viterbi(np.asarray(px), np.asarray(py), np.asarray(bd),
                                            "regular")
        align = rnnt_alignment(scores, frames, np.asarray(tg).astype(np.int64),
                               np.asarray(il), np.asarray(tl), blank, t_max)
        return (align.astype(specs[0].dtype), frames.astype(specs[1].dtype),
                scores.astype(specs[2].dtype))

    return pure_callback(host, specs, px, py, boundary, targets, il, tl,
                             vmap_method="sequential")
