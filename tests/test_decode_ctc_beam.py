"""CTC prefix beam search (``ctc_decoder``) against independent references.

* Exhaustive search: every alignment of T <= 6 frames over C <= 5 classes is enumerated in
  plain Python; the best labelling (viterbi: max over alignments; ``log_add``: CTC
  probability summed over the alignments of each labelling) must equal the beam search
  with a beam that keeps everything.  With a lexicon and an ARPA LM each alignment is parsed
  into words and scored as documented (acoustic + lm_weight x log10 LM (ARPA semantics by
  ``ArpaLM.score``, itself checked against hand computations in test_decode_arpa.py and here)
  + word_score per word + sil_score per silence frame).
* The numba LM tables equal ``ArpaLM.score`` (and a hand computation) to 1e-6.
* Hotword bonuses on hand-computed cases; torch and JAX identical; NaN utterances;
  one thread vs several; bad input.
"""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest

from duoloss.core import _pool
from duoloss.core.decoding import read_arpa
from duoloss.core.decoding.ctc_beam import CTCDecoderLM, build_decoder, compile_lm
from duoloss.core.decoding import _beam_kernel as _k

WIDE = dict(beam_size=100_000, beam_threshold=math.inf)


def _emissions(rng, B, T, C, sharp=1.5):
    x = rng.standard_normal((B, T, C)) * sharp
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _collapse(frames, blank):
    """CTC collapse of a per-frame token path: repeats merged, then blanks removed."""
    out = []
    prev = None
    for f in frames:
        if f != prev and f != blank:
            out.append(f)
        prev = f
    return out


def _lse(a, b):
    if a == -math.inf:
        return b
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


# ----------------------------------------------------------------------------- lexicon-free

def _brute_lexfree(em, blank, sil, sil_score, log_add, k=None):
    """label sequence (after the start silence) -> best or summed alignment score, and the
    best alignment of each labelling; with ``k``, only alignments through each frame's ``k``
    best classes (flashlight's beam_size_token without a lexicon)."""
    T, C = em.shape
    agg, best_path = {}, {}
    allowed = [set(np.argsort(-em[t], kind="stable")[:k].tolist()) if k else set(range(C))
               for t in range(T)]
    for path in itertools.product(range(C), repeat=T):
        if any(c not in allowed[t] for t, c in enumerate(path)):
            continue
        s = sum(em[t, c] for t, c in enumerate(path)) + sil_score * sum(c == sil for c in path)
        # the search starts in silence: a first-frame silence continues it
        lab = tuple(_collapse((sil,) + path, blank)[1:])
        if lab not in agg:
            agg[lab], best_path[lab] = -math.inf, None
        if best_path[lab] is None or s > best_path[lab][0]:
            best_path[lab] = (s, path)
        agg[lab] = _lse(agg[lab], s) if log_add else max(agg[lab], s)
    return agg, best_path


@pytest.mark.parametrize("log_add", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_lexicon_free_equals_exhaustive_search(seed, log_add):
    rng = np.random.default_rng(seed)
    T, C = 5, 4
    tokens = ["-", "|", "a", "b"]
    em = _emissions(rng, 1, T, C)
    sil_score = [0.0, -0.7, 0.4, 0.0, 0.2][seed]
    k = 3 if seed == 4 else None          # beam_size_token: each frame's 3 best classes
    dec = build_decoder(tokens, nbest=3, sil_score=sil_score, log_add=log_add,
                        beam_size_token=k, **WIDE)
    hyps = dec.decode(em)[0]
    agg, best_path = _brute_lexfree(em[0], 0, 1, sil_score, log_add, k)
    ranked = sorted(agg.items(), key=lambda kv: -kv[1])
    for h, (lab, score) in zip(hyps, ranked[:3]):
        assert h.score == pytest.approx(score, abs=1e-9)
        # tokens: start silence + labelling + end silence, merged as torchaudio merges them
        frames = (1,) + best_path[lab][1] + (1,)
        expect = [f for i, f in enumerate(frames) if f != 0 and (i == 0 or f != frames[i - 1])]
        if not log_add:
            assert h.tokens.tolist() == expect
            times = [i for i, f in enumerate(frames) if f != 0 and (i == 0 or f != frames[i - 1])]
            assert h.timesteps.tolist() == times
        else:   # the labelling (the kept path may be another alignment of it)
            toks = h.tokens.tolist()
            assert toks[0] == 1 and toks[1:] in (list(lab), list(lab) + [1])
    assert len(hyps) == 3


def test_log_add_gives_the_ctc_probability_of_the_labelling():
    """Uniform emissions, T=2, classes (-, |, a): the search starts in silence, so counted by
    hand the labelling "a" has the alignments (a,a), (a,-), (-,a), (|,a): probability 4/9;
    "a|" has (a,|): 1/9; "" has (-,-), (|,|), (|,-): 3/9; "|" has (-,|): 1/9.  Both "a" and
    "a|" are reported with the tokens | a | (the end silence merges with the labelling's)."""
    em = np.log(np.full((1, 2, 3), 1 / 3))
    dec = build_decoder(["-", "|", "a"], nbest=10, log_add=True, **WIDE)
    hyps = dec.decode(em)[0]
    assert len(hyps) == 4
    probs = sorted((math.exp(h.score) for h in hyps), reverse=True)
    assert probs == pytest.approx([4 / 9, 3 / 9, 1 / 9, 1 / 9], abs=1e-12)
    assert sorted(math.exp(h.score) for h in hyps if h.tokens.tolist() == [1, 2, 1]) == \
        pytest.approx([1 / 9, 4 / 9], abs=1e-12)


# ----------------------------------------------------------------------------- lexicon + LM

ARPA = """\\data\\
ngram 1=6
ngram 2=5

\\1-grams:
-1.0\t<s>\t-0.3
-0.6\tab\t-0.2
-0.9\tba\t-0.25
-1.2\ta\t-0.1
-0.7\t</s>
-2.0\t<unk>

\\2-grams:
-0.2\t<s>\tab
-0.5\tab\tba
-0.4\tba\t</s>
-0.3\tab\t</s>
-0.8\ta\tab

\\end\\
"""

LEXICON = "ab a b |\nba b a |\na a |\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctcbeam")
    (d / "lm.arpa").write_text(ARPA)
    (d / "lexicon.txt").write_text(LEXICON)
    return str(d / "lm.arpa"), str(d / "lexicon.txt")


def _parse_words(labs, spell_to_word, sil):
    """Split a label sequence into words (spellings end with the silence token) and
    silences; None when the sequence does not end at a word boundary or spells no word."""
    words, cur = [], []
    for x in labs:
        cur.append(x)
        if x == sil:
            if len(cur) == 1:         # silence between words
                cur = []
                continue
            w = spell_to_word.get(tuple(cur))
            if w is None:
                return None
            words.append(w)
            cur = []
    return None if cur else words


def _brute_lexicon(em, lm, spell_to_word, lm_weight, word_score, sil_score, log_add):
    T, C = em.shape
    agg = {}
    for path in itertools.product(range(C), repeat=T):
        labs = _collapse((1,) + path, 0)[1:]
        words = _parse_words(labs, spell_to_word, 1)
        if words is None:
            continue
        s = sum(em[t, c] for t, c in enumerate(path)) + sil_score * sum(c == 1 for c in path)
        key = tuple(words)
        agg[key] = _lse(agg.get(key, -math.inf), s) if log_add else max(agg.get(key, -math.inf), s)
    out = {}
    for words, s in agg.items():
        out[words] = s + lm_weight * lm.sentence_log10(list(words)) + word_score * len(words)
    return out


class _ArpaAsPythonLM(CTCDecoderLM):
    """The ARPA model behind the CTCDecoderLM protocol (the search's Python path)."""

    def __init__(self, lm, units):
        self.lm, self.units = lm, units

    def _ctx(self, history):
        ctx = self.lm.begin()
        for u in history:
            _, ctx = self.lm.score(ctx, self.lm.word_id(self.units[u]))
        return ctx

    def start(self, start_with_nothing):
        return ()                               # a state: the history of unit ids

    def score(self, state, usr_token_idx):
        p, _ = self.lm.score(self._ctx(state), self.lm.word_id(self.units[usr_token_idx]))
        return state + (usr_token_idx,), p

    def finish(self, state):
        return state, self.lm.score(self._ctx(state), self.lm.eos)[0]


@pytest.mark.parametrize("seed,log_add,python_lm",
                         [(s, a, False) for s in range(3) for a in (False, True)]
                         + [(0, False, True), (1, True, True)])
def test_lexicon_and_lm_equal_exhaustive_search(files, seed, log_add, python_lm):
    arpa, lexicon = files
    lm = read_arpa(arpa)
    if python_lm:     # the same ARPA model as a Python LM: the search's Python path
        arpa = _ArpaAsPythonLM(lm, ["ab", "ba", "a", "<unk>"])
    rng = np.random.default_rng(100 + seed)
    T = 6
    tokens = ["-", "|", "a", "b"]
    em = _emissions(rng, 1, T, 4, sharp=1.0)
    lm_weight, word_score, sil_score = [(0.8, 0.5, 0.0), (2.0, -0.3, -0.2), (1.3, 1.0, 0.3)][seed]
    dec = build_decoder(tokens, lexicon, arpa, nbest=4, lm_weight=lm_weight,
                        word_score=word_score, sil_score=sil_score, log_add=log_add, **WIDE)
    hyps = dec.decode(em)[0]
    spell = {(2, 3, 1): "ab", (3, 2, 1): "ba", (2, 1): "a"}
    ref = _brute_lexicon(em[0], lm, spell, lm_weight, word_score, sil_score, log_add)
    ranked = sorted(ref.items(), key=lambda kv: -kv[1])
    assert len(hyps) == min(4, len(ranked))
    for h, (words, score) in zip(hyps, ranked):
        assert h.words == list(words)
        assert h.score == pytest.approx(score, abs=1e-9)


def test_lexicon_search_never_emits_a_word_outside_the_lexicon(files):
    arpa, lexicon = files
    rng = np.random.default_rng(7)
    em = _emissions(rng, 6, 30, 4, sharp=3.0)
    for lm in (None, arpa):
        dec = build_decoder(["-", "|", "a", "b"], lexicon, lm, nbest=5, beam_size=20)
        for hyps in dec.decode(em):
            assert hyps
            for h in hyps:
                assert set(h.words) <= {"ab", "ba", "a"}
                # the tokens spell those words (with silences); the end silence that no
                # frame emitted (timestep T + 1) is dropped, and when no hypothesis reached a
                # word boundary at the end, flashlight keeps those ending inside a word
                toks = h.tokens.tolist()[1:]
                if h.timesteps[-1] == em.shape[1] + 1:
                    toks = toks[:-1]
                cut = len(toks) - toks[::-1].index(1) if 1 in toks else 0
                got = _parse_words(toks[:cut], {(2, 3, 1): "ab", (3, 2, 1): "ba", (2, 1): "a"}, 1)
                assert got == h.words


def test_unknown_words(files):
    """unk_score > -inf: a trie prefix that is no word may end as ``<unk>`` (flashlight)."""
    _, lexicon = files
    # frames: b, blank -> "b" is a prefix (of "ba") but no word; with unk_score it becomes <unk>
    em = np.log(np.array([[[.05, .05, .05, .85], [.85, .05, .05, .05]]]))
    dec = build_decoder(["-", "|", "a", "b"], lexicon, None, unk_score=-0.5, **WIDE)
    h = dec.decode(em)[0][0]
    assert h.words == ["<unk>"]
    assert h.score == pytest.approx(math.log(.85 * .85) - 0.5, abs=1e-12)
    dec = build_decoder(["-", "|", "a", "b"], lexicon, None, **WIDE)
    assert dec.decode(em)[0][0].words == []


# ----------------------------------------------------------------------------- the LM tables

def test_lm_tables_equal_arpa_semantics(files):
    arpa, _ = files
    lm = read_arpa(arpa)
    t = compile_lm(lm)
    # every reachable context: walk all word sequences of length <= 3 from <s> and from ()
    V = len(lm.words)
    checked = 0
    for start in [lm.begin(), ()]:
        frontier = [(start, None)]
        for _ in range(3):
            nxt = []
            for ctx, sid in frontier:
                if sid is None:
                    sid = t.start if ctx == lm.begin() else 0
                for w in range(V):
                    if w == lm.bos:
                        continue
                    p_ref, ctx2 = lm.score(ctx, w)
                    p, s2 = _score(t, sid, w)
                    assert p == pytest.approx(p_ref, abs=1e-6), (ctx, w)
                    checked += 1
                    nxt.append((ctx2, s2))
            frontier = nxt
    assert checked > 100
    # by hand: p(ba | <s>) = bo(<s>) + p(ba) = -0.3 - 0.9; p(a | ab) = bo(ab) + p(a) = -0.2 - 1.2
    bos = lm.word_index
    p, s = _score(t, t.start, bos["ba"])
    assert p == pytest.approx(-1.2, abs=1e-9)
    p, _ = _score(t, s, bos["</s>"])
    assert p == pytest.approx(-0.4, abs=1e-9)
    p, s = _score(t, t.start, bos["ab"])
    assert p == pytest.approx(-0.2, abs=1e-9)
    p, _ = _score(t, s, bos["a"])
    assert p == pytest.approx(-1.4, abs=1e-9)


def _score(t, state, word):
    out_p = np.empty(1)
    out_s = np.empty(1, np.int32)
    _k.lm_score_many(t.keys, t.probs, t.nexts, t.keys.shape[0] - 1, t.n_words, t.bo, t.parent,
                     np.array([state], np.int64), np.array([word], np.int64), out_p, out_s)
    return float(out_p[0]), int(out_s[0])


def test_lm_tables_on_a_random_4gram(tmp_path):
    """A random 4-gram ARPA file (with pruned histories): tables == ArpaLM.score."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(12)]
    grams = [{(w,) for w in words + ["<s>", "</s>"]}]
    for n in range(2, 5):
        g = set()
        for _ in range(60):
            g.add(tuple(rng.choice(words, n - 1).tolist()) + (str(rng.choice(words + ["</s>"])),))
        grams.append(g)
    lines = ["\\data\\"] + [f"ngram {k + 1}={len(g)}" for k, g in enumerate(grams)] + [""]
    for k, g in enumerate(grams):
        lines.append(f"\\{k + 1}-grams:")
        for gram in sorted(g):
            lp = -99.0 if gram == ("<s>",) else round(float(-rng.uniform(0.1, 3)), 4)
            bo = f"\t{round(float(-rng.uniform(0, 1)), 4)}" if k < 3 and "</s>" not in gram else ""
            lines.append(f"{lp}\t{' '.join(gram)}{bo}")
        lines.append("")
    lines.append("\\end\\")
    path = tmp_path / "r.arpa"
    path.write_text("\n".join(lines) + "\n")
    lm = read_arpa(str(path))
    t = compile_lm(lm)
    for _ in range(300):
        seq = rng.choice(len(words), rng.integers(1, 7)).tolist()
        ctx, sid = lm.begin(), t.start
        for w in [lm.word_index[words[i]] for i in seq] + [lm.eos]:
            p_ref, ctx = lm.score(ctx, w)
            p, sid = _score(t, sid, w)
            assert p == pytest.approx(p_ref, abs=1e-6)


# ----------------------------------------------------------------------------- hotwords

def test_hotword_bonus_completed_phrase():
    """Lexicon-free, hotword "ab" (weight 3, 1.5 per token): "ab" beats a likelier "ba"."""
    tokens = ["-", "|", "a", "b"]
    em = np.log(np.array([[[.05, .05, .4, .5], [.05, .05, .5, .4]]]))
    plain = build_decoder(tokens, **WIDE).decode(em)[0][0]
    assert plain.tokens.tolist() == [1, 3, 2, 1]                 # "ba": 0.5 * 0.5
    hot = build_decoder(tokens, hotwords=[("ab", 3.0)], **WIDE).decode(em)[0][0]
    assert hot.tokens.tolist() == [1, 2, 3, 1]                   # "ab": 0.4 * 0.4, + 3
    assert hot.score == pytest.approx(math.log(.4 * .4) + 3.0, abs=1e-12)


def test_hotword_needs_word_boundaries():
    """Lexicon-free, hotword "a" (weight 2): "a" alone (between silences) earns it, the "a"
    in "ab" does not, so "a" beats the likelier "ab"."""
    tokens = ["-", "|", "a", "b"]
    em = np.log(np.array([[[.1 / 3, .1 / 3, .9, .1 / 3], [.45, .025, .025, .5]]]))
    plain = build_decoder(tokens, **WIDE).decode(em)[0][0]
    assert plain.tokens.tolist() == [1, 2, 3, 1]
    hot = build_decoder(tokens, hotwords=[("a", 2.0)], **WIDE).decode(em)[0][0]
    assert hot.tokens.tolist() == [1, 2, 1]
    assert hot.score == pytest.approx(math.log(.9 * .45) + 2.0, abs=1e-12)


def test_hotword_partial_match_is_taken_back():
    """Hotword "aba" (4 credited tokens a, b, a and the closing silence: 0.75 each): a
    hypothesis that stops after "ab" keeps no bonus at the end, but the partial bonus kept it
    in a beam of 1 on the way."""
    tokens = ["-", "|", "a", "b"]
    em = np.log(np.array([[[.05, .05, .45, .45], [.05, .05, .45, .45], [.9, .04, .03, .03]]]))
    h = build_decoder(tokens, hotwords=[("aba", 3.0)], **WIDE).decode(em)[0][0]
    # the best labelling gets no bonus (no whole "aba" fits): plain acoustic score
    assert h.score == pytest.approx(math.log(.45 * .45 * .9), abs=1e-12)
    # with a beam of one hypothesis the partial bonus decides the first frames: "ab"
    h1 = build_decoder(tokens, hotwords=["aba"], hotword_weight=3.0, beam_size=1).decode(em)[0][0]
    assert h1.tokens.tolist() == [1, 2, 3, 1]
    assert h1.score == pytest.approx(math.log(.45 * .45 * .9), abs=1e-12)


def test_hotword_in_lexicon_mode(files):
    _, lexicon = files
    tokens = ["-", "|", "a", "b"]
    # frames: b/a ambiguous, a/b ambiguous, silence: "ba" slightly likelier than "ab"
    em = np.log(np.array([[[.02, .02, .46, .5], [.02, .02, .5, .46], [.02, .94, .02, .02]]]))
    plain = build_decoder(tokens, lexicon, **WIDE).decode(em)[0][0]
    assert plain.words == ["ba"]
    hot = build_decoder(tokens, lexicon, hotwords=[("ab", 1.0)], **WIDE).decode(em)[0][0]
    assert hot.words == ["ab"]
    assert hot.score == pytest.approx(math.log(.46 * .46 * .94) + 1.0, abs=1e-12)


def test_hotwords_that_never_match_change_nothing():
    """200 hotwords, all starting with a token the emissions rule out (log prob -1000): the
    hypotheses and scores are those of the search without hotwords."""
    tokens = ["-", "|", "a", "b", "c"]
    rng = np.random.default_rng(5)
    em = _emissions(rng, 3, 40, 5)
    em[:, :, 4] = -1000.0
    base = build_decoder(tokens, beam_size=10, nbest=3).decode(em)
    phrases = ["c" + "".join(rng.choice(list("abc"), int(rng.integers(1, 8)))) for _ in range(200)]
    hot = build_decoder(tokens, beam_size=10, nbest=3, hotwords=phrases).decode(em)
    for a, b in zip(base, hot):
        assert [(x.tokens.tolist(), x.score) for x in a] == [(x.tokens.tolist(), x.score) for x in b]


# ----------------------------------------------------------------------------- batches, NaN

def test_nan_utterance_gets_no_hypothesis_and_others_are_unchanged(files):
    arpa, lexicon = files
    rng = np.random.default_rng(11)
    em = _emissions(rng, 4, 20, 4, sharp=2.0)
    dec = build_decoder(["-", "|", "a", "b"], lexicon, arpa, nbest=2, beam_size=8)
    ref = dec.decode(em)
    bad = em.copy()
    bad[2, 5, 1] = np.nan
    got = dec.decode(bad, np.array([20, 20, 20, 4]))
    assert got[2] == []
    for b in (0, 1):
        assert [h.words for h in got[b]] == [h.words for h in ref[b]]
        assert [h.score for h in got[b]] == [h.score for h in ref[b]]
    # a NaN beyond an utterance's length is ignored
    bad2 = em.copy()
    bad2[3, 10] = np.nan
    assert dec.decode(bad2, np.array([20, 20, 20, 8]))[3]


def test_threads_give_the_same_result(monkeypatch, files):
    arpa, lexicon = files
    rng = np.random.default_rng(12)
    em = _emissions(rng, 9, 60, 4, sharp=2.0)
    lens = rng.integers(1, 61, 9)
    dec = build_decoder(["-", "|", "a", "b"], lexicon, arpa, nbest=3, beam_size=40)
    monkeypatch.setattr(_pool, "num_threads", lambda: 1)
    one = dec.decode(em, lens)
    monkeypatch.setattr(_pool, "num_threads", lambda: 2)
    monkeypatch.setattr("duoloss.core.decoding.ctc_beam._PARALLEL_MIN_CELLS", 0)
    two = dec.decode(em, lens)
    for a, b in zip(one, two):
        assert [(h.words, h.score, h.tokens.tolist(), h.timesteps.tolist()) for h in a] == \
               [(h.words, h.score, h.tokens.tolist(), h.timesteps.tolist()) for h in b]


# ----------------------------------------------------------------------------- frontends

def test_torch_and_jax_give_identical_hypotheses(files):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import duoloss.jax as dj
    import duoloss.torch as dt
    arpa, lexicon = files
    rng = np.random.default_rng(13)
    em = _emissions(rng, 3, 25, 4, sharp=2.0)
    lens = np.array([25, 17, 3])
    with jax.enable_x64(True):
        for kw in (dict(), dict(lexicon=lexicon, lm=arpa, word_score=0.3)):
            dtd = dt.ctc_decoder(["-", "|", "a", "b"], nbest=3, beam_size=12, **kw)
            djd = dj.ctc_decoder(["-", "|", "a", "b"], nbest=3, beam_size=12, **kw)
            a = dtd(torch.from_numpy(em), torch.from_numpy(lens))
            b = djd(jnp.asarray(em), jnp.asarray(lens))
            for ha, hb in zip(a, b):
                assert len(ha) == len(hb) > 0
                for x, y in zip(ha, hb):
                    assert x.tokens.tolist() == np.asarray(y.tokens).tolist()
                    assert x.timesteps.tolist() == np.asarray(y.timesteps).tolist()
                    assert x.words == y.words
                    assert abs(x.score - y.score) <= 1e-12
                    assert x.tokens.dtype == torch.int64
            # the jit path gives the same hypotheses
            tok, ntok, times, scores, words, nw = jax.jit(djd.padded)(jnp.asarray(em),
                                                                        jnp.asarray(lens))
            for bi, hyps in enumerate(b):
                for j, h in enumerate(hyps):
                    n = int(ntok[bi, j])
                    assert np.asarray(tok[bi, j, :n]).tolist() == np.asarray(h.tokens).tolist()
                    assert float(scores[bi, j]) == pytest.approx(h.score, abs=1e-12)
                    assert [djd.words[w] for w in np.asarray(words[bi, j, :int(nw[bi, j])])] == h.words


@pytest.mark.parametrize("call,match", [
    (lambda m: m.ctc_decoder(["-", "|", "a"], blank_token="_"), "blank_token"),
    (lambda m: m.ctc_decoder(["-", "|", "a"], sil_token="<sil>"), "sil_token"),
    (lambda m: m.ctc_decoder(["-", "|", "a"], beam_size=0), "beam_size"),
    (lambda m: m.ctc_decoder(["-", "|", "a"], beam_threshold=float("nan")), "beam_threshold"),
    (lambda m: m.ctc_decoder(["-", "|", "a"], lm="/nonexistent/lm.arpa"), "lm"),
    (lambda m: m.ctc_decoder(["-", "|", "a"], hotwords=["xyz"]), "hotwords"),
])
def test_bad_arguments(call, match):
    import duoloss.torch as dt
    with pytest.raises((ValueError, TypeError), match=rf"ctc_decoder: .*{match}"):
        call(dt)


def test_bad_files(tmp_path):
    import duoloss.torch as dt
    lex = tmp_path / "lex.txt"
    lex.write_text("ab a b |\nxy x y |\n")
    with pytest.raises(ValueError, match=r"lex.txt:2"):
        dt.ctc_decoder(["-", "|", "a", "b"], lexicon=str(lex))
    arpa = tmp_path / "bad.arpa"
    arpa.write_text("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\ta\n\n\\end\\\n")
    with pytest.raises(ValueError, match=r"bad.arpa"):
        dt.ctc_decoder(["-", "|", "a", "b"], lm=str(arpa))


def test_bad_call_arguments():
    torch = pytest.importorskip("torch")
    import duoloss.torch as dt
    dec = dt.ctc_decoder(["-", "|", "a", "b"])
    em = torch.zeros(2, 5, 4)
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'emissions' must have at least C = len\(tokens\) = 4"):
        dec(torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'emissions' must be 3-D"):
        dec(torch.zeros(5, 4))
    with pytest.raises(TypeError, match=r"ctc_decoder: argument 'emissions' must be a float"):
        dec(torch.zeros(2, 5, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'lengths' must be >= 0"):
        dec(em, torch.tensor([5, -1]))
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'lengths' must be <= T = 5"):
        dec(em, torch.tensor([6, 1]))
    with pytest.raises(TypeError, match=r"ctc_decoder: argument 'lengths' must be an integer"):
        dec(em, torch.tensor([5.0, 1.0]))
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj
    jd = dj.ctc_decoder(["-", "|", "a", "b"])
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'emissions' must have at least C"):
        jd(jax.numpy.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match=r"ctc_decoder: argument 'lengths' must be <= T"):
        jd(jax.numpy.zeros((2, 5, 4)), jax.numpy.array([6, 1]))


def test_kenlm_models_through_the_optional_kenlm_package(files):
    """A KenLM model (here KenLM reading the same ARPA file; binaries take the same path)
    decodes as the ARPA path does (KenLM stores float32 scores: 1e-5)."""
    pytest.importorskip("kenlm")
    from duoloss.core.decoding._beam_python import kenlm_model
    arpa, lexicon = files
    rng = np.random.default_rng(21)
    em = _emissions(rng, 3, 25, 4, sharp=2.0)
    ref = build_decoder(["-", "|", "a", "b"], lexicon, arpa, nbest=2, beam_size=10).decode(em)
    ken = kenlm_model(arpa, ["ab", "ba", "a", "<unk>"])
    got = build_decoder(["-", "|", "a", "b"], lexicon, ken, nbest=2, beam_size=10).decode(em)
    for a, b in zip(ref, got):
        assert [h.words for h in a] == [h.words for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
