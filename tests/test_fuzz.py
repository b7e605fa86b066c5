"""Fuzzing every loss and aligner against brute-force enumeration (float64).

Hypothesis draws tiny batches (T <= 4 frames, C <= 3-4 classes, ragged
lengths, empty targets, repeated labels, ``-inf`` scores, large score scales
that push the kernels onto their log-space fallback); every example is checked
against an enumeration of all frame labellings / arc sequences: losses, every
gradient (posteriors / expected counts, computed from the enumeration, not from
the kernels' maths), Viterbi scores and that the returned path is optimal.

Reproducible: ``derandomize=True`` and no example database, so each CI run
draws the same examples.  The number of examples per test is ``FUZZ_EXAMPLES``
(scaled by the environment variable ``DUOLOSS_FUZZ_SCALE``, default 1); the
counts run are printed at the end of the module.  The graph engine's own
property tests live in ``tests/gtn/test_properties.py`` (not duplicated here).
"""
from __future__ import annotations

import collections
import functools
import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from duoloss.core import (asg_align, asg_loss_and_grad, asg_viterbi, ctc_align,
                          ctc_loss_and_grad, graph_align, graph_loss_and_grad, pack_graphs)
from duoloss.gtn import Graph

SCALE = float(os.environ.get("DUOLOSS_FUZZ_SCALE", "1"))
FUZZ_EXAMPLES = {
    "ctc_loss": 600, "asg_loss": 500, "asg_loss_no_transitions": 300, "graph_loss": 500,
    "ctc_align": 300, "asg_align": 250, "asg_viterbi": 200, "graph_align": 250,
    "frontends": 60,
}
COUNTS: collections.Counter = collections.Counter()


def fuzz(name):
    return settings(max_examples=max(1, int(FUZZ_EXAMPLES[name] * SCALE)), deadline=None,
                    derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (f"fuzz examples run: {sum(COUNTS.values())} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(COUNTS.items()))})")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if rep is not None and cap is not None:
        with cap.global_and_fixture_disabled():
            rep.write_line("\n" + line)


# ---------------------------------------------------------------- references

def lse(x):
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return -np.inf
    m = x.max()
    if not np.isfinite(m):
        return m
    return m + np.log(np.exp(x - m).sum())


@functools.lru_cache(maxsize=None)
def labellings(t, c):
    """All ``c**t`` frame labellings as an int array ``(c**t, t)``."""
    if t == 0:
        return np.zeros((1, 0), np.int64)
    return np.array(list(itertools.product(range(c), repeat=t)), np.int64).reshape(-1, t)


@functools.lru_cache(maxsize=None)
def ctc_mask(t, c, target, blank):
    out = []
    for pi in labellings(t, c):
        seq, prev = [], None
        for k in pi:
            if k != blank and k != prev:
                seq.append(int(k))
            prev = k
        out.append(tuple(seq) == target)
    return np.array(out, bool)


@functools.lru_cache(maxsize=None)
def asg_segmentations(t, c, target):
    """Per labelling, the number of ways it spells ``target`` with every token on >= 1
    consecutive frames (ASG's force-align graph has one path per segmentation, so
    ``[1, 1]`` over 3 frames is spelled twice by ``1 1 1``)."""
    ok = collections.Counter()
    n = len(target)
    if 0 < n <= t:
        for cuts in itertools.combinations(range(1, t), n - 1):
            b = (0,) + cuts + (t,)
            ok[tuple(k for i, k in enumerate(target) for _ in range(b[i + 1] - b[i]))] += 1
    return np.array([ok[tuple(int(k) for k in pi)] for pi in labellings(t, c)], np.int64)


def asg_mask(t, c, target):
    return asg_segmentations(t, c, target) > 0


def posterior(pis, w, t, c):
    """``P(pi_t = k)`` under weights ``w`` of labellings ``pis`` ((t, c); zeros if none)."""
    out = np.zeros((t, c))
    z = lse(w)
    if not np.isfinite(z) or len(w) == 0:
        return out, z
    p = np.exp(w - z)
    for s in range(t):
        np.add.at(out[s], pis[:, s], p)
    return out, z


def asg_weights(pis, em, tr, sv):
    w = em[np.arange(pis.shape[1]), pis].sum(1) if pis.shape[1] else np.zeros(len(pis))
    if sv is not None and pis.shape[1]:
        w = w + sv[pis[:, 0]]
    if tr is not None and pis.shape[1] > 1:
        w = w + tr[pis[:, 1:], pis[:, :-1]].sum(1)
    return w


def close(a, b, tol=1e-7):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.nanmax(np.abs(b)))
                                                         if b.size and np.isfinite(b).any() else 1))


# ---------------------------------------------------------------- strategies

@st.composite
def batches(draw, blank_free, max_c=4):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    t_max = draw(st.integers(1, 4))
    n = draw(st.integers(1, 3))
    c = draw(st.integers(2 if blank_free else 1, max_c))
    s = draw(st.integers(0, 3))
    scale = draw(st.sampled_from([0.5, 1.0, 3.0, 300.0]))  # 300: log-space fallback
    em = rng.standard_normal((t_max, n, c)) * scale
    if draw(st.booleans()):                                # zero-probability entries
        em[rng.random(em.shape) < 0.2] = -np.inf
    il = rng.integers(0, t_max + 1, n)
    tl = rng.integers(0, s + 1, n)
    lo = 1 if blank_free else 0
    tg = rng.integers(lo, c, (n, s)) if c > lo else np.zeros((n, s), np.int64)
    if blank_free and c == 1:
        tl[:] = 0
    return em, tg, il, tl, rng


# ---------------------------------------------------------------- CTC

@fuzz("ctc_loss")
@given(batches(blank_free=True))
def test_ctc_loss_and_grad(batch):
    em, tg, il, tl, _ = batch
    COUNTS["ctc_loss"] += 1
    losses, grad = ctc_loss_and_grad(em, tg, il, tl, blank=0)
    t_max, n, c = em.shape
    for b in range(n):
        tb, target = int(il[b]), tuple(int(k) for k in tg[b, :tl[b]])
        pis = labellings(tb, c)[ctc_mask(tb, c, target, 0)]
        w = em[np.arange(tb)[None, :], b, pis].sum(1) if tb else np.zeros(len(pis))
        post, z = posterior(pis, w, tb, c)
        if not np.isfinite(z):
            assert losses[b] == np.inf
            np.testing.assert_array_equal(grad[:, b], 0.0)
            continue
        close(losses[b], -z)
        close(grad[:tb, b], -post)
        np.testing.assert_array_equal(grad[tb:, b], 0.0)


@fuzz("ctc_align")
@given(batches(blank_free=True))
def test_ctc_align(batch):
    em, tg, il, tl, _ = batch
    COUNTS["ctc_align"] += 1
    labels, scores = ctc_align(em, tg, il, tl, blank=0)
    c = em.shape[2]
    for b in range(em.shape[1]):
        tb, target = int(il[b]), tuple(int(k) for k in tg[b, :tl[b]])
        pis = labellings(tb, c)[ctc_mask(tb, c, target, 0)]
        w = em[np.arange(tb)[None, :], b, pis].sum(1) if tb else np.zeros(len(pis))
        best = w.max() if len(w) else -np.inf
        if tb == 0 and target == ():
            best = 0.0
        if not np.isfinite(best):
            assert scores[b] == -np.inf and (labels[b] == -1).all()
            continue
        close(scores[b], best)
        path = labels[b, :tb]
        assert ctc_mask(tb, c, target, 0)[np.ravel_multi_index(path, (c,) * tb)] if tb else True
        close(em[np.arange(tb), b, path].sum(), best)
        assert (labels[b, tb:] == -1).all()


# ---------------------------------------------------------------- ASG

def _asg_check(em, tr, sv, tg, il, tl, losses, ge, gt, gs):
    n, c = em.shape[1:]
    gt_ref = np.zeros((n, c, c))
    gs_ref = np.zeros((n, c))
    for b in range(n):
        tb, target = int(il[b]), tuple(int(k) for k in tg[b, :tl[b]])
        if tb == 0:
            assert losses[b] == (0.0 if not target else np.inf)
            continue
        pis = labellings(tb, c)
        e = em[:tb, b]
        w = asg_weights(pis, e, tr, sv)
        mask = asg_mask(tb, c, target)
        w_aln = w.copy()
        w_aln[mask] += np.log(asg_segmentations(tb, c, target)[mask])
        p_all, lz = posterior(pis, w, tb, c)
        p_aln, ln = posterior(pis[mask], w_aln[mask], tb, c)
        if not np.isfinite(ln) or not np.isfinite(lz):
            assert losses[b] == np.inf
            continue
        close(losses[b], lz - ln)
        close(ge[:tb, b], p_all - p_aln)
        np.testing.assert_array_equal(ge[tb:, b], 0.0)
        # expected transition / start counts, all minus aligned
        for sel, ww, sign, zz in ((np.ones(len(w), bool), w, 1.0, lz), (mask, w_aln, -1.0, ln)):
            p = np.exp(ww[sel] - zz)
            ps = pis[sel]
            np.add.at(gs_ref[b], ps[:, 0], sign * p)
            for s in range(1, tb):
                np.add.at(gt_ref[b], (ps[:, s], ps[:, s - 1]), sign * p)
        if gt is not None:
            close(gt[b], gt_ref[b])
        if gs is not None:
            close(gs[b], gs_ref[b])


@fuzz("asg_loss")
@given(batches(blank_free=False), st.booleans())
def test_asg_loss_and_grads(batch, with_start):
    em, tg, il, tl, rng = batch
    COUNTS["asg_loss"] += 1
    c = em.shape[2]
    em = np.where(np.isinf(em), -30.0, em)  # ASG: keep the normaliser finite here
    tr = rng.standard_normal((c, c))
    sv = rng.standard_normal(c) if with_start else None
    losses, (ge, gt, gs) = asg_loss_and_grad(em, tr, tg, il, tl, start_transitions=sv)
    _asg_check(em, tr, sv, tg, il, tl, losses, ge, gt, gs)


@fuzz("asg_loss_no_transitions")
@given(batches(blank_free=False))
def test_asg_loss_without_transitions(batch):
    em, tg, il, tl, _ = batch
    COUNTS["asg_loss_no_transitions"] += 1
    em = np.where(np.isinf(em), -30.0, em)
    losses, (ge, _, _) = asg_loss_and_grad(em, None, tg, il, tl)
    _asg_check(em, None, None, tg, il, tl, losses, ge, None, None)


@fuzz("asg_align")
@given(batches(blank_free=False), st.booleans())
def test_asg_align(batch, with_trans):
    em, tg, il, tl, rng = batch
    COUNTS["asg_align"] += 1
    c = em.shape[2]
    tr = rng.standard_normal((c, c)) if with_trans else None
    labels, scores = asg_align(em, tr, tg, il, tl)
    for b in range(em.shape[1]):
        tb, target = int(il[b]), tuple(int(k) for k in tg[b, :tl[b]])
        pis = labellings(tb, c)
        mask = asg_mask(tb, c, target)
        w = asg_weights(pis[mask], em[:tb, b], tr, None)
        best = w.max() if len(w) else -np.inf
        if tb == 0 and target == ():
            assert scores[b] == 0.0 and (labels[b] == -1).all()  # the empty path
            continue
        if not np.isfinite(best):
            assert scores[b] == -np.inf and (labels[b] == -1).all()
            continue
        close(scores[b], best)
        path = labels[b, :tb]
        assert mask[np.ravel_multi_index(path, (c,) * tb)]
        close(asg_weights(path[None], em[:tb, b], tr, None)[0], best)


@fuzz("asg_viterbi")
@given(batches(blank_free=False), st.booleans())
def test_asg_viterbi(batch, with_trans):
    em, _, il, _, rng = batch
    COUNTS["asg_viterbi"] += 1
    c = em.shape[2]
    tr = rng.standard_normal((c, c)) if with_trans else None
    sv = rng.standard_normal(c)
    labels, scores = asg_viterbi(em, tr, il, start_transitions=sv)
    for b in range(em.shape[1]):
        tb = int(il[b])
        if tb == 0:
            assert (labels[b] == -1).all()
            continue
        w = asg_weights(labellings(tb, c), em[:tb, b], tr, sv)
        close(scores[b], w.max())
        if np.isfinite(w.max()):
            close(asg_weights(labels[b, :tb][None], em[:tb, b], tr, sv)[0], w.max())


# ---------------------------------------------------------------- graphs

def random_graph(rng, c):
    n_nodes = int(rng.integers(1, 4))
    g = Graph(calc_grad=False)
    for i in range(n_nodes):
        g.add_node(start=i == 0 or rng.random() < 0.3, accept=rng.random() < 0.5)
    for _ in range(int(rng.integers(0, 6))):
        g.add_arc(int(rng.integers(n_nodes)), int(rng.integers(n_nodes)), int(rng.integers(c)),
                  None, float(rng.standard_normal()))
    return g


def arc_table(g):
    from duoloss.gtn import graph_arrays

    _, src, dst, lab, _, w, start, accept = graph_arrays(g)
    return (np.asarray(src), np.asarray(dst), np.asarray(lab), np.asarray(w, np.float64),
            set(np.flatnonzero(np.asarray(start))), set(np.flatnonzero(np.asarray(accept))))


def graph_paths(g, tb):
    """Every sequence of ``tb`` arcs from a start to an accept node, as an int array."""
    src, dst, lab, w, starts, accepts = arc_table(g)
    if tb == 0:
        return np.zeros((len(starts & accepts), 0), np.int64)
    out = []
    for seq in itertools.product(range(len(src)), repeat=tb):
        if src[seq[0]] in starts and dst[seq[-1]] in accepts and all(
                dst[seq[i]] == src[seq[i + 1]] for i in range(tb - 1)):
            out.append(seq)
    return np.array(out, np.int64).reshape(-1, tb)


@fuzz("graph_loss")
@given(batches(blank_free=False), st.booleans(), st.booleans())
def test_graph_loss_and_grads(batch, normalize, tied):
    em, _, il, _, rng = batch
    COUNTS["graph_loss"] += 1
    t_max, n, c = em.shape
    em = np.where(np.isinf(em), -30.0, em) if normalize else em
    graphs = [random_graph(rng, c) for _ in range(n)]
    k = 2
    theta = rng.standard_normal(k) if tied else None
    idx = [rng.integers(-1, k, g.num_arcs()) for g in graphs] if tied else None
    packed = pack_graphs(graphs, idx)
    losses, (ge, gw) = graph_loss_and_grad(em, packed, il, weights=theta, normalize=normalize,
                                           want_grad=(True, tied))
    gw_ref = np.zeros(k)
    for b, g in enumerate(graphs):
        tb = int(il[b])
        src, dst, lab, w0, _, _ = arc_table(g)
        wa = w0 + (np.where(idx[b] >= 0, theta[idx[b]], 0.0) if tied else 0.0)
        paths = graph_paths(g, tb)
        w = (wa[paths] + em[np.arange(tb)[None, :], b, lab[paths]]).sum(1) if tb else \
            np.zeros(len(paths))
        post, z = posterior(lab[paths] if tb else paths, w, tb, c)
        norm = sum(lse(em[t, b]) for t in range(tb)) if normalize else 0.0
        if not np.isfinite(z):
            assert losses[b] == np.inf, (losses[b], z)
            continue
        close(losses[b], -z + norm)
        soft = np.exp(em[:tb, b] - np.array([lse(em[t, b]) for t in range(tb)])[:, None]) \
            if normalize else 0.0
        close(ge[:tb, b], soft - post)
        np.testing.assert_array_equal(ge[tb:, b], 0.0)
        if tied and tb:
            p = np.exp(w - z)
            for s in range(tb):
                ii = idx[b][paths[:, s]]
                np.add.at(gw_ref, ii[ii >= 0], -p[ii >= 0])
            close(gw[b], gw_ref)
            gw_ref[:] = 0.0
        elif tied:
            np.testing.assert_array_equal(gw[b], 0.0)


@fuzz("graph_align")
@given(batches(blank_free=False))
def test_graph_align(batch):
    em, _, il, _, rng = batch
    COUNTS["graph_align"] += 1
    t_max, n, c = em.shape
    graphs = [random_graph(rng, c) for _ in range(n)]
    labels, scores, arcs = graph_align(em, pack_graphs(graphs), il)
    for b, g in enumerate(graphs):
        tb = int(il[b])
        src, dst, lab, w0, _, _ = arc_table(g)
        paths = graph_paths(g, tb)
        w = (w0[paths] + em[np.arange(tb)[None, :], b, lab[paths]]).sum(1) if tb else \
            np.zeros(len(paths))
        best = w.max() if len(w) else -np.inf
        if not np.isfinite(best):
            assert scores[b] == -np.inf and (labels[b] == -1).all()
            continue
        close(scores[b], best)
        a = arcs[b, :tb]
        if tb:
            assert any((p == a).all() for p in paths)
            close((w0[a] + em[np.arange(tb), b, lab[a]]).sum(), best)
            np.testing.assert_array_equal(labels[b, :tb], lab[a])


# ---------------------------------------------------------------- frontends

@fuzz("frontends")
@given(batches(blank_free=True))
def test_frontends_agree_with_the_core(batch):
    """torch and jax (float32 in, float64 core) give the core's numbers for every loss."""
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    em, tg, il, tl, rng = batch
    COUNTS["frontends"] += 1
    em32 = em.astype(np.float32)
    c = em.shape[2]
    tr = rng.standard_normal((c, c)).astype(np.float32)
    ints = tuple(x.astype(np.int32) for x in (tg, il, tl))
    for name, core, call in (
        ("ctc", lambda: ctc_loss_and_grad(em32, *ints), lambda m, e, *a: m.ctc_loss(e, *a, reduction="none")),
        ("asg", lambda: asg_loss_and_grad(em32, tr, *ints, want_grad=(True, False, False)),
         lambda m, e, *a: m.asg_loss(e, tr if m is dj else torch.from_numpy(tr), *a, reduction="none")),
    ):
        want_l, want_g = core()
        want_g = want_g[0] if isinstance(want_g, tuple) else want_g
        x = torch.tensor(em32, requires_grad=True)
        lt = call(dt, x, *(torch.from_numpy(a) for a in ints))
        lt.sum().backward() if np.isfinite(want_l).all() else None
        lj = call(dj, em32, *ints)
        np.testing.assert_array_equal(lt.detach().numpy(), want_l)
        np.testing.assert_array_equal(np.asarray(lj), want_l)
        if np.isfinite(want_l).all():
            gj = jax.grad(lambda e: call(dj, e, *ints).sum())(em32)
            np.testing.assert_array_equal(x.grad.numpy(), want_g)
            np.testing.assert_array_equal(np.asarray(gj), want_g)
