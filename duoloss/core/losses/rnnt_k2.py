"""Framework-free checks for the k2-style simple and pruned RNN-T losses.

The torch and JAX frontends (``duoloss.torch._rnnt_k2``, ``duoloss.jax._rnnt_k2``)
compute k2's ``(px, py)`` log-probabilities with their own array operations and
hand them to the transducer recursion of the core; what they share is here:
argument checks that read only shapes and dtype names (they also run on JAX
tracers), value checks on host numpy arrays (eager calls only), and the
``s_range`` adjustment of `get_rnnt_prune_ranges`, so both frontends raise
the same messages and warn the same way.

Conventions (k2's): ``B`` batch, ``T`` frames, ``S`` symbols (``S + 1``
decoder positions), ``C`` classes including the termination (blank) symbol;
``boundary`` rows are ``[s_begin, t_begin, s_end, t_end]``.
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import numpy as np

from .. import _validate as _v

__all__ = [
    "RNNT_TYPES",
    "check_boundary_static",
    "check_boundary_values",
    "check_common_scalars",
    "check_float_scalar",
    "check_pruned_static",
    "check_ranges_values",
    "check_simple_static",
    "check_symbols_values",
    "check_prune_ranges_static",
    "check_pruning_static",
    "prune_s_range",
]

RNNT_TYPES = ("regular", "modified", "constrained")


def _shape(x):
    return tuple(int(s) for s in x)


def check_common_scalars(fn: str, termination_symbol, num_classes: int, rnnt_type,
                         delay_penalty, reduction) -> None:
    """termination_symbol in [0, C), rnnt_type, delay_penalty, reduction."""
    _v.check_int_scalar(fn, "termination_symbol", termination_symbol, 0, num_classes)
    if not isinstance(rnnt_type, str) or rnnt_type not in RNNT_TYPES:
        raise ValueError(f"{fn}: argument 'rnnt_type' must be one of "
                         f"{', '.join(repr(r) for r in RNNT_TYPES)}, got {rnnt_type!r}")
    check_float_scalar(fn, "delay_penalty", delay_penalty)
    _v.check_reduction(fn, reduction)


def check_float_scalar(fn: str, arg: str, value) -> float:
    """A finite Python/numpy real number (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: argument '{arg}' must be a float, got {type(value).__name__}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{fn}: argument '{arg}' must be finite, got {value!r}")
    return value


def _check_float(fn, arg, shape, dtype, ndim, layout):
    _v.check_dtype(fn, arg, dtype, _v.FLOAT_DTYPES, "a floating")
    _v.check_ndim(fn, arg, shape, (ndim,), layout)


def _check_symbols(fn, shape, dtype, b: int, s: Optional[int]):
    _v.check_dtype(fn, "symbols", dtype, _v.INT_DTYPES, "an integer")
    _v.check_ndim(fn, "symbols", shape, (2,), "2-D (B, S)")
    want = (b, s) if s is not None else (b, shape[1])
    if _shape(shape) != want:
        raise ValueError(f"{fn}: argument 'symbols' must have shape {_v.shape_str(want)} "
                         f"(B, S), got {_v.shape_str(shape)}")


def check_boundary_static(fn: str, shape, dtype, b: int) -> None:
    _v.check_dtype(fn, "boundary", dtype, _v.INT_DTYPES, "an integer")
    if _shape(shape) != (b, 4):
        raise ValueError(f"{fn}: argument 'boundary' must have shape ({b}, 4) "
                         f"(rows [s_begin, t_begin, s_end, t_end]), got {_v.shape_str(shape)}")


def check_simple_static(fn, lm_shape, lm_dtype, am_shape, am_dtype, sym_shape, sym_dtype
                        ) -> Tuple[int, int, int, int]:
    """Shapes and dtypes of ``rnnt_loss_simple``; returns ``(B, S, T, C)``."""
    _check_float(fn, "lm", lm_shape, lm_dtype, 3, "3-D (B, S+1, C)")
    _check_float(fn, "am", am_shape, am_dtype, 3, "3-D (B, T, C)")
    b, t, c = _shape(am_shape)
    if c < 1:
        raise ValueError(f"{fn}: argument 'am' must have C >= 1 classes, got shape "
                         f"{_v.shape_str(am_shape)}")
    if lm_shape[0] != b or lm_shape[2] != c or lm_shape[1] < 1:
        raise ValueError(f"{fn}: argument 'lm' must have shape ({b}, S+1, {c}) with S+1 >= 1 "
                         f"(am is {_v.shape_str(am_shape)}), got {_v.shape_str(lm_shape)}")
    if _v.dtype_name(lm_dtype) != _v.dtype_name(am_dtype):
        raise TypeError(f"{fn}: argument 'lm' must have the dtype of 'am' "
                        f"({_v.dtype_name(am_dtype)}), got {_v.dtype_name(lm_dtype)}")
    s = int(lm_shape[1]) - 1
    _check_symbols(fn, sym_shape, sym_dtype, b, s)
    return b, s, t, c


def check_pruned_static(fn, logits_shape, logits_dtype, sym_shape, sym_dtype, ranges_shape,
                        ranges_dtype) -> Tuple[int, int, int, int, int]:
    """Shapes and dtypes of ``rnnt_loss_pruned``; returns ``(B, S, T, s_range, C)``."""
    _check_float(fn, "logits", logits_shape, logits_dtype, 4, "4-D (B, T, s_range, C)")
    b, t, r, c = _shape(logits_shape)
    if c < 1 or r < 1:
        raise ValueError(f"{fn}: argument 'logits' must have s_range >= 1 and C >= 1, "
                         f"got shape {_v.shape_str(logits_shape)}")
    _check_symbols(fn, sym_shape, sym_dtype, b, None)
    s = int(sym_shape[1])
    _v.check_dtype(fn, "ranges", ranges_dtype, _v.INT_DTYPES, "an integer")
    if _shape(ranges_shape) != (b, t, r):
        raise ValueError(f"{fn}: argument 'ranges' must have shape ({b}, {t}, {r}) "
                         f"(B, T, s_range of logits), got {_v.shape_str(ranges_shape)}")
    if r > s + 1:
        raise ValueError(f"{fn}: argument 'logits' must have s_range <= S+1 = {s + 1}, "
                         f"got shape {_v.shape_str(logits_shape)}")
    return b, s, t, r, c


def check_symbols_values(fn: str, symbols: np.ndarray, num_classes: int) -> None:
    """Every entry (padding included: k2 gathers them all) in [0, C)."""
    if symbols.size == 0:
        return
    bad = (symbols < 0) | (symbols >= num_classes)
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{fn}: argument 'symbols' must hold symbols in [0, {num_classes}), "
                         f"got {int(symbols[b, i])} at sequence {b}, position {i}")


def check_boundary_values(fn: str, boundary: np.ndarray, s: int, t: int, rnnt_type: str
                          ) -> None:
    """``0 <= s_begin <= s_end <= S``, ``0 <= t_begin <= t_end <= T`` and, for
    'modified'/'constrained', at most one symbol per frame (``s_end - s_begin <=
    t_end - t_begin``)."""
    for i, (sb, tb, se, te) in enumerate(np.asarray(boundary).tolist()):
        if not (0 <= sb <= se <= s and 0 <= tb <= te <= t):
            raise ValueError(
                f"{fn}: argument 'boundary' must hold rows [s_begin, t_begin, s_end, t_end] "
                f"with 0 <= s_begin <= s_end <= S = {s} and 0 <= t_begin <= t_end <= T = {t}, "
                f"got [{sb}, {tb}, {se}, {te}] at row {i}")
        if rnnt_type != "regular" and se - sb > te - tb:
            raise ValueError(
                f"{fn}: argument 'boundary' must have s_end - s_begin <= t_end - t_begin for "
                f"rnnt_type={rnnt_type!r} (one symbol per frame at most), got "
                f"[{sb}, {tb}, {se}, {te}] at row {i}")


def check_ranges_values(fn: str, ranges: np.ndarray, s: int) -> None:
    """Each row ``ranges[b, t]`` is ``r0, r0+1, ..., r0+s_range-1`` with
    ``0 <= r0 <= S + 1 - s_range`` (what `get_rnnt_prune_ranges` returns)."""
    if ranges.size == 0:
        return
    r = ranges.shape[2]
    start = ranges[:, :, :1]
    bad = np.any(ranges != start + np.arange(r), axis=2)
    if bad.any():
        b, t = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{fn}: argument 'ranges' must hold consecutive symbol positions "
                         f"r0, r0+1, ... in each row, got {ranges[b, t].tolist()} at "
                         f"sequence {b}, frame {t}")
    bad = (start[..., 0] < 0) | (start[..., 0] > s + 1 - r)
    if bad.any():
        b, t = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{fn}: argument 'ranges' must start each row in [0, S+1-s_range] = "
                         f"[0, {s + 1 - r}], got {int(start[b, t, 0])} at sequence {b}, "
                         f"frame {t}")


def check_prune_ranges_static(fn, px_shape, px_dtype, py_shape, py_dtype, b_shape, b_dtype,
                              s_range) -> Tuple[int, int, int, bool]:
    """Returns ``(B, S, T, is_regular)``."""
    _check_float(fn, "px_grad", px_shape, px_dtype, 3, "3-D (B, S, T+1) or (B, S, T)")
    _check_float(fn, "py_grad", py_shape, py_dtype, 3, "3-D (B, S+1, T)")
    b, s, t1 = _shape(px_shape)
    t = int(py_shape[2])
    if _shape(py_shape) != (b, s + 1, t) or t1 not in (t, t + 1):
        raise ValueError(f"{fn}: argument 'py_grad' must have shape (B, S+1, T) = "
                         f"({b}, {s + 1}, T) with px_grad of shape (B, S, T+1) or (B, S, T) "
                         f"(px_grad is {_v.shape_str(px_shape)}), got {_v.shape_str(py_shape)}")
    check_boundary_static(fn, b_shape, b_dtype, b)
    _v.check_int_scalar(fn, "s_range", s_range, 1)
    return b, s, t, t1 == t + 1


def prune_s_range(fn: str, s_range: int, s: int, is_regular: bool,
                  boundary: Optional[np.ndarray]) -> int:
    """k2's adjustment of ``s_range`` (with a warning, as k2 prints one).

    * regular: at least ``(s_end - 1) // t_end + 2`` (enough symbols per frame
      for the longest sequence to fit; needs the boundary values, so it is
      skipped when ``boundary`` is None, i.e. traced);
    * at most ``S + 1``;
    * at least 2 for regular (1 otherwise): a ``ValueError`` where k2 asserts.
    """
    if is_regular and boundary is not None and boundary.shape[0] > 0:
        ss = boundary[:, 2].astype(np.int64)
        ts = np.maximum(boundary[:, 3].astype(np.int64), 1)
        # torch's div(rounding_mode='trunc') truncates toward zero
        minimum = int(np.max(np.trunc((ss - 1) / ts).astype(np.int64) + 2))
        if s_range < minimum:
            warnings.warn(f"{fn}: got s_range={s_range} for boundaries S={ss.tolist()}, "
                          f"T={boundary[:, 3].tolist()}; adjusting to {minimum}", stacklevel=3)
            s_range = minimum
    if s_range > s:
        if s_range > s + 1:
            warnings.warn(f"{fn}: got s_range={s_range} for S={s}; adjusting to {s + 1}",
                          stacklevel=3)
        s_range = s + 1
    if is_regular and s_range < 2:
        raise ValueError(f"{fn}: argument 's_range' must be >= 2 for the regular transducer "
                         f"(no path survives pruning otherwise), got {s_range}")
    return s_range


def check_pruning_static(fn, am_shape, lm_shape, ranges_shape, ranges_dtype) -> None:
    _v.check_ndim(fn, "am", am_shape, (3,), "3-D (B, T, encoder_dim)")
    _v.check_ndim(fn, "lm", lm_shape, (3,), "3-D (B, S+1, decoder_dim)")
    _v.check_dtype(fn, "ranges", ranges_dtype, _v.INT_DTYPES, "an integer")
    b, t = int(am_shape[0]), int(am_shape[1])
    if len(ranges_shape) != 3 or _shape(ranges_shape[:2]) != (b, t):
        raise ValueError(f"{fn}: argument 'ranges' must have shape ({b}, {t}, s_range) "
                         f"(B, T of am), got {_v.shape_str(ranges_shape)}")
    if int(lm_shape[0]) != b:
        raise ValueError(f"{fn}: argument 'lm' must have shape ({b}, S+1, decoder_dim) "
                         f"(B of am), got {_v.shape_str(lm_shape)}")
