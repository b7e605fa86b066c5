"""The CTC beam search with a language model written in Python (``CTCDecoderLM``).

The same search as the numba kernel (``_beam_kernel.decode_batch``; same candidates, merge
keys, pruning and end of utterance), in Python, because the LM is a Python object: its
``score`` is called once per (history, unit) -- histories are nodes of a trie, as in the
kernel -- and ``finish`` once per history that reaches the end.  Also here: KenLM binary
models through the optional ``kenlm`` package.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from .ctc_beam import CTCDecoderLM, CTCDecoderLMState, CTCHypothesis

__all__ = ["decode_python", "kenlm_model", "lm_word_scores"]

_GC_MIN = 1 << 14      # histories before the first collection of unreachable ones


def lm_word_scores(lm: Any, units: Any) -> List[float]:
    """Each unit's score after ``lm.start(False)`` (the trie's look-ahead, as torchaudio);
    ``units`` are the indices the LM knows the words by."""
    start = lm.start(False)
    return [float(lm.score(start, int(w))[1]) for w in units]


class _KenLMState(CTCDecoderLMState):
    """A state of ``_KenLM``: its KenLM state in ``ken``, its score in ``score_``."""


class _KenLM(CTCDecoderLM):
    """A KenLM model (ARPA or binary) behind the ``CTCDecoderLM`` protocol."""

    def __init__(self, path: str, units: Any) -> None:
        import kenlm   # optional

        self.model = kenlm.Model(path)
        self.units = units
        self._kenlm = kenlm

    def start(self, start_with_nothing: bool) -> CTCDecoderLMState:
        s = _KenLMState()
        s.ken = self._kenlm.State()
        if start_with_nothing:
            self.model.NullContextWrite(s.ken)
        else:
            self.model.BeginSentenceWrite(s.ken)
        return s

    def score(self, state: CTCDecoderLMState, usr_token_idx: int) -> Tuple[CTCDecoderLMState, float]:
        out = state.child(usr_token_idx)
        if not hasattr(out, "ken"):
            out.ken = self._kenlm.State()
            out.score_ = self.model.BaseScore(state.ken, self.units[usr_token_idx], out.ken)
        return out, out.score_

    def finish(self, state: CTCDecoderLMState) -> Tuple[CTCDecoderLMState, float]:
        out = state.child(-1)
        if not hasattr(out, "ken"):
            out.ken = self._kenlm.State()
            out.score_ = self.model.BaseScore(state.ken, "</s>", out.ken)
        return out, out.score_


def kenlm_model(path: str, units: Any) -> CTCDecoderLM:
    """A KenLM binary model as a ``CTCDecoderLM`` (needs the ``kenlm`` package)."""
    try:
        import kenlm  # noqa: F401
    except ImportError:
        raise ValueError(f"ctc_decoder: argument 'lm': {path!r} is not an ARPA text file, and "
                         "reading KenLM binary models needs the optional 'kenlm' package (not "
                         "installed); pass the ARPA file instead") from None
    return _KenLM(path, units)


def _logadd(a: float, b: float) -> float:
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


class _Search:
    """One utterance's search with a Python LM: the numba kernel's steps, in Python."""

    def __init__(self, dec: Any) -> None:
        self.dec = dec
        self.lm = dec.py_lm
        self.units = dec._py_units.tolist()
        # history trie: node -> (parent, unit, lm state, lm score)
        self.h_key: Dict[Tuple[int, int], int] = {}
        self.h_par: List[int] = [-1]
        self.h_unit: List[int] = [-1]
        self.h_state: List[Any] = [self.lm.start(False)]
        self.h_score: List[float] = [0.0]
        self.cands: List[tuple] = []
        self.best = -math.inf

    def child(self, H: int, u: int) -> int:
        """The history ``H + u`` (its LM score computed once)."""
        n = self.h_key.get((H, u))
        if n is None:
            st, sc = self.lm.score(self.h_state[H], self.units[u])
            n = len(self.h_par)
            self.h_key[(H, u)] = n
            self.h_par.append(H)
            self.h_unit.append(u)
            self.h_state.append(st)
            self.h_score.append(float(sc))
        return n

    def collect(self, hyps: List[tuple]) -> List[tuple]:
        """Drop the histories no hypothesis reaches (as the kernel's ``_hist_collect``):
        memory bounded by the beam.  Returns ``hyps`` with their histories renumbered."""
        live = {0}
        for hyp in hyps:
            n = hyp[1]
            while n > 0 and n not in live:
                live.add(n)
                n = self.h_par[n]
        new_id: Dict[int, int] = {}
        for n in sorted(live):          # a parent before its children
            new_id[n] = len(new_id)
        self.h_par = [-1 if n == 0 else new_id[self.h_par[n]] for n in sorted(live)]
        self.h_unit = [self.h_unit[n] for n in sorted(live)]
        self.h_state = [self.h_state[n] for n in sorted(live)]
        self.h_score = [self.h_score[n] for n in sorted(live)]
        self.h_key = {(self.h_par[m], self.h_unit[m]): m for m in range(1, len(self.h_par))}
        return [(h[0], new_id[h[1]]) + h[2:] for h in hyps]

    def hw_step(self, node: int, x: int) -> Tuple[int, float]:
        col, goto, credit, out = self.dec._hw
        c = int(goto[node, col[x]])
        return c, float(out[c] + credit[c] - credit[node])

    def add(self, score: float, hist: int, lex: int, tok: int, blk: int, hwn: int, par: int
            ) -> None:
        if score >= self.best:
            self.best = score
        if score >= self.best - self.dec.beam_threshold:
            self.cands.append((score, hist, lex, tok, blk, hwn, par))

    def expand_lexicon(self, h: int, hyp: tuple, row: np.ndarray, allowed: set) -> None:
        dec = self.dec
        ch_start, ch_token, ch_node, lab_start, lab_word, smear, _ = dec._trie
        S, H, L, p, pb, hwn = hyp
        lmw = dec.lm_weight
        lex_max = 0.0 if L == 0 else float(smear[L])
        for j in range(ch_start[L], ch_start[L + 1]):
            n = int(ch_token[j])
            if n not in allowed or not (pb or n != p):
                continue
            c = int(ch_node[j])
            sc = S + row[n] + (dec.sil_score if n == dec.sil else 0.0)
            if ch_start[c + 1] > ch_start[c]:
                self.add(sc + lmw * (float(smear[c]) - lex_max), H, c, n, 0, hwn, h)
            ends = [(int(w), dec.word_score) for w in lab_word[lab_start[c]:lab_start[c + 1]]]
            if not ends and dec.unk_score > -math.inf:
                ends = [(dec._unk_unit, dec.unk_score)]
            for w, bonus in ends:
                nh = self.child(H, w)
                nhwn, dhw = self.hw_step(hwn, w) if dec._has_hw else (hwn, 0.0)
                self.add(sc + lmw * (self.h_score[nh] - lex_max) + bonus + dhw,
                         nh, 0, n, 0, nhwn, h)
        if (not pb) or L == 0:
            n = dec.sil if L == 0 else p
            self.add(S + row[n] + (dec.sil_score if n == dec.sil else 0.0), H, L, n, 0, hwn, h)
            if L == 0 and not pb and p != dec.sil:   # the finished word's last token again
                self.add(S + row[p], H, 0, p, 0, hwn, h)
        self.add(S + row[dec.blank], H, L, dec.blank, 1, hwn, h)

    def expand_free(self, h: int, hyp: tuple, row: np.ndarray, top: List[int]) -> None:
        dec = self.dec
        S, H, _, p, pb, hwn = hyp
        for n in top:
            sc = S + row[n] + (dec.sil_score if n == dec.sil else 0.0)
            if n != dec.blank and (n != p or pb):
                nh = self.child(H, n)
                nhwn, dhw = self.hw_step(hwn, n) if dec._has_hw else (hwn, 0.0)
                self.add(sc + dec.lm_weight * self.h_score[nh] + dhw, nh, 0, n, 0, nhwn, h)
            elif n == dec.blank:
                self.add(sc, H, 0, n, 1, hwn, h)
            else:
                self.add(sc, H, 0, n, 0, hwn, h)

    def finish(self, hyps: List[tuple]) -> None:
        dec = self.dec
        lexicon = dec.lexicon is not None
        nice = lexicon and any(hp[2] == 0 for hp in hyps)
        for h, (S, H, L, p, pb, hwn) in enumerate(hyps):
            if nice and L != 0:
                continue
            _, fs = self.lm.finish(self.h_state[H])
            sc = S + dec.lm_weight * float(fs)
            if dec._has_hw:
                if not lexicon:    # the end silence ends a phrase spelled up to its last token
                    hwn, dhw = self.hw_step(hwn, dec.sil)
                    sc += dhw
                sc -= float(dec._hw[2][hwn])      # an unfinished phrase earns nothing
            self.add(sc, H, L, dec.sil, 0, 0, h)

    def take(self) -> List[Tuple[float, tuple]]:
        kept = _store(self.cands, self.best, self.dec.beam_threshold, self.dec.beam_size,
                      self.dec.log_add)
        self.cands = []
        self.best = -math.inf
        return kept

    def words(self, node: int) -> List[str]:
        out: List[str] = []
        while node > 0:
            out.append(self.dec.words[self.h_unit[node]])
            node = self.h_par[node]
        return out[::-1]


def decode_python(dec: Any, em: np.ndarray, lens: np.ndarray, todo: np.ndarray
                  ) -> Dict[int, List[CTCHypothesis]]:
    """The search of ``_beam_kernel.decode_batch`` with ``dec.py_lm`` (emissions summed in
    float64, as there)."""
    lexicon = dec.lexicon is not None
    n_tok = len(dec.tokens)
    out: Dict[int, List[CTCHypothesis]] = {}
    for b in todo.tolist():
        T = int(lens[b])
        run = _Search(dec)
        hyps = [(0.0, 0, 0, dec.sil, 0, dec._hw_init)]    # (score, hist, lex, tok, blank, hw)
        p_tok = [[dec.sil]]
        p_par = [[-1]]
        gc_at = _GC_MIN
        for t in range(T):
            if len(run.h_par) > gc_at:
                hyps = run.collect(hyps)
                gc_at = max(_GC_MIN, 2 * len(run.h_par))
            row = em[b, t, :n_tok].astype(np.float64).tolist()
            top = np.argsort(-np.asarray(row), kind="mergesort")[:dec.beam_size_token].tolist()
            if dec.beam_size_token >= n_tok:
                top = list(range(n_tok))
            allowed = set(top)
            for h, hyp in enumerate(hyps):
                if lexicon:
                    run.expand_lexicon(h, hyp, row, allowed)
                else:
                    run.expand_free(h, hyp, row, top)
            kept = run.take()
            hyps = [(sc, c[1], c[2], c[3], c[4], c[5]) for sc, c in kept]
            p_tok.append([c[3] for _, c in kept])
            p_par.append([c[6] for _, c in kept])
        run.finish(hyps)
        res = []
        for s, c in run.take()[:dec.nbest]:
            path = [0] * (T + 2)
            path[T + 1] = dec.sil
            i = c[6]
            for f in range(T, -1, -1):
                path[f] = p_tok[f][i]
                i = p_par[f][i]
            words = run.words(c[1]) if lexicon else []
            res.append(dec._hypothesis(np.array(path, np.int64), words, float(s)))
        out[b] = res
    return out


def _store(cands: List[tuple], best: float, thr: float, beam: int, log_add: bool
           ) -> List[Tuple[float, tuple]]:
    cut = best - thr
    merged: Dict[tuple, List[Any]] = {}
    order: List[tuple] = []
    for c in cands:
        if not (c[0] >= cut):
            continue
        key = (c[1], c[2], c[3], c[4])
        m = merged.get(key)
        if m is None:
            merged[key] = [c[0], c]
            order.append(key)
        else:
            m[0] = _logadd(m[0], c[0]) if log_add else max(m[0], c[0])
            if c[0] > m[1][0]:
                m[1] = c
    items = [(merged[k][0], merged[k][1]) for k in order]
    items.sort(key=lambda x: -x[0])      # stable: ties keep proposal order, as the kernel
    return items[:beam]
