"""Target-graph loss for JAX: ``graph_loss``."""
from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import jax
import numpy as np
import jax.numpy as jnp
from jax.typing import ArrayLike

from duoloss.core.losses.graph_loss import (GRAPH_LOSS_KERNEL, GRAPH_MMI_KERNEL, PackedGraphs,
                                      check_denominator, check_graph_args)
from duoloss.core._validate import check_reduction, shape_str

from ._adapter import apply_kernel
from ._args import as_array, as_int_array, check_bool, is_concrete

__all__ = ["graph_loss"]


def graph_loss(emissions: ArrayLike, graphs: Sequence, input_lengths: ArrayLike, *,
               normalize: bool = False, reduction: Literal["none", "sum", "mean"] = "mean",
               weights: ArrayLike | None = None, arc_weight_index: Optional[Sequence] = None,
               target_lengths: ArrayLike | None = None, zero_infinity: bool = False,
               denominator: Any = None, denominator_arc_weight_index: Any = None) -> jax.Array:
    r"""Loss of one target graph per sequence; see [`duoloss.torch.graph_loss`][duoloss.torch.graph_loss].

    $$
    \text{loss}_b = -\log \sum_{a_1 \dots a_{T_b} \in G_b} \exp \sum_{t}
    \left(w_{a_t} + e_t(k_{a_t})\right)
    + [\text{normalize}] \sum_t \operatorname{logsumexp}_k e_t(k),
    \qquad w_a = \text{graph weight}_a + \theta_{i_a}.
    $$

    Args:
      emissions: ``(T, N, C)``-array of scores.
      graphs: ``N`` ``duoloss.gtn.Graph`` acceptors (Python objects: under ``jit``
        close over them; they become constants of the trace), or a
        [`PackedGraphs`][duoloss.jax.PackedGraphs] from [`pack_graphs`][duoloss.jax.pack_graphs], a pytree of arrays that can
        be a ``jit`` argument (pad with ``num_nodes``/``num_arcs`` for static shapes;
        then ``arc_weight_index`` is inside it and the argument must be ``None``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      normalize: add the forward score of the unconstrained emissions.
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (divided by ``target_lengths``
        clamped to >= 1 if given, then the batch mean).
      weights: ``(K,)``-array $\theta$ of learnable, tied arc weights
        (differentiable).
      arc_weight_index: with ``weights``: one integer array per graph, an index in
        ``[-1, K)`` per arc.
      target_lengths: optional ``(N,)`` normalisers for ``'mean'``.
      zero_infinity: sequences without a path get loss 0 and zero gradients.
      denominator: LF-MMI denominator: one ``Graph`` (shared), ``N`` graphs, or a
        [`PackedGraphs`][duoloss.jax.PackedGraphs] of 1 or ``N`` graphs (a ``jit`` argument); loss
        $-\log Z(G_b \circ E_b) + \log Z(D_b \circ E_b)$; ``normalize``
        must be ``False``.
      denominator_arc_weight_index: with ``weights``: one integer array (shared
        denominator) or ``N``, an index in ``[-1, K)`` per arc.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    NB: works under ``jit``, ``grad`` and ``vmap`` over the emissions (each
    vmapped copy uses the same graphs).

    Examples:
        >>> import math, numpy as np
        >>> import duoloss.jax as dj
        >>> from duoloss.graphs import ctc_graph
        >>> log_probs = np.full((2, 1, 3), -math.log(3), np.float32)  # (T, N, C): uniform frames
        >>> loss = dj.graph_loss(log_probs, [ctc_graph([1])], np.array([2]))
        >>> round(float(loss), 4)  # the CTC graph of '1': the CTC loss, log 3
        1.0986
    """
    fn = "graph_loss"
    check_reduction(fn, reduction)
    check_bool(fn, "normalize", normalize)
    check_bool(fn, "zero_infinity", zero_infinity)
    if (arc_weight_index is None and denominator_arc_weight_index is not None
            and denominator is not None and weights is not None
            and isinstance(graphs, (list, tuple))):  # only the denominator is weighted
        arc_weight_index = [np.full(g.num_arcs(), -1, np.int64) if hasattr(g, "num_arcs")
                            else None for g in graphs]
    emissions, weights, input_lengths, packed = prepare_graphs(
        fn, emissions, graphs, input_lengths, weights, arc_weight_index)
    den = None
    if denominator is not None:
        if normalize:
            raise ValueError(f"{fn}: argument 'normalize' must be False with a 'denominator' "
                             f"(the normaliser cancels), got True")
        den, den_concrete = device_graphs(denominator)
        den = check_denominator(fn, emissions, den, weights, denominator_arc_weight_index,
                                graphs_concrete=den_concrete)
    elif denominator_arc_weight_index is not None:
        raise ValueError(f"{fn}: argument 'denominator_arc_weight_index' needs a "
                         f"'denominator', got None")
    n = emissions.shape[1]
    if target_lengths is None:
        target_lengths = jnp.ones(n, jnp.int32)
    else:
        target_lengths = as_int_array(fn, "target_lengths", target_lengths)
        if target_lengths.shape != (n,):
            raise ValueError(f"{fn}: argument 'target_lengths' must be an (N,)-array with "
                             f"N = {n}, got shape {shape_str(target_lengths.shape)}")
    if weights is None:
        weights = jnp.zeros(0, emissions.dtype)
    arrays = (emissions, weights, input_lengths) + tuple(jnp.asarray(p) for p in packed)
    # the reduction in the core, as in the torch frontend (same bits)
    if den is not None:
        return apply_kernel(GRAPH_MMI_KERNEL, arrays + tuple(jnp.asarray(p) for p in den),
                            reduction=reduction, lengths=target_lengths,
                            zero_infinity=bool(zero_infinity))
    return apply_kernel(GRAPH_LOSS_KERNEL, arrays, reduction=reduction, lengths=target_lengths,
                        normalize=bool(normalize), zero_infinity=bool(zero_infinity))


def prepare_graphs(fn, emissions, graphs, input_lengths, weights, arc_weight_index):
    """``(emissions, weights, input_lengths, packed graphs)``, validated (values when
    concrete) by the core, for ``graph_loss`` and ``graph_align``."""
    emissions = as_array(fn, "emissions", emissions)
    weights = as_array(fn, "weights", weights, optional=True)
    input_lengths = as_int_array(fn, "input_lengths", input_lengths)
    graphs, graphs_concrete = device_graphs(graphs)
    packed = check_graph_args(fn, emissions, graphs, input_lengths, weights, arc_weight_index,
                              concrete=is_concrete(input_lengths),
                              graphs_concrete=graphs_concrete)
    return emissions, weights, input_lengths, packed


def device_graphs(graphs):
    """A `PackedGraphs` -> of jax arrays, and whether its values are concrete."""
    if isinstance(graphs, PackedGraphs):
        graphs = PackedGraphs(*(jnp.asarray(x) for x in graphs))
        return graphs, is_concrete(*graphs)
    return graphs, True
