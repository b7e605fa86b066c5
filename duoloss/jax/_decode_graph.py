"""``graph_decode`` for JAX arrays: WFST decoding on duoloss's graphs (issue 25, point 3).

Thin: eager arrays go to the host as numpy (float64), the numba search of
``duoloss.core.decoding.wfst`` runs there, the hypotheses come back as JAX
integer arrays (int32 unless ``jax_enable_x64``).  The result has a
data-dependent size, so the function runs outside ``jit`` (a traced argument
raises a ``TypeError``).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from duoloss.core.decoding.wfst import GraphHypothesis
from duoloss.core.decoding.wfst import graph_decode as _graph_decode
from duoloss.core.graph.graph import Graph

from ._args import as_array, as_int_array

__all__ = ["graph_decode"]


def _host(fn: str, arg: str, x: Any) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"{fn}: argument '{arg}' is a traced value (inside jax.jit, vmap or "
                        "grad); graph_decode returns data-dependent sizes and runs on eager "
                        "arrays only: call it outside the transformation")
    return np.asarray(x)


def graph_decode(emissions: Any, graph: Graph, *,
                 lengths: Union[jax.Array, np.ndarray, Sequence[int], None] = None,
                 beam: float = 20.0, max_active: Optional[int] = 10000
                 ) -> List[List[GraphHypothesis]]:
    r"""Beam-pruned Viterbi decoding of emissions against a decoding graph (WFST decoding).

    The JAX twin of [`duoloss.torch.graph_decode`][duoloss.torch.graph_decode]: same
    arguments, same hypotheses and scores (the same core search).  The emissions of
    each utterance are composed with ``graph`` on the fly, keeping the states within
    ``beam`` of each frame's best (at most ``max_active``); with ``beam=math.inf`` and
    ``max_active=None`` the result is ``duoloss.gtn.viterbi_path`` of the full
    composition, which is never built.  Score of a path: its emissions plus its graph
    arc weights (tropical).

    Args:
      emissions: ``(B, T, C)`` frame scores (log-probabilities), batch first, an eager
        ``jax.Array`` or numpy array of any floating dtype (computed in float64).
      graph: the decoding graph (``duoloss.gtn.Graph``; input labels in ``[0, C)`` or
        ``-1``, epsilon), e.g. ``gtn.compose(ctc_topo(C), gtn.compose(L, G))``.
      lengths: ``(B,)`` frames per utterance in ``[0, T]``; ``None``: all ``T``.
      beam: score window below the frame's best (natural log); ``math.inf``: none.
      max_active: most states kept per frame; ``None``: no limit.

    Returns:
      One list per utterance holding its best hypothesis (``GraphHypothesis`` with
      ``labels``, ``score`` (float), ``alignment``, ``timesteps``, ``arcs`` as JAX
      integer arrays), or an empty list when the utterance's emissions hold a NaN or
      no path reaches an accept state within the beam.

    Raises:
      TypeError/ValueError: naming ``graph_decode`` and the argument, before any search
        runs (also for a traced argument: call it outside ``jit``).

    Examples:
        >>> import jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> from duoloss.graphs import ctc_topo
        >>> probs = jnp.array([[[0.1, 0.8, 0.1], [0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]])  # (B, T, C)
        >>> [hyp] = dj.graph_decode(jnp.log(probs), ctc_topo(3))[0]   # CTC best path, blank 0
        >>> hyp.labels.tolist(), hyp.alignment.tolist(), hyp.timesteps.tolist(), round(hyp.score, 4)
        ([1, 2], [1, 0, 2], [0, 2], -0.6694)
    """
    fn = "graph_decode"
    em = _host(fn, "emissions", as_array(fn, "emissions", emissions))
    if em.dtype.kind != "f" and em.dtype.name != "bfloat16":
        raise TypeError(f"{fn}: argument 'emissions' must hold floating-point scores, got "
                        f"dtype {em.dtype}")
    em = em.astype(np.float64)
    ln = None if lengths is None else _host(fn, "lengths", as_int_array(fn, "lengths", lengths))
    res = _graph_decode(em, graph, lengths=ln, beam=beam, max_active=max_active, fn=fn)
    return [[GraphHypothesis(jnp.asarray(h.labels), h.score, jnp.asarray(h.alignment),
                             jnp.asarray(h.timesteps), jnp.asarray(h.arcs))
             for h in hyps] for hyps in res]
