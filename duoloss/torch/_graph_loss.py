"""Target-graph loss for PyTorch: ``graph_loss`` and ``GraphLoss``."""
from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import numpy as np
import torch

from duoloss.core.losses.graph_loss import (GRAPH_LOSS_KERNEL, GRAPH_MMI_KERNEL, PackedGraphs,
                                      check_denominator, check_graph_args)
from duoloss.core._validate import check_reduction, shape_str

from ._adapter import apply_kernel, autocast_inputs, reduction_weights, torchscript_error
from ._args import check_bool, check_same_device, check_tensor, host_graphs, int_lengths

__all__ = ["graph_loss", "GraphLoss"]


def graph_loss(emissions: torch.Tensor, graphs: Sequence,
               input_lengths: torch.Tensor | Sequence[int], *, normalize: bool = False,
               reduction: Literal["none", "sum", "mean"] = "mean",
               weights: Optional[torch.Tensor] = None, arc_weight_index: Optional[Sequence] = None,
               target_lengths: torch.Tensor | Sequence[int] | None = None,
               zero_infinity: bool = False, denominator: Any = None,
               denominator_arc_weight_index: Any = None) -> torch.Tensor:
    r"""Loss of one target graph per sequence: ``-forward_score(intersect(G_b, E_b))``.

    ``T`` frames, ``N`` sequences, ``C`` classes, ``K`` shared arc weights.  Each
    path of $G_b$ that takes exactly ``T_b`` arcs (one per frame; self-loops
    and cycles are fine) is scored by its arc weights plus the emissions of its
    labels:

    $$
    \text{loss}_b = -\log \sum_{a_1 \dots a_{T_b} \in G_b} \exp \sum_{t}
    \left(w_{a_t} + e_t(k_{a_t})\right)
    + [\text{normalize}] \sum_t \operatorname{logsumexp}_k e_t(k),
    \qquad w_a = \text{graph weight}_a + \theta_{i_a}.
    $$

    With the CTC graph of each target (and ``target_lengths``) it equals
    [`duoloss.torch.ctc_loss`][duoloss.torch.ctc_loss]; ASG is the target-graph loss minus the
    full-transition-graph loss, both with the transitions as tied ``weights``.

    Args:
      emissions: ``(T, N, C)``-tensor of scores (e.g. log-probabilities), float32/float64.
      graphs: ``N`` ``duoloss.gtn.Graph`` acceptors over ``[0, C)`` (matched on their
        input labels; epsilon arcs, label ``-1``, consume no frame and must not form
        a cycle), or the same already packed by
        [`pack_graphs`][duoloss.torch.pack_graphs] (then ``arc_weight_index`` is inside it).  Their own
        arc weights are constants.
      input_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      normalize: add the forward score of the unconstrained emissions (for
        unnormalised ``emissions``, like GTN's "normalized" losses).
      reduction: ``'none'``, ``'sum'`` or ``'mean'`` (each loss divided by its
        ``target_lengths`` entry clamped to >= 1 if given, then the batch mean).
      weights: ``(K,)``-tensor $\theta$ of learnable, tied arc weights.
      arc_weight_index: with ``weights``: ``N`` integer arrays, one index in
        ``[-1, K)`` per arc of each graph (``-1``: the arc has no learnable part).
      target_lengths: optional ``(N,)`` normalisers for ``'mean'``.
      zero_infinity: sequences without a path get loss 0 and zero gradients.
      denominator: LF-MMI: one ``Graph`` shared by the batch (packed once), a list
        of ``N`` graphs, or a [`PackedGraphs`][duoloss.torch.PackedGraphs] of 1 or ``N`` graphs; the loss
        becomes $-\log Z(G_b \circ E_b) + \log Z(D_b \circ E_b)$
        (``normalize`` must then be ``False``: it cancels).  Its arcs may be tied
        to the same ``weights``.
      denominator_arc_weight_index: with ``weights``: one integer array (a shared
        denominator) or ``N`` of them, an index in ``[-1, K)`` per arc.

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    Gradients: w.r.t. emissions, (softmax if ``normalize``) minus the posterior
    of each label at each frame (zero on padded frames); w.r.t. ``weights[i]``,
    minus the expected number of uses of the arcs tied to ``i``.

    NB: a graph without a path of exactly ``T_b`` arcs gives ``+inf``.  Graphs
    and indices are fully validated before any computation.  Maths and
    numerics: `duoloss.core.losses.graph_loss`.

    References:
      Hannun et al., "Differentiable Weighted Finite-State Transducers", 2020.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> from duoloss.graphs import ctc_graph
        >>> log_probs = torch.full((2, 1, 3), -math.log(3))  # (T, N, C): uniform frames
        >>> loss = dt.graph_loss(log_probs, [ctc_graph([1])], torch.tensor([2]))
        >>> round(loss.item(), 4)  # the CTC graph of '1': the CTC loss, log 3
        1.0986
    """
    fn = "graph_loss"
    check_reduction(fn, reduction)
    check_bool(fn, "normalize", normalize)
    check_bool(fn, "zero_infinity", zero_infinity)
    check_tensor(fn, "emissions", emissions)
    check_tensor(fn, "weights", weights, optional=True)
    # autocast: bfloat16 emissions with float32 tied weights, as asg_loss.
    emissions, weights = autocast_inputs(emissions, weights)
    il = int_lengths(fn, "input_lengths", input_lengths, emissions)
    if (arc_weight_index is None and denominator_arc_weight_index is not None
            and denominator is not None and weights is not None
            and isinstance(graphs, (list, tuple))):  # only the denominator is weighted
        arc_weight_index = [np.full(g.num_arcs(), -1, np.int64) if hasattr(g, "num_arcs")
                            else None for g in graphs]
    packed = check_graph_args(fn, emissions, host_graphs(graphs), il, weights, arc_weight_index)
    den = None
    if denominator is not None:
        if normalize:
            raise ValueError(f"{fn}: argument 'normalize' must be False with a 'denominator' "
                             f"(the normaliser cancels), got True")
        den = check_denominator(fn, emissions, host_graphs(denominator), weights,
                                denominator_arc_weight_index)
    elif denominator_arc_weight_index is not None:
        raise ValueError(f"{fn}: argument 'denominator_arc_weight_index' needs a "
                         f"'denominator', got None")
    il = il.astype(np.int64, copy=False).reshape(-1)
    n = il.shape[0]
    if target_lengths is None:
        tl = np.ones(n, np.int64)
    else:
        tl = int_lengths(fn, "target_lengths", target_lengths, emissions)
        tl = tl.astype(np.int64).reshape(-1)
        if tl.shape != (n,):
            raise ValueError(f"{fn}: argument 'target_lengths' must be an (N,)-array with "
                             f"N = {n}, got shape {shape_str(tl.shape)}")
    if weights is None:
        weights = torch.zeros(0, dtype=emissions.dtype, device=emissions.device)
    else:
        check_same_device(fn, "emissions", emissions, weights=weights)
    if den is not None:
        return apply_kernel(GRAPH_MMI_KERNEL, (emissions, weights, il) + tuple(packed)
                            + tuple(den), weights=reduction_weights(reduction, tl),
                            zero_infinity=bool(zero_infinity))
    return apply_kernel(GRAPH_LOSS_KERNEL, (emissions, weights, il) + tuple(packed),
                        weights=reduction_weights(reduction, tl), normalize=bool(normalize),
                        zero_infinity=bool(zero_infinity))


class GraphLoss(torch.nn.Module):
    """Module form of [`graph_loss`][duoloss.torch.graph_loss] holding ``K`` learnable tied arc weights.

    Args:
      num_weights: ``K`` (zeros at initialisation).
      normalize: as in [`graph_loss`][duoloss.torch.graph_loss].
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`graph_loss`][duoloss.torch.graph_loss].
      zero_infinity: as in [`graph_loss`][duoloss.torch.graph_loss].
      dtype: of the weights; ``None``: torch's default dtype.
      device: of the weights.

    Attributes:
      weights: ``(K,)`` ``nn.Parameter``; arcs refer to it through the
        ``arc_weight_index`` passed to `forward`.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> from duoloss.graphs import ctc_graph
        >>> log_probs = torch.full((2, 1, 3), -math.log(3))  # (T, N, C): uniform frames
        >>> loss = dt.GraphLoss()(log_probs, [ctc_graph([1])], torch.tensor([2]))
        >>> round(loss.item(), 4)  # the CTC graph of '1': the CTC loss, log 3
        1.0986
    """

    def __init__(self, num_weights: int = 0, *, normalize: bool = False,
                 reduction: Literal["none", "sum", "mean"] = "mean", zero_infinity: bool = False,
                 dtype: Optional[torch.dtype] = None, device: torch.device | str | None = None
                 ) -> None:
        super().__init__()
        if isinstance(num_weights, bool) or not isinstance(num_weights, int) or num_weights < 0:
            raise ValueError(f"GraphLoss: argument 'num_weights' must be an int >= 0, "
                             f"got {num_weights!r}")
        check_reduction("GraphLoss", reduction)
        check_bool("GraphLoss", "normalize", normalize)
        check_bool("GraphLoss", "zero_infinity", zero_infinity)
        self.weights = torch.nn.Parameter(torch.zeros(num_weights, dtype=dtype, device=device))
        self.normalize = normalize
        self.reduction = reduction
        self.zero_infinity = zero_infinity

    def forward(self, emissions: torch.Tensor, graphs: Sequence[Any],
                input_lengths: torch.Tensor | Sequence[int],
                arc_weight_index: Sequence[Any] | None = None,
                target_lengths: torch.Tensor | Sequence[int] | None = None, denominator: Any = None,
                denominator_arc_weight_index: Any = None) -> torch.Tensor:
        use = (arc_weight_index is not None or isinstance(graphs, PackedGraphs)
               or denominator_arc_weight_index is not None
               or isinstance(denominator, PackedGraphs))
        return graph_loss(emissions, graphs, input_lengths, normalize=self.normalize,
                          reduction=self.reduction, weights=self.weights if use else None,
                          arc_weight_index=arc_weight_index, target_lengths=target_lengths,
                          zero_infinity=self.zero_infinity, denominator=denominator,
                          denominator_arc_weight_index=denominator_arc_weight_index)

    def __prepare_scriptable__(self):
        raise torchscript_error("GraphLoss")

    def extra_repr(self) -> str:
        return (f"num_weights={self.weights.shape[0]}, normalize={self.normalize}, "
                f"reduction={self.reduction!r}, zero_infinity={self.zero_infinity}")
