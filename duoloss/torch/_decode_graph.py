"""``graph_decode`` for torch tensors: WFST decoding on duoloss's graphs (issue 25, point 3).

Thin: the emissions go to the host as numpy (float64), the numba search of
``duoloss.core.decoding.wfst`` runs there, the hypotheses come back as CPU
``torch.int64`` tensors.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from duoloss.core._validate import dtype_name
from duoloss.core.decoding.wfst import GraphHypothesis
from duoloss.core.decoding.wfst import graph_decode as _graph_decode
from duoloss.core.graph.graph import Graph

from ._adapter import to_numpy
from ._args import check_tensor, int_array

__all__ = ["graph_decode"]


def graph_decode(emissions: torch.Tensor, graph: Graph, *,
                 lengths: Union[torch.Tensor, Sequence[int], None] = None,
                 beam: float = 20.0, max_active: Optional[int] = 10000
                 ) -> List[List[GraphHypothesis]]:
    r"""Beam-pruned Viterbi decoding of emissions against a decoding graph (WFST decoding).

    The emissions of each utterance are composed with ``graph`` on the fly, frame by
    frame (token passing in the tropical semiring, as Kaldi's decoders and k2's
    ``intersect_dense_pruned``): the full composition is never built, and only the
    states within ``beam`` of each frame's best, at most ``max_active`` of them, are
    kept.  The score of a path is

    $$
    \sum_{t < T_b} \text{emissions}[b, t, i_t] + \sum_{a \in \text{path}} w_a ,
    $$

    ``i_t`` the input label of the path's ``t``-th frame-consuming arc.  With
    ``beam=math.inf`` and ``max_active=None`` the result is the best path of the
    full composition: ``duoloss.gtn.viterbi_path(compose(E_b, graph))`` with ``E_b``
    the linear graph of the utterance's emissions (same score, same input and output
    labels).

    The decoding graph is a ``duoloss.gtn.Graph`` whose input labels are classes in
    ``[0, C)`` or ``-1`` (epsilon: consumes no frame); its output labels are what the
    search returns, e.g. word ids of ``gtn.compose(ctc_topo(C), gtn.compose(L, G))``
    built with [`lexicon_graph`][duoloss.graphs.lexicon_graph] and
    [`arpa_graph`][duoloss.graphs.arpa_graph] (composed once, statically, like
    Kaldi's HCLG or k2's HLG).

    Args:
      emissions: ``(B, T, C)`` frame scores (log-probabilities), batch first; any
        floating dtype (computed in float64).
      graph: the decoding graph (one for the whole batch).
      lengths: ``(B,)`` frames per utterance in ``[0, T]``; ``None``: all ``T``.
      beam: after each frame (and its epsilon closure) keep the states whose score is
        within ``beam`` of the frame's best (natural log); ``math.inf``: no score pruning.
      max_active: then keep at most this many of them, the best (ties: the first
        reached); ``None``: no limit.  States from which no accept state can be reached
        are never entered; the last frame is not pruned.

    Returns:
      One list per utterance holding its best hypothesis (a ``GraphHypothesis``:
      ``labels`` ``(L,)`` output labels without epsilons, ``score`` a float,
      ``alignment`` ``(T_b,)`` the input label read at each frame, ``timesteps``
      ``(L,)`` the frame each output label was emitted at, ``arcs`` the graph's arc
      indices along the path, input-epsilon arcs included; CPU int64 tensors), or an
      empty list when the utterance's emissions hold a NaN or no path reaches an
      accept state within the beam.

    Raises:
      TypeError/ValueError: naming ``graph_decode`` and the argument (emissions not a
        3-D floating tensor, lengths of the wrong shape or outside ``[0, T]``, a graph
        input label ``>= C``, a cycle of input-epsilon arcs, a bad ``beam`` or
        ``max_active``), before any search runs.

    NB: memory per utterance is the graph's arrays plus the tokens of one frame and the
    traceback of the surviving ones (``<= max_active`` per frame times one plus the
    longest chain of input-epsilon arcs), never ``T`` times the graph.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> from duoloss.graphs import ctc_topo
        >>> probs = torch.tensor([[[0.1, 0.8, 0.1], [0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]])  # (B, T, C)
        >>> [hyp] = dt.graph_decode(probs.log(), ctc_topo(3))[0]   # CTC best path, blank 0
        >>> hyp.labels.tolist(), hyp.alignment.tolist(), hyp.timesteps.tolist(), round(hyp.score, 4)
        ([1, 2], [1, 0, 2], [0, 2], -0.6694)
    """
    fn = "graph_decode"
    check_tensor(fn, "emissions", emissions)
    if emissions.is_complex() or not emissions.is_floating_point():
        raise TypeError(f"{fn}: argument 'emissions' must hold floating-point scores, got "
                        f"dtype {dtype_name(emissions.dtype)}")
    em = to_numpy(emissions.detach().to("cpu", torch.float64))
    ln = None if lengths is None else int_array(fn, "lengths", lengths)
    res = _graph_decode(em, graph, lengths=ln, beam=beam, max_active=max_active, fn=fn)
    return [[GraphHypothesis(torch.from_numpy(h.labels), h.score, torch.from_numpy(h.alignment),
                             torch.from_numpy(h.timesteps), torch.from_numpy(h.arcs))
             for h in hyps] for hyps in res]
