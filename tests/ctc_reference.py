"""Independent CTC references for the tests (plain numpy/itertools, float64).

Nothing here calls duoloss: these are the definitions written out directly.
"""
from __future__ import annotations

import itertools

import numpy as np


def collapse(path, blank):
    """CTC's many-to-one map: merge repeats, then drop blanks."""
    out = []
    prev = None
    for k in path:
        if k != prev and k != blank:
            out.append(int(k))
        prev = k
    return tuple(out)


def brute_force_ctc(logp, target, blank=0):
    """Loss and d loss / d logp by enumerating all C**T frame-label paths.

    logp: (T, C) float64 scores.  Returns (loss, grad (T, C)); loss is +inf and
    grad 0 when no path collapses to the target.
    """
    t_len, n_cls = logp.shape
    target = tuple(int(y) for y in target)
    scores = []
    paths = []
    for path in itertools.product(range(n_cls), repeat=t_len):
        if collapse(path, blank) == target:
            paths.append(path)
            scores.append(sum(logp[t, k] for t, k in enumerate(path)))
    grad = np.zeros_like(logp)
    if not paths:
        return np.inf, grad
    scores = np.array(scores)
    m = scores.max()
    if m == -np.inf:
        return np.inf, grad
    w = np.exp(scores - m)
    z = w.sum()
    for path, wi in zip(paths, w):
        for t, k in enumerate(path):
            grad[t, k] -= wi / z
    return -(m + np.log(z)), grad


def _lse(*xs):
    xs = np.array(xs, dtype=np.float64)
    m = xs.max()
    if m == -np.inf:
        return -np.inf
    return m + np.log(np.exp(xs - m).sum())


def log_space_ctc(logp, target, blank=0):
    """Textbook log-space alpha/beta CTC in float64 (loss, grad (T, C)).

    Written independently of duoloss (no rescaling, no windows, no fallbacks).
    """
    logp = np.asarray(logp, np.float64)
    t_len, n_cls = logp.shape
    ext = [blank]
    for y in target:
        ext += [int(y), blank]
    s_n = len(ext)
    neg = -np.inf

    def can_skip(s):
        return s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]

    alpha = np.full((t_len, s_n), neg)
    if t_len == 0:
        return (0.0 if not len(target) else np.inf), np.zeros_like(logp)
    alpha[0, 0] = logp[0, ext[0]]
    if s_n > 1:
        alpha[0, 1] = logp[0, ext[1]]
    for t in range(1, t_len):
        for s in range(s_n):
            terms = [alpha[t - 1, s]]
            if s >= 1:
                terms.append(alpha[t - 1, s - 1])
            if can_skip(s):
                terms.append(alpha[t - 1, s - 2])
            alpha[t, s] = _lse(*terms) + logp[t, ext[s]]
    beta = np.full((t_len, s_n), neg)
    beta[-1, -1] = logp[-1, ext[-1]]
    if s_n > 1:
        beta[-1, -2] = logp[-1, ext[-2]]
    for t in range(t_len - 2, -1, -1):
        for s in range(s_n):
            terms = [beta[t + 1, s]]
            if s + 1 < s_n:
                terms.append(beta[t + 1, s + 1])
            if s + 2 < s_n and can_skip(s + 2):
                terms.append(beta[t + 1, s + 2])
            beta[t, s] = _lse(*terms) + logp[t, ext[s]]
    logz = _lse(alpha[-1, -1], alpha[-1, -2] if s_n > 1 else neg)
    grad = np.zeros_like(logp)
    if logz == -np.inf:
        return np.inf, grad
    for t in range(t_len):
        for s in range(s_n):
            if alpha[t, s] == -np.inf or beta[t, s] == -np.inf:
                continue
            a = alpha[t, s] + beta[t, s] - logp[t, ext[s]]
            if a > -np.inf:
                grad[t, ext[s]] -= np.exp(a - logz)
    return -logz, grad


def random_batch(rng, t_max, n, n_cls, s_max, *, blank=0, scale=1.0, repeats=True,
                 min_len=0):
    """Random normalised log-probs (T, N, C), padded targets, and lengths."""
    logits = rng.normal(size=(t_max, n, n_cls)) * scale
    logp = logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)
    labels = [k for k in range(n_cls) if k != blank]
    targets = np.zeros((n, s_max), np.int64)
    tl = rng.integers(min_len, s_max + 1, size=n)
    for b in range(n):
        pool = labels[: max(1, len(labels) // 3)] if repeats and b % 2 == 0 else labels
        targets[b, : tl[b]] = rng.choice(pool, size=tl[b])
    il = rng.integers(max(1, t_max // 2), t_max + 1, size=n)
    return logp, targets, il, tl


def check_extreme_scores(loss_and_grad, seed, cases, t_max=30, max_labels=7):
    """Random unnormalised scores x300 (some -inf) against :func:`log_space_ctc`.

    A frame's rescaled posterior sum can underflow there; a kernel must then
    recompute in log space (not divide by zero).  ``loss_and_grad(logp (T, 1,
    C), target list) -> (loss, grad (T, C))``.  Returns how many feasible
    cases were compared.
    """
    import pytest

    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(cases):
        t = int(rng.integers(2, t_max))
        c = int(rng.integers(2, 5))
        n_lab = int(rng.integers(1, min(t, max_labels) + 1))
        logp = rng.normal(size=(t, 1, c)) * 300.0
        if rng.random() < 0.3:
            logp[rng.random(logp.shape) < 0.2] = -np.inf
        target = [int(v) for v in rng.integers(1, c, size=n_lab)]
        loss, grad = loss_and_grad(logp, target)
        want, want_g = log_space_ctc(logp[:, 0], target)
        if want == np.inf:
            assert loss == np.inf
            continue
        checked += 1
        assert loss == pytest.approx(want, rel=1e-9, abs=1e-9)
        np.testing.assert_allclose(grad, want_g, atol=1e-9)
    return checked

