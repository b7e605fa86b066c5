"""The numba kernel of the CTC prefix beam search (see ``ctc_beam`` for the semantics).

Everything here works on flat arrays built once per decoder by ``ctc_beam``:

* the lexicon trie in CSR form (``ch_start``/``ch_token``/``ch_node`` children per node,
  ``lab_start``/``lab_word`` the words ending at a node, ``smear`` the node's look-ahead
  score, as float32 like flashlight's ``TrieNode::maxScore``);
* the n-gram LM as an open-addressing hash table keyed by ``(context state, word)`` with the
  log10 probability and the next state, plus each state's backoff weight and backoff state;
* the hotword automaton (Aho-Corasick: a trie with failure links) as a dense transition
  table over the units the hotwords use, with each state's ``credit`` (the partial bonus of
  the phrases it is an unfinished prefix of) and ``out`` (the weights of every phrase that
  ends there, through the output links).

Per utterance the search keeps, per frame, at most ``beam`` hypotheses and one parent
pointer per kept hypothesis (arrays grown as the search uses them, never ``beam x C`` up
front); histories (the word sequence with a lexicon, the token sequence without) are nodes
of a trie built on the fly, so that two hypotheses with the same history share one node id
and the LM is queried once per node.  Nodes no hypothesis reaches any more are collected
now and then (``_hist_collect``), so memory is bounded by the beam, not by ``T``.

One frame is: ``_frame_tokens`` (the tokens tried), ``_expand_lexicon`` or
``_expand_free`` per hypothesis (each proposes candidates through ``_add``), ``_store``
(merge equal states, prune, keep the beam), ``_keep`` (the kept candidates become the
hypotheses); the utterance ends with ``_finish`` and ``_write_out``.
"""
from __future__ import annotations

import numba
import numpy as np

from .._numerics import HELPER

_EMPTY = -1
_MUL1 = 0x9E3779B97F4A7C15 - (1 << 64)   # int64 multipliers (wrapping arithmetic)
_MUL2 = 0xC2B2AE3D27D4EB4F - (1 << 64)
_MUL3 = 0x165667B19E3779F9

# columns of a hypothesis or candidate row (``y_int``/``c_int``): its history node, lexicon
# trie node, last token, whether that was blank, hotword state; candidates also keep their
# parent hypothesis and (lexicon-free) the history node to take when kept (see _expand_free)
_HIST, _LEX, _TOK, _BLANK, _HWN, _PAR, _BASE = 0, 1, 2, 3, 4, 5, 6
_NCOL = 7
# columns of a history node (``h_int``): parent node, unit (word or token), LM state
_HPAR, _HUNIT, _HLM = 0, 1, 2
_GC_MIN = 1 << 16      # history nodes before the first collection of unreachable ones


@numba.njit(inline="always")
def _mix(a, b, c, d):
    h = np.int64(a) * np.int64(_MUL1) + np.int64(b) * np.int64(_MUL2)
    h = (h ^ (h >> 29)) + np.int64(c) * np.int64(_MUL3) + np.int64(d)
    h = h * np.int64(_MUL1)
    return h ^ (h >> 32)


# --------------------------------------------------------------------------- the n-gram LM

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


# --------------------------------------------------------------------------- hotwords

@numba.njit(inline="always")
def _hw_step(hw, node, x):
    """Advance the hotword automaton ``hw = (col, goto, credit, out)`` by unit ``x``:
    (new state, bonus delta).  The delta adds the weight of every phrase that ends here
    (``out``: the state's own phrase and, through the output links, its suffixes) and
    moves the partial credit from the old state's to the new one's (an abandoned prefix's
    credit is taken back)."""
    col, goto, credit, out = hw
    c = np.int64(goto[node, col[x]])
    return c, out[c] + credit[c] - credit[node]


# --------------------------------------------------------------------------- histories

@numba.njit(**HELPER)
def _hist_new(cap, start_state):
    """An empty history trie: node 0 is the empty history (LM state ``start_state``)."""
    h_int = np.empty((cap, 3), np.int32)
    h_score = np.empty(cap, np.float64)
    h_table = np.full(2 * cap, -1, np.int32)
    h_int[0, _HPAR] = -1
    h_int[0, _HUNIT] = -1
    h_int[0, _HLM] = start_state
    h_score[0] = 0.0
    return h_int, h_score, h_table


@numba.njit(**HELPER)
def _hist_index(h_int, h_table, n_hist):
    """(Re)build the hash table ``(parent, unit) -> node`` of nodes ``1 .. n_hist - 1``."""
    mask = h_table.shape[0] - 1
    for i in range(h_table.shape[0]):
        h_table[i] = -1
    for n in range(1, n_hist):
        i = _mix(h_int[n, _HPAR], h_int[n, _HUNIT], 7, 0) & mask
        while h_table[i] >= 0:
            i = (i + 1) & mask
        h_table[i] = n


@numba.njit(**HELPER)
def _hist_reserve(h_int, h_score, h_table, n_hist, need):
    """The history arrays with room for ``need`` more nodes (doubled when short)."""
    if n_hist + need < h_int.shape[0]:
        return h_int, h_score, h_table
    cap = h_int.shape[0]
    while n_hist + need >= cap:
        cap *= 2
    i2 = np.empty((cap, 3), np.int32)
    s2 = np.empty(cap, np.float64)
    i2[:n_hist] = h_int[:n_hist]
    s2[:n_hist] = h_score[:n_hist]
    t2 = np.empty(2 * cap, np.int32)
    _hist_index(i2, t2, n_hist)
    return i2, s2, t2


@numba.njit(**HELPER)
def _hist_collect(h_int, h_score, h_table, n_hist, y_int, n_hyp):
    """Drop the history nodes that are no ancestor of a live hypothesis (a history is
    created for every candidate, and most candidates are pruned); nodes keep their order
    (a parent before its children) and ``y_int``'s history column is renumbered.  Returns
    the new node count."""
    live = np.zeros(n_hist, np.bool_)
    live[0] = True
    for h in range(n_hyp):
        n = y_int[h, _HIST]
        while n > 0 and not live[n]:
            live[n] = True
            n = h_int[n, _HPAR]
    new_id = np.empty(n_hist, np.int32)
    m = 0
    for n in range(n_hist):
        if live[n]:
            new_id[n] = m
            if m != n:
                h_int[m, _HPAR] = new_id[h_int[n, _HPAR]]
                h_int[m, _HUNIT] = h_int[n, _HUNIT]
                h_int[m, _HLM] = h_int[n, _HLM]
                h_score[m] = h_score[n]
            m += 1
    for h in range(n_hyp):
        y_int[h, _HIST] = new_id[y_int[h, _HIST]]
    _hist_index(h_int, h_table, m)
    return m


@numba.njit(**HELPER)
def _hist_child(h_int, h_score, h_table, n_hist, parent, unit, lm, lm_nw, has_lm):
    """Node id of history ``parent + unit`` (created, with its LM score, when new), and
    the new node count.  ``lm = (unit_lm, keys, probs, nexts, bo, backoff parent)``."""
    mask = h_table.shape[0] - 1
    i = _mix(parent, unit, 7, 0) & mask
    while True:
        n = h_table[i]
        if n < 0:
            break
        if h_int[n, _HPAR] == parent and h_int[n, _HUNIT] == unit:
            return n, n_hist
        i = (i + 1) & mask
    n = n_hist
    h_table[i] = n
    h_int[n, _HPAR] = parent
    h_int[n, _HUNIT] = unit
    if has_lm:
        unit_lm, keys, probs, nexts, bo, lpar = lm
        p, s = lm_score(keys, probs, nexts, keys.shape[0] - 1, lm_nw, bo, lpar,
                        h_int[parent, _HLM], unit_lm[unit])
        h_score[n] = p
        h_int[n, _HLM] = s
    else:
        h_score[n] = 0.0
        h_int[n, _HLM] = 0
    return n, n_hist + 1


# --------------------------------------------------------------------------- candidates

@numba.njit(**HELPER)
def _cands_reserve(c_score, c_int, m_table, m_rep, m_score, need):
    """The candidate store with room for ``need`` candidates (doubled when short)."""
    if need <= c_score.shape[0]:
        return c_score, c_int, m_table, m_rep, m_score
    cap = c_score.shape[0]
    while cap < need:
        cap *= 2
    m_size = m_table.shape[0]
    while m_size < 2 * cap:
        m_size *= 2
    return (np.empty(cap, np.float64), np.empty((cap, _NCOL), np.int64),
            np.empty(m_size, np.int64), np.empty(cap, np.int64), np.empty(cap, np.float64))


@numba.njit(inline="always")
def _add(c_score, c_int, nc, best, thr, score, hist, lex, tok, blank, hwn, par):
    """flashlight's candidatesAdd: keep a candidate within ``thr`` of the best so far."""
    if score >= best:
        best = score
    if score >= best - thr:
        c_score[nc] = score
        c_int[nc, _HIST] = hist
        c_int[nc, _LEX] = lex
        c_int[nc, _TOK] = tok
        c_int[nc, _BLANK] = blank
        c_int[nc, _HWN] = hwn
        c_int[nc, _PAR] = par
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


@numba.njit(inline="always")
def _same_state(c_int, a, b):
    return (c_int[a, _HIST] == c_int[b, _HIST] and c_int[a, _LEX] == c_int[b, _LEX]
            and c_int[a, _TOK] == c_int[b, _TOK] and c_int[a, _BLANK] == c_int[b, _BLANK])


@numba.njit(**HELPER)
def _store(c_score, c_int, nc, best, thr, beam, log_add, m_table, m_rep, m_score):
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
        i = _mix(c_int[c, _HIST], c_int[c, _LEX], c_int[c, _TOK], c_int[c, _BLANK]) & mask
        while True:
            r = m_table[i]
            if r < 0:
                m_table[i] = n_rep
                m_rep[n_rep] = c
                m_score[n_rep] = s
                n_rep += 1
                break
            rc = m_rep[r]
            if _same_state(c_int, rc, c):
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


# --------------------------------------------------------------------------- one frame

@numba.njit(**HELPER)
def _frame_tokens(row, n_cls, k_tok, allowed, top):
    """Mark the ``k_tok`` best of the ``n_cls`` tokens in ``allowed`` and list them in
    ``top`` (best first; all tokens in order when ``k_tok >= n_cls``).  Classes past the
    tokens (a model's padded vocabulary) are never tried."""
    if k_tok < n_cls:
        idx = np.argsort(-row[:n_cls], kind="mergesort")
        for c in range(n_cls):
            allowed[c] = False
        for r in range(k_tok):
            allowed[idx[r]] = True
            top[r] = idx[r]
    else:
        for c in range(n_cls):
            allowed[c] = True
            top[c] = c


@numba.njit(**HELPER)
def _expand_lexicon(h, S, yi, row, allowed, pf, pi, trie, lm, hw, h_int, h_score, h_table,
                    n_hist, c_score, c_int, nc, best):
    """flashlight's LexiconDecoder step for hypothesis ``h`` (score ``S``, row ``yi``):
    (1) each allowed child token of its trie node, and every word that ends there;
    (2) the same node again (a repeated token; at the root, silence, or the repeat of the
    last token of the word just finished); (3) blank.  Returns (nc, best, n_hist)."""
    lm_weight, word_score, unk_score, sil_score, thr = pf[0], pf[1], pf[2], pf[3], pf[4]
    blank, sil, unk_word, lm_nw = pi[2], pi[3], pi[4], pi[13]
    has_lm, has_hw = pi[7] != 0, pi[12] != 0
    ch_start, ch_token, ch_node, lab_start, lab_word, smear = trie
    H, L, p, pb, hwn = yi[_HIST], yi[_LEX], yi[_TOK], yi[_BLANK] != 0, yi[_HWN]
    lex_max = 0.0 if L == 0 else np.float64(smear[L])
    for j in range(ch_start[L], ch_start[L + 1]):
        n = ch_token[j]
        if not allowed[n] or not (pb or n != p):
            continue    # a repeat without blank is no new token (CTC)
        child = ch_node[j]
        sc = S + row[n]
        if n == sil:
            sc += sil_score
        if ch_start[child + 1] > ch_start[child]:
            nc, best = _add(c_score, c_int, nc, best, thr,
                            sc + lm_weight * (np.float64(smear[child]) - lex_max),
                            H, child, n, 0, hwn, h)
        n_lab = lab_start[child + 1] - lab_start[child]
        for q in range(max(n_lab, 1)):          # each word ending here, else <unk>
            if q < n_lab:
                w = lab_word[lab_start[child] + q]
                bonus = word_score
            elif unk_score > -np.inf:     # no word: an unknown word, if allowed
                w = unk_word
                bonus = unk_score
            else:
                break
            nh, n_hist = _hist_child(h_int, h_score, h_table, n_hist, H, w, lm, lm_nw, has_lm)
            nhwn, dhw = hwn, 0.0
            if has_hw:       # with a lexicon the hotword automaton reads words
                nhwn, dhw = _hw_step(hw, hwn, w)
            nc, best = _add(c_score, c_int, nc, best, thr,
                            sc + lm_weight * (h_score[nh] - lex_max) + bonus + dhw,
                            nh, 0, n, 0, nhwn, h)
    if (not pb) or L == 0:
        n = sil if L == 0 else p
        sc = S + row[n]
        if n == sil:
            sc += sil_score
        nc, best = _add(c_score, c_int, nc, best, thr, sc, H, L, n, 0, hwn, h)
        if L == 0 and not pb and p != sil:
            # the last token of the word just finished, one more frame (the word's best
            # alignment when spellings do not end in the separator)
            nc, best = _add(c_score, c_int, nc, best, thr, S + row[p], H, 0, p, 0, hwn, h)
    nc, best = _add(c_score, c_int, nc, best, thr, S + row[blank], H, L, blank, 1, hwn, h)
    return nc, best, n_hist


@numba.njit(**HELPER)
def _expand_free(h, S, yi, row, top, pf, pi, lm, hw, h_int, h_score, h_table, n_hist,
                 c_score, c_int, nc, best):
    """flashlight's LexiconFreeDecoder step for hypothesis ``h``: each of the frame's
    tokens (a new token, a repeat, or blank).  With an LM a new token's history node is
    looked up now (it caches the LM score); without one it is created only for the
    candidates kept (``_BASE`` = -2 - parent history), and a repeat's merge key is the key
    of the candidate that created its history.  Returns (nc, best, n_hist)."""
    lm_weight, sil_score, thr = pf[0], pf[3], pf[4]
    k_tok, blank, sil, lm_nw = pi[1], pi[2], pi[3], pi[13]
    has_lm, has_hw = pi[7] != 0, pi[12] != 0
    H, p, pb, hwn = yi[_HIST], yi[_TOK], yi[_BLANK] != 0, yi[_HWN]
    for r in range(k_tok):
        n = top[r]
        sc = S + row[n]
        if n == sil:
            sc += sil_score
        n0 = nc
        if n != blank and (n != p or pb):
            nhwn, dhw = hwn, 0.0
            if has_hw:
                nhwn, dhw = _hw_step(hw, hwn, n)
            if has_lm:
                nh, n_hist = _hist_child(h_int, h_score, h_table, n_hist, H, n, lm, lm_nw,
                                         has_lm)
                nc, best = _add(c_score, c_int, nc, best, thr,
                                sc + lm_weight * h_score[nh] + dhw, nh, 0, n, 0, nhwn, h)
                base = nh
            else:
                nc, best = _add(c_score, c_int, nc, best, thr, sc + dhw, H, 0, n, 0, nhwn, h)
                base = -2 - H
        elif n == blank:
            nc, best = _add(c_score, c_int, nc, best, thr, sc, H, 0, n, 1, hwn, h)
            base = H
        else:
            key = H if has_lm else h_int[H, _HPAR]
            nc, best = _add(c_score, c_int, nc, best, thr, sc, key, 0, n, 0, hwn, h)
            base = H
        if nc > n0:
            c_int[n0, _BASE] = base
    return nc, best, n_hist


@numba.njit(**HELPER)
def _keep(kept, c_int, lexicon, lm, lm_nw, has_lm, h_int, h_score, h_table, n_hist,
          p_tok, p_par, off):
    """The kept candidates become the frame's hypotheses (rows of ``y_int``); their tokens
    and parents are appended to the back-pointer arrays at ``off``.  Returns
    (y_int, n_hist)."""
    n_hyp = kept.shape[0]
    y_int = np.empty((n_hyp, _NCOL), np.int64)
    for j in range(n_hyp):
        c = kept[j]
        for k in range(_NCOL):
            y_int[j, k] = c_int[c, k]
        if not lexicon:
            hb = c_int[c, _BASE]
            if hb < 0:
                hb, n_hist = _hist_child(h_int, h_score, h_table, n_hist, -2 - hb,
                                         c_int[c, _TOK], lm, lm_nw, has_lm)
            y_int[j, _HIST] = hb
        p_tok[off + j] = c_int[c, _TOK]
        p_par[off + j] = c_int[c, _PAR]
    return y_int, n_hist


@numba.njit(**HELPER)
def _grow_paths(p_tok, p_par, need):
    if need <= p_tok.shape[0]:
        return p_tok, p_par
    cap = max(16, 2 * p_tok.shape[0])
    while cap < need:
        cap *= 2
    t2 = np.empty(cap, np.int32)
    q2 = np.empty(cap, np.int32)
    t2[:p_tok.shape[0]] = p_tok
    q2[:p_par.shape[0]] = p_par
    return t2, q2


# --------------------------------------------------------------------------- the end

@numba.njit(**HELPER)
def _finish(y_score, y_int, pf, pi, lm, hw, h_int, c_score, c_int):
    """The end of the utterance: with a lexicon only hypotheses at a word boundary (if
    any), the LM's ``</s>``, unfinished hotwords taken back; the end silence.  Returns the
    candidates' count and best score."""
    lm_weight, thr = pf[0], pf[4]
    sil, eos_lm, lm_nw = pi[3], pi[10], pi[13]
    lexicon, has_lm, has_hw = pi[5] != 0, pi[7] != 0, pi[12] != 0
    n_hyp = y_int.shape[0]
    nice = False
    if lexicon:
        for h in range(n_hyp):
            if y_int[h, _LEX] == 0:
                nice = True
                break
    nc = 0
    best = -np.inf
    for h in range(n_hyp):
        if nice and y_int[h, _LEX] != 0:
            continue
        sc = y_score[h]
        if has_hw:
            node = y_int[h, _HWN]
            if not lexicon:     # the end silence ends a phrase spelled up to its last token
                node, dhw = _hw_step(hw, node, sil)
                sc += dhw
            sc -= hw[2][node]          # an unfinished phrase earns nothing
        if has_lm:
            _, keys, probs, nexts, bo, lpar = lm
            fp, _ = lm_score(keys, probs, nexts, keys.shape[0] - 1, lm_nw, bo, lpar,
                             h_int[y_int[h, _HIST], _HLM], eos_lm)
            sc += lm_weight * fp
        nc, best = _add(c_score, c_int, nc, best, thr, sc, y_int[h, _HIST], y_int[h, _LEX],
                        sil, 0, 0, h)
    return nc, best


@numba.njit(**HELPER)
def _write_out(b, T, kept, scores, nbest, sil, lexicon, c_int, h_int, p_tok, p_par, p_off,
               out_n, out_score, out_path, out_words, out_nwords):
    """Write the ``nbest`` best: score, per-frame tokens (back-pointers) and words."""
    n_out = min(kept.shape[0], nbest)
    out_n[b] = n_out
    for j in range(n_out):
        c = kept[j]
        out_score[b, j] = scores[j]
        out_path[b, j, T + 1] = sil
        i = c_int[c, _PAR]
        for f in range(T, -1, -1):
            out_path[b, j, f] = p_tok[p_off[f] + i]
            i = p_par[p_off[f] + i]
        nw = 0
        if lexicon:
            node = c_int[c, _HIST]
            while node > 0:
                nw += 1
                node = h_int[node, _HPAR]
            node = c_int[c, _HIST]
            q = nw
            while node > 0:
                q -= 1
                out_words[b, j, q] = h_int[node, _HUNIT]
                node = h_int[node, _HPAR]
        out_nwords[b, j] = nw


# --------------------------------------------------------------------------- the search

@numba.njit(cache=True, nogil=True)
def decode_batch(order, em, lengths, pf, pi,
                 ch_start, ch_token, ch_node, lab_start, lab_word, smear,
                 unit_lm, lm_keys, lm_probs, lm_nexts, lm_bo, lm_par,
                 hw_col, hw_goto, hw_credit, hw_out,
                 out_n, out_score, out_path, out_words, out_nwords):
    """Decode the utterances listed in ``order``.

    Per utterance ``b``: ``out_n[b]`` hypotheses, best first, their scores
    ``out_score[b, :n]``, their per-frame tokens ``out_path[b, :n, :T+2]`` (frames 0 and
    T+1 are the start and end silence, as flashlight reports them) and, with a lexicon,
    their words ``out_words[b, j, :out_nwords[b, j]]`` (decoder word ids).
    """
    thr = pf[4]
    beam, k_tok, sil, lexicon, log_add = pi[0], pi[1], pi[3], pi[5] != 0, pi[6] != 0
    has_lm, nbest, max_lab, start_state, lm_nw = pi[7] != 0, pi[8], pi[9], pi[11], pi[13]
    hw_init, n_cls = pi[14], pi[15]
    trie = (ch_start, ch_token, ch_node, lab_start, lab_word, smear)
    lm = (unit_lm, lm_keys, lm_probs, lm_nexts, lm_bo, lm_par)
    hw = (hw_col, hw_goto, hw_credit, hw_out)
    per_hyp = k_tok * (2 + max_lab) + 3 if lexicon else k_tok
    c_score, c_int, m_table, m_rep, m_score = _cands_reserve(
        np.empty(1), np.empty((1, _NCOL), np.int64), np.empty(2, np.int64),
        np.empty(1, np.int64), np.empty(1), per_hyp + 1)
    allowed = np.zeros(n_cls, np.bool_)
    top = np.empty(n_cls, np.int64)
    for oi in range(order.shape[0]):
        b = order[oi]
        T = lengths[b]
        h_int, h_score, h_table = _hist_new(1024, start_state)
        n_hist = 1
        gc_at = _GC_MIN
        y_score = np.zeros(1, np.float64)
        y_int = np.zeros((1, _NCOL), np.int64)
        y_int[0, _TOK] = sil                 # the search starts in silence
        y_int[0, _HWN] = hw_init
        # back-pointers: frame f's hypotheses at p_off[f] ...; grown as used
        p_off = np.empty(T + 2, np.int64)
        p_tok, p_par = _grow_paths(np.empty(0, np.int32), np.empty(0, np.int32),
                                   (T + 2) * min(beam, 16))
        p_tok[0] = sil
        p_par[0] = -1
        p_off[0] = 0
        for t in range(T):
            n_hyp = y_int.shape[0]
            if n_hist > gc_at:
                n_hist = _hist_collect(h_int, h_score, h_table, n_hist, y_int, n_hyp)
                gc_at = max(_GC_MIN, 2 * n_hist)
            h_int, h_score, h_table = _hist_reserve(h_int, h_score, h_table, n_hist,
                                                    n_hyp * per_hyp + 1)
            c_score, c_int, m_table, m_rep, m_score = _cands_reserve(
                c_score, c_int, m_table, m_rep, m_score, n_hyp * per_hyp + 1)
            row = em[b, t]
            _frame_tokens(row, n_cls, k_tok, allowed, top)
            nc = 0
            best = -np.inf
            for h in range(n_hyp):
                if lexicon:
                    nc, best, n_hist = _expand_lexicon(
                        h, y_score[h], y_int[h], row, allowed, pf, pi, trie, lm, hw,
                        h_int, h_score, h_table, n_hist, c_score, c_int, nc, best)
                else:
                    nc, best, n_hist = _expand_free(
                        h, y_score[h], y_int[h], row, top, pf, pi, lm, hw,
                        h_int, h_score, h_table, n_hist, c_score, c_int, nc, best)
            kept, y_score = _store(c_score, c_int, nc, best, thr, beam, log_add,
                                   m_table, m_rep, m_score)
            p_off[t + 1] = p_off[t] + n_hyp
            p_tok, p_par = _grow_paths(p_tok, p_par, p_off[t + 1] + kept.shape[0])
            y_int, n_hist = _keep(kept, c_int, lexicon, lm, lm_nw, has_lm, h_int, h_score,
                                  h_table, n_hist, p_tok, p_par, p_off[t + 1])
        nc, best = _finish(y_score, y_int, pf, pi, lm, hw, h_int, c_score, c_int)
        kept, scores = _store(c_score, c_int, nc, best, thr, beam, log_add,
                              m_table, m_rep, m_score)
        _write_out(b, T, kept, scores, nbest, sil, lexicon, c_int, h_int, p_tok, p_par, p_off,
                   out_n, out_score, out_path, out_words, out_nwords)
