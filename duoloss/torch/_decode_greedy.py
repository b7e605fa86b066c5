"""CTC greedy (best-path) decoding in torch ops: runs on the input's device, no host sync."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from duoloss.core import _validate as _v

from ._adapter import check_not_torchscript, is_concrete
from ._args import check_bool, check_tensor, int_array, int_tensor

__all__ = ["ctc_greedy_decode"]

#: The value of ``tokens`` and ``frames`` past each hypothesis's length.
PAD = -1


def ctc_greedy_decode(log_probs: torch.Tensor, input_lengths: torch.Tensor | Sequence[int] | int,
                      blank: int = 0, *,
                      batch_first: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""CTC greedy (best-path) decoding: the best class per frame, repeats merged, blanks removed.

    With ``a_t = argmax_c log_probs[t, n, c]`` over the frames ``t < input_lengths[n]``,
    a frame emits ``a_t`` when ``a_t != blank`` and ``a_t != a_{t-1}`` (the first frame
    always compares unequal); the hypothesis is the sequence of emitted tokens, each with
    the frame that emitted it (its first frame: a token held over frames ``t..t+k`` is
    reported at ``t``).  Ties go to the lowest class index (``argmax``'s rule); a NaN in a
    frame makes the NaN's class that frame's best (``torch.argmax``'s rule).

    Tensor ops only, on the input's device: no host synchronisation (with the lengths on
    the device too), usable under ``torch.compile(fullgraph=True)``.  Scores need not be
    normalised (logits give the same result as their ``log_softmax``).

    Args:
      log_probs: ``(T, N, C)``-tensor of frame scores (``(N, T, C)`` with
        ``batch_first=True``; or an unbatched ``(T, C)``), any float dtype and device.
        ``T`` frames, ``N`` sequences, ``C`` classes including the blank.
      input_lengths: ``(N,)`` integer tensor, or a tuple/list of ints, in ``[0, T]``
        (an int or 0-d tensor for unbatched input).  Values are checked when they can
        be read without a device synchronisation (host tensors and Python ints,
        outside ``torch.compile``); otherwise they are clamped into ``[0, T]``.
      blank: index of the blank class, in ``[0, C)``.
      batch_first: ``log_probs`` is ``(N, T, C)``.

    Returns:
      ``(tokens, lengths, frames)``: ``tokens`` ``(N, T)`` int64, the hypothesis of each
      sequence left-aligned and padded with ``-1``; ``lengths`` ``(N,)`` int64, the number
      of tokens; ``frames`` ``(N, T)`` int64, each token's first frame (``-1`` past the
      length).  Unbatched input gives ``(T,)``, ``()`` and ``(T,)``.  All on
      ``log_probs``'s device.

    Raises:
      TypeError: ``log_probs`` not a floating tensor, lengths not integers, ``blank`` or
        ``batch_first`` of the wrong type.
      ValueError: wrong shapes, ``blank`` outside ``[0, C)``, lengths outside ``[0, T]``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> best = torch.tensor([0, 1, 1, 0, 1, 2, 2])             # per-frame best classes
        >>> log_probs = torch.nn.functional.one_hot(best, 3).float()[:, None, :]  # (T=7, N=1, C=3)
        >>> tokens, lengths, frames = dt.ctc_greedy_decode(log_probs, torch.tensor([7]))
        >>> tokens[0, :lengths[0]].tolist(), frames[0, :lengths[0]].tolist()
        ([1, 1, 2], [1, 4, 5])
    """
    fn = "ctc_greedy_decode"
    check_not_torchscript(fn)
    check_tensor(fn, "log_probs", log_probs)
    batch_first = check_bool(fn, "batch_first", batch_first)
    _check_float(fn, log_probs)
    ndim = _v.check_ndim(fn, "log_probs", tuple(log_probs.shape), (2, 3),
                         "(N, T, C) (batch_first) or unbatched (T, C)" if batch_first
                         else "(T, N, C) or unbatched (T, C)")
    lp = log_probs if ndim == 3 else log_probs.unsqueeze(0 if batch_first else 1)
    if not batch_first:
        lp = lp.transpose(0, 1)  # (N, T, C)
    n, t_max, n_cls = lp.shape
    blank = _v.check_int_scalar(fn, "blank", blank, 0, max(n_cls, 1))
    if n_cls == 0:
        raise ValueError(f"{fn}: argument 'log_probs' must have at least one class, got C = 0")
    lengths = _lengths(fn, input_lengths, lp, ndim)
    return _decode(lp, lengths, blank, ndim == 2)


def _check_float(fn: str, x: torch.Tensor) -> None:
    """A floating dtype, checked with the dtype's own flag: no lookup keyed by the dtype,
    which ``torch.compile`` cannot trace in every torch version."""
    if not x.dtype.is_floating_point:
        _v.check_dtype(fn, "log_probs", x.dtype, _v.FLOAT_DTYPES, "a floating")  # raises
    elif x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        _v.check_dtype(fn, "log_probs", x.dtype, _v.FLOAT_DTYPES, "a floating")  # float8: raises


def _lengths(fn: str, input_lengths, lp: torch.Tensor, ndim: int) -> torch.Tensor:
    """``input_lengths`` as an ``(N,)`` int64 tensor on ``lp``'s device, value-checked when
    that needs no device synchronisation (host values outside tracing), else clamped."""
    n, t_max = lp.shape[0], lp.shape[1]
    want = "a 0-d tensor or an int (unbatched log_probs)" if ndim == 2 else f"shape ({n},)"
    readable = is_concrete(input_lengths) and (
        not isinstance(input_lengths, torch.Tensor) or input_lengths.device.type == "cpu")
    if readable:
        host = int_array(fn, "input_lengths", input_lengths)
        _v.check_dtype(fn, "input_lengths", host.dtype, _v.INT_DTYPES, "an integer")
        if host.size != n or (ndim == 2 and host.ndim != 0) or (ndim == 3 and host.ndim not in (0, 1)) \
                or (ndim == 3 and host.ndim == 0 and n != 1):
            raise ValueError(f"{fn}: argument 'input_lengths' must be {want}, "
                             f"got shape {_v.shape_str(host.shape)}")
        _v.check_lengths(fn, "input_lengths", host.reshape(-1), t_max, "the number of frames T")
        if isinstance(input_lengths, torch.Tensor):
            return input_lengths.reshape(n).to(device=lp.device, dtype=torch.int64)
        return torch.as_tensor(np.asarray(host, np.int64).reshape(n), device=lp.device)
    il = int_tensor(fn, "input_lengths", input_lengths, lp.device)
    if il.dtype.is_floating_point or il.dtype.is_complex or il.dtype == torch.bool:
        _v.check_dtype(fn, "input_lengths", il.dtype, _v.INT_DTYPES, "an integer")  # raises
    if il.numel() != n or il.dim() > 1:
        raise ValueError(f"{fn}: argument 'input_lengths' must be {want}, "
                         f"got shape {_v.shape_str(tuple(il.shape))}")
    return il.reshape(n).to(device=lp.device, dtype=torch.int64).clamp(0, t_max)


def _decode(lp: torch.Tensor, lengths: torch.Tensor, blank: int, unbatched: bool):
    n, t_max, _ = lp.shape
    best = lp.argmax(-1)                                           # (N, T)
    t = torch.arange(t_max, device=lp.device)
    prev = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], 1)
    keep = (t[None, :] < lengths[:, None]) & (best != blank) & (best != prev)
    count = keep.sum(1)
    # the kept frames first, in frame order (a stable sort of the 0/1 "dropped" flags): no
    # scatter and no cumulative sum (torch 2.11's inductor failed to generate a CUDA kernel
    # for the cumsum form), deterministic on every device
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
    within = t[None, :] < count[:, None]
    tokens = torch.where(within, best.gather(1, order), PAD)
    frames = torch.where(within, order, PAD)
    if unbatched:
        return tokens[0], count[0], frames[0]
    return tokens, count, frames
