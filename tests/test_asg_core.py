"""duoloss.core ASG / all-alignments kernels vs GTN golden values and brute force."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from duoloss.core import asg_loss_and_grad
from test_asg_reference import brute_asg, grad_tolerance_ok, load_family

ASG = load_family("asg")
ALL = load_family("all_alignments")
needs_asg = pytest.mark.skipif(ASG is None, reason="GTN fixtures (shared/fixtures/gtn) absent")
needs_all = pytest.mark.skipif(ALL is None, reason="GTN fixtures (shared/fixtures/gtn) absent")


def _f32(x):
    return np.asarray(x, np.float32)


def _asg_case_arrays(case):
    em = _f32(case["emissions"])[:, None, :]
    tr = _f32(case["transitions"])
    sv = _f32(case["start"])
    tgt = np.asarray(case["target"], np.int64).reshape(1, -1)
    if tgt.size == 0:
        tgt = np.zeros((1, 1), np.int64)
    return em, tr, sv, tgt, np.array([case["T"]]), np.array([len(case["target"])])


@needs_asg
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("idx", range(len(ASG["cases"]) if ASG else 0))
def test_asg_matches_gtn(idx, dtype):
    case = ASG["cases"][idx]
    em, tr, sv, tgt, il, tl = _asg_case_arrays(case)
    losses, (ge, gt, gs) = asg_loss_and_grad(
        em.astype(dtype), tr.astype(dtype), tgt, il, tl, start_transitions=sv.astype(dtype))
    assert losses.dtype == dtype and ge.dtype == dtype
    expected = case["loss"]
    if np.isinf(expected):
        assert losses[0] == expected
    else:
        np.testing.assert_allclose(losses[0], expected, rtol=1e-5 if dtype == np.float64 else 3e-5)
    s = max(abs(case["forward_score_norm"]), abs(np.nan_to_num(case["forward_score_target"],
                                                                neginf=0.0)))
    slack = 1.0 if dtype == np.float64 else 2.0
    for name, got, want in (("emissions", ge[:, 0], case["grad_emissions"]),
                            ("transitions", gt[0], case["grad_transitions"]),
                            ("start", gs[0], case["grad_start"])):
        ok, worst = grad_tolerance_ok(got, want, s)
        assert worst <= slack, f"grad {name}: {worst:.3g} x tolerance"


@needs_asg
def test_asg_gtn_unit_test_transition_sum():
    """GTN's test sums the transition gradient over its three examples."""
    total = 0
    for case in ASG["cases"][:3]:
        em, tr, sv, tgt, il, tl = _asg_case_arrays(case)
        _, (_, gt, _) = asg_loss_and_grad(em.astype(np.float64), tr.astype(np.float64), tgt,
                                          il, tl, start_transitions=sv.astype(np.float64))
        total = total + gt[0]
    expected = np.asarray(ASG["cases"][0]["gtn_test_expected_grad_transitions_sum_over_gtn_tests"])
    np.testing.assert_allclose(total.ravel(), expected.ravel(), atol=1e-4)


@needs_all
@pytest.mark.parametrize("idx", range(len(ALL["cases"]) if ALL else 0))
def test_all_alignments_matches_gtn(idx):
    case = ALL["cases"][idx]
    b, t, u = case["B"], case["T"], case["U"]
    x = _f32(case["inputs"]).transpose(1, 0, 2)  # (T, B, C)
    tgt = np.asarray(case["targets"], np.int64).reshape(b, u) if u else np.zeros((b, 1), np.int64)
    losses, (ge, gt, gs) = asg_loss_and_grad(x, None, tgt, np.full(b, t), np.full(b, u))
    assert gt is None and gs is None
    want = np.asarray(case["losses"], np.float64)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(losses), fin)
    np.testing.assert_array_equal(losses[~fin], want[~fin])
    np.testing.assert_allclose(losses[fin], want[fin], rtol=1e-5, atol=1e-5)
    s = np.max(np.abs(case["forward_score_E"]))
    ok, worst = grad_tolerance_ok(ge.transpose(1, 0, 2), case["grads"], s)
    assert ok, worst


# --------------------------------------------------------------------------- #
# brute force and central differences (float64)                                #
# --------------------------------------------------------------------------- #
@st.composite
def tiny_batches(draw):
    n = draw(st.integers(1, 3))
    c = draw(st.integers(1, 3))
    t_max = draw(st.integers(1, 5))
    s_cap = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.1, 1.0, 4.0]))
    rng = np.random.default_rng(seed)
    il = rng.integers(0, t_max + 1, n)
    tl = rng.integers(0, s_cap + 1, n)
    tgt = rng.integers(0, c, (n, s_cap))
    em = rng.standard_normal((t_max, n, c)) * scale
    tr = rng.standard_normal((c, c)) * scale if draw(st.booleans()) else None
    sv = rng.standard_normal(c) * scale if draw(st.booleans()) else None
    return em, tr, sv, tgt, il, tl


@settings(max_examples=60, deadline=None)
@given(tiny_batches())
def test_asg_loss_matches_brute_force(batch):
    em, tr, sv, tgt, il, tl = batch
    losses, _ = asg_loss_and_grad(em, tr, tgt, il, tl, start_transitions=sv)
    for b in range(em.shape[1]):
        tb, lb = il[b], tl[b]
        if tb == 0:
            assert losses[b] == (0.0 if lb == 0 else np.inf)
            continue
        ref, _ = brute_asg(em[:tb, b], tr, sv, list(tgt[b, :lb]))
        if np.isinf(ref):
            assert losses[b] == np.inf
        else:
            np.testing.assert_allclose(losses[b], ref, rtol=1e-10, atol=1e-10)


def _central(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (f(xp) - f(xm)) / (2 * eps)
    return g


@pytest.mark.parametrize("with_trans,with_start", [(True, True), (True, False), (False, True),
                                                   (False, False)])
def test_asg_gradients_central_differences(with_trans, with_start):
    rng = np.random.default_rng(3)
    t_max, n, c = 6, 3, 4
    em = rng.standard_normal((t_max, n, c))
    tr = rng.standard_normal((c, c)) if with_trans else None
    sv = rng.standard_normal(c) if with_start else None
    tgt = np.array([[1, 1, 2, 0], [3, 0, 0, 0], [2, 1, 2, 2]])
    il = np.array([6, 4, 5])
    tl = np.array([4, 1, 3])
    w = np.array([0.7, -1.3, 2.1])  # distinct per-sequence weights

    def total(e=em, t=tr, s=sv):
        return float(w @ asg_loss_and_grad(e, t, tgt, il, tl, start_transitions=s,
                                           want_grad=(False, False, False))[0])

    _, (ge, gt, gs) = asg_loss_and_grad(em, tr, tgt, il, tl, start_transitions=sv)
    np.testing.assert_allclose(ge * w[None, :, None], _central(lambda e: total(e=e), em),
                               atol=1e-7)
    assert np.all(ge[5, 1:] == 0) and np.all(ge[4:, 1] == 0)  # padded frames
    if with_trans:
        np.testing.assert_allclose(np.tensordot(w, gt, 1), _central(lambda t: total(t=t), tr),
                                   atol=1e-7)
    else:
        assert gt is None
    if with_start:
        np.testing.assert_allclose(w @ gs, _central(lambda s: total(s=s), sv), atol=1e-7)


def test_infeasible_gradient_is_normaliser_part():
    """GTN's convention: +inf loss, gradient of the normaliser alone."""
    rng = np.random.default_rng(5)
    t_max, c = 3, 3
    em = rng.standard_normal((t_max, 2, c))
    tr = rng.standard_normal((c, c))
    sv = rng.standard_normal(c)
    tgt = np.array([[0, 1, 2, 1], [0, 0, 0, 0]])
    il = np.array([3, 3])
    tl = np.array([4, 0])  # T < L, and an empty target
    losses, (ge, gt, gs) = asg_loss_and_grad(em, tr, tgt, il, tl, start_transitions=sv)
    assert np.all(losses == np.inf)
    for b in range(2):
        def lz(e=em[:, b], t=tr, s=sv):
            return brute_asg(e, t, s, [])[1]
        np.testing.assert_allclose(ge[:, b], _central(lambda e: lz(e=e), em[:, b]), atol=1e-7)
        np.testing.assert_allclose(gt[b], _central(lambda t: lz(t=t), tr), atol=1e-7)
        np.testing.assert_allclose(gs[b], _central(lambda s: lz(s=s), sv), atol=1e-7)
    losses, (ge, gt, gs) = asg_loss_and_grad(em, tr, tgt, il, tl, start_transitions=sv,
                                             zero_infinity=True)
    assert np.all(losses == 0) and not ge.any() and not gt.any() and not gs.any()


def test_empty_sequences():
    em = np.zeros((2, 2, 3))
    losses, (ge, _, _) = asg_loss_and_grad(em, None, np.zeros((2, 1), np.int64),
                                           np.array([0, 0]), np.array([0, 1]))
    np.testing.assert_array_equal(losses, [0.0, np.inf])
    assert not ge.any()


@pytest.mark.parametrize("kind", ["transition", "emission_scale"])
def test_log_space_fallback_matches_brute_force(kind):
    """Scores whose linear-space weights underflow take the exact log-space path."""
    rng = np.random.default_rng(11)
    t_max, c = 5, 3
    em = rng.standard_normal((t_max, 1, c))
    tr = rng.standard_normal((c, c))
    if kind == "transition":
        tr[1, 0] = -900.0  # the target needs 0 -> 1: ~900 nats below the rest
    else:
        em *= 400.0
    tgt = np.array([[0, 1, 2]])
    losses, (ge, gt, _) = asg_loss_and_grad(em, tr, tgt, np.array([5]), np.array([3]))
    ref, _ = brute_asg(em[:, 0], tr, None, [0, 1, 2])
    np.testing.assert_allclose(losses[0], ref, rtol=1e-10)
    num = _central(lambda t: asg_loss_and_grad(em, t, tgt, np.array([5]), np.array([3]),
                                               want_grad=(0, 0, 0))[0][0], tr, eps=1e-5)
    np.testing.assert_allclose(gt[0], num, atol=1e-5)


def test_forbidden_transitions():
    """-inf transitions are allowed; a target that needs one is infeasible."""
    rng = np.random.default_rng(2)
    em = rng.standard_normal((4, 2, 3))
    tr = rng.standard_normal((3, 3))
    tr[2, 1] = -np.inf
    tgt = np.array([[0, 1], [1, 2]])
    losses, (ge, _, _) = asg_loss_and_grad(em, tr, tgt, np.array([4, 4]), np.array([2, 2]))
    ref, _ = brute_asg(em[:, 0], tr, None, [0, 1])
    np.testing.assert_allclose(losses[0], ref, rtol=1e-10)
    assert losses[1] == np.inf and np.all(np.isfinite(ge))


def test_nan_only_poisons_its_sequence():
    rng = np.random.default_rng(4)
    em = rng.standard_normal((4, 3, 3))
    tr = rng.standard_normal((3, 3))
    tgt = np.array([[0, 1], [1, 2], [2, 2]])
    il, tl = np.array([4, 4, 3]), np.array([2, 2, 2])
    clean, (gc, _, _) = asg_loss_and_grad(em, tr, tgt, il, tl)
    em[1, 1, 2] = np.nan
    em[3, 2, 0] = np.nan  # beyond sequence 2's length: ignored
    losses, (ge, gt, _) = asg_loss_and_grad(em, tr, tgt, il, tl)
    assert np.isnan(losses[1]) and np.isnan(ge[:, 1]).all() and np.isnan(gt[1]).all()
    np.testing.assert_array_equal(losses[[0, 2]], clean[[0, 2]])
    np.testing.assert_array_equal(ge[:, [0, 2]], gc[:, [0, 2]])


def test_invalid_runtime_values_give_nan():
    """Out-of-range labels/lengths (possible for traced JAX values) never index out of bounds."""
    em = np.zeros((3, 3, 2))
    tgt = np.array([[0, 5], [0, 1], [-1, 0]])
    losses, (ge, _, _) = asg_loss_and_grad(em, None, tgt, np.array([3, 9, 3]),
                                           np.array([2, 1, 1]))
    assert np.isnan(losses).all() and np.isnan(ge).all()


def test_batch_parallel_path_matches_serial():
    rng = np.random.default_rng(9)
    t_max, n, c = 120, 6, 20
    em = rng.standard_normal((t_max, n, c)).astype(np.float32)
    tr = rng.standard_normal((c, c)).astype(np.float32)
    tgt = rng.integers(0, c, (n, 30))
    il = rng.integers(60, t_max + 1, n)
    tl = rng.integers(1, 31, n)
    big, (g1, t1, _) = asg_loss_and_grad(em, tr, tgt, il, tl)  # parallel driver
    for b in range(n):  # one at a time: serial driver
        lb, (gb, tb_, _) = asg_loss_and_grad(em[:, b:b + 1], tr, tgt[b:b + 1], il[b:b + 1],
                                             tl[b:b + 1])
        np.testing.assert_array_equal(lb, big[b:b + 1])
        np.testing.assert_array_equal(gb[:, 0], g1[:, b])
        np.testing.assert_array_equal(tb_[0], t1[b])


def test_core_does_not_import_frameworks():
    code = ("import sys, duoloss.core.losses.asg, duoloss.core.losses.align; "
            "print(any(m.split('.')[0] in ('torch', 'jax') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
