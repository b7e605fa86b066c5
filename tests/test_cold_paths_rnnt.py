"""The cold-compile restructuring of the transducer kernels (issue 19 point 3).

* The exact log-space recursion (``transducer._one``) is compiled only when a
  sequence needs it: the linear sweep marks such sequences in ``pending`` and
  the drivers run ``_fallback_batch`` over them (over none under
  ``duoloss.warmup``, so that it is cached).
* Fallback results (lattice loss and the fused joiner path) match an
  independent brute-force reference (every path enumerated).
* The batch kernels process exactly the sequences of ``order`` (any subset).
* No kernel compiles a second signature for a ``prange`` index (uint64) or a
  literal argument.
"""
from __future__ import annotations

import itertools
import json
import math
import sys

import numpy as np
import pytest
from numba.core import types
from numba.core.registry import CPUDispatcher

from duoloss.core import _numerics
from duoloss.core.losses import joiner, transducer
from duoloss.core.losses.transducer import transducer_loss_and_grad
from fresh_process import run_with_empty_cache


def _brute(px, py, bd, modified):
    """``(loss, gx, gy)`` of one sequence by enumerating every path of its box
    (moves as sequences of 'x' / 'y'); float64, log-sum-exp in Python."""
    s0, t0, s1, t1 = (int(v) for v in bd)
    ns, nt = s1 - s0, t1 - t0
    gx = np.zeros(px.shape)
    gy = np.zeros(py.shape)
    paths = []
    n_y = nt - ns if modified else nt  # a modified symbol move also advances a frame
    if n_y < 0:
        return math.inf, gx, gy
    for xs in itertools.combinations(range(ns + n_y), ns):
        s, t, score, moves = s0, t0, 0.0, []
        for k in range(ns + n_y):
            if k in xs:
                score += float(px[s, t])
                moves.append(("x", s, t))
                s, t = s + 1, t + (1 if modified else 0)
            else:
                score += float(py[s, t])
                moves.append(("y", s, t))
                t += 1
        paths.append((score, moves))
    scores = np.array([p[0] for p in paths])
    m = scores.max()
    if m == -math.inf:
        return math.inf, gx, gy
    logz = m + math.log(np.exp(scores - m).sum())
    for score, moves in paths:
        w = math.exp(score - logz)
        for kind, s, t in moves:
            (gx if kind == "x" else gy)[s, t] -= w
    return -logz, gx, gy


def _lattice(rng, n, s, t, modified, scale):
    px = rng.normal(size=(n, s, t if modified else t + 1)) * scale
    py = rng.normal(size=(n, s + 1, t)) * scale
    if not modified:
        px[:, :, t] = -np.inf
    bd = np.zeros((n, 4), np.int64)
    bd[:, 2] = s
    bd[:, 3] = t
    return px, py, bd


class _Spy:
    """Records the ``order`` arrays ``_fallback_batch`` is called with."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.orders = []

    def __call__(self, order, *args):
        self.orders.append(order.copy())
        return self.kernel(order, *args)


@pytest.fixture
def spy(monkeypatch):
    s = _Spy(transducer._fallback_batch)
    monkeypatch.setattr(transducer, "_fallback_batch", s)
    return s


def test_fallback_not_called_when_the_linear_sweep_certifies(spy):
    px, py, bd = _lattice(np.random.default_rng(0), 3, 2, 4, False, 1.0)
    transducer_loss_and_grad(px, py, bd)
    assert spy.orders == []


def test_warmup_compiles_the_fallback_with_an_empty_order(spy, monkeypatch):
    monkeypatch.setattr(_numerics, "_compile_both", True)
    px, py, bd = _lattice(np.random.default_rng(0), 3, 2, 4, False, 1.0)
    transducer_loss_and_grad(px, py, bd)
    assert len(spy.orders) == 1
    assert spy.orders[0].dtype == np.int64 and spy.orders[0].shape == (0,)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
@pytest.mark.parametrize("scale", [300.0, 3000.0])
def test_fallback_matches_brute_force(spy, rnnt_type, scale):
    modified = rnnt_type != "regular"
    rng = np.random.default_rng(1)
    px, py, bd = _lattice(rng, 4, 2, 5, modified, scale)
    bd[1] = (0, 1, 2, 5)
    bd[2] = (0, 0, 3, 5)  # invalid row: NaN loss and gradients
    if modified:
        bd[3] = (0, 0, 2, 1)  # infeasible: +inf, zero gradients
    losses, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    assert spy.orders and spy.orders[0].size  # the fallback ran
    assert np.isnan(losses[2]) and np.isnan(gx[2]).all() and np.isnan(gy[2]).all()
    for b in (0, 1, 3):
        loss, rx, ry = _brute(px[b], py[b], bd[b], modified)
        np.testing.assert_allclose(losses[b], loss, rtol=1e-12)
        np.testing.assert_allclose(gx[b], rx, atol=1e-12)
        np.testing.assert_allclose(gy[b], ry, atol=1e-12)
    # a forward-only call gives the same losses
    only, _ = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type,
                                       want_grad=(False, False))
    np.testing.assert_array_equal(only, losses)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_joiner_fallback_equals_the_three_steps_and_brute_force(spy, dtype):
    from duoloss.core.losses.joiner import (rnnt_loss_from_logits, transducer_log_probs,
                                            transducer_log_probs_grad)

    rng = np.random.default_rng(2)
    n, t, u, v = 3, 6, 2, 5
    x = (rng.normal(size=(n, t, u + 1, v)) * 400).astype(dtype)
    tg = rng.integers(1, v, (n, u))
    il = np.array([t, t - 1, 3])
    tl = np.array([u, 1, 2])
    bd = np.zeros((n, 4), np.int64)
    bd[:, 2] = tl
    bd[:, 3] = il
    scale = 1 / 3
    losses, lse, gx, gy, grad = rnnt_loss_from_logits(x, tg, il, tl, 0, bd, scale)
    assert spy.orders and spy.orders[0].size  # the fallback ran
    px, py, lse3 = transducer_log_probs(x, tg, il, tl, 0)
    l3, (gx3, gy3) = transducer_loss_and_grad(px, py, bd)
    tiny = np.finfo(dtype).tiny  # subnormal cotangents flushed, as the fused kernel does
    cx, cy = (np.where(np.abs(c) < tiny, c * 0, c) for c in (gx3 * dtype(scale),
                                                             gy3 * dtype(scale)))
    g3 = transducer_log_probs_grad(x, lse3, tg, il, tl, 0, cx, cy)
    np.testing.assert_array_equal(losses.astype(dtype), l3)
    np.testing.assert_array_equal(lse, lse3)
    np.testing.assert_array_equal(gx, gx3)
    np.testing.assert_array_equal(gy, gy3)
    np.testing.assert_array_equal(grad, g3)
    for b in range(n):
        loss, _, _ = _brute(px[b].astype(np.float64), py[b].astype(np.float64), bd[b], False)
        np.testing.assert_allclose(losses[b], loss, rtol=1e-12)
    only = rnnt_loss_from_logits(x, tg, il, tl, 0, bd, scale, want_grad=False)[0]
    np.testing.assert_array_equal(only, losses)


def test_batch_kernels_process_exactly_the_order():
    rng = np.random.default_rng(3)
    px, py, bd = _lattice(rng, 5, 3, 6, False, 1.0)
    px[3] *= 3000  # falls back
    full, (fx, fy) = transducer_loss_and_grad(px, py, bd)
    order = np.array([4, 1, 3], np.int64)
    losses = np.full(5, -7.0)
    gx = np.zeros_like(px)
    gy = np.zeros_like(py)
    pending = np.zeros(5, np.int8)
    args = (px, py, bd, False, True, True, losses, gx, gy, pending)
    transducer._batch_serial(order, *args)
    assert pending[3] != 0
    transducer.run_fallback(args)
    for b in range(5):
        if b in order:
            assert losses[b] == full[b]
            np.testing.assert_array_equal(gx[b], fx[b])
            np.testing.assert_array_equal(gy[b], fy[b])
        else:
            assert losses[b] == -7.0 and not gx[b].any() and not gy[b].any()


def test_fused_kernels_process_exactly_the_order():
    rng = np.random.default_rng(4)
    n, t, u, v = 4, 5, 2, 6
    x = rng.normal(size=(n, t, u + 1, v))
    tg = rng.integers(1, v, (n, u))
    il = np.full(n, t)
    tl = np.full(n, u)
    bd = np.zeros((n, 4), np.int64)
    bd[:, 2] = tl
    bd[:, 3] = il
    ref = joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)
    px = np.zeros((n, u, t + 1))
    py = np.zeros((n, u + 1, t))
    lse = np.zeros((n, t, u + 1))
    losses = np.zeros(n)
    gx, gy = np.zeros_like(px), np.zeros_like(py)
    cx, cy = np.empty_like(px), np.empty_like(py)
    out = np.zeros_like(x)
    pending = np.zeros(n, np.int8)
    order = np.array([2, 0], np.int64)
    joiner._fused_serial(order, x, tg, il, tl, 0, bd, False, 0.5, True, px, py, lse, losses, gx,
                         gy, cx, cy, out, pending)
    for b in range(n):
        if b in order:
            assert losses[b] == ref[0][b]
            np.testing.assert_array_equal(out[b], ref[4][b])
        else:
            assert losses[b] == 0 and not out[b].any() and not px[b].any()
    assert not pending.any()


def _fused_case(rng, dtype):
    """A float32/float64 batch with one sequence of large logits (normalisers
    above the unshifted range), one with a NaN logit inside its frames and two
    ordinary ones; returns ``(x, tg, il, tl, bd)``."""
    n, t, u, v = 4, 5, 2, 7
    x = rng.normal(size=(n, t, u + 1, v)).astype(dtype)
    x[1] *= 1000.0 if dtype == np.float64 else 100.0
    x[2, 1, 1, 3] = np.nan
    tg = rng.integers(1, v, (n, u))
    il = np.array([5, 5, 4, 3])
    tl = np.array([2, 2, 1, 2])
    bd = np.zeros((n, 4), np.int64)
    bd[:, 2] = tl
    bd[:, 3] = il
    return x, tg, il, tl, bd


@pytest.fixture
def two_pass_spies(monkeypatch):
    """Spies on the two-pass kernels the fused driver hands its rarer sequences to."""
    spies = {}
    for name in ("_lattice_forward_serial", "_lattice_backward_serial"):
        spies[name] = _Spy(getattr(joiner, name))
        monkeypatch.setattr(joiner, name, spies[name])
    return spies


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_hands_max_shifted_sequences_to_the_two_pass_kernels(two_pass_spies, dtype):
    """Only the sequences with a row outside the unshifted range get their
    lattices from the two-pass kernels (with the max-shifted passes), and only
    they and those the log-space fallback finished get their gradient from
    them; every output equals the three-step path and the large-logit loss
    equals brute force over a float64 numpy log-softmax."""
    fwd, bwd = (two_pass_spies[k] for k in ("_lattice_forward_serial", "_lattice_backward_serial"))
    x, tg, il, tl, bd = _fused_case(np.random.default_rng(7), dtype)
    losses, lse, gx, gy, grad = joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)
    # the NaN sequence (2) fails the linear sweep too: the log-space fallback, then
    # its gradient, as for any such sequence
    assert [list(o) for o in fwd.orders] == [[1, 2]]
    assert [list(o) for o in bwd.orders] == [[1, 2]]
    px, py, lse3 = joiner.transducer_log_probs(x, tg, il, tl, 0)
    losses3, (gx3, gy3) = transducer_loss_and_grad(px, py, bd)
    grad3 = joiner.transducer_log_probs_grad(x, lse3, tg, il, tl, 0, gx3 * dtype(0.5),
                                             gy3 * dtype(0.5))
    assert np.array_equal(losses.astype(dtype), losses3, equal_nan=True)
    for a, b in ((lse, lse3), (gx, gx3), (gy, gy3), (grad, grad3)):
        assert np.array_equal(a, b, equal_nan=True)
    assert np.isnan(losses[2]) and np.isfinite(losses[[0, 1, 3]]).all()
    x64 = x[1].astype(np.float64)
    m = x64.max(-1, keepdims=True)
    lsm = x64 - m - np.log(np.exp(x64 - m).sum(-1, keepdims=True))
    t1, u1 = int(il[1]), int(tl[1])
    px1 = np.full((u1, t1 + 1), -np.inf)
    py1 = np.zeros((u1 + 1, t1))
    for t in range(t1):
        for s in range(u1 + 1):
            py1[s, t] = lsm[t, s, 0]
            if s < u1:
                px1[s, t] = lsm[t, s, tg[1, s]]
    ref, _, _ = _brute(px1, py1, (0, 0, u1, t1), False)
    assert losses[1] == pytest.approx(ref, rel=1e-5 if dtype == np.float32 else 1e-12)
    # no gradient asked: the same losses
    only = joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5, want_grad=False)[0]
    assert np.array_equal(only, losses, equal_nan=True)


def test_fused_driver_runs_the_two_pass_kernels_under_warmup_only(two_pass_spies, monkeypatch):
    x, tg, il, tl, bd = _fused_case(np.random.default_rng(8), np.float64)
    x[1] /= 1000.0
    x[2, 1, 1, 3] = 0.0
    joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)
    assert all(spy.orders == [] for spy in two_pass_spies.values())
    monkeypatch.setattr(_numerics, "_compile_both", True)
    joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)
    for spy in two_pass_spies.values():
        assert [(o.shape, o.dtype) for o in spy.orders] == [((0,), np.int64)]


_SHIFTED_PASSES = ("_shifted_forward", "_shifted_backward", "_row_lse", "_backward_row_shifted",
                   "_lattice_forward_serial", "_lattice_backward_serial")


def test_a_first_call_without_such_rows_compiles_no_max_shifted_pass():
    out = run_with_empty_cache("""
        import json, numba.core.event as ev
        import numpy as np
        compiled = []
        class L(ev.Listener):
            def on_start(self, e):
                compiled.append(e.data["dispatcher"].py_func.__name__)
            def on_end(self, e):
                pass
        ev.register("numba:compile", L())
        from duoloss.core.losses import joiner
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 6, 3, 9)).astype(np.float32)
        tg = np.array([[1, 2], [3, 4]]); il = np.array([6, 5]); tl = np.array([2, 1])
        bd = np.array([[0, 0, 2, 6], [0, 0, 1, 5]])
        joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)
        first = list(compiled)
        x[0] *= 100.0
        losses = joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 0.5)[0]
        print(json.dumps({"first": first, "then": compiled[len(first):],
                          "finite": bool(np.isfinite(losses).all())}))
    """)
    r = json.loads(out.strip().splitlines()[-1])
    assert "_fused_serial" in r["first"]
    assert not set(_SHIFTED_PASSES) & set(r["first"]), r["first"]
    assert set(_SHIFTED_PASSES) <= set(r["then"]) and r["finite"], r


def _bad_signatures():
    """Transducer-family kernels with a uint64 argument (a prange index), and
    per-sequence and per-frame functions with a literal argument (the fused
    kernel passes ``modified`` at run time, so that the sweeps share one
    signature per dtype with the two-pass path), but for the deliberate literal
    ``in_out`` (True from the fused kernel, False from the two-pass path) of
    the backward frame loop."""
    found = set()
    mods = ("duoloss.core.losses.transducer", "duoloss.core.losses.joiner",
            "duoloss.core.losses.tdt")
    per_sequence = {name: [] for name in (
        "_one_linear", "_one", "_seq", "_exp_moves", "_linear_forward", "_linear_backward",
        "_fill_box", "_lattice_forward_frames")}
    per_sequence["_lattice_backward_frames"] = [11]
    # (module-level kernels only: gc.get_objects() would meet dead weak proxies)
    kernels = [obj for mod in mods for obj in list(vars(sys.modules[mod]).values())
               if isinstance(obj, CPUDispatcher)]
    for obj in kernels:
        if obj.py_func.__module__ in mods:
            name = obj.py_func.__name__
            for sig in obj.signatures:
                literal = [i for i, t in enumerate(sig) if isinstance(t, types.Literal)]
                if types.uint64 in sig or (name in per_sequence
                                           and literal not in ([], per_sequence[name])):
                    found.add((name, str(sig)))
    return found


def test_warmup_compiles_no_duplicate_signatures(monkeypatch):
    """Under warmup every kernel (fallbacks too) runs: no uint64/literal duplicates."""
    monkeypatch.setattr(_numerics, "_compile_both", True)
    rng = np.random.default_rng(5)
    px, py, bd = _lattice(rng, 2, 2, 3, False, 1.0)
    transducer_loss_and_grad(px, py, bd)
    x = rng.normal(size=(2, 3, 3, 4))
    tg = rng.integers(1, 4, (2, 2))
    ln = np.array([3, 2])
    bd = np.array([[0, 0, 2, 3], [0, 0, 2, 2]])
    joiner.rnnt_loss_from_logits(x, tg, ln, np.array([2, 2]), 0, bd)
    bad = _bad_signatures()
    assert not bad, bad
