"""The contract between a core loss and the framework frontends.

A core loss is a plain function on numpy buffers.  A frontend (``duoloss.torch``,
``duoloss.jax``) only needs a `LossKernel` describing it to build an
autograd function / ``custom_vjp`` around it; no frontend knows the maths.

Conventions
-----------
* ``kernel.run(arrays, want_grad, **static)`` takes a tuple of numpy arrays (the
  loss's array arguments, in order) and a tuple of booleans (one per array: is
  its gradient wanted?) and returns ``(losses, grads)``:

  - ``losses``: ``(N,)`` array, one loss per sequence, in the dtype of the first
    floating input;
  - ``grads``: a tuple with one entry per array input: ``None`` where no
    gradient was asked for, else the gradient of *each sequence's own loss*:

    * input with a batch axis ``k`` (``batch_axes[i] == k``): same shape as the
      input; the slice at index ``b`` of axis ``k`` holds ``d losses[b] / d x``
      (sequences never share entries);
    * shared input (``batch_axes[i] is None``, e.g. a transition matrix):
      shape ``(N, *x.shape)``, entry ``b`` holds ``d losses[b] / d x``.

  With ``kernel.weighted``, ``run`` also takes ``grad_weights=w`` (an ``(N,)``
  float64 array, or ``None``) and returns every gradient for ``w[b] *
  losses[b]`` instead (the losses themselves stay unweighted): a frontend
  folds a batch reduction into the kernel's own stores instead of a pass over
  the gradients.

  A frontend's backward rule therefore only scales: the cotangent ``g`` of the
  ``(N,)`` losses is broadcast along the batch axis (per-sequence inputs) or
  contracted with the leading axis (shared inputs).
* ``run`` never raises for values that can only be known at run time (labels,
  lengths): an invalid sequence gets a NaN loss and NaN gradient.  Everything
  checkable up front is checked by the frontend *before* calling ``run`` with
  the validators in `duoloss.core._validate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

__all__ = ["LossKernel"]


@dataclass(frozen=True)
class LossKernel:
    """Description of one core loss for the frontends' generic adapters.

    Attributes:
      name: public name, used in error messages.
      run: ``run(arrays, want_grad, **static) -> (losses, grads)`` (see module doc).
      batch_axes: per array input, the axis that indexes the batch, or ``None``
        for an input shared by all sequences.
      differentiable: per array input, whether it can receive a gradient.
      weighted: ``run`` accepts ``grad_weights`` (see the module doc).
    """

    name: str
    run: Callable[..., Tuple[np.ndarray, Tuple[Optional[np.ndarray], ...]]]
    batch_axes: Tuple[Optional[int], ...]
    differentiable: Tuple[bool, ...]
    weighted: bool = False
