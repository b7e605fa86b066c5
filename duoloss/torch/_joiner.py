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

from duoloss.core.losses.joiner import log_softmax_gather, log_softmax_gather_grad

__all__ = ["FORWARD_OP", "BACKWARD_OP", "joiner_forward", "joiner_backward", "supported"]

FORWARD_OP = "duoloss::joiner_log_softmax_gather"
BACKWARD_OP = "duoloss::joiner_log_softmax_gather_backward"


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
