"""Batch reductions, computed once, on the host, in a fixed order: the same bits everywhere.

Every frontend (``duoloss.torch``, ``duoloss.jax``) reduces per-sequence losses
with the functions here instead of its framework's own ``sum``/``mean``:
torch's and XLA's reductions pick their order and vector width per CPU, so two
frameworks (or one framework on two CPUs) can differ by an ulp on the same
losses.  Here:

* a reduction is a vector of per-sequence weights ``w`` (float64, computed in
  numpy: [`reduction_weights`][duoloss.core.reduction_weights]), and the reduced loss is
  ``sum_b w_b * loss_b``: each product rounded in float64, their sum
  *correctly rounded* (`math.fsum`, so independent of any order), then
  one rounding to the losses' dtype (`weighted_sum`);
* the gradient returned with it is the gradient of the reduced loss for a unit
  cotangent: a kernel that takes ``grad_weights`` (``LossKernel.weighted``)
  folds ``w_b`` into its own float64 stores; else each sequence's gradient is
  multiplied by ``w_b`` (in the gradient's dtype, elementwise); the
  per-sequence gradients of an input shared by all sequences are added
  sequentially, ``b = 0, 1, ..., N - 1`` ([`run_reduced`][duoloss.core.run_reduced]);
* subnormal gradient entries are flushed to zero, keeping their sign
  (`flush_subnormals`): XLA on CPU flushes subnormals, so a buffer must
  hold none for both frameworks to receive the same bits.  A kernel whose
  stores already flush (registered with `subnormal_free`, e.g. CTC's) skips
  that extra pass over its gradients.

A frontend's backward then only multiplies by the scalar cotangent ``g``: for
``g = 1`` (``loss.backward()``, ``jax.grad``) the bits are the core's.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

__all__ = ["REDUCTIONS", "flush_subnormals", "is_subnormal_free", "reduce_losses",
           "reduction_weights", "run_reduced", "run_weighted", "subnormal_free", "sum_weighted",
           "weighted_sum"]

#: The batch reductions the losses accept.
REDUCTIONS = ("none", "sum", "mean")


def reduction_weights(reduction: str, n: int, lengths: npt.ArrayLike | None = None, *,
                      k2_mean: bool = False) -> Optional[np.ndarray]:
    """Per-sequence weights ``w`` ``(n,)`` float64 of a batch reduction (None for ``'none'``).

    * ``'sum'``: ``w_b = 1``;
    * ``'mean'`` with ``lengths`` (torch's CTC convention):
      ``w_b = 1 / (n * max(lengths[b], 1))``, one correctly rounded division of
      an exact product;
    * ``'mean'`` without ``lengths`` (torchaudio's RNN-T, k2):
      ``w_b = 1 / n``.

    An empty batch (``n = 0``) has no weights; `weighted_sum` then gives
    0 (or NaN with ``k2_mean``, k2's ``mean`` of nothing).

    Args:
      reduction: ``'none'``, ``'sum'`` or ``'mean'``.
      n: the batch size ``N``.
      lengths: ``(n,)`` integer lengths (numpy or anything ``np.asarray`` takes), or None.
      k2_mean: accepted for symmetry with
        [`reduce_losses`][duoloss.core.reduce_losses] (k2's mean has weights ``1 / n``;
        pass no ``lengths``).
    """
    if reduction == "none":
        return None
    if reduction == "sum":
        return np.ones(n)
    if reduction != "mean":
        raise ValueError(f"reduction_weights: argument 'reduction' must be one of "
                         f"{REDUCTIONS}, got {reduction!r}")
    if n == 0:
        return np.zeros(0)
    if lengths is None:
        return np.full(n, 1.0 / n)
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != n:
        raise ValueError(f"reduction_weights: argument 'lengths' must have {n} entries, "
                         f"got {lengths.shape[0]}")
    if n <= 64 and lengths.dtype.kind in "iu":
        # (a training step's small batch: the same IEEE operations on Python floats, an
        # exact product of integers and one correctly rounded division, without numpy's
        # per-call cost)
        return np.array([1.0 / (n * float(max(v, 1))) for v in lengths.tolist()])
    return 1.0 / (n * np.maximum(lengths.astype(np.float64), 1.0))


def weighted_sum(losses: np.ndarray, weights: np.ndarray, *, k2_mean: bool = False,
                 dtype=None) -> np.ndarray:
    """``sum_b weights[b] * losses[b]`` as a 0-d array in ``dtype`` (default: the losses').

    Each product is rounded in float64 and the products are summed correctly
    rounded (`math.fsum`): the result does not depend on any summation
    order, vector width or thread count.  Non-finite products (an infinite or
    NaN loss) give the IEEE result of their sum (``inf``, ``-inf`` or NaN),
    which is order-independent too.  ``k2_mean`` and an empty batch: NaN.
    """
    dtype = np.dtype(losses.dtype if dtype is None else dtype)
    if k2_mean and losses.shape[0] == 0:
        return np.array(np.nan, dtype)
    # (Python floats: the same IEEE float64 products as numpy's, without its
    # per-call overhead on the small batches of a training step)
    terms = [x * w for x, w in zip(losses.reshape(-1).tolist(),
                                   np.asarray(weights, np.float64).reshape(-1).tolist())]
    try:
        # finite terms: correctly rounded; inf and NaN terms give the IEEE result
        # of their sum, which is order-independent
        return np.array(math.fsum(terms), dtype)
    except (OverflowError, ValueError):  # an exact sum beyond float64, or inf - inf
        pass
    total = 0.0
    for v in terms:  # sequential: inf/NaN results are order-independent
        total += v
    return np.array(total, dtype)


def reduce_losses(losses: np.ndarray, reduction: str, lengths: npt.ArrayLike | None = None, *,
                  k2_mean: bool = False) -> np.ndarray:
    """The reduced loss of per-sequence ``losses`` ``(N,)``: the one reduction of every frontend.

    ``'none'``: ``losses`` unchanged; ``'sum'``/``'mean'``:
    `weighted_sum` with [`reduction_weights`][duoloss.core.reduction_weights] (so ``'mean'`` with
    ``lengths`` is ``mean_b(loss_b / max(lengths_b, 1))``, without it
    ``sum_b loss_b / N``), a 0-d array in the losses' dtype.  The ``'mean'``
    of an empty batch is 0 (NaN with ``k2_mean``, as k2's functions).

    The gradient that goes with it: each sequence's gradient times
    ``reduction_weights(reduction, N, lengths)[b]`` (see [`run_reduced`][duoloss.core.run_reduced]
    for a [`LossKernel`][duoloss.core.LossKernel]).
    """
    if reduction == "none":
        return losses
    w = reduction_weights(reduction, losses.shape[0], lengths)
    return weighted_sum(losses, w, k2_mean=k2_mean and reduction == "mean")


def flush_subnormals(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """Subnormal entries of a floating array set to zero of the same sign, in place.

    XLA on CPU flushes subnormal results (FTZ/DAZ); the core hands the
    frontends buffers without subnormals so both receive the same bits.
    Returns ``a``.
    """
    if a is None or a.dtype.kind != "f" or a.size == 0:
        return a
    small = np.abs(a) < np.finfo(a.dtype).tiny
    if small.any():
        np.multiply(a, 0, out=a, where=small)  # -x * 0 = -0: the sign stays
    return a


# ``run`` functions of kernels whose gradient stores flush subnormals themselves.
_SUBNORMAL_FREE: set = set()


def subnormal_free(run: Callable) -> Callable:
    """Register a kernel's ``run`` as returning gradients without subnormals (its
    stores flush them, keeping the sign, as `flush_subnormals` would): the
    reductions then skip their pass over those gradients.  Returns ``run``."""
    _SUBNORMAL_FREE.add(run)
    return run


def is_subnormal_free(run: Callable, weighted: bool, weights) -> bool:
    """Whether the batched inputs' gradients of one `run_reduced` call of ``run``
    hold no subnormals without a flush: ``run`` is registered and no product is
    formed after its stores (no weights, or weights it folds in itself)."""
    return (weighted or weights is None) and run in _SUBNORMAL_FREE


def run_weighted(run: Callable, weighted: bool, batch_axes: Sequence[Optional[int]], arrays,
                 want, weights: np.ndarray, static: dict):
    """One core call whose gradients are weighted per sequence: ``(losses, grads)``.

    ``losses`` ``(N,)`` are unweighted.  A batched input's gradient is the
    gradient of ``sum_b w_b loss_b`` (``weights`` folded into the kernel's
    stores when the kernel is ``weighted``, else multiplied along the batch
    axis in the gradient's dtype); a shared input's ``(N, *shape)`` gradient
    holds ``w_b * d loss_b / d x`` in row ``b`` (sum them with
    `sum_weighted`).
    """
    if weighted:
        losses, grads = run(arrays, want, grad_weights=weights, **static)
        return losses, tuple(grads)
    losses, grads = run(arrays, want, **static)
    out = []
    for g, axis in zip(grads, batch_axes):
        if g is None:
            out.append(None)
            continue
        shape = [1] * g.ndim
        shape[0 if axis is None else axis] = -1
        g *= weights.astype(g.dtype).reshape(shape)  # the core's fresh buffer
        out.append(g)
    return losses, tuple(out)


def sum_weighted(losses: np.ndarray, grads, weights: np.ndarray,
                 batch_axes: Sequence[Optional[int]], *, k2_mean: bool = False,
                 flushed: bool = False):
    """``(sum_b w_b loss_b, gradients)`` from `run_weighted`'s outputs.

    The loss is `weighted_sum`; a shared input's rows are added in order
    ``b = 0, 1, ...`` (an empty batch: zeros); every gradient is
    `flush_subnormals`-ed (a batched input's one only when not ``flushed``
    already: `is_subnormal_free`).
    """
    out = []
    for g, axis in zip(grads, batch_axes):
        if g is not None and axis is None:
            acc = np.zeros(g.shape[1:], g.dtype)
            for b in range(g.shape[0]):
                acc += g[b]
            g = acc
        elif flushed:
            out.append(g)
            continue
        out.append(flush_subnormals(g))
    return weighted_sum(losses, weights, k2_mean=k2_mean), tuple(out)


def run_reduced(run: Callable, weighted: bool, batch_axes: Sequence[Optional[int]],
                arrays: Sequence[np.ndarray], want: Sequence[bool], weights: Optional[np.ndarray],
                static: dict, *, k2_mean: bool = False
                ) -> Tuple[np.ndarray, Tuple[Optional[np.ndarray], ...]]:
    """One core call of a loss, reduced: every frontend's forward.

    ``weights`` None: ``(losses (N,), per-sequence gradients)`` (the
    [`LossKernel`][duoloss.core.LossKernel] contract), subnormals flushed.  Else
    ``(sum_b w_b loss_b as a 0-d array in the losses' dtype, the gradients of
    that sum)``: `run_weighted` then `sum_weighted`.
    """
    flushed = is_subnormal_free(run, weighted, weights)
    if weights is None:
        losses, grads = run(arrays, want, **static)
        if flushed:
            return losses, tuple(g if axis is not None else flush_subnormals(g)
                                 for g, axis in zip(grads, batch_axes))
        return losses, tuple(flush_subnormals(g) for g in grads)
    losses, grads = run_weighted(run, weighted, batch_axes, arrays, want, weights, static)
    return sum_weighted(losses, grads, weights, batch_axes, k2_mean=k2_mean, flushed=flushed)
