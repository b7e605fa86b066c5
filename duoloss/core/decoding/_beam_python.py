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


def lm_word_scores(lm: Any, n_words: int) -> List[float]:
    """Each word's score after ``lm.start(False)`` (the trie's look-ahead, as torchaudio)."""
    start = lm.start(False)
    return [float(lm.score(start, w)[1]) for w in range(n_words)]


class _KenLMState(CTCDecoderLMState):
    """A state of ``_KenLM``: its KenLM state in ``ken``, its score in ``score_``."""


class _KenLM(CTCDecoderLM):
    """A KenLM model (ARPA or binary) behind the ``CTCDecoderLM`` protocol."""

    def __init__(self, path: str, units: List[str]) -> None:
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


def kenlm_model(path: str, units: List[str]) -> CTCDecoderLM:
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


def decode_python(dec: Any, em: np.ndarray, lens: np.ndarray, todo: np.ndarray
                  ) -> Dict[int, List[CTCHypothesis]]:
    lm = dec.py_lm
    lexicon = dec.lexicon is not None
    if lexicon:
        ch_start, ch_token, ch_node, lab_start, lab_word, smear, _ = dec._trie
    hw_col, hw_goto, hw_par, hw_cum, hw_term = dec._hw
    has_hw = dec._has_hw
    beam, k_tok, blank, sil = dec.beam_size, dec.beam_size_token, dec.blank, dec.sil
    thr, lmw = dec.beam_threshold, dec.lm_weight
    unk = dec._unk_unit
    out: Dict[int, List[CTCHypothesis]] = {}

    def hw_step(node: int, pending: float, x: int) -> Tuple[int, float, float]:
        c = int(hw_goto[node, hw_col[x]])
        if hw_par[c] == node:
            delta = hw_cum[c] - hw_cum[node]
            pending += delta
        else:
            delta = hw_cum[c] - pending
            pending = hw_cum[c]
        if hw_term[c]:
            pending = 0.0
        return c, pending, float(delta)

    for b in todo.tolist():
        T = int(lens[b])
        # history trie: node -> (parent, unit, lm state, lm score)
        h_key: Dict[Tuple[int, int], int] = {}
        h_par: List[int] = [-1]
        h_unit: List[int] = [-1]
        h_state: List[Any] = [lm.start(False)]
        h_score: List[float] = [0.0]

        def child(H: int, u: int) -> int:
            n = h_key.get((H, u))
            if n is None:
                st, sc = lm.score(h_state[H], u)
                n = len(h_par)
                h_key[(H, u)] = n
                h_par.append(H)
                h_unit.append(u)
                h_state.append(st)
                h_score.append(float(sc))
            return n

        # hypothesis: (score, hist, lex, tok, blank, hwn, hwp)
        hyps = [(0.0, 0, 0, sil, 0, dec._hw_init, 0.0)]
        p_tok = [[sil]]
        p_par = [[-1]]
        for t in range(T):
            row = em[b, t]
            if k_tok < row.shape[0]:
                top = np.argsort(-row, kind="mergesort")[:k_tok].tolist()
            else:
                top = list(range(row.shape[0]))
            allowed = set(top)
            cands: List[tuple] = []
            best = -math.inf

            def add(score, hist, lex, tok, blk, par, hwn, hwp):
                nonlocal best
                if score >= best:
                    best = score
                if score >= best - thr:
                    cands.append((score, hist, lex, tok, blk, par, hwn, hwp))

            for h, (S, H, L, p, pb, hwn, hwp) in enumerate(hyps):
                if lexicon:
                    lex_max = 0.0 if L == 0 else float(smear[L])
                    for j in range(ch_start[L], ch_start[L + 1]):
                        n = int(ch_token[j])
                        if n not in allowed or not (pb or n != p):
                            continue
                        c = int(ch_node[j])
                        sc = S + row[n] + (dec.sil_score if n == sil else 0.0)
                        if ch_start[c + 1] > ch_start[c]:
                            add(sc + lmw * (float(smear[c]) - lex_max), H, c, n, 0, h, hwn, hwp)
                        n_lab = lab_start[c + 1] - lab_start[c]
                        for q in range(lab_start[c], lab_start[c + 1]):
                            w = int(lab_word[q])
                            nh = child(H, w)
                            nhwn, nhwp, dhw = (hw_step(hwn, hwp, w) if has_hw else (hwn, hwp, 0.0))
                            add(sc + lmw * (h_score[nh] - lex_max) + dec.word_score + dhw,
                                nh, 0, n, 0, h, nhwn, nhwp)
                        if n_lab == 0 and dec.unk_score > -math.inf:
                            nh = child(H, unk)
                            nhwn, nhwp, dhw = (hw_step(hwn, hwp, unk) if has_hw else (hwn, hwp, 0.0))
                            add(sc + lmw * (h_score[nh] - lex_max) + dec.unk_score + dhw,
                                nh, 0, n, 0, h, nhwn, nhwp)
                    if (not pb) or L == 0:
                        n = sil if L == 0 else p
                        sc = S + row[n] + (dec.sil_score if n == sil else 0.0)
                        add(sc, H, L, n, 0, h, hwn, hwp)
                    add(S + row[blank], H, L, blank, 1, h, hwn, hwp)
                else:
                    for n in top:
                        sc = S + row[n] + (dec.sil_score if n == sil else 0.0)
                        if n != blank and (n != p or pb):
                            nh = child(H, n)
                            nhwn, nhwp, dhw = (hw_step(hwn, hwp, n) if has_hw else (hwn, hwp, 0.0))
                            add(sc + lmw * h_score[nh] + dhw, nh, 0, n, 0, h, nhwn, nhwp)
                        elif n == blank:
                            add(sc, H, 0, n, 1, h, hwn, hwp)
                        else:
                            add(sc, H, 0, n, 0, h, hwn, hwp)
            kept = _store(cands, best, thr, beam, dec.log_add)
            hyps = [(s, c[1], c[2], c[3], c[4], c[6], c[7]) for s, c in kept]
            p_tok.append([c[3] for _, c in kept])
            p_par.append([c[5] for _, c in kept])
        nice = lexicon and any(hp[2] == 0 for hp in hyps)
        cands = []
        best = -math.inf
        for h, (S, H, L, p, pb, hwn, hwp) in enumerate(hyps):
            if nice and L != 0:
                continue
            _, fs = lm.finish(h_state[H])
            sc = S + lmw * float(fs)
            if has_hw:
                if not lexicon:    # the end silence ends a phrase spelled up to its last token
                    _, hwp, dhw = hw_step(hwn, hwp, sil)
                    sc += dhw
                sc -= hwp
            if sc >= best:
                best = sc
            if sc >= best - thr:
                cands.append((sc, H, L, sil, 0, h, 0, 0.0))
        kept = _store(cands, best, thr, beam, dec.log_add)
        res = []
        for s, c in kept[:dec.nbest]:
            path = [0] * (T + 2)
            path[T + 1] = sil
            i = c[5]
            for f in range(T, -1, -1):
                path[f] = p_tok[f][i]
                i = p_par[f][i]
            words: List[str] = []
            if lexicon:
                node = c[1]
                while node > 0:
                    words.append(dec.words[h_unit[node]])
                    node = h_par[node]
                words.reverse()
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
