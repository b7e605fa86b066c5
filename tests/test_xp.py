"""duoloss._xp: the framework-free array maths (k2 lattices and pruning, CTC gather plan).

As einops' backend tests: the same inputs through every namespace (numpy, torch,
JAX with x64 on and off) give the same arrays; numpy is checked against
independent Python loops written from the definitions (k2's formulas, the
gather plan's contract).
"""
from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from duoloss._xp import JaxOps, NumpyOps, ctc, k2, namespace_of

TYPES = ("regular", "modified", "constrained")


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _frameworks():
    """(namespace, to_array) for torch and JAX."""
    return [(namespace_of(torch.empty(0)), torch.from_numpy), (JaxOps(), jnp.asarray)]


def _inputs(seed=0, B=2, T=5, S=3, C=6, ninf=False):
    rng = np.random.default_rng(seed)
    am = rng.standard_normal((B, T, C))
    lm = rng.standard_normal((B, S + 1, C))
    if ninf:
        am[1, 2, :] = -np.inf  # an all -inf frame: the shift must stay finite
    symbols = rng.integers(1, C, (B, S))
    boundary = np.array([[0, 0, S, T], [0, 0, S - 1, T - 1]])
    return am, lm, symbols, boundary


def _log_softmax(x):
    m = np.max(x, -1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_namespace_of_and_no_framework_import():
    assert namespace_of(np.zeros(1)) is NumpyOps
    assert namespace_of(torch.zeros(1)).name == "torch"
    assert namespace_of(jnp.zeros(1)).name == "jax"
    code = ("import sys, numpy as np, duoloss._xp as xp; from duoloss._xp import k2, ctc;"
            "xp.namespace_of(np.zeros(1));"
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("scales", [None, (0.2, 0.0)])
def test_simple_logprobs_numpy_matches_the_definition(rnnt_type, scales):
    """numpy namespace vs log_softmax of the full (B, T, S+1, C) joiner written out;
    smoothing from k2's formulas (LM-only softmax, AM with the batch-mean unigram)."""
    am, lm, symbols, _ = _inputs()
    B, T, C = am.shape
    S = symbols.shape[1]
    px, py = k2.simple_logprobs(NumpyOps, lm, am, symbols, 0, rnnt_type, scales)
    full = _log_softmax(am[:, :, None, :] + lm[:, None, :, :])  # (B, T, S+1, C)
    want_px = np.stack([[full[b, :, s, symbols[b, s]] for s in range(S)] for b in range(B)])
    want_py = np.transpose(full[..., 0], (0, 2, 1))
    if scales is not None:
        lm_s, am_s = scales
        lp_lm = _log_softmax(lm)  # (B, S+1, C)
        uni = np.exp(lp_lm).mean(axis=(0, 1)) + np.finfo(float).tiny
        lp_am = _log_softmax(am + np.log(uni))  # (B, T, C)
        comb = 1 - lm_s - am_s
        am_s = am_s or 1e-20
        want_px = (comb * want_px
                   + lm_s * np.stack([[np.full(T, lp_lm[b, s, symbols[b, s]]) for s in range(S)]
                                      for b in range(B)])
                   + am_s * np.stack([[lp_am[b, :, symbols[b, s]] for s in range(S)]
                                      for b in range(B)]))
        want_py = (comb * want_py + lm_s * np.repeat(lp_lm[:, :, :1], T, 2)
                   + am_s * np.transpose(np.repeat(lp_am[:, :, None, 0], S + 1, 2), (0, 2, 1)))
    if rnnt_type == "regular":
        assert px.shape == (B, S, T + 1) and np.isneginf(px[:, :, T]).all()
        px = px[:, :, :T]
    np.testing.assert_allclose(px, want_px, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(py, want_py, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the all -inf frame
@pytest.mark.parametrize("x64", [True, False])
def test_every_function_agrees_across_namespaces(x64):
    """numpy, torch and JAX give the same k2 lattices, ranges, pruning and CTC plans
    (float64 inputs with x64 on; float32 with x64 off)."""
    dtype = np.float64 if x64 else np.float32
    tol = dict(rtol=1e-12, atol=1e-12) if x64 else dict(rtol=2e-6, atol=2e-6)
    am, lm, symbols, bd = _inputs(1, ninf=True)
    am, lm = am.astype(dtype), lm.astype(dtype)
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 5, 2, 6)).astype(dtype)
    ranges = np.minimum(np.arange(5) // 2, 2)[None, :, None] + np.arange(2)
    ranges = np.broadcast_to(ranges, (2, 5, 2)).copy()
    targets = np.array([[3, 1, 3, 0], [2, 7, 0, 0]])  # 7 out of range, 0 the blank
    tlen = np.array([3, 2])
    lp = rng.standard_normal((4, 2, 6)).astype(dtype)

    def run(xp, arr):
        out = {}
        for ty in TYPES:
            px, py = k2.simple_logprobs(xp, arr(lm), arr(am), arr(symbols), 0, ty, (0.1, 0.1))
            out[ty, "px"], out[ty, "py"] = px, py
            out[ty, "fin"] = k2.finish_px(xp, px, py, arr(bd), ty, 0.5)
            ppx, ppy = k2.pruned_logprobs(xp, arr(logits), arr(symbols), arr(ranges), 0, ty)
            out[ty, "ppx"], out[ty, "ppy"] = ppx, ppy
        gx = np.abs(_np(out["regular", "px"]))
        gx = np.where(np.isfinite(gx), gx, 0)
        gy = np.abs(_np(out["regular", "py"]))
        out["ranges"] = k2.prune_ranges(xp, arr(gx), arr(gy), arr(bd), 2, True)
        out["am_p"], out["lm_p"] = k2.do_pruning(xp, arr(am), arr(lm), arr(ranges))
        cols, ct = ctc.gather_plan(xp, arr(targets), arr(tlen), 6, 0)
        out["cols"], out["ct"] = cols, ct
        out["gathered"] = ctc.gathered(xp, arr(lp), cols)
        return {k: _np(v) for k, v in out.items()}

    with jax.enable_x64(x64):
        ref = run(NumpyOps, np.asarray)
        for xp, arr in _frameworks():
            got = run(xp, arr)
            for key, want in ref.items():
                np.testing.assert_allclose(got[key], want, err_msg=f"{xp.name} {key}", **tol)
                if want.dtype.kind in "iub":
                    np.testing.assert_array_equal(got[key], want, err_msg=f"{xp.name} {key}")


def test_gather_plan_matches_its_contract():
    """columns = [blank, labels (padding -> blank, clipped)], column_targets = 1 + first
    occurrence, -1 for a blank or out-of-range label; written as loops."""
    rng = np.random.default_rng(3)
    n, s, c, blank = 6, 5, 7, 2
    targets = rng.integers(-1, c + 2, (n, s))
    tlen = rng.integers(0, s + 1, n)
    cols, ct = ctc.gather_plan(NumpyOps, targets, tlen, c, blank)
    for b in range(n):
        labels = [int(targets[b, i]) if i < tlen[b] else blank for i in range(s)]
        assert cols[b].tolist() == [blank] + [min(max(x, 0), c - 1) for x in labels]
        for i in range(s):
            if i >= tlen[b]:
                assert ct[b, i] == 1 + (0 if tlen[b] == 0 else ct[b, i] - 1)  # padding: any
                continue
            y = labels[i]
            want = -1 if (y < 0 or y >= c or y == blank) else 1 + labels.index(y)
            assert ct[b, i] == want
            if want > 0:
                assert cols[b, want] == y
    lp = rng.standard_normal((3, n, c))
    g = ctc.gathered(NumpyOps, lp, cols)
    assert g.shape == (3, n, s + 1)
    for t in range(3):
        for b in range(n):
            assert g[t, b].tolist() == [lp[t, b, k] for k in cols[b]]


def test_prune_ranges_follow_k2s_constraints():
    """Each row starts at 0, never decreases, rises by < s_range (regular) / < 2, and
    ends on the last window; ranges are consecutive."""
    rng = np.random.default_rng(4)
    B, S, T = 3, 6, 8
    bd = np.array([[0, 0, 6, 8], [0, 0, 4, 6], [0, 0, 2, 8]])
    for regular, r in ((True, 3), (False, 2)):
        gx = rng.random((B, S, T + 1 if regular else T))
        gy = rng.random((B, S + 1, T))
        ranges = k2.prune_ranges(NumpyOps, gx, gy, bd, r, regular)
        start = ranges[:, :, 0]
        assert (ranges == start[..., None] + np.arange(r)).all()
        assert (start[:, 0] == 0).all() and (np.diff(start, axis=1) >= 0).all()
        assert (np.diff(start, axis=1) < (r if regular else 2)).all()
        assert (start >= 0).all() and (start <= S + 1 - r).all()
