"""One validation layer for every frontend.

Every public loss validates its arguments here *before* any kernel or host
callback runs, so torch, JAX and numpy users get the very same messages:
``"<function>: argument '<name>' must be <expected>, got <actual>"``.

The checks are split in two:

* *static* checks use only shapes and dtype names (``'float32'``,
  ``'int64'`` ...) and therefore also run on JAX tracers at trace time;
* *value* checks (label ranges, lengths) need concrete numpy arrays; they run
  eagerly in both frontends and are skipped for traced JAX values, where the
  kernels instead return NaN for an invalid sequence (see each loss's docs).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "HALF_DTYPES",
    "INT_DTYPES",
    "REDUCTIONS",
    "check_dtype",
    "check_ndim",
    "check_reduction",
    "IMPLS",
    "TORCH_IMPLS",
    "check_impl",
    "check_int_scalar",
    "check_int_type",
    "batch_first_hint",
    "check_lengths",
    "check_labels",
    "dtype_name",
    "int_list",
    "not_an_array",
]

# float16/bfloat16 are accepted by the frontends, which run the kernels on float32
# copies (computing in float64 inside) and return results in the input dtype.
HALF_DTYPES = ("float16", "bfloat16")
FLOAT_DTYPES = HALF_DTYPES + ("float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
REDUCTIONS = ("none", "mean", "sum")
#: Every ``impl`` word a frontend accepts.  The JAX frontend takes all of them
#: (``'xla'``/``'pallas'`` force one of its two device paths, see
#: `duoloss.jax._pallas.backend_for`); torch takes `TORCH_IMPLS`.
IMPLS = ("auto", "host", "device", "xla", "pallas")
#: The torch frontend's ``impl`` words (its one device path is Triton's).
TORCH_IMPLS = ("auto", "host", "device")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """Canonical name ('float32', 'int64', ...) of a numpy, torch or JAX dtype."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


def _dtype_name(dtype) -> str:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name == "bool":
        return "bool"
    try:
        return np.dtype(name).name
    except TypeError:
        return name


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_dtype(fn: str, arg: str, dtype, allowed: Sequence[str], what: str) -> str:
    """Raise ``TypeError`` unless ``dtype``'s name is in ``allowed``; return the name."""
    name = dtype_name(dtype)
    if name not in allowed:
        raise TypeError(
            f"{fn}: argument '{arg}' must have {what} dtype ({', '.join(allowed)}), got {name}"
        )
    return name


def check_ndim(fn: str, arg: str, shape, allowed: Iterable[int], layout: str) -> int:
    """Raise ``ValueError`` unless ``len(shape)`` is allowed; ``layout`` describes it."""
    allowed = tuple(allowed)
    if len(shape) not in allowed:
        raise ValueError(
            f"{fn}: argument '{arg}' must be {layout}, got shape {_fmt_shape(shape)}"
        )
    return len(shape)


def _check_choice(fn: str, arg: str, value, choices) -> str:
    """``value`` itself if it is one of the strings ``choices``, else a ``ValueError``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{fn}: argument '{arg}' must be one of {', '.join(repr(c) for c in choices)}, "
            f"got {value!r}"
        )
    return value


def check_reduction(fn: str, reduction) -> str:
    return _check_choice(fn, "reduction", reduction, REDUCTIONS)


def check_impl(fn: str, impl, accepted: Sequence[str] = TORCH_IMPLS) -> str:
    """``impl`` itself if it is one of ``accepted``, else a ``ValueError`` naming ``fn``.

    The default is torch's words; the JAX frontend passes `IMPLS`.  A JAX-only word
    given where only `TORCH_IMPLS` are accepted gets a message of its own."""
    if isinstance(impl, str) and impl in accepted:
        return impl
    if isinstance(impl, str) and impl in IMPLS and tuple(accepted) == TORCH_IMPLS:
        raise ValueError(f"{fn}: impl={impl!r} is a JAX-only choice; torch takes 'auto', "
                         f"'host' or 'device'")
    return _check_choice(fn, "impl", impl, accepted)


def check_int_scalar(fn: str, arg: str, value, lo: int, hi: Optional[int] = None) -> int:
    """A Python/numpy integer in ``[lo, hi)`` (``hi=None``: unbounded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got {type(value).__name__}")
    value = int(value)
    if value < lo or (hi is not None and value >= hi):
        rng = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: argument '{arg}' must be in {rng}, got {value}")
    return value


def check_int_type(fn: str, arg: str, value) -> int:
    """A Python/numpy integer (not a bool), any value: for constructor arguments
    whose range depends on inputs seen only at call time (e.g. ``blank = -1``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got {type(value).__name__}")
    return int(value)


def batch_first_hint(lp_shape, got: int, name: str = "log_probs") -> str:
    """A hint to append to a batch-size mismatch when ``name`` looks batch-first.

    ``lp_shape`` should be time-first ``(T, N, C)``; when another argument has
    ``got`` rows (or entries) where ``N = lp_shape[1]`` was due and ``got``
    equals ``lp_shape[0]`` instead, the likely cause is an ``(N, T, C)`` tensor
    (the layout of ``batch_first`` models and of ``optax.ctc_loss``).  Returns
    ``""`` otherwise.
    """
    if len(lp_shape) == 3 and int(got) == int(lp_shape[0]) != int(lp_shape[1]):
        return (f"; {name} of shape {_fmt_shape(lp_shape)} looks batch-first (N, T, C), "
                f"but it must be time-first (T, N, C): swap its first two axes "
                f"(torch: {name}.transpose(0, 1); JAX: jnp.swapaxes({name}, 0, 1))")
    return ""


def check_lengths(fn: str, arg: str, values: np.ndarray, hi: int, hi_what: str) -> None:
    """Every entry of ``values`` in ``[0, hi]``."""
    if values.size == 0:
        return
    bad = np.flatnonzero((values < 0) | (values > hi))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: argument '{arg}' must be in [0, {hi}] ({hi_what}), "
            f"got {int(values.flat[i])} at index {i}"
        )


def check_labels(
    fn: str,
    arg: str,
    labels: np.ndarray,
    lengths: np.ndarray,
    num_classes: int,
    forbidden: Optional[int] = None,
    forbidden_what: str = "",
) -> None:
    """Labels of each padded row ``labels[b, :lengths[b]]`` in ``[0, num_classes)``.

    ``forbidden`` (e.g. the blank index) may not appear inside a target.
    """
    if labels.size == 0:
        return
    s = labels.shape[1]
    valid = np.arange(s)[None, :] < lengths[:, None]
    lab = np.where(valid, labels, 0)
    bad = valid & ((lab < 0) | (lab >= num_classes))
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"{fn}: argument '{arg}' must hold labels in [0, {num_classes}), "
            f"got {int(labels[b, i])} at sequence {b}, position {i}"
        )
    if forbidden is not None:
        bad = valid & (lab == forbidden)
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(
                f"{fn}: argument '{arg}' must not contain {forbidden_what} ({forbidden}), "
                f"found at sequence {b}, position {i}"
            )


def int_list(fn: str, arg: str, values, array_name: str) -> np.ndarray:
    """A tuple/list of Python/numpy ints (lengths given as a sequence) as int64.

    ``array_name`` is the frontend's array type ('a torch.Tensor', 'a jax.Array'),
    so the message reads the same in both frontends but for that name.
    """
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
               for x in values):
        raise TypeError(f"{fn}: argument '{arg}' must be {array_name} or a tuple/list of ints, "
                        f"got a {type(values).__name__} with non-int entries")
    return np.asarray(values, np.int64).reshape(len(values))


def not_an_array(fn: str, arg: str, value, expected: str) -> TypeError:
    """The error for a non-array where ``expected`` (e.g. 'a torch.Tensor or None') was due."""
    return TypeError(f"{fn}: argument '{arg}' must be {expected}, got {type(value).__name__}")


def shape_str(shape: Tuple[int, ...]) -> str:
    return _fmt_shape(shape)
