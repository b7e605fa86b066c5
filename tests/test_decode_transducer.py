"""Transducer decoding (torch and JAX) from a stateful predictor and a joiner.

The model: an embedding + LSTM-cell predictor (state ``(h, c)``: a tuple in torch, a dict
in JAX, so the state handling is exercised) and a ``tanh`` joiner, the same float64 weights
in three implementations: numpy (the references), torch and JAX.

* greedy (RNN-T, TDT, multi-blank) against plain per-utterance loops in numpy that follow
  the documented rules step by step;
* beam searches with a beam that keeps every hypothesis against exhaustive enumeration of
  every path (RNN-T: one move per frame; TDT: the lattice with duration-0 tokens and the
  per-frame symbol cap), each sequence's probability summed over its paths;
* beam 1 == greedy with one symbol per frame (RNN-T); torch == JAX (float64, 1e-12) on
  batches with padded and zero lengths; ``jax.jit``; bad input.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

import duoloss.torch as dt

jax = pytest.importorskip("jax")
jnp = jax.numpy
import duoloss.jax as dj  # noqa: E402

E, H, J = 4, 5, 6  # embedding, predictor state, joiner sizes


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


# ------------------------------------------------------------------------------ the model
def make_weights(seed, n_cls, n_out, blank, blank_bias=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    w = dict(emb=rng.standard_normal((n_cls, E)), wx=rng.standard_normal((E, 4 * H)) * 0.5,
             wh=rng.standard_normal((H, 4 * H)) * 0.5, b=rng.standard_normal(4 * H) * 0.1,
             p=rng.standard_normal((H, J)), wo=rng.standard_normal((J, n_out)) * scale,
             bo=rng.standard_normal(n_out) * 0.3)
    w["bo"][blank] += blank_bias
    return w


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_predict(w, tok, state):
    h, c = (np.zeros(H), np.zeros(H)) if state is None else state
    g = w["emb"][tok] @ w["wx"] + h @ w["wh"] + w["b"]
    i, f, gg, o = np.split(g, 4)
    c = _sig(f) * c + _sig(i) * np.tanh(gg)
    h = _sig(o) * np.tanh(c)
    return h, (h, c)


def np_join(w, e, p):
    return np.tanh(e + p @ w["p"]) @ w["wo"] + w["bo"]


def _log_softmax(x):
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def torch_model(w):
    tw = {k: torch.from_numpy(v) for k, v in w.items() if k != "float32"}

    def predict(tokens, state):
        n = tokens.shape[0]
        h, c = (torch.zeros(n, H, dtype=tw["wx"].dtype),) * 2 if state is None else state
        g = tw["emb"][tokens] @ tw["wx"] + h @ tw["wh"] + tw["b"]
        i, f, gg, o = g.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, (h, c)

    def join(e, p):
        return torch.tanh(e + p @ tw["p"]) @ tw["wo"] + tw["bo"]

    return predict, join


def jax_model(w):
    jw = {k: jnp.asarray(v) for k, v in w.items() if k != "float32"}

    def predict(tokens, state):
        n = tokens.shape[0]
        if state is None:
            state = {"h": jnp.zeros((n, H), jw["wx"].dtype), "c": jnp.zeros((n, H), jw["wx"].dtype)}
        g = jw["emb"][tokens] @ jw["wx"] + state["h"] @ jw["wh"] + jw["b"]
        i, f, gg, o = jnp.split(g, 4, -1)
        c = jax.nn.sigmoid(f) * state["c"] + jax.nn.sigmoid(i) * jnp.tanh(gg)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, {"h": h, "c": c}

    def join(e, p):
        return jnp.tanh(e + p @ jw["p"]) @ jw["wo"] + jw["bo"]

    return predict, join


# ------------------------------------------------------------------------------ references
def ref_greedy(kind, w, enc, t_b, blank, max_sym, durations=(), big=(), n_tok=None):
    """One utterance, step by step: (tokens, frames)."""
    pred, state = np_predict(w, blank, None)
    t, sym, toks, frames = 0, 0, [], []
    while t < t_b:
        logits = np_join(w, enc[t], pred)
        if kind == "tdt":  # NeMo's rule: a 0 duration becomes 1 for a blank or the last token
            k = int(np.argmax(logits[:n_tok]))
            adv = durations[int(np.argmax(logits[n_tok:]))]
            if adv == 0 and (k == blank or sym + 1 >= max_sym):
                adv = 1
        else:
            k = int(np.argmax(logits))
            if k == blank:
                adv = 1
            elif kind == "multiblank" and blank - len(big) <= k < blank:
                adv = big[blank - 1 - k]
            else:
                adv = 0 if sym + 1 < max_sym else 1
        is_token = k != blank and not (kind == "multiblank" and blank - len(big) <= k < blank)
        if is_token:
            toks.append(k)
            frames.append(t)
            pred, state = np_predict(w, k, state)
            sym += 1
        if adv > 0:
            t, sym = t + adv, 0
    return toks, frames


def ref_rnnt_sequences(w, enc, t_b, blank, n_cls):
    """Every path of one move per frame: {tokens: log of the summed probability}."""
    out = defaultdict(list)

    def rec(t, seq, pred, state, logp):
        if t == t_b:
            out[tuple(seq)].append(logp)
            return
        lp = _log_softmax(np_join(w, enc[t], pred))
        for k in range(n_cls):
            if k == blank:
                rec(t + 1, seq, pred, state, logp + lp[k])
            else:
                p2, s2 = np_predict(w, k, state)
                rec(t + 1, seq + [k], p2, s2, logp + lp[k])

    p0, s0 = np_predict(w, blank, None)
    rec(0, [], p0, s0, 0.0)
    return {s: float(np.logaddexp.reduce(v)) for s, v in out.items()}


def ref_tdt_sequences(w, enc, t_b, blank, n_cls, durations, max_sym):
    """Every TDT path (tokens of any duration, blanks of positive ones, at most ``max_sym``
    tokens per frame with the last one leaving it; a move past the end ends the path)."""
    out = defaultdict(list)

    def rec(t, r, seq, pred, state, logp):
        if t >= t_b:
            out[tuple(seq)].append(logp)
            return
        logits = np_join(w, enc[t], pred)
        lp, ld = _log_softmax(logits[:n_cls]), _log_softmax(logits[n_cls:])
        for i, d in enumerate(durations):
            if d > 0:
                rec(min(t + d, t_b), 0, seq, pred, state, logp + lp[blank] + ld[i])
            for k in range(n_cls):
                if k == blank or (d == 0 and r >= max_sym - 1):
                    continue
                p2, s2 = np_predict(w, k, state)
                if d == 0:
                    rec(t, r + 1, seq + [k], p2, s2, logp + lp[k] + ld[i])
                else:
                    rec(min(t + d, t_b), 0, seq + [k], p2, s2, logp + lp[k] + ld[i])

    p0, s0 = np_predict(w, blank, None)
    rec(0, 0, [], p0, s0, 0.0)
    return {s: float(np.logaddexp.reduce(v)) for s, v in out.items()}


def _unpad(tokens, lengths, frames):
    tokens, lengths, frames = (np.asarray(x) for x in (tokens, lengths, frames))
    out = []
    for n in range(tokens.shape[0]):
        k = int(lengths[n])
        assert (tokens[n, k:] == -1).all() and (frames[n, k:] == -1).all()
        out.append((tokens[n, :k].tolist(), frames[n, :k].tolist()))
    return out


def _run_torch(name, enc, lengths, w, *args, **kw):
    tp, tj = torch_model(w)
    got = getattr(dt, name)(torch.from_numpy(enc), torch.from_numpy(lengths), tp, tj, *args, **kw)
    return [x.numpy() for x in got]


def _run_both(name, enc, lengths, w, *args, **kw):
    """The torch and the JAX result of ``name`` as numpy arrays (each JAX call with a new
    model compiles its search: a few seconds, so the tests make few of them)."""
    tp, tj = torch_model(w)
    got_t = getattr(dt, name)(torch.from_numpy(enc), torch.from_numpy(lengths), tp, tj, *args, **kw)
    jp, jj = jax_model(w)
    got_j = getattr(dj, name)(jnp.asarray(enc), jnp.asarray(lengths), jp, jj, *args, **kw)
    return [x.numpy() for x in got_t], [np.asarray(x) for x in got_j]


def _same(got_t, got_j):
    for a, b in zip(got_t, got_j):
        assert a.shape == b.shape
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ greedy
GREEDY_CASES = [  # (kind, model, arguments, compare with JAX)
    ("rnnt", dict(n_cls=5, blank=4), dict(blank=-1, max_symbols_per_frame=2), True),
    ("rnnt", dict(n_cls=4, blank=0), dict(blank=0, max_symbols_per_frame=10), False),
    ("tdt", dict(n_cls=4, blank=3, durations=[0, 1, 2, 4]),
     dict(blank=3, durations=[0, 1, 2, 4], max_symbols_per_frame=3), True),
    ("tdt", dict(n_cls=3, blank=0, durations=[2, 1]), dict(blank=0, durations=[2, 1]), False),
    ("multiblank", dict(n_cls=6, blank=5, big=[2, 3]),
     dict(blank=5, big_blank_durations=[2, 3], max_symbols_per_frame=2), True),
]


@pytest.mark.parametrize("kind,model,kw,with_jax", GREEDY_CASES)
def test_greedy_matches_the_loop_reference(kind, model, kw, with_jax, x64):
    n_cls, blank = model["n_cls"], model["blank"]
    durations = model.get("durations", [])
    n_out = n_cls + len(durations)
    rng = np.random.default_rng(len(str(kw)))
    t_max, n = 9, 4
    enc = rng.standard_normal((n, t_max, J))
    lengths = np.array([t_max, 5, 0, 1])
    name = {"rnnt": "rnnt_greedy_decode", "tdt": "tdt_greedy_decode",
            "multiblank": "multiblank_greedy_decode"}[kind]
    for seed, bias in ((0, 0.0), (1, 1.5)):  # token-heavy, then blank-heavy
        w = make_weights(seed, n_cls, n_out, blank, blank_bias=bias, scale=1.5)
        if with_jax and seed == 0:
            got_t, got_j = _run_both(name, enc, lengths, w, **kw)
            _same(got_t, got_j)
        else:
            got_t = _run_torch(name, enc, lengths, w, **kw)
        max_sym = kw.get("max_symbols_per_frame", 10)
        assert got_t[0].shape == (n, t_max * max_sym)
        want = [ref_greedy(kind, w, enc[b], lengths[b], blank, max_sym, durations,
                           model.get("big", ()), n_cls) for b in range(n)]
        assert _unpad(*got_t) == want


def test_greedy_emits_several_symbols_per_frame_and_caps_them(x64):
    """A joiner that always prefers token 1: max_symbols_per_frame tokens on every frame."""
    w = make_weights(0, 3, 3, 0)
    w["wo"][:] = 0.0
    w["bo"][:] = [0.0, 5.0, 1.0]
    enc = np.zeros((1, 4, J))
    got_t = _run_torch("rnnt_greedy_decode", enc, np.array([4]), w, blank=0,
                       max_symbols_per_frame=3)
    assert _unpad(*got_t) == [([1] * 12, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])]


def test_tdt_greedy_zero_durations_as_nemo():
    """NeMo's GreedyTDTInfer: a blank whose best duration is 0 moves one frame, and so does
    the max_symbols_per_frame-th token; a 0-duration token otherwise stays on its frame.
    Frames ask for token 0 (value 1) or the blank (value 0); duration 0 always wins."""
    def predict(tokens, state):
        return tokens[:, None].double(), None

    def join(frames, pred):
        n = frames.shape[0]
        tok = torch.nn.functional.one_hot(torch.where(frames[:, 0] > 0, 0, 1), 2).double()
        return torch.cat([tok, torch.tensor([[5.0, 0.0]]).expand(n, 2)], 1)  # durations [0, 2]

    enc = torch.tensor([[[0.0], [1.0], [0.0], [1.0]]])
    got = dt.tdt_greedy_decode(enc, [4], predict, join, 1, [0, 2], max_symbols_per_frame=2)
    assert _unpad(*[x.numpy() for x in got]) == [([0, 0, 0, 0], [1, 1, 3, 3])]
    jgot = dj.tdt_greedy_decode(jnp.asarray(enc.numpy()), [4],
                                lambda t, s: (t[:, None] * 1.0, None),
                                lambda f, p: jnp.concatenate(
                                    [jax.nn.one_hot(jnp.where(f[:, 0] > 0, 0, 1), 2),
                                     jnp.tile(jnp.array([[5.0, 0.0]]), (f.shape[0], 1))], 1),
                                1, [0, 2], max_symbols_per_frame=2)
    assert _unpad(*jgot) == [([0, 0, 0, 0], [1, 1, 3, 3])]


# ------------------------------------------------------------------------------ beam search
def _hyps(tokens, lengths, scores, b):
    out = {}
    for i in range(tokens.shape[1]):
        if np.isfinite(scores[b, i]):
            seq = tuple(tokens[b, i, :lengths[b, i]].tolist())
            assert seq not in out, "a sequence twice in the n-best: not merged"
            out[seq] = float(scores[b, i])
    return out


def test_rnnt_beam_search_with_a_full_beam_is_exhaustive(x64):
    n_cls, blank, t_max = 3, 1, 4
    w = make_weights(3, n_cls, n_cls, blank, scale=1.2)
    rng = np.random.default_rng(5)
    enc = rng.standard_normal((3, t_max, J))
    lengths = np.array([4, 2, 0])
    beam = 2 ** (t_max + 1)  # >= every sequence of <= 4 tokens over 2 labels (31)
    got_t, got_j = _run_both("rnnt_beam_search", enc, lengths, w, blank=blank, beam=beam)
    _same(got_t, got_j)
    tokens, lens, scores, frames = got_t
    assert tokens.shape == (3, beam, t_max) and scores.shape == (3, beam)
    for b in range(3):
        want = ref_rnnt_sequences(w, enc[b], lengths[b], blank, n_cls)
        got = _hyps(tokens, lens, scores, b)
        assert set(got) == set(want)
        for seq in want:
            assert abs(got[seq] - want[seq]) < 1e-10
        assert np.all(np.diff(scores[b][np.isfinite(scores[b])]) <= 0)  # best first
        np.testing.assert_allclose(np.logaddexp.reduce(list(got.values())), 0.0, atol=1e-10)
        for i in range(int(np.isfinite(scores[b]).sum())):  # one token per frame, in order
            fr = frames[b, i, :lens[b, i]]
            assert np.all(np.diff(fr) > 0) and np.all(fr < lengths[b])


def test_tdt_beam_search_with_a_full_beam_is_exhaustive(x64):
    n_cls, blank, t_max, durations, max_sym = 3, 2, 3, [0, 1, 2], 2
    w = make_weights(4, n_cls, n_cls + len(durations), blank)
    rng = np.random.default_rng(6)
    enc = rng.standard_normal((2, t_max, J))
    lengths = np.array([3, 2])
    beam = 160  # the 127 sequences, each on its final frame, and the hypotheses on the way
    got_t, got_j = _run_both("tdt_beam_search", enc, lengths, w, blank, durations, beam=beam,
                             max_symbols_per_frame=max_sym)
    _same(got_t, got_j)
    tokens, lens, scores, _ = got_t
    assert tokens.shape == (2, beam, t_max * max_sym)
    for b in range(2):
        want = ref_tdt_sequences(w, enc[b], lengths[b], blank, n_cls, durations, max_sym)
        got = _hyps(tokens, lens, scores, b)
        assert len(want) > 20 and set(got) == set(want)
        for seq in want:
            assert abs(got[seq] - want[seq]) < 1e-10


def test_rnnt_beam_one_is_greedy_with_one_symbol_per_frame(x64):
    n_cls, blank = 6, 0
    w = make_weights(8, n_cls, n_cls, blank, scale=1.5)
    rng = np.random.default_rng(9)
    enc = rng.standard_normal((3, 10, J))
    lengths = np.array([10, 7, 3])
    beam_t = _run_torch("rnnt_beam_search", enc, lengths, w, blank=blank, beam=1)
    greedy_t = _run_torch("rnnt_greedy_decode", enc, lengths, w, blank=blank,
                            max_symbols_per_frame=1)
    for b in range(3):
        k = greedy_t[1][b]
        assert beam_t[1][b, 0] == k
        np.testing.assert_array_equal(beam_t[0][b, 0, :k], greedy_t[0][b, :k])
        np.testing.assert_array_equal(beam_t[3][b, 0, :k], greedy_t[2][b, :k])


def test_narrow_beams_torch_equals_jax_and_jit(x64):
    """Beams far narrower than the hypotheses: pruning and merging in both frameworks;
    the JAX search also inside a user's ``jax.jit``."""
    n_cls, blank = 7, 6
    rng = np.random.default_rng(10)
    enc = rng.standard_normal((3, 12, J))
    lengths = np.array([12, 9, 4])
    w = make_weights(11, n_cls, n_cls, blank)
    got_t = _run_torch("rnnt_beam_search", enc, lengths, w, blank=-1, beam=3)
    assert np.isfinite(got_t[2]).all()
    w = make_weights(12, n_cls, n_cls + 3, blank)
    got_t, got_j = _run_both("tdt_beam_search", enc, lengths, w, -1, [0, 1, 3], beam=3,
                             max_symbols_per_frame=3)
    _same(got_t, got_j)
    assert np.isfinite(got_t[2]).all()
    p, j = jax_model(w)
    jitted = jax.jit(lambda e, l: dj.tdt_beam_search(e, l, p, j, -1, [0, 1, 3], beam=3,
                                                     max_symbols_per_frame=3))
    _same(got_t, [np.asarray(x) for x in jitted(jnp.asarray(enc), jnp.asarray(lengths))])


def test_float32_and_no_x64():
    """float32 models, JAX without x64 (int32 outputs): the same hypotheses as torch."""
    n_cls, blank = 5, 4
    w = {k: v.astype(np.float32) for k, v in make_weights(15, n_cls, n_cls, blank, scale=1.5).items()}
    w["float32"] = True
    rng = np.random.default_rng(16)
    enc = rng.standard_normal((2, 7, J)).astype(np.float32)
    lengths = np.array([7, 5])
    got_t, got_j = _run_both("rnnt_beam_search", enc, lengths, w, beam=2)
    for a, b in zip(got_t, got_j):
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-5)
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("frontend", ["torch", "jax"])
def test_bad_input(frontend):
    mod, arr = (dt, torch.from_numpy) if frontend == "torch" else (dj, jnp.asarray)
    w = make_weights(0, 4, 4 + 2, 3)
    p, j = torch_model(w) if frontend == "torch" else jax_model(w)
    enc = arr(np.zeros((2, 3, J)))
    ok = arr(np.array([3, 2]))
    with pytest.raises(ValueError, match=r"rnnt_greedy_decode: argument 'encoder_lengths' must be in \[0, 3\].*got 4"):
        mod.rnnt_greedy_decode(enc, arr(np.array([4, 2])), p, j)
    with pytest.raises(ValueError, match=r"rnnt_beam_search: argument 'encoder_lengths' must be shape \(2,\)"):
        mod.rnnt_beam_search(enc, arr(np.array([3])), p, j)
    with pytest.raises(TypeError, match=r"rnnt_beam_search: argument 'join' must be callable"):
        mod.rnnt_beam_search(enc, ok, p, None)
    with pytest.raises(ValueError, match=r"rnnt_beam_search: argument 'beam' must be in"):
        mod.rnnt_beam_search(enc, ok, p, j, beam=0)
    with pytest.raises(ValueError, match=r"rnnt_greedy_decode: argument 'blank' must be in \[-6, 6\), got 6"):
        mod.rnnt_greedy_decode(enc, ok, p, j, blank=6)
    with pytest.raises(ValueError, match=r"tdt_greedy_decode: argument 'blank' must be in \[-4, 4\), got 4"):
        mod.tdt_greedy_decode(enc, ok, p, j, 4, [0, 1])
    with pytest.raises(ValueError, match=r"tdt_beam_search: argument 'durations' must hold a positive"):
        mod.tdt_beam_search(enc, ok, p, j, 3, [0])
    with pytest.raises(ValueError, match=r"tdt_greedy_decode: argument 'durations' must hold distinct"):
        mod.tdt_greedy_decode(enc, ok, p, j, 3, [1, 1])
    with pytest.raises(ValueError, match=r"tdt_greedy_decode: 'join' must return V \+ D logits"):
        mod.tdt_greedy_decode(enc, ok, p, j, 0, [0, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"multiblank_greedy_decode: argument 'big_blank_durations' must leave"):
        mod.multiblank_greedy_decode(enc, ok, p, j, 1, [2, 3])
    with pytest.raises(ValueError, match=r"rnnt_greedy_decode: argument 'max_symbols_per_frame' must be in"):
        mod.rnnt_greedy_decode(enc, ok, p, j, max_symbols_per_frame=0)
    with pytest.raises(TypeError, match=r"rnnt_greedy_decode: argument 'encoder_out' must have a floating"):
        mod.rnnt_greedy_decode(arr(np.zeros((2, 3, J), np.int64)), ok, p, j)


def test_zero_frames(x64):
    w = make_weights(0, 4, 4, 3)
    enc = np.zeros((2, 0, J))
    got_t, got_j = _run_both("rnnt_beam_search", enc, np.array([0, 0]), w, beam=2)
    _same(got_t, got_j)
    assert got_t[0].shape == (2, 2, 0) and got_t[1].tolist() == [[0, 0], [0, 0]]
    assert got_t[2][:, 0].tolist() == [0.0, 0.0] and np.isinf(got_t[2][:, 1]).all()
    got_t, got_j = _run_both("rnnt_greedy_decode", enc, np.array([0, 0]), w)
    _same(got_t, got_j)
    assert got_t[1].tolist() == [0, 0]

