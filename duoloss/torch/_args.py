"""Argument coercion and validation shared by every torch frontend.

A frontend checks its arguments here, at the boundary, before any kernel runs:
tensor types, bools, devices, integer lengths in the forms ``F.ctc_loss``
accepts (a tensor, a tuple/list of ints or of 0-d integer tensors, an int or a
0-d tensor for a batch of one), and the traced forms of the same when the
values cannot be read on the host (``torch.compile`` tracing, a
``torch.func.vmap`` over them: `duoloss.torch._adapter.is_concrete`).
The messages name the function, the argument, what was expected and what came
(``tests/bad_inputs.py`` pins them); the value checks of each loss live in its
core module (`duoloss.core._validate` and the loss's ``check_*``).
"""
from __future__ import annotations

import numpy as np
import torch

from duoloss.core import _validate as _v
from duoloss.core.losses.graph_loss import PackedGraphs

from ._adapter import check_not_torchscript, to_numpy
from ._private import transforms_active

__all__ = ["check_bool", "check_same_device", "check_tensor", "host_graphs", "int_array",
           "int_lengths", "int_tensor", "padded_targets_traced", "per_sequence",
           "host_ints", "read_ints_together", "read_together_applies"]

#: The integer dtypes `read_ints_together` reads (anything else takes the separate
#: reads, whose validation names the argument and its dtype).
_INT_DTYPES = {torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
               torch.int32: np.int32, torch.int64: np.int64}


def read_together_applies(device: torch.device, xs) -> bool:
    """Whether the validation may read the integer tensors ``xs`` (targets and
    lengths) in one copy (`read_ints_together`): all of them integer tensors on
    ``device``, an accelerator, outside ``torch.func`` transforms."""
    return (device.type != "cpu" and not transforms_active()
            and all(isinstance(x, torch.Tensor) and x.device == device
                    and x.dtype in _INT_DTYPES for x in xs))


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of ``x`` in row-major order, 1-D: a view where ``x`` is contiguous
    (the 1-D lengths as they are: no reshape op), else a contiguous copy first (a
    strided row such as ``lengths[::2]`` has no byte view)."""
    if not x.is_contiguous():
        x = x.contiguous()
    if x.dim() != 1:
        x = x.reshape(-1)
    return x.view(torch.uint8)


def read_ints_together(xs) -> tuple:
    """The host values of the integer tensors ``xs`` as numpy arrays of their shapes
    and dtypes (the same arrays as one `to_numpy` each), read in one device-to-host
    copy of their bytes: one synchronisation where one read each made ``len(xs)``."""
    flat = torch.cat([_bytes(x) for x in xs]).cpu().numpy()
    out, at = [], 0
    for x in xs:
        dt = np.dtype(_INT_DTYPES[x.dtype])
        nb = x.numel() * dt.itemsize
        out.append(np.frombuffer(flat[at:at + nb].tobytes(), dt).reshape(tuple(x.shape)).copy())
        at += nb
    return tuple(out)


def check_tensor(fn: str, arg: str, x, optional: bool = False):
    """``x`` itself if it is a ``torch.Tensor`` (or None when ``optional``), else a TypeError."""
    if x is None and optional:
        return x
    if not isinstance(x, torch.Tensor):
        raise _v.not_an_array(fn, arg, x,
                              "a torch.Tensor or None" if optional else "a torch.Tensor")
    return x


def check_bool(fn: str, arg: str, x) -> bool:
    """``bool(x)`` for a Python or numpy bool, else a TypeError."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument '{arg}' must be a bool, got {type(x).__name__}")
    return bool(x)


def check_same_device(fn: str, ref_arg: str, ref: torch.Tensor, **others) -> None:
    """Every tensor in ``others`` (None skipped) on the device of ``ref``."""
    for arg, x in others.items():
        if x is not None and x.device != ref.device:
            raise ValueError(f"{fn}: argument '{arg}' must be on the device of '{ref_arg}' "
                             f"({ref.device}), got {x.device}")


def _ints_of(x):
    """A tuple/list of lengths with 0-d integer tensors (``F.ctc_loss`` accepts them,
    e.g. ``(torch.tensor(5),)``) turned into ints; anything else unchanged."""
    if any(isinstance(v, torch.Tensor) for v in x):
        out = [int(v) if isinstance(v, torch.Tensor) and v.dim() == 0
               and not v.is_floating_point() and not v.is_complex()
               and v.dtype != torch.bool else v for v in x]
        return tuple(out) if isinstance(x, tuple) else out
    return x


def per_sequence(x, data: torch.Tensor, batch_dim: int = 1):
    """Lengths given as a scalar (a 0-d tensor or array, an int) for a batch of
    ``N = 1`` (``F.ctc_loss`` accepts them): as a ``(1,)`` array; else unchanged."""
    if data.dim() == 3 and data.shape[batch_dim] == 1 and x.ndim == 0:
        return x.reshape(1)
    return x


def int_array(fn: str, arg: str, x) -> np.ndarray:
    """Lengths as a host array: a tensor, a numpy array, an int or a tuple/list of ints
    (or of 0-d integer tensors).  The dtype and shape are the caller's to check."""
    check_not_torchscript(fn)
    if isinstance(x, torch.Tensor):
        return to_numpy(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return np.asarray(x, np.int64)
    if isinstance(x, (list, tuple)):
        return _v.int_list(fn, arg, _ints_of(x), "a torch.Tensor")
    if isinstance(x, np.ndarray):
        return x
    raise _v.not_an_array(fn, arg, x, "a torch.Tensor or a tuple/list of ints")


def int_tensor(fn: str, arg: str, x, device) -> torch.Tensor:
    """Lengths as a tensor, without reading tensor values on the host (the traced
    path: ``torch.compile``, ``torch.func.vmap``): a tensor unchanged, ints and
    tuples/lists of ints or of 0-d tensors as an int64 tensor on ``device``."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return torch.tensor(int(x), dtype=torch.int64, device=device)
    if isinstance(x, (list, tuple)):
        if any(isinstance(v, torch.Tensor) for v in x) and all(
                isinstance(v, torch.Tensor) and v.dim() == 0 for v in x):
            return torch.stack(list(x)).to(device)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in x):
            raise TypeError(f"{fn}: argument '{arg}' must be a tensor or a tuple/list of ints, "
                            f"got a {type(x).__name__} with non-int entries")
        return torch.tensor([int(v) for v in x], dtype=torch.int64, device=device)
    if isinstance(x, np.ndarray):
        return torch.as_tensor(x, device=device)
    raise TypeError(f"{fn}: argument '{arg}' must be a tensor or a tuple/list of ints, "
                    f"got {type(x).__name__}")


def int_lengths(fn: str, arg: str, x, data: torch.Tensor, traced: bool = False):
    """Per-sequence lengths for the ``(T, N, ...)`` input ``data``: a host array
    (`int_array`), or with ``traced`` a tensor on ``data``'s device
    (`int_tensor`); a scalar becomes ``(1,)`` when ``N = 1``."""
    if traced:
        return per_sequence(int_tensor(fn, arg, x, data.device), data)
    return per_sequence(int_array(fn, arg, x), data)


def padded_targets_traced(targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """1-D concatenated targets as ``(N, S)`` padded ones in torch ops, for values
    that cannot be read: padded to the static bound ``S = targets.numel()``."""
    s = targets.shape[0]
    offsets = torch.cumsum(target_lengths, 0) - target_lengths
    pos = torch.arange(s, device=targets.device)
    idx = offsets[:, None] + pos[None, :]
    valid = pos[None, :] < target_lengths[:, None]
    if s == 0:
        return idx
    return torch.where(valid, targets[idx.clamp(0, s - 1)], torch.zeros_like(idx))


def host_graphs(graphs):
    """A `PackedGraphs` of tensors -> of numpy arrays; anything else unchanged."""
    if isinstance(graphs, PackedGraphs):
        return PackedGraphs(*(to_numpy(x) if isinstance(x, torch.Tensor) else np.asarray(x)
                              for x in graphs))
    return graphs


def host_ints(fn: str, targets, logit_lengths, target_lengths, device: bool,
              dev: torch.device) -> tuple:
    """``(targets, logit_lengths, target_lengths)`` as host arrays for a transducer
    loss's validation: with ``device`` and all three integer tensors on the
    accelerator ``dev``, one device-to-host copy (`read_ints_together`); else one
    read each (`int_array`, `to_numpy`: their errors name the argument)."""
    ints = (targets, logit_lengths, target_lengths)
    if device and read_together_applies(dev, ints):
        return read_ints_together(ints)
    il = int_array(fn, "logit_lengths", logit_lengths)
    tl = int_array(fn, "target_lengths", target_lengths)
    return to_numpy(targets), il, tl
