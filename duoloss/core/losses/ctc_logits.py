r"""CTC from unnormalised scores: ``log_softmax`` and its backward on the host, beside
the CTC kernel (the host path of ``duoloss.jax.optax_ctc_loss``).

optax's ``ctc_loss`` takes logits ``(B, T, K)``, batch first.  Run as
``jax.nn.log_softmax``, a transpose to the CTC kernel's ``(T, B, K)``, the kernel, and
the way back, most of a jitted step on CPU was XLA's work around the callback (about
6 of 11 ms at (32, 500, 50, 100) on 2 cores): the log-softmax backward on a
transposed cotangent, the transposes and the operand copies.  Here one host call
does all of it:

.. math::

    \mathrm{lp}_{t,b,k} = x_{b,t,k} - m_{b,t} - \log \sum_j e^{x_{b,t,j} - m_{b,t}},
    \qquad m_{b,t} = \max_j x_{b,t,j},

then the CTC kernel (`duoloss.core.losses.ctc.ctc_loss_and_grad`) on ``lp``, whose
gradient ``G = d loss / d lp`` (``(T, B, K)``) goes back through the log-softmax:

.. math::

    \frac{\partial\, \mathrm{loss}}{\partial x_{b,t,k}} = G_{t,b,k}
    - e^{\mathrm{lp}_{t,b,k}} \sum_j G_{t,b,j},

written batch first.  Sums are float64 in a fixed lane order (the same bits on any
CPU); the exponentials are the joiner kernels' vectorised ones, kept from the forward
in the gradient's buffer (``softmax = e * scale`` per row), so the backward is one
pass without an exponential; the gradient's subnormals are flushed (as the CTC
kernel's own stores).  A row holding NaN or
``+inf``, or only ``-inf``, gives a NaN row (as ``jax.nn.log_softmax``).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .._pool import run_batch
from .._reduce import subnormal_free
from .._spec import LossKernel
from .ctc import ctc_loss_and_grad
from .joiner import _cast_like, _exp_nonpos, _unshifted_logs
from .transducer import _lane_sum

__all__ = ["CTC_LOGITS_KERNEL", "ctc_logits_loss_and_grad"]

#: Below this many logits a batch runs on the calling thread.
_PARALLEL_MIN = 100_000


#: Rows go through the exponentials in blocks of about this many logits (L1/L2-resident).
_BLOCK_ELEMS = 4096


@numba.njit(cache=True, nogil=True)
def _log_softmax_tbk(order, x, lp, keep, scale):
    """``lp[:, b, :] = log_softmax(x[b])`` for the sequences ``b`` in ``order``; with
    ``keep`` (``x``'s shape, else empty) also the softmax's numerators in ``keep[b]``
    and their scale in ``scale[b]`` (``softmax = keep * scale``), for the backward.

    Rows whose normaliser lies in the joiner's `_unshifted_range` take unshifted
    exponentials (one vectorised pass over a block of rows, float64 lane sums, one
    vectorised pass of logs; exact to the dtype's rounding there, see
    `duoloss.core.losses.joiner._forward_block`); the others (far from 0, NaN, inf)
    are shifted by their max first."""
    n_cls = x.shape[2]
    t_max = x.shape[1]
    per = max(1, _BLOCK_ELEMS // max(n_cls, 1))
    scratch = np.empty(per * n_cls, x.dtype)
    sums = np.empty(per)
    with_keep = keep.shape[0] > 0
    for i in range(order.shape[0]):
        b = order[i]
        xb = x[b].reshape(-1)
        for t0 in range(0, t_max, per):
            t1 = min(t0 + per, t_max)
            nb = t1 - t0
            xs = xb[t0 * n_cls:t1 * n_cls]
            e = keep[b].reshape(-1)[t0 * n_cls:t1 * n_cls] if with_keep else scratch
            _unshifted_logs(xs, nb, n_cls, e, sums)
            for r in range(nb):
                t = t0 + r
                row = x[b, t]
                ls = sums[r]
                er = e[r * n_cls:(r + 1) * n_cls]
                if ls != ls:  # outside the unshifted range: shifted by the max
                    m = row[0]
                    for k in range(1, n_cls):
                        v = row[k]
                        m = v if v > m else m
                    for k in range(n_cls):
                        er[k] = _exp_nonpos(row[k] - m)
                    sv = _lane_sum(er, n_cls)
                    ls = np.float64(m) + math.log(sv)
                    sc = 1.0 / sv
                else:
                    sc = math.exp(-ls)
                if with_keep:
                    scale[b, t] = sc
                o = lp[t, b]
                for k in range(n_cls):
                    o[k] = np.float64(row[k]) - ls


@numba.njit(cache=True, nogil=True)
def _log_softmax_vjp(order, g, scale, out):
    """``out[b] = g[:, b] - out[b] * scale[b] * sum_k g[:, b, k]`` in place (``out[b]``
    holds the forward's numerators: ``out * scale`` is the softmax), subnormals flushed
    to signed zero, for the sequences ``b`` in ``order``."""
    t_max, _, n_cls = g.shape
    tiny = _cast_like(out, 1.1754943508222875e-38 if out.itemsize == 4
                      else 2.2250738585072014e-308)
    for i in range(order.shape[0]):
        b = order[i]
        for t in range(t_max):
            gr = g[t, b]
            o = out[b, t]
            c = scale[b, t] * _lane_sum(gr, n_cls)
            for k in range(n_cls):
                v = np.float64(gr[k]) - np.float64(o[k]) * c
                o[k] = v
            for k in range(n_cls):
                v = o[k]
                o[k] = v * 0 if abs(v) < tiny else v


def ctc_logits_loss_and_grad(logits, targets, input_lengths, target_lengths, *, blank: int = 0,
                             want_grad: bool = True, grad_weights=None):
    """Per-sequence CTC losses of ``log_softmax(logits)`` and their gradient w.r.t.
    ``logits``.

    Args:
      logits: ``(B, T, K)`` float32/float64 unnormalised scores, batch first.
      targets, input_lengths, target_lengths, blank, want_grad, grad_weights: as
        `duoloss.core.losses.ctc.ctc_loss_and_grad` (``(B, S)`` padded targets).

    Returns:
      ``(losses, grad)``: ``(B,)`` losses in ``logits.dtype`` and the ``(B, T, K)``
      gradient (``None`` without ``want_grad``).
    """
    x = np.ascontiguousarray(logits)
    n, t_max, n_cls = x.shape
    want = bool(want_grad)
    lp = np.empty((t_max, n, n_cls), x.dtype)
    # with a gradient: the softmax's numerators wait in the gradient's buffer
    out = np.empty_like(x) if want else np.empty((0, 0, 0), x.dtype)
    scale = np.empty((n, t_max) if want else (0, 0))
    order = np.arange(n, dtype=np.int64)
    if x.size:
        run_batch(_log_softmax_tbk, order, x.size, _PARALLEL_MIN, (x, lp, out, scale))
    losses, g = ctc_loss_and_grad(lp, targets, input_lengths, target_lengths, blank=blank,
                                  want_grad=want, grad_weights=grad_weights)
    if not want:
        return losses, None
    if x.size:
        run_batch(_log_softmax_vjp, order, x.size, _PARALLEL_MIN, (g, scale, out))
    return losses, out


def _run(arrays, want_grad, *, blank=0, grad_weights=None):
    logits, targets, input_lengths, target_lengths = arrays
    losses, grad = ctc_logits_loss_and_grad(
        logits, targets, input_lengths, target_lengths, blank=blank,
        want_grad=bool(want_grad[0]), grad_weights=grad_weights)
    return losses, (grad, None, None, None)


subnormal_free(_run)

#: CTC of ``log_softmax(logits)`` for the frontends' adapters: arrays are
#: ``(logits (B,T,K), targets (B,S), input_lengths (B,), target_lengths (B,))``.
CTC_LOGITS_KERNEL = LossKernel(
    name="optax_ctc_loss",
    run=_run,
    batch_axes=(0, 0, 0, 0),
    differentiable=(True, False, False, False),
    weighted=True,
)
