r"""Decoding-graph builders: a lexicon transducer ``L`` and an ARPA grammar acceptor ``G``.

Both are re-exported by [`duoloss.graphs`][duoloss.graphs] (the public names); they build
``duoloss.gtn.Graph``s for [`graph_decode`][duoloss.torch.graph_decode] and every
``duoloss.gtn`` operation.  Weights are natural logarithms (larger is better), as every
duoloss graph: an ARPA score ``log10 p`` becomes the arc weight ``log10 p * ln 10``.

NB: this module never imports torch or jax.
"""
from __future__ import annotations

import math
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from duoloss.core.graph.graph import EPSILON, Graph

from .arpa import ArpaLM, read_arpa
from .lexicon import read_lexicon

__all__ = ["lexicon_graph", "arpa_graph"]

LN10 = math.log(10.0)

Lexicon = Union[str, "os.PathLike[str]", Mapping[str, Sequence[Sequence[Union[int, str]]]],
                Sequence[Tuple[str, Sequence[Sequence[Union[int, str]]]]]]


def _from_lists(n, src, dst, il, ol, w, start, accept) -> Graph:
    return Graph._from_trusted(
        int(n), np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(il, np.int64),
        np.asarray(ol, np.int64), np.asarray(w, np.float32),
        _flags(n, start), _flags(n, accept), False)


def _flags(n, ids):
    f = np.zeros(int(n), np.bool_)
    f[np.asarray(ids, np.int64)] = True
    return f


def _token_id(fn, tok, index, n_tok, word):
    if isinstance(tok, str):
        if index is None:
            raise TypeError(f"{fn}: the word {word!r} is spelled with the token {tok!r} (a str) "
                            "but argument 'tokens' is None; give 'tokens' or token ids")
        if tok not in index:
            raise ValueError(f"{fn}: the word {word!r} is spelled with the token {tok!r}, which "
                             "is not in argument 'tokens'")
        return index[tok]
    if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)):
        raise TypeError(f"{fn}: the spelling of {word!r} must hold token ids (int) or tokens "
                        f"(str), got {type(tok).__name__}")
    t = int(tok)
    if t < 0 or (n_tok is not None and t >= n_tok):
        hi = f"[0, {n_tok})" if n_tok is not None else ">= 0"
        raise ValueError(f"{fn}: the word {word!r} is spelled with token id {t}; ids must lie "
                         f"in {hi}")
    return t


def _token_index(fn, tokens):
    if tokens is None:
        return None, None
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{fn}: argument 'tokens' must be a sequence of str (id -> token) or "
                        f"None, got {type(tokens).__name__}")
    index: Dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise TypeError(f"{fn}: argument 'tokens' must be a sequence of str, got an item of "
                            f"type {type(t).__name__} at index {i}")
        index.setdefault(t, i)
    return index, len(tokens)


def _word_ids(fn, words):
    if words is None:
        return None
    if isinstance(words, (str, bytes)) or not isinstance(words, Sequence):
        raise TypeError(f"{fn}: argument 'words' must be a sequence of str (id -> word) or "
                        f"None, got {type(words).__name__}")
    out: Dict[str, int] = {}
    for i, w in enumerate(words):
        if not isinstance(w, str):
            raise TypeError(f"{fn}: argument 'words' must be a sequence of str, got an item of "
                            f"type {type(w).__name__} at index {i}")
        out.setdefault(w, i)
    return out


def lexicon_graph(lexicon: Lexicon, tokens: Optional[Sequence[str]] = None, *,
                  words: Optional[Sequence[str]] = None, sil: Union[int, str, None] = None,
                  sil_weight: float = 0.0) -> Graph:
    r"""Lexicon transducer ``L``: token ids in, word ids out (Kaldi's ``L.fst``).

    One start and accept node (the word boundary); each spelling ``t1 ... tk`` of a word
    ``w`` is a loop on it, ``t1:w``, ``t2:ε``, ..., ``tk:ε`` (the word is emitted on its
    first token, so that ``compose(L, G)`` stays the size of ``G`` times the spelling
    lengths; its timestep in [`graph_decode`][duoloss.torch.graph_decode] is the frame
    where the word starts).  Every arc weighs 0.  With ``sil``, a self-loop ``sil:ε`` of
    weight ``sil_weight`` on the boundary node makes silence optional between words (a
    flashlight lexicon usually spells ``|`` at the end of each word instead).  No
    disambiguation symbols are added: [`graph_decode`][duoloss.torch.graph_decode]
    searches nondeterministic graphs as they are (no determinisation needed).

    Args:
      lexicon: a flashlight-format lexicon file (``word t o k e n s |`` per line, several
        lines per word allowed; read with ``duoloss.core.decoding.read_lexicon``, which
        needs ``tokens``), a dict ``{word: [spelling, ...]}`` or a list of
        ``(word, [spelling, ...])`` pairs; a spelling is a sequence of token ids (int) or
        tokens (str, looked up in ``tokens``).
      tokens: the classes, id -> token (e.g. the ``tokens`` of ``ctc_decoder``); needed for
        a file or str spellings; when given, token ids must lie in ``[0, len(tokens))``.
      words: the output word ids, id -> word (e.g. ``arpa_graph``'s vocabulary, so that
        ``L`` and ``G`` agree); a word of the lexicon that is not in ``words`` is left out.
        ``None``: ids in the lexicon's order (first appearance).
      sil: an optional silence token (id or str) that may appear between words.
      sil_weight: the weight of the silence loop (natural log).

    Returns:
      A transducer ``Graph`` (weights 0 but the silence loop).

    Raises:
      TypeError/ValueError: naming ``lexicon_graph`` and the argument, or the file and
        line (from ``read_lexicon``); an empty spelling; a token that is not in ``tokens``.

    Examples:
        >>> from duoloss.graphs import lexicon_graph
        >>> L = lexicon_graph({"ab": [[1, 2]], "b": [[2]]})
        >>> L.num_nodes(), L.num_arcs()   # the boundary node, one extra node for "ab"
        (2, 3)
        >>> L.labels_to_list(), L.labels_to_list(False)   # tokens in, word ids out (-1: epsilon)
        ([1, 2, 2], [0, -1, 1])
    """
    fn = "lexicon_graph"
    index, n_tok = _token_index(fn, tokens)
    if isinstance(lexicon, (str, os.PathLike)):
        if tokens is None:
            raise TypeError(f"{fn}: reading the lexicon file {os.fspath(lexicon)!r} needs "
                            "argument 'tokens' (id -> token), got None")
        entries = read_lexicon(lexicon, list(tokens))
    elif isinstance(lexicon, Mapping):
        entries = list(lexicon.items())
    elif isinstance(lexicon, Sequence) and not isinstance(lexicon, bytes):
        entries = list(lexicon)
        for e in entries:
            if not (isinstance(e, (tuple, list)) and len(e) == 2):
                raise TypeError(f"{fn}: argument 'lexicon' as a list must hold (word, spellings) "
                                f"pairs, got an item {e!r}")
    else:
        raise TypeError(f"{fn}: argument 'lexicon' must be a file path, a dict "
                        f"{{word: spellings}} or a list of (word, spellings), got "
                        f"{type(lexicon).__name__}")
    wmap = _word_ids(fn, words)
    if wmap is None:
        wmap = {}
        for w, _ in entries:
            wmap.setdefault(w, len(wmap))
    src: List[int] = []
    dst: List[int] = []
    il: List[int] = []
    ol: List[int] = []
    wt: List[float] = []
    n = 1
    for word, spellings in entries:
        if not isinstance(word, str):
            raise TypeError(f"{fn}: words of argument 'lexicon' must be str, got "
                            f"{type(word).__name__}")
        if isinstance(spellings, (str, bytes)) or not isinstance(spellings, Sequence):
            raise TypeError(f"{fn}: the spellings of {word!r} must be a list of token "
                            f"sequences, got {type(spellings).__name__}")
        for sp in spellings:
            if isinstance(sp, (str, bytes)) or not isinstance(sp, Sequence):
                raise TypeError(f"{fn}: a spelling of {word!r} must be a sequence of token ids "
                                f"or tokens, got {type(sp).__name__}")
            ids = [_token_id(fn, t, index, n_tok, word) for t in sp]
            if not ids:
                raise ValueError(f"{fn}: the word {word!r} has an empty spelling")
            if word not in wmap:
                continue
            prev = 0
            for k, t in enumerate(ids):
                nxt = 0 if k == len(ids) - 1 else n
                if nxt:
                    n += 1
                src.append(prev)
                dst.append(nxt)
                il.append(t)
                ol.append(wmap[word] if k == 0 else EPSILON)
                wt.append(0.0)
                prev = nxt
    if sil is not None:
        s = _token_id(fn, sil, index, n_tok, "<sil>")
        try:
            sw = float(sil_weight)
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: argument 'sil_weight' must be a float, got "
                            f"{type(sil_weight).__name__}") from None
        src.append(0)
        dst.append(0)
        il.append(s)
        ol.append(EPSILON)
        wt.append(sw)
    return _from_lists(n, src, dst, il, ol, wt, [0], [0])


def arpa_graph(lm: Union[str, "os.PathLike[str]", ArpaLM], *,
               words: Optional[Sequence[str]] = None, bos: bool = True,
               eos: bool = True) -> Graph:
    r"""Grammar acceptor ``G`` of an ARPA n-gram model, backoff as epsilon arcs.

    The standard conversion (Kaldi's ``arpa2fst``, k2's ``G.fst``): one node per history
    ``h`` of the model (every n-gram shorter than the order, and the empty history); an
    n-gram ``h w`` with ``log10 p`` is an arc ``h -> h'`` labelled ``w`` with weight
    ``log10 p · ln 10`` (natural log), ``h'`` the longest suffix of ``h w`` that is a
    history; a history with backoff ``log10 bo(h)`` has an epsilon arc to its longest
    proper suffix that is a history, weight ``log10 bo · ln 10``.  ``</s>`` is an epsilon
    arc into the one accepting node (so the output labels are words only); ``<s>`` is the
    start history and is never predicted.

    The path that backs off only where an n-gram is missing scores exactly
    ``ArpaLM.sentence_log10(sentence) · ln 10``.  NB (the usual approximation, as in
    Kaldi and k2): a Viterbi search may also take a backoff arc where the n-gram exists;
    it does so only when that path scores higher, so the best path's LM score is at
    least the exact one and equal to it whenever no backoff path beats the explicit
    n-gram (the common case: ``bo(h) + p(w | h') <= p(w | h)``).

    Args:
      lm: an ARPA file (read with ``duoloss.core.decoding.read_arpa``) or an ``ArpaLM``.
      words: the label ids, id -> word (e.g. the word list of ``lexicon_graph``); an LM word
        not in ``words`` gets no arc; a word of ``words`` that the LM does not know is
        scored as ``<unk>`` (a copy of every ``<unk>`` arc).  ``None``: the LM's own ids
        (``ArpaLM.words``).
      bos: start from the ``<s>`` history (else from the empty one).
      eos: end with ``log p(</s> | h)`` into the accepting node; ``False``: every history
        accepts and ``</s>`` is not scored.

    Returns:
      An acceptor ``Graph`` (natural-log weights).

    Raises:
      TypeError/ValueError: naming ``arpa_graph`` and the argument, or ``read_arpa``'s error
        naming the file and line.

    Examples:
        >>> import math, os, tempfile
        >>> from duoloss.graphs import arpa_graph
        >>> path = os.path.join(tempfile.mkdtemp(), "lm.arpa")
        >>> _ = open(path, "w").write("\\data\\\nngram 1=3\n\n\\1-grams:\n"
        ...                           "-99\t<s>\n-0.3\ta\n-0.6\t</s>\n\n\\end\\\n")
        >>> G = arpa_graph(path)   # one history: loops "a" and "<unk>", an epsilon arc for </s>
        >>> G.num_nodes(), G.num_arcs()
        (2, 3)
        >>> [round(w / math.log(10), 4) for w in G.weights_to_list()]   # log10 again
        [-0.3, -0.6, -100.0]
    """
    fn = "arpa_graph"
    for arg, v in (("bos", bos), ("eos", eos)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{fn}: argument '{arg}' must be a bool, got {type(v).__name__}")
    if isinstance(lm, (str, os.PathLike)):
        lm = read_arpa(lm)
    elif not isinstance(lm, ArpaLM):
        raise TypeError(f"{fn}: argument 'lm' must be an ARPA file path or an ArpaLM, got "
                        f"{type(lm).__name__}")
    wmap = _word_ids(fn, words)
    # label(s) of each LM word id
    if wmap is None:
        labels: List[List[int]] = [[i] for i in range(len(lm.words))]
    else:
        labels = [[wmap[w]] if w in wmap else [] for w in lm.words]
        oov = sorted(i for w, i in wmap.items() if w not in lm.word_index)
        labels[lm.unk] = labels[lm.unk] + oov
    N = lm.order
    # histories: the empty one, then every n-gram shorter than the order (not ending in </s>)
    state: Dict[Tuple[int, ...], int] = {(): 0}
    for k in range(min(N - 1, len(lm.ngrams))):
        for g in lm.ngrams[k]:
            if g[-1] != lm.eos:
                state.setdefault(g, len(state))
    final = len(state)
    n = final + 1 if eos else final

    def longest(h):
        while h not in state:
            h = h[1:]
        return state[h]

    src: List[int] = []
    dst: List[int] = []
    il: List[int] = []
    wt: List[float] = []
    for k, grams in enumerate(lm.ngrams[:N]):
        for g, (logp, _) in grams.items():
            h, w = g[:-1], g[-1]
            if h not in state or w == lm.bos:
                continue
            s = state[h]
            weight = logp * LN10
            if w == lm.eos:
                if eos:
                    src.append(s)
                    dst.append(final)
                    il.append(EPSILON)
                    wt.append(weight)
                continue
            d = longest((h + (w,))[-(N - 1):] if N > 1 else ())
            for lab in labels[w]:
                src.append(s)
                dst.append(d)
                il.append(lab)
                wt.append(weight)
    for h, s in state.items():
        if not h:
            continue
        bo = lm.ngrams[len(h) - 1][h][1]
        src.append(s)
        dst.append(longest(h[1:]))
        il.append(EPSILON)
        wt.append(bo * LN10)
    start = state.get((lm.bos,), 0) if bos else 0
    accept = [final] if eos else list(range(n))
    return _from_lists(n, src, dst, il, il, wt, [start], accept)
