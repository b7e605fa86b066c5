r"""Viterbi CTC forced alignment in XLA: a max-plus ``lax.scan`` over frames that
stores one-byte back-pointers, then a reverse scan for the traceback.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``S`` padded target
positions, ``S' = 2S + 1`` extended states (blank, label 1, blank, ...).  With
``lp_t(s) = log_probs[t, n, ext[n, s]]`` gathered as in `.ctc`,

.. math::

    \delta_0(s) = lp_0(s), \qquad
    \delta_t(s) = lp_t(s) + \max\big(\delta_{t-1}(s),\ \delta_{t-1}(s-1),\
        [\text{skip}_s]\,\delta_{t-1}(s-2)\big),

every cell outside the frame's band ``max(0, S'_n - 2(L - t)) <= s <=
min(S'_n - 1, 2t + 1)`` set to ``-inf`` (``L`` the input length, ``S'_n = 2
U_n + 1``), exactly the trellis of `duoloss.core.losses.ctc._ctc_trellis_forward`
in the tropical semiring.  The forward keeps the ``(N, S')`` row as carry and
stores which predecessor won, ``step_t(s)`` in ``{0: stay, 1: advance, 2: skip}``
(``(T, N, S')`` int8); the reverse scan walks ``s <- s - step_t(s)`` from the best
final state.  Memory: ``T N S'`` bytes of back-pointers.  Each function is
jitted (one compile per shape, also for eager calls).

**Bit-identity with the host path** (`duoloss.core.losses.align.ctc_align`):
the same comparisons in the same order (``stay``, then ``advance`` if strictly
greater, then ``skip`` if strictly greater: ties go to the higher state, NaN is
never picked over a number; the final state ``2U`` wins a tie over ``2U - 1``),
so the labels are the host's; the sums are the host's in float64 whenever
``jax_enable_x64`` is on (the core accumulates in float64 and returns the input's
dtype), so scores are then bit-identical too.  With ``jax_enable_x64`` off the
recursion runs in float32: scores agree to float32 rounding, and two paths whose
float64 sums differ by less than that rounding may be ordered differently.

Special cases as the core: invalid labels or lengths (traced values only) give
score NaN and labels ``-1``; ``L = 0`` gives score ``0`` (``U = 0``) or
``-inf``; an infeasible sequence (score ``-inf``) gets labels ``-1``; a NaN
score keeps its traced path; frames at or past ``L`` are ``-1``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ._logsem import NEG_INF, shift_right

__all__ = ["ctc_viterbi", "transducer_viterbi_regular"]


@functools.partial(jax.jit, static_argnames=("blank", "index_dtype"))
def ctc_viterbi(log_probs, targets, input_lengths, target_lengths, blank: int, index_dtype):
    """``(labels (N, T), scores (N,))`` of the Viterbi CTC alignment on the device.

    Args:
      log_probs: ``(T, N, C)`` floating.
      targets: ``(N, S)`` padded integer targets.
      input_lengths, target_lengths: ``(N,)`` integers.
      blank: the blank class (a Python int in ``[0, C)``).
      index_dtype: the labels' dtype.

    Returns:
      labels in ``index_dtype`` and scores in ``log_probs``' dtype (see the module
      docstring).
    """
    t_max, n, n_cls = log_probs.shape
    s_max = targets.shape[1]
    s_ext = 2 * s_max + 1
    out_dtype = log_probs.dtype
    work = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    tg = targets.astype(jnp.int32)
    il = input_lengths.astype(jnp.int32)
    tl = target_lengths.astype(jnp.int32)
    used = jnp.arange(s_max)[None, :] < tl[:, None]
    bad = used & ((tg < 0) | (tg >= n_cls) | (tg == blank))
    valid = (il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= s_max) & ~bad.any(axis=1)
    labels = jnp.where(used & ~bad, tg, blank)
    ext = jnp.stack([jnp.full_like(labels, blank), labels], axis=2).reshape(n, 2 * s_max)
    ext = jnp.concatenate([ext, jnp.full((n, 1), blank, jnp.int32)], axis=1)   # (N, S')
    idx = jnp.arange(s_ext)
    skip = (ext != jnp.roll(ext, 2, axis=1)) & ((idx >= 2) & (idx % 2 == 1))[None]
    il_c = jnp.where(valid, il, 0)
    tl_c = jnp.where(valid, tl, 0)
    n_states = 2 * tl_c + 1                                                    # (N,)
    lp = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (t_max, n, s_ext)),
                             axis=2).astype(work)                              # (T, N, S')
    states = idx[None, :]

    def forward(delta, xs):
        t, lp_t = xs
        lo = jnp.maximum(0, n_states - 2 * (il_c - t))[:, None]
        hi = jnp.minimum(n_states - 1, 2 * t + 1)[:, None]
        band = (states >= lo) & (states <= hi)
        adv = shift_right(delta, 1)
        skp = jnp.where(skip, shift_right(delta, 2), NEG_INF)
        best, step = delta, jnp.zeros(delta.shape, jnp.int8)
        m = adv > best
        best, step = jnp.where(m, adv, best), jnp.where(m, jnp.int8(1), step)
        m = skp > best
        best, step = jnp.where(m, skp, best), jnp.where(m, jnp.int8(2), step)
        new = jnp.where(band, jnp.where(t == 0, lp_t, best + lp_t), NEG_INF)
        live = (t < il_c)[:, None]
        return jnp.where(live, new, delta), step

    init = jnp.full((n, s_ext), NEG_INF, work)
    last, steps = lax.scan(forward, init, (jnp.arange(t_max, dtype=jnp.int32), lp))
    rows = jnp.arange(n)
    end = n_states - 1
    prev = jnp.maximum(end - 1, 0)
    take_prev = (n_states > 1) & (last[rows, prev] > last[rows, end])
    s_final = jnp.where(take_prev, prev, end)
    score = last[rows, s_final]
    score = jnp.where(il_c == 0, jnp.where(tl_c == 0, 0.0, NEG_INF).astype(work), score)
    score = jnp.where(valid, score, jnp.nan)
    traced = valid & (il_c > 0) & (score != NEG_INF)

    def backward(s, xs):
        t, step_t = xs
        live = t < il_c
        lab = jnp.where(live & traced, ext[rows, s], -1)
        back = jnp.where(live & (t > 0), step_t[rows, s].astype(jnp.int32), 0)
        return s - back, lab

    _, frame_labels = lax.scan(backward, s_final.astype(jnp.int32),
                               (jnp.arange(t_max, dtype=jnp.int32), steps), reverse=True)
    return frame_labels.T.astype(index_dtype), score.astype(out_dtype)


@jax.jit
def transducer_viterbi_regular(px, py, boundary):
    r"""Best path through a regular transducer lattice on the device: ``(scores (N,),
    frames (N, U))`` as `duoloss.core.losses.transducer.transducer_viterbi` with
    boundaries ``(0, 0, U_b, T_b)`` (``(0, 0, -1, -1)`` marks an invalid sequence).

    The tropical table ``v[i, j] = max(v[i, j-1] + py[i, j-1], v[i-1, j] + px[i-1, j])``
    (NaN propagating, the ``py`` term first, as the core) runs over the anti-diagonals
    ``d = i + j`` with the ``(N, U+1)`` diagonal as carry; each cell stores whether the
    core's backtrace would take the symbol move there (``cx >= cy`` and ``cx > -inf``:
    ties go to the symbol), and a reverse scan over the diagonals walks that choice
    from ``(U_b, T_b)`` writing ``frames[i - 1] = j`` on each symbol move.  Scores in
    float64 under ``jax_enable_x64`` (bit-identical to the core), else float32.

    Args:
      px: ``(N, U, T + 1)`` symbol moves; py: ``(N, U + 1, T)`` blank moves.
      boundary: ``(N, 4)`` integers.
    """
    n, u1, t_max = py.shape
    u_max = u1 - 1
    work = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    px = px.astype(work)
    py = py.astype(work)
    bd = boundary.astype(jnp.int32)
    valid = ((bd[:, 0] == 0) & (bd[:, 1] == 0) & (bd[:, 2] >= 0) & (bd[:, 2] <= u_max)
             & (bd[:, 3] >= 0) & (bd[:, 3] <= t_max))
    ub = jnp.where(valid, bd[:, 2], 0)
    tb = jnp.where(valid, bd[:, 3], 0)
    ii = jnp.arange(u1)[None, :]                                   # (1, U+1)
    rows = jnp.arange(n)[:, None]
    n_levels = u_max + t_max + 1

    def cell_moves(d, prev):
        """``(cx, cy, inside)`` at level ``d`` from the level ``d - 1`` diagonal."""
        j = d - ii
        inside = (j >= 0) & (j <= tb[:, None]) & (ii <= ub[:, None])
        py_d = py[rows, ii, jnp.clip(j - 1, 0, max(t_max - 1, 0))] if t_max else \
            jnp.full((n, u1), NEG_INF, work)
        px_d = px[rows, jnp.clip(ii - 1, 0, max(u_max - 1, 0)), jnp.clip(j, 0, t_max)] \
            if u_max else jnp.full((n, u1), NEG_INF, work)
        cy = jnp.where(inside & (j > 0), prev + py_d, NEG_INF)
        cx = jnp.where(inside & (ii > 0), shift_right(prev, 1) + px_d, NEG_INF)
        return cx, cy, inside

    end = ub + tb                                                  # the last level
    v0 = jnp.broadcast_to(jnp.where(ii == 0, 0.0, NEG_INF).astype(work), (n, u1))

    def forward(carry, d):
        prev, score = carry
        cx, cy, inside = cell_moves(d, prev)
        best = jnp.where(jnp.isnan(cy) | jnp.isnan(cx), jnp.nan, jnp.where(cy >= cx, cy, cx))
        v = jnp.where(inside, best, NEG_INF)
        score = jnp.where(d == end, v[jnp.arange(n), ub], score)
        return (v, score), (ii > 0) & (cx >= cy) & (cx > NEG_INF)

    score0 = jnp.where(end == 0, 0.0, NEG_INF).astype(work)
    levels = jnp.arange(1, n_levels, dtype=jnp.int32)
    (_, score), symbol = lax.scan(forward, (v0, score0), levels)  # symbol: (L-1, N, U+1)
    score = jnp.where(valid, score, jnp.nan)
    traced = valid & (score > NEG_INF)                              # NaN: False
    cols = jnp.arange(u_max)[None, :]

    def backward(carry, xs):
        i, frames = carry
        d, sym_d = xs
        live = traced & (d <= end)
        take = live & sym_d[jnp.arange(n), i]
        frames = jnp.where(take[:, None] & (cols == (i - 1)[:, None]), (d - i)[:, None], frames)
        return (i - take.astype(jnp.int32), frames), None

    frames0 = jnp.full((n, u_max), -1, jnp.int32)
    (_, frames), _ = lax.scan(backward, (ub, frames0), (levels, symbol), reverse=True)
    return score, frames


@functools.partial(jax.jit, static_argnames=("blank", "t_max"))
def rnnt_tokens(scores, frames, targets, logit_lengths, target_lengths, blank: int, t_max: int):
    """`duoloss.core.losses.transducer.rnnt_alignment` in jnp: ``(N, T + U)`` tokens, for
    each frame ``t < T_b`` the labels with ``frames == t`` then one blank, then ``-1``
    (all ``-1`` without a finite score).  Symbol ``s`` lands at ``s + frames[s]`` and
    frame ``t``'s blank at ``t + #{s < U_b: frames[s] <= t}``."""
    n, u_max = frames.shape
    width = u_max + t_max
    ok = jnp.isfinite(scores)
    ub = jnp.where(ok, target_lengths.astype(jnp.int32), 0)
    tb = jnp.where(ok, logit_lengths.astype(jnp.int32), 0)
    rows = jnp.arange(n)[:, None]
    sym = jnp.arange(u_max)[None, :] < ub[:, None]
    pos_s = jnp.where(sym, jnp.arange(u_max)[None, :] + frames, width)
    t = jnp.arange(t_max)[None, :]
    before = ((frames[:, None, :] <= t[:, :, None]) & sym[:, None, :]).sum(axis=2)
    pos_b = jnp.where(t < tb[:, None], t + before, width)
    out = jnp.full((n, width), -1, jnp.int32)
    out = out.at[rows, pos_s].set(targets.astype(jnp.int32), mode="drop")
    return out.at[rows, pos_b].set(jnp.int32(blank), mode="drop")
