r"""k2's lattice builders and pruning, written once for every framework.

Every function takes the array namespace ``xp`` (`duoloss._xp._backend`)
first and arrays of that framework, already validated and coerced by the
frontend (``duoloss.torch._rnnt_k2``, ``duoloss.jax._rnnt_k2``); autograd (torch)
and tracing (JAX) flow through the operations.  Conventions are k2's: ``B``
batch, ``T`` frames, ``S`` symbols, ``C`` classes, ``boundary`` rows
``[s_begin, t_begin, s_end, t_end]``; ``px`` ``(B, S, T+1)`` ('regular') or
``(B, S, T)``, ``py`` ``(B, S+1, T)``.

* `simple_logprobs` — ``(px, py)`` of the additive joiner (optionally
  k2's LM-only / AM-only smoothing), before `finish_px`;
* `pruned_logprobs` — ``(px, py)`` of pruned joiner logits, before
  `finish_px`;
* `finish_px` — k2's tail: ``-inf`` at each regular sequence's ``t_end``,
  constrained's forced blank, the delay penalty;
* `prune_ranges` — k2's ``get_rnnt_prune_ranges`` after its ``s_range``
  adjustment;
* `do_pruning` — k2's ``do_rnnt_pruning``.
"""
from __future__ import annotations

__all__ = ["do_pruning", "finish_px", "prune_ranges", "pruned_logprobs", "simple_logprobs"]

_NINF = float("-inf")


def simple_logprobs(xp, lm, am, symbols, termination_symbol: int, rnnt_type: str,
                    scales=None):
    r"""``(px, py)`` of the joiner ``logits = am[:, :, None] + lm[:, None]``.

    .. math::
      \log Z_{b,s,t} = \log \sum_c \exp(am_{b,t,c} + lm_{b,s,c}), \quad
      px_{b,s,t} = am_{b,t,y_s} + lm_{b,s,y_s} - \log Z_{b,s,t}, \quad
      py_{b,s,t} = am_{b,t,\varnothing} + lm_{b,s,\varnothing} - \log Z_{b,s,t}

    ``log Z`` is a matrix product of ``exp(lm - max)`` and ``exp(am - max)``
    (no ``(B, T, S+1, C)`` array).  ``scales = (lm_only_scale, am_only_scale)``
    interpolates with k2's LM-only and AM-only (unigram) log-probabilities.
    'regular' appends k2's ``-inf`` frame ``T`` to ``px``.
    """
    b, s = symbols.shape
    symbols = xp.index(symbols)
    am_max = xp.stop_gradient(xp.amax(am, 2))  # (B, T, 1)
    lm_max = xp.stop_gradient(xp.amax(lm, 2))  # (B, S+1, 1)
    # an all -inf row would give nan; any finite shift works
    am_max = xp.where(xp.isfinite(am_max), am_max, xp.zeros_like(am_max))
    lm_max = xp.where(xp.isfinite(lm_max), lm_max, xp.zeros_like(lm_max))
    am_probs = xp.exp(am - am_max)
    lm_probs = xp.exp(lm - lm_max)
    tiny = xp.tiny(am)
    prod = xp.matmul(lm_probs, xp.swapaxes(am_probs, 1, 2))  # (B, S+1, T)
    log_z = xp.log(prod + tiny) + lm_max + xp.swapaxes(am_max, 1, 2)

    px_am = xp.take_along_axis(xp.swapaxes(am, 1, 2), symbols[:, :, None], 1)  # (B, S, T)
    px_lm = xp.take_along_axis(lm[:, :s], symbols[:, :, None], 2)  # (B, S, 1)
    px = px_am + px_lm - log_z[:, :s, :]
    py_am = am[:, None, :, termination_symbol]  # (B, 1, T)
    py_lm = lm[:, :, termination_symbol, None]  # (B, S+1, 1)
    py = py_am + py_lm - log_z
    if scales is not None:
        lm_scale, am_scale = scales
        # LM alone: lm's own softmax (no frame dependence)
        lm_sum = xp.sum(lm_probs, 2)  # (B, S+1, 1)
        lm_only_norm = xp.log(lm_sum) + lm_max
        # AM alone: am with the unigram (lm's softmax averaged over batch and
        # positions, padding included, as k2)
        unigram = xp.mean(lm_probs / lm_sum, (0, 1)) + tiny  # (C,)
        am_only_norm = (xp.log(xp.matmul(am_probs, unigram))[:, None, :]
                        + xp.swapaxes(am_max, 1, 2))  # (B, 1, T)
        log_unigram = xp.log(unigram)
        px_am_only = px_am + xp.take(log_unigram, symbols)[:, :, None] - am_only_norm
        px_lm_only = px_lm - lm_only_norm[:, :s]
        py_am_only = py_am + log_unigram[termination_symbol] - am_only_norm
        py_lm_only = py_lm - lm_only_norm
        combined = 1.0 - lm_scale - am_scale
        # k2: exact zeros would turn -inf * 0 into nan
        lm_scale = lm_scale if lm_scale != 0.0 else 1e-20
        am_scale = am_scale if am_scale != 0.0 else 1e-20
        px = px * combined + px_lm_only * lm_scale + px_am_only * am_scale
        py = py * combined + py_lm_only * lm_scale + py_am_only * am_scale
    if rnnt_type == "regular":
        px = xp.concat([px, xp.full((b, s, 1), _NINF, px)], 2)
    return px, py


def pruned_logprobs(xp, logits, symbols, ranges, termination_symbol: int, rnnt_type: str):
    """``(px, py)`` from pruned joiner logits ``(B, T, s_range, C)``.

    ``px[b, s, t] = log_softmax(logits[b, t, k])[symbols[b, s]]`` and ``py[b, s, t]
    = log_softmax(logits[b, t, k])[termination_symbol]`` where ``s = ranges[b, t,
    k]``; ``-inf`` outside each frame's range.  'regular' appends the ``-inf``
    frame ``T`` to ``px``.
    """
    b, t, _, _ = logits.shape
    s = symbols.shape[1]
    ranges = xp.index(ranges)
    symbols = xp.index(symbols)
    sym = xp.concat([symbols, xp.full((b, 1), termination_symbol, symbols)], 1)
    pruned_sym = xp.take_along_axis(sym[:, None, :], ranges, 2)  # (B, T, r)
    log_z = xp.logsumexp(logits, 3)  # (B, T, r)
    px_r = xp.take_along_axis(logits, pruned_sym[..., None], 3)[..., 0] - log_z
    py_r = logits[..., termination_symbol] - log_z
    # the frame's s_range values at their positions; -inf elsewhere
    ninf = xp.full((b, t, s + 1), _NINF, logits)
    px = xp.swapaxes(xp.put_along_axis(ninf, ranges, px_r, 2)[:, :, :s], 1, 2)  # (B, S, T)
    py = xp.swapaxes(xp.put_along_axis(ninf, ranges, py_r, 2), 1, 2)  # (B, S+1, T)
    if rnnt_type == "regular":
        px = xp.concat([px, xp.full((b, s, 1), _NINF, px)], 2)
    return xp.contiguous(px), xp.contiguous(py)


def finish_px(xp, px, py, boundary, rnnt_type: str, delay_penalty: float):
    """k2's tail on ``px``: 'regular' sets ``px[b, :, t_end[b]] = -inf`` (no symbol on
    a sequence's one-past-the-last frame), 'constrained' adds the forced blank
    ``py[:, 1:, :]``; then ``delay_penalty * ((t_end - 1) / 2 - t)`` on every
    symbol arc of frame ``t`` (when ``delay_penalty > 0``)."""
    b, _, t0 = px.shape
    if rnnt_type == "regular":
        col = xp.arange(t0, px)[None, None, :]
        px = xp.where(col == boundary[:, 3].reshape(b, 1, 1), _NINF, px)
    elif rnnt_type == "constrained":
        px = px + py[:, 1:, :]
    if delay_penalty > 0.0:
        offset = (xp.astype(boundary[:, 3], px) - 1) / 2
        penalty = offset.reshape(b, 1, 1) - xp.arange(t0, px, px)
        px = px + xp.astype(penalty * delay_penalty, px)
    return px


def prune_ranges(xp, px_grad, py_grad, boundary, s_range: int, regular: bool):
    """k2's pruning ranges ``(B, T, s_range)`` from the occupations (``s_range``
    already adjusted; see ``duoloss.core.losses.rnnt_k2.prune_s_range``).

    Per frame the window start maximising ``sum_{k<s_range} py_grad[r0+k, t] -
    px_grad[r0-1, t]``; frames from ``t_end - 1`` on take the last window; the
    starts are then made non-decreasing from 0, rising by less than ``s_range``
    (regular) or 2 per frame.
    """
    b, _, t1 = px_grad.shape
    s1 = py_grad.shape[1]
    t = py_grad.shape[2]
    n_win = s1 - s_range + 1
    blk = py_grad[:, 0:n_win, :]
    for k in range(1, s_range):
        blk = blk + py_grad[:, k:k + n_win, :]
    px_pad = xp.concat([xp.zeros_like(px_grad[:, :1, :]), px_grad], 1)
    final = blk - px_pad[:, :n_win, :t]
    s_begin = xp.argmax(final, 1)  # (B, T), first maximum
    bd = xp.astype(boundary, s_begin)
    frames = xp.arange(t, px_grad, s_begin)[None, :]
    mask = frames < (bd[:, 3:4] - 1)
    pad = xp.maximum(bd[:, 2:3] - s_range + 1, 0)
    s_begin = xp.where(mask, s_begin, pad)
    step = (s_range if regular else 2) - 1
    s_begin = xp.cummin_rev(s_begin)
    shifted = xp.maximum(xp.cummin_rev(step * frames - s_begin), 0)
    s_begin = step * frames - shifted
    return s_begin[:, :, None] + xp.arange(s_range, px_grad, s_begin)


def do_pruning(xp, am, lm, ranges):
    """``(am_pruned, lm_pruned)``, both ``(B, T, s_range, D)``: ``am[b, t]`` repeated
    (a broadcast view) and ``lm[b, ranges[b, t, k]]``."""
    b, t, r = ranges.shape
    d = lm.shape[2]
    am_pruned = xp.broadcast_to(am[:, :, None, :], (b, t, r, am.shape[2]))
    lm_pruned = xp.take_along_axis(lm, ranges.reshape(b, t * r, 1), 1).reshape(b, t, r, d)
    return am_pruned, lm_pruned
