"""Argument coercion shared by the JAX frontends.

Every public JAX function turns its arguments into ``jax.Array``s with the
helpers here, so the accepted types, the traced-versus-concrete split and the
error texts are the same in every loss (the texts also match the torch
frontend's but for the array type's name; `duoloss.core._validate` builds
them).  Shapes, dtypes and values are checked by the core's ``check_*``
functions, which the frontends call on the coerced arrays.

* `as_array` / `as_int_array`: an argument as a ``jax.Array``, or a
  ``TypeError`` naming the function and the argument.
* `per_sequence`: the scalar lengths of a one-sequence batch as ``(1,)``.
* `is_concrete`: whether values can be read on the host (eager call) or
  are traced (``jit``, ``vmap``...), in which case only static checks run.
* `check_bool`: a ``bool`` option.
* `padded_targets`: the padded targets layout, from the core's host
  padding (concrete values) or in jnp (traced).
* `reduce_losses`: ``'none'``/``'sum'``/``'mean'`` of per-sequence losses.
* `HALF_DTYPES`, `is_half`, `host_floats`: float16/bfloat16,
  which the kernels never see (they take float32 or float64);
  `first_floating`: the dtype that sets a loss's dtype.
* `index_dtype`: the integer dtype of index outputs (int64 with
  ``jax_enable_x64``, else int32).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from duoloss.core import _validate as _v

__all__ = [
    "HALF_DTYPES",
    "as_array",
    "as_int_array",
    "check_bool",
    "first_floating",
    "host_floats",
    "index_dtype",
    "is_concrete",
    "is_half",
    "padded_targets",
    "per_sequence",
    "reduce_losses",
]

#: The half-precision float dtypes; the kernels compute them in float32.
HALF_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))

_ARRAYS = (jax.Array, np.ndarray)


def is_concrete(*xs) -> bool:
    """True when no argument is a tracer (values can be checked on the host)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def as_array(fn: str, arg: str, x, *, optional: bool = False, arrays_only: bool = False):
    """``jnp.asarray(x)``, or a ``TypeError`` naming ``fn`` and ``arg``.

    Accepts arrays (``jax.Array``, ``numpy.ndarray``, numpy scalars), nested
    lists/tuples and Python ints/floats; with ``arrays_only`` only ``jax.Array``
    and ``numpy.ndarray`` (the k2-style functions, as in their torch twins).
    ``optional``: ``None`` passes through as ``None``.
    """
    if x is None and optional:
        return None
    if arrays_only:
        if isinstance(x, _ARRAYS):
            return jnp.asarray(x)
    elif isinstance(x, _ARRAYS + (np.generic, list, tuple)) or (
            isinstance(x, (int, float)) and not isinstance(x, bool)):
        try:
            return jnp.asarray(x)
        except (TypeError, ValueError):
            pass
    raise _v.not_an_array(fn, arg, x, "a jax.Array or None" if optional else "a jax.Array")


def as_int_array(fn: str, arg: str, x):
    """Lengths: an array, an int or a tuple/list of ints (as in the torch frontend).

    The integer dtype itself is checked by the core (``check_*``), which names
    the dtype it got.
    """
    if isinstance(x, (list, tuple)):
        return jnp.asarray(_v.int_list(fn, arg, x, "a jax.Array"))
    if isinstance(x, _ARRAYS + (np.generic,)) or (isinstance(x, int) and not isinstance(x, bool)):
        return jnp.asarray(x)
    raise _v.not_an_array(fn, arg, x, "a jax.Array or a tuple/list of ints")


def per_sequence(lengths, data):
    """Scalar ``lengths`` of a ``(T, 1, C)`` batch (one sequence, as
    ``torch.nn.functional.ctc_loss`` accepts) as a ``(1,)`` array; else unchanged."""
    if data.ndim == 3 and data.shape[1] == 1 and lengths.ndim == 0:
        return lengths.reshape(1)
    return lengths


def check_bool(fn: str, arg: str, x, *, numpy_bool: bool = True) -> bool:
    """``x`` as a Python bool; a ``TypeError`` for anything else.

    ``numpy_bool=False`` also rejects ``numpy.bool_`` (k2's ``return_grad``,
    as in the torch frontend).
    """
    if not isinstance(x, (bool, np.bool_) if numpy_bool else bool):
        raise TypeError(f"{fn}: argument '{arg}' must be a bool, got {type(x).__name__}")
    return bool(x)


def padded_targets(targets, target_lengths, host_padded=None):
    """``(N, S)`` padded targets in ``targets``' dtype.

    ``host_padded``: the core's padded targets from its value checks (concrete
    values), taken as they are.  Else (traced values) 2-D ``targets`` are
    already padded, and 1-D concatenated ones are padded here in jnp: every row
    is cut at the static bound ``S = targets.size``; entries past a row's length
    are 0.
    """
    if host_padded is not None:
        return jnp.asarray(host_padded.astype(np.asarray(targets).dtype))
    if targets.ndim != 1:
        return targets
    s = targets.shape[0]
    offsets = jnp.cumsum(target_lengths) - target_lengths
    pos = jnp.arange(s)
    idx = offsets[:, None] + pos[None, :]
    valid = pos[None, :] < target_lengths[:, None]
    gathered = jnp.take(targets, jnp.clip(idx, 0, max(s - 1, 0)), axis=0) if s else idx
    return jnp.where(valid, gathered, 0)


def reduce_losses(losses, reduction: str, lengths=None, *, k2_mean: bool = False):
    """``'none'`` (``losses``), ``'sum'``, or ``'mean'`` of ``(N,)`` losses, in XLA.

    Not bit-identical to the torch frontend (XLA picks its own order and vector
    width): the host losses reduce in the core instead, inside their callback
    (`duoloss.jax._adapter.apply_kernel` with ``reduction=``,
    `duoloss.core._reduce`).  This is for losses computed in XLA (the
    device paths).

    ``'mean'``: with ``lengths``, each loss over its length clamped to ``>= 1``,
    then the batch mean (torch's CTC convention); without, ``sum / N``
    (torchaudio's RNN-T convention).  The ``'mean'`` of an empty batch is 0 with
    a zero gradient, as in the torch frontend (not NaN).  ``k2_mean``:
    ``losses.mean()``, NaN for an empty batch (k2's functions, as their torch
    twins).
    """
    if reduction == "none":
        return losses
    n = losses.shape[0]
    if k2_mean and reduction == "mean":
        return losses.mean()
    if reduction == "sum" or n == 0:
        return losses.sum()
    if lengths is None:
        return losses.sum() / n
    return (losses / jnp.maximum(lengths, 1).astype(losses.dtype)).mean()


def is_half(dtype) -> bool:
    """float16 or bfloat16."""
    return np.dtype(dtype) in HALF_DTYPES


def host_floats(x) -> np.ndarray:
    """A host (numpy) array; float16/bfloat16 as float32 (the kernels take float32/float64)."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype in HALF_DTYPES else x


def index_dtype():
    """The dtype of integer outputs (labels, frames, arcs): int64 with ``jax_enable_x64``,
    else int32."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def first_floating(arrays) -> Optional[np.dtype]:
    """The dtype of the first floating array (it sets a loss's dtype, as in the core),
    or None."""
    for a in arrays:
        if jnp.issubdtype(a.dtype, jnp.floating):
            return np.dtype(a.dtype)
    return None
