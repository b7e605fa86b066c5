"""Viterbi forced alignment for PyTorch: ``ctc_align``, ``asg_align``, ``asg_viterbi``."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core.losses.align import asg_align as _asg_align
from duoloss.core.losses.align import asg_viterbi as _asg_viterbi
from duoloss.core.losses.align import ctc_align as _ctc_align
from duoloss.core.losses.align import graph_align as _graph_align
from duoloss.core.losses.align import check_token_spans_args
from duoloss.core.losses.align import token_spans as _token_spans
from duoloss.core.losses.asg import check_asg_args
from duoloss.core.losses.ctc import check_ctc_static, check_ctc_values
from duoloss.core.losses.graph_loss import check_graph_args

from ._adapter import to_numpy
from ._args import check_tensor, host_graphs, int_array, int_lengths
from ._asg import _prepare
from ._device_align import ctc_viterbi
from ._triton import check_impl

__all__ = ["ctc_align", "asg_align", "asg_viterbi", "graph_align", "token_spans"]


def _out(labels, scores, like):
    """Labels and scores as tensors on ``like``'s device, the scores in its dtype."""
    return (torch.from_numpy(labels).to(like.device),
            torch.from_numpy(scores).to(like.device, like.dtype))


def _floats(t):
    """A host array of a floating tensor (float16/bfloat16: as float32), or None."""
    if t is None:
        return None
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return to_numpy(t)


def ctc_align(log_probs: torch.Tensor, targets: torch.Tensor,
              input_lengths: torch.Tensor | Sequence[int],
              target_lengths: torch.Tensor | Sequence[int], *, blank: int = 0,
              impl: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Viterbi CTC forced alignment (the best CTC path of each target).

    Like ``torchaudio.functional.forced_align``, batched:

    $$
    \text{score}_b = \max_{\pi:\ \mathcal{B}(\pi) = y_b} \sum_{t < T_b}
    \log p_t(\pi_t),
    $$

    where $\mathcal{B}$ removes repeats and then blanks.

    Args:
      log_probs: ``(T, N, C)``-tensor (or unbatched ``(T, C)``) of log-probabilities,
        float16/bfloat16/float32/float64.  ``T`` frames, ``N`` sequences, ``C``
        classes with the blank.
      targets: ``(N, S)`` padded integer targets, or 1-D concatenated targets
        (``(S,)`` for unbatched input); labels in ``[0, C)``, never ``blank``.
      input_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      target_lengths: ``(N,)`` tensor or tuple of ints in ``[0, S]``.
      blank: the blank class.
      impl: ``'auto'`` (default: the device path for CUDA tensors, else the
        host), ``'device'`` (a max-plus loop over frames in torch operations on
        ``log_probs``' device with int8 back-pointers, any device, no Triton) or
        ``'host'`` (the numba core); both give the same labels and scores bit
        for bit; see the Devices page.

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame labels (the blank included;
      ``-1`` on frames at or beyond ``input_lengths[b]``) and ``(N,)`` path scores
      in ``log_probs``' dtype (``(T,)`` and a scalar for unbatched input).

    NB: not differentiable (the scores are detached; the gradient of a Viterbi
    score would be the indicator of the path).  Ties go to the higher CTC state
    (stay > advance > skip, the trailing blank over the last label): labels come
    as early as possible.  An infeasible target gives score ``-inf`` and labels
    ``-1``.  Details: `duoloss.core.losses.align`.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> probs = [[[0.1, 0.8, 0.1]], [[0.1, 0.1, 0.8]], [[0.8, 0.1, 0.1]]]  # (T, N, C): '1', '2', blank
        >>> labels, scores = d.ctc_align(torch.log(torch.tensor(probs)), torch.tensor([[1, 2]]), torch.tensor([3]), torch.tensor([2]))
        >>> labels.tolist(), round(float(scores[0]), 4)  # the best path and its log-probability, 3 log 0.8
        ([[1, 2, 0]], -0.6694)
    """
    fn = "ctc_align"
    check_impl(fn, impl)
    check_tensor(fn, "log_probs", log_probs)
    check_tensor(fn, "targets", targets)
    il = int_lengths(fn, "input_lengths", input_lengths, log_probs)
    tl = int_lengths(fn, "target_lengths", target_lengths, log_probs)
    batched, concatenated = check_ctc_static(
        fn, tuple(log_probs.shape), log_probs.dtype, tuple(targets.shape), targets.dtype,
        il.shape, il.dtype, tl.shape, tl.dtype, blank)
    lp = log_probs if batched else log_probs.unsqueeze(1)
    tg = to_numpy(targets).astype(np.int64, copy=False)
    if not batched:
        tg = tg.reshape(1, -1)
    il = il.astype(np.int64, copy=False).reshape(-1)
    tl = tl.astype(np.int64, copy=False).reshape(-1)
    padded = check_ctc_values(fn, tg, il, tl, lp.shape[0], lp.shape[2], blank, concatenated)
    if impl == "device" or (impl == "auto" and log_probs.device.type == "cuda"):
        dev = log_probs.device
        labels, scores = ctc_viterbi(lp.detach(), torch.from_numpy(padded).to(dev),
                                     torch.from_numpy(il).to(dev), torch.from_numpy(tl).to(dev),
                                     int(blank))
        return (labels, scores) if batched else (labels[0], scores[0])
    labels, scores = _ctc_align(_floats(lp), padded, il, tl, blank=int(blank))
    labels, scores = _out(labels, scores, log_probs)
    return (labels, scores) if batched else (labels[0], scores[0])


def asg_align(emissions: torch.Tensor, transitions: Optional[torch.Tensor], targets: torch.Tensor,
              input_lengths: torch.Tensor | Sequence[int],
              target_lengths: torch.Tensor | Sequence[int], *,
              start_transitions: Optional[torch.Tensor] = None
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Viterbi ASG forced alignment: the best segmentation of each target.

    $$
    \text{score}_b = \max_{\pi \in \text{align}(y_b)} s_{\pi_1}
    + \sum_t e_t(\pi_t) + \sum_{t \ge 2} A_{\pi_t \pi_{t-1}}
    $$

    over the frame labellings that spell the target with every token on >= 1
    consecutive frames (the target paths of [`asg_loss`][duoloss.torch.asg_loss]).

    Args:
      emissions: ``(T, N, C)`` frame scores, as in [`asg_loss`][duoloss.torch.asg_loss].
      transitions: ``(C, C)`` transition scores or ``None``, as in [`asg_loss`][duoloss.torch.asg_loss].
      targets: ``(N, S)`` integer targets, as in [`asg_loss`][duoloss.torch.asg_loss].
      input_lengths: ``(N,)`` frame counts, as in [`asg_loss`][duoloss.torch.asg_loss].
      target_lengths: ``(N,)`` target lengths, as in [`asg_loss`][duoloss.torch.asg_loss].
      start_transitions: ``(C,)`` start scores or ``None``, as in [`asg_loss`][duoloss.torch.asg_loss].

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame tokens (``-1`` past each
      sequence) and ``(N,)`` best-path scores in the emissions' dtype.

    NB: not differentiable.  Ties go to the higher target position (stay rather
    than advance on the backtrace): tokens start as early as possible.
    Infeasible targets (``T_b < L_b``, empty) give ``-inf`` and labels ``-1``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> emissions = torch.tensor([[[2.0, 0.0]], [[2.0, 0.0]], [[0.0, 2.0]]])  # (T, N, C); transitions None: 0
        >>> labels, scores = d.asg_align(emissions, None, torch.tensor([[0, 1]]), torch.tensor([3]), torch.tensor([2]))
        >>> labels.tolist(), float(scores[0])  # the best segmentation of '0 1' and its score
        ([[0, 0, 1]], 6.0)
    """
    fn = "asg_align"
    tg, il, tl = _prepare(fn, emissions, transitions, start_transitions, targets,
                          input_lengths, target_lengths)
    labels, scores = _asg_align(
        _floats(emissions), _floats(transitions), tg, il, tl,
        start_transitions=_floats(start_transitions))
    return _out(labels, scores, emissions)


def asg_viterbi(emissions: torch.Tensor, transitions: Optional[torch.Tensor],
                input_lengths: torch.Tensor | Sequence[int], *,
                start_transitions: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""ASG Viterbi decoding: the best unconstrained frame labelling of each sequence.

    GTN's ``viterbi_path(compose(E, Trans))``: $\max_\pi s_{\pi_1} +
    \sum_t e_t(\pi_t) + \sum_{t \ge 2} A_{\pi_t \pi_{t-1}}$ over all labellings.

    Args:
      emissions: ``(T, N, C)``-tensor of scores.
      transitions: ``(C, C)``-tensor or ``None``.
      input_lengths: ``(N,)`` tensor or tuple of ints in ``[0, T]``.
      start_transitions: ``(C,)``-tensor or ``None``.

    Returns:
      ``(labels, scores)``: ``(N, T)`` int64 frame tokens (``-1`` past each
      sequence) and ``(N,)`` scores.  Ties: the larger token index wins.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> emissions = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]], [[0.0, 2.0]]])  # (T, N, C)
        >>> transitions = torch.tensor([[0.0, -5.0], [0.0, 0.0]])  # [to, from]: 1 -> 0 costs 5
        >>> labels, scores = d.asg_viterbi(emissions, transitions, torch.tensor([3]))
        >>> labels.tolist(), float(scores[0])  # the free best labelling: frame argmaxes, 2 + 1 + 2
        ([[0, 1, 1]], 5.0)
    """
    fn = "asg_viterbi"
    check_tensor(fn, "emissions", emissions)
    check_tensor(fn, "transitions", transitions, optional=True)
    check_tensor(fn, "start_transitions", start_transitions, optional=True)
    il = int_lengths(fn, "input_lengths", input_lengths, emissions)
    n = emissions.shape[1] if emissions.dim() == 3 else 0
    check_asg_args(fn, emissions, transitions, start_transitions, np.zeros((n, 0), np.int64),
                   il, np.zeros(n, np.int64))
    labels, scores = _asg_viterbi(
        _floats(emissions), _floats(transitions), il.astype(np.int64).reshape(-1),
        start_transitions=_floats(start_transitions))
    return _out(labels, scores, emissions)


def graph_align(emissions: torch.Tensor, graphs: Sequence[Any],
                input_lengths: torch.Tensor | Sequence[int], *,
                weights: Optional[torch.Tensor] = None,
                arc_weight_index: Sequence[Any] | None = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Viterbi alignment of each sequence to its target graph.

    GTN's ``viterbi_path(intersect(G_b, E_b))``: the best path of exactly ``T_b``
    arcs, $\max \sum_t (w_{a_t} + e_t(k_{a_t}))$, with arc weights as in
    [`duoloss.torch.graph_loss`][duoloss.torch.graph_loss].

    Args:
      emissions: ``(T, N, C)`` frame scores, as in [`graph_loss`][duoloss.torch.graph_loss].
      graphs: ``N`` target graphs (or a ``PackedGraphs``), as in [`graph_loss`][duoloss.torch.graph_loss].
      input_lengths: ``(N,)`` frame counts, as in [`graph_loss`][duoloss.torch.graph_loss].
      weights: optional ``(K,)`` tied arc weights, as in [`graph_loss`][duoloss.torch.graph_loss].
      arc_weight_index: with ``weights``: one index array per graph, as in [`graph_loss`][duoloss.torch.graph_loss].

    Returns:
      ``(labels, scores, arcs)``: ``(N, T)`` int64 frame labels, ``(N,)`` path
      scores, and ``(N, T)`` int64 index of the arc of ``graphs[b]`` used at each
      frame (e.g. to read word boundaries off a lexicon graph); labels and arcs
      are ``-1`` past each sequence.

    NB: not differentiable.  Ties: the first arc in the graph's arc order and the
    lowest accept node win.  No path: score ``-inf``, labels ``-1``.  Epsilon
    arcs (label ``-1``) consume no frame: they count in the score and are not
    listed in ``arcs``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> from duoloss.graphs import ctc_graph
        >>> probs = [[[0.1, 0.8, 0.1]], [[0.8, 0.1, 0.1]], [[0.1, 0.1, 0.8]]]  # (T, N, C)
        >>> labels, scores, arcs = d.graph_align(torch.log(torch.tensor(probs)), [ctc_graph([1, 2])], torch.tensor([3]))
        >>> labels.tolist(), round(float(scores[0]), 4)  # as ctc_align: '1', blank, '2'
        ([[1, 0, 2]], -0.6694)
    """
    fn = "graph_align"
    check_tensor(fn, "emissions", emissions)
    check_tensor(fn, "weights", weights, optional=True)
    il = int_array(fn, "input_lengths", input_lengths)
    packed = check_graph_args(fn, emissions, host_graphs(graphs), il, weights,
                              arc_weight_index)
    labels, scores, arcs = _graph_align(
        _floats(emissions), packed, il.astype(np.int64).reshape(-1), weights=_floats(weights))
    labels, scores = _out(labels, scores, emissions)
    return labels, scores, torch.from_numpy(arcs).to(emissions.device)


def token_spans(labels: torch.Tensor, log_probs: torch.Tensor, *, blank: int = 0,
                num_spans: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Token spans of CTC frame alignments: ``torchaudio.functional.merge_tokens`` for a batch.

    A span is a maximal run of equal consecutive frame labels other than the
    blank (and the ``-1`` padding past a sequence), as torchaudio's ``TokenSpan``:
    ``start`` its first frame, ``end`` one past its last, and

    $$
    \text{score} = \frac{1}{\text{end} - \text{start}}
    \sum_{t=\text{start}}^{\text{end}-1} \exp(\text{log\_probs}_{t,b,\text{token}}),
    $$

    the mean frame probability (torchaudio: ``merge_tokens(tokens, scores.exp())``
    with ``forced_align``'s frame scores).

    Args:
      labels: ``(N, T)`` integer frame labels in ``[-1, C)`` ([`ctc_align`][duoloss.torch.ctc_align]'s
        output), or ``(T,)`` for unbatched ``log_probs``.
      log_probs: ``(T, N, C)`` (or ``(T, C)``) tensor: the log-probabilities aligned.
      blank: the blank class.
      num_spans: span slots per sequence; ``None``: the largest number of spans
        in the batch (for a feasible ``ctc_align`` output, the largest target
        length).  A sequence with more spans keeps its first ``num_spans``.

    Returns:
      ``(tokens, starts, ends, scores)``, each ``(N, K)`` (``(K,)`` unbatched):
      int64 tokens, start frames and end frames (exclusive), and scores in
      ``log_probs``' dtype; unused slots hold ``-1`` and score ``0``.

    NB: not differentiable.  Typical use: ``labels, _ = ctc_align(log_probs,
    targets, input_lengths, target_lengths)``, then ``token_spans(labels, log_probs)``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> lp = torch.log(torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.3, 0.7], [0.8, 0.2]]))  # (T, C)
        >>> tokens, starts, ends, scores = d.token_spans(torch.tensor([0, 1, 1, 0]), lp)
        >>> tokens.tolist(), starts.tolist(), ends.tolist(), round(float(scores[0]), 6)  # (0.5 + 0.7) / 2
        ([1], [1], [3], 0.6)
    """
    fn = "token_spans"
    check_tensor(fn, "labels", labels)
    check_tensor(fn, "log_probs", log_probs)
    check_token_spans_args(fn, tuple(labels.shape), to_numpy(labels[:0]).dtype,
                           tuple(log_probs.shape), _floats(log_probs[:0]).dtype, blank,
                           num_spans)
    out = _token_spans(to_numpy(labels), _floats(log_probs), blank=blank, num_spans=num_spans,
                       fn=fn)
    dev = log_probs.device
    tokens, starts, ends = (torch.from_numpy(x).to(dev) for x in out[:3])
    scores = torch.from_numpy(out[3]).to(dev, log_probs.dtype)
    if log_probs.dim() == 2:
        return tokens[0], starts[0], ends[0], scores[0]
    return tokens, starts, ends, scores
