"""Duration transducers for JAX: ``tdt_loss`` and ``multiblank_rnnt_loss``
(NeMo's semantics; same arguments and numbers as `duoloss.torch`).

Thin: argument checks (`duoloss.core.losses.tdt`), then the whole loss
and its gradient w.r.t. the logits in one host callback
(`duoloss.jax._adapter.apply_kernel`).
"""
from __future__ import annotations

from typing import Literal, Sequence

import jax
from jax.typing import ArrayLike

from duoloss.core.losses.tdt import (MULTIBLANK_KERNEL, TDT_KERNEL, check_duration_options,
                                     check_multiblank_args,
                                     check_tdt_args, durations_key)

from ._adapter import apply_kernel
from ._args import as_array, as_int_array, is_concrete, reduce_losses
from ._pallas import backend_for, check_impl
from ._xla.tdt import multiblank_losses as _device_multiblank
from ._xla.tdt import tdt_losses as _device_tdt

__all__ = ["tdt_loss", "multiblank_rnnt_loss"]


def _arrays(fn, logits, targets, logit_lengths, target_lengths):
    logits = as_array(fn, "logits", logits)
    targets = as_array(fn, "targets", targets)
    il = as_int_array(fn, "logit_lengths", logit_lengths)
    tl = as_int_array(fn, "target_lengths", target_lengths)
    return logits, targets, il, tl, is_concrete(targets, il, tl)


def tdt_loss(logits: ArrayLike, targets: ArrayLike, logit_lengths: ArrayLike,
             target_lengths: ArrayLike, blank: int, durations: Sequence[int], *,
             reduction: Literal["none", "sum", "mean"] = "mean", fastemit_lambda: float = 0.0,
             clamp: float = -1.0, sigma: float = 0.0, omega: float = 0.0,
             impl: str = "auto") -> jax.Array:
    r"""Token-and-Duration Transducer loss for JAX; see [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].

    Same arguments, maths and numbers as the torch function (one core), as a
    differentiable JAX function under ``jit``, ``grad`` and ``vmap``.
    ``logits`` ``(N, T, U + 1, V + D)``: ``V`` token logits (the blank among
    them), then ``D = len(durations)`` duration logits; with
    $\ell = \log\operatorname{softmax}(x_{:V}) - \sigma$ and
    $\delta = \log\operatorname{softmax}(x_{V:})$, a label move with
    duration $d_i$ goes ``(t, u) -> (t + d_i, u + 1)`` with weight
    $\ell(y_{u+1}) + \delta_i$, a blank move with $d_i > 0$ goes
    ``(t, u) -> (t + d_i, u)`` with weight $\ell(\varnothing) +
    \delta_i$, and paths end with a blank landing exactly on ``T_b``:

    $$
    \text{loss}_b = (1 + \lambda)\Big((1 - \omega)\big(-\log
    \textstyle\sum_{\text{paths}} e^{\sum w}\big) + \omega\,
    \text{rnnt}_b\Big).
    $$

    Args:
      logits: ``(N, T, U + 1, V + D)`` (halves run in float32).
      targets: ``(N, U)`` integer padded targets (never the blank).
      logit_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, U]``.
      blank: the blank among the ``V`` token classes (``-1`` is ``V - 1``).
      durations: distinct ints ``>= 0``, at least one positive.
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (batch mean).
      fastemit_lambda: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      clamp: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      sigma: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      omega: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss] (the expectation of NeMo's random choice).
      impl: ``'host'``: the numba core through one callback; ``'device'``:
        the loss and its gradient on the device, no callback (reduced there, so
        not bit-identical to the host path): the alpha/beta recursions as a Pallas
        kernel on a CUDA GPU or a TPU, as ``lax.scan`` elsewhere; ``'pallas'``
        / ``'xla'`` force either (``'pallas'`` on a CPU: interpreted, slow, for
        tests); ``'auto'`` (default): the device path for inputs on an
        accelerator, else the host.

    Returns:
      The reduced loss, or ``(N,)`` losses.

    NB: shapes and dtypes are validated at trace time, label and length values
    whenever concrete; under ``jit`` an invalid value makes that sequence's
    loss and gradient NaN (never an out-of-bounds read).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from duoloss.jax import tdt_loss
      >>> logits = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 3, 5 + 3))
      >>> targets = jnp.array([[1, 2], [3, 0]])
      >>> f = lambda x: tdt_loss(x, targets, (6, 4), (2, 1), blank=4, durations=[0, 1, 2])
      >>> grads = jax.jit(jax.grad(f))(logits)
      >>> import numpy as np
      >>> import duoloss.jax as d
      >>> logits = np.zeros((1, 2, 2, 3 + 2))  # (N, T, U + 1, V + D): uniform tokens (V=3) and durations [0, 1]
      >>> loss = d.tdt_loss(logits, np.array([[0]]), np.array([2]), np.array([1]), blank=2, durations=[0, 1])
      >>> round(float(loss), 4)  # 3 paths ('0'@d=0 ∅ ∅, '0'@d=1 ∅, ∅ '0'@d=0 ∅), each move 1/3 * 1/2: log 27
      3.2958

    References:
      Xu, Jia, Zhang, Hershey, Ginsburg, "Efficient Sequence Transduction by
      Jointly Predicting Tokens and Durations", ICML 2023, arXiv:2304.06795.
    """
    fn = "tdt_loss"
    check_duration_options(fn, reduction, clamp, fastemit_lambda, sigma, omega)
    check_impl(fn, impl)
    logits, targets, il, tl, concrete = _arrays(fn, logits, targets, logit_lengths,
                                                target_lengths)
    blank, durs = check_tdt_args(fn, logits, targets, il, tl, blank, durations,
                                 concrete=concrete)
    path = backend_for(fn, impl, logits, dtype=logits.dtype)
    if path != "host":  # on the device (duoloss/jax/_xla/tdt.py, _pallas/tdt.py), reduced in XLA
        return reduce_losses(_device_tdt(logits, targets, il.reshape(-1), tl.reshape(-1),
                                         blank=blank, durations=durs, sigma=sigma,
                                         fastemit_lambda=fastemit_lambda, clamp=clamp,
                                         omega=omega, path=path), reduction)
    # the reduction in the core (bit-identical to torch's; weights in the kernel's stores)
    return apply_kernel(TDT_KERNEL, (logits, targets, il.reshape(-1), tl.reshape(-1)),
                        reduction=reduction, blank=blank, durations=durations_key(durs),
                        sigma=float(sigma), fastemit_lambda=float(fastemit_lambda),
                        clamp=float(clamp), omega=float(omega))


def multiblank_rnnt_loss(logits: ArrayLike, targets: ArrayLike, logit_lengths: ArrayLike,
                         target_lengths: ArrayLike, blank: int, big_blank_durations: Sequence[int],
                         *, reduction: Literal["none", "sum", "mean"] = "mean",
                         fastemit_lambda: float = 0.0, clamp: float = -1.0, sigma: float = 0.0,
                         impl: str = "auto") -> jax.Array:
    r"""Multi-blank RNN-T loss for JAX; see [`duoloss.torch.multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].

    ``logits`` ``(N, T, U + 1, V)``, $\ell = \log\operatorname{softmax}(x)
    - \sigma$; the standard blank at ``blank`` (duration 1), big blank ``i`` at
    ``blank - 1 - i`` with duration ``big_blank_durations[i]``; labels move
    ``(t, u) -> (t, u + 1)``, a blank of duration ``d`` moves ``(t, u) -> (t + d,
    u)`` and the last blank lands exactly on ``T_b``:

    $$
    \text{loss}_b = -(1 + \lambda) \log \sum_{\text{paths}}
    e^{\sum_{\text{moves}} \ell_{t,u}(k)}.
    $$

    Args:
      logits: ``(N, T, U + 1, V)`` (halves run in float32).
      targets: ``(N, U)`` integer padded targets (never a blank or big blank).
      logit_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, U]``.
      blank: the standard blank (``-1`` is ``V - 1``).
      big_blank_durations: ints ``>= 1``.
      reduction: as in [`duoloss.torch.multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      fastemit_lambda: as in [`duoloss.torch.multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      clamp: as in [`duoloss.torch.multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      sigma: as in [`duoloss.torch.multiblank_rnnt_loss`][duoloss.torch.multiblank_rnnt_loss].
      impl: as in [`tdt_loss`][duoloss.jax.tdt_loss].

    Returns:
      The reduced loss, or ``(N,)`` losses.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from duoloss.jax import multiblank_rnnt_loss
      >>> logits = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 3, 7))
      >>> targets = jnp.array([[1, 2], [3, 0]])
      >>> loss = multiblank_rnnt_loss(logits, targets, (8, 5), (2, 1), blank=6,
      ...                             big_blank_durations=[2, 4])
      >>> import numpy as np
      >>> import duoloss.jax as d
      >>> logits = np.zeros((1, 2, 2, 4))  # (N, T, U + 1, V): uniform; blank 3, big blank 2 of duration 2
      >>> loss = d.multiblank_rnnt_loss(logits, np.array([[0]]), np.array([2]), np.array([1]), blank=3,
      ...                            big_blank_durations=[2])
      >>> round(float(loss), 4)  # '0' ∅ ∅, '0' big-∅, ∅ '0' ∅; each move 1/4: -log(2/64 + 1/16)
      2.3671

    References:
      Xu, Jia, Zhang, Hershey, Ginsburg, "Multi-blank Transducers for Speech
      Recognition", ICASSP 2023, arXiv:2211.03541.
    """
    fn = "multiblank_rnnt_loss"
    check_duration_options(fn, reduction, clamp, fastemit_lambda, sigma)
    check_impl(fn, impl)
    logits, targets, il, tl, concrete = _arrays(fn, logits, targets, logit_lengths,
                                                target_lengths)
    blank, big = check_multiblank_args(fn, logits, targets, il, tl, blank, big_blank_durations,
                                       concrete=concrete)
    path = backend_for(fn, impl, logits, dtype=logits.dtype)
    if path != "host":  # on the device (duoloss/jax/_xla/tdt.py, _pallas/tdt.py), reduced in XLA
        return reduce_losses(_device_multiblank(logits, targets, il.reshape(-1), tl.reshape(-1),
                                                blank=blank, big_blank_durations=big,
                                                sigma=sigma, fastemit_lambda=fastemit_lambda,
                                                clamp=clamp, path=path), reduction)
    return apply_kernel(MULTIBLANK_KERNEL, (logits, targets, il.reshape(-1), tl.reshape(-1)),
                        reduction=reduction, blank=blank, big_blank_durations=durations_key(big),
                        sigma=float(sigma), fastemit_lambda=float(fastemit_lambda),
                        clamp=float(clamp))
