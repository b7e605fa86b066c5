"""CTC for JAX: ``ctc_loss`` (torch's API on jax arrays) and ``optax_ctc_loss``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core import _validate as _v
from duoloss.core.losses.ctc import (_NO_REDUCTION, CTC_KERNEL, check_ctc_static, check_ctc_values,
                               ctc_gather_worthwhile)
from duoloss.core.losses.ctc_logits import CTC_LOGITS_KERNEL

from duoloss._xp import JaxOps
from duoloss._xp import ctc as _xp_ctc

from ._adapter import apply_kernel
from ._pallas import backend_for, check_impl, is_pallas
from ._xla.ctc import ctc_losses as _device_ctc_losses
from ._args import (as_array, as_int_array, check_bool, is_concrete, is_half, padded_targets,
                    per_sequence)

__all__ = ["ctc_loss", "optax_ctc_loss"]

from ._args import reduce_losses as _reduce_losses  # noqa: E402  (the device path's reduction)


def _prepare_ctc(fn, log_probs, targets, input_lengths, target_lengths, blank,
                 reduction=_NO_REDUCTION, zero_infinity=False):
    """Validate ``ctc_loss``/``ctc_align`` arguments and bring them to the batched,
    padded layout: ``(log_probs (T, N, C), targets (N, S), input_lengths (N,),
    target_lengths (N,), batched)``.  Values are checked when concrete."""
    log_probs = as_array(fn, "log_probs", log_probs)
    targets = as_array(fn, "targets", targets)
    input_lengths = per_sequence(as_int_array(fn, "input_lengths", input_lengths), log_probs)
    target_lengths = per_sequence(as_int_array(fn, "target_lengths", target_lengths), log_probs)
    batched, concatenated = check_ctc_static(
        fn, log_probs.shape, log_probs.dtype, targets.shape, targets.dtype,
        input_lengths.shape, input_lengths.dtype, target_lengths.shape, target_lengths.dtype,
        blank, reduction)
    check_bool(fn, "zero_infinity", zero_infinity)
    if not batched:
        log_probs = log_probs[:, None, :]
        targets = targets[None, :]
    input_lengths = input_lengths.reshape(-1)
    target_lengths = target_lengths.reshape(-1)
    targets = _checked_targets(fn, targets, input_lengths, target_lengths, log_probs.shape[0],
                               log_probs.shape[2], blank, concatenated)
    return log_probs, targets, input_lengths, target_lengths, batched


def _checked_targets(fn, targets, input_lengths, target_lengths, t_max, n_cls, blank,
                     concatenated):
    """The ``(N, S)`` padded targets, their values and the lengths checked by the core
    when all three are concrete (traced values: the kernel marks bad rows NaN)."""
    padded = None
    if is_concrete(targets, input_lengths, target_lengths):
        padded = check_ctc_values(
            fn, np.asarray(targets).astype(np.int64), np.asarray(input_lengths).astype(np.int64),
            np.asarray(target_lengths).astype(np.int64), t_max, n_cls, blank, concatenated)
    return padded_targets(targets, target_lengths, padded)

_xp = JaxOps()  # duoloss._xp's array vocabulary for jax.numpy


def _gathered(log_probs, targets, target_lengths, blank):
    """``(log_probs, targets, blank)`` for the kernel: with a large vocabulary only
    the columns each sequence reads, gathered here in jnp on the input's device
    (see `duoloss.core.losses.ctc`, "the gathered crossing"); else unchanged."""
    t_max, n, n_cls = log_probs.shape
    s = targets.shape[1]
    if not ctc_gather_worthwhile(t_max, n, n_cls, s):
        return log_probs, targets, blank
    columns, column_targets = _xp_ctc.gather_plan(_xp, targets, target_lengths, n_cls, blank)
    return _xp_ctc.gathered(_xp, log_probs, columns), column_targets, 0


def _ctc_losses(fn, log_probs, targets, input_lengths, target_lengths, blank, reduction,
                zero_infinity, impl="auto"):
    check_impl(fn, impl)
    log_probs, targets, input_lengths, target_lengths, batched = _prepare_ctc(
        fn, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
    backend = backend_for(fn, impl, log_probs, dtype=log_probs.dtype)
    if is_pallas(backend):
        from ._pallas.ctc import ctc_losses as _pallas_ctc_losses
        losses = _pallas_ctc_losses(log_probs, targets, input_lengths, target_lengths,
                                    int(blank), bool(zero_infinity), backend)
        return _reduce_losses(losses, reduction, target_lengths), target_lengths, batched
    if backend == "xla":
        losses = _device_ctc_losses(log_probs, targets, input_lengths, target_lengths,
                                    int(blank), bool(zero_infinity))
        return _reduce_losses(losses, reduction, target_lengths), target_lengths, batched
    log_probs, targets, blank = _gathered(log_probs, targets, target_lengths, int(blank))
    # reduced in the core, as in the torch frontend (same bits); 'none' per sequence
    losses = apply_kernel(CTC_KERNEL, (log_probs, targets, input_lengths, target_lengths),
                          reduction=reduction, lengths=target_lengths,
                          blank=int(blank), zero_infinity=bool(zero_infinity))
    return losses, target_lengths, batched


def ctc_loss(log_probs: ArrayLike, targets: ArrayLike, input_lengths: ArrayLike,
             target_lengths: ArrayLike, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False, *, impl: str = "auto") -> jax.Array:
    r"""Connectionist Temporal Classification loss with ``torch.nn.functional.ctc_loss``'s API.

    Same arguments, layouts and numbers as [`duoloss.torch.ctc_loss`][duoloss.torch.ctc_loss] (both
    run the same core on the same buffers), as a differentiable JAX function
    that works under ``jit``, ``grad``, ``value_and_grad`` and ``vmap``.

    Args:
      log_probs: ``(T, N, C)``-array (or unbatched ``(T, C)``) of log-probabilities,
        float16, bfloat16, float32 (or float64 with ``jax_enable_x64``); half
        precision is computed in float64 and returned in its dtype. ``T`` frames, ``N``
        sequences, ``C`` classes including the blank.
      targets: ``(N, S)`` padded integer targets or 1-D concatenated targets
        (``(S,)`` for unbatched input); labels in ``[0, C)``, never ``blank``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      blank: index of the blank class.
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (loss / clamp(target length, 1), then mean).
      zero_infinity: infeasible sequences get loss 0 and zero gradient.
      impl: ``'auto'`` (default: the device path when ``log_probs`` lives on a
        GPU/TPU, else the host core), ``'device'`` (the Pallas kernel where it lowers,
        CUDA GPUs and TPUs, else the XLA scan; no callback), ``'xla'`` (the
        ``lax.scan`` forward-backward anywhere), ``'pallas'`` (the Pallas kernel
        anywhere: interpreted on CPU, for tests) or ``'host'`` (the numba core
        through one callback); see the Devices page.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``, in ``log_probs``' dtype.

    NB: the gradient is ``d loss / d log_probs = -posterior`` (see
    [`duoloss.torch.ctc_loss`][duoloss.torch.ctc_loss]).  Everything static (shapes, dtypes, blank,
    reduction) is validated at trace time; label and length *values* are
    validated whenever they are concrete (eager calls).  Under ``jit`` they are
    traced and cannot be checked: a sequence with an out-of-range label or length
    then gets a NaN loss and gradient (never an out-of-bounds read).  Call once
    eagerly (outside ``jit``) to get the error message.  Reverse mode only and
    first order only: ``jax.jvp``/``jacfwd`` raise ``TypeError``, and ``jax.grad``
    of ``jax.grad``, ``jax.hessian`` and Hessian-vector products raise
    ``NotImplementedError`` (never zeros).

    Examples:
        >>> import math, numpy as np
        >>> import duoloss.jax as dj
        >>> log_probs = np.full((2, 1, 3), -math.log(3), np.float32)  # (T, N, C): T=2 uniform frames, C=3
        >>> loss = dj.ctc_loss(log_probs, np.array([[1]]), np.array([2]), np.array([1]))
        >>> round(float(loss), 4)  # 3 of the 9 frame paths spell '1': -log(3/9) = log 3
        1.0986
    """
    losses, target_lengths, batched = _ctc_losses(
        "ctc_loss", log_probs, targets, input_lengths, target_lengths, blank, reduction,
        zero_infinity, impl)
    if not batched and reduction == "none":
        return losses[0]
    return losses


def _check_right_padding(fn, arg, pad):
    """0/1 entries, zeros then ones in each row (optax's right padding); int64 rows."""
    bad = (pad != 0) & (pad != 1)
    if bad.any():
        r, i = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(f"{fn}: argument '{arg}' must hold 0.0/1.0 paddings, "
                         f"got {float(pad[r, i])} at row {r}, position {i}")
    pad = pad.astype(np.int64)
    bad = np.diff(pad, axis=1) < 0
    if bad.any():
        r, i = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(f"{fn}: argument '{arg}' must be right padding (zeros, then ones), "
                         f"got a 0 after a 1 at row {r}, position {i + 1}")
    return pad


def optax_ctc_loss(logits: ArrayLike, logit_paddings: ArrayLike, labels: ArrayLike,
                   label_paddings: ArrayLike, *, blank_id: int = 0, log_epsilon: float = -1e5,
                   impl: str = "auto") -> jax.Array:
    """Drop-in for ``optax.ctc_loss``: same signature, per-sequence losses ``(B,)``.

    Args:
      logits: ``(B, T, K)``-array of unnormalised scores (``log_softmax`` is applied
        here, and differentiated through, as optax does).
      logit_paddings: ``(B, T)`` with 1.0 on padded frames (right padding).
      labels: ``(B, N)`` integer labels.
      label_paddings: ``(B, N)`` with 1.0 on padded label positions (right padding).
      blank_id: index of the blank class.
      log_epsilon: accepted for signature compatibility; unused (duoloss is exact
        in log space and needs no stand-in for ``log(0)``).
      impl: ``'auto'``, ``'device'``, ``'xla'``, ``'pallas'`` or ``'host'``, as in
        [`ctc_loss`][duoloss.jax.ctc_loss].

    Returns:
      ``(B,)`` losses; equal to optax's for every feasible sequence.  Like
      optax, float16/bfloat16 ``logits`` give float32 losses (the gradient
      w.r.t. ``logits`` keeps their dtype).

    On CPU (``impl='auto'`` or ``'host'``) ``log_softmax``, the CTC kernel and the
    way back to the logits run in one host call, batch first
    (`duoloss.core.losses.ctc_logits`): no XLA work around the callback.  A large
    vocabulary (many more classes than labels) instead gathers the columns the
    kernel reads before the callback, as [`ctc_loss`][duoloss.jax.ctc_loss] does.

    NB: paddings must be right-aligned (as optax assumes); lengths are
    ``T - sum(logit_paddings)`` and ``N - sum(label_paddings)``.  Deliberate
    difference: an infeasible sequence (too few frames for its labels) gets
    ``+inf`` — optax returns a finite value near ``-log_epsilon`` there, which
    silently trains on impossible targets.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as dj
        >>> logits = np.zeros((1, 2, 3), np.float32)  # (B, T, K): 2 uniform frames over 3 classes
        >>> loss = dj.optax_ctc_loss(logits, np.zeros((1, 2), np.float32), np.array([[1]]), np.zeros((1, 1), np.float32))
        >>> loss.shape, round(float(loss[0]), 4)  # per sequence, as optax: -log(3/9) = log 3
        ((1,), 1.0986)
    """
    fn = "optax_ctc_loss"
    check_impl(fn, impl)
    logits = as_array(fn, "logits", logits)
    _v.check_ndim(fn, "logits", logits.shape, (3,), "a (B, T, K)-array")
    _v.check_dtype(fn, "logits", logits.dtype, _v.FLOAT_DTYPES, "a floating")
    b, t, k = logits.shape
    logit_paddings = as_array(fn, "logit_paddings", logit_paddings)
    labels = as_array(fn, "labels", labels)
    label_paddings = as_array(fn, "label_paddings", label_paddings)
    if logit_paddings.shape != (b, t):
        raise ValueError(f"{fn}: argument 'logit_paddings' must have shape ({b}, {t}), "
                         f"got {logit_paddings.shape}")
    if labels.ndim != 2 or labels.shape[0] != b:
        raise ValueError(f"{fn}: argument 'labels' must be ({b}, N), got shape {labels.shape}")
    if label_paddings.shape != labels.shape:
        raise ValueError(f"{fn}: argument 'label_paddings' must have shape {labels.shape}, "
                         f"got {label_paddings.shape}")
    _v.check_dtype(fn, "labels", labels.dtype, _v.INT_DTYPES, "an integer")
    _v.check_int_scalar(fn, "blank_id", blank_id, 0, k)
    if is_concrete(logit_paddings, labels, label_paddings):
        # Checked here under optax's names; _ctc_losses re-checks under its own.
        _check_right_padding(fn, "logit_paddings", np.asarray(logit_paddings))
        lpad = _check_right_padding(fn, "label_paddings", np.asarray(label_paddings))
        _v.check_labels(fn, "labels", np.asarray(labels).astype(np.int64),
                        labels.shape[1] - lpad.sum(axis=1), k, forbidden=blank_id,
                        forbidden_what="blank_id")
    int_t = jnp.int32
    input_lengths = (t - jnp.round(logit_paddings.sum(axis=1))).astype(int_t)
    target_lengths = (labels.shape[1] - jnp.round(label_paddings.sum(axis=1))).astype(int_t)
    if (logits.dtype in (jnp.float32, jnp.float64)
            and not ctc_gather_worthwhile(t, b, k, labels.shape[1])
            and backend_for(fn, impl, logits, dtype=logits.dtype) == "host"):
        # one host call for log_softmax, the CTC kernel and the way back, batch first
        # (duoloss.core.losses.ctc_logits): no XLA work around the callback.  (A large
        # vocabulary keeps the gathered crossing: the callback then sees S + 1 columns.)
        return _host_logits_losses(fn, logits, labels, input_lengths, target_lengths,
                                   int(blank_id))
    log_probs = jax.nn.log_softmax(logits, axis=-1).transpose(1, 0, 2)
    losses, _, _ = _ctc_losses(fn, log_probs, labels, input_lengths, target_lengths, blank_id,
                               "none", False, impl)
    if is_half(logits.dtype):
        losses = losses.astype(jnp.float32)  # as optax: float32 losses for half logits
    return losses


def _host_logits_losses(fn, logits, labels, input_lengths, target_lengths, blank):
    """`optax_ctc_loss`'s host path: ``(B,)`` losses of `CTC_LOGITS_KERNEL`, with the
    value checks of the general path when the lengths are concrete."""
    _, t, k = logits.shape
    targets = _checked_targets(fn, labels, input_lengths, target_lengths, t, k, blank, False)
    return apply_kernel(CTC_LOGITS_KERNEL, (logits, targets, input_lengths, target_lengths),
                        blank=blank)
