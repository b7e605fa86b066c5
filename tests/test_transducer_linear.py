"""The linear-space (rescaled) transducer sweep against the exact log-space one.

``duoloss.core.losses.transducer`` runs a rescaled linear-space forward-backward and
falls back to the exact log-space recursion when it cannot certify its result;
``_log_space=True`` forces the log-space kernel.  The log-space kernel is itself
checked against brute force, GTN and finite differences in ``test_rnnt.py``;
here both kernels are compared directly on random and adversarial lattices, and
the linear one on a few cases against an independent brute-force enumeration.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duoloss.core.losses.transducer import transducer_loss_and_grad

TYPES = ("regular", "modified", "constrained")


def _both(px, py, bd, rnnt_type, want=(True, True)):
    lin = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type, want_grad=want)
    ref = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type, want_grad=want,
                                   _log_space=True)
    return lin, ref


def _assert_same(lin, ref, rtol=1e-12, atol=1e-13):
    (l1, (gx1, gy1)), (l2, (gx2, gy2)) = lin, ref
    np.testing.assert_allclose(l1, l2, rtol=rtol, atol=atol, equal_nan=True)
    for a, b in ((gx1, gx2), (gy1, gy2)):
        if b is None:
            assert a is None
        else:
            # same NaN pattern; exact zeros wherever the exact kernel has them
            # (outside the box, unreachable cells); the linear sweep's own zeros
            # only where the exact posterior is negligible: a move more than 708
            # nats below the box's best underflows, and a level's mass is at
            # least 1e-200 (else log space), so what is lost is below 1e-308/1e-200
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
            assert np.all(a[b == 0] == 0)
            assert np.all(np.abs(b[(a == 0) & (b != 0)]) < 1e-100)
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=atol, equal_nan=True)


def _case(rng, n, s_max, t_max, rnnt_type, scale=1.0, full=False):
    modified = rnnt_type != "regular"
    px = rng.normal(size=(n, s_max, t_max if modified else t_max + 1)) * scale
    py = rng.normal(size=(n, s_max + 1, t_max)) * scale
    bd = np.zeros((n, 4), np.int64)
    for b in range(n):
        if full:
            bd[b] = (0, 0, s_max, t_max)
            continue
        s0 = rng.integers(0, s_max + 1)
        s1 = rng.integers(s0, s_max + 1)
        t0 = rng.integers(0, t_max + 1)
        t1 = rng.integers(t0, t_max + 1)
        bd[b] = (s0, t0, s1, t1)
    return px, py, bd


def _brute_loss(px, py, bd, modified):
    """-log sum over every monotone path of exp(path score), float64 (independent)."""
    out = []
    for b in range(px.shape[0]):
        s0, t0, s1, t1 = bd[b]
        n_x = s1 - s0
        n_moves = (t1 - t0) if modified else (s1 - s0) + (t1 - t0)
        scores = []
        for xs in itertools.combinations(range(n_moves), n_x) if n_x <= n_moves else ():
            s, t, sc = s0, t0, 0.0
            for k in range(n_moves):
                if k in xs:
                    sc += px[b, s, t]
                    s += 1
                    t += 1 if modified else 0
                else:
                    sc += py[b, s, t]
                    t += 1
            scores.append(sc)
        scores = np.array(scores)
        if scores.size == 0 or np.all(scores == -np.inf):
            out.append(np.inf)
            continue
        m = scores.max()
        out.append(-(m + np.log(np.exp(scores - m).sum())))
    return np.array(out)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_linear_matches_brute_force(rnnt_type):
    rng = np.random.default_rng(11)
    px, py, bd = _case(rng, 8, 4, 5, rnnt_type)
    losses, _ = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    np.testing.assert_allclose(losses, _brute_loss(px, py, bd, rnnt_type != "regular"),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0, 60.0])
def test_random_and_scaled_scores_match_log_space(rnnt_type, scale):
    rng = np.random.default_rng(int(scale * 10) + len(rnnt_type))
    px, py, bd = _case(rng, 12, 9, 17, rnnt_type, scale=scale)
    _assert_same(*_both(px, py, bd, rnnt_type))


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_log_softmax_like_inputs_float32(rnnt_type):
    # realistic lattices: gathered log-probabilities (<= 0), float32 inputs
    rng = np.random.default_rng(3)
    px, py, bd = _case(rng, 6, 20, 60, rnnt_type, full=True)
    px = np.log(rng.uniform(0.01, 1.0, px.shape)).astype(np.float32)
    py = np.log(rng.uniform(0.01, 1.0, py.shape)).astype(np.float32)
    lin, ref = _both(px, py, bd, rnnt_type)
    assert lin[0].dtype == np.float32
    _assert_same(lin, ref, rtol=1e-6, atol=1e-6)
    # float64 inside: the float32 losses round the same float64 number
    lin64, ref64 = _both(px.astype(np.float64), py.astype(np.float64), bd, rnnt_type)
    _assert_same(lin64, ref64)
    np.testing.assert_array_equal(lin[0], lin64[0].astype(np.float32))


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_minus_inf_entries(rnnt_type):
    rng = np.random.default_rng(5)
    px, py, bd = _case(rng, 16, 6, 9, rnnt_type)
    px[rng.uniform(size=px.shape) < 0.3] = -np.inf
    py[rng.uniform(size=py.shape) < 0.2] = -np.inf
    px[0] = -np.inf  # a sequence with only blank moves
    py[1] = -np.inf  # ... and one with none (infeasible unless the box is one row)
    lin, ref = _both(px, py, bd, rnnt_type)
    assert not np.any(np.isnan(lin[0]))
    _assert_same(lin, ref)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_nan_inf_and_invalid_boundaries(rnnt_type):
    rng = np.random.default_rng(6)
    px, py, bd = _case(rng, 6, 5, 8, rnnt_type, full=True)
    px[0, 2, 3] = np.nan
    py[1, 3, 4] = np.inf
    py[2, 0, 0] = -np.inf
    bd[3] = (2, 1, 1, 5)   # s_begin > s_end
    bd[4] = (0, 0, 6, 8)   # s_end > S
    bd[5] = (0, 3, 0, 3)   # a single node: loss 0
    _assert_same(*_both(px, py, bd, rnnt_type))


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_empty_targets_infeasible_and_offset_boundaries(rnnt_type):
    rng = np.random.default_rng(7)
    s_max, t_max = 6, 8
    px, py, bd = _case(rng, 7, s_max, t_max, rnnt_type)
    bd[0] = (0, 0, 0, t_max)      # empty target
    bd[1] = (0, 0, s_max, 0)      # no frame: symbols only (regular) / infeasible
    bd[2] = (0, 0, s_max, 3)      # more symbols than frames
    bd[3] = (2, 3, 5, 7)          # pruned / k2 offsets
    bd[4] = (4, 0, 6, 2)
    bd[5] = (1, 1, 4, 4)          # modified: diagonal only
    bd[6] = (0, 5, 0, 5)
    lin, ref = _both(px, py, bd, rnnt_type)
    _assert_same(lin, ref)
    if rnnt_type != "regular":
        assert lin[0][1] == np.inf and lin[0][2] == np.inf


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_long_lattice_t2000(rnnt_type):
    rng = np.random.default_rng(8)
    n, s_max, t_max = 2, 30, 2000
    px, py, bd = _case(rng, n, s_max, t_max, rnnt_type, full=True)
    px = np.log(rng.uniform(0.001, 1.0, px.shape))
    py = np.log(rng.uniform(0.001, 1.0, py.shape))
    bd[1] = (3, 100, 25, 1900)
    _assert_same(*_both(px, py, bd, rnnt_type), rtol=1e-11)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_peaked_lattice_flushes_and_still_agrees(rnnt_type):
    # A "trained" lattice: one alignment has probability ~1, everything else is
    # hundreds of nats down, so cells far from it leave float64's range; the
    # flush record + per-level check must still give the log-space numbers.
    rng = np.random.default_rng(9)
    n, s_max, t_max = 4, 12, 40
    px, py, bd = _case(rng, n, s_max, t_max, rnnt_type, full=True)
    px[:] = -400.0 + rng.normal(size=px.shape)
    py[:] = rng.normal(size=py.shape) * 0.01
    for b in range(n):
        frames = np.sort(rng.choice(t_max - 1, s_max, replace=False))
        px[b, np.arange(s_max), frames] = -0.01
    py[2] *= 100.0
    py[3, :, ::3] = -800.0
    for want in ((True, True), (False, False), (True, False)):
        lin, ref = _both(px, py, bd, rnnt_type, want)
        _assert_same(lin, ref, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_loss_same_with_and_without_gradient(rnnt_type):
    rng = np.random.default_rng(10)
    cases = [_case(rng, 8, 7, 30, rnnt_type, scale=s) for s in (1.0, 30.0, 200.0)]
    for px, py, bd in cases:
        full = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)[0]
        for want in ((False, False), (True, False), (False, True)):
            part = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type, want_grad=want)[0]
            np.testing.assert_array_equal(part, full)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rnnt_type=st.sampled_from(TYPES),
       s_max=st.integers(0, 8), t_max=st.integers(0, 14),
       scale=st.sampled_from([0.01, 1.0, 10.0, 100.0]),
       p_inf=st.sampled_from([0.0, 0.1, 0.5]))
def test_property_linear_equals_log_space(seed, rnnt_type, s_max, t_max, scale, p_inf):
    rng = np.random.default_rng(seed)
    px, py, bd = _case(rng, 3, s_max, t_max, rnnt_type, scale=scale)
    if p_inf:
        px[rng.uniform(size=px.shape) < p_inf] = -np.inf
        py[rng.uniform(size=py.shape) < p_inf] = -np.inf
    _assert_same(*_both(px, py, bd, rnnt_type), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_race_ahead_cell_carries_all_the_mass(rnnt_type):
    # Blanks before the symbol score +1 per frame up to frame 700 (then -2), so
    # for hundreds of levels the "no symbol yet" cell dominates its level by up
    # to e^700; but emitting the symbol costs 1000 + t nats before frame 1100,
    # so the whole posterior sits on the path that emits at frame 0 -- a cell
    # that, relative to its level, leaves float64's range.  The linear forward
    # alone would lose that path and report a loss near 100 nats.
    t_max = 1200
    modified = rnnt_type != "regular"
    px = np.empty((2, 1, t_max if modified else t_max + 1))
    px[:, 0, :] = -1000.0 - np.arange(px.shape[2])
    px[:, 0, 0] = 0.0
    px[:, 0, 1100:] = 0.0
    py = np.zeros((2, 2, t_max))
    py[:, 0, :700] = 1.0
    py[:, 0, 700:] = -2.0
    py[1, 1, :] = -0.05
    bd = np.array([[0, 0, 1, t_max], [0, 0, 1, t_max - 7]])
    for want in ((True, True), (False, False), (False, True)):
        lin, ref = _both(px, py, bd, rnnt_type, want)
        _assert_same(lin, ref)
        # independent value: the frame-0 emission (other paths are e^-100 down),
        # then blanks on the last row: T_b (regular) or T_b - 1 (modified) of them
        n_blank = bd[:, 3] - (1 if modified else 0)
        np.testing.assert_allclose(lin[0], [0.0, 0.05 * n_blank[1]], rtol=1e-12, atol=1e-12)
