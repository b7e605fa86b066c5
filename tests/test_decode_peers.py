"""Peer parity of duoloss's CTC beam search (``ctc_decoder``) with flashlight-text and pyctcdecode.

* flashlight-text 0.0.7 (torchaudio's ``ctc_decoder`` backend, KenLM inside), wired as torchaudio
  wires it (``tests/_decode_peers.py``), on 200 synthetic utterances (words over a 28-token
  alphabet, emissions from noisy smoothed alignments):

  - lexicon + 3-gram ARPA LM: at a beam where flashlight's own best hypotheses no longer change
    (beam 100 equals beam 400 on all 200 utterances, checked here), duoloss gives the same best
    word sequence on >= 98% of the utterances (and the same score where they agree); at beam 50
    the two WERs differ by at most 0.2 percentage points;
  - lexicon-free without an LM: the same, on the token sequences;
  - lexicon-free with a 3-gram LM over the tokens: the same best tokens at the same beam
    (the flashlight runner gives the LM the tokens in their order; torchaudio's own wiring does
    not, see ``FlashlightCTCDecoder``).

* pyctcdecode 0.5.0's own hotword example (its ``test_hotwords``: the "bugs bunny" emissions and
  the bigram ARPA file shipped inside the pyctcdecode package): the texts its documentation
  and tests state, for each hotword list, with and without the LM; pyctcdecode itself is run on
  the same emissions where it can (the LM cases need the ``kenlm`` package).

Each peer's tests are skipped when the peer is not installed.
"""
from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest

import _decode_peers as P

torch = pytest.importorskip("torch")
import duoloss.torch as dt  # noqa: E402

needs_flashlight = pytest.mark.skipif(not P.flashlight_available(),
                                      reason="flashlight-text is not installed")

N_UTTS = 200
LM_OPTS = dict(lm_weight=1.0, word_score=0.0, beam_threshold=25.0)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return P.make_task(0, N_UTTS, tmpdir=str(tmp_path_factory.mktemp("decode_peers")),
                       frames_per_token=2.0, noise=0.8, confusion=0.05, peak=6.0,
                       min_words=2, max_words=5)


def _duoloss(task, **kw):
    dec = dt.ctc_decoder(task["tokens"], **kw)
    return dec(torch.from_numpy(task["emissions"]), torch.from_numpy(task["lengths"]))


def _flashlight(task, **kw):
    return P.FlashlightCTCDecoder(task["tokens"], **kw)(task["emissions"], task["lengths"])


def _agreement(fl, du, key):
    same, score_diff = 0, 0.0
    for a, b in zip(fl, du):
        assert len(a) == 1 and len(b) == 1
        if key(a[0]) == key(b[0]):
            same += 1
            score_diff = max(score_diff, abs(a[0]["score"] - b[0].score))
    return same / len(fl), score_diff


def _words(h):
    return list(h["words"] if isinstance(h, dict) else h.words)


def _tokens(h):
    return list(h["tokens"] if isinstance(h, dict) else h.tokens.tolist())


@needs_flashlight
def test_lexicon_lm_search_agrees_with_flashlight(task):
    lex = dict(lexicon=task["lexicon"], lm=task["arpa"], **LM_OPTS)
    # flashlight's own search has converged at beam 100: a 4x wider beam changes nothing
    fl100 = _flashlight(task, beam_size=100, **lex)
    fl400 = _flashlight(task, beam_size=400, **lex)
    assert all(_words(a[0]) == _words(b[0]) and a[0]["score"] == pytest.approx(b[0]["score"])
               for a, b in zip(fl100, fl400))
    du100 = _duoloss(task, beam_size=100, **lex)
    agree, score_diff = _agreement(fl100, du100, _words)
    print(f"\nlexicon + 3-gram LM, beam 100: same best words on {agree:.1%} of {N_UTTS}; "
          f"largest score difference where they agree {score_diff:.2e}")
    assert agree >= 0.98
    assert score_diff < 1e-3  # flashlight accumulates in float32
    # never a word outside the lexicon
    assert {w for h in du100 for w in h[0].words} <= set(task["vocab"])

    fl50 = _flashlight(task, beam_size=50, **lex)
    du50 = _duoloss(task, beam_size=50, **lex)
    wer_fl = P.wer(task["refs"], [_words(h[0]) for h in fl50])
    wer_du = P.wer(task["refs"], [_words(h[0]) for h in du50])
    print(f"beam 50: WER flashlight {wer_fl:.4f}, duoloss {wer_du:.4f}")
    assert abs(wer_fl - wer_du) <= 0.002
    assert wer_du < 0.5  # the task is decodable: the comparison is not between two failures


@needs_flashlight
def test_lexicon_free_search_agrees_with_flashlight(task):
    opts = dict(beam_threshold=10.0)
    fl10 = _flashlight(task, beam_size=10, **opts)
    fl40 = _flashlight(task, beam_size=40, **opts)
    assert all(_tokens(a[0]) == _tokens(b[0]) for a, b in zip(fl10, fl40))
    du10 = _duoloss(task, beam_size=10, **opts)
    agree, score_diff = _agreement(fl10, du10, _tokens)
    print(f"\nlexicon-free, beam 10: same best tokens on {agree:.1%} of {N_UTTS}; "
          f"largest score difference where they agree {score_diff:.2e}")
    assert agree >= 0.98
    assert score_diff < 1e-3
    # and the timesteps torchaudio reports (first frame of each token) where the tokens agree
    same_t = sum(_tokens(a[0]) == _tokens(b[0]) and a[0]["timesteps"] == b[0].timesteps.tolist()
                 for a, b in zip(fl10, du10))
    assert same_t >= 0.98 * N_UTTS


@needs_flashlight
def test_lexicon_free_token_lm_search_agrees_with_flashlight(task, tmp_path):
    # a 3-gram LM over tokens (letters and the word boundary "|"), as a character LM
    rng = np.random.default_rng(1)
    sentences = [list("|".join(s)) for s in P.WordChain(rng, task["vocab"]).sentences(rng, 1500)]
    arpa = P.write_arpa(str(tmp_path / "tokens3.arpa"), sentences, 3)
    opts = dict(lm=arpa, lm_weight=0.5, sil_score=-0.5, beam_threshold=10.0)
    # A token LM keeps many near-equal prefixes alive: flashlight's result still changes between
    # beams 10, 20 and 40 (on 7 and 4 of the 200).  The comparison is at the same beam, where
    # the same search must make the same pruning decisions.
    fl10 = _flashlight(task, beam_size=10, **opts)
    du10 = _duoloss(task, beam_size=10, **opts)
    agree, score_diff = _agreement(fl10, du10, _tokens)
    print(f"\nlexicon-free + token 3-gram LM, beam 10: same best tokens on {agree:.1%} of "
          f"{N_UTTS}; largest score difference where they agree {score_diff:.2e}")
    assert agree >= 0.98
    assert score_diff < 1e-3


# --------------------------------------------------------------------------- pyctcdecode
def _bugs_bunny():
    """pyctcdecode's hotword example: labels, emissions (log-probabilities), its ARPA file.

    Frames 0-5 mix "bugs" + two blanks (0.49) with "bunny" (0.51), frame 6 is the word
    separator, frames 7-12 are "bunny"; the LM (pyctcdecode's bigram sample) prefers
    "bugs bunny"."""
    labels = [" ", "b", "g", "n", "s", "u", "y", ""]
    ix = {c: i for i, c in enumerate(labels)}

    def onehot(chars):
        m = np.zeros((len(chars), len(labels)))
        for t, c in enumerate(chars):
            m[t, ix[c]] = 1.0
        return m

    bugs = onehot(["b", "u", "g", "s", "", ""])
    bunny = onehot(["b", "u", "n", "", "n", "y"])
    probs = np.vstack([bugs * 0.49 + bunny * 0.51, onehot([" "]), bunny])
    logits = np.log(np.clip(probs, 1e-15, 1.0))
    spec = importlib.util.find_spec("pyctcdecode")
    arpa = None
    if spec is not None and spec.origin is not None:
        cand = os.path.join(os.path.dirname(spec.origin), "tests", "sample_data",
                            "bugs_bunny_kenlm.arpa")
        arpa = cand if os.path.exists(cand) else None
    return labels, logits, arpa


#: (hotwords, hotword_weight, with the LM?) -> the text pyctcdecode's test_hotwords states
HOTWORD_CASES = [
    (None, None, True, "bugs bunny"),
    (["bunny"], 20.0, True, "bunny bunny"),
    (["bugs", "bunny"], 20.0, True, "bugs bunny"),
    (["bugs bunny"], 20.0, True, "bugs bunny"),
    (None, None, False, "bunny bunny"),
    (["bugs"], 10.0, False, "bugs bunny"),  # pyctcdecode's default weight is 10
]


@pytest.mark.parametrize("hotwords,weight,with_lm,expected", HOTWORD_CASES)
def test_pyctcdecode_hotword_example(tmp_path, hotwords, weight, with_lm, expected):
    labels, logits, arpa = _bugs_bunny()
    if with_lm and arpa is None:
        pytest.skip("pyctcdecode (whose package ships the example's ARPA file) is not installed")
    # duoloss: blank "" -> "-", word separator " " -> "|"; pyctcdecode's LM terms
    # alpha * ln(10) * log10 p + beta per word (defaults alpha 0.5, beta 1.5) are
    # lm_weight = 0.5 * ln(10) on KenLM's log10 scores and word_score = 1.5.
    tokens = ["|" if c == " " else ("-" if c == "" else c) for c in labels]
    kw = dict(beam_size=100, hotwords=hotwords)
    if weight is not None:
        kw["hotword_weight"] = weight
    if with_lm:
        lexicon = tmp_path / "lexicon.txt"
        lexicon.write_text("bugs b u g s\nbunny b u n n y\n")  # "|" is silence between words
        kw.update(lexicon=str(lexicon), lm=arpa, lm_weight=0.5 * math.log(10), word_score=1.5)
    dec = dt.ctc_decoder(tokens, **kw)
    hyp = dec(torch.from_numpy(logits[None].astype(np.float32)))[0][0]
    assert " ".join(hyp.words if with_lm else
                    "".join(dec.idxs_to_tokens(hyp.tokens)).replace("|", " ").split()) == expected

    if importlib.util.find_spec("pyctcdecode") is None:
        return
    if with_lm and importlib.util.find_spec("kenlm") is None:
        return  # pyctcdecode needs the kenlm package for its LM
    from pyctcdecode import build_ctcdecoder

    peer = build_ctcdecoder(labels, arpa if with_lm else None)
    pkw = {} if hotwords is None else dict(hotwords=hotwords, hotword_weight=weight)
    assert peer.decode(logits, **pkw) == expected
