"""The vectorised CTC host kernels (issue 36): guard columns, fixed-lane sums, the
band's edges, and ctc_align's branch-free tropical row.

The references are independent: textbook log-space CTC and brute-force
enumeration (`tests/ctc_reference.py`), exact rational sums, and a brute-force
Viterbi written here.  The cross-width bit identity is in
``tests/test_bit_identity_isa.py``.
"""
import itertools
from fractions import Fraction

import numba
import numpy as np
import pytest

from ctc_reference import brute_force_ctc, log_space_ctc
from duoloss.core.losses.align import ctc_align
from duoloss.core.losses.ctc import (_ctc_trellis_final, _ctc_trellis_forward, _lane_sum,
                                     _pair_lane_sums, ctc_loss_and_grad, ctc_states)


@numba.njit(cache=False)
def _sums(x, lo, hi):
    a, b = _pair_lane_sums(x, lo, hi)
    return _lane_sum(x, lo, hi), a, b


def _fixed_lanes(x, start, n):
    """The documented order of `_vector_pair_sums`, in Python floats: blocks of 16
    to two accumulators of 8 lanes, one more block of 8 to the first, the two added
    lane by lane, the even and the odd lanes each as a pair of pairs, then the tail
    in order by parity.  Returns (even, odd)."""
    acc = [[0.0] * 8, [0.0] * 8]
    k = 0
    while k + 16 <= n:
        for q in range(2):
            for lane in range(8):
                acc[q][lane] += float(x[start + k + 8 * q + lane])
        k += 16
    if n - k >= 8:
        for lane in range(8):
            acc[0][lane] += float(x[start + k + lane])
        k += 8
    a = [acc[0][lane] + acc[1][lane] for lane in range(8)]
    sums = [(a[p] + a[p + 2]) + (a[p + 4] + a[p + 6]) for p in range(2)]
    for j in range(k, n):
        sums[j % 2] += float(x[start + j])
    return sums[0], sums[1]


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 6), (0, 7), (3, 3), (1, 17), (2, 40), (5, 64),
                                   (0, 15), (0, 23), (4, 27), (7, 200)])
def test_lane_sums_are_the_fixed_order_and_exact_to_rounding(lo, hi):
    rng = np.random.default_rng(lo * 100 + hi)
    x = np.zeros(hi + 3)
    x[lo:hi + 1] = rng.random(hi + 1 - lo) * 10.0 ** rng.integers(-3, 4, size=hi + 1 - lo)
    total, even, odd = _sums(x, lo, hi)
    e, o = _fixed_lanes(x, lo, hi + 1 - lo)
    assert total == e + o  # bit for bit: the order is the source's
    first = lo - (lo & 1)
    assert (even, odd) == _fixed_lanes(x, first, hi + 1 - first)
    exact = sum(Fraction(float(v)) for v in x[lo:hi + 1])
    assert abs(Fraction(total) - exact) <= 1e-15 * exact
    exact_even = sum(Fraction(float(x[s])) for s in range(lo, hi + 1) if s % 2 == 0)
    exact_odd = exact - exact_even
    assert abs(Fraction(even) - exact_even) <= 1e-15 * exact
    assert abs(Fraction(odd) - exact_odd) <= 1e-15 * exact


def _batch_against_reference(logp, targets, il, tl, blank, rtol=1e-10):
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl, blank=blank)
    for b in range(logp.shape[1]):
        loss_ref, grad_ref = log_space_ctc(logp[:il[b], b, :], targets[b, :tl[b]], blank)
        np.testing.assert_allclose(losses[b], loss_ref, rtol=rtol, err_msg=f"loss of {b}")
        np.testing.assert_allclose(grad[:il[b], b, :], grad_ref, rtol=rtol, atol=1e-12,
                                   err_msg=f"grad of {b}")
        assert not grad[il[b]:, b, :].any()


@pytest.mark.parametrize("blank", [0, 4])
def test_band_edges_and_guard_columns(blank):
    """Every position of the band's edges: targets from empty to the most T allows
    (T = L and T = L + repeats: a band one state wide), repeated labels (the skip
    rule's other value), odd and even band starts, sequences of every length in one
    batch (one shared alpha buffer, sized for the largest)."""
    rng = np.random.default_rng(7 + blank)
    cases = [(1, []), (1, [1]), (2, [1, 1]), (3, [1, 1]), (3, [2, 3, 2]), (4, [1, 2, 3, 4]),
             (5, [3, 3, 3]), (6, [1, 2, 1, 2, 1]), (9, [2, 2]), (12, [1, 3, 3, 1, 2]),
             (17, []), (23, [1, 2, 3, 3, 2, 1, 1, 2, 3, 1, 2])]
    t_max, s_max, n_cls = 23, 11, 5
    labels = [k for k in range(n_cls) if k != blank]
    logits = rng.normal(size=(t_max, len(cases), n_cls)) * 2.0
    logp = logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)
    targets = np.zeros((len(cases), s_max), np.int64)
    il = np.array([t for t, _ in cases])
    tl = np.array([len(y) for _, y in cases])
    for b, (_, y) in enumerate(cases):
        targets[b, :len(y)] = [labels[k - 1] for k in y]
    _batch_against_reference(logp, targets, il, tl, blank)


def test_brute_force_on_every_short_target():
    """All targets of up to 3 labels over 2 classes, T = 4: every band shape."""
    rng = np.random.default_rng(11)
    t_len, n_cls = 4, 3
    targets = [y for n in range(4) for y in itertools.product((1, 2), repeat=n)]
    logits = rng.normal(size=(t_len, len(targets), n_cls))
    logp = logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)
    padded = np.zeros((len(targets), 3), np.int64)
    for b, y in enumerate(targets):
        padded[b, :len(y)] = y
    tl = np.array([len(y) for y in targets])
    losses, grad = ctc_loss_and_grad(logp, padded, np.full(len(targets), t_len), tl)
    for b, y in enumerate(targets):
        loss_ref, grad_ref = brute_force_ctc(logp[:, b, :], y)
        if np.isinf(loss_ref):
            assert losses[b] == np.inf and not grad[:, b, :].any()
            continue
        np.testing.assert_allclose(losses[b], loss_ref, rtol=1e-12)
        np.testing.assert_allclose(grad[:, b, :], grad_ref, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("n_cls", [12, 60])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_against_log_space(dtype, n_cls):
    """Rows longer than several vectors (2L+1 = 61), ragged lengths, a weighted
    gradient: float32 in, float64 inside; 12 classes (at most 12 distinct in a
    target: the scalar exp of the frame probabilities) and 60 (the packed one)."""
    rng = np.random.default_rng(3)
    t_max, n, s_max = 90, 4, 30
    logits = rng.normal(size=(t_max, n, n_cls)) * 3.0
    logp = (logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)).astype(dtype)
    targets = rng.integers(1, n_cls, size=(n, s_max))
    il = np.array([90, 77, 64, 61])
    tl = np.array([30, 29, 17, 30])
    w = np.array([1.0, 0.5, 2.0, 0.25])
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl, grad_weights=w)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    for b in range(n):
        loss_ref, grad_ref = log_space_ctc(logp[:il[b], b, :].astype(np.float64),
                                           targets[b, :tl[b]])
        np.testing.assert_allclose(losses[b], loss_ref, rtol=tol)
        np.testing.assert_allclose(grad[:il[b], b, :], w[b] * grad_ref, rtol=tol, atol=1e-30)


def _viterbi_brute_force(logp, target, blank=0):
    """(best score, its frame labels) over all C**T label paths that collapse to
    ``target``, by enumeration; the first maximum in lexicographic order."""
    from ctc_reference import collapse
    best, best_path = -np.inf, None
    for path in itertools.product(range(logp.shape[1]), repeat=logp.shape[0]):
        if collapse(path, blank) != tuple(target):
            continue
        score = sum(logp[t, k] for t, k in enumerate(path))
        if score > best:
            best, best_path = score, path
    return best, best_path


def test_ctc_align_row_against_brute_force_and_bounded_memory_path():
    rng = np.random.default_rng(5)
    t_len, n_cls = 6, 3
    targets = [(), (1,), (2, 2), (1, 2), (2, 1, 2), (1, 1, 2)]
    logp = rng.normal(size=(t_len, len(targets), n_cls))
    padded = np.zeros((len(targets), 3), np.int64)
    for b, y in enumerate(targets):
        padded[b, :len(y)] = y
    il = np.full(len(targets), t_len)
    tl = np.array([len(y) for y in targets])
    labels, scores = ctc_align(logp, padded, il, tl)
    labels_ck, scores_ck = ctc_align(logp, padded, il, tl, _checkpoint_cells=0)
    np.testing.assert_array_equal(labels_ck, labels)
    assert scores_ck.tobytes() == scores.tobytes()
    for b, y in enumerate(targets):
        best, path = _viterbi_brute_force(logp[:, b, :], y)
        np.testing.assert_allclose(scores[b], best, rtol=1e-13)
        # random scores: the best path is unique
        np.testing.assert_array_equal(labels[b], path)


def test_ctc_align_bounded_memory_rows_with_ties_nan_and_neg_inf():
    """The checkpointed path's branch-free rows give the full table's labels and
    score bits: ties everywhere (rounded scores), -inf entries, a NaN entry
    (whether it reaches the score depends on the path: `_ctc_best_step`)."""
    rng = np.random.default_rng(9)
    t_max, n, n_cls, s_max = 60, 5, 4, 12
    logp = np.round(rng.normal(size=(t_max, n, n_cls)), 0)
    logp[10:13, 1, 2] = -np.inf
    logp[20, 2, 1] = np.nan
    targets = rng.integers(1, n_cls, size=(n, s_max))
    il = np.array([60, 55, 60, 30, 12])
    tl = np.array([12, 10, 12, 12, 6])
    labels, scores = ctc_align(logp, targets, il, tl)
    labels_ck, scores_ck = ctc_align(logp, targets, il, tl, _checkpoint_cells=0)
    np.testing.assert_array_equal(labels_ck, labels)
    assert scores_ck.tobytes() == scores.tobytes()
    assert np.isfinite(scores[[0, 1, 3]]).all()


@pytest.mark.parametrize("want_grad", [False, True])
def test_empty_bands_of_infeasible_sequences(want_grad):
    """A target longer than the frames allow leaves a frame's band empty (hi < lo):
    the lane sums then add nothing (they once read 8-aligned leftovers of the shared
    buffer, garbage from the sequence before), and the loss is +inf (0 with
    zero_infinity), the same on every call."""
    rng = np.random.default_rng(55)
    t_max, n, n_cls = 40, 4, 6
    logits = rng.normal(size=(t_max, n, n_cls)) * 5.0
    logp = logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)
    targets = rng.integers(1, n_cls, size=(n, 20))
    il = np.array([40, 1, 5, 4])
    tl = np.array([15, 11, 13, 20])
    for zero_infinity in (False, True):
        for _ in range(3):
            losses, grad = ctc_loss_and_grad(logp, targets, il, tl, want_grad=want_grad,
                                             zero_infinity=zero_infinity)
            loss_ref, _ = log_space_ctc(logp[:, 0, :], targets[0, :15])
            np.testing.assert_allclose(losses[0], loss_ref, rtol=1e-10)
            assert (losses[1:] == (0.0 if zero_infinity else np.inf)).all()
            if want_grad:
                assert not grad[:, 1:, :].any()


@numba.njit(cache=False)
def _trellis_viterbi_score(logp, targets, b, input_len, n_labels, blank):
    lab, skip = ctc_states(targets, b, n_labels, blank)
    table = _ctc_trellis_forward(b, input_len, lab, skip, logp, True)
    score, _ = _ctc_trellis_final(table, True)
    return score


@pytest.mark.parametrize("checkpoint_cells", [None, 0])
def test_ctc_align_scores_are_the_trellis_definition_bit_for_bit(checkpoint_cells):
    """The aligner's vectorised rows against the branchy tropical trellis of
    ``ctc.py`` (the definition, written once): the same score bits, ties, -inf and
    rounded values included."""
    rng = np.random.default_rng(21)
    t_max, n, n_cls, s_max = 50, 6, 5, 10
    logp = np.round(rng.normal(size=(t_max, n, n_cls)) * 3.0, 1)
    logp[5:9, 2, :] = -np.inf
    logp[rng.random(logp.shape) < 0.03] = -np.inf
    targets = rng.integers(1, n_cls, size=(n, s_max))
    targets[0, 1] = targets[0, 0]
    il = np.array([50, 47, 50, 21, 33, 9])
    tl = np.array([10, 9, 10, 10, 3, 4])
    _, scores = ctc_align(logp, targets, il, tl, _checkpoint_cells=checkpoint_cells)
    for b in range(n):
        want = _trellis_viterbi_score(logp, targets, b, il[b], tl[b], 0)
        assert np.float64(scores[b]).tobytes() == np.float64(want).tobytes(), b
