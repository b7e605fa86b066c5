"""CTC prefix beam search with a lexicon, an n-gram LM and hotwords (framework-free).

The search is flashlight-text's ``LexiconDecoder`` / ``LexiconFreeDecoder`` (the backend of
torchaudio's ``ctc_decoder``), run by one numba kernel over plain arrays
(``duoloss.core.decoding._beam_kernel``).  Per frame every hypothesis proposes
candidates; candidates in the same state -- the same history (word sequence with a
lexicon, token sequence without), the same lexicon-trie node, the same last token and
whether the last frame was blank -- are merged (max, or log-add with ``log_add=True``),
candidates more than ``beam_threshold`` below the best are dropped and the ``beam_size``
best are kept.  A hypothesis's score is

.. math::

    \\text{acoustic} + \\text{lm\\_weight} \\cdot \\log_{10} P_\\text{LM}
    + \\text{word\\_score} \\cdot \\#\\text{words} + \\text{unk\\_score} \\cdot \\#\\text{unk}
    + \\text{sil\\_score} \\cdot \\#\\text{silence frames} + \\text{hotword bonus}

with the acoustic score the sum of the emissions along the best alignment of the
hypothesis (or summed over the merged alignments with ``log_add``).  With a lexicon the LM
score of a word is felt while it is spelled: each trie node carries the best LM score (after
``<s>``) of the words below it (flashlight's ``SmearingMode.MAX``), and a word's LM score
replaces that look-ahead when the word ends.

The framework frontends (``duoloss.torch.ctc_decoder``, ``duoloss.jax.ctc_decoder``) wrap
[`CTCDecoder`][duoloss.core.decoding.CTCDecoder]; this module never imports torch or jax.
"""
from __future__ import annotations

import math
import os
from typing import (Any, Dict, List, NamedTuple, Optional, Sequence, Tuple)

import numpy as np

from .._pool import run_batch
from . import _beam_kernel as _k
from .arpa import ArpaLM, read_arpa
from .lexicon import read_lexicon
from ._text import fields as _fields, lines as _lines

__all__ = ["CTCDecoder", "CTCDecoderLM", "CTCDecoderLMState", "CTCHypothesis", "DecoderFrontend",
           "build_decoder", "check_emissions", "check_lengths", "compile_lm"]

_FN = "ctc_decoder"
_PARALLEL_MIN_CELLS = 20_000     # frames x beam below which one thread decodes the batch


class CTCHypothesis(NamedTuple):
    """One hypothesis of the CTC beam search (torchaudio's ``CTCHypothesis`` fields).

    Attributes:
        tokens: ``(L,)`` token ids: repeats merged, blanks removed, silence kept; as
            torchaudio reports them they start and end with the silence token (the search
            starts and ends in silence).
        words: the words, with a lexicon (``unk_word`` for an unknown word); ``[]`` without.
        score: the hypothesis's total score (see the module docstring).
        timesteps: ``(L,)`` the frame of each token, counted as torchaudio counts them:
            frame ``t`` of the emissions is timestep ``t + 1``; the start silence is
            timestep 0 and an end silence that no frame emitted is ``T + 1``.
    """

    tokens: Any
    words: List[str]
    score: float
    timesteps: Any


class CTCDecoderLMState:
    """A state of a user language model (torchaudio's ``CTCDecoderLMState``).

    States form a tree: ``child(i)`` returns (creating it once) the state reached by unit
    ``i``, so that two hypotheses with the same history hold the same state object.

    Examples:
        >>> from duoloss.torch import CTCDecoderLMState
        >>> root = CTCDecoderLMState()
        >>> root.child(3) is root.child(3), root.child(3) is root.child(4)
        (True, False)
    """

    def __init__(self) -> None:
        self.children: Dict[int, CTCDecoderLMState] = {}

    def child(self, usr_index: int) -> "CTCDecoderLMState":
        """The child state for unit ``usr_index`` (created on first use)."""
        s = self.children.get(usr_index)
        if s is None:
            s = type(self)()
            self.children[usr_index] = s
        return s


class CTCDecoderLM:
    """A language model written in Python (torchaudio's ``CTCDecoderLM`` protocol).

    Subclass it and implement ``start``, ``score`` and ``finish``; scores are added to the
    hypothesis times ``lm_weight`` (like KenLM's log10 scores).  With a lexicon the units
    are word ids (the lexicon's words in file order, then ``unk_word``; with ``lm_dict``,
    their lines in that file); without, token ids.
    A Python LM runs the search in Python (slower than the compiled n-gram path); ``score``
    is called once per history and unit, ``finish`` once per history that reaches the end.
    States may be any Python objects (``CTCDecoderLMState`` offers torchaudio's ``child``).

    Examples:
        A "language model" that charges log10 score -1 per token, whatever the history; with
        ``lm_weight=0.5`` the one-token hypothesis pays 0.5:

        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> class TokenPenalty(dt.CTCDecoderLM):
        ...     def start(self, start_with_nothing): return ()
        ...     def score(self, state, usr_token_idx): return state + (usr_token_idx,), -1.0
        ...     def finish(self, state): return state, 0.0
        >>> decoder = dt.ctc_decoder(["-", "|", "a"], lm=TokenPenalty(), lm_weight=0.5)
        >>> hyp = decoder(torch.tensor([[[.2, .1, .7]]]).log())[0][0]
        >>> decoder.idxs_to_tokens(hyp.tokens), round(hyp.score - math.log(.7), 6)
        (['|', 'a', '|'], -0.5)
    """

    def __init__(self) -> None:
        pass

    def start(self, start_with_nothing: bool) -> Any:
        """The state at the start of an utterance (any object)."""
        raise NotImplementedError

    def score(self, state: Any, usr_token_idx: int) -> Tuple[Any, float]:
        """(the state after unit ``usr_token_idx``, its score)."""
        raise NotImplementedError

    def finish(self, state: Any) -> Tuple[Any, float]:
        """(the final state, the end-of-sentence score)."""
        raise NotImplementedError


# --------------------------------------------------------------------------- the n-gram LM

class _LMTables(NamedTuple):
    keys: np.ndarray      # int64 state * n_words + word, -1 empty
    probs: np.ndarray     # float64 log10 p
    nexts: np.ndarray     # int32 next state
    bo: np.ndarray        # float64 backoff of each state
    parent: np.ndarray    # int32 backoff state of each state
    n_words: int
    start: int            # state of (<s>,)
    eos: int
    unk: int
    word_index: Dict[str, int]


def compile_lm(lm: ArpaLM) -> _LMTables:
    """Flat numba tables of an ``ArpaLM``: a hash table ``(state, word) -> (log10 p, next
    state)`` over the model's n-grams, and each state's backoff weight and backoff state.

    States are the model's contexts (n-grams of at most ``order - 1`` words, their suffixes,
    and the histories of its n-grams); state 0 is the empty context.  ``lm_score`` on these
    tables equals ``ArpaLM.score`` (tested to 1e-6).
    """
    order = lm.order
    ngrams = lm.ngrams
    states: Dict[Tuple[int, ...], int] = {(): 0}

    def state(ctx: Tuple[int, ...]) -> int:
        s = states.get(ctx)
        if s is None:
            for m in range(len(ctx) - 1, -1, -1):      # suffixes first: parents exist
                suf = ctx[len(ctx) - m:]
                if suf not in states:
                    states[suf] = len(states)
            s = states[ctx] = len(states)
        return s

    n_max = order - 1

    def next_state(full: Tuple[int, ...]) -> int:
        if len(full) <= n_max:     # an n-gram short enough to be a context itself
            return state(full)
        for m in range(min(len(full), n_max), 0, -1):
            suf = full[len(full) - m:]
            if suf in ngrams[m - 1]:
                return state(suf)
        return 0

    entries: List[Tuple[int, int, float, int]] = []
    for k in range(order):
        for gram, (logp, _bo) in ngrams[k].items():
            hist = gram[:-1]
            entries.append((state(hist), gram[-1], logp, next_state(gram)))
    n_states = len(states)
    bo = np.zeros(n_states)
    parent = np.zeros(n_states, np.int32)
    for ctx, s in states.items():
        if ctx:
            parent[s] = states[ctx[1:]]
            g = ngrams[len(ctx) - 1].get(ctx) if len(ctx) <= order else None
            bo[s] = g[1] if g is not None else 0.0
    n_words = len(lm.words)
    size = 1
    while size < 2 * len(entries) + 2:
        size *= 2
    keys = np.full(size, -1, np.int64)
    probs = np.zeros(size)
    nexts = np.zeros(size, np.int32)
    ent_s = np.array([e[0] for e in entries], np.int64)
    ent_w = np.array([e[1] for e in entries], np.int64)
    _k.lm_fill(keys, probs, nexts, ent_s * n_words + ent_w,
               np.array([e[2] for e in entries], np.float64),
               np.array([e[3] for e in entries], np.int32))
    start = states.get((lm.bos,), 0) if order > 1 else 0
    return _LMTables(keys, probs, nexts, bo, parent, n_words, start, lm.eos, lm.unk,
                     dict(lm.word_index))


def _no_lm_tables() -> _LMTables:
    return _LMTables(np.full(2, -1, np.int64), np.zeros(2), np.zeros(2, np.int32), np.zeros(1),
                     np.zeros(1, np.int32), 1, 0, 0, 0, {})


# --------------------------------------------------------------------------- tries

def _trie_log_add(a: float, b: float) -> float:
    # flashlight's TrieLogAdd (natural-log add, even of log10 scores)
    if a < b:
        a, b = b, a
    d = b - a
    return a if d < -39.14 else a + math.log1p(math.exp(d))


def _build_lexicon_trie(entries: List[Tuple[str, List[List[int]]]], word_scores: List[float]):
    """CSR arrays of the lexicon trie; node 0 is the root.  ``word_scores[i]`` is word i's
    LM score after ``<s>`` (0 without an LM), smeared up the trie by max like flashlight."""
    children: List[Dict[int, int]] = [{}]
    labels: List[List[int]] = [[]]
    for wid, (_word, spellings) in enumerate(entries):
        for sp in spellings:
            node = 0
            for tok in sp:
                nxt = children[node].get(tok)
                if nxt is None:
                    nxt = len(children)
                    children[node][tok] = nxt
                    children.append({})
                    labels.append([])
                node = nxt
            if wid not in labels[node]:   # all of them (flashlight keeps 6: kTrieMaxLabel)
                labels[node].append(wid)
    n = len(children)
    smear = np.zeros(n, np.float32)
    # children have larger ids than their parent: smear from the leaves up
    for v in range(n - 1, -1, -1):
        m = np.float32(-np.inf)
        for w in labels[v]:
            m = np.float32(_trie_log_add(float(m), float(np.float32(word_scores[w]))))
        for c in children[v].values():
            if smear[c] > m:
                m = smear[c]
        smear[v] = m
    ch_start = np.zeros(n + 1, np.int64)
    lab_start = np.zeros(n + 1, np.int64)
    for v in range(n):
        ch_start[v + 1] = ch_start[v] + len(children[v])
        lab_start[v + 1] = lab_start[v] + len(labels[v])
    ch_token = np.array([t for v in range(n) for t in sorted(children[v])], np.int64)
    ch_node = np.array([children[v][t] for v in range(n) for t in sorted(children[v])], np.int64)
    lab_word = np.array([w for v in range(n) for w in labels[v]], np.int64)
    max_lab = max((len(x) for x in labels), default=0)
    return ch_start, ch_token, ch_node, lab_start, lab_word, smear, max_lab


def _build_hotword_automaton(phrases: List[Tuple[List[List[int]], float, int]], n_units: int):
    """Aho-Corasick automaton over unit sequences: ``(col, goto, credit, out)``.

    Every spelling of a phrase of weight ``w`` and ``n`` units after its ``lead`` leading
    boundary units is a path of the trie.  ``out[s]`` is the total weight of the phrases
    that end at state ``s``: its own and, through the failure links (the output links),
    every phrase that is a suffix of it, so that a phrase completed inside an unfinished
    longer one earns its weight.  ``credit[s]`` is the partial bonus of an unfinished
    phrase: ``w * m / n`` after ``m`` of its ``n`` units (the largest over the phrases
    that ``s`` is a proper prefix of); it is taken back when the match is abandoned.
    ``goto[s, col[u]]`` is the transition on unit ``u`` (column 0: any unit no phrase
    uses)."""
    children: List[Dict[int, int]] = [{}]
    credit = [0.0]
    own = [0.0]
    for spellings, weight, lead in phrases:
        for units in spellings:
            n = len(units) - lead
            if n <= 0:
                continue
            node = 0
            for i, u in enumerate(units):
                nxt = children[node].get(u)
                if nxt is None:
                    nxt = len(children)
                    children[node][u] = nxt
                    children.append({})
                    credit.append(0.0)
                    own.append(0.0)
                node = nxt
                m = i + 1 - lead           # leading boundary units earn nothing
                if 0 < m < n:
                    credit[node] = max(credit[node], weight * m / n)
            own[node] = max(own[node], weight)
    n_states = len(children)
    fail = [0] * n_states
    out = np.array(own, np.float64)
    queue = [0]
    head = 0
    while head < len(queue):          # breadth first: a state's failure target comes first
        v = queue[head]
        head += 1
        for u, c in children[v].items():
            if v != 0:
                f = fail[v]
                while f != 0 and u not in children[f]:
                    f = fail[f]
                fail[c] = children[f].get(u, 0)
            out[c] += out[fail[c]]
            queue.append(c)
    used = sorted({u for ch in children for u in ch})
    col = np.zeros(n_units, np.int64)
    for i, u in enumerate(used):
        col[u] = i + 1
    if n_states * (len(used) + 1) > (1 << 26):
        raise ValueError(f"{_FN}: argument 'hotwords': the hotwords make an automaton of "
                         f"{n_states} states over {len(used)} units, too large for its table "
                         f"(at most {1 << 26} entries); use fewer or shorter hotwords")
    goto = np.zeros((n_states, len(used) + 1), np.int32)
    for v in queue:
        if v:
            goto[v] = goto[fail[v]]
        for u, c in children[v].items():
            goto[v, col[u]] = c
    return col, goto, np.array(credit, np.float64), out


# --------------------------------------------------------------------------- the decoder

class CTCDecoder:
    """A CTC beam-search decoder (build it with ``ctc_decoder`` of a frontend, or
    [`build_decoder`][duoloss.core.decoding.build_decoder]).

    Calling ``decode(emissions, lengths)`` with a ``(B, T, C)`` float array of log
    probabilities (or any per-frame scores) and ``(B,)`` lengths returns, per utterance,
    up to ``nbest`` [`CTCHypothesis`][duoloss.core.decoding.CTCHypothesis] (numpy arrays),
    best first; an utterance with a NaN among its first ``length`` frames gets ``[]``.
    """

    def __init__(self, *, tokens: List[str], token_index: Dict[str, int], blank: int, sil: int,
                 words: List[str], unk_word: str, nbest: int, beam_size: int,
                 beam_size_token: int, beam_threshold: float, lm_weight: float,
                 word_score: float, unk_score: float, sil_score: float, log_add: bool,
                 lexicon: Optional[List[Tuple[str, List[List[int]]]]],
                 lm_tables: Optional[_LMTables], py_lm: Optional[CTCDecoderLM],
                 hotwords: List[Tuple[List[List[int]], float, int]],
                 lm_units: Optional[Tuple[List[str], np.ndarray]] = None):
        self.tokens = tokens
        self.token_index = token_index
        self.blank = blank
        self.sil = sil
        self.words = words
        self.unk_word = unk_word
        self.nbest = nbest
        self.beam_size = beam_size
        self.beam_size_token = beam_size_token
        self.beam_threshold = beam_threshold
        self.lm_weight = lm_weight
        self.word_score = word_score
        self.unk_score = unk_score
        self.sil_score = sil_score
        self.log_add = log_add
        self.lexicon = lexicon
        self.py_lm = py_lm
        n_cls = len(tokens)
        tables = lm_tables if lm_tables is not None else _no_lm_tables()
        self._lm = tables
        has_lm = lm_tables is not None
        # the search's units (lexicon words then unk_word, or tokens) as the LM knows them:
        # by name for an ARPA LM, by index for a Python LM (see build_decoder's lm_dict)
        units = words if lexicon is not None else tokens
        if lm_units is None:
            lm_names, self._py_units = list(units), np.arange(len(units), dtype=np.int64)
        else:
            lm_names, self._py_units = lm_units
        if lexicon is not None:
            unit_lm = np.array([tables.word_index.get(w, tables.unk) for w in lm_names]
                               if has_lm else np.zeros(len(words)), np.int64)
            if has_lm and lm_names[-1] not in tables.word_index:
                unit_lm[len(words) - 1] = tables.unk
            word_scores = [0.0] * len(lexicon)
            if has_lm:
                p = np.empty(len(lexicon))
                s = np.empty(len(lexicon), np.int32)
                _k.lm_score_many(tables.keys, tables.probs, tables.nexts, tables.keys.shape[0] - 1,
                                 tables.n_words, tables.bo, tables.parent,
                                 np.full(len(lexicon), tables.start, np.int64),
                                 unit_lm[:len(lexicon)].copy(), p, s)
                word_scores = [float(x) for x in p]
            elif py_lm is not None:
                from ._beam_python import lm_word_scores
                word_scores = lm_word_scores(py_lm, self._py_units[:len(lexicon)])
            self._trie = _build_lexicon_trie(lexicon, word_scores)
            self._unk_unit = len(words) - 1
        else:
            unit_lm = np.array([tables.word_index.get(t, tables.unk) for t in lm_names]
                               if has_lm else np.zeros(n_cls), np.int64)
            z = np.zeros(2, np.int64)
            self._trie = (z, np.zeros(0, np.int64), np.zeros(0, np.int64), z.copy(),
                          np.zeros(0, np.int64), np.zeros(1, np.float32), 0)
            self._unk_unit = 0
        self._unit_lm = unit_lm
        self._has_lm = has_lm
        self._hw_init = 0
        if hotwords:
            # units: words with a lexicon, tokens without (phrases framed by silences)
            n_units = len(words) if lexicon is not None else n_cls
            self._hw = _build_hotword_automaton(hotwords, n_units)
            if lexicon is None:       # the search starts in silence
                self._hw_init = int(self._hw[1][0, self._hw[0][sil]])
        else:
            self._hw = (np.zeros(max(n_cls, len(words)), np.int64), np.zeros((1, 1), np.int32),
                        np.zeros(1), np.zeros(1))
        self._has_hw = bool(hotwords)

    # ---------------------------------------------------------------- decoding
    def decode(self, emissions: np.ndarray, lengths: Optional[np.ndarray] = None
               ) -> List[List[CTCHypothesis]]:
        """Decode a batch (arguments already validated by the frontend).

        Args:
            emissions: ``(B, T, C)`` float array (float32 and float64 are read as they are,
                other floats as float32; the scores add up in float64).
            lengths: ``(B,)`` integer lengths in ``[0, T]``, or None for ``T``.

        Returns:
            Per utterance, up to ``nbest`` hypotheses, best first (``[]`` for an utterance
            with NaN emissions).
        """
        em = np.asarray(emissions)
        if em.dtype != np.float32 and em.dtype != np.float64:
            em = em.astype(np.float32)
        em = np.ascontiguousarray(em)      # float32 stays float32: no float64 copy of a batch
        # classes past the tokens (a padded vocabulary) are never emitted, as in torchaudio
        n_tok = len(self.tokens)
        B, T, C = em.shape
        if lengths is None:
            lens = np.full(B, T, np.int64)
        else:
            lens = np.ascontiguousarray(lengths, dtype=np.int64).reshape(B)
        nan = np.zeros(B, np.bool_)
        for b in range(B):
            if lens[b] > 0 and np.isnan(em[b, :lens[b], :n_tok]).any():
                nan[b] = True
        todo = np.flatnonzero(~nan).astype(np.int64)
        if self.py_lm is not None:
            from ._beam_python import decode_python
            raw = decode_python(self, em, lens, todo)
        else:
            raw = self._decode_numba(em, lens, todo)
        out: List[List[CTCHypothesis]] = []
        for b in range(B):
            out.append([] if nan[b] else raw[b])
        return out

    def _params(self):
        pf = np.array([self.lm_weight, self.word_score, self.unk_score, self.sil_score,
                       self.beam_threshold], np.float64)
        tables = self._lm
        # a beam past what any search can hold is no limit (and must fit an int64)
        pi = np.array([min(self.beam_size, 1 << 62), self.beam_size_token, self.blank, self.sil,
                       self._unk_unit, self.lexicon is not None, self.log_add, self._has_lm,
                       self.nbest, self._trie[6], tables.eos, tables.start, self._has_hw,
                       tables.n_words, self._hw_init, len(self.tokens)], np.int64)
        return pf, pi

    def _decode_numba(self, em, lens, todo):
        B, T, _ = em.shape
        pf, pi = self._params()
        nb = self.nbest
        out_n = np.zeros(B, np.int64)
        out_score = np.zeros((B, nb))
        out_path = np.zeros((B, nb, T + 2), np.int32)
        out_words = np.zeros((B, nb, T + 1), np.int32)
        out_nwords = np.zeros((B, nb), np.int64)
        tables = self._lm
        ch_start, ch_token, ch_node, lab_start, lab_word, smear, _ = self._trie
        hw = self._hw
        if todo.shape[0] > 1:
            order = todo[np.argsort(-lens[todo], kind="stable")]
        else:
            order = todo
        cells = int(lens[todo].sum()) * self.beam_size
        args = (em, lens, pf, pi, ch_start, ch_token, ch_node, lab_start, lab_word, smear,
                self._unit_lm, tables.keys, tables.probs, tables.nexts, tables.bo, tables.parent,
                hw[0], hw[1], hw[2], hw[3],
                out_n, out_score, out_path, out_words, out_nwords)
        run_batch(_k.decode_batch, order, cells, _PARALLEL_MIN_CELLS, args)
        res: Dict[int, List[CTCHypothesis]] = {}
        for b in todo:
            hyps = []
            for j in range(int(out_n[b])):
                path = out_path[b, j, :lens[b] + 2]
                words = ([self.words[w] for w in out_words[b, j, :out_nwords[b, j]]]
                         if self.lexicon is not None else [])
                hyps.append(self._hypothesis(path, words, float(out_score[b, j])))
            res[int(b)] = hyps
        return res

    def _hypothesis(self, path: np.ndarray, words: List[str], score: float) -> CTCHypothesis:
        # torchaudio's _get_tokens / _get_timesteps on flashlight's per-frame tokens
        new = np.ones(path.shape[0], np.bool_)
        new[1:] = path[1:] != path[:-1]
        keep = new & (path != self.blank)
        timesteps = np.flatnonzero(keep).astype(np.int32)
        return CTCHypothesis(tokens=path[keep].astype(np.int64), words=words, score=score,
                             timesteps=timesteps)

    def decode_padded(self, emissions: np.ndarray, lengths: Optional[np.ndarray] = None
                      ) -> Tuple[np.ndarray, ...]:
        """``decode`` as fixed-shape arrays (for ``jax.pure_callback``).

        Returns:
            ``(tokens, n_tokens, timesteps, scores, words, n_words)``: ``(B, nbest, T + 2)``
            int32 token ids padded with -1, ``(B, nbest)`` int32 counts, ``(B, nbest, T + 2)``
            int32 timesteps padded with -1, ``(B, nbest)`` float64 scores (``-inf`` where an
            utterance has fewer hypotheses), ``(B, nbest, T + 1)`` int32 word ids (indices into
            ``words``) padded with -1 and ``(B, nbest)`` int32 counts.
        """
        em = np.asarray(emissions)
        B, T = em.shape[0], em.shape[1]
        nb = self.nbest
        tokens = np.full((B, nb, T + 2), -1, np.int32)
        times = np.full((B, nb, T + 2), -1, np.int32)
        n_tok = np.zeros((B, nb), np.int32)
        scores = np.full((B, nb), -np.inf)
        words = np.full((B, nb, T + 1), -1, np.int32)
        n_words = np.zeros((B, nb), np.int32)
        index = {w: i for i, w in enumerate(self.words)}
        for b, hyps in enumerate(self.decode(em, lengths)):
            for j, h in enumerate(hyps):
                n = h.tokens.shape[0]
                tokens[b, j, :n] = h.tokens
                times[b, j, :n] = h.timesteps
                n_tok[b, j] = n
                scores[b, j] = h.score
                words[b, j, :len(h.words)] = [index[w] for w in h.words]
                n_words[b, j] = len(h.words)
        return tokens, n_tok, times, scores, words, n_words

    def idxs_to_tokens(self, idxs: Sequence[int]) -> List[str]:
        """The token strings of token ids."""
        return [self.tokens[int(i)] for i in idxs]


class DecoderFrontend:
    """What the torch and JAX ``CTCDecoder`` share (framework-free): the core decoder, its
    tokens and words, token lookup and the conversion of hypotheses."""

    def __init__(self, core: CTCDecoder) -> None:
        self.core = core

    @property
    def tokens(self) -> List[str]:
        """The tokens, id -> token."""
        return self.core.tokens

    @property
    def words(self) -> List[str]:
        """The lexicon's words, id -> word (then ``unk_word``); ``[]`` without a lexicon."""
        return self.core.words

    def idxs_to_tokens(self, idxs: Any) -> List[str]:
        """Map token ids to their tokens (torchaudio's ``idxs_to_tokens``)."""
        flat = np.asarray(idxs.tolist() if hasattr(idxs, "tolist") else list(idxs)).reshape(-1)
        return self.core.idxs_to_tokens(flat.tolist())

    def _decode(self, em: np.ndarray, lens: Optional[np.ndarray], tokens_as: Any,
                times_as: Any) -> List[List[CTCHypothesis]]:
        """The core's hypotheses with ``tokens`` and ``timesteps`` converted."""
        return [[CTCHypothesis(tokens=tokens_as(h.tokens), words=h.words, score=h.score,
                               timesteps=times_as(h.timesteps)) for h in hyps]
                for hyps in self.core.decode(em, lens)]


# --------------------------------------------------------------------------- call checks

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def check_emissions(shape: Tuple[int, ...], dtype: str, n_tokens: int) -> None:
    """The decoder's ``emissions`` argument: a ``(B, T, C)`` float array with
    ``C >= len(tokens)`` (classes past the tokens are never emitted, as in torchaudio)."""
    if dtype not in _FLOATS:
        raise TypeError(f"{_FN}: argument 'emissions' must be a float array (float16, bfloat16, "
                        f"float32 or float64), got {dtype}")
    if len(shape) != 3:
        raise ValueError(f"{_FN}: argument 'emissions' must be 3-D (B, T, C), got shape "
                         f"{tuple(shape)}")
    if shape[2] < n_tokens:
        raise ValueError(f"{_FN}: argument 'emissions' must have at least C = len(tokens) = "
                         f"{n_tokens} classes in its last dimension (more are allowed: the "
                         f"classes past the tokens are never emitted), got shape {tuple(shape)}")


def check_lengths(lengths: Optional[np.ndarray], dtype: Optional[str], batch: int, frames: int
                  ) -> Optional[np.ndarray]:
    """The decoder's ``lengths`` argument: None or ``(B,)`` integers in ``[0, T]``."""
    if lengths is None:
        return None
    if dtype not in _INTS:
        raise TypeError(f"{_FN}: argument 'lengths' must be an integer array, got {dtype}")
    lens = np.asarray(lengths)
    if lens.shape != (batch,):
        raise ValueError(f"{_FN}: argument 'lengths' must have shape ({batch},) (one length per "
                         f"utterance), got {tuple(lens.shape)}")
    lens = lens.astype(np.int64)
    if batch and lens.min() < 0:
        b = int(np.argmin(lens))
        raise ValueError(f"{_FN}: argument 'lengths' must be >= 0, got {int(lens[b])} at index {b}")
    if batch and lens.max() > frames:
        b = int(np.argmax(lens))
        raise ValueError(f"{_FN}: argument 'lengths' must be <= T = {frames} (the emissions' "
                         f"frames), got {int(lens[b])} at index {b}")
    return lens


# --------------------------------------------------------------------------- building

def _read_dictionary(path: str, arg: str, what: str) -> Tuple[List[str], Dict[str, int]]:
    """A flashlight ``Dictionary`` file: one entry per line, several entries on a line
    sharing an index; (index -> first entry, entry -> index)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            lines = _lines(f.read())
    except (FileNotFoundError, IsADirectoryError):
        raise ValueError(f"{_FN}: argument '{arg}' must be a list of {what}s or a {what}s "
                         f"file, got {path!r}, which does not exist") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{_FN}: argument '{arg}': {path!r} is not UTF-8 text ({e.reason} at "
                         f"byte {e.start})") from None
    out: List[str] = []
    index: Dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        fields = _fields(line)
        if not fields:
            continue
        for fld in fields:     # several entries on a line share an id (flashlight)
            if fld in index:
                raise ValueError(f"{_FN}: {path}:{lineno}: {what} {fld!r} is listed twice")
            index[fld] = len(out)
        out.append(fields[0])
    if not out:
        raise ValueError(f"{_FN}: {what}s file {path!r} lists no {what}")
    return out, index


def _read_tokens(tokens: Any) -> Tuple[List[str], Dict[str, int]]:
    if isinstance(tokens, (str, os.PathLike)):
        return _read_dictionary(os.fspath(tokens), "tokens", "token")
    if isinstance(tokens, (bytes, dict)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{_FN}: argument 'tokens' must be a list of str or a tokens file path, "
                        f"got {type(tokens).__name__}")
    out = []
    index = {}
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise TypeError(f"{_FN}: argument 'tokens' must be a list of str, got an item of "
                            f"type {type(t).__name__} at index {i}")
        if t in index:
            raise ValueError(f"{_FN}: argument 'tokens' lists {t!r} twice (indices "
                             f"{index[t]} and {i})")
        index[t] = i
        out.append(t)
    if not out:
        raise ValueError(f"{_FN}: argument 'tokens' must list at least one token, got []")
    return out, index


def _number(name: str, value: Any, *, lo: Optional[float] = None, allow_neg_inf: bool = False,
            allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{_FN}: argument '{name}' must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or (v == -math.inf and not allow_neg_inf) or (v == math.inf and not allow_inf):
        raise ValueError(f"{_FN}: argument '{name}' must be a finite number"
                         f"{' or -inf' if allow_neg_inf else ''}, got {v}")
    if lo is not None and v < lo:
        raise ValueError(f"{_FN}: argument '{name}' must be >= {lo:g}, got {v}")
    return v


def _int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{_FN}: argument '{name}' must be an int, got {type(value).__name__}")
    if int(value) < lo:
        raise ValueError(f"{_FN}: argument '{name}' must be >= {lo}, got {int(value)}")
    return int(value)


def _spell_greedy(word: str, token_index: Dict[str, int], phrase: str) -> List[int]:
    out = []
    i = 0
    longest = max(len(t) for t in token_index)
    while i < len(word):
        for n in range(min(longest, len(word) - i), 0, -1):
            t = token_index.get(word[i:i + n])
            if t is not None:
                out.append(t)
                i += n
                break
        else:
            raise ValueError(f"{_FN}: argument 'hotwords': {phrase!r} cannot be spelled with "
                             f"the tokens ({word[i]!r} in {word!r} is no token)")
    return out


def _hotword_units(hotwords: Any, hotword_weight: float, token_index: Dict[str, int], sil: int,
                   blank: int, lexicon: Optional[List[Tuple[str, List[List[int]]]]]
                   ) -> List[Tuple[List[List[int]], float, int]]:
    if hotwords is None:
        return []
    if isinstance(hotwords, (str, bytes)) or not isinstance(hotwords, Sequence):
        raise TypeError(f"{_FN}: argument 'hotwords' must be a list of phrases (str) or "
                        f"(phrase, weight) pairs, got {type(hotwords).__name__}")
    spell = {w: i for i, (w, _) in enumerate(lexicon)} if lexicon is not None else None
    out = []
    for i, item in enumerate(hotwords):
        if isinstance(item, str):
            phrase, weight = item, hotword_weight
        elif (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            phrase = item[0]
            weight = _number(f"hotwords[{i}][1]", item[1])
        else:
            raise TypeError(f"{_FN}: argument 'hotwords' must hold str or (str, weight) pairs, "
                            f"got {item!r} at index {i}")
        words = _fields(phrase)     # spaces and tabs only, as the lexicon's fields
        if not words:
            raise ValueError(f"{_FN}: argument 'hotwords' has an empty phrase at index {i}")
        if spell is not None:
            # with a lexicon the automaton reads words (their ids)
            ids = []
            for w in words:
                if w not in spell:
                    raise ValueError(f"{_FN}: argument 'hotwords': the word {w!r} of {phrase!r} "
                                     "is not in the lexicon (it could never be decoded)")
                ids.append(spell[w])
            out.append(([ids], weight, 0))
        else:
            # without, it reads tokens: the phrase between silences (word boundaries), the
            # leading silence earning nothing
            units: List[int] = [sil]
            for w in words:
                units += _spell_greedy(w, token_index, phrase)
                units.append(sil)
            if blank in units:
                raise ValueError(f"{_FN}: argument 'hotwords': {phrase!r} is spelled with the "
                                 "blank token")
            out.append(([units], weight, 1))
    return out


def _lm_units(lm_dict: Any, words: List[str], tokens: List[str], unk_word: str
              ) -> Optional[Tuple[List[str], np.ndarray]]:
    """torchaudio's ``lm_dict``: the LM's own word list (a flashlight dictionary file, one
    word per line, in the LM's index order).  With a lexicon a Python LM sees each word as
    its index in ``lm_dict``, and every lexicon word and ``unk_word`` must be listed
    there; without one a Python LM sees token ids and an n-gram LM scores token ``i`` as
    the word on ``lm_dict``'s line ``i``.  Returns (each unit's word for an n-gram LM,
    each unit's index for a Python LM), or None without ``lm_dict``."""
    if lm_dict is None:
        return None
    if not isinstance(lm_dict, (str, os.PathLike)):
        raise TypeError(f"{_FN}: argument 'lm_dict' must be None or a file path (the LM's "
                        f"words, one per line), got {type(lm_dict).__name__}")
    path = os.fspath(lm_dict)
    entries, index = _read_dictionary(path, "lm_dict", "word")
    if words:
        ids = []
        for w in words:
            if w not in index:
                what = "unk_word" if len(ids) == len(words) - 1 else "the lexicon word"
                raise ValueError(f"{_FN}: argument 'lm_dict': {what} {w!r} is not listed in "
                                 f"{path!r} (it must list every lexicon word and unk_word, "
                                 "as torchaudio requires)")
            ids.append(index[w])
        return [entries[i] for i in ids], np.array(ids, np.int64)
    names = [entries[i] if i < len(entries) else unk_word for i in range(len(tokens))]
    return names, np.arange(len(tokens), dtype=np.int64)


def _looks_like_arpa(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return True       # let read_arpa report it
    if head[:2] == b"\x1f\x8b":         # gzip: a compressed ARPA file (read_arpa reads it)
        return True
    text = head.lstrip()
    return text.startswith(b"\\data\\") or not head or b"\0" not in head


def build_decoder(tokens: Any, lexicon: Any = None, lm: Any = None, *, nbest: int = 1,
                  beam_size: int = 50, beam_size_token: Optional[int] = None,
                  beam_threshold: float = 50, lm_weight: float = 2, word_score: float = 0,
                  unk_score: float = float("-inf"), sil_score: float = 0, log_add: bool = False,
                  blank_token: str = "-", sil_token: str = "|", unk_word: str = "<unk>",
                  hotwords: Any = None, hotword_weight: float = 10.0,
                  lm_dict: Any = None) -> CTCDecoder:
    """Check the arguments of ``ctc_decoder`` and build a framework-free
    [`CTCDecoder`][duoloss.core.decoding.CTCDecoder] (see the frontends' ``ctc_decoder``
    for the arguments).

    Examples:
        >>> import numpy as np
        >>> dec = build_decoder(["-", "|", "a", "b"])
        >>> em = np.log(np.array([[[.1, .1, .7, .1], [.8, .1, .05, .05]]]))
        >>> hyp = dec.decode(em)[0][0]
        >>> dec.idxs_to_tokens(hyp.tokens)
        ['|', 'a', '|']
    """
    tok_list, token_index = _read_tokens(tokens)
    for name, tok in (("blank_token", blank_token), ("sil_token", sil_token)):
        if not isinstance(tok, str):
            raise TypeError(f"{_FN}: argument '{name}' must be a str, got {type(tok).__name__}")
        if tok not in token_index:
            raise ValueError(f"{_FN}: argument '{name}' must be one of the tokens, got {tok!r} "
                             f"(tokens: {tok_list[:8]}{' ...' if len(tok_list) > 8 else ''})")
    blank, sil = token_index[blank_token], token_index[sil_token]
    if blank == sil:
        raise ValueError(f"{_FN}: arguments 'blank_token' and 'sil_token' must be different "
                         f"tokens, got {blank_token!r} and {sil_token!r}")
    if not isinstance(unk_word, str):
        raise TypeError(f"{_FN}: argument 'unk_word' must be a str, got {type(unk_word).__name__}")
    nbest = _int("nbest", nbest, 1)
    beam_size = _int("beam_size", beam_size, 1)
    k_tok = len(tok_list) if beam_size_token is None else _int("beam_size_token", beam_size_token, 1)
    k_tok = min(k_tok, len(tok_list))
    beam_threshold = _number("beam_threshold", beam_threshold, lo=0, allow_inf=True)
    lm_weight = _number("lm_weight", lm_weight)
    word_score = _number("word_score", word_score)
    unk_score = _number("unk_score", unk_score, allow_neg_inf=True)
    sil_score = _number("sil_score", sil_score)
    hotword_weight = _number("hotword_weight", hotword_weight)
    if not isinstance(log_add, (bool, np.bool_)):
        raise TypeError(f"{_FN}: argument 'log_add' must be a bool, got {type(log_add).__name__}")
    lex_entries = None
    if lexicon is not None:
        if isinstance(lexicon, (str, os.PathLike)):
            lex_entries = read_lexicon(lexicon, token_index)
        else:
            raise TypeError(f"{_FN}: argument 'lexicon' must be a lexicon file path or None, "
                            f"got {type(lexicon).__name__}")
        for w, sps in lex_entries:
            for sp in sps:
                if blank in sp:
                    raise ValueError(f"{_FN}: argument 'lexicon': the word {w!r} is spelled with "
                                     f"the blank token {blank_token!r}")
    # the hotwords first: compiling an LM's tables below takes seconds for a large LM
    hw = _hotword_units(hotwords, hotword_weight, token_index, sil, blank, lex_entries)
    words: List[str] = []
    if lex_entries is not None:
        words = [w for w, _ in lex_entries] + [unk_word]
    lm_units = _lm_units(lm_dict, words, tok_list, unk_word)
    tables = None
    py_lm = None
    if lm is None:
        pass
    elif isinstance(lm, ArpaLM):
        tables = compile_lm(lm)
    elif isinstance(lm, (str, os.PathLike)):
        path = os.fspath(lm)
        if not os.path.exists(path):
            raise ValueError(f"{_FN}: argument 'lm': the file {path!r} does not exist")
        if _looks_like_arpa(path):
            tables = compile_lm(read_arpa(path))
        else:
            from ._beam_python import kenlm_model
            units = words or tok_list
            if lm_units is not None:     # the Python-LM index of each unit -> its LM word
                units = dict(zip(lm_units[1].tolist(), lm_units[0]))
            py_lm = kenlm_model(path, units)
    elif isinstance(lm, CTCDecoderLM) or all(hasattr(lm, a) for a in ("start", "score", "finish")):
        py_lm = lm
    else:
        raise TypeError(f"{_FN}: argument 'lm' must be None, an ARPA file path, an ArpaLM or a "
                        f"CTCDecoderLM, got {type(lm).__name__}")
    return CTCDecoder(tokens=tok_list, token_index=token_index, blank=blank, sil=sil, words=words,
                      unk_word=unk_word, nbest=nbest, beam_size=beam_size, beam_size_token=k_tok,
                      beam_threshold=beam_threshold, lm_weight=lm_weight, word_score=word_score,
                      unk_score=unk_score, sil_score=sil_score, log_add=bool(log_add),
                      lexicon=lex_entries, lm_tables=tables, py_lm=py_lm, hotwords=hw,
                      lm_units=lm_units)
