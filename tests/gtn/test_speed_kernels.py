"""The fast paths of the graph engine against its general kernels.

* ``log_forward_sorted`` / ``log_backward_sorted`` (graphs whose node ids are a
  topological order and whose arcs are grouped by source) against
  ``log_forward_fast`` / ``log_backward_fast`` and the useful-part kernels, on
  random such graphs with ``-inf`` / ``+inf`` / NaN weights, several start and
  accept nodes, unreachable parts and dead ends;
* the label-table matching of ``compose_kernel`` against a merge-only run
  (the same graphs, so the same states and arcs in the same order).
"""
from __future__ import annotations

import numpy as np
import pytest

import duoloss.gtn as gtn
from duoloss.core import _graph_kernels as K
from duoloss.core import _graph_ops as ops


def _sorted_dag(rng, n, m, special):
    src = rng.integers(0, max(n - 1, 1), size=m)
    dst = src + 1 + rng.integers(0, 3, size=m)
    keep = dst < n
    src, dst = np.sort(src[keep]), None
    src = src.astype(np.int64)
    dst = (src + 1 + rng.integers(0, 3, size=src.size)).clip(max=n - 1).astype(np.int64)
    ok = dst > src
    src, dst = src[ok], dst[ok]
    w = rng.normal(size=src.size)
    if special and src.size:
        for val in (-np.inf, np.inf, np.nan):
            if rng.random() < 0.3:
                w[rng.integers(src.size)] = val
    start = rng.random(n) < 0.15
    start[0] = True
    accept = rng.random(n) < 0.15
    accept[n - 1] = rng.random() < 0.9
    return src, dst, w.astype(np.float32), start, accept


def _close(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same_nan = np.isnan(a) == np.isnan(b)
    fin = np.isfinite(a) & np.isfinite(b)
    return bool(np.all(same_nan) and np.all((a == b) | fin | np.isnan(a))
                and np.allclose(a[fin], b[fin], rtol=1e-13, atol=1e-13))


@pytest.mark.parametrize("special", [False, True])
def test_sorted_kernels_match_general(special):
    rng = np.random.default_rng(1 + special)
    for trial in range(400):
        n = int(rng.integers(1, 30))
        m = int(rng.integers(0, 80))
        src, dst, w, start, accept = _sorted_dag(rng, n, m, special)
        assert K.is_sorted_dag(src, dst)
        st, sc, alpha = K.log_forward_sorted(n, src, dst, w, start, accept, np.empty(n))
        assert st == 0
        scratch = np.empty(2 * n + src.size + 1, np.int64)
        st2, sc2, alpha2, order, op, oi = K.log_forward_fast(n, src, dst, w, start, accept, scratch)
        assert st2 == 0
        assert _close(sc, sc2), (trial, sc, sc2)
        assert _close(alpha, alpha2), trial
        g = K.log_backward_sorted(src, dst, w, accept, alpha, sc, np.empty(n))
        g2 = K.log_backward_fast(order, op, oi, dst, w, accept, alpha2, sc2, np.empty(n))
        assert _close(g, g2), trial
        if special:
            continue  # (a NaN behind a -inf arc: the fast kernels skip -inf sources)
        # and the useful-part kernels (the mathematics on any acyclic graph)
        prep = K.dag_prepare(n, src, dst, start, accept)
        sc3, a3 = K.log_forward(prep[1], prep[3], prep[6], prep[7], src, w, start, accept, n)
        assert _close(sc, sc3), (trial, sc, sc3)
        g3 = K.log_backward(prep[1], prep[3], prep[4], prep[5], src, dst, w, accept, n, a3, sc3)
        assert _close(g, g3), trial


def test_sorted_detection():
    assert K.is_sorted_dag(np.array([0, 0, 1], np.int64), np.array([1, 2, 2], np.int64))
    assert not K.is_sorted_dag(np.array([0, 1, 0], np.int64), np.array([1, 2, 2], np.int64))
    assert not K.is_sorted_dag(np.array([0, 1], np.int64), np.array([1, 1], np.int64))
    assert not K.is_sorted_dag(np.array([1], np.int64), np.array([0], np.int64))
    assert K.is_sorted_dag(np.zeros(0, np.int64), np.zeros(0, np.int64))


def _random_graph(rng, n, m, nlab, eps):
    src = rng.integers(0, n, size=m).astype(np.int64)
    dst = rng.integers(0, n, size=m).astype(np.int64)
    lab = rng.integers(-1 if eps else 0, nlab, size=m).astype(np.int64)
    return gtn.Graph.from_arrays(n, src, dst, lab, lab.copy(), rng.normal(size=m).astype(np.float32),
                                 np.flatnonzero(rng.random(n) < 0.3)[:3] if n > 1 else np.array([0]),
                                 np.flatnonzero(rng.random(n) < 0.3)[:3] if n > 1 else np.array([0]))


def test_label_table_matches_merge(monkeypatch):
    """Same output (node numbering, arc order, weights) with and without the
    (node, label) lookup tables: only the way matches are found differs."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        nlab = int(rng.integers(1, 12))
        eps = bool(rng.random() < 0.5)
        g1 = _random_graph(rng, int(rng.integers(1, 8)), int(rng.integers(0, 20)), nlab, eps)
        g2 = _random_graph(rng, int(rng.integers(1, 8)), int(rng.integers(0, 40)), nlab, eps)
        a = ops.compose(g1, g2)
        with monkeypatch.context() as mp:
            mp.setattr(ops, "_LABEL_TABLES", False)
            b = ops.compose(g1, g2)
        for x, y in zip(gtn.graph_arrays(a), gtn.graph_arrays(b)):
            np.testing.assert_array_equal(x, y)
