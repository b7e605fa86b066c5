"""Shared helpers for the decoding peer tests and ``benchmarks/decode.py``.

* a synthetic speech-like task: words over a 28-token alphabet (``-`` blank, ``|`` word
  boundary, ``a``-``z``), sentences from a random word Markov chain (so that an n-gram LM helps),
  and emissions made by smoothing a noisy frame alignment of the sentence's tokens, log-softmaxed;
* an ARPA writer: an n-gram LM estimated from sentences (absolute discounting with Katz backoff
  weights that normalise each context), or the same n-grams with random scores;
* a flashlight-text runner wired as torchaudio's ``ctc_decoder`` wires it (``Dictionary``,
  ``load_words`` + ``create_word_dict``, a ``Trie`` filled with each spelling and the word's
  unigram LM score, ``smear(MAX)``, ``LexiconDecoder``/``LexiconFreeDecoder`` with
  ``CriterionType.CTC``), returning torchaudio's hypothesis fields;
* word error rate by edit distance.

Nothing here calls duoloss: these are the independent side of the comparisons.
"""
from __future__ import annotations

import itertools
import math
import os
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

BLANK = "-"
SIL = "|"
TOKENS = [BLANK, SIL] + [chr(c) for c in range(ord("a"), ord("z") + 1)]  # 28 tokens


# ----------------------------------------------------------------------------- corpus
def make_vocabulary(rng: np.random.Generator, n_words: int, min_len: int = 2,
                    max_len: int = 7) -> List[str]:
    """``n_words`` distinct random words over ``a``-``z`` (letters drawn with a skewed law)."""
    letters = np.array(TOKENS[2:])
    freq = rng.dirichlet(np.full(26, 2.0))
    words: set = set()
    out: List[str] = []
    while len(out) < n_words:
        n = int(rng.integers(min_len, max_len + 1))
        w = "".join(rng.choice(letters, size=n, p=freq))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


class WordChain:
    """A random word Markov chain: each word has a few likely successors (Zipf-like unigrams)."""

    def __init__(self, rng: np.random.Generator, vocab: Sequence[str], fanout: int = 8,
                 stick: float = 0.7):
        self.vocab = list(vocab)
        v = len(self.vocab)
        self.unigram = 1.0 / np.arange(1, v + 1) ** 0.9
        self.unigram /= self.unigram.sum()
        self.next = rng.choice(v, size=(v, fanout), p=self.unigram)
        self.stick = stick

    def sentences(self, rng: np.random.Generator, n: int, min_words: int = 3,
                  max_words: int = 8) -> List[List[str]]:
        out = []
        for _ in range(n):
            k = int(rng.integers(min_words, max_words + 1))
            ids = [int(rng.choice(len(self.vocab), p=self.unigram))]
            while len(ids) < k:
                if rng.random() < self.stick:
                    ids.append(int(self.next[ids[-1], rng.integers(self.next.shape[1])]))
                else:
                    ids.append(int(rng.choice(len(self.vocab), p=self.unigram)))
            out.append([self.vocab[i] for i in ids])
        return out


def write_lexicon(path: str, vocab: Sequence[str], extra_spellings: int = 0,
                  rng: Optional[np.random.Generator] = None) -> str:
    """Flashlight lexicon ``word w o r d |``; ``extra_spellings`` words get a second spelling
    (their last letter doubled)."""
    with open(path, "w") as f:
        for i, w in enumerate(vocab):
            f.write(w + "\t" + " ".join(w) + " |\n")
            if i < extra_spellings:
                f.write(w + "\t" + " ".join(w + w[-1]) + " |\n")
    return path


def sentence_tokens(words: Sequence[str]) -> List[int]:
    """Token ids of a sentence as a lexicon spells it: each word's letters then ``|``."""
    index = {t: i for i, t in enumerate(TOKENS)}
    out = []
    for w in words:
        out.extend(index[c] for c in w)
        out.append(index[SIL])
    return out


# -------------------------------------------------------------------------- emissions
def synth_emissions(rng: np.random.Generator, labels: Sequence[int], T: int, C: int = 28,
                    blank: int = 0, peak: float = 4.0, noise: float = 1.5,
                    smooth: int = 2, confusion: float = 0.15) -> np.ndarray:
    """(T, C) float32 log-probabilities of a noisy CTC-like rendering of ``labels``.

    The labels get random durations (a blank frame between repeats, random blank runs),
    a fraction ``confusion`` of the frames' targets is replaced by a random token, the one-hot
    frame targets times ``peak`` plus Gaussian noise are smoothed over ``smooth`` frames and
    log-softmaxed.  ``T`` must be at least ``len(labels)`` plus the number of repeats.
    """
    L = len(labels)
    need = L + sum(1 for a, b in zip(labels, labels[1:]) if a == b)
    if T < need:
        raise ValueError(f"synth_emissions: T={T} < {need} frames needed")
    # frames per label (>= 1), the rest split into blank runs
    weights = rng.dirichlet(np.full(2 * L + 1, 1.0))
    spare = T - need
    extra = np.floor(weights * spare).astype(int)
    extra[: spare - extra.sum()] += 1
    frames = []
    frames += [blank] * int(extra[0])
    for i, lab in enumerate(labels):
        if i > 0 and labels[i - 1] == lab:
            frames.append(blank)
        frames += [lab] * (1 + int(extra[2 * i + 1]))
        frames += [blank] * int(extra[2 * i + 2])
    target = np.array(frames[:T])
    flip = rng.random(T) < confusion
    target[flip] = rng.integers(0, C, size=int(flip.sum()))
    logits = rng.normal(0.0, noise, size=(T, C))
    logits[np.arange(T), target] += peak
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        logits = np.stack([np.convolve(logits[:, c], kernel, mode="same") for c in range(C)], 1)
    logits -= logits.max(1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return logp.astype(np.float32)


def make_task(seed: int, n_utts: int, n_words: int = 200, order: int = 3, frames_per_token=3.0,
              tmpdir: str = ".", lm_sentences: int = 2000, min_words: int = 3,
              max_words: int = 8, **emission_kw):
    """A whole synthetic task: vocabulary, lexicon file, ARPA file, utterances, emissions.

    Returns a dict with ``tokens``, ``vocab``, ``lexicon`` (path), ``arpa`` (path),
    ``refs`` (list of word lists), ``emissions`` (B, T, C) float32, ``lengths`` (B,) int64.
    """
    rng = np.random.default_rng(seed)
    vocab = make_vocabulary(rng, n_words)
    chain = WordChain(rng, vocab)
    lex = write_lexicon(os.path.join(tmpdir, f"lexicon_{seed}.txt"), vocab)
    arpa = write_arpa(os.path.join(tmpdir, f"lm_{seed}.arpa"),
                      chain.sentences(rng, lm_sentences), order)
    refs = chain.sentences(rng, n_utts, min_words, max_words)
    labels = [sentence_tokens(r) for r in refs]
    lengths = np.array([max(len(lab) * 2 + 2, int(round(len(lab) * frames_per_token)))
                        for lab in labels], dtype=np.int64)
    T = int(lengths.max())
    em = np.full((n_utts, T, len(TOKENS)), np.log(1.0 / len(TOKENS)), dtype=np.float32)
    for b, lab in enumerate(labels):
        em[b, : lengths[b]] = synth_emissions(rng, lab, int(lengths[b]), len(TOKENS),
                                              **emission_kw)
    return dict(tokens=list(TOKENS), vocab=vocab, lexicon=lex, arpa=arpa, refs=refs,
                emissions=em, lengths=lengths)


# ------------------------------------------------------------------------------- ARPA
def _count(sentences: Sequence[Sequence[str]], order: int) -> List[Counter]:
    counts = [Counter() for _ in range(order)]
    for s in sentences:
        padded = ["<s>"] + list(s) + ["</s>"]
        for k in range(1, order + 1):
            for i in range(len(padded) - k + 1):
                g = tuple(padded[i:i + k])
                if k == 1 and g == ("<s>",):
                    continue
                counts[k - 1][g] += 1
    return counts


def estimate_ngrams(sentences: Sequence[Sequence[str]], order: int, discount: float = 0.5,
                    unk_mass: float = 0.01) -> List[Dict[Tuple[str, ...], Tuple[float, float]]]:
    """n-gram tables (word tuples -> (log10 p, log10 backoff)) estimated from sentences.

    Unigrams: relative frequencies with ``unk_mass`` kept for ``<unk>`` (``<s>``: -99).
    Higher orders: absolute discounting, ``p(w|h) = (c(h w) - D) / c(h .)``, and the backoff of
    ``h`` chosen so that ``p(.|h)`` sums to one over the vocabulary (Katz)."""
    counts = _count(sentences, order)
    total = sum(counts[0].values())
    tables: List[Dict[Tuple[str, ...], List[float]]] = [dict() for _ in range(order)]
    for (w,), c in counts[0].items():
        tables[0][(w,)] = [math.log10((1 - unk_mass) * c / total), 0.0]
    tables[0][("<s>",)] = [-99.0, 0.0]
    tables[0][("<unk>",)] = [math.log10(unk_mass), 0.0]

    def lower_prob(hist: Tuple[str, ...], w: str, k: int) -> float:
        """p(w | hist) (linear) from the tables of orders < k, hist of length <= k - 2."""
        bo = 0.0
        for n in range(len(hist), -1, -1):
            h = hist[len(hist) - n:]
            e = tables[n].get(h + (w,))
            if e is not None:
                return 10.0 ** (bo + e[0])
            if n > 0:
                he = tables[n - 1].get(h)
                if he is not None:
                    bo += he[1]
        return 10.0 ** (bo + tables[0][("<unk>",)][0])

    for k in range(2, order + 1):
        by_hist: Dict[Tuple[str, ...], List[Tuple[str, int]]] = defaultdict(list)
        for g, c in counts[k - 1].items():
            by_hist[g[:-1]].append((g[-1], c))
        for h, succ in by_hist.items():
            ch = sum(c for _, c in succ)
            used = 0.0
            lower = 0.0
            for w, c in succ:
                p = (c - discount) / ch
                tables[k - 1][h + (w,)] = [math.log10(p), 0.0]
                used += p
                lower += lower_prob(h[1:], w, k)
            left = max(1.0 - used, 1e-12)
            rest = max(1.0 - lower, 1e-6)
            tables[k - 2][h][1] = math.log10(left / rest)
    return [{g: (v[0], v[1]) for g, v in t.items()} for t in tables]


def random_scores(tables, rng: np.random.Generator):
    """The same n-grams with random log10 probabilities in [-3, -0.01] and backoffs in
    [-1.5, 0.5] (no backoff on the highest order): not a normalised model, but a valid file."""
    order = len(tables)
    out = []
    for k, t in enumerate(tables):
        new = {}
        for g in t:
            p = float(rng.uniform(-3.0, -0.01)) if g != ("<s>",) else -99.0
            bo = float(rng.uniform(-1.5, 0.5)) if k < order - 1 else 0.0
            new[g] = (p, bo)
        out.append(new)
    return out


def write_arpa_tables(path: str, tables, sep: str = "\t") -> str:
    """Write n-gram tables (word tuples -> (log10 p, log10 backoff)) as an ARPA file."""
    order = len(tables)
    with open(path, "w") as f:
        f.write("\\data\\\n")
        for k, t in enumerate(tables):
            f.write(f"ngram {k + 1}={len(t)}\n")
        for k, t in enumerate(tables):
            f.write(f"\n\\{k + 1}-grams:\n")
            for g, (p, bo) in t.items():
                line = f"{p:.6f}{sep}{' '.join(g)}"
                if k < order - 1:
                    line += f"{sep}{bo:.6f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")
    return path


def write_arpa(path: str, sentences: Sequence[Sequence[str]], order: int, **kw) -> str:
    """Estimate an ``order``-gram LM from ``sentences`` and write it as ARPA (tab-separated)."""
    return write_arpa_tables(path, estimate_ngrams(sentences, order, **kw))


# ------------------------------------------------------------------------- flashlight
def flashlight_available() -> bool:
    try:
        import flashlight.lib.text.decoder  # noqa: F401
    except ImportError:
        return False
    return True


class FlashlightCTCDecoder:
    """flashlight-text's CTC decoders wired as torchaudio's ``ctc_decoder`` wires them.

    ``__call__(emissions (B, T, C) float32, lengths (B,))`` returns per utterance a list of
    dicts with torchaudio's ``CTCHypothesis`` fields: ``tokens`` (repeats merged, blanks
    dropped), ``words``, ``score`` and ``timesteps``.
    """

    def __init__(self, tokens: Sequence[str], lexicon: Optional[str] = None,
                 lm: Optional[str] = None, nbest: int = 1, beam_size: int = 50,
                 beam_size_token: Optional[int] = None, beam_threshold: float = 50.0,
                 lm_weight: float = 2.0, word_score: float = 0.0,
                 unk_score: float = float("-inf"), sil_score: float = 0.0,
                 log_add: bool = False, blank_token: str = BLANK, sil_token: str = SIL,
                 unk_word: str = "<unk>"):
        from flashlight.lib.text.decoder import (CriterionType, LexiconDecoder,
                                                 LexiconDecoderOptions, LexiconFreeDecoder,
                                                 LexiconFreeDecoderOptions, SmearingMode, Trie,
                                                 ZeroLM)
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary, create_word_dict, load_words

        self.tokens_dict = Dictionary(list(tokens))
        self.blank = self.tokens_dict.get_index(blank_token)
        sil = self.tokens_dict.get_index(sil_token)
        self.nbest = nbest
        n_tok = self.tokens_dict.index_size()
        bst = beam_size_token if beam_size_token is not None else n_tok
        if lexicon is not None:
            words = load_words(lexicon)
            self.word_dict = create_word_dict(words)
            unk = self.word_dict.get_index(unk_word)
            self.lm = KenLM(lm, self.word_dict) if lm is not None else ZeroLM()
            trie = Trie(n_tok, sil)
            start = self.lm.start(False)
            for word, spellings in words.items():
                wid = self.word_dict.get_index(word)
                _, score = self.lm.score(start, wid)
                for spelling in spellings:
                    trie.insert([self.tokens_dict.get_index(t) for t in spelling], wid, score)
            trie.smear(SmearingMode.MAX)
            opts = LexiconDecoderOptions(beam_size, bst, beam_threshold, lm_weight, word_score,
                                         unk_score, sil_score, log_add, CriterionType.CTC)
            self.trie = trie  # keep alive
            self.decoder = LexiconDecoder(opts, trie, self.lm, sil, self.blank, unk, [], False)
        else:
            # The LM's unit i must be token i.  torchaudio builds this dictionary with
            # create_word_dict({token: [[token]]}), whose order is a hash map's, not the tokens'
            # (fairseq#5109 fixed the same mismatch in fairseq): its LM then scores other tokens.
            # Here the dictionary follows the tokens, the semantics duoloss implements.
            self.word_dict = Dictionary(list(tokens) + [unk_word])
            self.lm = KenLM(lm, self.word_dict) if lm is not None else ZeroLM()
            opts = LexiconFreeDecoderOptions(beam_size, bst, beam_threshold, lm_weight, sil_score,
                                             log_add, CriterionType.CTC)
            self.decoder = LexiconFreeDecoder(opts, self.lm, sil, self.blank, [])

    def _tokens(self, idxs):
        idxs = [g for g, _ in itertools.groupby(idxs)]
        return [i for i in idxs if i != self.blank]

    def _timesteps(self, idxs):
        out = []
        for i, idx in enumerate(idxs):
            if idx == self.blank:
                continue
            if i == 0 or idx != idxs[i - 1]:
                out.append(i)
        return out

    def __call__(self, emissions: np.ndarray, lengths: Sequence[int]):
        em = np.ascontiguousarray(emissions, dtype=np.float32)
        B, _, C = em.shape
        out = []
        for b in range(B):
            row = np.ascontiguousarray(em[b])
            results = self.decoder.decode(row.ctypes.data, int(lengths[b]), C)
            hyps = []
            for r in results[: self.nbest]:
                toks = list(r.tokens)
                hyps.append(dict(tokens=self._tokens(toks),
                                 words=[self.word_dict.get_entry(x) for x in r.words if x >= 0],
                                 score=float(r.score), timesteps=self._timesteps(toks)))
            out.append(hyps)
        return out


# -------------------------------------------------------------------------------- WER
def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def wer(refs: Sequence[Sequence[str]], hyps: Sequence[Sequence[str]]) -> float:
    """Corpus word error rate: total edit distance over total reference words."""
    errors = sum(edit_distance(r, h) for r, h in zip(refs, hyps))
    return errors / max(1, sum(len(r) for r in refs))
