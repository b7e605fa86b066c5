"""CTC greedy (best-path) decoding in jnp ops: jit- and vmap-able, no host callback."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core import _validate as _v

from ._args import as_array, as_int_array, check_bool, index_dtype, is_concrete

__all__ = ["ctc_greedy_decode"]

#: The value of ``tokens`` and ``frames`` past each hypothesis's length.
PAD = -1


def ctc_greedy_decode(log_probs: ArrayLike, input_lengths: ArrayLike | Sequence[int],
                      blank: int = 0, *,
                      batch_first: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""CTC greedy (best-path) decoding: the best class per frame, repeats merged, blanks removed.

    With ``a_t = argmax_c log_probs[t, n, c]`` over the frames ``t < input_lengths[n]``,
    a frame emits ``a_t`` when ``a_t != blank`` and ``a_t != a_{t-1}`` (the first frame
    always compares unequal); the hypothesis is the sequence of emitted tokens, each with
    the frame that emitted it (its first frame: a token held over frames ``t..t+k`` is
    reported at ``t``).  Ties go to the lowest class index (``argmax``'s rule); a NaN in a
    frame makes the NaN's class that frame's best (``jnp.argmax``'s rule).  Same arguments
    and results as `duoloss.torch.ctc_greedy_decode`.

    Plain ``jnp`` ops (no host callback): works under ``jax.jit`` and ``jax.vmap`` and runs
    on any backend.  Scores need not be normalised (logits give the same result as their
    ``log_softmax``).

    Args:
      log_probs: ``(T, N, C)``-array of frame scores (``(N, T, C)`` with
        ``batch_first=True``; or an unbatched ``(T, C)``), any float dtype.
        ``T`` frames, ``N`` sequences, ``C`` classes including the blank.
      input_lengths: ``(N,)`` integer array, or a tuple/list of ints, in ``[0, T]``
        (an int or 0-d array for unbatched input).  Values are checked on concrete
        (eager) calls; under ``jit``/``vmap`` they are clamped into ``[0, T]``.
      blank: index of the blank class, in ``[0, C)``.
      batch_first: ``log_probs`` is ``(N, T, C)`` (``optax.ctc_loss``'s layout).

    Returns:
      ``(tokens, lengths, frames)``: ``tokens`` ``(N, T)``, the hypothesis of each
      sequence left-aligned and padded with ``-1``; ``lengths`` ``(N,)``, the number of
      tokens; ``frames`` ``(N, T)``, each token's first frame (``-1`` past the length).
      Unbatched input gives ``(T,)``, ``()`` and ``(T,)``.  Integer dtype: int64 with
      ``jax_enable_x64``, else int32.

    Raises:
      TypeError: ``log_probs`` not a floating array, lengths not integers, ``blank`` or
        ``batch_first`` of the wrong type.
      ValueError: wrong shapes, ``blank`` outside ``[0, C)``, lengths outside ``[0, T]``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> best = jnp.array([0, 1, 1, 0, 1, 2, 2])               # per-frame best classes
        >>> log_probs = jax.nn.one_hot(best, 3)[:, None, :]        # (T=7, N=1, C=3)
        >>> tokens, lengths, frames = dj.ctc_greedy_decode(log_probs, jnp.array([7]))
        >>> tokens[0, :int(lengths[0])].tolist(), frames[0, :int(lengths[0])].tolist()
        ([1, 1, 2], [1, 4, 5])
    """
    fn = "ctc_greedy_decode"
    log_probs = as_array(fn, "log_probs", log_probs)
    batch_first = check_bool(fn, "batch_first", batch_first)
    _v.check_dtype(fn, "log_probs", log_probs.dtype, _v.FLOAT_DTYPES, "a floating")
    ndim = _v.check_ndim(fn, "log_probs", tuple(log_probs.shape), (2, 3),
                         "(N, T, C) (batch_first) or unbatched (T, C)" if batch_first
                         else "(T, N, C) or unbatched (T, C)")
    lp = log_probs if ndim == 3 else jnp.expand_dims(log_probs, 0 if batch_first else 1)
    if not batch_first:
        lp = jnp.swapaxes(lp, 0, 1)  # (N, T, C)
    n, t_max, n_cls = lp.shape
    blank = _v.check_int_scalar(fn, "blank", blank, 0, max(n_cls, 1))
    if n_cls == 0:
        raise ValueError(f"{fn}: argument 'log_probs' must have at least one class, got C = 0")
    lengths = _lengths(fn, input_lengths, n, t_max, ndim)
    tokens, count, frames = _decode(lp, lengths, blank)
    if ndim == 2:
        return tokens[0], count[0], frames[0]
    return tokens, count, frames


def _lengths(fn: str, input_lengths, n: int, t_max: int, ndim: int):
    """``input_lengths`` as an ``(N,)`` integer array, value-checked when concrete, else
    clamped into ``[0, T]``."""
    il = as_int_array(fn, "input_lengths", input_lengths)
    _v.check_dtype(fn, "input_lengths", il.dtype, _v.INT_DTYPES, "an integer")
    want = "a 0-d array or an int (unbatched log_probs)" if ndim == 2 else f"shape ({n},)"
    if il.size != n or (ndim == 2 and il.ndim != 0) or il.ndim > 1 or (il.ndim == 0 and n != 1):
        raise ValueError(f"{fn}: argument 'input_lengths' must be {want}, "
                         f"got shape {_v.shape_str(tuple(il.shape))}")
    if is_concrete(il):
        _v.check_lengths(fn, "input_lengths", np.asarray(il).reshape(-1), t_max,
                         "the number of frames T")
    return jnp.clip(il.reshape(n).astype(index_dtype()), 0, t_max)


def _decode(lp, lengths, blank: int):
    n, t_max, _ = lp.shape
    idx = index_dtype()
    best = jnp.argmax(lp, -1).astype(idx)                          # (N, T)
    t = jnp.arange(t_max, dtype=idx)
    prev = jnp.concatenate([jnp.full((n, min(t_max, 1)), -1, idx), best[:, :-1]], 1)
    keep = (t[None, :] < lengths[:, None]) & (best != blank) & (best != prev)
    count = keep.sum(1, dtype=idx)
    slot = jnp.where(keep, jnp.cumsum(keep, 1, dtype=idx) - 1, t_max)  # t_max: dropped
    rows = jnp.arange(n)[:, None]
    tokens = jnp.full((n, t_max), PAD, idx).at[rows, slot].set(best, mode="drop")
    frames = jnp.full((n, t_max), PAD, idx).at[rows, slot].set(
        jnp.broadcast_to(t[None, :], (n, t_max)), mode="drop")
    return tokens, count, frames
