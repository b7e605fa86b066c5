"""The pruned RNN-T lattice of the torch device path, in bounded memory.

`pruned_logprobs` computes what `duoloss._xp.k2.pruned_logprobs` computes -- ``px``
``(B, S, T [+1])`` and ``py`` ``(B, S + 1, T)`` from pruned joiner logits ``(B, T,
s_range, C)`` -- but the normalised gathers (``log_softmax(logits)`` at each position's
symbol and at the termination symbol) are one autograd node, `_NormalisedGathers`: the
forward keeps nothing beyond the logits (already alive) and the ``(B, T, s_range)``
normalisers, and takes ``logsumexp`` a quarter of the batch at a time; the backward
writes ``d loss / d logits = onehot(symbol) g_px + onehot(termination) g_py -
softmax(logits) (g_px + g_py)`` in place into the gradient's own buffer.  Composed by
autograd from ``logsumexp``, ``take_along_axis`` and indexing, the same gradient took
about three logits-sized temporaries (``benchmarks/device_memory.py``).
"""
from __future__ import annotations

import torch

__all__ = ["pruned_logprobs"]

_NEG = float("-inf")


def _logsumexp_chunked(x: torch.Tensor) -> torch.Tensor:
    """``torch.logsumexp(x, -1)`` a quarter of the batch at a time (each row's value as
    in one call; the ``exp`` temporary stays a fraction of ``x``)."""
    n = x.shape[0]
    if n <= 1:
        return torch.logsumexp(x, -1)
    step = -(-n // 4)
    return torch.cat([torch.logsumexp(c, -1) for c in x.split(step, 0)], 0)


class _NormalisedGathers(torch.autograd.Function):
    """``(logits[..., idx] - log_z, logits[..., term] - log_z)`` with ``log_z =
    logsumexp(logits, -1)``; ``idx`` ``(B, T, r)`` int64."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits, idx, term):
        log_z = _logsumexp_chunked(logits)
        px = torch.gather(logits, 3, idx[..., None])[..., 0] - log_z
        py = logits[..., term] - log_z
        return px, py, log_z

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, idx, term = inputs
        ctx.mark_non_differentiable(output[2])
        ctx.term = term
        ctx.save_for_backward(logits, idx, output[2])

    @staticmethod
    def backward(ctx, g_px, g_py, _unused):
        logits, idx, log_z = ctx.saved_tensors
        if g_px is None:
            g_px = torch.zeros_like(log_z)
        if g_py is None:
            g_py = torch.zeros_like(log_z)
        with torch.no_grad():
            g = torch.empty_like(logits, memory_format=torch.contiguous_format)
            g.copy_(logits).sub_(log_z[..., None]).exp_()
            g.mul_(-(g_px + g_py)[..., None])
            g.scatter_add_(3, idx[..., None], g_px[..., None])
            g[..., ctx.term].add_(g_py)
        if torch.is_grad_enabled():  # create_graph: differentiate the formula
            sm = torch.exp(logits - log_z[..., None])
            g = -(g_px + g_py)[..., None] * sm
            g = g.scatter_add(3, idx[..., None], g_px[..., None])
            g = g.index_add(3, torch.tensor([ctx.term], device=g.device), g_py[..., None])
        return g, None, None


def pruned_logprobs(logits, symbols, ranges, termination_symbol: int, rnnt_type: str):
    """``(px, py)`` as `duoloss._xp.k2.pruned_logprobs` (the same values), with the
    normalised gathers of `_NormalisedGathers`."""
    b, t, _, _ = logits.shape
    s = symbols.shape[1]
    ranges = ranges.to(torch.int64)
    symbols = symbols.to(torch.int64)
    sym = torch.cat([symbols, torch.full((b, 1), termination_symbol, dtype=torch.int64,
                                         device=symbols.device)], 1)
    pruned_sym = torch.take_along_dim(sym[:, None, :], ranges, 2)           # (B, T, r)
    px_r, py_r, _ = _NormalisedGathers.apply(logits, pruned_sym, int(termination_symbol))
    ninf = torch.full((b, t, s + 1), _NEG, dtype=logits.dtype, device=logits.device)
    px = ninf.scatter(2, ranges, px_r)[:, :, :s].transpose(1, 2)             # (B, S, T)
    py = ninf.scatter(2, ranges, py_r).transpose(1, 2)                       # (B, S+1, T)
    if rnnt_type == "regular":
        px = torch.cat([px, torch.full((b, s, 1), _NEG, dtype=px.dtype, device=px.device)], 2)
    return px.contiguous(), py.contiguous()
