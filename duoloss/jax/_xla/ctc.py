r"""CTC in XLA: a ``lax.scan`` forward (alpha) and backward (beta) over the
gathered lattice, with a ``custom_vjp`` from the two.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``S`` padded target
positions, ``S' = 2S + 1`` extended states (blank, label 1, blank, label 2, ...).
The framework gathers ``lp[t, n, s] = log_probs[t, n, ext[n, s]]`` (``(T, N,
S')``; its transpose scatters the posteriors back to ``(T, N, C)``), then

.. math::

    \alpha_{t}(s) = lp_t(s) + \log\big(e^{\alpha_{t-1}(s)} + e^{\alpha_{t-1}(s-1)}
        + [\text{skip}_s]\, e^{\alpha_{t-1}(s-2)}\big), \qquad
    \hat\beta_{t}(s) = \log \sum_{s' \in \{s, s+1, s+2\}} e^{lp_{t+1}(s') + \hat\beta_{t+1}(s')},

``Z = \log(e^{\alpha_{L-1}(S'_n - 1)} + e^{\alpha_{L-1}(S'_n - 2)})`` with ``L`` the
input length and ``S'_n = 2 U_n + 1``; the loss is ``-Z`` and
``d loss / d lp_t(s) = -\exp(\alpha_t(s) + \hat\beta_t(s) - Z)`` (minus the
posterior of the state, as the core), formed as the core does: normalised by the
frame's own total ``\sum_s \exp(\alpha_t(s) + \hat\beta_t(s))`` (``= Z`` in exact
arithmetic) relative to the frame's best state, so that each frame's posteriors
sum to 1 even for raw scores of 1e100.  Both recursions are vectorised over
``(N, S')``; memory is the stored ``alpha`` ``(T, N, S')``.

NaN/inf policy as `duoloss.core.losses.ctc`: infeasible sequences get
``+inf`` (``0`` with ``zero_infinity``) and zero gradient; a NaN read by a
sequence makes that sequence's loss and gradient NaN only (padding frames,
padding states and unread classes are never mixed in: ``where``, not
arithmetic masks); ``-inf`` log-probabilities never give NaN.  Invalid labels
or lengths (possible only for traced values) give that sequence a NaN loss and
gradient, never an out-of-bounds read.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._adapter import _gradient
from .._sharding import mark_varying, varying_axes
from ._logsem import NEG_INF, lse2, lse3, shift_left, shift_right

__all__ = ["ctc_losses", "prepare"]

_NAME = "ctc_loss (impl='device')"


def prepare(log_probs, targets, input_lengths, target_lengths, blank: int):
    """What every device CTC path computes first (the XLA scan, the Pallas kernels):
    ``(lp, il, tl, valid, labels)`` -- the log-probabilities (half precision in
    float32), int32 lengths, whether each sequence's lengths and labels are in
    range, and its labels with the padding and invalid labels set to ``blank``."""
    t_max, _, n_cls = log_probs.shape
    s_max = targets.shape[1]
    dtype = log_probs.dtype
    lp_all = log_probs.astype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else log_probs
    tg = targets.astype(jnp.int32)
    il = input_lengths.astype(jnp.int32)
    tl = target_lengths.astype(jnp.int32)
    in_len = jnp.arange(s_max)[None, :] < tl[:, None]
    bad = in_len & ((tg < 0) | (tg >= n_cls) | (tg == blank))
    valid = ((il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= s_max) & ~bad.any(axis=1))
    labels = jnp.where(in_len & ~bad, tg, blank)
    return lp_all, il, tl, valid, labels


def ctc_losses(log_probs, targets, input_lengths, target_lengths, blank: int,
               zero_infinity: bool = False):
    """Per-sequence CTC losses ``(N,)`` on the device, differentiable w.r.t. ``log_probs``.

    Args:
      log_probs: ``(T, N, C)`` floating (half precision is computed in float32
        and returned in its dtype).
      targets: ``(N, S)`` padded integer targets.
      input_lengths, target_lengths: ``(N,)`` integers.
      blank: the blank class (a Python int in ``[0, C)``).
      zero_infinity: infeasible sequences get loss 0 (and zero gradient).
    """
    t_max, n, _ = log_probs.shape
    s_max = targets.shape[1]
    dtype = log_probs.dtype
    lp_all, il, tl, valid, labels = prepare(log_probs, targets, input_lengths,
                                            target_lengths, blank)
    ext = jnp.stack([jnp.full_like(labels, blank), labels], axis=2).reshape(n, 2 * s_max)
    ext = jnp.concatenate([ext, jnp.full((n, 1), blank, jnp.int32)], axis=1)   # (N, S')
    s_ext = 2 * s_max + 1
    # [:, :s_ext]: with every target empty (S' = 1) the two leading False are one too many
    skip = jnp.concatenate([jnp.zeros((n, 2), bool), ext[:, 2:] != ext[:, :-2]],
                           axis=1)[:, :s_ext]
    skip = skip & (jnp.arange(s_ext) % 2 == 1)[None]
    # the extended lattice: blank column (a slice: its transpose is cheap) interleaved with
    # the label columns (a gather whose transpose is _take_labels' own backward)
    lp_blank = jnp.broadcast_to(lp_all[:, :, blank][:, :, None], (t_max, n, s_max + 1))
    lp_lab = _take_labels(lp_all, labels)
    lp = jnp.stack([lp_blank[:, :, :s_max], lp_lab], axis=3).reshape(t_max, n, 2 * s_max)
    lp = jnp.concatenate([lp, lp_blank[:, :, s_max:]], axis=2)                  # (T, N, S')
    il_c = jnp.where(valid, il, 0)
    tl_c = jnp.where(valid, tl, 0)
    losses = _ctc_core(lp, skip, il_c, tl_c, valid, bool(zero_infinity))
    return losses.astype(dtype)


#: Up to this many classes the label gather's backward is a one-hot contraction (a
#: matmul: ``C`` multiply-adds per entry, fast everywhere); above, a scatter-add.
_ONE_HOT_MAX_CLASSES = 512


@jax.custom_vjp
def _take_labels(x, labels):
    """``x[t, n, labels[n, s]]``: ``(T, N, C), (N, S) -> (T, N, S)`` (labels in ``[0, C)``)."""
    return jnp.take_along_axis(x, jnp.broadcast_to(labels[None], (x.shape[0],) + labels.shape),
                               axis=2)


def _take_labels_fwd(x, labels):
    return _take_labels(x, labels), (labels, jnp.zeros((0, x.shape[2]), x.dtype))


def _take_labels_bwd(res, g):
    labels, tag = res                       # tag: x's dtype and class count, no data
    n_cls = tag.shape[1]
    if n_cls <= _ONE_HOT_MAX_CLASSES:
        onehot = jax.nn.one_hot(labels, n_cls, dtype=g.dtype)                  # (N, S, C)
        dx = jnp.einsum("tns,nsc->tnc", g, onehot, precision=jax.lax.Precision.HIGHEST)
    else:
        t_max, n = g.shape[:2]
        dx = jnp.zeros((t_max, n, n_cls), g.dtype).at[
            jnp.arange(t_max)[:, None, None], jnp.arange(n)[None, :, None],
            labels[None]].add(g)
    return dx.astype(tag.dtype), None


_take_labels.defvjp(_take_labels_fwd, _take_labels_bwd)


def _alpha(lp, skip, il, live):
    """Forward: stored alphas ``(T, N, S')`` (``-inf`` past each input length) and ``Z``."""
    t_max = lp.shape[0]
    state = jnp.arange(lp.shape[2])
    a0 = jnp.where((state[None] < 2) & live & (il[:, None] > 0), lp[0], NEG_INF)
    a0 = mark_varying(a0, varying_axes(lp, skip, il, live))   # a scan carry inside shard_map

    def step(a, xs):
        lp_t, t = xs
        new = lse3(a, shift_right(a, 1), jnp.where(skip, shift_right(a, 2), NEG_INF)) + lp_t
        new = jnp.where(live & (t < il)[:, None], new, NEG_INF)
        run = (t < il)[:, None]
        return jnp.where(run, new, a), new

    a_last, rest = jax.lax.scan(step, a0, (lp[1:], jnp.arange(1, t_max, dtype=jnp.int32)))
    alphas = jnp.concatenate([a0[None], rest], axis=0)
    return alphas, a_last


def _log_z(a_last, il, tl):
    last = 2 * tl                                  # index of the final blank
    end1 = jnp.take_along_axis(a_last, last[:, None], axis=1)[:, 0]
    end2 = jnp.take_along_axis(a_last, jnp.maximum(last - 1, 0)[:, None], axis=1)[:, 0]
    z = lse2(end1, jnp.where(tl > 0, end2, NEG_INF))
    # zero frames: the empty target has probability one, any other none
    return jnp.where(il == 0, jnp.where(tl == 0, 0.0, NEG_INF).astype(z.dtype), z)


def _beta(lp, skip, il, tl, live):
    """Backward: ``beta_hat (T, N, S')``, the log-probability of finishing from
    state ``s`` at frame ``t`` after ``lp_t(s)`` was emitted (``-inf`` past ``L``)."""
    n, s_ext = lp.shape[1:]
    state = jnp.arange(s_ext)[None]
    final = live & ((state == 2 * tl[:, None]) | (state == 2 * tl[:, None] - 1))
    init = jnp.where(final, 0.0, NEG_INF).astype(lp.dtype)
    skip_into = shift_left(skip, 2, False)          # s -> s + 2 allowed

    def step(c, xs):
        lp_t, t = xs                                # c = beta_hat[t + 1] + lp[t + 1]
        trans = lse3(c, shift_left(c, 1), jnp.where(skip_into, shift_left(c, 2), NEG_INF))
        last = (t == il - 1)[:, None]
        inner = (t < il - 1)[:, None]
        bh = jnp.where(last, init, jnp.where(inner & live, trans, NEG_INF))
        return bh + lp_t, bh

    c0 = mark_varying(jnp.full((n, s_ext), NEG_INF, lp.dtype), varying_axes(lp, skip, il, tl))
    _, bh = jax.lax.scan(step, c0, (lp, jnp.arange(lp.shape[0], dtype=jnp.int32)),
                         reverse=True)
    return bh


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _ctc_core(lp, skip, il, tl, valid, zero_infinity):
    return _ctc_fwd(lp, skip, il, tl, valid, zero_infinity)[0]


def _finish(z, valid, zero_infinity):
    loss = jnp.where(valid, -z, jnp.nan) + 0.0      # -0.0 -> 0.0
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), 0.0, loss)
    return loss


def _ctc_fwd(lp, skip, il, tl, valid, zero_infinity):
    live = jnp.arange(lp.shape[2])[None] < (2 * tl + 1)[:, None]
    if lp.shape[0] == 0:
        z = jnp.where(tl == 0, 0.0, NEG_INF).astype(lp.dtype)
        return _finish(z, valid, zero_infinity), (lp, skip, il, tl, valid, None, z)
    alphas, a_last = _alpha(lp, skip, il, live)
    z = _log_z(a_last, il, tl)
    return _finish(z, valid, zero_infinity), (lp, skip, il, tl, valid, alphas, z)


def _ctc_bwd(zero_infinity, res, g):
    lp, skip, il, tl, valid, alphas, z = res
    if alphas is None:
        return jnp.zeros_like(lp), None, None, None, None
    live = jnp.arange(lp.shape[2])[None] < (2 * tl + 1)[:, None]
    bh = _beta(lp, skip, il, tl, live)
    frames = jnp.arange(lp.shape[0])[:, None, None] < il[None, :, None]
    read = frames & live[None]
    use = ~(jnp.isinf(z) & (z < 0)) & valid        # infeasible: zero gradient
    # Posteriors normalised by each frame's own total (= Z in exact arithmetic),
    # relative to the frame's best state, as the core: in [0, 1] and summing to 1
    # even for raw scores of 1e100, where alpha + beta - log Z carries rounding
    # errors of ~1e84 (docs/numerics.md, "Large scores").
    ab = jnp.where(read, alphas + bh, NEG_INF)
    m = jnp.max(ab, axis=2, keepdims=True)
    e = jnp.exp(ab - jnp.where(jnp.isfinite(m), m, 0.0))
    total = jnp.sum(e, axis=2, keepdims=True)
    post = e / jnp.where(total > 0, total, 1.0)
    post = jnp.where(jnp.isnan(z)[None, :, None], jnp.nan, post)   # a NaN read: all of it
    grad = jnp.where(read & use[None, :, None], -post, 0.0)
    grad = jnp.where(valid[None, :, None], grad, jnp.nan).astype(lp.dtype)
    # scaled by the cotangent; differentiating it again raises (as on the host path)
    return _gradient(_NAME, 1, grad, lp, g.astype(lp.dtype)), None, None, None, None


_ctc_core.defvjp(_ctc_fwd, _ctc_bwd)
