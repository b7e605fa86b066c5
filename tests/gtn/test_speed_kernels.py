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
from duoloss.core.graph import compose as KC
from duoloss.core.graph import scores as KS
from duoloss.core.graph import ops as ops


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
        assert KS.is_sorted_dag(src, dst)
        sc, mx, sm = KS.log_forward_sorted(n, src, dst, w, start, accept)
        with np.errstate(all="ignore"):
            alpha = np.where(np.isnan(sm), np.nan, np.where(np.isinf(mx), mx, mx + np.log(sm)))
        scratch = np.empty(2 * n + src.size + 1, np.int64)
        st2, sc2, alpha2, order, op, oi = KS.log_forward_fast(n, src, dst, w, start, accept, scratch)
        assert st2 == 0
        assert _close(sc, sc2), (trial, sc, sc2)
        assert _close(alpha, alpha2), trial
        g = KS.log_backward_sorted(src, dst, w, accept, mx, sm, sc, np.empty(n), np.empty(n))
        g2 = KS.log_backward_fast(order, op, oi, dst, w, accept, alpha2, sc2, np.empty(n))
        assert _close(g, g2), trial
        if special:
            continue  # (a NaN behind a -inf arc: the fast kernels skip -inf sources)
        # and the useful-part kernels (the mathematics on any acyclic graph)
        prep = KS.dag_prepare(n, src, dst, start, accept)
        sc3, a3 = KS.log_forward(prep[1], prep[3], prep[6], prep[7], src, w, start, accept, n)
        assert _close(sc, sc3), (trial, sc, sc3)
        g3 = KS.log_backward(prep[1], prep[3], prep[4], prep[5], src, dst, w, accept, n, a3, sc3)
        assert _close(g, g3), trial


def test_sorted_detection():
    assert KS.is_sorted_dag(np.array([0, 0, 1], np.int64), np.array([1, 2, 2], np.int64))
    assert not KS.is_sorted_dag(np.array([0, 1, 0], np.int64), np.array([1, 2, 2], np.int64))
    assert not KS.is_sorted_dag(np.array([0, 1], np.int64), np.array([1, 1], np.int64))
    assert not KS.is_sorted_dag(np.array([1], np.int64), np.array([0], np.int64))
    assert KS.is_sorted_dag(np.zeros(0, np.int64), np.zeros(0, np.int64))


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


def test_sorted_kernels_large_sums_and_wide_ranges():
    # 30 parallel arcs per step: the scaled sums grow like 30**t and are renormalised
    g = gtn.linear_graph(300, 30, True)
    w = np.zeros(9000, np.float32)
    w[::7] = -1000.0   # terms far below exp(-708) of their sum
    w[5::11] = 3.0
    g.set_weights(w)
    s = gtn.forward_score(g)
    gtn.backward(s)
    ref = 0.0
    post = np.zeros((300, 30))
    for t in range(300):
        row = w[t * 30:(t + 1) * 30].astype(np.float64)
        top = row.max()
        lse = top + np.log(np.exp(row - top).sum())
        ref += lse
        post[t] = np.exp(row - lse)
    assert np.isclose(s.item(), ref, rtol=1e-6)
    np.testing.assert_allclose(g.grad().weights_to_numpy().reshape(300, 30), post, rtol=1e-6, atol=1e-30)
    # same graph through the general kernels (arcs reversed: not source-sorted)
    rng = np.random.default_rng(5)
    for scale in (1.0, 50.0, 400.0):
        n, m = 40, 160
        src = np.sort(rng.integers(0, n - 1, size=m))
        dst = np.minimum(src + 1 + rng.integers(0, 4, size=m), n - 1)
        keep = dst > src
        src, dst = src[keep].astype(np.int64), dst[keep].astype(np.int64)
        w = (scale * rng.normal(size=src.size)).astype(np.float32)
        start = np.zeros(n, np.bool_)
        start[[0, 3]] = True
        accept = np.zeros(n, np.bool_)
        accept[[n - 1, n - 5]] = True
        sc, mx, sm = KS.log_forward_sorted(n, src, dst, w, start, accept)
        scratch = np.empty(2 * n + src.size + 1, np.int64)
        st2, sc2, alpha2, order, op, oi = KS.log_forward_fast(n, src, dst, w, start, accept, scratch)
        assert np.isclose(sc, sc2, rtol=1e-14, atol=1e-12)
        g1 = KS.log_backward_sorted(src, dst, w, accept, mx, sm, sc, np.empty(n), np.empty(n))
        g2 = KS.log_backward_fast(order, op, oi, dst, w, accept, alpha2, sc2, np.empty(n))
        # posteriors are exp(alpha + w + beta - score): an exponent of size |score|
        # carries a rounding error of about |score| * 2**-52 in either kernel
        tol = 1e-13 + 8 * abs(sc) * 2.0 ** -52
        np.testing.assert_allclose(g1, g2, rtol=tol, atol=1e-300)


def test_fast_exp_accuracy():
    from duoloss.core._numerics import fast_exp
    import numba

    @numba.njit
    def vexp(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = fast_exp(x[i])
        return out

    rng = np.random.default_rng(0)
    edges = np.array([0.0, -0.0, -np.inf, np.inf, np.nan, 709.0, 709.78, 709.79, -708.0,
                      np.nextafter(-708.0, 0), np.nextafter(-708.0, -1e9), -708.4, -745.1,
                      -745.2, -746.0, 1e-300, -1e-300, 5e-324, 1e-17, -1e-17])
    x = np.concatenate([rng.uniform(-760, 720, 100000), rng.uniform(-40, 1, 100000),
                        rng.uniform(-1e-3, 1e-3, 10000), edges])
    got = vexp(x)
    with np.errstate(all="ignore"):
        ref = np.exp(x)
    inside = (x >= -708.0) & (x <= 709.0)
    # outside [-708, 709] (and NaN) it is the C library's exp: exact IEEE specials
    out = ~inside
    assert np.array_equal(got[out], ref[out], equal_nan=True)
    # inside: within 1e-15 relative of numpy (itself < 1 ulp)
    assert np.max(np.abs(got[inside] - ref[inside]) / ref[inside]) <= 1e-15
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(120):
        sample = np.concatenate([x[inside][rng.choice(inside.sum() - edges.size, 3000)],
                                 edges[(edges >= -708) & (edges <= 709)]])
        vals = vexp(sample)
        worst = max(abs(float((mpmath.mpf(float(v)) - mpmath.exp(mpmath.mpf(float(s)))) /
                              mpmath.exp(mpmath.mpf(float(s)))))
                    for s, v in zip(sample, vals))
    assert worst <= 1.5 * 2.0 ** -53   # correctly rounded would be 2**-53


def test_sorted_kernels_float64_accuracy_on_a_chain():
    # a linear graph's posteriors are the row-wise softmax of its weights
    M, N = 400, 30
    rng = np.random.default_rng(7)
    w = (3 * rng.normal(size=M * N)).astype(np.float32)
    w[::13] = -np.inf
    g = gtn.linear_graph(M, N, False)
    n, src, dst, il, ol, _, start, accept = gtn.graph_arrays(g)
    sc, mx, sm = KS.log_forward_sorted(n, src, dst, w, start, accept)
    rows = w.astype(np.float64).reshape(M, N)
    top = rows.max(1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(rows - top).sum(1))
    assert abs(sc - lse.sum()) <= 1e-13 * abs(lse.sum())
    post = KS.log_backward_sorted(src, dst, w, accept, mx, sm, sc, np.empty(n), np.empty(n))
    ref = np.exp(rows - lse[:, None]).reshape(-1)
    np.testing.assert_allclose(post, ref, rtol=1e-12, atol=0)


def test_grad_graph_is_independent_of_its_graph():
    # grad() shares the (never modified in place) structure arrays
    g = gtn.Graph(True)
    for _ in range(3):
        g.add_node(_ == 0, _ == 2)
    g.add_arc(0, 1, 0, 0, 0.5)
    g.add_arc(1, 2, 1, 1, 0.25)
    gtn.backward(gtn.forward_score(g))
    d = g.grad()
    g.add_node(False, True)
    g.add_arc(2, 3, 2, 2, 1.0)
    d.add_node(True, False)
    d.add_arc(3, 0, 5, 5, 2.0)
    g.set_weights([1.0, 2.0, 3.0])
    assert g.num_arcs() == 3 and d.num_arcs() == 3
    assert g.labels_to_list() == [0, 1, 2] and d.labels_to_list() == [0, 1, 5]
    assert d.weights_to_list() == [1.0, 1.0, 2.0]
    assert g.accept() == [2, 3] and d.accept() == [2] and d.start() == [0, 3]
    n, src, dst = gtn.graph_arrays(g)[:3]
    assert src.tolist() == [0, 1, 2] and gtn.graph_arrays(d)[1].tolist() == [0, 1, 3]


def test_fast_exp_tables():
    from duoloss.core import _numerics as f

    hi, lo, l_hi, l_lo, inv = f._tables()
    assert np.array_equal(hi, f._T_HI) and np.array_equal(lo, f._T_LO)
    assert (l_hi, l_lo, inv) == (f._L_HI, f._L_LO, f._INV_L)


def test_exp_poly_and_log_poly_accuracy():
    """The table-free exp/log of the vectorised loops (joiner, transducer lattice)
    against mpmath at 120 bits: within 2 ulp on their documented domains."""
    import numba

    from duoloss.core._numerics import exp_poly, log_poly

    @numba.njit
    def both(x, y):
        e = np.empty_like(x)
        lg = np.empty_like(y)
        for i in range(x.shape[0]):
            e[i] = exp_poly(x[i])
        for i in range(y.shape[0]):
            lg[i] = log_poly(y[i])
        return e, lg

    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-708, 0.5, 3000), rng.uniform(-1e-3, 1e-3, 300),
                        [0.0, -708.0, 0.5, -0.34657359, 0.34657359]])
    y = np.concatenate([np.exp(rng.uniform(-700, 700, 3000)), 1 + rng.uniform(-1e-4, 1e-4, 300),
                        [1.0, 2.0, 0.5, np.sqrt(2.0), np.nextafter(np.sqrt(2.0), 2),
                         2.2250738585072014e-308, 1.7976931348623157e308]])
    e, lg = both(x, y)
    # specials: below -708 and -inf give 0, NaN stays NaN
    se, _ = both(np.array([-708.5, -1e300, -np.inf, np.nan]), np.ones(1))
    assert se[0] == se[1] == se[2] == 0.0 and np.isnan(se[3])
    mpmath = pytest.importorskip("mpmath")
    ulp = 2.0 ** -52
    with mpmath.workprec(120):
        worst_e = max(abs(float((mpmath.mpf(float(v)) - mpmath.exp(mpmath.mpf(float(s))))
                                / mpmath.exp(mpmath.mpf(float(s))))) for s, v in zip(x, e))
        worst_l = max(abs(float(mpmath.mpf(float(v)) - mpmath.log(mpmath.mpf(float(s)))))
                      / max(abs(float(mpmath.log(mpmath.mpf(float(s))))), 1e-300)
                      for s, v in zip(y, lg) if s != 1.0)
    assert worst_e <= 2 * ulp and worst_l <= 2 * ulp
    assert lg[np.flatnonzero(y == 1.0)].tolist() == [0.0]
