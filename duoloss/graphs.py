r"""Graph builders for the WFST losses (framework-free).

Every builder returns ``duoloss.gtn.Graph`` objects usable by
``duoloss.torch.graph_loss`` / ``duoloss.jax.graph_loss``, the aligners and the
graph operations of [`duoloss.gtn`][duoloss.gtn] (``compose``, ``intersect``,
``forward_score``...).  Labels are class ids in ``[0, C)``; ``-1``
(`duoloss.gtn.EPSILON`) is the empty label, and an arc with input label
``-1`` consumes no frame.

* [`ctc_graph`][duoloss.graphs.ctc_graph] — the CTC acceptor of one target (standard or modified).
* [`ctc_topo`][duoloss.graphs.ctc_topo] — the CTC topology over ``C`` classes, a transducer from
  frame labels to tokens (standard: ``C**2`` arcs; modified: ``3C - 2`` arcs and
  epsilon arcs).
* [`asg_graph`][duoloss.graphs.asg_graph] — the ASG force-alignment graph of one target with the
  indices of its tied transition weights.
* [`token_ngram_graph`][duoloss.graphs.token_ngram_graph] — a back-off token n-gram estimated from token
  sequences (interpolated absolute discounting; back-off arcs are epsilon).
* [`wordpiece_graph`][duoloss.graphs.wordpiece_graph] — every decomposition of a word (or a sentence) into
  pieces of a vocabulary (Hannun et al., 2020, Sec. 5).
* [`lexicon_graph`][duoloss.graphs.lexicon_graph] — a lexicon transducer ``L`` (token ids in, word ids
  out) for decoding with ``graph_decode``.
* [`arpa_graph`][duoloss.graphs.arpa_graph] — the grammar acceptor ``G`` of an ARPA n-gram model (backoff
  as epsilon arcs, natural-log weights).

References:
  Graves et al., "Connectionist Temporal Classification", ICML 2006.
  Collobert, Puhrsch, Synnaeve, "Wav2Letter", arXiv:1609.03193, 2016.
  Hannun, Pratap, Kahn, Hsu, "Differentiable Weighted Finite-State
  Transducers", arXiv:2010.01003, 2020.
  Ney, Essen, Kneser, "On structuring probabilistic dependences in stochastic
  language modelling", Computer Speech & Language, 1994 (absolute discounting).
  k2: ``k2.ctc_graph`` and ``k2.ctc_topo`` (``modified=True``: no blank needed
  between repeated tokens).
"""
from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict
from typing import Dict, List, Sequence, Tuple, overload

import numpy as np

from duoloss.core.graph.graph import EPSILON, Graph
from duoloss.core.decoding.wfst_graphs import arpa_graph, lexicon_graph

__all__ = ["ctc_graph", "ctc_topo", "asg_graph", "token_ngram_graph", "wordpiece_graph", "lexicon_graph",
           "arpa_graph"]


#: The most arcs a builder makes (``2**28``: about 9.7 GB of arc arrays at 36
#: bytes per arc); a request for more raises ``ValueError`` before anything is
#: allocated.
_MAX_ARCS = 2 ** 28


def _check_arcs(fn, what, arcs):
    """``ValueError`` naming ``fn`` and the argument when ``arcs > _MAX_ARCS``."""
    if arcs > _MAX_ARCS:
        raise ValueError(f"{fn}: {what} would need {arcs} arcs, more than the limit of "
                         f"{_MAX_ARCS} (2**28) arcs a graph builder makes")


def _build(n, src, dst, ilabel, olabel=None, weight=None, start=None, accept=None):
    """A graph from owned arrays (the builders' output is valid by construction)."""
    src = np.ascontiguousarray(src, np.int64)
    il = np.ascontiguousarray(ilabel, np.int64)
    ol = il.copy() if olabel is None else np.ascontiguousarray(olabel, np.int64)
    w = (np.zeros(src.shape[0], np.float32) if weight is None
         else np.ascontiguousarray(weight, np.float32))
    flags = []
    for f in (start, accept):
        fl = np.zeros(n, np.bool_)
        if f is not None:
            fl[np.asarray(f, np.int64)] = True
        flags.append(fl)
    return Graph._from_trusted(n, src, np.ascontiguousarray(dst, np.int64), il, ol, w,
                               flags[0], flags[1], False)


def _len(value):
    """``len(value)``, or None where it has none (the sequence checks report it)."""
    try:
        return len(value)
    except TypeError:
        return None


def _int(fn, arg, value, lo=None, hi=None):
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got "
                        f"{type(value).__name__}") from None
    if (lo is not None and v < lo) or (hi is not None and v >= hi):
        rng = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: argument '{arg}' must be in {rng}, got {v}")
    return v


def _bool(fn, arg, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument '{arg}' must be a bool, got {type(value).__name__}")
    return bool(value)


def _seq(fn, arg, value, lo=0, hi=None, what="token ids"):
    """A 1-D sequence of ints (list, tuple or integer array) -> list of ints."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{fn}: argument '{arg}' must be a sequence of {what}, got "
                        f"{type(value).__name__}")
    if isinstance(value, (list, tuple)):
        for i, x in enumerate(value):
            if isinstance(x, (bool, np.bool_)):
                raise TypeError(f"{fn}: argument '{arg}' must be a sequence of {what} (ints), "
                                f"got a bool ({x!r}) at position {i}")
    arr = np.asarray(value)
    if arr.size == 0:
        return []
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument '{arg}' must be a 1-D sequence of {what} (ints), got "
                        f"dtype {arr.dtype} and shape {arr.shape}")
    out = [int(x) for x in arr]
    bad = [x for x in out if x < lo or (hi is not None and x >= hi)]
    if bad:
        rng = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: argument '{arg}' must hold {what} in {rng}, got {bad[0]}")
    return out


def _is_batch(targets):
    return (isinstance(targets, (list, tuple)) and len(targets) > 0
            and all(hasattr(t, "__len__") and not isinstance(t, (str, bytes)) for t in targets))


@overload
def ctc_graph(targets: Sequence[int], blank: int = 0, modified: bool = False) -> Graph: ...
@overload
def ctc_graph(targets: Sequence[Sequence[int]], blank: int = 0,
              modified: bool = False) -> list[Graph]: ...


def ctc_graph(targets: Sequence[int] | Sequence[Sequence[int]], blank: int = 0,
              modified: bool = False) -> Graph | list[Graph]:
    r"""CTC acceptor(s) of target token sequences.

    For a target $y_1 \dots y_L$ the graph has ``2L + 1`` nodes (blank,
    $y_1$, blank, ..., $y_L$, blank); node 0 is the start and the
    last two nodes accept.  Every arc is labelled by the class of the node it
    enters, so a path of ``T`` arcs is a CTC alignment of ``T`` frames: each node
    has a self-loop, node ``s`` enters ``s + 1``, and label node ``l`` enters
    label node ``l + 1`` directly when $y_{l+1} \ne y_l$ (standard) or
    always (``modified``, k2's topology without a mandatory blank between
    repeated tokens, where frames ``a a`` may also spell two ``a``).
    ``graph_loss`` with these graphs equals ``ctc_loss`` (standard).

    Args:
      targets: one target (a 1-D sequence of ints, ``blank`` excluded) or a list
        of targets.
      blank: the blank class id (``>= 0``).
      modified: k2's modified topology.

    Returns:
      A ``Graph`` (one target) or a list of graphs (a list of targets); arc
      weights are 0 and ``olabel == ilabel``.

    Raises:
      TypeError/ValueError: non-integer (or bool) targets, negative ids, ``blank``
        inside a target, a target needing more than ``2**28`` arcs.

    Examples:
        >>> from duoloss.graphs import ctc_graph
        >>> g = ctc_graph([1, 2])  # blank, 1, blank, 2, blank
        >>> g.num_nodes(), g.num_arcs()  # 5 self-loops, 4 steps, 1 skip of the blank between 1 and 2
        (5, 10)
    """
    fn = "ctc_graph"
    blank = _int(fn, "blank", blank, 0)
    modified = _bool(fn, "modified", modified)
    if _is_batch(targets):
        return [ctc_graph(t, blank, modified) for t in targets]
    n_in = _len(targets)
    if n_in is not None:  # 3 arcs at most enter each of the 2L + 1 nodes
        _check_arcs(fn, f"argument 'targets' of length {n_in}", 3 * (2 * n_in + 1))
    target = _seq(fn, "targets", targets)
    if blank in target:
        raise ValueError(f"{fn}: argument 'targets' must not contain the blank ({blank}), got "
                         f"it at position {target.index(blank)}")
    n = 2 * len(target) + 1
    lab = np.full(n, blank, np.int64)
    lab[1::2] = target
    s = np.arange(n)
    # up to three arcs enter node s, in this order: the self-loop, from s - 1, and
    # (odd s >= 3) the skip from s - 2 when the label changes (always if modified)
    skip = (s >= 3) & (s % 2 == 1)
    if not modified:
        skip[3::2] &= lab[3::2] != lab[1:-2:2]
    keep = np.stack([np.ones(n, np.bool_), s >= 1, skip], axis=1)
    src = np.stack([s, s - 1, s - 2], axis=1)[keep]
    dst = np.broadcast_to(s[:, None], (n, 3))[keep]
    return _build(n, src, dst, lab[dst], start=[0], accept=np.arange(max(n - 2, 0), n))


def ctc_topo(num_classes: int, blank: int = 0, modified: bool = False) -> Graph:
    r"""CTC topology: a transducer from frame labels to tokens (k2's ``ctc_topo``).

    One node per class (the class of the previous frame; ``blank``'s node is the
    start); every node accepts (standard) or only the blank's (``modified``, where
    a token node reaches it by its epsilon arc: one path per alignment).  Input
    labels are frame labels in ``[0, C)``; output labels are the tokens spelled (``-1``, epsilon, for a
    blank or a repeated frame).

    * standard: an arc ``i -> j`` labelled ``j`` for every pair (``C**2`` arcs),
      output ``j`` unless ``j`` is the blank or ``j == i``: a blank is needed
      between two equal tokens.
    * ``modified``: arcs ``blank -> blank`` (blank:eps), ``blank -> j`` (j:j),
      ``j -> j`` (j:eps) and an epsilon arc ``j -> blank`` (eps:eps), ``3C - 2``
      arcs: a token node returns to the blank node without consuming a frame, so
      ``a a`` may spell one or two ``a`` (no blank needed between repeats).

    ``compose(ctc_topo, token_graph)`` (`duoloss.gtn.compose`) maps a token
    graph (a lexicon, an n-gram, a word-piece decomposition) to a frame-level
    graph for ``graph_loss``.

    Args:
      num_classes: ``C`` (blank included), ``>= 1``.
      blank: the blank id in ``[0, C)``.
      modified: k2's modified topology.

    Returns:
      A ``Graph`` (weights 0).

    Raises:
      TypeError/ValueError: a non-integer (or bool) ``num_classes`` / ``blank``, or a
        topology of more than ``2**28`` arcs (``C > 16384`` standard).

    Examples:
        >>> from duoloss.graphs import ctc_topo
        >>> ctc_topo(3).num_arcs(), ctc_topo(3, modified=True).num_arcs()  # C**2 and 3C - 2
        (9, 7)
    """
    fn = "ctc_topo"
    c = _int(fn, "num_classes", num_classes, 1)
    blank = _int(fn, "blank", blank, 0, c)
    modified = _bool(fn, "modified", modified)
    arcs = 3 * c - 2 if modified else c * c
    _check_arcs(fn, f"argument 'num_classes' = {c} ({'3C - 2' if modified else 'C**2'})",
                arcs)
    # modified: a token node accepts through its epsilon arc only
    accept = [blank] if modified else np.arange(c)
    if not modified:
        src = np.repeat(np.arange(c, dtype=np.int64), c)  # arc i -> j for every (i, j)
        dst = np.tile(np.arange(c, dtype=np.int64), c)
        olabel = np.where((dst == blank) | (dst == src), EPSILON, dst)
        return _build(c, src, dst, dst, olabel, start=[blank], accept=accept)
    # blank -> blank, then per token j: blank -> j, j -> j, j -> blank (epsilon)
    j = np.delete(np.arange(c, dtype=np.int64), blank)
    b = np.full_like(j, blank)
    eps = np.full_like(j, EPSILON)
    src = np.concatenate([[blank], np.stack([b, j, j], 1).reshape(-1)])
    dst = np.concatenate([[blank], np.stack([j, j, b], 1).reshape(-1)])
    il = np.concatenate([[blank], np.stack([j, j, eps], 1).reshape(-1)])
    ol = np.concatenate([[EPSILON], np.stack([j, eps, eps], 1).reshape(-1)])
    return _build(c, src, dst, il, ol, start=[blank], accept=accept)


def asg_graph(target: Sequence[int], num_classes: int, *, start_transitions: bool = False
              ) -> tuple[Graph, np.ndarray]:
    r"""ASG force-alignment graph of one target and the indices of its tied weights.

    Nodes ``0 .. L``: node 0 is the start (nothing emitted yet), node ``l``
    means "in token $y_l$", node ``L`` accepts.  Arcs: ``l - 1 -> l``
    labelled $y_l$ and ``l -> l`` labelled $y_l$ (repeated tokens
    need no separator).  The returned index array ties each arc to the
    flattened ``(C, C)`` transition matrix ``transitions[to, from]`` (index
    ``to * C + from``, as [`duoloss.torch.asg_loss`][duoloss.torch.asg_loss]), the first arc to
    ``C * C + y_1`` with ``start_transitions`` (else ``-1``, no weight).
    ``graph_loss(.., weights=transitions.reshape(-1), arc_weight_index=[idx])``
    minus the same loss over the full graph [`token_ngram_graph`][duoloss.graphs.token_ngram_graph]-style
    (every token after every token) is ASG.

    Args:
      target: 1-D sequence of token ids in ``[0, C)``.
      num_classes: ``C``.
      start_transitions: tie the first arc to a start score.

    Returns:
      ``(graph, arc_weight_index)``: a ``Graph`` and an ``int64`` array with one
      entry per arc.

    Examples:
        >>> from duoloss.graphs import asg_graph
        >>> g, index = asg_graph([0, 1], num_classes=2)  # token 0 on >= 1 frames, then token 1
        >>> g.num_nodes(), g.num_arcs()  # a start node, then one node per token with its self-loop
        (3, 4)
        >>> index.tolist()  # arc i scores transitions[to, from] at to * C + from: none, 0->0, 0->1, 1->1
        [-1, 0, 2, 3]
    """
    fn = "asg_graph"
    c = _int(fn, "num_classes", num_classes, 1)
    n_in = _len(target)
    if n_in is not None:
        _check_arcs(fn, f"argument 'target' of length {n_in}", 2 * n_in)
    y = _seq(fn, "target", target, 0, c)
    start_transitions = _bool(fn, "start_transitions", start_transitions)
    if c * c + c > np.iinfo(np.int64).max:
        raise ValueError(f"{fn}: argument 'num_classes' must keep C * C + C within int64 "
                         f"(the transition indices), got {c}")
    n = len(y)
    ya = np.asarray(y, np.int64)
    l = np.arange(1, n + 1, dtype=np.int64)
    # per token l: the arc l - 1 -> l, then the self-loop l -> l, both labelled y_l
    src = np.stack([l - 1, l], 1).reshape(-1)
    dst = np.repeat(l, 2)
    enter = ya * c + np.concatenate([[0], ya[:-1]]) if n else ya
    if n:
        enter[0] = c * c + ya[0] if start_transitions else -1
    idx = np.stack([enter, ya * c + ya], 1).reshape(-1)
    return _build(n + 1, src, dst, np.repeat(ya, 2), start=[0], accept=[n]), idx


def token_ngram_graph(sequences: Sequence[Sequence[int]], num_classes: int, order: int = 2, *,
                      discount: float = 0.5, bos: bool = True) -> Graph:
    r"""A back-off token n-gram acceptor estimated from token sequences.

    Interpolated absolute discounting: with counts $c(h, k)$ of token
    ``k`` after history ``h`` (the previous ``order - 1`` tokens at most),
    $c(h) = \sum_k c(h, k)$, $n(h)$ the number of distinct ``k`` with
    $c(h, k) > 0$, discount ``D`` and $\bar h$ the history without
    its oldest token,

    $$
    P(k \mid h) = \frac{\max(c(h, k) - D, 0)}{c(h)}
    + \gamma(h)\, P(k \mid \bar h), \qquad
    \gamma(h) = \frac{D\, n(h)}{c(h)} \;(1 \text{ if } c(h) = 0),
    $$

    and $P(k \mid ()) = \max(c(k) - D, 0)/N + (D\, n/N) / C$ (uniform
    floor; ``1/C`` without data).  Every probability is positive and sums to one
    over the ``C`` tokens.

    The graph has one node per observed history (tuples of ``1 .. order - 1``
    tokens, plus the empty history); the start node is the history ``(BOS,)``
    (``bos=True``: counts include the sequence starts; else the empty history)
    and these nodes accept (no end-of-sequence model).  From history ``h`` an
    arc labelled ``k`` for each seen ``k`` carries
    $\log(\max(c(h,k) - D, 0)/c(h))$ and enters the longest history that
    ends with ``h + (k,)``; an *epsilon* arc with $\log \gamma(h)$ enters
    a non-accepting copy of $\bar h$ (same token arcs), so a path never
    ends on a back-off arc; the empty history has an arc for every token.  For
    ``order <= 2`` the sum over the paths of a token sequence is exactly its
    interpolated probability $\prod_t P(k_t \mid h_t)$ (a path-sum graph
    implements the interpolation).  For ``order > 2`` a token read after a
    back-off enters a history of the backed-off order (the usual back-off WFST
    approximation).  Weights are stored in float32.

    Args:
      sequences: list of 1-D token sequences (ints in ``[0, C)``).
      num_classes: ``C``.
      order: n-gram order ``>= 1`` (1: a single node with ``C`` self-loops).
      discount: ``D`` in ``(0, 1)``.
      bos: model the sequence start as its own history.

    Returns:
      An acceptor ``Graph`` with epsilon arcs (for ``order >= 2``).

    Examples:
        >>> import math
        >>> from duoloss import gtn
        >>> from duoloss.graphs import token_ngram_graph
        >>> g = token_ngram_graph([[0, 1], [0, 1, 1]], num_classes=2, order=2)  # a bigram
        >>> two_tokens = gtn.linear_graph(2, 2)  # every sequence of 2 tokens
        >>> round(math.exp(gtn.forward_score(gtn.intersect(g, two_tokens)).item()), 4)  # they sum to 1
        1.0
    """
    fn = "token_ngram_graph"
    c = _int(fn, "num_classes", num_classes, 1)
    order = _int(fn, "order", order, 1)
    bos = _bool(fn, "bos", bos)
    if isinstance(discount, bool) or not isinstance(discount, (int, float, np.floating)) \
            or not 0.0 < float(discount) < 1.0:
        raise ValueError(f"{fn}: argument 'discount' must be a float in (0, 1), got "
                         f"{discount!r}")
    d = float(discount)
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, (list, tuple)):
        raise TypeError(f"{fn}: argument 'sequences' must be a list of token sequences, got "
                        f"{type(sequences).__name__}")
    seqs = [_seq(fn, f"sequences[{i}]", s, 0, c) for i, s in enumerate(sequences)]
    BOS = -2  # internal history symbol, never a label
    counts: Dict[Tuple[int, ...], Counter] = defaultdict(Counter)
    histories = set()
    for s in seqs:
        ctx = ([BOS] if bos and order > 1 else []) + s
        first = 1 if bos and order > 1 else 0
        for i in range(len(ctx) + 1):
            for m in range(1, min(order, i + 1)):  # every history of 1 .. order-1 ending at i
                histories.add(tuple(ctx[i - m:i]))
        for i in range(first, len(ctx)):
            for m in range(0, min(order, i + 1)):
                counts[tuple(ctx[i - m:i])][ctx[i]] += 1
    start_h = (BOS,) if bos and order > 1 else ()
    histories.add(start_h)
    histories.add(())
    nodes = sorted(histories, key=lambda h: (len(h), h))
    nid = {h: i for i, h in enumerate(nodes)}

    def enter(h, k):
        full = (h + (k,))[-(order - 1):] if order > 1 else ()
        while full not in nid:
            full = full[1:]
        return nid[full]

    # Back-off targets get a second, non-accepting copy: an epsilon arc always
    # leads to a copy that must go on with a token, so a sequence that ends in a
    # history is not counted again through trailing back-off arcs.
    targets = sorted({h[1:] for h in nodes if h}, key=lambda h: (len(h), h))
    bid = {h: len(nodes) + i for i, h in enumerate(targets)}
    uni = counts[()]
    n_tot = sum(uni.values())
    # the empty history (and its back-off copy, when it has one) has an arc per class
    uni_arcs = c * (1 + (() in bid))
    _check_arcs(fn, f"argument 'num_classes' = {c} (C arcs from the empty history)",
                uni_arcs + sum(len(v) + 1 for v in counts.values()))
    if n_tot:
        uni_k = np.zeros(c, np.int64)
        uni_k[list(uni)] = list(uni.values())
        # one log per distinct count (math.log, as a scalar loop would round)
        logs = {u: math.log(max(u - d, 0.0) / n_tot + d * len(uni) / n_tot / c)
                for u in set(uni_k.tolist())}
        uni_w = np.vectorize(logs.__getitem__, otypes=[np.float64])(uni_k)
    else:
        uni_w = np.full(c, math.log(1.0 / c))
    parts = []  # (src, dst, label, weight) arrays in arc order; label -1 = epsilon
    for copy, hs in ((nid, nodes), (bid, targets)):
        for h in hs:
            src = copy[h]
            cnt = counts.get(h, Counter())
            ch = sum(cnt.values())
            if h == ():  # an arc per class into the history (k,) (or () for order 1)
                parts.append((np.full(c, src, np.int64), _unigram_targets(nid, c, order),
                              np.arange(c, dtype=np.int64), uni_w))
                continue
            ks = sorted(cnt)
            gamma = 1.0 if ch == 0 else d * len(cnt) / ch
            parts.append((np.array([src] * (len(ks) + 1), np.int64),
                          np.array([enter(h, k) for k in ks] + [bid[h[1:]]], np.int64),
                          np.array(ks + [EPSILON], np.int64),
                          np.array([math.log((cnt[k] - d) / ch) for k in ks]
                                   + [math.log(gamma)])))
    src, dst, lab, w = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return _build(len(nodes) + len(targets), src, dst, lab, weight=w,
                  start=[nid[start_h]], accept=np.arange(len(nodes)))


def _unigram_targets(nid, c, order):
    """Where token k leads from the empty history: ``nid[(k,)]`` where that history
    exists (order > 1), else ``nid[()]``, for every class k."""
    dst = np.full(c, nid[()], np.int64)
    for h, i in nid.items():
        if order > 1 and len(h) == 1 and 0 <= h[0] < c:
            dst[h[0]] = i
    return dst


def wordpiece_graph(words: str | Sequence[str], vocabulary: Sequence) -> Graph:
    r"""Acceptor of every decomposition of a word (or words) into word pieces.

    For a word $w$ the nodes are the character positions ``0 .. |w|``
    (0 starts, ``|w|`` accepts) and an arc ``i -> j`` labelled ``v`` exists for
    every vocabulary entry ``vocabulary[v] == w[i:j]``.  A list of words gives
    their concatenation (the accept node of a word is the start of the next):
    the graph accepts exactly the piece sequences that spell the sentence, each
    once, as in the word-piece experiments of Hannun et al. (2020).  Nodes
    that lie on no decomposition are removed.  Compose with [`ctc_topo`][duoloss.graphs.ctc_topo]
    (``duoloss.gtn.compose(ctc_topo(C), wordpiece_graph(...))``) for a
    frame-level graph.

    Args:
      words: a ``str`` or a list of ``str``.
      vocabulary: sequence of pieces; entry ``v`` is the label ``v``.  Entries
        that are not non-empty strings (e.g. ``None`` for the blank) are skipped.

    Returns:
      An acceptor ``Graph`` (weights 0).

    Raises:
      ValueError: a word has no decomposition.

    Examples:
        >>> import math
        >>> from duoloss import gtn
        >>> from duoloss.graphs import wordpiece_graph
        >>> g = wordpiece_graph(["ab"], ["a", "b", "ab"])  # 'a b' or 'ab'
        >>> round(math.exp(gtn.forward_score(g).item()), 4)  # the number of decompositions
        2.0
    """
    fn = "wordpiece_graph"
    if isinstance(words, str):
        words = [words]
    if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
        raise TypeError(f"{fn}: argument 'words' must be a str or a list of str, got "
                        f"{type(words).__name__}")
    if isinstance(vocabulary, str) or not isinstance(vocabulary, (list, tuple)):
        raise TypeError(f"{fn}: argument 'vocabulary' must be a list of str, got "
                        f"{type(vocabulary).__name__}")
    pieces: Dict[str, int] = {}
    for v, p in enumerate(vocabulary):
        if isinstance(p, str) and p and p not in pieces:
            pieces[p] = v
    max_len = max((len(p) for p in pieces), default=0)
    arcs: List[Tuple[int, int, int]] = []
    offset = 0
    for wi, w in enumerate(words):
        n = len(w)
        fwd = [False] * (n + 1)
        fwd[0] = True
        local = []
        for i in range(n):
            if not fwd[i]:
                continue
            for j in range(i + 1, min(n, i + max_len) + 1):
                v = pieces.get(w[i:j])
                if v is not None:
                    local.append((i, j, v))
                    fwd[j] = True
        if not fwd[n]:
            raise ValueError(f"{fn}: argument 'words' has no decomposition into the vocabulary "
                             f"for word {wi} ({w!r})")
        bwd = [False] * (n + 1)
        bwd[n] = True
        for i, j, v in sorted(local, key=lambda a: -a[0]):
            if bwd[j]:
                bwd[i] = True
        keep = [i for i in range(n + 1) if fwd[i] and bwd[i]]
        pos = {i: offset + r for r, i in enumerate(keep)}
        arcs += [(pos[i], pos[j], v) for i, j, v in local if i in pos and j in pos]
        offset += len(keep) - 1
    a = np.array(arcs, np.int64).reshape(-1, 3)
    return _build(offset + 1, a[:, 0], a[:, 1], a[:, 2], start=[0], accept=[offset])
