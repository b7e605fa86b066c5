"""The RNN-T lattices on CPU tensors as two ``torch.library`` operators.

``duoloss::transducer_log_probs`` and its backward run
`duoloss.core.losses.joiner.transducer_log_probs` (the normaliser, the
gathers and the core's lattice layout in one pass) on zero-copy views of CPU
tensors: eager code, ``torch.func`` transforms (the vmap rules fold the vmapped
dimension into the batch) and ``torch.compile`` (fake rules) all run the same
kernels, so every path gives the same bits.  Tensors on other devices use the
framework formula in `duoloss.torch._rnnt`.

Shapes: ``x`` ``(N, T, U + 1, V)``, ``targets`` ``(N, U)``, lengths ``(N,)``,
``px`` ``(N, U, T + 1)``, ``py`` ``(N, U + 1, T)``, ``lse`` ``(N, T, U + 1)``.
"""
from __future__ import annotations

from typing import Tuple

import torch

from duoloss.core.losses.joiner import transducer_log_probs, transducer_log_probs_grad

__all__ = ["LATTICE_OP", "LATTICE_BACKWARD_OP", "lattice_forward", "lattice_backward",
           "supported"]

LATTICE_OP = "duoloss::transducer_log_probs"
LATTICE_BACKWARD_OP = "duoloss::transducer_log_probs_backward"


def supported(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the operators (a CPU float32/float64 tensor)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def _view(t: torch.Tensor, shape) -> "object":
    return t.detach().contiguous().reshape(shape).numpy()


def _batched(args, in_dims, size):
    """Every tensor with its vmapped dimension first (expanded where it had none)."""
    out = []
    for t, d in zip(args, in_dims):
        out.append(t.expand(size, *t.shape) if d is None else t.movedim(d, 0))
    return out


@torch.library.custom_op(LATTICE_OP, mutates_args=())
def lattice_forward(x: torch.Tensor, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor,
                    blank: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(px (N, U, T + 1), py (N, U + 1, T), lse (N, T, U + 1))`` from ``x``
    ``(N, T, U + 1, V)`` (see `duoloss.core.losses.joiner.transducer_log_probs`):
    the normaliser, the gathers, the transposes to the core's layout and the
    ``-inf`` past each sequence's frames in one pass."""
    px, py, lse = transducer_log_probs(_view(x, x.shape), _view(targets, targets.shape),
                                       _view(il, -1), _view(tl, -1), blank)
    return torch.from_numpy(px), torch.from_numpy(py), torch.from_numpy(lse)


@lattice_forward.register_fake
def _lattice_fake(x, targets, il, tl, blank):
    n, t_max, u1, _ = x.shape
    return (x.new_empty((n, u1 - 1, t_max + 1)), x.new_empty((n, u1, t_max)),
            x.new_empty((n, t_max, u1), dtype=torch.float64))


@torch.library.custom_op(LATTICE_BACKWARD_OP, mutates_args=())
def lattice_backward(x: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor,
                     il: torch.Tensor, tl: torch.Tensor, g_px: torch.Tensor, g_py: torch.Tensor,
                     blank: int) -> torch.Tensor:
    """The gradient w.r.t. ``x`` of `lattice_forward`'s ``px``/``py``."""
    out = transducer_log_probs_grad(_view(x, x.shape), _view(lse, lse.shape),
                                    _view(targets, targets.shape), _view(il, -1), _view(tl, -1),
                                    blank, _view(g_px, g_px.shape), _view(g_py, g_py.shape))
    return torch.from_numpy(out)


@lattice_backward.register_fake
def _lattice_backward_fake(x, lse, targets, il, tl, g_px, g_py, blank):
    return x.new_empty(x.shape)


def _fold(args, in_dims, size):
    """vmapped dimension first (expanded where there was none), folded into the batch."""
    return [t.reshape(-1, *t.shape[2:]) for t in _batched(args, in_dims, size)]


def _lattice_vmap(info, in_dims, x, targets, il, tl, blank):
    size = info.batch_size
    outs = lattice_forward(*_fold((x, targets, il, tl), in_dims[:4], size), blank)
    return tuple(o.reshape(size, -1, *o.shape[1:]) for o in outs), (0, 0, 0)


def _lattice_backward_vmap(info, in_dims, x, lse, targets, il, tl, g_px, g_py, blank):
    size = info.batch_size
    out = lattice_backward(*_fold((x, lse, targets, il, tl, g_px, g_py), in_dims[:7], size),
                           blank)
    return out.reshape(size, -1, *out.shape[1:]), 0


lattice_forward.register_vmap(_lattice_vmap)
lattice_backward.register_vmap(_lattice_backward_vmap)
