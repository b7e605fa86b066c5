"""The core transducer lattice (duoloss.core.losses.transducer) against independent references.

References: brute-force enumeration of every lattice path (float64), the same
lattice built as a ``duoloss.gtn`` graph (forward_score / backward / viterbi),
and central finite differences.
"""
from __future__ import annotations

import numpy as np
import pytest

import duoloss.gtn as gtn
from rnnt_reference import lattice_paths

from duoloss.core import TRANSDUCER_KERNEL, transducer_loss_and_grad, transducer_viterbi


# --------------------------------------------------------------------------- #
# Brute force                                                                  #
# --------------------------------------------------------------------------- #
def _paths(s0, t0, s1, t1, modified):
    """Every monotone path from (s0, t0) to (s1, t1) (k2's px/py moves)."""
    return lattice_paths(s1 - s0, t1 - t0, modified, s0=s0, t0=t0)


def _brute(px, py, bd, modified):
    """Losses, gradients (minus move posteriors), best scores and best frames."""
    n, s_max = px.shape[0], px.shape[1]
    losses = np.empty(n)
    gx, gy = np.zeros_like(px), np.zeros_like(py)
    best = np.full(n, -np.inf)
    frames = np.full((n, s_max), -1)
    for b in range(n):
        paths = _paths(*bd[b], modified)
        scores = np.array([sum(px[b, s, t] if k == "x" else py[b, s, t] for k, s, t in p)
                           for p in paths])
        if len(paths) == 0 or np.all(scores == -np.inf):
            losses[b] = np.inf
            continue
        m = scores.max()
        logz = m + np.log(np.exp(scores - m).sum())
        losses[b] = -logz
        for p, sc in zip(paths, scores):
            w = np.exp(sc - logz)
            for k, s, t in p:
                (gx if k == "x" else gy)[b, s, t] -= w
        best[b] = m
        for k, s, t in paths[int(np.argmax(scores))]:
            if k == "x":
                frames[b, s] = t
    return losses, gx, gy, best, frames


def _random_case(rng, n, s_max, t_max, modified, full=False):
    px = rng.normal(size=(n, s_max, t_max if modified else t_max + 1))
    py = rng.normal(size=(n, s_max + 1, t_max))
    bd = np.zeros((n, 4), np.int64)
    for b in range(n):
        if full:
            bd[b] = (0, 0, s_max, t_max)
            continue
        s0 = rng.integers(0, 2)
        t0 = rng.integers(0, 2)
        s1 = rng.integers(s0, s_max + 1)
        t1 = rng.integers(t0, t_max + 1)
        if modified and s1 - s0 > t1 - t0:
            s1 = s0 + (t1 - t0)
        bd[b] = (s0, t0, s1, t1)
    return px, py, bd


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_grad_viterbi_match_brute_force(rnnt_type, seed):
    rng = np.random.default_rng(seed)
    modified = rnnt_type != "regular"
    px, py, bd = _random_case(rng, 5, 3, 4, modified)
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    bl, bgx, bgy, bbest, bframes = _brute(px, py, bd, modified)
    np.testing.assert_allclose(losses, bl, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, bgx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gy, bgy, rtol=1e-10, atol=1e-12)
    scores, frames = transducer_viterbi(px, py, bd, rnnt_type)
    np.testing.assert_allclose(scores, bbest, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(frames, bframes)


def test_default_boundary_is_full_box_and_regular_path_count():
    # All-zero weights: -loss = log(number of paths) = log C(S + T, S) (regular).
    px, py = np.zeros((1, 3, 5)), np.zeros((1, 4, 4))
    losses, _ = transducer_loss_and_grad(px, py)
    np.testing.assert_allclose(losses, [-np.log(35.0)], rtol=1e-14)
    # modified: C(T, S) paths
    losses, _ = transducer_loss_and_grad(np.zeros((1, 3, 4)), py, rnnt_type="modified")
    np.testing.assert_allclose(losses, [-np.log(4.0)], rtol=1e-14)


def test_finite_differences_float64():
    rng = np.random.default_rng(5)
    for rnnt_type in ("regular", "modified"):
        px, py, bd = _random_case(rng, 3, 3, 5, rnnt_type != "regular")
        _, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
        eps = 1e-6
        for arr, g in ((px, gx), (py, gy)):
            for idx in np.ndindex(arr.shape):
                old = arr[idx]
                arr[idx] = old + eps
                lp = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type,
                                              want_grad=(False, False))[0][idx[0]]
                arr[idx] = old - eps
                lm = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type,
                                              want_grad=(False, False))[0][idx[0]]
                arr[idx] = old
                assert abs((lp - lm) / (2 * eps) - g[idx]) < 1e-7


# --------------------------------------------------------------------------- #
# The lattice as a GTN graph: an independent path through duoloss.gtn          #
# --------------------------------------------------------------------------- #
def _lattice_graph(px, py, b, bd, modified):
    s0, t0, s1, t1 = (int(v) for v in bd[b])
    g = gtn.Graph()
    node = {}
    for s in range(s0, s1 + 1):
        for t in range(t0, t1 + 1):
            node[s, t] = g.add_node(start=(s, t) == (s0, t0), accept=(s, t) == (s1, t1))
    arcs = []
    for (s, t), u in node.items():
        if t < t1:
            g.add_arc(u, node[s, t + 1], 0, 0, float(py[b, s, t]))
            arcs.append(("y", s, t))
        if s < s1:
            dst = (s + 1, t + 1) if modified else (s + 1, t)
            if dst in node:
                g.add_arc(u, node[dst], 1, 1, float(px[b, s, t]))
                arcs.append(("x", s, t))
    return g, arcs


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_matches_gtn_graph_forward_backward_and_viterbi(rnnt_type):
    rng = np.random.default_rng(11)
    modified = rnnt_type != "regular"
    px, py, bd = _random_case(rng, 3, 4, 6, modified)
    # gtn.Graph weights are float32: give both sides the same values
    px, py = (a.astype(np.float32).astype(np.float64) for a in (px, py))
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    scores, _ = transducer_viterbi(px, py, bd, rnnt_type)
    for b in range(3):
        g, arcs = _lattice_graph(px, py, b, bd, modified)
        fs = gtn.forward_score(g)
        gtn.backward(fs)
        np.testing.assert_allclose(-fs.item(), losses[b], rtol=1e-6)
        w_grad = g.grad().weights_to_numpy()
        for (k, s, t), gw in zip(arcs, w_grad):
            ours = gx[b, s, t] if k == "x" else gy[b, s, t]
            np.testing.assert_allclose(-ours, gw, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gtn.viterbi_score(g).item(), scores[b], rtol=1e-6)


# --------------------------------------------------------------------------- #
# Paths agree, policies                                                        #
# --------------------------------------------------------------------------- #
def test_no_grad_equals_with_grad_and_serial_equals_parallel():
    rng = np.random.default_rng(3)
    px, py, bd = _random_case(rng, 40, 12, 30, False, full=True)
    full, (gx, gy) = transducer_loss_and_grad(px, py, bd)
    bare, (nx, ny) = transducer_loss_and_grad(px, py, bd, want_grad=(False, False))
    assert nx is None and ny is None
    np.testing.assert_array_equal(full, bare)
    # one sequence at a time runs the serial driver: bit-identical per sequence
    for b in (0, 17, 39):
        one, (ox, oy) = transducer_loss_and_grad(px[b:b + 1], py[b:b + 1], bd[b:b + 1])
        np.testing.assert_array_equal(one[0], full[b])
        np.testing.assert_array_equal(ox[0], gx[b])
        np.testing.assert_array_equal(oy[0], gy[b])


def test_gradients_zero_outside_box_and_posteriors_conserve_mass():
    rng = np.random.default_rng(4)
    px, py, bd = _random_case(rng, 6, 4, 5, False)
    _, (gx, gy) = transducer_loss_and_grad(px, py, bd)
    for b in range(6):
        s0, t0, s1, t1 = bd[b]
        inside_x = np.zeros(px.shape[1:], bool)
        inside_x[s0:s1, t0:t1 + 1] = True
        inside_y = np.zeros(py.shape[1:], bool)
        inside_y[s0:s1 + 1, t0:t1] = True
        assert np.all(gx[b][~inside_x] == 0) and np.all(gy[b][~inside_y] == 0)
        # every path makes exactly s1 - s0 symbol moves and t1 - t0 frame moves
        np.testing.assert_allclose(-gx[b].sum(), s1 - s0, atol=1e-12)
        np.testing.assert_allclose(-gy[b].sum(), t1 - t0, atol=1e-12)


def test_float32_inputs_float64_inside():
    rng = np.random.default_rng(6)
    px, py, bd = _random_case(rng, 4, 3, 5, False)
    l64, (gx64, _) = transducer_loss_and_grad(px, py, bd)
    l32, (gx32, gy32) = transducer_loss_and_grad(px.astype(np.float32), py.astype(np.float32), bd)
    assert l32.dtype == np.float32 and gx32.dtype == np.float32 and gy32.dtype == np.float32
    l64b, _ = transducer_loss_and_grad(px.astype(np.float32).astype(np.float64),
                                       py.astype(np.float32).astype(np.float64), bd)
    np.testing.assert_array_equal(l32, l64b.astype(np.float32))
    np.testing.assert_allclose(gx32, gx64, atol=1e-5)


def test_minus_inf_is_probability_zero_not_nan():
    rng = np.random.default_rng(7)
    px, py, bd = _random_case(rng, 2, 3, 4, False, full=True)
    px[0, 1, :] = -np.inf    # symbol 1 can never be emitted: infeasible
    py[1, 0, 2] = -np.inf    # one blank forbidden: fine
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd)
    assert losses[0] == np.inf and np.all(gx[0] == 0) and np.all(gy[0] == 0)
    ref = py.copy()
    ref[1, 0, 2] = -1e4
    ref_l, (rgx, rgy) = transducer_loss_and_grad(px, ref, bd)
    np.testing.assert_allclose(losses[1], ref_l[1], rtol=1e-14)
    np.testing.assert_allclose(gy[1], rgy[1], atol=1e-300)
    assert np.isfinite(gx[1]).all() and np.isfinite(gy[1]).all()
    scores, frames = transducer_viterbi(px, py, bd)
    assert scores[0] == -np.inf and np.all(frames[0] == -1)


def test_infeasible_modified_and_empty_boxes():
    py = np.zeros((3, 4, 2))
    px = np.zeros((3, 3, 2))
    bd = np.array([[0, 0, 3, 2],    # 3 symbols in 2 frames: infeasible
                   [0, 0, 0, 0],    # empty box: loss 0
                   [1, 1, 1, 1]])   # empty box elsewhere: loss 0
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type="modified")
    np.testing.assert_array_equal(losses, [np.inf, 0.0, 0.0])
    assert np.all(gx == 0) and np.all(gy == 0)


def test_nan_stays_in_its_sequence_and_outside_box_is_ignored():
    rng = np.random.default_rng(8)
    px, py, bd = _random_case(rng, 3, 3, 4, False, full=True)
    bd[2] = (0, 0, 2, 3)
    clean, (cx, cy) = transducer_loss_and_grad(px, py, bd)
    px[0, 1, 2] = np.nan            # inside sequence 0's box
    py[2, 3, 3] = np.nan            # outside sequence 2's box (s_end = 2)
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd)
    assert np.isnan(losses[0]) and np.isnan(gx[0]).any() and np.isnan(gy[0]).any()
    np.testing.assert_array_equal(losses[1:], clean[1:])
    np.testing.assert_array_equal(gx[1:], cx[1:])
    np.testing.assert_array_equal(gy[1:], cy[1:])


def test_invalid_boundary_row_gives_nan_not_out_of_bounds():
    px, py = np.zeros((3, 2, 4)), np.zeros((3, 3, 3))
    bd = np.array([[0, 0, 3, 3], [0, 0, 2, 4], [0, 0, 2, 3]])  # S = 2, T = 3
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd)
    assert np.isnan(losses[:2]).all() and np.isfinite(losses[2])
    assert np.isnan(gx[:2]).all() and np.isfinite(gx[2]).all()
    scores, frames = transducer_viterbi(px, py, bd)
    assert np.isnan(scores[:2]).all() and np.all(frames[:2] == -1)


def test_kernel_spec_and_shape_errors():
    assert TRANSDUCER_KERNEL.batch_axes == (0, 0, 0)
    assert TRANSDUCER_KERNEL.differentiable == (True, True, False)
    px, py = np.zeros((2, 2, 4)), np.zeros((2, 3, 3))
    bd = np.array([[0, 0, 2, 3]] * 2)
    losses, grads = TRANSDUCER_KERNEL.run((px, py, bd), (True, False, False),
                                          rnnt_type="regular")
    assert grads[1] is None and grads[2] is None and grads[0].shape == px.shape
    with pytest.raises(ValueError, match="transducer_loss: argument 'px' must have shape"):
        transducer_loss_and_grad(px, py, bd, rnnt_type="modified")
    with pytest.raises(ValueError, match="argument 'rnnt_type' must be one of"):
        transducer_loss_and_grad(px, py, bd, rnnt_type="pruned")
    with pytest.raises(ValueError, match="argument 'boundary' must be an integer"):
        transducer_loss_and_grad(px, py, bd[:1])
