r"""The torch aligners on the inputs' device: Viterbi CTC and RNN-T alignment in
plain torch tensor operations (no Triton, no copy of the lattice to the host).

The same algorithms as the JAX device path (`duoloss.jax._xla.align`), written as
a Python loop over frames (CTC) or anti-diagonals (transducer) of vectorised
max-plus steps on ``(N, S')`` / ``(N, U + 1)`` tensors, with one-byte
back-pointers kept on the device and a reverse loop for the traceback.  They run
on any device (CUDA tensors under ``impl='auto'``; CPU tensors with
``impl='device'``, which is how the tests check them).

**CTC** (``T`` frames, ``N`` sequences, ``S' = 2S + 1`` extended states, ``lp_t(s)
= log_probs[t, n, ext[n, s]]``):

.. math::

    \delta_0(s) = lp_0(s), \qquad
    \delta_t(s) = lp_t(s) + \max\big(\delta_{t-1}(s),\ \delta_{t-1}(s-1),\
        [\text{skip}_s]\,\delta_{t-1}(s-2)\big)

inside the band ``max(0, S'_n - 2(L - t)) <= s <= min(S'_n - 1, 2t + 1)``, else
``-inf``; ``step_t(s)`` in ``{0: stay, 1: advance, 2: skip}`` is stored as
``(T, N, S')`` int8.  **Transducer**: ``v[i, j] = max(v[i, j-1] + py[i, j-1],
v[i-1, j] + px[i-1, j])`` over the anti-diagonals ``d = i + j``, one bool per cell
saying whether the core's backtrace takes the symbol move there.

**Identity with the host path**: the recursions accumulate in float64 for every
input dtype (as the numba core does, which then returns the input's dtype), with
the core's comparisons in the core's order (CTC: stay, then advance if strictly
greater, then skip if strictly greater, the final state ``2U`` over ``2U - 1`` on a
tie; transducer: ``cy >= cx`` keeps the blank move on the forward pass, the
backtrace takes the symbol move when ``cx >= cy`` and ``cx > -inf``; NaN
propagates), so labels, frames and scores equal the host's bit for bit on
float16/bfloat16/float32/float64 inputs.
"""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = ["ctc_viterbi", "transducer_viterbi_regular", "rnnt_tokens"]

_NEG_INF = float("-inf")


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` shifted ``k`` places right along the last axis, ``-inf`` filled."""
    if k >= x.shape[-1]:
        return torch.full_like(x, _NEG_INF)
    return torch.nn.functional.pad(x[..., :-k], (k, 0), value=_NEG_INF)


@torch.no_grad()
def ctc_viterbi(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor, blank: int
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(labels (N, T) int64, scores (N,) in log_probs' dtype)`` of the Viterbi CTC
    alignment, all on ``log_probs``' device.

    Args:
      log_probs: ``(T, N, C)`` floating tensor.
      targets: ``(N, S)`` padded int64 targets (validated: labels in ``[0, C)``,
        never ``blank``, on ``log_probs``' device).
      input_lengths, target_lengths: ``(N,)`` int64 tensors (validated).
      blank: the blank class.
    """
    t_max, n, _ = log_probs.shape
    s_max = targets.shape[1]
    s_ext = 2 * s_max + 1
    dev = log_probs.device
    il = input_lengths.to(dev, torch.int64)
    tl = target_lengths.to(dev, torch.int64)
    tg = targets.to(dev, torch.int64)
    used = torch.arange(s_max, device=dev)[None, :] < tl[:, None]
    labels = torch.where(used, tg, blank)
    ext = torch.stack([torch.full_like(labels, blank), labels], dim=2).reshape(n, 2 * s_max)
    ext = torch.cat([ext, torch.full((n, 1), blank, dtype=torch.int64, device=dev)], dim=1)
    idx = torch.arange(s_ext, device=dev)
    skip = (ext != torch.roll(ext, 2, dims=1)) & ((idx >= 2) & (idx % 2 == 1))[None]
    n_states = 2 * tl + 1
    states = idx[None, :]
    delta = torch.full((n, s_ext), _NEG_INF, dtype=torch.float64, device=dev)
    steps = torch.zeros((t_max, n, s_ext), dtype=torch.int8, device=dev)
    neg = torch.tensor(_NEG_INF, dtype=torch.float64, device=dev)
    for t in range(t_max):
        lp_t = torch.gather(log_probs[t], 1, ext).to(torch.float64)
        lo = torch.clamp(n_states - 2 * (il - t), min=0)[:, None]
        hi = torch.clamp(n_states - 1, max=2 * t + 1)[:, None]
        band = (states >= lo) & (states <= hi)
        adv = _shift_right(delta, 1)
        skp = torch.where(skip, _shift_right(delta, 2), neg)
        best, step = delta, torch.zeros((n, s_ext), dtype=torch.int8, device=dev)
        m = adv > best
        best, step = torch.where(m, adv, best), torch.where(m, 1, step).to(torch.int8)
        m = skp > best
        best, step = torch.where(m, skp, best), torch.where(m, 2, step).to(torch.int8)
        new = torch.where(band, lp_t if t == 0 else best + lp_t, neg)
        delta = torch.where((t < il)[:, None], new, delta)
        steps[t] = step
    rows = torch.arange(n, device=dev)
    end = n_states - 1
    prev = torch.clamp(end - 1, min=0)
    take_prev = (n_states > 1) & (delta[rows, prev] > delta[rows, end])
    s = torch.where(take_prev, prev, end)
    score = delta[rows, s]
    empty = torch.where(tl == 0, 0.0, _NEG_INF).to(torch.float64)
    score = torch.where(il == 0, empty, score)
    traced = (il > 0) & (score != _NEG_INF)
    out = torch.full((n, t_max), -1, dtype=torch.int64, device=dev)
    for t in range(t_max - 1, -1, -1):
        live = t < il
        out[:, t] = torch.where(live & traced, ext[rows, s], -1)
        back = torch.where(live & (t > 0), steps[t][rows, s].to(torch.int64), 0)
        s = s - back
    return out, score.to(log_probs.dtype)


@torch.no_grad()
def transducer_viterbi_regular(px: torch.Tensor, py: torch.Tensor, ub: torch.Tensor,
                               tb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Best path through a regular transducer lattice: ``(scores (N,) float64,
    frames (N, U) int64)`` as `duoloss.core.losses.transducer.transducer_viterbi`
    with boundaries ``(0, 0, U_b, T_b)``.

    Args:
      px: ``(N, U, T + 1)`` symbol moves; py: ``(N, U + 1, T)`` blank moves.
      ub, tb: ``(N,)`` int64 target and frame counts (validated).
    """
    n, u1, t_max = py.shape
    u_max = u1 - 1
    dev = py.device
    px = px.to(torch.float64)
    py = py.to(torch.float64)
    ub = ub.to(dev, torch.int64)
    tb = tb.to(dev, torch.int64)
    ii = torch.arange(u1, device=dev)[None, :]
    rows = torch.arange(n, device=dev)[:, None]
    flat = torch.arange(n, device=dev)
    n_levels = u_max + t_max + 1
    neg = torch.tensor(_NEG_INF, dtype=torch.float64, device=dev)
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=dev)
    end = ub + tb
    prev = torch.where(ii == 0, 0.0, _NEG_INF).to(torch.float64).expand(n, u1)
    score = torch.where(end == 0, 0.0, _NEG_INF).to(torch.float64)
    symbol = torch.zeros((max(n_levels - 1, 0), n, u1), dtype=torch.bool, device=dev)
    for d in range(1, n_levels):
        j = d - ii
        inside = (j >= 0) & (j <= tb[:, None]) & (ii <= ub[:, None])
        if t_max:
            py_d = py[rows, ii, torch.clamp(j - 1, 0, t_max - 1)]
        else:
            py_d = torch.full((n, u1), _NEG_INF, dtype=torch.float64, device=dev)
        if u_max:
            px_d = px[rows, torch.clamp(ii - 1, 0, u_max - 1), torch.clamp(j, 0, t_max)]
        else:
            px_d = torch.full((n, u1), _NEG_INF, dtype=torch.float64, device=dev)
        cy = torch.where(inside & (j > 0), prev + py_d, neg)
        cx = torch.where(inside & (ii > 0), _shift_right(prev, 1) + px_d, neg)
        best = torch.where(torch.isnan(cy) | torch.isnan(cx), nan, torch.where(cy >= cx, cy, cx))
        v = torch.where(inside, best, neg)
        score = torch.where(end == d, v[flat, ub], score)
        symbol[d - 1] = (ii > 0) & (cx >= cy) & (cx > _NEG_INF)
        prev = v
    traced = score > _NEG_INF                                      # NaN: False
    cols = torch.arange(u_max, device=dev)[None, :]
    frames = torch.full((n, u_max), -1, dtype=torch.int64, device=dev)
    i = ub.clone()
    for d in range(n_levels - 1, 0, -1):
        take = traced & (end >= d) & symbol[d - 1][flat, i]
        frames = torch.where(take[:, None] & (cols == (i - 1)[:, None]), (d - i)[:, None], frames)
        i = i - take.to(torch.int64)
    return score, frames


@torch.no_grad()
def rnnt_tokens(scores: torch.Tensor, frames: torch.Tensor, targets: torch.Tensor,
                logit_lengths: torch.Tensor, target_lengths: torch.Tensor, blank: int,
                t_max: int) -> torch.Tensor:
    """`duoloss.core.losses.transducer.rnnt_alignment` in torch: ``(N, T + U)`` int64
    tokens, for each frame ``t < T_b`` the labels with ``frames == t`` then one blank,
    then ``-1`` (all ``-1`` without a finite score).  Symbol ``s`` lands at ``s +
    frames[s]`` and frame ``t``'s blank at ``t + #{s < U_b: frames[s] <= t}``."""
    n, u_max = frames.shape
    dev = frames.device
    width = u_max + t_max
    ok = torch.isfinite(scores)
    ub = torch.where(ok, target_lengths.to(dev, torch.int64), 0)
    tb = torch.where(ok, logit_lengths.to(dev, torch.int64), 0)
    pos = torch.arange(u_max, device=dev)[None, :]
    sym = pos < ub[:, None]
    pos_s = torch.where(sym, pos + frames, width)
    t = torch.arange(t_max, device=dev)[None, :]
    before = ((frames[:, None, :] <= t[:, :, None]) & sym[:, None, :]).sum(dim=2)
    pos_b = torch.where(t < tb[:, None], t + before, width)
    out = torch.full((n, width + 1), -1, dtype=torch.int64, device=dev)   # last column: dropped
    out.scatter_(1, pos_s, targets[:, :u_max].to(dev, torch.int64))
    out.scatter_(1, pos_b, torch.full_like(pos_b, int(blank)))
    return out[:, :width]
