"""k2 parity of the lattice builders ``get_rnnt_logprobs`` / ``get_rnnt_logprobs_pruned``.

k2's ``rnnt_loss_test.py`` asserts that the lattice ``(px, py)`` these functions
return, scored by the mutual-information recursion with the same ``boundary``,
equals the loss (``rnnt_loss_simple`` / ``rnnt_loss_pruned``).  That holds only
with k2's two final steps: 'regular' sets ``px[b, :, t_end[b]] = -inf`` and
'constrained' adds ``py[:, 1:, :]`` to ``px``.

References here are independent of duoloss: the recursion written out in float64
numpy from k2's docstring, and brute-force enumeration of every alignment
(``rnnt_reference.lattice_paths``) on a tiny lattice.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from rnnt_reference import lattice_paths

TYPES = ("regular", "modified", "constrained")


def mi_recursion(px, py, boundary, rnnt_type):
    """k2's recursion, float64 numpy: p[sb, tb] = 0 and
    p[s, t] = logaddexp(p[s-1, t'] + px[s-1, t'], p[s, t-1] + py[s, t-1]),
    t' = t (regular) or t - 1; returns -p[s_end, t_end] per sequence."""
    px, py = np.asarray(px, np.float64), np.asarray(py, np.float64)
    out = []
    for b, (sb, tb, se, te) in enumerate(np.asarray(boundary).tolist()):
        p = np.full((se + 1, te + 1), -np.inf)
        p[sb, tb] = 0.0
        for s in range(sb, se + 1):
            for t in range(tb, te + 1):
                if (s, t) == (sb, tb):
                    continue
                terms = []
                if s > sb:
                    if rnnt_type == "regular":
                        terms.append(p[s - 1, t] + px[b, s - 1, t])
                    elif t > tb:
                        terms.append(p[s - 1, t - 1] + px[b, s - 1, t - 1])
                if t > tb:
                    terms.append(p[s, t - 1] + py[b, s, t - 1])
                p[s, t] = np.logaddexp.reduce(terms) if terms else -np.inf
        out.append(-p[se, te])
    return np.array(out)


def _inputs(seed, B, T, S, C):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, T, C)), rng.standard_normal((B, S + 1, C)),
            rng.integers(1, C, (B, S)))


BOUNDARIES = {
    # the issue's reproducer: the second sequence is shorter than T
    "short": np.array([[0, 0, 3, 6], [0, 0, 2, 4]], np.int64),
    "full": np.array([[0, 0, 3, 6], [0, 0, 3, 6]], np.int64),
    "none": None,
}


def _t(x):
    return None if x is None else torch.from_numpy(np.asarray(x))


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("which", sorted(BOUNDARIES))
def test_recursion_on_logprobs_equals_simple_loss(rnnt_type, which):
    """k2's identity in torch and JAX (float64): recursion(get_rnnt_logprobs) ==
    rnnt_loss_simple, for short, full-length and default boundaries."""
    B, T, S, C = 2, 6, 3, 5
    am, lm, symbols = _inputs(0, B, T, S, C)
    bd = BOUNDARIES[which]
    bd_rows = bd if bd is not None else np.array([[0, 0, S, T]] * B)
    px, py = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, rnnt_type, _t(bd))
    want = dt.rnnt_loss_simple(_t(lm), _t(am), _t(symbols), 0, _t(bd), rnnt_type,
                               reduction="none").numpy()
    got = mi_recursion(px.numpy(), py.numpy(), bd_rows, rnnt_type)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with jax.enable_x64(True):
        jpx, jpy = dj.get_rnnt_logprobs(lm, am, symbols, 0, rnnt_type, bd)
        jwant = dj.rnnt_loss_simple(lm, am, symbols, 0, bd, rnnt_type, reduction="none")
        np.testing.assert_allclose(mi_recursion(jpx, jpy, bd_rows, rnnt_type), jwant,
                                   rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jpx), px.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jpy), py.numpy(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jwant), want, rtol=1e-12)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_logprobs_structure_like_k2(rnnt_type):
    """The two final steps themselves: -inf at each regular sequence's t_end and at
    frame T (nowhere else on finite inputs), constrained = modified + py[:, 1:]."""
    B, T, S, C = 2, 6, 3, 5
    am, lm, symbols = _inputs(1, B, T, S, C)
    bd = _t(BOUNDARIES["short"])
    px, py = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, rnnt_type, bd)
    if rnnt_type == "regular":
        assert px.shape == (B, S, T + 1)
        inf = torch.isneginf(px)
        # column T (k2's padding frame) for all, and each sequence's own t_end
        assert inf[:, :, T].all() and inf[1, :, 4].all()
        assert inf.sum() == 3 * S  # nowhere else
    else:
        assert px.shape == (B, S, T)
        assert torch.isfinite(px).all()
    if rnnt_type == "constrained":
        mpx, mpy = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, "modified", bd)
        torch.testing.assert_close(px, mpx + mpy[:, 1:, :], rtol=0, atol=0)
        torch.testing.assert_close(py, mpy, rtol=0, atol=0)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_logprobs_scored_by_brute_force(rnnt_type):
    """Independent of both the recursion and the loss: every alignment of a tiny
    lattice scored from log_softmax(am + lm) (constrained: plus the forced blank of
    the next context on the same frame) equals the recursion on get_rnnt_logprobs."""
    B, T, S, C = 2, 3, 2, 4
    am, lm, symbols = _inputs(2, B, T, S, C)
    bd = np.array([[0, 0, 2, 3], [0, 0, 1, 2]], np.int64)
    px, py = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, rnnt_type, _t(bd))
    got = mi_recursion(px.numpy(), py.numpy(), bd, rnnt_type)
    for b, (_, _, se, te) in enumerate(bd.tolist()):
        z = am[b][:, None, :] + lm[b][None, :, :]  # (T, S+1, C)
        lp = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
        if rnnt_type == "regular":
            paths = lattice_paths(se, te, modified=False, last_is_blank=True)
        else:
            paths = lattice_paths(se, te, modified=True)
        scores = []
        for path in paths:
            total = 0.0
            for kind, s, t in path:
                if kind == "x":
                    total += lp[t, s, symbols[b, s]]
                    if rnnt_type == "constrained":
                        total += lp[t, s + 1, 0]
                else:
                    total += lp[t, s, 0]
            scores.append(total)
        np.testing.assert_allclose(got[b], -np.logaddexp.reduce(scores), rtol=1e-12)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_recursion_on_pruned_logprobs_equals_pruned_loss(rnnt_type):
    """The same identity for get_rnnt_logprobs_pruned / rnnt_loss_pruned (torch, JAX)."""
    B, T, S, C, r = 2, 6, 3, 5, 2
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((B, T, r, C))
    symbols = rng.integers(1, C, (B, S))
    bd = BOUNDARIES["short"]
    # a valid monotone range per frame: start rises by at most one per frame
    start = np.minimum(np.arange(T) // 2, S + 1 - r)
    ranges = np.broadcast_to(start[None, :, None] + np.arange(r), (B, T, r)).copy()
    px, py = dt.get_rnnt_logprobs_pruned(_t(logits), _t(symbols), _t(ranges), 0, _t(bd),
                                         rnnt_type)
    want = dt.rnnt_loss_pruned(_t(logits), _t(symbols), _t(ranges), 0, _t(bd), rnnt_type,
                               reduction="none").numpy()
    np.testing.assert_allclose(mi_recursion(px.numpy(), py.numpy(), bd, rnnt_type), want,
                               rtol=1e-12)
    assert np.isfinite(want).all()
    with jax.enable_x64(True):
        jpx, jpy = dj.get_rnnt_logprobs_pruned(logits, symbols, ranges, 0, bd, rnnt_type)
        np.testing.assert_allclose(np.asarray(jpx), px.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jpy), py.numpy(), rtol=1e-12)


def test_issue_reproducer_float32_x64_off():
    """The issue's numbers with float32 inputs and jax_enable_x64 off: the recursion on
    the returned lattice equals the loss in both frontends (float32 rounding)."""
    B, T, S, C = 2, 6, 3, 5
    am, lm, symbols = (x.astype(np.float32) if x.dtype.kind == "f" else x
                       for x in _inputs(0, B, T, S, C))
    bd = BOUNDARIES["short"]
    with jax.enable_x64(False):
        for rnnt_type in ("regular", "constrained"):
            jpx, jpy = dj.get_rnnt_logprobs(lm, am, symbols, 0, rnnt_type, bd)
            want = dj.rnnt_loss_simple(lm, am, symbols, 0, bd, rnnt_type, reduction="none")
            np.testing.assert_allclose(mi_recursion(jpx, jpy, bd, rnnt_type), want,
                                       rtol=1e-5)
            px, py = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, rnnt_type, _t(bd))
            np.testing.assert_allclose(mi_recursion(px.numpy(), py.numpy(), bd, rnnt_type),
                                       want, rtol=1e-5)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_recursion_on_smoothed_logprobs_equals_smoothed_loss(rnnt_type):
    """k2's get_rnnt_logprobs_smoothed: the identity with rnnt_loss_smoothed (torch, JAX),
    and zero scales reduce it to get_rnnt_logprobs up to k2's 1e-20 stand-in scales."""
    B, T, S, C = 2, 6, 3, 5
    am, lm, symbols = _inputs(4, B, T, S, C)
    bd = BOUNDARIES["short"]
    px, py = dt.get_rnnt_logprobs_smoothed(_t(lm), _t(am), _t(symbols), 0, 0.2, 0.1, _t(bd),
                                           rnnt_type)
    want = dt.rnnt_loss_smoothed(_t(lm), _t(am), _t(symbols), 0, 0.2, 0.1, _t(bd), rnnt_type,
                                 reduction="none").numpy()
    np.testing.assert_allclose(mi_recursion(px.numpy(), py.numpy(), bd, rnnt_type), want,
                               rtol=1e-12)
    with jax.enable_x64(True):
        jpx, jpy = dj.get_rnnt_logprobs_smoothed(lm, am, symbols, 0, 0.2, 0.1, bd, rnnt_type)
        np.testing.assert_allclose(np.asarray(jpx), px.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jpy), py.numpy(), rtol=1e-12)
    zpx, zpy = dt.get_rnnt_logprobs_smoothed(_t(lm), _t(am), _t(symbols), 0, 0.0, 0.0, _t(bd),
                                             rnnt_type)
    rpx, rpy = dt.get_rnnt_logprobs(_t(lm), _t(am), _t(symbols), 0, rnnt_type, _t(bd))
    torch.testing.assert_close(zpx, rpx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(zpy, rpy, rtol=1e-12, atol=1e-12)
