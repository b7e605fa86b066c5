"""The numba kernel of the CTC prefix beam search (see ``ctc_beam`` for the semantics).

Everything here works on flat arrays built once per decoder by ``ctc_beam``:

* the lexicon trie in CSR form (``ch_start``/``ch_token``/``ch_node`` children per node,
  ``lab_start``/``lab_word`` the words ending at a node, ``smear`` the node's look-ahead
  score, as float32 like flashlight's ``TrieNode::maxScore``);
* the n-gram LM as an open-addressing hash table keyed by ``(context state, word)`` with the
  log10 probability and the next state, plus each state's backoff weight and backoff state;
* the hotword automaton (a trie with failure links, Aho-Corasick style) as a dense
  transition table over the tokens the hotwords use, with each node's trie parent, its
  cumulative bonus and whether a phrase ends there.

Per utterance the search keeps, per frame, at most ``beam`` hypotheses in plain arrays and
one parent pointer per frame and hypothesis; histories (the word sequence with a lexicon,
the token sequence without) are nodes of a trie built on the fly, so that two hypotheses
with the same history share one node id and the LM is queried once per node.
"""
from __future__ import annotations

import numba
import numpy as np

from .._numerics import HELPER

_EMPTY = -1
_MUL1 = 0x9E3779B97F4A7C15 - (1 << 64)   # int64 multipliers (wrapping arithmetic)
_MUL2 = 0xC2B2AE3D27D4EB4F - (1 << 64)
_MUL3 = 0x165667B19E3779F9


@numba.njit(inline="always")
def _mix(a, b, c, d):
    h = np.int64(a) * np.int64(_MUL1) + np.int64(b) * np.int64(_MUL2)
    h = (h ^ (h >> 29)) + np.int64(c) * np.int64(_MUL3) + np.int64(d)
    h = h * np.int64(_MUL1)
    return h ^ (h >> 32)


@numba.njit(inline="always")
def _lm_lookup(keys, probs, nexts, mask, n_words, state, word):
    """(log10 p, next state) of the n-gram ``state + word`` or (nan, -1) when absent."""
    key = np.int64(state) * np.int64(n_words) + np.int64(word)
    i = _mix(key, 0, 0, 0) & mask
    while True:
        k = keys[i]
        if k == key:
            return probs[i], nexts[i]
        if k == _EMPTY:
            return np.nan, -1
        i = (i + 1) & mask


@numba.njit(**HELPER)
def lm_score(keys, probs, nexts, mask, n_words, bo, parent, state, word):
    """log10 p(word | state) with ARPA backoff, and the state after ``word``."""
    total = 0.0
    s = state
    while True:
        p, nxt = _lm_lookup(keys, probs, nexts, mask, n_words, s, word)
        if nxt >= 0:
            return total + p, nxt
        if s == 0:
            return -np.inf, 0      # unreachable: every word id is a unigram
        total += bo[s]
        s = parent[s]


@numba.njit(cache=True, nogil=True)
def lm_score_many(keys, probs, nexts, mask, n_words, bo, parent, states, words, out_p, out_s):
    """``lm_score`` for arrays of (state, word) pairs (tests and the Python side)."""
    for i in range(states.shape[0]):
        p, s = lm_score(keys, probs, nexts, mask, n_words, bo, parent, states[i], words[i])
        out_p[i] = p
        out_s[i] = s


@numba.njit(inline="always")
def _hw_step(hw_col, hw_goto, hw_par, hw_cum, hw_term, node, pending, x):
    """Advance the hotword automaton by unit ``x``: (new node, new pending, score delta).

    ``hw_goto[node, hw_col[x]]`` is the automaton's transition (a child, else the failure
    links' target); a dense table, because a search through the failure links in the hot
    loop (even as a call in a branch never taken) slowed every candidate by a third."""
    c = np.int64(hw_goto[node, hw_col[x]])
    if hw_par[c] == node:   # the match goes on: one more unit's bonus
        delta = hw_cum[c] - hw_cum[node]
        pending = pending + delta
    else:                   # abandoned: the partial bonus is taken back, a suffix match starts
        delta = hw_cum[c] - pending
        pending = hw_cum[c]
    if hw_term[c]:
        pending = 0.0      # a whole phrase: its bonus stays
    return c, pending, delta


@numba.njit(**HELPER)
def _hist_child(h_parent, h_unit, h_lm, h_lmscore, h_table, n_hist, parent, unit,
                unit_lm, has_lm, lm_keys, lm_probs, lm_nexts, lm_mask, lm_nw, lm_bo, lm_par):
    """Node id of history ``parent + unit`` (created, with its LM score, when new)."""
    mask = h_table.shape[0] - 1
    i = _mix(parent, unit, 7, 0) & mask
    while True:
        n = h_table[i]
        if n < 0:
            break
        if h_parent[n] == parent and h_unit[n] == unit:
            return n, n_hist
        i = (i + 1) & mask
    n = n_hist
    h_table[i] = n
    h_parent[n] = parent
    h_unit[n] = unit
    if has_lm:
        p, s = lm_score(lm_keys, lm_probs, lm_nexts, lm_mask, lm_nw, lm_bo, lm_par,
                        h_lm[parent], unit_lm[unit])
        h_lmscore[n] = p
        h_lm[n] = s
    else:
        h_lmscore[n] = 0.0
        h_lm[n] = 0
    return n, n_hist + 1


@numba.njit(**HELPER)
def _grow_hist(h_parent, h_unit, h_lm, h_lmscore, n_hist):
    cap = 2 * h_parent.shape[0]
    p2 = np.empty(cap, np.int32)
    u2 = np.empty(cap, np.int32)
    l2 = np.empty(cap, np.int32)
    s2 = np.empty(cap, np.float64)
    p2[:n_hist] = h_parent[:n_hist]
    u2[:n_hist] = h_unit[:n_hist]
    l2[:n_hist] = h_lm[:n_hist]
    s2[:n_hist] = h_lmscore[:n_hist]
    table = np.full(2 * cap, -1, np.int32)
    mask = table.shape[0] - 1
    for n in range(1, n_hist):
        i = _mix(p2[n], u2[n], 7, 0) & mask
        while table[i] >= 0:
            i = (i + 1) & mask
        table[i] = n
    return p2, u2, l2, s2, table


@numba.njit(inline="always")
def _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par, c_hwn, c_hwp, nc, best, thr,
         score, hist, lex, tok, blank, par, hwn, hwp):
    """flashlight's candidatesAdd: keep a candidate within ``thr`` of the best so far."""
    if score >= best:
        best = score
    if score >= best - thr:
        c_score[nc] = score
        c_hist[nc] = hist
        c_lex[nc] = lex
        c_tok[nc] = tok
        c_blank[nc] = blank
        c_par[nc] = par
        c_hwn[nc] = hwn
        c_hwp[nc] = hwp
        nc += 1
    return nc, best


@numba.njit(inline="always")
def _worse(scores, a, b):
    # a ranks below b: lower score, or the same score and proposed later
    return scores[a] < scores[b] or (scores[a] == scores[b] and a > b)


@numba.njit(**HELPER)
def _top_k(scores, n, k):
    """Indices of the ``k`` best of ``scores[:n]`` (ties: lower index first), best first;
    the order ``np.argsort(-scores[:n], kind="mergesort")[:k]`` gives, in O(n log k)."""
    heap = np.empty(k, np.int64)       # a min-heap: heap[0] is the worst kept
    for i in range(k):
        heap[i] = i
        j = i
        while j > 0:
            par = (j - 1) >> 1
            if _worse(scores, heap[j], heap[par]):
                heap[j], heap[par] = heap[par], heap[j]
                j = par
            else:
                break
    for i in range(k, n):
        if _worse(scores, heap[0], i):
            heap[0] = i
            j = 0
            while True:
                l = 2 * j + 1
                if l >= k:
                    break
                m = l
                r = l + 1
                if r < k and _worse(scores, heap[r], heap[l]):
                    m = r
                if _worse(scores, heap[m], heap[j]):
                    heap[j], heap[m] = heap[m], heap[j]
                    j = m
                else:
                    break
    # heap order -> best first (k is small): insertion sort
    out = heap.copy()
    for i in range(1, k):
        x = out[i]
        j = i - 1
        while j >= 0 and _worse(scores, out[j], x):
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = x
    return out


@numba.njit(**HELPER)
def _store(c_score, c_hist, c_lex, c_tok, c_blank, nc, best, thr, beam, log_add,
           m_table, m_rep, m_score):
    """flashlight's candidatesStore: drop candidates below ``best - thr``, merge equal
    states (max, or log-add), keep the ``beam`` best.  Returns the kept candidates'
    indices (best first) and their merged scores."""
    mask = m_table.shape[0] - 1
    for i in range(m_table.shape[0]):
        m_table[i] = -1
    n_rep = 0
    cut = best - thr
    for c in range(nc):
        s = c_score[c]
        if not (s >= cut):
            continue
        i = _mix(c_hist[c], c_lex[c], c_tok[c], c_blank[c]) & mask
        while True:
            r = m_table[i]
            if r < 0:
                m_table[i] = n_rep
                m_rep[n_rep] = c
                m_score[n_rep] = s
                n_rep += 1
                break
            rc = m_rep[r]
            if (c_hist[rc] == c_hist[c] and c_lex[rc] == c_lex[c] and c_tok[rc] == c_tok[c]
                    and c_blank[rc] == c_blank[c]):
                old = m_score[r]
                hi = max(old, s)
                if log_add:
                    lo = min(old, s)
                    m_score[r] = hi + np.log1p(np.exp(lo - hi))
                else:
                    m_score[r] = hi
                if s > c_score[rc]:     # the best-scoring member gives the path
                    m_rep[r] = c
                break
            i = (i + 1) & mask
    k = min(n_rep, beam)
    if n_rep > beam:
        order = _top_k(m_score, n_rep, beam)
    else:
        order = np.argsort(-m_score[:n_rep], kind="mergesort")
    kept = np.empty(k, np.int64)
    scores = np.empty(k, np.float64)
    for j in range(k):
        kept[j] = m_rep[order[j]]
        scores[j] = m_score[order[j]]
    return kept, scores


@numba.njit(cache=True, nogil=True)
def decode_batch(order, em, lengths, pf, pi,
                 ch_start, ch_token, ch_node, lab_start, lab_word, smear,
                 unit_lm, lm_keys, lm_probs, lm_nexts, lm_bo, lm_par,
                 hw_col, hw_goto, hw_par, hw_cum, hw_term,
                 out_n, out_score, out_path, out_words, out_nwords):
    """Decode the utterances listed in ``order``.

    Per utterance ``b``: ``out_n[b]`` hypotheses, best first, their scores
    ``out_score[b, :n]``, their per-frame tokens ``out_path[b, :n, :T+2]`` (frames 0 and
    T+1 are the start and end silence, as flashlight reports them) and, with a lexicon,
    their words ``out_words[b, j, :out_nwords[b, j]]`` (decoder word ids).
    """
    lm_weight, word_score, unk_score, sil_score, thr = pf[0], pf[1], pf[2], pf[3], pf[4]
    beam, k_tok, blank, sil = pi[0], pi[1], pi[2], pi[3]
    unk_word, lexicon, log_add, has_lm = pi[4], pi[5] != 0, pi[6] != 0, pi[7] != 0
    nbest, max_lab, eos_lm, start_state = pi[8], pi[9], pi[10], pi[11]
    has_hw, lm_nw, hw_init = pi[12] != 0, pi[13], pi[14]
    n_cls = em.shape[2]
    lm_mask = lm_keys.shape[0] - 1
    n_nodes = ch_start.shape[0] - 1
    if lexicon:
        per_hyp = k_tok * (2 + max_lab) + 2
    else:
        per_hyp = k_tok
    cap = beam * per_hyp + 1
    c_score = np.empty(cap, np.float64)
    c_hist = np.empty(cap, np.int64)
    c_lex = np.empty(cap, np.int64)
    c_tok = np.empty(cap, np.int64)
    c_blank = np.empty(cap, np.int64)
    c_par = np.empty(cap, np.int64)
    c_hwn = np.empty(cap, np.int64)
    c_hwp = np.empty(cap, np.float64)
    c_base = np.empty(cap, np.int64)     # lexicon-free: the candidate's history (see below)
    m_size = 1
    while m_size < 2 * cap:
        m_size *= 2
    m_table = np.empty(m_size, np.int64)
    m_rep = np.empty(cap, np.int64)
    m_score = np.empty(cap, np.float64)
    allowed = np.zeros(n_cls, np.bool_)
    top = np.empty(n_cls, np.int64)
    for oi in range(order.shape[0]):
        b = order[oi]
        T = lengths[b]
        # history trie (node 0: the empty history)
        hcap = 1024
        h_parent = np.empty(hcap, np.int32)
        h_unit = np.empty(hcap, np.int32)
        h_lm = np.empty(hcap, np.int32)
        h_lmscore = np.empty(hcap, np.float64)
        h_table = np.full(2 * hcap, -1, np.int32)
        h_parent[0] = -1
        h_unit[0] = -1
        h_lm[0] = start_state
        h_lmscore[0] = 0.0
        n_hist = 1
        # hypotheses of the current frame
        n_hyp = 1
        y_score = np.zeros(1, np.float64)
        y_hist = np.zeros(1, np.int64)
        y_lex = np.zeros(1, np.int64)
        y_tok = np.full(1, sil, np.int64)
        y_blank = np.zeros(1, np.int64)
        y_hwn = np.full(1, hw_init, np.int64)     # lexicon-free: after the start silence
        y_hwp = np.zeros(1, np.float64)
        p_tok = np.empty((T + 2, beam), np.int32)     # token of each kept hypothesis
        p_par = np.empty((T + 2, beam), np.int32)     # its parent in the frame before
        p_tok[0, 0] = sil
        p_par[0, 0] = -1
        for t in range(T):
            # room for this frame's new histories
            while n_hist + n_hyp * per_hyp + 1 >= h_parent.shape[0]:
                h_parent, h_unit, h_lm, h_lmscore, h_table = _grow_hist(
                    h_parent, h_unit, h_lm, h_lmscore, n_hist)
            row = em[b, t]
            # the beam_size_token best tokens of the frame
            if k_tok < n_cls:
                idx = np.argsort(-row, kind="mergesort")
                for c in range(n_cls):
                    allowed[c] = False
                for r in range(k_tok):
                    allowed[idx[r]] = True
                    top[r] = idx[r]
            else:
                for c in range(n_cls):
                    allowed[c] = True
                    top[c] = c
            nc = 0
            best = -np.inf
            for h in range(n_hyp):
                S = y_score[h]
                H = y_hist[h]
                L = y_lex[h]
                p = y_tok[h]
                pb = y_blank[h] != 0
                hwn = y_hwn[h]
                hwp = y_hwp[h]
                if lexicon:
                    lex_max = 0.0 if L == 0 else np.float64(smear[L])
                    # (1) the children of the trie node
                    for j in range(ch_start[L], ch_start[L + 1]):
                        n = ch_token[j]
                        if not allowed[n]:
                            continue
                        if not (pb or n != p):
                            continue    # a repeat without blank is no new token (CTC)
                        child = ch_node[j]
                        sc = S + row[n]
                        if n == sil:
                            sc += sil_score
                        if ch_start[child + 1] > ch_start[child]:
                            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                            c_hwn, c_hwp, nc, best, thr,
                                            sc + lm_weight * (np.float64(smear[child]) - lex_max),
                                            H, child, n, 0, h, hwn, hwp)
                        n_lab = lab_start[child + 1] - lab_start[child]
                        for q in range(lab_start[child], lab_start[child + 1]):
                            w = lab_word[q]
                            nh, n_hist = _hist_child(h_parent, h_unit, h_lm, h_lmscore, h_table,
                                                     n_hist, H, w, unit_lm, has_lm, lm_keys,
                                                     lm_probs, lm_nexts, lm_mask, lm_nw, lm_bo,
                                                     lm_par)
                            # hotwords with a lexicon: the automaton reads words
                            nhwn, nhwp, dhw = hwn, hwp, 0.0
                            if has_hw:
                                nhwn, nhwp, dhw = _hw_step(hw_col, hw_goto, hw_par, hw_cum,
                                                           hw_term, hwn, hwp, w)
                            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                            c_hwn, c_hwp, nc, best, thr,
                                            sc + lm_weight * (h_lmscore[nh] - lex_max)
                                            + word_score + dhw,
                                            nh, 0, n, 0, h, nhwn, nhwp)
                        if n_lab == 0 and unk_score > -np.inf:
                            nh, n_hist = _hist_child(h_parent, h_unit, h_lm, h_lmscore, h_table,
                                                     n_hist, H, unk_word, unit_lm, has_lm,
                                                     lm_keys, lm_probs, lm_nexts, lm_mask, lm_nw,
                                                     lm_bo, lm_par)
                            nhwn, nhwp, dhw = hwn, hwp, 0.0
                            if has_hw:
                                nhwn, nhwp, dhw = _hw_step(hw_col, hw_goto, hw_par, hw_cum,
                                                           hw_term, hwn, hwp, unk_word)
                            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                            c_hwn, c_hwp, nc, best, thr,
                                            sc + lm_weight * (h_lmscore[nh] - lex_max)
                                            + unk_score + dhw,
                                            nh, 0, n, 0, h, nhwn, nhwp)
                    # (2) the same trie node: a repeated token, or silence at a word boundary
                    if (not pb) or L == 0:
                        n = sil if L == 0 else p
                        sc = S + row[n]
                        if n == sil:
                            sc += sil_score
                        nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                        c_hwn, c_hwp, nc, best, thr,
                                        sc, H, L, n, 0, h, hwn, hwp)
                    # (3) blank
                    nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                    c_hwn, c_hwp, nc, best, thr,
                                    S + row[blank], H, L, blank, 1, h, hwn, hwp)
                else:
                    for r in range(k_tok):
                        n = top[r]
                        sc = S + row[n]
                        if n == sil:
                            sc += sil_score
                        n0 = nc
                        if n != blank and (n != p or pb):
                            nhwn, nhwp, dhw = hwn, hwp, 0.0
                            if has_hw:
                                nhwn, nhwp, dhw = _hw_step(hw_col, hw_goto, hw_par, hw_cum,
                                                           hw_term, hwn, hwp, n)
                            if has_lm:     # the history node caches the LM score
                                nh, n_hist = _hist_child(h_parent, h_unit, h_lm, h_lmscore,
                                                         h_table, n_hist, H, n, unit_lm, has_lm,
                                                         lm_keys, lm_probs, lm_nexts, lm_mask,
                                                         lm_nw, lm_bo, lm_par)
                                nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                                c_hwn, c_hwp, nc, best, thr,
                                                sc + lm_weight * h_lmscore[nh] + dhw,
                                                nh, 0, n, 0, h, nhwn, nhwp)
                                if nc > n0:
                                    c_base[n0] = nh
                            else:
                                # no LM: the history H + n is created only if the candidate
                                # survives; its key is (H, n, not blank), which a repeat of n
                                # at H + n shares (see below)
                                nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                                c_hwn, c_hwp, nc, best, thr,
                                                sc + dhw, H, 0, n, 0, h, nhwn, nhwp)
                                if nc > n0:
                                    c_base[n0] = -2 - H
                        elif n == blank:
                            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                            c_hwn, c_hwp, nc, best, thr,
                                            sc, H, 0, n, 1, h, hwn, hwp)
                            if nc > n0:
                                c_base[n0] = H
                        else:
                            # a repeat of n: the history H ends with n; without an LM its key
                            # is (parent of H, n), the key of the candidate that created H
                            key = H if has_lm else h_parent[H]
                            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par,
                                            c_hwn, c_hwp, nc, best, thr,
                                            sc, key, 0, n, 0, h, hwn, hwp)
                            if nc > n0:
                                c_base[n0] = H
            kept, scores = _store(c_score, c_hist, c_lex, c_tok, c_blank, nc, best, thr, beam,
                                  log_add, m_table, m_rep, m_score)
            n_hyp = kept.shape[0]
            y_score = scores
            y_hist = np.empty(n_hyp, np.int64)
            y_lex = np.empty(n_hyp, np.int64)
            y_tok = np.empty(n_hyp, np.int64)
            y_blank = np.empty(n_hyp, np.int64)
            y_hwn = np.empty(n_hyp, np.int64)
            y_hwp = np.empty(n_hyp, np.float64)
            for j in range(n_hyp):
                c = kept[j]
                if lexicon:
                    y_hist[j] = c_hist[c]
                else:
                    hb = c_base[c]
                    if hb < 0:
                        hb, n_hist = _hist_child(h_parent, h_unit, h_lm, h_lmscore, h_table,
                                                 n_hist, -2 - hb, c_tok[c], unit_lm, has_lm,
                                                 lm_keys, lm_probs, lm_nexts, lm_mask, lm_nw,
                                                 lm_bo, lm_par)
                    y_hist[j] = hb
                y_lex[j] = c_lex[c]
                y_tok[j] = c_tok[c]
                y_blank[j] = c_blank[c]
                y_hwn[j] = c_hwn[c]
                y_hwp[j] = c_hwp[c]
                p_tok[t + 1, j] = c_tok[c]
                p_par[t + 1, j] = c_par[c]
        # the end of the utterance: </s>, the end silence, unfinished hotwords taken back
        nice = False
        if lexicon:
            for h in range(n_hyp):
                if y_lex[h] == 0:
                    nice = True
                    break
        nc = 0
        best = -np.inf
        for h in range(n_hyp):
            if nice and y_lex[h] != 0:
                continue
            sc = y_score[h]
            if has_hw:
                fhwp = y_hwp[h]
                if not lexicon:     # the end silence ends a phrase spelled up to its last token
                    _, fhwp, dhw = _hw_step(hw_col, hw_goto, hw_par, hw_cum, hw_term, y_hwn[h],
                                            fhwp, sil)
                    sc += dhw
                sc -= fhwp          # an unfinished phrase earns nothing
            if has_lm:
                fp, _ = lm_score(lm_keys, lm_probs, lm_nexts, lm_mask, lm_nw, lm_bo, lm_par,
                                 h_lm[y_hist[h]], eos_lm)
                sc += lm_weight * fp
            nc, best = _add(c_score, c_hist, c_lex, c_tok, c_blank, c_par, c_hwn, c_hwp,
                            nc, best, thr, sc, y_hist[h], y_lex[h], sil, 0, h, 0, 0.0)
        kept, scores = _store(c_score, c_hist, c_lex, c_tok, c_blank, nc, best, thr, beam,
                              log_add, m_table, m_rep, m_score)
        n_out = min(kept.shape[0], nbest)
        out_n[b] = n_out
        for j in range(n_out):
            c = kept[j]
            out_score[b, j] = scores[j]
            out_path[b, j, T + 1] = sil
            i = c_par[c]
            for f in range(T, -1, -1):
                out_path[b, j, f] = p_tok[f, i]
                i = p_par[f, i]
            nw = 0
            if lexicon:
                node = c_hist[c]
                while node > 0:
                    nw += 1
                    node = h_parent[node]
                node = c_hist[c]
                q = nw
                while node > 0:
                    q -= 1
                    out_words[b, j, q] = h_unit[node]
                    node = h_parent[node]
            out_nwords[b, j] = nw


@numba.njit(cache=True, nogil=True)
def lm_fill(keys, probs, nexts, ks, ps, ns):
    """Insert the n-gram entries ``ks`` (state * n_words + word) into the hash table."""
    mask = keys.shape[0] - 1
    for e in range(ks.shape[0]):
        key = ks[e]
        i = _mix(key, 0, 0, 0) & mask
        while keys[i] != _EMPTY and keys[i] != key:
            i = (i + 1) & mask
        keys[i] = key
        probs[i] = ps[e]
        nexts[i] = ns[e]
