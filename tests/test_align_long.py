"""Bounded-memory CTC alignment (checkpointed rows, windowed recomputing traceback) and
``token_spans``.

* The checkpointed path (forced with ``_checkpoint_cells=0``) gives the full-table path's
  labels and scores bit for bit on random sizes, ties included (rounded and all-equal
  log-probs), infeasible, empty and padded sequences;
* its alignment is a brute-force Viterbi path on tiny inputs, collapses to the target, and
  its path score (summed here from the log-probs) equals the returned score;
* the frontends take it above ``CTC_CHECKPOINT_CELLS`` (lowered here), torch == JAX;
* ``token_spans`` equals a re-derivation of ``torchaudio.functional.merge_tokens`` from its
  documented semantics (runs of equal non-blank labels, end exclusive, score the mean of
  the given frame scores; here the frame probabilities).
"""
from __future__ import annotations

import numpy as np
import pytest

from duoloss.core.losses import align as core_align
from test_asg_reference import brute_ctc_align


def _collapse(path, blank):
    return [int(k) for i, k in enumerate(path) if k != blank and (i == 0 or k != path[i - 1])]


def _random_case(rng, trial):
    t_max = int(rng.integers(1, 30))
    n_cls = int(rng.integers(2, 5))
    n = 3
    s = int(rng.integers(1, 10))
    lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, n)))
    if trial % 3 == 1:
        lp = np.round(lp)  # many ties
    elif trial % 3 == 2:
        lp[:] = -1.0  # every path ties
    tg = rng.integers(1, n_cls, size=(n, s))
    if trial % 4 == 0:
        tg[:, 1::2] = tg[:, ::2][:, :tg[:, 1::2].shape[1]]  # repeats: no skip
    il = rng.integers(0, t_max + 1, size=n)
    tl = rng.integers(0, s + 1, size=n)
    return lp, tg, il, tl


def test_checkpointed_equals_full_table_random(rng):
    for trial in range(150):
        lp, tg, il, tl = _random_case(rng, trial)
        full = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=1 << 40)
        ckpt = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=0)
        np.testing.assert_array_equal(ckpt[0], full[0], err_msg=f"trial {trial}")
        np.testing.assert_array_equal(ckpt[1], full[1], err_msg=f"trial {trial}")


def test_checkpointed_long_sequence_many_segments(rng):
    # one sequence long enough for ~10 segments and windows that clip at state 0
    t_max, n_cls, n_lab = 400, 6, 60
    lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, 2))).astype(np.float32)
    lp[100:140] = np.float32(-2.0)  # a tied stretch
    tg = rng.integers(1, n_cls, size=(2, n_lab))
    il, tl = np.array([400, 333]), np.array([60, 41])
    assert core_align._ctc_segment(400, 121) < 40
    full = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=1 << 40)
    ckpt = core_align.ctc_align(lp, tg, il, tl, blank=0, _checkpoint_cells=0)
    np.testing.assert_array_equal(ckpt[0], full[0])
    np.testing.assert_array_equal(ckpt[1], full[1])
    assert ckpt[1].dtype == np.float32
    lp64 = lp.astype(np.float64)
    for b in range(2):
        path = ckpt[0][b, :il[b]]
        assert _collapse(path, 0) == list(tg[b, :tl[b]])
        assert np.all(ckpt[0][b, il[b]:] == -1)
        score = sum(lp64[t, b, k] for t, k in enumerate(path))  # the kernel's order
        assert np.float32(score) == ckpt[1][b]


def test_checkpointed_is_a_viterbi_path_brute_force(rng):
    for trial in range(40):
        t_max = int(rng.integers(1, 7))
        n_cls = 3
        lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, 1)))
        if trial % 2:
            lp = np.round(lp, 0)
        n_lab = int(rng.integers(0, 4))
        target = list(rng.integers(1, n_cls, size=n_lab))
        tg = np.array([target + [1]], np.int64)
        labels, scores = core_align.ctc_align(lp, tg, [t_max], [n_lab], blank=0,
                                              _checkpoint_cells=0)
        best, arg = brute_ctc_align(lp[:, 0], target, 0)
        if best == -np.inf:
            assert scores[0] == -np.inf and np.all(labels == -1)
            continue
        np.testing.assert_allclose(scores[0], best, rtol=1e-12, atol=1e-12)
        assert tuple(int(k) for k in labels[0]) in arg
        assert _collapse(labels[0], 0) == target


def test_checkpointed_infeasible_nan_and_empty():
    lp = np.zeros((3, 3, 3))
    tg = np.array([[1, 1, 2], [1, 2, 1], [1, 1, 1]])
    # too few frames for a repeat / empty sequence / no target
    for cells in (0, 1 << 40):
        labels, scores = core_align.ctc_align(lp, tg, [3, 0, 3], [3, 0, 0], blank=0,
                                              _checkpoint_cells=cells)
        assert scores[0] == -np.inf and np.all(labels[0] == -1)
        assert scores[1] == 0.0 and np.all(labels[1] == -1)
        assert scores[2] == 0.0 and list(labels[2]) == [0, 0, 0]
    lp[1, 0, :] = np.nan
    a = core_align.ctc_align(lp, tg, [3, 3, 3], [1, 1, 1], blank=0, _checkpoint_cells=0)
    b = core_align.ctc_align(lp, tg, [3, 3, 3], [1, 1, 1], blank=0, _checkpoint_cells=1 << 40)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert np.isnan(a[1][0])


def _frontend_case(rng):
    lp = np.log(rng.dirichlet(np.ones(5), size=(50, 3))).astype(np.float32)
    tg = rng.integers(1, 5, size=(3, 8))
    il, tl = np.array([50, 41, 30]), np.array([8, 5, 8])
    return lp, tg, il, tl


def test_frontends_take_the_checkpointed_path(rng, monkeypatch):
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    lp, tg, il, tl = _frontend_case(rng)
    full = core_align.ctc_align(lp, tg, il, tl, _checkpoint_cells=1 << 40)
    monkeypatch.setattr(core_align, "CTC_CHECKPOINT_CELLS", 0)
    lt, st = dt.ctc_align(torch.from_numpy(lp), torch.from_numpy(tg), torch.from_numpy(il),
                          torch.from_numpy(tl))
    lj, sj = jax.jit(dj.ctc_align)(lp, tg, il, tl)
    np.testing.assert_array_equal(lt.numpy(), full[0])
    np.testing.assert_array_equal(np.asarray(lj), full[0])
    np.testing.assert_array_equal(st.numpy(), full[1])
    np.testing.assert_array_equal(np.asarray(sj), full[1])


def _merge_tokens_reference(tokens, scores, blank):
    """torchaudio.functional.merge_tokens, re-derived from its documentation: spans of
    equal consecutive tokens, blanks dropped, ``end`` exclusive, ``score`` the mean of
    ``scores[start:end]``."""
    spans = []
    t = 0
    while t < len(tokens):
        u = t
        while u < len(tokens) and tokens[u] == tokens[t]:
            u += 1
        if tokens[t] != blank:
            spans.append((int(tokens[t]), t, u, float(np.mean(scores[t:u]))))
        t = u
    return spans


@pytest.mark.parametrize("blank", [0, 4])
def test_token_spans_matches_merge_tokens_reference(rng, blank):
    import torch

    import duoloss.torch as dt

    t_max, n, n_cls = 40, 4, 5
    lp = np.log(rng.dirichlet(np.ones(n_cls), size=(t_max, n)))
    labels = rng.integers(0, n_cls, size=(n, t_max))
    labels[1, 10:14] = labels[1, 9]  # a long run
    il = np.array([40, 31, 0, 7])
    for b in range(n):
        labels[b, il[b]:] = -1
    tokens, starts, ends, scores = dt.token_spans(torch.from_numpy(labels),
                                                  torch.from_numpy(lp), blank=blank)
    refs = []
    for b in range(n):
        frame_scores = np.exp(lp[np.arange(il[b]), b, labels[b, :il[b]]])
        refs.append(_merge_tokens_reference(labels[b, :il[b]], frame_scores, blank))
    k = max(len(r) for r in refs)
    assert tokens.shape == (n, k) and tokens.dtype == torch.int64
    for b, ref in enumerate(refs):
        m = len(ref)
        assert tokens[b, :m].tolist() == [r[0] for r in ref]
        assert starts[b, :m].tolist() == [r[1] for r in ref]
        assert ends[b, :m].tolist() == [r[2] for r in ref]
        np.testing.assert_allclose(scores[b, :m].numpy(), [r[3] for r in ref], rtol=1e-13)
        assert tokens[b, m:].tolist() == [-1] * (k - m)
        assert starts[b, m:].tolist() == [-1] * (k - m)
        assert np.all(scores[b, m:].numpy() == 0)


def test_token_spans_of_an_alignment_torch_equals_jax(rng):
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    lp, tg, il, tl = _frontend_case(rng)
    labels, _ = dt.ctc_align(torch.from_numpy(lp), torch.from_numpy(tg), torch.from_numpy(il),
                             torch.from_numpy(tl))
    out_t = dt.token_spans(labels, torch.from_numpy(lp))
    out_j = dj.token_spans(np.asarray(labels), lp)
    out_jit = jax.jit(lambda a, b: dj.token_spans(a, b, num_spans=8))(np.asarray(labels), lp)
    for b in range(3):  # one span per target label, in order, inside the sequence
        assert out_t[0][b, :tl[b]].tolist() == list(tg[b, :tl[b]])
        assert out_t[1][b, 0] >= 0 and out_t[2][b, tl[b] - 1] <= il[b]
    for x, y, z in zip(out_t, out_j, out_jit):
        np.testing.assert_array_equal(x.numpy(), np.asarray(y))
        np.testing.assert_array_equal(x.numpy(), np.asarray(z))
    assert out_t[3].dtype == torch.float32 and out_j[3].dtype == np.float32
    # unbatched
    u = dt.token_spans(labels[0], torch.from_numpy(lp[:, 0]))
    np.testing.assert_array_equal(u[1].numpy(), out_t[1][0].numpy()[:u[1].shape[0]])


def test_token_spans_bad_input():
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    lp = torch.zeros(6, 2, 3)
    with pytest.raises(ValueError, match="token_spans: labels must have shape"):
        dt.token_spans(torch.zeros(6, 2, dtype=torch.int64), lp)
    with pytest.raises(TypeError, match="token_spans: labels must be an integer"):
        dt.token_spans(torch.zeros(2, 6), lp)
    with pytest.raises(ValueError, match=r"token_spans: labels must be in \[-1, 3\)"):
        dt.token_spans(torch.full((2, 6), 3), lp)
    with pytest.raises(ValueError, match="token_spans: blank"):
        dt.token_spans(torch.zeros(2, 6, dtype=torch.int64), lp, blank=3)
    with pytest.raises(ValueError, match=r"token_spans: labels must be in \[-1, 3\)"):
        dj.token_spans(np.full((2, 6), -2), np.zeros((6, 2, 3), np.float32))
    with pytest.raises(ValueError, match="token_spans: num_spans is required"):
        import jax
        jax.jit(dj.token_spans)(np.zeros((2, 6), np.int32), np.zeros((6, 2, 3), np.float32))


def asg_random_case(rng, trial, t_hi, n, s_hi):
    """An ASG alignment case (emissions, transitions or None, start or None, targets,
    input lengths, target lengths); ``trial % 4`` picks ties: 1 rounded scores, 2 every
    path tying."""
    t_max = int(rng.integers(1, t_hi))
    n_cls = int(rng.integers(2, 5))
    s = int(rng.integers(1, s_hi))
    em = rng.normal(size=(t_max, n, n_cls))
    trans = rng.normal(size=(n_cls, n_cls)) if trial % 2 else None
    start = rng.normal(size=n_cls) if trial % 3 == 0 else None
    if trial % 4 == 1:
        em = np.round(em)  # ties
        trans = None if trans is None else np.round(trans)
    elif trial % 4 == 2:
        em[:] = 0.5  # every path ties (without transitions)
    tg = rng.integers(0, n_cls, size=(n, s))
    il = rng.integers(0, t_max + 1, size=n)
    tl = rng.integers(0, s + 1, size=n)
    return em, trans, start, tg, il, tl


def test_asg_checkpointed_equals_full_table_random(rng):
    for trial in range(120):
        em, trans, start, tg, il, tl = asg_random_case(rng, trial, 40, 3, 12)
        full = core_align.asg_align(em, trans, tg, il, tl, start_transitions=start,
                                    _checkpoint_cells=1 << 40)
        ckpt = core_align.asg_align(em, trans, tg, il, tl, start_transitions=start,
                                    _checkpoint_cells=0)
        np.testing.assert_array_equal(ckpt[0], full[0], err_msg=f"trial {trial}")
        np.testing.assert_array_equal(ckpt[1], full[1], err_msg=f"trial {trial}")


def test_asg_checkpointed_long_path_score(rng):
    t_max, n_cls, n_lab = 300, 5, 40
    em = rng.normal(size=(t_max, 1, n_cls))
    trans = rng.normal(size=(n_cls, n_cls))
    tg = np.cumsum(rng.integers(1, n_cls, size=(1, n_lab)), axis=1) % n_cls  # no repeats
    labels, scores = core_align.asg_align(em, trans, tg, [t_max], [n_lab], _checkpoint_cells=0)
    full = core_align.asg_align(em, trans, tg, [t_max], [n_lab], _checkpoint_cells=1 << 40)
    np.testing.assert_array_equal(labels, full[0])
    path = labels[0]
    # the path spells the target, each token on >= 1 consecutive frames
    assert [int(k) for i, k in enumerate(path) if i == 0 or k != path[i - 1]] == list(tg[0])
    # its score, summed here: emissions + transitions between consecutive frames
    score = em[0, 0, path[0]] + sum(em[t, 0, path[t]] + trans[path[t], path[t - 1]]
                                    for t in range(1, t_max))
    np.testing.assert_allclose(score, scores[0], rtol=1e-12)


# --------------------------------------------------------------------------- #
# rnnt_align / transducer_viterbi: checkpointed rows, recomputing backtrace     #
# --------------------------------------------------------------------------- #
def _lattice_case(rng, trial):
    n, s_max, t_max = 3, int(rng.integers(0, 8)), int(rng.integers(1, 12))
    modified = trial % 2 == 1
    px = rng.standard_normal((n, s_max, t_max + (0 if modified else 1)))
    py = rng.standard_normal((n, s_max + 1, t_max))
    if trial % 3 == 1:
        px, py = np.round(px), np.round(py)  # many ties
    elif trial % 3 == 2:
        px[:], py[:] = -1.0, -1.0  # every path ties
    if trial % 7 == 0 and s_max:
        px[0, 0, :] = -np.inf  # sequence 0: no path
    if trial % 11 == 0:
        py[1, 0, 0] = np.nan
    bd = np.zeros((n, 4), np.int64)
    for b in range(n):  # random boxes, empty ones included
        s1, t1 = int(rng.integers(0, s_max + 1)), int(rng.integers(0, t_max + 1))
        bd[b] = [int(rng.integers(0, s1 + 1)), int(rng.integers(0, t1 + 1)), s1, t1]
    return px, py, bd, "modified" if modified else "regular"


def test_rnnt_checkpointed_equals_full_table_random(rng):
    from duoloss.core.losses import transducer

    for trial in range(150):
        px, py, bd, rnnt_type = _lattice_case(rng, trial)
        full = transducer.transducer_viterbi(px, py, bd, rnnt_type, _checkpoint_cells=1 << 40)
        ckpt = transducer.transducer_viterbi(px, py, bd, rnnt_type, _checkpoint_cells=0)
        np.testing.assert_array_equal(ckpt[0], full[0], err_msg=f"trial {trial}")
        np.testing.assert_array_equal(ckpt[1], full[1], err_msg=f"trial {trial}")


def test_rnnt_checkpointed_infeasible_nan_and_empty():
    from duoloss.core.losses import transducer

    px, py = np.zeros((4, 3, 5)), np.zeros((4, 4, 4))
    px[1] = -np.inf  # no symbol can be emitted: infeasible for s_end > 0
    py[2, 1, 2] = np.nan
    bd = np.array([[0, 0, 0, 0], [0, 0, 3, 4], [0, 0, 3, 4], [1, 1, 3, 4]])
    for modified in ("regular", "modified"):
        pxm = px if modified == "regular" else px[..., :4].copy()
        a = transducer.transducer_viterbi(pxm, py, bd, modified, _checkpoint_cells=0)
        b = transducer.transducer_viterbi(pxm, py, bd, modified, _checkpoint_cells=1 << 40)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[0][0] == 0.0 and np.all(a[1][0] == -1)  # the one-node box
        assert a[0][1] == -np.inf and np.all(a[1][1] == -1)
        assert np.isnan(a[0][2]) == (modified == "regular")  # modified: NaN off every path


def test_rnnt_checkpointed_long_sequence_path_score(rng):
    from duoloss.core.losses import transducer

    s_max, t_max = 60, 200  # segments of 8 rows, a backtrace that crosses many columns
    assert transducer._viterbi_segment(s_max + 1) == 8
    px = rng.standard_normal((2, s_max, t_max + 1)) - 2.0
    py = rng.standard_normal((2, s_max + 1, t_max)) - 0.5
    px[0, :, t_max] = -np.inf  # no symbol on the one-past-the-last frame (rnnt_loss's lattice)
    px[1, :, 150:] = -np.inf
    px[1, 10:30], py[1, 10:30] = -1.0, -1.0  # a tied stretch
    bd = np.array([[0, 0, s_max, t_max], [0, 0, 41, 150]])
    full = transducer.transducer_viterbi(px, py, bd, _checkpoint_cells=1 << 40)
    scores, frames = transducer.transducer_viterbi(px, py, bd, _checkpoint_cells=0)
    np.testing.assert_array_equal(frames, full[1])
    np.testing.assert_array_equal(scores, full[0])
    for b, (s_end, t_end) in enumerate([(s_max, t_max), (41, 150)]):
        fr = frames[b, :s_end]
        assert np.all(np.diff(fr) >= 0) and 0 <= fr[0] and fr[-1] < t_end
        assert np.all(frames[b, s_end:] == -1)
        # the path's score, summed here: each symbol on its frame, one blank per frame
        emitted = np.searchsorted(fr, np.arange(t_end), side="right")  # symbols by frame t
        score = px[b, np.arange(s_end), fr].sum() + py[b, emitted, np.arange(t_end)].sum()
        np.testing.assert_allclose(score, scores[b], rtol=1e-12)


@pytest.mark.parametrize("x64", [False, True])
def test_rnnt_align_frontends_take_the_checkpointed_path(rng, monkeypatch, x64):
    import jax
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt
    from duoloss.core.losses import transducer

    logits = rng.standard_normal((3, 12, 6, 5)).astype(np.float32)
    logits[2, :, :, :] = 0.0  # every alignment ties
    tg = rng.integers(1, 5, size=(3, 5))
    il, tl = np.array([12, 9, 7]), np.array([5, 3, 5])
    args = (torch.from_numpy(logits), torch.from_numpy(tg), torch.from_numpy(il),
            torch.from_numpy(tl))
    full = [x.numpy() for x in dt.rnnt_align(*args, blank=0)]
    monkeypatch.setattr(transducer, "RNNT_CHECKPOINT_CELLS", 0)
    ckpt = [x.numpy() for x in dt.rnnt_align(*args, blank=0)]
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        jx = [np.asarray(x) for x in jax.jit(dj.rnnt_align, static_argnames="blank")(
            logits, tg, il, tl, blank=0)]
    finally:
        jax.config.update("jax_enable_x64", old)
    for a, b, c in zip(full, ckpt, jx):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(c, a)
    # each alignment spells its target (blanks dropped), one blank per frame
    for b in range(3):
        row = full[0][b][full[0][b] >= 0]
        assert list(row[row != 0]) == list(tg[b, :tl[b]]) and np.sum(row == 0) == il[b]
