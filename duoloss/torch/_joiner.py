"""The transducer normaliser on CPU tensors as two ``torch.library`` operators.

``duoloss::joiner_log_softmax_gather`` and its backward run
:mod:`duoloss.core.losses.joiner` on zero-copy views of CPU tensors: eager code,
``torch.func`` transforms (the vmap rules fold vmapped dimensions into the
rows: the kernels are row-wise) and ``torch.compile`` (fake rules) all run the
same kernels, so every path gives the same bits.  Tensors on other devices use
the framework formula in :mod:`duoloss.torch._rnnt`.

Shapes: ``x`` ``(..., V)``, every other tensor ``x.shape[:-1]``; ``labels``
int64 with the core's ``NO_LABEL``/``INACTIVE`` sentinels.
"""
from __future__ import annotations

from typing import Tuple

import torch

from duoloss.core.losses.joiner import (log_softmax_gather, log_softmax_gather_grad,
                                        transducer_log_probs, transducer_log_probs_grad)

__all__ = ["FORWARD_OP", "BACKWARD_OP", "LATTICE_OP", "LATTICE_BACKWARD_OP", "joiner_forward",
           "joiner_backward", "lattice_forward", "lattice_backward", "supported"]

FORWARD_OP = "duoloss::joiner_log_softmax_gather"
BACKWARD_OP = "duoloss::joiner_log_softmax_gather_backward"
LATTICE_OP = "duoloss::transducer_log_probs"
LATTICE_BACKWARD_OP = "duoloss::transducer_log_probs_backward"


def supported(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the operators (a CPU float32/float64 tensor)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def _view(t: torch.Tensor, shape) -> "object":
    return t.detach().contiguous().reshape(shape).numpy()


@torch.library.custom_op(FORWARD_OP, mutates_args=())
def joiner_forward(x: torch.Tensor, labels: torch.Tensor, blank: int
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(label, blank, lse)`` log-probabilities per row (``lse`` float64)."""
    n_cls = x.shape[-1]
    lab, blk, lse = log_softmax_gather(_view(x, (-1, n_cls)), _view(labels, -1), blank)
    shape = x.shape[:-1]
    return (torch.from_numpy(lab).reshape(shape), torch.from_numpy(blk).reshape(shape),
            torch.from_numpy(lse).reshape(shape))


@joiner_forward.register_fake
def _forward_fake(x, labels, blank):
    shape = x.shape[:-1]
    return (x.new_empty(shape), x.new_empty(shape), x.new_empty(shape, dtype=torch.float64))


@torch.library.custom_op(BACKWARD_OP, mutates_args=())
def joiner_backward(x: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
                    g_label: torch.Tensor, g_blank: torch.Tensor, blank: int) -> torch.Tensor:
    """The gradient w.r.t. ``x`` (see :func:`duoloss.core.losses.joiner.log_softmax_gather_grad`)."""
    n_cls = x.shape[-1]
    # numpy's allocator asks the kernel for transparent huge pages on large
    # buffers (torch's does only with THP_MEM_ALLOC_ENABLE=1): a fresh 1.5 GB
    # gradient costs ~0.2 s of page faults instead of ~1.1 s (measured, #11)
    out = log_softmax_gather_grad(_view(x, (-1, n_cls)), _view(lse, -1), _view(labels, -1),
                                  blank, _view(g_label, -1), _view(g_blank, -1))
    return torch.from_numpy(out).reshape(x.shape)


@joiner_backward.register_fake
def _backward_fake(x, lse, labels, g_label, g_blank, blank):
    return x.new_empty(x.shape)


def _batched(args, in_dims, size):
    """Every tensor with its vmapped dimension first (expanded where it had none)."""
    out = []
    for t, d in zip(args, in_dims):
        out.append(t.expand(size, *t.shape) if d is None else t.movedim(d, 0))
    return out


def _forward_vmap(info, in_dims, x, labels, blank):
    x, labels = _batched((x, labels), in_dims[:2], info.batch_size)
    return joiner_forward(x, labels, blank), (0, 0, 0)


def _backward_vmap(info, in_dims, x, lse, labels, g_label, g_blank, blank):
    args = _batched((x, lse, labels, g_label, g_blank), in_dims[:5], info.batch_size)
    return joiner_backward(*args, blank), 0


joiner_forward.register_vmap(_forward_vmap)
joiner_backward.register_vmap(_backward_vmap)


# --------------------------------------------------------------------------- #
# The whole RNN-T lattice in one operator pair (rnnt_loss on CPU tensors)      #
# --------------------------------------------------------------------------- #
@torch.library.custom_op(LATTICE_OP, mutates_args=())
def lattice_forward(x: torch.Tensor, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor,
                    blank: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(px (N, U, T + 1), py (N, U + 1, T), lse (N, T, U + 1))`` from ``x``
    ``(N, T, U + 1, V)`` (see :func:`duoloss.core.losses.joiner.transducer_log_probs`):
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
    """The gradient w.r.t. ``x`` of :func:`lattice_forward`'s ``px``/``py``."""
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
