"""``ctc_align`` and ``rnnt_align`` with ``impl='device'`` (duoloss/jax/_xla/align.py:
max-plus scans with one-byte back-pointers) against the host path (the numba core is the oracle): the same labels,
and the same scores bit for bit with ``jax_enable_x64`` on (float32 rounding with it
off); ties (equal log-probabilities) broken by the core's rule; infeasible, empty,
invalid (traced) and NaN cases; ``jit`` (no callback in the jaxpr) and ``vmap``.
"""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp

import duoloss.jax as dj

MODES = [(np.float32, False), (np.float32, True), (np.float64, True)]
MODE_IDS = ["f32-x64off", "f32-x64on", "f64"]


def case(dtype, seed=0, t=9, n=7, c=5, s=4):
    rng = np.random.default_rng(seed)
    lp = np.array(jax.nn.log_softmax(jnp.asarray(rng.standard_normal((t, n, c)), dtype), -1))
    tg = rng.integers(1, c, (n, s))
    tg[0, 1] = tg[0, 0]                               # a repeat: a blank in between
    il = np.array([t, t - 2, 3, 0, 0, 2, t])[:n]      # zero frames with and without targets
    tl = np.array([4, 3, 2, 0, 1, 2, 0])[:n]          # 3 frames for '2 labels', 2 for 2: tight
    tg[5, 1] = tg[5, 0]                               # repeat in 2 frames: infeasible
    return lp, tg, il, tl


def check_equal(host, dev, exact):
    (hl, hs), (dl, ds) = host, dev
    assert dl.dtype == hl.dtype and ds.dtype == hs.dtype
    assert dl.shape == hl.shape and ds.shape == hs.shape
    np.testing.assert_array_equal(np.asarray(dl), np.asarray(hl))
    hs, ds = np.asarray(hs), np.asarray(ds)
    if exact:
        np.testing.assert_array_equal(ds.reshape(-1).view(np.uint8), hs.reshape(-1).view(np.uint8))
    else:
        np.testing.assert_array_equal(np.isnan(ds), np.isnan(hs))
        np.testing.assert_allclose(ds, hs, rtol=2e-6, atol=1e-6)


def both(*args, **kw):
    return dj.ctc_align(*args, impl="host", **kw), dj.ctc_align(*args, impl="device", **kw)


@pytest.mark.parametrize("dtype,x64", MODES, ids=MODE_IDS)
def test_random_equals_host(dtype, x64):
    with jax.enable_x64(x64):
        lp, tg, il, tl = case(dtype)
        host, dev = both(lp, tg, il, tl)
        check_equal(host, dev, exact=x64)
        s = np.asarray(dev[1])
        assert s[3] == 0 and s[4] == -np.inf and s[5] == -np.inf  # empty, 0 frames, infeasible
        assert (np.asarray(dev[0])[[3, 4, 5]] == -1).all()
        if dtype == np.float32 and x64:
            return
        # jit (no callback) and vmap over a leading axis of two batches
        f = jax.jit(lambda x: dj.ctc_align(x, tg, il, tl, impl="device"))
        assert "callback" not in str(jax.make_jaxpr(f)(lp))
        check_equal(host, f(lp), exact=x64)
        g = jax.vmap(lambda x, y: dj.ctc_align(x, y, il, tl, impl="device"))
        lab2, sc2 = g(jnp.stack([lp, lp[::-1]]), jnp.stack([tg, tg]))
        check_equal(host, (lab2[0], sc2[0]), exact=x64)
        check_equal(dj.ctc_align(lp[::-1], tg, il, tl, impl="host"), (lab2[1], sc2[1]), exact=x64)


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
def test_ties_follow_the_core_rule(x64):
    # equal log-probabilities: every path ties; labels as early as possible, blanks late
    with jax.enable_x64(x64):
        lp = np.full((3, 1, 3), np.log(1 / 3), np.float32)
        labels, scores = dj.ctc_align(lp, np.array([[1]]), np.array([3]), np.array([1]),
                                      impl="device")
        assert np.asarray(labels).tolist() == [[1, 0, 0]]
        np.testing.assert_allclose(np.asarray(scores), [3 * np.log(1 / 3)], rtol=1e-6)
        # many ties at once: constant and two-valued log-probs, repeats, longer inputs
        rng = np.random.default_rng(1)
        lp = rng.choice([-1.0, -2.0], (12, 5, 4)).astype(np.float32)  # integer sums: exact
        lp[:, 0] = 0.0
        tg = np.array([[1, 1, 2], [3, 2, 3], [1, 2, 3], [2, 2, 2], [1, 0, 0]])
        il, tl = np.array([12, 10, 7, 12, 5]), np.array([3, 3, 3, 3, 1])
        check_equal(*both(lp, tg, il, tl), exact=True)


def test_neg_inf_nan_and_empty_shapes():
    with jax.enable_x64(True):
        lp, tg, il, tl = case(np.float64, seed=2)
        lp[:, 1, tg[1, 0]] = -np.inf          # its first label is never emitted: infeasible
        lp[2, 2, 0] = np.nan                  # a NaN frame in sequence 2 only
        lp[:, 6, 3] = -np.inf                 # an unread class
        lp[:, 0, 4] = np.inf                  # +inf in a class it may not read
        host, dev = both(lp, tg, il, tl)
        check_equal(host, dev, exact=True)
        assert np.asarray(dev[1])[1] == -np.inf and np.isnan(np.asarray(dev[1])[2])
        # T = 0, N = 0, S = 0, unbatched
        for args in [(np.zeros((0, 2, 3)), np.array([[1], [2]]), np.array([0, 0]), np.array([0, 1])),
                     (np.zeros((4, 0, 3)), np.zeros((0, 2), int), np.zeros(0, int), np.zeros(0, int)),
                     (lp[:, :3], np.zeros((3, 0), int), np.array([9, 1, 0]), np.zeros(3, int)),
                     (lp[:, 0], tg[0], np.array(9), np.array(4))]:
            check_equal(*both(*args), exact=True)


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
def test_invalid_traced_values_give_nan(x64):
    with jax.enable_x64(x64):
        lp, tg, il, tl = case(np.float32, seed=3)
        tg[0, 2] = 7                              # out of range
        tg[1, 0] = 0                              # the blank
        il[2] = 99                                # longer than T
        f = jax.jit(lambda a, b, c, d, impl: dj.ctc_align(a, b, c, d, impl=impl),
                    static_argnames="impl")
        host, dev = f(lp, tg, il, tl, "host"), f(lp, tg, il, tl, "device")
        check_equal(host, dev, exact=x64)
        assert np.isnan(np.asarray(dev[1])[:3]).all() and (np.asarray(dev[0])[:3] == -1).all()


def test_bad_impl_and_eager_validation():
    lp, tg, il, tl = case(np.float32)
    with pytest.raises(ValueError, match="ctc_align: argument 'impl'"):
        dj.ctc_align(lp, tg, il, tl, impl="gpu")
    tg[0, 0] = 0
    with pytest.raises(ValueError, match="ctc_align"):
        dj.ctc_align(lp, tg, il, tl, impl="device")


# ---------------------------------------------------------------- RNN-T
def rnnt_case(dtype, seed=0, n=6, t=6, u=3, v=4):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, t, u + 1, v)).astype(dtype)
    tg = rng.integers(0, v - 1, (n, u))                  # blank = v - 1 (the default -1)
    il = np.array([t, 4, 0, 0, 2, 1])[:n]               # zero frames with and without labels
    tl = np.array([3, 2, 0, 1, 3, 0])[:n]
    return logits, tg, il, tl


def check_rnnt(host, dev, exact):
    for h, d in zip(host[:2], dev[:2]):                  # alignment, label frames
        assert d.dtype == h.dtype and d.shape == h.shape
        np.testing.assert_array_equal(np.asarray(d), np.asarray(h))
    check_equal((host[0], host[2]), (dev[0], dev[2]), exact)


def rnnt_both(*args, **kw):
    return dj.rnnt_align(*args, impl="host", **kw), dj.rnnt_align(*args, impl="device", **kw)


@pytest.mark.parametrize("dtype,x64", MODES, ids=MODE_IDS)
def test_rnnt_random_equals_host(dtype, x64):
    with jax.enable_x64(x64):
        logits, tg, il, tl = rnnt_case(dtype)
        host, dev = rnnt_both(logits, tg, il, tl)
        check_rnnt(host, dev, exact=x64)
        s = np.asarray(dev[2])
        assert s[2] == 0 and s[3] == -np.inf and (np.asarray(dev[0])[3] == -1).all()
        if dtype == np.float32 and x64:
            return
        f = jax.jit(lambda x: dj.rnnt_align(x, tg, il, tl, impl="device"))
        assert "callback" not in str(jax.make_jaxpr(f)(logits))
        check_rnnt(host, f(logits), exact=x64)
        out = jax.vmap(lambda x: dj.rnnt_align(x, tg, il, tl, impl="device"))(
            jnp.stack([logits, logits[:, ::-1]]))
        check_rnnt(host, [o[0] for o in out], exact=x64)
        check_rnnt(dj.rnnt_align(logits[:, ::-1], tg, il, tl, impl="host"), [o[1] for o in out],
                   exact=x64)


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
def test_rnnt_ties_and_special_values(x64):
    with jax.enable_x64(x64):
        # uniform logits: every path ties; symbols as late as possible (the core's rule)
        align, frames, scores = dj.rnnt_align(np.zeros((1, 2, 2, 3), np.float32), np.array([[0]]),
                                              np.array([2]), np.array([1]), impl="device")
        assert align.tolist() == [[2, 0, 2]] and frames.tolist() == [[1]]
        # integer-valued log-probs (fused_log_softmax=False): many exact ties
        rng = np.random.default_rng(4)
        lg = rng.choice([-1.0, -2.0], (6, 5, 4, 4)).astype(np.float32)
        tg = rng.integers(0, 3, (6, 3))
        il, tl = np.array([5, 5, 3, 1, 0, 4]), np.array([3, 2, 3, 1, 0, 0])
        check_rnnt(*rnnt_both(lg, tg, il, tl, fused_log_softmax=False), exact=True)
        lg[1, :, :, tg[1, 0]] = -np.inf                  # its first label never: infeasible
        lg[2, 1, 1, :] = np.nan                          # a NaN node in sequence 2
        lg[0, 4, 3, :] = np.inf                          # the final node: score +inf
        lg[5, :, 1:, :] = np.nan                         # nodes past its (empty) target: unread
        host, dev = rnnt_both(lg, tg, il, tl, fused_log_softmax=False)
        check_rnnt(host, dev, exact=True)
        assert np.asarray(dev[2])[1] == -np.inf and np.isnan(np.asarray(dev[2])[2])
        # invalid traced values: NaN and -1, as the host path
        tg2, il2 = tg.copy(), il.copy()
        tg2[0, 1] = 3                                    # the blank
        il2[1] = 9                                       # longer than T
        f = jax.jit(lambda a, b, c, d, impl: dj.rnnt_align(a, b, c, d, impl=impl),
                    static_argnames="impl")
        dev = f(lg, tg2, il2, tl, "device")
        check_rnnt(f(lg, tg2, il2, tl, "host"), dev, exact=x64)
        assert np.isnan(np.asarray(dev[2])[:2]).all() and (np.asarray(dev[0])[:2] == -1).all()


def test_rnnt_empty_shapes_and_bad_impl():
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        for n, t, u in [(2, 3, 0), (2, 0, 2), (0, 3, 2)]:
            lg = rng.standard_normal((n, t, u + 1, 3))
            tg = rng.integers(0, 2, (n, u))
            il = np.full(n, t)
            tl = np.full(n, u)
            check_rnnt(*rnnt_both(lg, tg, il, tl), exact=True)
        with pytest.raises(ValueError, match="rnnt_align: argument 'impl'"):
            dj.rnnt_align(lg, tg, il, tl, impl=None)
