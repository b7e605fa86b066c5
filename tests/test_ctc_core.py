"""CTC core: analytic cases -> brute force -> independent log-space reference -> GTN."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import GTN_FIXTURES
from ctc_reference import brute_force_ctc, check_extreme_scores, log_space_ctc, random_batch
from duoloss.core import ctc_loss_and_grad


def _one(logp, target, blank=0, dtype=np.float64, **kw):
    t_len, n_cls = logp.shape
    tg = np.asarray(target, np.int64).reshape(1, -1)
    losses, grad = ctc_loss_and_grad(np.asarray(logp, dtype)[:, None, :], tg, [t_len],
                                     [tg.shape[1]], blank=blank, **kw)
    return float(losses[0]), grad[:, 0, :]


# --- analytic ----------------------------------------------------------------

def test_single_alignment_is_minus_sum_log_p(rng):
    # T == L and no repeats: exactly one alignment, loss = -sum_t log p_t(y_t),
    # gradient = -onehot(y).
    logp = np.log(rng.dirichlet(np.ones(6), size=5))
    target = [1, 3, 2, 5, 4]
    loss, grad = _one(logp, target)
    assert loss == pytest.approx(-sum(logp[t, y] for t, y in enumerate(target)), rel=1e-14)
    np.testing.assert_array_equal(grad, -np.eye(6)[target])


def test_empty_target_is_all_blanks(rng):
    logp = np.log(rng.dirichlet(np.ones(4), size=7))
    loss, grad = _one(logp, [])
    assert loss == pytest.approx(-logp[:, 0].sum(), rel=1e-14)
    np.testing.assert_array_equal(grad, -np.eye(4)[[0] * 7])


def test_uniform_counts_alignments():
    # With p = 1/C everywhere, exp(-loss) = (#alignments) / C**T.  For target
    # "a" and T frames there are T*(T+1)/2 alignments (blanks, a-run, blanks).
    t_len, n_cls = 6, 3
    logp = np.full((t_len, n_cls), -np.log(n_cls))
    loss, _ = _one(logp, [1])
    assert np.exp(-loss) == pytest.approx(t_len * (t_len + 1) / 2 / n_cls ** t_len, rel=1e-12)


def test_zero_frames():
    loss, _ = _one(np.zeros((0, 3)), [])
    assert loss == 0.0
    loss, _ = _one(np.zeros((0, 3)), [1])
    assert loss == np.inf


# --- brute force -------------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_brute_force_tiny(seed):
    rng = np.random.default_rng(seed)
    t_len = int(rng.integers(1, 6))
    n_cls = int(rng.integers(2, 4))
    blank = int(rng.integers(0, n_cls))
    labels = [k for k in range(n_cls) if k != blank]
    target = list(rng.choice(labels, size=int(rng.integers(0, 4))))
    logp = rng.normal(size=(t_len, n_cls)) * 2  # unnormalised scores are fine too
    want_loss, want_grad = brute_force_ctc(logp, target, blank)
    loss, grad = _one(logp, target, blank)
    if want_loss == np.inf:
        assert loss == np.inf
        np.testing.assert_array_equal(grad, 0.0)
    else:
        assert loss == pytest.approx(want_loss, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_central_differences():
    rng = np.random.default_rng(7)
    logp = rng.normal(size=(8, 4))
    target = [1, 1, 3]
    _, grad = _one(logp, target)
    eps = 1e-6
    num = np.zeros_like(logp)
    for idx in np.ndindex(*logp.shape):
        d = np.zeros_like(logp)
        d[idx] = eps
        num[idx] = (_one(logp + d, target)[0] - _one(logp - d, target)[0]) / (2 * eps)
    np.testing.assert_allclose(grad, num, atol=1e-7)


# --- independent log-space reference, large and extreme inputs ---------------

@pytest.mark.parametrize("scale", [1.0, 20.0, 50.0, 200.0])
def test_matches_log_space_reference_even_when_linear_space_underflows(scale):
    # Logits scaled by 50+ put needed labels hundreds of nats below the frame's
    # best: linear space underflows and the kernel must fall back exactly.
    rng = np.random.default_rng(int(scale))
    logp, targets, il, tl = random_batch(rng, 60, 3, 5, 12, scale=scale, min_len=1)
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl)
    for b in range(3):
        want, want_g = log_space_ctc(logp[: il[b], b], targets[b, : tl[b]])
        assert losses[b] == pytest.approx(want, rel=1e-10)
        np.testing.assert_allclose(grad[: il[b], b], want_g, atol=1e-8)
        np.testing.assert_array_equal(grad[il[b]:, b], 0.0)


def test_float32_gradient_accuracy_long_sequence():
    # Issue 2: float32 gradients within 1e-6 of a float64 reference at T=1000.
    rng = np.random.default_rng(3)
    logp, targets, il, tl = random_batch(rng, 1000, 2, 30, 200, min_len=150)
    il[:] = 1000
    l64, g64 = ctc_loss_and_grad(logp, targets, il, tl)
    l32, g32 = ctc_loss_and_grad(logp.astype(np.float32), targets, il, tl)
    # reference for the float32 *input* values, computed in float64
    lref, gref = ctc_loss_and_grad(logp.astype(np.float32).astype(np.float64), targets, il, tl)
    want, want_g = log_space_ctc(logp[:, 0], targets[0, : tl[0]])
    assert l64[0] == pytest.approx(want, rel=1e-11)
    np.testing.assert_allclose(g64[:, 0], want_g, atol=1e-9)
    err = np.abs(g32.astype(np.float64) - gref) / np.maximum(1.0, np.abs(gref))
    assert err.max() < 1e-6
    assert np.abs(l32.astype(np.float64) - lref).max() <= 1e-6 * np.abs(lref).max()


def test_neg_inf_log_probs_give_no_nan():
    rng = np.random.default_rng(5)
    logp, targets, il, tl = random_batch(rng, 20, 2, 5, 4, min_len=1)
    logp[3, :, 2] = -np.inf
    logp[7, :, :] = -np.inf
    logp[7, :, 0] = 0.0  # only blank possible at frame 7
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl)
    assert not np.isnan(losses).any() and not np.isnan(grad).any()
    for b in range(2):
        want, want_g = log_space_ctc(logp[: il[b], b], targets[b, : tl[b]])
        assert losses[b] == pytest.approx(want, rel=1e-10) if want < np.inf else losses[b] == np.inf
        np.testing.assert_allclose(grad[: il[b], b], want_g, atol=1e-10)


def test_infeasible_and_zero_infinity():
    logp = np.log(np.full((3, 1, 4), 0.25))
    targets = np.array([[1, 1, 2]])  # needs 4 frames (blank between the repeats)
    losses, grad = ctc_loss_and_grad(logp, targets, [3], [3])
    assert losses[0] == np.inf and not grad.any()
    losses, grad = ctc_loss_and_grad(logp, targets, [3], [3], zero_infinity=True)
    assert losses[0] == 0.0 and not grad.any()


def test_nan_stays_in_its_sequence():
    rng = np.random.default_rng(9)
    logp, targets, il, tl = random_batch(rng, 30, 3, 5, 5, min_len=1)
    il[:] = 30
    clean, gclean = ctc_loss_and_grad(logp, targets, il, tl)
    logp[4, 1, targets[1, 0]] = np.nan
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl)
    assert np.isnan(losses[1]) and np.isnan(grad[:, 1]).any()
    np.testing.assert_array_equal(losses[[0, 2]], clean[[0, 2]])
    np.testing.assert_array_equal(grad[:, [0, 2]], gclean[:, [0, 2]])


def test_invalid_runtime_values_give_nan_not_crash():
    # What a traced (unvalidated) call can pass: the kernel must stay in bounds.
    logp = np.zeros((5, 4, 3))
    targets = np.array([[1, 2], [7, 1], [1, 0], [1, 1]])
    il = np.array([5, 5, 5, 99])
    tl = np.array([2, 2, 2, 2])
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl)
    assert np.isfinite(losses[0])
    assert np.isnan(losses[1:]).all()  # label >= C, blank in target, length > T
    assert np.isnan(grad[:, 1:]).all() and not np.isnan(grad[:, 0]).any()


def test_parallel_and_serial_paths_agree():
    rng = np.random.default_rng(11)
    logp, targets, il, tl = random_batch(rng, 200, 16, 20, 30)
    losses, grad = ctc_loss_and_grad(logp, targets, il, tl)  # parallel driver
    for b in (0, 5, 15):
        lb, gb = ctc_loss_and_grad(logp[:, b:b + 1], targets[b:b + 1], il[b:b + 1],
                                   tl[b:b + 1])  # serial driver
        assert lb[0] == losses[b]
        np.testing.assert_array_equal(gb[:, 0], grad[:, b])


def test_forward_only_matches():
    rng = np.random.default_rng(2)
    logp, targets, il, tl = random_batch(rng, 40, 4, 6, 8)
    l1, g = ctc_loss_and_grad(logp, targets, il, tl, want_grad=False)
    l2, _ = ctc_loss_and_grad(logp, targets, il, tl)
    assert g is None
    np.testing.assert_array_equal(l1, l2)


# --- GTN golden values -------------------------------------------------------

def _gtn_ctc_cases():
    path = GTN_FIXTURES / "ctc.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())["cases"]


@pytest.mark.skipif(not (GTN_FIXTURES / "ctc.json").exists(), reason="GTN fixtures absent")
def test_gtn_golden_ctc():
    cases = _gtn_ctc_cases()
    assert len(cases) > 10
    for case in cases:
        logp = np.asarray(case["logp"], np.float32).astype(np.float64)
        target = case["target"]
        blank = case["blank"]
        loss, grad = _one(logp, target, blank)
        # GTN's float32 error grows with the score (fixtures README §1.8, §4.9).
        want_loss = float(case["loss_nonorm"])
        if want_loss == np.inf:
            assert loss == np.inf, case["id"]
        else:
            assert loss == pytest.approx(want_loss, rel=2e-6, abs=2e-5), case["id"]
        # facebookresearch puts NaN next to -inf inputs; gtn-org (and the maths) give 0.
        want_grad = np.asarray(case.get("gtn_org", {}).get("grad_nonorm", case["grad_nonorm"]),
                               np.float64)
        if np.isnan(want_grad).any():
            continue
        s = max(1.0, abs(want_loss)) if np.isfinite(want_loss) else 1.0
        np.testing.assert_allclose(grad, want_grad, atol=(1e-4 + 1e-6 * s), err_msg=case["id"])
        if case.get("gtn_test_expected_loss") is not None and case["blank"] == blank:
            # values hard-coded in GTN's own tests (wav2letter / TensorFlow cases) are
            # of the normalised loss: add log Z of the unconstrained emissions.
            norm = float(np.logaddexp.reduce(logp, axis=1).sum())
            assert loss + norm == pytest.approx(float(case["gtn_test_expected_loss"]),
                                                rel=1e-5, abs=1e-5)


def test_core_imports_no_framework():
    code = ("import sys, duoloss.core, duoloss.core.losses.ctc;"
            "bad = [m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_extreme_unnormalised_scores_match_log_space_reference():
    # Scores x300 with some -inf: the rescaled posterior sum of a frame can
    # underflow to 0 (it once raised ZeroDivisionError); such sequences must be
    # recomputed in log space and match the textbook reference.
    def run(logp, target):
        losses, grad = ctc_loss_and_grad(logp, np.array([target]), [logp.shape[0]],
                                         [len(target)])
        return losses[0], grad[:, 0]

    assert check_extreme_scores(run, seed=1, cases=300) > 100
