"""Independent float64 references for ASG / all-alignments / alignment tests.

Brute force: enumerate every frame labelling (C**T of them) and every
segmentation of the target; no recursion shared with duoloss's kernels.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np

FIXTURES = Path(os.environ.get("DUOLOSS_GTN_FIXTURES")
                or Path(__file__).resolve().parent / "data" / "gtn") / "public"


def load_family(name):
    """GTN's golden cases of one family; the files are vendored, so missing is an error."""
    path = FIXTURES / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"GTN fixture file {path} is missing (tests/data/gtn/public/)")
    with open(path) as f:
        return json.load(f)


def logsumexp(xs):
    xs = np.asarray(list(xs), np.float64)
    if xs.size == 0:
        return -np.inf
    m = xs.max()
    if not np.isfinite(m):
        return m
    return m + np.log(np.exp(xs - m).sum())


def path_weight(em, trans, start, pi):
    """Score of the frame labelling ``pi`` (em: (T, C))."""
    w = (0.0 if start is None else start[pi[0]]) + sum(em[t, k] for t, k in enumerate(pi))
    if trans is not None:
        w += sum(trans[pi[t], pi[t - 1]] for t in range(1, len(pi)))
    return w


def all_labellings(T, C):
    return itertools.product(range(C), repeat=T)


def aligned_labellings(T, target):
    """Every segmentation of ``target`` into T frames (token i over >= 1 frames)."""
    L = len(target)
    if L == 0 or L > T:
        return
    for cuts in itertools.combinations(range(1, T), L - 1):
        bounds = (0,) + cuts + (T,)
        pi = []
        for l in range(L):
            pi += [target[l]] * (bounds[l + 1] - bounds[l])
        yield tuple(pi)


def brute_asg(em, trans, start, target):
    """(loss, log normaliser) of one sequence, em: (T, C) float64."""
    T, C = em.shape
    lz = logsumexp(path_weight(em, trans, start, pi) for pi in all_labellings(T, C))
    ln = logsumexp(path_weight(em, trans, start, pi) for pi in aligned_labellings(T, target))
    return lz - ln, lz


def brute_asg_align(em, trans, start, target):
    """Best force-aligned labelling (score, set of optimal labellings)."""
    best, arg = -np.inf, set()
    for pi in aligned_labellings(em.shape[0], target):
        w = path_weight(em, trans, start, pi)
        if w > best + 1e-12:
            best, arg = w, {pi}
        elif abs(w - best) <= 1e-12:
            arg.add(pi)
    return best, arg


def ctc_paths(T, target, blank):
    """Every frame labelling that collapses to ``target`` (CTC)."""
    L = len(target)
    # Brute force over all label sequences drawn from target ∪ {blank}.
    alphabet = sorted(set(target) | {blank})
    for pi in itertools.product(alphabet, repeat=T):
        out, prev = [], None
        for k in pi:
            if k != blank and k != prev:
                out.append(k)
            prev = k
        if out == list(target):
            yield pi
    del L


def brute_ctc_align(logp, target, blank):
    best, arg = -np.inf, set()
    for pi in ctc_paths(logp.shape[0], target, blank):
        w = sum(logp[t, k] for t, k in enumerate(pi))
        if w > best + 1e-12:
            best, arg = w, {pi}
        elif abs(w - best) <= 1e-12:
            arg.add(pi)
    return best, arg


def grad_tolerance_ok(actual, expected, score_scale):
    """README §1.9: |a-b| <= (1e-4 + 1e-6 S) max(1, |b|)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    tol = (1e-4 + 1e-6 * score_scale) * np.maximum(1.0, np.abs(expected))
    return np.all(np.abs(actual - expected) <= tol), float(np.max(np.abs(actual - expected) / tol))
