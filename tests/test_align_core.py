"""duoloss.core Viterbi alignments vs GTN golden paths and brute-force enumeration."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from duoloss.core.losses.align import asg_align, asg_viterbi, ctc_align
from test_asg_reference import (all_labellings, brute_asg_align, brute_ctc_align, load_family,
                                path_weight)

VIT = load_family("viterbi")
needs_vit = pytest.mark.skipif(VIT is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
CTC_CASES = [i for i, c in enumerate(VIT["cases"]) if c["kind"] == "ctc"] if VIT else []
ASG_CASES = [i for i, c in enumerate(VIT["cases"]) if c["kind"] == "asg"] if VIT else []


def _path_score_ctc(logp, labels):
    return sum(float(logp[t, k]) for t, k in enumerate(labels))


@needs_vit
@pytest.mark.parametrize("idx", CTC_CASES)
def test_ctc_align_matches_gtn(idx):
    case = VIT["cases"][idx]
    logp = np.asarray(case["logp"], np.float32)
    t_max = case["T"]
    tgt = np.asarray(case["target"], np.int64).reshape(1, -1)
    if tgt.size == 0:
        tgt = np.zeros((1, 1), np.int64)
    labels, scores = ctc_align(logp[:, None, :].astype(np.float64), tgt, [t_max],
                               [len(case["target"])], blank=case["blank"])
    if case["score"] == -np.inf:
        assert scores[0] == -np.inf and np.all(labels == -1)
        return
    np.testing.assert_allclose(scores[0], case["score"], rtol=1e-6)
    # the returned path is a valid CTC path of the target with that score
    path = labels[0]
    collapsed = [k for i, k in enumerate(path) if k != case["blank"]
                 and (i == 0 or k != path[i - 1])]
    assert collapsed == case["target"]
    np.testing.assert_allclose(_path_score_ctc(logp.astype(np.float64), path), scores[0],
                               rtol=1e-12)
    if not case["viterbi_tie"]:
        np.testing.assert_array_equal(path, case["path_labels"])


@needs_vit
@pytest.mark.parametrize("idx", ASG_CASES)
def test_asg_viterbi_matches_gtn(idx):
    case = VIT["cases"][idx]
    em = np.asarray(case["emissions"], np.float32).astype(np.float64)
    tr = np.asarray(case["transitions"], np.float32).astype(np.float64)
    sv = np.asarray(case["start"], np.float32).astype(np.float64)
    labels, scores = asg_viterbi(em[:, None, :], tr, [case["T"]], start_transitions=sv)
    np.testing.assert_allclose(scores[0], case["score"], rtol=1e-6)
    np.testing.assert_allclose(path_weight(em, tr, sv, labels[0]), scores[0], rtol=1e-12)
    if not case["viterbi_tie"]:
        np.testing.assert_array_equal(labels[0], case["path_labels"])
    if "gtn_test_expected_path" in case:
        np.testing.assert_array_equal(labels[0], case["gtn_test_expected_path"])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t_max=st.integers(1, 6), c=st.integers(2, 4),
       s_cap=st.integers(1, 3), ties=st.booleans())
def test_ctc_align_brute_force(seed, t_max, c, s_cap, ties):
    rng = np.random.default_rng(seed)
    n = 2
    logp = rng.standard_normal((t_max, n, c))
    if ties:
        logp = np.round(logp)  # many exact ties
    tgt = rng.integers(1, c, (n, s_cap))
    il = rng.integers(0, t_max + 1, n)
    tl = rng.integers(0, s_cap + 1, n)
    labels, scores = ctc_align(logp, tgt, il, tl, blank=0)
    for b in range(n):
        best, arg = brute_ctc_align(logp[:il[b], b], list(tgt[b, :tl[b]]), 0)
        if best == -np.inf:
            assert scores[b] == -np.inf and np.all(labels[b] == -1)
            continue
        np.testing.assert_allclose(scores[b], best, rtol=1e-12, atol=1e-12)
        assert tuple(labels[b, :il[b]]) in arg
        assert np.all(labels[b, il[b]:] == -1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t_max=st.integers(1, 6), c=st.integers(1, 3),
       s_cap=st.integers(1, 4), ties=st.booleans(), with_trans=st.booleans())
def test_asg_align_brute_force(seed, t_max, c, s_cap, ties, with_trans):
    rng = np.random.default_rng(seed)
    n = 2
    em = rng.standard_normal((t_max, n, c))
    tr = rng.standard_normal((c, c)) if with_trans else None
    sv = rng.standard_normal(c)
    if ties:
        em = np.round(em)
        tr = None if tr is None else np.round(tr)
        sv = np.round(sv)
    tgt = rng.integers(0, c, (n, s_cap))
    il = rng.integers(0, t_max + 1, n)
    tl = rng.integers(0, s_cap + 1, n)
    labels, scores = asg_align(em, tr, tgt, il, tl, start_transitions=sv)
    for b in range(n):
        if il[b] == 0 and tl[b] == 0:
            assert scores[b] == 0.0
            continue
        best, arg = brute_asg_align(em[:il[b], b], tr, sv, list(tgt[b, :tl[b]]))
        if best == -np.inf:
            assert scores[b] == -np.inf and np.all(labels[b] == -1)
            continue
        np.testing.assert_allclose(scores[b], best, rtol=1e-12, atol=1e-12)
        assert tuple(labels[b, :il[b]]) in arg
        assert np.all(labels[b, il[b]:] == -1)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t_max=st.integers(1, 5), c=st.integers(1, 3))
def test_asg_viterbi_brute_force(seed, t_max, c):
    rng = np.random.default_rng(seed)
    em = rng.standard_normal((t_max, 1, c))
    tr = rng.standard_normal((c, c))
    labels, scores = asg_viterbi(em, tr, [t_max])
    best = max(path_weight(em[:, 0], tr, None, pi) for pi in all_labellings(t_max, c))
    np.testing.assert_allclose(scores[0], best, rtol=1e-12)
    np.testing.assert_allclose(path_weight(em[:, 0], tr, None, labels[0]), best, rtol=1e-12)


def test_documented_tie_breaking():
    """All scores equal: labels as early as possible, trailing blanks (higher state wins)."""
    logp = np.zeros((5, 1, 3))
    labels, scores = ctc_align(logp, np.array([[1, 2]]), [5], [2])
    np.testing.assert_array_equal(labels[0], [1, 2, 0, 0, 0])
    assert scores[0] == 0.0
    labels, _ = asg_align(np.zeros((4, 1, 3)), np.zeros((3, 3)), np.array([[1, 2]]), [4], [2])
    np.testing.assert_array_equal(labels[0], [1, 2, 2, 2])
    labels, _ = asg_viterbi(np.zeros((3, 1, 3)), np.zeros((3, 3)), [3])
    np.testing.assert_array_equal(labels[0], [2, 2, 2])


def test_invalid_runtime_values_give_nan():
    labels, scores = ctc_align(np.zeros((3, 2, 3)), np.array([[0, 1], [5, 1]]), [3, 3], [1, 2])
    assert np.isnan(scores).all() and np.all(labels == -1)
    labels, scores = asg_align(np.zeros((3, 1, 3)), None, np.array([[1]]), [4], [1])
    assert np.isnan(scores[0]) and np.all(labels == -1)


def test_large_batch_parallel_path():
    rng = np.random.default_rng(0)
    t_max, n, c = 300, 8, 30
    logp = rng.standard_normal((t_max, n, c))
    tgt = rng.integers(1, c, (n, 60))
    il = rng.integers(200, t_max + 1, n)
    tl = rng.integers(1, 61, n)
    labels, scores = ctc_align(logp, tgt, il, tl)
    for b in range(n):
        l1, s1 = ctc_align(logp[:, b:b + 1], tgt[b:b + 1], il[b:b + 1], tl[b:b + 1])
        np.testing.assert_array_equal(l1[0], labels[b])
        assert s1[0] == scores[b]
