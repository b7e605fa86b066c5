"""The aligners' bounded-memory paths compile lazily (issue 19, cold compile).

`ctc_align` / `asg_align` mark the sequences above the checkpoint threshold as pending in
the batch kernel, and a separate kernel (`_ctc_align_big` / `_asg_align_big`) aligns them
on the checkpointed path, so a first call that needs no such sequence never compiles it:

* mixed batches (some sequences pending, some not; serial, thread-pool and every
  threshold) give the full-table labels and scores bit for bit, ties, infeasible, empty,
  invalid and NaN sequences included, and pending sequences' scores and paths are
  brute-force Viterbi optima (an independent reference) on tiny inputs;
* the batch kernels write only the sequences listed in ``order`` (any subset), so they
  can be split over threads;
* a fresh process that aligns small sequences compiles neither `_ctc_align_checkpointed`
  nor `_asg_align_checkpointed`; with ``_compile_both`` (warmup) the pending kernels
  compile with an empty index array, with the signature a real call then uses.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from duoloss.core import _numerics
from duoloss.core.losses import align as core_align
from fresh_process import run_with_empty_cache
from test_align_long import asg_random_case
from test_asg_reference import brute_ctc_align


def _ctc_case(rng, trial, n=5):
    t_max = int(rng.integers(1, 25))
    n_cls = int(rng.integers(2, 5))
    s = int(rng.integers(1, 8))
    lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, n)))
    if trial % 3 == 1:
        lp = np.round(lp)  # many ties
    elif trial % 3 == 2:
        lp[:] = -1.0  # every path ties
    tg = rng.integers(1, n_cls, size=(n, s))
    il = rng.integers(0, t_max + 1, size=n)
    tl = rng.integers(0, s + 1, size=n)
    return lp, tg, il, tl


def _thresholds(cells):
    """Checkpoint thresholds: all pending, none, and between every pair of sizes."""
    sizes = sorted(set(int(c) for c in cells))
    return [0, 1 << 40] + [c for c in sizes if c > 0]


def _assert_same(a, b, msg=""):
    np.testing.assert_array_equal(a[0], b[0], err_msg=msg)
    np.testing.assert_array_equal(a[1], b[1], err_msg=msg)
    assert a[1].dtype == b[1].dtype


def test_ctc_mixed_pending_equals_full_table(rng):
    for trial in range(60):
        lp, tg, il, tl = _ctc_case(rng, trial)
        full = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=1 << 40)
        cells = il * (2 * tl + 1)
        for limit in _thresholds(cells):
            got = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=limit)
            _assert_same(got, full, f"trial {trial} limit {limit}")


def test_asg_mixed_pending_equals_full_table(rng):
    for trial in range(60):
        em, trans, start, tg, il, tl = asg_random_case(rng, trial, 30, 5, 10)
        full = core_align.asg_align(em, trans, tg, il, tl, start_transitions=start,
                                    _checkpoint_cells=1 << 40)
        for limit in _thresholds(il * tl):
            got = core_align.asg_align(em, trans, tg, il, tl, start_transitions=start,
                                       _checkpoint_cells=limit)
            _assert_same(got, full, f"trial {trial} limit {limit}")


def test_float32_pending_scores_keep_the_dtype(rng):
    lp, tg, il, tl = _ctc_case(rng, 0)
    lp = lp.astype(np.float32)
    full = core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=1 << 40)
    _assert_same(core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=0), full)
    full = core_align.asg_align(lp, None, tg, il, tl, _checkpoint_cells=1 << 40)
    _assert_same(core_align.asg_align(lp, None, tg, il, tl, _checkpoint_cells=0), full)


def test_pending_on_threads_equals_full_table(rng, monkeypatch):
    monkeypatch.setattr(core_align, "_PENDING_THREADS_MIN_CELLS", 0)
    n = 7
    lp = np.log(rng.dirichlet(np.ones(4), size=(60, n)))
    tg = rng.integers(1, 4, size=(n, 12))
    il = np.array([60, 55, 0, 60, 3, 41, 60])
    tl = np.array([12, 9, 0, 0, 12, 5, 12])  # one too short for its target
    em = rng.normal(size=(60, n, 4))
    trans = rng.normal(size=(4, 4))
    for limit in (0, 150):
        _assert_same(core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=limit),
                     core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=1 << 40))
        _assert_same(core_align.asg_align(em, trans, tg, il, tl, _checkpoint_cells=limit),
                     core_align.asg_align(em, trans, tg, il, tl, _checkpoint_cells=1 << 40))


def test_pending_infeasible_invalid_nan_and_empty():
    lp = np.zeros((3, 5, 3))
    tg = np.array([[1, 1, 2], [1, 2, 1], [1, 1, 1], [5, 1, 1], [1, 1, 1]])
    il, tl = [3, 0, 3, 3, 3], [3, 0, 0, 1, 1]  # infeasible / empty / no target / bad label
    for cells in (0, 1 << 40):
        labels, scores = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=cells)
        assert scores[0] == -np.inf and np.all(labels[0] == -1)
        assert scores[1] == 0.0 and np.all(labels[1] == -1)
        assert scores[2] == 0.0 and list(labels[2]) == [0, 0, 0]
        assert np.isnan(scores[3]) and np.all(labels[3] == -1)
        labels, scores = core_align.asg_align(lp, None, tg, [2, 0, 3, 3, 3], tl,
                                              _checkpoint_cells=cells)
        assert scores[0] == -np.inf and np.all(labels[0] == -1)  # L > T
        assert scores[1] == 0.0 and np.all(labels[1] == -1)
        assert scores[2] == -np.inf and np.all(labels[2] == -1)
        assert np.isnan(scores[3]) and np.all(labels[3] == -1)
        assert scores[4] == 0.0 and list(labels[4]) == [1, 1, 1]
    lp[1, 0, :] = np.nan
    lp[:, 4, 1] = -np.inf  # every path through label 1 is -inf
    _assert_same(core_align.ctc_align(lp, tg, il, [1, 0, 0, 1, 1], _checkpoint_cells=0),
                 core_align.ctc_align(lp, tg, il, [1, 0, 0, 1, 1], _checkpoint_cells=1 << 40))
    _assert_same(core_align.asg_align(lp, None, tg, il, [1, 0, 0, 1, 1], _checkpoint_cells=0),
                 core_align.asg_align(lp, None, tg, il, [1, 0, 0, 1, 1],
                                      _checkpoint_cells=1 << 40))
    a = core_align.ctc_align(lp, tg, il, [1, 0, 0, 1, 1], _checkpoint_cells=0)
    assert np.isnan(a[1][0]) and a[1][4] == -np.inf and np.all(a[0][4] == -1)


def _brute_asg_align(em, trans, start, target):
    """Best ASG path by enumeration: every monotone map of the frames onto the target
    positions (first frame on the first, last frame on the last, each step stays or
    advances by one); score = start + emissions + transitions between frame tokens."""
    t_max = em.shape[0]
    n_lab = len(target)
    best, arg = -np.inf, set()
    for steps in itertools.product((0, 1), repeat=t_max - 1):
        pos = np.concatenate([[0], np.cumsum(steps)]).astype(int)
        if pos[-1] != n_lab - 1:
            continue
        path = tuple(int(target[p]) for p in pos)
        w = start[path[0]] + em[0, path[0]] + sum(
            em[t, path[t]] + trans[path[t], path[t - 1]] for t in range(1, t_max))
        if w > best + 1e-12:
            best, arg = w, {path}
        elif abs(w - best) <= 1e-12:
            arg.add(path)
    return best, arg


def test_pending_paths_are_brute_force_viterbi_optima(rng):
    for trial in range(30):
        t_max = int(rng.integers(1, 7))
        n_cls = 3
        lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, 2)))
        if trial % 2:
            lp = np.round(lp, 0)
        n_lab = int(rng.integers(0, 4))
        target = [int(k) for k in rng.integers(1, n_cls, size=n_lab)]
        tg = np.array([target + [1], target + [1]], np.int64)
        # sequence 0 pending (its cells exceed the threshold), sequence 1 not (no frames)
        labels, scores = core_align.ctc_align(lp, tg, [t_max, 0], [n_lab, 0], blank=0,
                                              _checkpoint_cells=0)
        assert scores[1] == 0.0 and np.all(labels[1] == -1)
        best, arg = brute_ctc_align(lp[:, 0], target, 0)
        if best == -np.inf:
            assert scores[0] == -np.inf and np.all(labels[0] == -1)
        else:
            np.testing.assert_allclose(scores[0], best, rtol=1e-12, atol=1e-12)
            assert tuple(int(k) for k in labels[0]) in arg

        em = rng.normal(size=(t_max, 2, n_cls))
        trans = rng.normal(size=(n_cls, n_cls))
        start = rng.normal(size=n_cls)
        tg = rng.integers(0, n_cls, size=(2, 3))
        n_lab = int(rng.integers(1, 4))
        labels, scores = core_align.asg_align(em, trans, tg, [t_max, t_max], [n_lab, 0],
                                              start_transitions=start, _checkpoint_cells=0)
        best, arg = _brute_asg_align(em[:, 0], trans, start, tg[0, :n_lab])
        if best == -np.inf:
            assert scores[0] == -np.inf and np.all(labels[0] == -1)
        else:
            np.testing.assert_allclose(scores[0], best, rtol=1e-12, atol=1e-12)
            assert tuple(int(k) for k in labels[0]) in arg
        assert scores[1] == -np.inf and np.all(labels[1] == -1)


def test_batch_kernels_write_only_the_listed_sequences(rng):
    n = 6
    lp, tg, il, tl = _ctc_case(rng, 0, n)
    il = np.full(n, lp.shape[0])
    tl = np.minimum(tl, lp.shape[0] // 2)
    full = core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=1 << 40)
    em = rng.normal(size=lp.shape)
    trans, start = rng.normal(size=(lp.shape[2],) * 2), np.zeros(lp.shape[2])
    tg_asg = tg % lp.shape[2]
    full_asg = core_align.asg_align(em, trans, tg_asg, il, tl, _checkpoint_cells=1 << 40)
    order = np.array([4, 1, 3], np.int64)
    for limit in (0, 1 << 40):
        labels = np.full((n, lp.shape[0]), -7, np.int64)
        scores = np.full(n, 7.0)
        pending = np.zeros(n, np.int8)
        core_align._ctc_align_serial(order, lp, tg, il, tl, 0, limit, labels, scores, pending)
        core_align._ctc_align_big(np.flatnonzero(pending).astype(np.int64), lp, tg, il, tl, 0,
                                  labels, scores)
        rest = np.setdiff1d(np.arange(n), order)
        assert np.all(labels[rest] == -7) and np.all(scores[rest] == 7.0)
        assert np.all(pending[rest] == 0)
        np.testing.assert_array_equal(labels[order], full[0][order])
        np.testing.assert_array_equal(scores[order], full[1][order])

        labels[:] = -7
        scores[:] = 7.0
        pending[:] = 0
        core_align._asg_align_serial(order, em, trans, start, True, tg_asg, il, tl, limit,
                                     labels, scores, pending)
        core_align._asg_align_big(np.flatnonzero(pending).astype(np.int64), em, trans, start,
                                  True, tg_asg, il, tl, labels, scores)
        assert np.all(labels[rest] == -7) and np.all(scores[rest] == 7.0)
        np.testing.assert_array_equal(labels[order], full_asg[0][order])
        np.testing.assert_array_equal(scores[order], full_asg[1][order])


def test_compile_both_compiles_the_pending_kernels_with_the_real_signature(rng, monkeypatch):
    lp, tg, il, tl = _ctc_case(rng, 0)
    tr = rng.normal(size=(lp.shape[2],) * 2)
    monkeypatch.setattr(_numerics, "_compile_both", True)
    core_align.ctc_align(lp.astype(np.float32), tg, il, tl, _checkpoint_cells=1 << 40)
    core_align.asg_align(lp.astype(np.float32), tr, tg, il, tl, _checkpoint_cells=1 << 40)
    monkeypatch.setattr(_numerics, "_compile_both", False)
    ctc_sigs = set(core_align._ctc_align_big.signatures)
    asg_sigs = set(core_align._asg_align_big.signatures)
    assert ctc_sigs and asg_sigs
    core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=0)
    core_align.asg_align(lp, tr, tg, il, tl, _checkpoint_cells=0)
    assert set(core_align._ctc_align_big.signatures) == ctc_sigs
    assert set(core_align._asg_align_big.signatures) == asg_sigs


_FRESH = """
import numpy as np
from duoloss.core import _numerics
from duoloss.core.losses import align
lp = np.log(np.full((6, 2, 4), 0.25))
tg = np.array([[1, 2], [3, 1]])
align.ctc_align(lp, tg, [6, 5], [2, 1])
align.asg_align(lp, None, tg, [6, 5], [2, 1])
assert not align._ctc_align_checkpointed.signatures, "compiled eagerly"
assert not align._asg_align_checkpointed.signatures, "compiled eagerly"
assert not align._ctc_align_big.signatures and not align._asg_align_big.signatures
_numerics._compile_both = True
align.ctc_align(lp, tg, [6, 5], [2, 1])
align.asg_align(lp, None, tg, [6, 5], [2, 1])
assert len(align._ctc_align_big.signatures) == 1 and len(align._asg_align_big.signatures) == 1
print("OK")
"""


def test_small_sequences_do_not_compile_the_checkpointed_paths():
    assert run_with_empty_cache(_FRESH).strip().endswith("OK")
