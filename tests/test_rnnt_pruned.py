"""k2-style simple and pruned RNN-T (``rnnt_loss_simple``, ``get_rnnt_prune_ranges``,
``do_rnnt_pruning``, ``rnnt_loss_pruned``) in both frontends.

Independent references: brute-force enumeration of every alignment (float64
numpy, on tiny lattices) for losses and occupation probabilities, counting
identities of the occupations, k2's identities (pruned with ``s_range = S+1``
equals the simple loss of the additive joiner), finite differences (torch
gradcheck, jax check_grads) and torch vs JAX.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads

import duoloss.jax as dj
import duoloss.torch as dt
from rnnt_reference import lattice_paths



@pytest.fixture(autouse=True)
def _x64():
    """float64 JAX inside these tests only (never the session-wide flag)."""
    with jax.enable_x64(True):
        yield

TYPES = ("regular", "modified", "constrained")


# ---------------------------------------------------------------- brute force


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _paths(ns, nt, rnnt_type):
    """Every alignment on an (ns symbols, nt frames) lattice: ('x', s, t) emits y_s at
    frame t, ('y', s, t) is a blank at frame t; regular paths end with a blank."""
    if rnnt_type == "regular":
        return lattice_paths(ns, nt, modified=False, last_is_blank=True)
    return lattice_paths(ns, nt, modified=True)


def brute_force(lp_fn, symbols, blank, boundary, rnnt_type, delay_penalty=0.0):
    """Loss ``-log sum_paths prod p`` and occupations of one sequence.

    ``lp_fn(t, s)`` is the ``(C,)`` log-softmax at frame t, context s, or None
    where the lattice is pruned away.  Returns (loss, occ_x, occ_y) with k2's
    index layout: occ_x[s, t] for the symbol arc leaving (s, t), occ_y[s, t]
    for the blank arc.
    """
    sb, tb, se, te = boundary
    S, T = len(symbols), None
    scores = []
    arcs = []
    for path in _paths(se - sb, te - tb, rnnt_type):
        total = 0.0
        used = []
        for kind, s, t in path:
            s, t = s + sb, t + tb
            lp = lp_fn(t, s)
            if lp is None:
                total = -np.inf
                break
            if kind == "x":
                total += lp[symbols[s]] + delay_penalty * ((te - 1) / 2 - t)
                if rnnt_type == "constrained":
                    nxt = lp_fn(t, s + 1)
                    total += -np.inf if nxt is None else nxt[blank]
            else:
                total += lp[blank]
            used.append((kind, s, t))
        scores.append(total)
        arcs.append(used)
    scores = np.array(scores)
    tot = np.logaddexp.reduce(scores) if len(scores) else -np.inf
    return -tot, arcs, scores


def occupations(arcs, scores, shape_x, shape_y):
    tot = np.logaddexp.reduce(scores)
    ox, oy = np.zeros(shape_x), np.zeros(shape_y)
    for used, sc in zip(arcs, scores):
        w = np.exp(sc - tot)
        for kind, s, t in used:
            (ox if kind == "x" else oy)[s, t] += w
    return ox, oy


# ---------------------------------------------------------------- inputs


def _inputs(seed, B=2, T=4, S=3, C=5, blank=0):
    rng = np.random.default_rng(seed)
    am = rng.standard_normal((B, T, C))
    lm = rng.standard_normal((B, S + 1, C))
    symbols = rng.integers(1, C, (B, S))
    return am, lm, symbols


def _boundary(B, S, T, rnnt_type):
    rows = [[0, 0, S, T], [0, 0, S - 1, T - 1]]
    if rnnt_type == "regular":
        rows[1] = [1, 1, S, T - 1]
    return np.array(rows[:B], np.int64)


def _simple_ref(am, lm, symbols, blank, boundary, rnnt_type, dp=0.0):
    out = []
    for b in range(am.shape[0]):
        full = _log_softmax(am[b][:, None, :] + lm[b][None, :, :])  # (T, S+1, C)
        out.append(brute_force(lambda t, s: full[t, s], symbols[b], blank, boundary[b],
                               rnnt_type, dp)[0])
    return np.array(out)


def _to_t(x):
    return torch.from_numpy(np.asarray(x))


# ---------------------------------------------------------------- simple loss


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("with_boundary", [False, True])
@pytest.mark.parametrize("dp", [0.0, 0.3])
def test_simple_loss_matches_brute_force(rnnt_type, with_boundary, dp):
    B, T, S, C = 2, 4, 3, 5
    am, lm, symbols = _inputs(1, B, T, S, C)
    bd = _boundary(B, S, T, rnnt_type) if with_boundary else None
    ref = _simple_ref(am, lm, symbols, 0, bd if bd is not None else [[0, 0, S, T]] * B,
                      rnnt_type, dp)
    got_t = dt.rnnt_loss_simple(_to_t(lm), _to_t(am), _to_t(symbols), 0,
                                None if bd is None else _to_t(bd), rnnt_type, dp, "none")
    got_j = dj.rnnt_loss_simple(jnp.asarray(lm), jnp.asarray(am), jnp.asarray(symbols), 0,
                                None if bd is None else jnp.asarray(bd), rnnt_type, dp, "none")
    np.testing.assert_allclose(got_t.numpy(), ref, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(got_j), ref, rtol=1e-11, atol=1e-11)


def test_simple_loss_blank_not_zero_and_reductions():
    B, T, S, C = 2, 4, 2, 4
    am, lm, symbols = _inputs(2, B, T, S, C)
    symbols = np.where(symbols == 2, 1, symbols)  # blank=2 may appear? k2 allows; keep apart
    ref = _simple_ref(am, lm, symbols, 2, [[0, 0, S, T]] * B, "regular")
    for red, want in (("none", ref), ("sum", ref.sum()), ("mean", ref.mean())):
        got = dt.rnnt_loss_simple(_to_t(lm), _to_t(am), _to_t(symbols), 2, reduction=red)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-11)
        gj = dj.rnnt_loss_simple(lm, am, symbols, 2, reduction=red)
        np.testing.assert_allclose(np.asarray(gj), want, rtol=1e-11)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_return_grad_is_brute_force_occupation(rnnt_type):
    B, T, S, C = 2, 4, 3, 5
    am, lm, symbols = _inputs(3, B, T, S, C)
    bd = _boundary(B, S, T, rnnt_type)
    loss_t, (gx_t, gy_t) = dt.rnnt_loss_simple(_to_t(lm), _to_t(am), _to_t(symbols), 0,
                                               _to_t(bd), rnnt_type, reduction="none",
                                               return_grad=True)
    loss_j, (gx_j, gy_j) = dj.rnnt_loss_simple(lm, am, symbols, 0, bd, rnnt_type,
                                               reduction="none", return_grad=True)
    t1 = T + 1 if rnnt_type == "regular" else T
    for b in range(B):
        full = _log_softmax(am[b][:, None, :] + lm[b][None, :, :])
        loss, arcs, scores = brute_force(lambda t, s: full[t, s], symbols[b], 0, bd[b],
                                         rnnt_type)
        ox, oy = occupations(arcs, scores, (S, t1), (S + 1, T))
        # constrained: the forced blank is folded into px (k2: px += py[:, 1:]), so
        # its occupation is that of the symbol arc (no separate blank arc)
        np.testing.assert_allclose(loss_t[b].item(), loss, rtol=1e-11)
        for gx, gy in ((gx_t.numpy(), gy_t.numpy()), (np.asarray(gx_j), np.asarray(gy_j))):
            np.testing.assert_allclose(gx[b], ox, atol=1e-11)
            np.testing.assert_allclose(gy[b], oy, atol=1e-11)
        # counting identities: every path has s_end - s_begin symbols and one
        # token (regular: one blank) per frame
        sb, tb, se, te = bd[b]
        np.testing.assert_allclose(gx_t.numpy()[b].sum(), se - sb, rtol=1e-11)
        if rnnt_type == "regular":
            np.testing.assert_allclose(gy_t.numpy()[b].sum(0)[tb:te], 1.0, rtol=1e-11)
        else:
            per_frame = gy_t.numpy()[b].sum(0) + gx_t.numpy()[b].sum(0)[:T]
            np.testing.assert_allclose(per_frame[tb:te], 1.0, rtol=1e-11)


def test_return_grad_loss_is_differentiable():
    B, T, S, C = 2, 4, 3, 5
    am, lm, symbols = _inputs(4, B, T, S, C)
    a1 = _to_t(am).requires_grad_()
    a2 = _to_t(am).requires_grad_()
    l1 = dt.rnnt_loss_simple(_to_t(lm), a1, _to_t(symbols), 0, return_grad=True)[0]
    l2 = dt.rnnt_loss_simple(_to_t(lm), a2, _to_t(symbols), 0)
    l1.backward()
    l2.backward()
    assert l1.item() == l2.item()
    np.testing.assert_allclose(a1.grad.numpy(), a2.grad.numpy(), rtol=1e-13, atol=1e-15)
    g1 = jax.grad(lambda a: dj.rnnt_loss_simple(lm, a, symbols, 0, return_grad=True)[0])(am)
    g2 = jax.grad(lambda a: dj.rnnt_loss_simple(lm, a, symbols, 0))(am)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(g1), a1.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_simple_gradcheck(rnnt_type):
    B, T, S, C = 2, 4, 2, 4
    am, lm, symbols = _inputs(5, B, T, S, C)
    bd = _to_t(_boundary(B, S, T, rnnt_type))
    sym = _to_t(symbols)

    def f(lm_, am_):
        return dt.rnnt_loss_simple(lm_, am_, sym, 0, bd, rnnt_type, 0.2, "none")

    assert torch.autograd.gradcheck(f, (_to_t(lm).requires_grad_(), _to_t(am).requires_grad_()))
    check_grads(
        lambda l_, a_: dj.rnnt_loss_simple(l_, a_, symbols, 0, np.asarray(bd), rnnt_type, 0.2,
                                           "sum"),
        (lm, am), order=1, modes=("rev",))


# ---------------------------------------------------------------- pruned loss


def _random_ranges(rng, B, T, S, r, regular):
    """Valid k2-format ranges: consecutive rows, starts in [0, S+1-r]."""
    starts = np.sort(rng.integers(0, S + 2 - r, (B, T)), axis=1)
    return starts[:, :, None] + np.arange(r)


def _pruned_ref(logits, symbols, ranges, blank, boundary, rnnt_type):
    out = []
    for b in range(logits.shape[0]):
        lsm = _log_softmax(logits[b])  # (T, r, C)

        def lp(t, s, b=b, lsm=lsm):
            k = s - ranges[b, t, 0]
            return lsm[t, k] if 0 <= k < ranges.shape[2] else None

        out.append(brute_force(lp, symbols[b], blank, boundary[b], rnnt_type)[0])
    return np.array(out)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("r", [2, 3])
def test_pruned_loss_matches_brute_force(rnnt_type, r):
    B, T, S, C = 2, 5, 3, 5
    rng = np.random.default_rng(10 + r)
    logits = rng.standard_normal((B, T, r, C))
    symbols = rng.integers(1, C, (B, S))
    ranges = _random_ranges(rng, B, T, S, r, rnnt_type == "regular")
    bd = _boundary(B, S, T, rnnt_type)
    ref = _pruned_ref(logits, symbols, ranges, 0, bd, rnnt_type)
    got_t = dt.rnnt_loss_pruned(_to_t(logits), _to_t(symbols), _to_t(ranges), 0, _to_t(bd),
                                rnnt_type, reduction="none").numpy()
    got_j = np.asarray(dj.rnnt_loss_pruned(logits, symbols, ranges, 0, bd, rnnt_type,
                                           reduction="none"))
    np.testing.assert_allclose(got_t, ref, rtol=1e-11)
    np.testing.assert_allclose(got_j, ref, rtol=1e-11)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruned_full_range_equals_simple(rnnt_type):
    """k2's identity: with s_range = S+1 nothing is pruned, and with the additive
    joiner's logits the pruned loss is the simple loss."""
    B, T, S, C = 3, 6, 4, 7
    am, lm, symbols = _inputs(6, B, T, S, C)
    ranges = np.broadcast_to(np.arange(S + 1), (B, T, S + 1)).copy()
    bd = np.array([[0, 0, S, T], [0, 0, 2, 5], [1, 0, 3, 4]], np.int64)
    for fw, mod, conv in (("torch", dt, _to_t), ("jax", dj, jnp.asarray)):
        am_p, lm_p = mod.do_rnnt_pruning(conv(am), conv(lm), conv(ranges))
        logits = am_p + lm_p
        pruned = mod.rnnt_loss_pruned(logits, conv(symbols), conv(ranges), 0, conv(bd),
                                      rnnt_type, 0.1, "none")
        simple = mod.rnnt_loss_simple(conv(lm), conv(am), conv(symbols), 0, conv(bd),
                                      rnnt_type, 0.1, "none")
        np.testing.assert_allclose(np.asarray(pruned), np.asarray(simple), rtol=1e-12,
                                   err_msg=fw)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruned_gradcheck(rnnt_type):
    B, T, S, C, r = 2, 4, 3, 4, 2
    rng = np.random.default_rng(20)
    logits = rng.standard_normal((B, T, r, C))
    symbols = rng.integers(1, C, (B, S))
    ranges = np.broadcast_to(np.minimum(np.arange(T), S + 1 - r)[None, :, None]
                             + np.arange(r), (B, T, r)).copy()
    bd = _boundary(B, S, T, rnnt_type)
    args = (_to_t(symbols), _to_t(ranges), 0, _to_t(bd), rnnt_type, 0.0, "none")
    lt = _to_t(logits).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: dt.rnnt_loss_pruned(x, *args), (lt,))
    check_grads(
        lambda x: dj.rnnt_loss_pruned(x, symbols, ranges, 0, bd, rnnt_type, 0.0, "sum"),
        (logits,), order=1, modes=("rev",))


def test_torch_and_jax_agree_float32():
    B, T, S, C, r = 3, 12, 5, 9, 3
    rng = np.random.default_rng(30)
    am = rng.standard_normal((B, T, C)).astype(np.float32)
    lm = rng.standard_normal((B, S + 1, C)).astype(np.float32)
    symbols = rng.integers(1, C, (B, S)).astype(np.int64)
    bd = np.array([[0, 0, S, T], [0, 0, 3, 10], [0, 0, 5, 8]], np.int64)
    lt, (gxt, gyt) = dt.rnnt_loss_simple(_to_t(lm), _to_t(am), _to_t(symbols), 0, _to_t(bd),
                                         reduction="none", return_grad=True)
    lj, (gxj, gyj) = dj.rnnt_loss_simple(lm, am, symbols, 0, bd, reduction="none",
                                         return_grad=True)
    assert lt.dtype == torch.float32 and lj.dtype == jnp.float32
    np.testing.assert_allclose(lt.numpy(), np.asarray(lj), rtol=2e-6)
    np.testing.assert_allclose(gxt.numpy(), np.asarray(gxj), atol=2e-6)
    rt = dt.get_rnnt_prune_ranges(gxt, gyt, _to_t(bd), r)
    rj = dj.get_rnnt_prune_ranges(gxt.numpy(), gyt.numpy(), bd, r)
    np.testing.assert_array_equal(rt.numpy(), np.asarray(rj))
    logits = rng.standard_normal((B, T, r, C)).astype(np.float32)
    pt = dt.rnnt_loss_pruned(_to_t(logits), _to_t(symbols), rt, 0, _to_t(bd), reduction="none")
    pj = dj.rnnt_loss_pruned(logits, symbols, rj, 0, bd, reduction="none")
    np.testing.assert_allclose(pt.numpy(), np.asarray(pj), rtol=2e-6)
    assert np.isfinite(pt.numpy()).all()


# ---------------------------------------------------------------- prune ranges


def _check_ranges(ranges, bd, s_range, regular):
    B, T, r = ranges.shape
    assert r == s_range
    np.testing.assert_array_equal(ranges - ranges[:, :, :1], np.broadcast_to(np.arange(r),
                                                                             ranges.shape))
    start = ranges[:, :, 0]
    assert (start[:, 0] == 0).all()
    d = np.diff(start, axis=1)
    assert (d >= 0).all()
    assert (d <= (s_range - 1 if regular else 1)).all()


def test_prune_ranges_follow_a_single_path():
    """Occupations of one alignment (all mass on one path): the windows must hold it,
    so the pruned loss of any logits keeps that path."""
    B, S, T, r = 1, 4, 6, 2
    emit = [0, 2, 3, 4]  # frame of each symbol
    ox = np.zeros((B, S, T + 1))
    oy = np.zeros((B, S + 1, T))
    s = 0
    for t in range(T):
        while s < S and emit[s] == t:
            ox[0, s, t] = 1
            s += 1
        oy[0, s, t] = 1
    bd = np.array([[0, 0, S, T]])
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        ranges = np.asarray(mod.get_rnnt_prune_ranges(conv(ox), conv(oy), conv(bd), r))
        _check_ranges(ranges, bd, r, True)
        s = 0
        for t in range(T):  # each (s, t) the path visits is inside the frame's window
            visited = {s}
            while s < S and emit[s] == t:
                s += 1
                visited.add(s)
            assert visited <= set(ranges[0, t].tolist()), (t, visited, ranges[0, t])
        # and the hand-derived answer
        np.testing.assert_array_equal(ranges[0, :, 0], [0, 0, 1, 2, 3, 3])


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_prune_ranges_properties_and_loss(rnnt_type):
    B, T, S, C, r = 3, 20, 8, 6, 3
    rng = np.random.default_rng(40)
    am = 3 * rng.standard_normal((B, T, C))
    lm = rng.standard_normal((B, S + 1, C))
    symbols = rng.integers(1, C, (B, S))
    bd = np.array([[0, 0, S, T], [0, 0, 6, 17], [0, 0, 8, 12]], np.int64)
    loss, (gx, gy) = dt.rnnt_loss_simple(_to_t(lm), _to_t(am), _to_t(symbols), 0, _to_t(bd),
                                         rnnt_type, reduction="none", return_grad=True)
    ranges = dt.get_rnnt_prune_ranges(gx, gy, _to_t(bd), r)
    _check_ranges(ranges.numpy(), bd, r, rnnt_type == "regular")
    for b in range(B):  # the last frames reach the last window
        te, se = bd[b, 3], bd[b, 2]
        assert ranges[b, te - 1, 0] == max(se + 1 - r, 0)
    am_p, lm_p = dt.do_rnnt_pruning(_to_t(am), _to_t(lm), ranges)
    pruned = dt.rnnt_loss_pruned(am_p + lm_p, _to_t(symbols), ranges, 0, _to_t(bd), rnnt_type,
                                 reduction="none")
    # pruning removes paths: loss can only go up, and stays finite
    assert np.isfinite(pruned.numpy()).all()
    assert (pruned.numpy() >= loss.numpy() - 1e-9).all()
    ranges_j = dj.get_rnnt_prune_ranges(np.asarray(gx), np.asarray(gy), bd, r)
    np.testing.assert_array_equal(np.asarray(ranges_j), ranges.numpy())


def test_prune_ranges_s_range_adjusted_like_k2():
    B, S, T = 1, 10, 3
    ox = np.zeros((B, S, T + 1))
    oy = np.zeros((B, S + 1, T))
    bd = np.array([[0, 0, S, T]])
    # regular: at least (S - 1) // T + 2 = 5 symbols per frame
    with pytest.warns(UserWarning, match="adjusting to 5"):
        rt = dt.get_rnnt_prune_ranges(_to_t(ox), _to_t(oy), _to_t(bd), 2)
    with pytest.warns(UserWarning, match="adjusting to 5"):
        rj = dj.get_rnnt_prune_ranges(ox, oy, bd, 2)
    assert rt.shape == (1, 3, 5) and rj.shape == (1, 3, 5)
    with pytest.warns(UserWarning, match="adjusting to 11"):
        rt = dt.get_rnnt_prune_ranges(_to_t(ox), _to_t(oy), _to_t(bd), 20)
    assert rt.shape == (1, 3, 11)
    np.testing.assert_array_equal(rt[0, :, 0].numpy(), [0, 0, 0])


def test_do_rnnt_pruning_values():
    rng = np.random.default_rng(50)
    B, T, S, r = 2, 5, 4, 3
    am = rng.standard_normal((B, T, 7))
    lm = rng.standard_normal((B, S + 1, 6))
    ranges = _random_ranges(rng, B, T, S, r, True)
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        a, l_ = (np.asarray(x) for x in mod.do_rnnt_pruning(conv(am), conv(lm), conv(ranges)))
        for b, t, k in itertools.product(range(B), range(T), range(r)):
            np.testing.assert_array_equal(a[b, t, k], am[b, t])
            np.testing.assert_array_equal(l_[b, t, k], lm[b, ranges[b, t, k]])


# ---------------------------------------------------------------- transforms


def test_jax_jit_and_vmap():
    """The whole pruned step (simple loss with return_grad, ranges, pruning, pruned
    loss) under jax.jit(value_and_grad) equals torch's eager step; vmap = a loop."""
    B, T, S, C, r = 2, 6, 3, 5, 2
    am, lm, symbols = _inputs(60, B, T, S, C)
    bd = _boundary(B, S, T, "regular")

    def step(mod, lm_, am_, bd_):
        loss, (gx, gy) = mod.rnnt_loss_simple(lm_, am_, symbols, 0, bd_, reduction="sum",
                                              return_grad=True)
        ranges = mod.get_rnnt_prune_ranges(gx, gy, bd_, r)
        am_p, lm_p = mod.do_rnnt_pruning(am_, lm_, ranges)
        pruned = mod.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, bd_, reduction="sum")
        return loss + pruned

    lt, at = _to_t(lm).requires_grad_(), _to_t(am).requires_grad_()
    symbols_t = _to_t(symbols)
    loss_t, (gx, gy) = dt.rnnt_loss_simple(lt, at, symbols_t, 0, _to_t(bd), reduction="sum",
                                           return_grad=True)
    ranges = dt.get_rnnt_prune_ranges(gx, gy, _to_t(bd), r)
    am_p, lm_p = dt.do_rnnt_pruning(at, lt, ranges)
    total = loss_t + dt.rnnt_loss_pruned(am_p + lm_p, symbols_t, ranges, 0, _to_t(bd),
                                         reduction="sum")
    total.backward()
    value, (g_lm, g_am) = jax.jit(jax.value_and_grad(
        lambda l_, a_, b_: step(dj, l_, a_, b_), argnums=(0, 1)))(lm, am, bd)
    np.testing.assert_allclose(np.asarray(value), total.item(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g_lm), lt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(g_am), at.grad.numpy(), rtol=1e-10, atol=1e-12)
    # vmap over an extra leading batch of inputs = a loop (torch as the loop)
    lms = np.stack([lm, lm + 0.5])
    vm = jax.jit(jax.vmap(
        lambda l_: dj.rnnt_loss_simple(l_, am, symbols, 0, bd, reduction="none")))(lms)
    loop = np.stack([dt.rnnt_loss_simple(_to_t(x), _to_t(am), symbols_t, 0, _to_t(bd),
                                         reduction="none").numpy() for x in lms])
    np.testing.assert_allclose(np.asarray(vm), loop, rtol=1e-12)


def test_torch_compile_fullgraph_pruned():
    B, T, S, C, r = 2, 6, 3, 5, 2
    rng = np.random.default_rng(70)
    logits = rng.standard_normal((B, T, r, C)).astype(np.float32)
    symbols = _to_t(rng.integers(1, C, (B, S)))
    ranges = _to_t(_random_ranges(rng, B, T, S, r, True))
    bd = _to_t(_boundary(B, S, T, "regular"))

    def f(x):
        return dt.rnnt_loss_pruned(x, symbols, ranges, 0, bd, reduction="sum")

    x1 = _to_t(logits).requires_grad_()
    x2 = _to_t(logits).requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    l1, l2 = f(x1), compiled(x2)
    l1.backward()
    l2.backward()
    np.testing.assert_allclose(l2.item(), l1.item(), rtol=1e-6)
    np.testing.assert_allclose(x2.grad.numpy(), x1.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_torch_compile_fullgraph_simple_return_grad():
    B, T, S, C = 2, 5, 3, 4
    am, lm, symbols = (_to_t(x) for x in _inputs(80, B, T, S, C))

    def f(a):
        loss, (gx, gy) = dt.rnnt_loss_simple(lm, a, symbols, 0, reduction="sum",
                                             return_grad=True)
        return loss, gx, gy

    a1 = am.clone().requires_grad_()
    a2 = am.clone().requires_grad_()
    torch._dynamo.reset()
    out1, out2 = f(a1), torch.compile(f, fullgraph=True, backend="aot_eager")(a2)
    for x, y in zip(out1, out2):
        np.testing.assert_allclose(y.detach().numpy(), x.detach().numpy(), rtol=1e-12)
    out1[0].backward()
    out2[0].backward()
    np.testing.assert_allclose(a2.grad.numpy(), a1.grad.numpy(), rtol=1e-12)


def test_torch_func_grad_simple():
    B, T, S, C = 2, 4, 2, 4
    am, lm, symbols = (_to_t(x) for x in _inputs(90, B, T, S, C))
    g = torch.func.grad(lambda a: dt.rnnt_loss_simple(lm, a, symbols, 0))(am)
    a = am.clone().requires_grad_()
    dt.rnnt_loss_simple(lm, a, symbols, 0).backward()
    np.testing.assert_allclose(g.numpy(), a.grad.numpy(), rtol=1e-13)


@pytest.mark.parametrize("dp", [0.0, 0.25])
def test_simple_and_pruned_equal_full_rnnt_loss(dp):
    """k2's identities against the full RNN-T (``rnnt_loss`` on (B, T, S+1, C)
    logits of the additive joiner): simple loss = full loss = pruned loss with
    s_range = S+1, per sequence with its own lengths."""
    B, T, S, C = 3, 7, 4, 6
    am, lm, symbols = _inputs(100, B, T, S, C)
    t_len = np.array([7, 5, 6])
    s_len = np.array([4, 2, 0])
    bd = np.stack([np.zeros(B, int), np.zeros(B, int), s_len, t_len], 1).astype(np.int64)
    logits = am[:, :, None, :] + lm[:, None, :, :]
    ranges = np.broadcast_to(np.arange(S + 1), (B, T, S + 1)).copy()
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        full = mod.rnnt_loss(conv(logits), conv(symbols.astype(np.int32)),
                             conv(t_len.astype(np.int32)), conv(s_len.astype(np.int32)),
                             blank=0, reduction="none", delay_penalty=dp)
        simple = mod.rnnt_loss_simple(conv(lm), conv(am), conv(symbols), 0, conv(bd),
                                      delay_penalty=dp, reduction="none")
        pruned = mod.rnnt_loss_pruned(conv(logits), conv(symbols), conv(ranges), 0, conv(bd),
                                      delay_penalty=dp, reduction="none")
        np.testing.assert_allclose(np.asarray(simple), np.asarray(full), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(pruned), np.asarray(full), rtol=1e-12)


def test_analytic_single_path_cases():
    """Closed forms: S = 0 (only blanks: loss = -sum_t log p_t(blank)) and
    'modified' with S = T (one alignment: symbol y_t on frame t, context t)."""
    B, T, C = 2, 4, 5
    am, lm, _ = _inputs(110, B, T, 0, C)
    lsm = _log_softmax(am + lm)  # (B, T, C): context 0 on every frame
    want = -lsm[:, :, 0].sum(1)
    sym0 = np.zeros((B, 0), np.int64)
    ranges = np.zeros((B, T, 1), np.int64)
    am4, lm4, sym4 = _inputs(111, B, T, T, C)
    full = _log_softmax(am4[:, :, None, :] + lm4[:, None, :, :])  # (B, T, S+1, C)
    want4 = -np.array([sum(full[b, t, t, sym4[b, t]] for t in range(T)) for b in range(B)])
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        got = mod.rnnt_loss_simple(conv(lm), conv(am), conv(sym0), 0, reduction="none")
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
        got = mod.rnnt_loss_pruned(conv((am + lm)[:, :, None]), conv(sym0), conv(ranges), 0,
                                   reduction="none")
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
        got = mod.rnnt_loss_simple(conv(lm4), conv(am4), conv(sym4), 0, rnnt_type="modified",
                                   reduction="none")
        np.testing.assert_allclose(np.asarray(got), want4, rtol=1e-12)


# ---------------------------------------------------------------- smoothed loss


def _smoothed_ref(am, lm, symbols, blank, boundary, rnnt_type, lm_s, am_s, dp):
    """Loop-by-loop arc scores of k2's smoothed loss, summed over every path."""
    B, T, C = am.shape
    lse = np.logaddexp.reduce
    sm = np.exp(lm - lse(lm, axis=2, keepdims=True))
    unigram = sm.reshape(-1, C).mean(0)
    out = []
    for b in range(B):
        def arc(s, t, c, b=b):
            logp = am[b, t, c] + lm[b, s, c] - lse(am[b, t] + lm[b, s])
            lm_only = lm[b, s, c] - lse(lm[b, s])
            am_only = am[b, t, c] + np.log(unigram[c]) - np.log(
                sum(np.exp(am[b, t, k]) * unigram[k] for k in range(C)))
            return (1 - lm_s - am_s) * logp + lm_s * lm_only + am_s * am_only

        sb, tb, se, te = boundary[b]
        scores = []
        for path in _paths(se - sb, te - tb, rnnt_type):
            total = 0.0
            for kind, s, t in path:
                s, t = s + sb, t + tb
                if kind == "x":
                    total += arc(s, t, symbols[b, s]) + dp * ((te - 1) / 2 - t)
                    if rnnt_type == "constrained":
                        total += arc(s + 1, t, blank)
                else:
                    total += arc(s, t, blank)
            scores.append(total)
        out.append(-np.logaddexp.reduce(scores))
    return np.array(out)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_smoothed_loss_matches_brute_force(rnnt_type):
    B, T, S, C = 2, 4, 3, 5
    am, lm, symbols = _inputs(120, B, T, S, C)
    bd = _boundary(B, S, T, rnnt_type)
    ref = _smoothed_ref(am, lm, symbols, 0, bd, rnnt_type, 0.1, 0.25, 0.2)
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        got = mod.rnnt_loss_smoothed(conv(lm), conv(am), conv(symbols), 0, 0.1, 0.25, conv(bd),
                                     rnnt_type, 0.2, "none")
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-11)
        # scales 0: the simple loss (k2 uses 1e-20 for an exact zero)
        got0 = mod.rnnt_loss_smoothed(conv(lm), conv(am), conv(symbols), 0, 0.0, 0.0, conv(bd),
                                      rnnt_type, reduction="none")
        simple = mod.rnnt_loss_simple(conv(lm), conv(am), conv(symbols), 0, conv(bd), rnnt_type,
                                      reduction="none")
        np.testing.assert_allclose(np.asarray(got0), np.asarray(simple), rtol=1e-12)


def test_smoothed_gradcheck_and_return_grad():
    B, T, S, C = 2, 4, 2, 4
    am, lm, symbols = _inputs(130, B, T, S, C)
    sym = _to_t(symbols)
    assert torch.autograd.gradcheck(
        lambda l_, a_: dt.rnnt_loss_smoothed(l_, a_, sym, 0, 0.2, 0.1, reduction="none"),
        (_to_t(lm).requires_grad_(), _to_t(am).requires_grad_()))
    check_grads(lambda l_, a_: dj.rnnt_loss_smoothed(l_, a_, symbols, 0, 0.2, 0.1),
                (lm, am), order=1, modes=("rev",))
    _, (gx, gy) = dt.rnnt_loss_smoothed(_to_t(lm), _to_t(am), sym, 0, return_grad=True)
    _, (jx, jy) = dj.rnnt_loss_smoothed(lm, am, symbols, 0, return_grad=True)
    np.testing.assert_allclose(gx.sum((1, 2)).numpy(), S, rtol=1e-12)  # S symbols per path
    np.testing.assert_allclose(np.asarray(jy), gy.numpy(), atol=1e-12)


def test_prune_ranges_modified_hand_derived():
    """'modified', one alignment (blank, y0, y1, blank, y2 on frames 0..4), s_range 2:
    windows worked out by hand from k2's rule (first maximum; last frame takes the
    last window; starts rise by at most 1 per frame)."""
    ox = np.zeros((1, 3, 5))
    oy = np.zeros((1, 4, 5))
    oy[0, 0, 0] = ox[0, 0, 1] = ox[0, 1, 2] = oy[0, 2, 3] = ox[0, 2, 4] = 1
    bd = np.array([[0, 0, 3, 5]])
    for mod, conv in ((dt, _to_t), (dj, jnp.asarray)):
        ranges = np.asarray(mod.get_rnnt_prune_ranges(conv(ox), conv(oy), conv(bd), 2))
        np.testing.assert_array_equal(ranges[0, :, 0], [0, 0, 0, 1, 2])
        np.testing.assert_array_equal(ranges[0, :, 1], [1, 1, 1, 2, 3])


def test_jax_vmap_pruned_equals_loop():
    B, T, S, C, r = 2, 6, 3, 5, 2
    rng = np.random.default_rng(140)
    logits = rng.standard_normal((3, B, T, r, C))
    symbols = rng.integers(1, C, (B, S))
    ranges = _random_ranges(rng, B, T, S, r, True)
    f = lambda x: dj.rnnt_loss_pruned(x, symbols, ranges, 0, reduction="none")  # noqa: E731
    vm = np.asarray(jax.vmap(f)(logits))
    loop = np.stack([dt.rnnt_loss_pruned(_to_t(x), _to_t(symbols), _to_t(ranges), 0,
                                         reduction="none").numpy() for x in logits])
    np.testing.assert_allclose(vm, loop, rtol=1e-12)
