"""Viterbi forced alignment for JAX: ``ctc_align``, ``asg_align``, ``asg_viterbi``.

Each is one ``jax.pure_callback`` into `duoloss.core.losses.align`; it works under
``jit`` and ``vmap`` (sequentially), and its outputs carry no gradient (the
inputs are passed through ``stop_gradient``).
"""
from __future__ import annotations

from typing import Any, Sequence
import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core.losses.align import asg_align as _asg_align
from duoloss.core.losses.align import asg_viterbi as _asg_viterbi
from duoloss.core.losses.align import ctc_align as _ctc_align
from duoloss.core.losses.align import graph_align as _graph_align
from duoloss.core.losses.align import check_token_spans_args, count_token_spans
from duoloss.core.losses.align import token_spans as _token_spans
from duoloss.core.losses.asg import check_asg_args

from ._adapter import host_call
from ._args import as_array, as_int_array, index_dtype, is_concrete
from ._asg import _prepare
from ._ctc import _prepare_ctc
from ._graph_loss import prepare_graphs
from ._xla import check_impl, use_device
from ._xla.align import ctc_viterbi

__all__ = ["ctc_align", "asg_align", "asg_viterbi", "graph_align", "token_spans"]


def _callback(host, t_max, n, score_dtype, *arrays):
    """``(labels (N, T), scores (N,))`` of ``host`` on ``arrays`` (no gradient)."""
    specs = (jax.ShapeDtypeStruct((n, t_max), index_dtype()),
             jax.ShapeDtypeStruct((n,), score_dtype))
    return host_call(host, specs, *arrays)


def ctc_align(log_probs: ArrayLike, targets: ArrayLike, input_lengths: ArrayLike,
              target_lengths: ArrayLike, *, blank: int = 0,
              impl: str = "auto") -> tuple[jax.Array, jax.Array]:
    r"""Viterbi CTC forced alignment; same arguments and results as [`duoloss.torch.ctc_align`][duoloss.torch.ctc_align].

    $$
    \text{score}_b = \max_{\pi:\ \mathcal{B}(\pi) = y_b} \sum_{t < T_b} \log p_t(\pi_t)
    $$

    Args:
      log_probs: ``(T, N, C)``-array (or unbatched ``(T, C)``) of log-probabilities.
      targets: ``(N, S)`` padded or 1-D concatenated integer targets (never ``blank``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      blank: the blank class.
      impl: ``'auto'`` (default: the XLA device path when ``log_probs`` lives on an
        accelerator, else the host), ``'device'`` (a max-plus ``lax.scan`` with int8
        back-pointers, no callback, any backend) or ``'host'`` (the numba core);
        both give the same labels, and the same scores bit for bit under
        ``jax_enable_x64``; see the Devices page.

    Returns:
      ``(labels, scores)``: ``(N, T)`` integer frame labels (blank included, ``-1``
      past each sequence; int32 unless ``jax_enable_x64``) and ``(N,)`` scores in
      ``log_probs``' dtype.

    NB: no gradient.  Ties go to the higher CTC state (labels as early as
    possible); infeasible targets give ``-inf`` and labels ``-1``.  Under
    ``jit``, invalid label/length values give a NaN score instead of an error.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> probs = [[[0.1, 0.8, 0.1]], [[0.1, 0.1, 0.8]], [[0.8, 0.1, 0.1]]]  # (T, N, C): '1', '2', blank
        >>> labels, scores = d.ctc_align(np.log(np.array(probs)), np.array([[1, 2]]), np.array([3]), np.array([2]))
        >>> labels.tolist(), round(float(scores[0]), 4)  # the best path and its log-probability, 3 log 0.8
        ([[1, 2, 0]], -0.6694)
    """
    fn = "ctc_align"
    check_impl(fn, impl)
    log_probs, targets, input_lengths, target_lengths, batched = _prepare_ctc(
        fn, log_probs, targets, input_lengths, target_lengths, blank)
    t_max, n, _ = log_probs.shape
    if use_device(fn, impl, log_probs):
        labels, scores = ctc_viterbi(jax.lax.stop_gradient(log_probs), targets, input_lengths,
                                     target_lengths, int(blank), index_dtype())
        return (labels, scores) if batched else (labels[0], scores[0])
    host = functools.partial(_ctc_align_host, int(blank))
    labels, scores = _callback(host, t_max, n, log_probs.dtype, log_probs, targets,
                               input_lengths, target_lengths)
    return (labels, scores) if batched else (labels[0], scores[0])


def _ctc_align_host(blank, lp, tg, il, tl):
    return _ctc_align(lp, tg, il, tl, blank=blank)


def asg_align(emissions: ArrayLike, transitions: ArrayLike | None, targets: ArrayLike,
              input_lengths: ArrayLike, target_lengths: ArrayLike, *,
              start_transitions: ArrayLike | None = None) -> tuple[jax.Array, jax.Array]:
    r"""Viterbi ASG forced alignment; same arguments and results as [`duoloss.torch.asg_align`][duoloss.torch.asg_align].

    Args:
      emissions: ``(T, N, C)``-array; transitions: ``(C, C)`` or ``None``;
      targets: ``(N, S)``; input_lengths, target_lengths: ``(N,)``;
      start_transitions: ``(C,)`` or ``None`` (as in [`asg_loss`][duoloss.jax.asg_loss]).

    Returns:
      ``(labels, scores)``: ``(N, T)`` frame tokens (``-1`` past each sequence)
      and ``(N,)`` best-path scores.

    NB: no gradient; ties go to the higher target position.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> emissions = np.array([[[2.0, 0.0]], [[2.0, 0.0]], [[0.0, 2.0]]])  # (T, N, C); transitions None: 0
        >>> labels, scores = d.asg_align(emissions, None, np.array([[0, 1]]), np.array([3]), np.array([2]))
        >>> labels.tolist(), float(scores[0])  # the best segmentation of '0 1' and its score
        ([[0, 0, 1]], 6.0)
    """
    em, tr, sv, tg, il, tl = _prepare("asg_align", emissions, transitions, start_transitions,
                                      targets, input_lengths, target_lengths)
    t_max, n, _ = em.shape
    arrays = [em, tg, il, tl] + [x for x in (tr, sv) if x is not None]
    host = functools.partial(_asg_align_host, tr is not None, sv is not None)
    return _callback(host, t_max, n, em.dtype, *arrays)


def _asg_align_host(has_tr, has_sv, em, tg, il, tl, *rest):
    rest = list(rest)
    tr = rest.pop(0) if has_tr else None
    sv = rest.pop(0) if has_sv else None
    return _asg_align(em, tr, tg, il, tl, start_transitions=sv)


def asg_viterbi(emissions: ArrayLike, transitions: ArrayLike | None, input_lengths: ArrayLike, *,
                start_transitions: ArrayLike | None = None) -> tuple[jax.Array, jax.Array]:
    r"""ASG Viterbi decoding (best unconstrained labelling); see [`duoloss.torch.asg_viterbi`][duoloss.torch.asg_viterbi].

    Args:
      emissions: ``(T, N, C)``-array; transitions: ``(C, C)`` or ``None``;
      input_lengths: ``(N,)``; start_transitions: ``(C,)`` or ``None``.

    Returns:
      ``(labels, scores)``: ``(N, T)`` frame tokens (``-1`` past each sequence)
      and ``(N,)`` scores.  Ties: the larger token index wins.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> emissions = np.array([[[2.0, 0.0]], [[0.0, 1.0]], [[0.0, 2.0]]])  # (T, N, C)
        >>> transitions = np.array([[0.0, -5.0], [0.0, 0.0]])  # [to, from]: 1 -> 0 costs 5
        >>> labels, scores = d.asg_viterbi(emissions, transitions, np.array([3]))
        >>> labels.tolist(), float(scores[0])  # the free best labelling: frame argmaxes, 2 + 1 + 2
        ([[0, 1, 1]], 5.0)
    """
    fn = "asg_viterbi"
    em = as_array(fn, "emissions", emissions)
    tr = as_array(fn, "transitions", transitions, optional=True)
    sv = as_array(fn, "start_transitions", start_transitions, optional=True)
    il = as_int_array(fn, "input_lengths", input_lengths)
    n = em.shape[1] if em.ndim == 3 else 0
    check_asg_args(fn, em, tr, sv, np.zeros((n, 0), np.int64), il, np.zeros(n, np.int64),
                   concrete=is_concrete(il))
    t_max = em.shape[0]
    arrays = [em, il] + [x for x in (tr, sv) if x is not None]
    host = functools.partial(_asg_viterbi_host, tr is not None, sv is not None)
    return _callback(host, t_max, n, em.dtype, *arrays)


def _asg_viterbi_host(has_tr, has_sv, em, il, *rest):
    rest = list(rest)
    tr = rest.pop(0) if has_tr else None
    sv = rest.pop(0) if has_sv else None
    return _asg_viterbi(em, tr, il, start_transitions=sv)


def graph_align(emissions: ArrayLike, graphs: Sequence[Any], input_lengths: ArrayLike, *,
                weights: ArrayLike | None = None, arc_weight_index: Sequence[Any] | None = None
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""Viterbi alignment to target graphs; see [`duoloss.torch.graph_align`][duoloss.torch.graph_align].

    Args:
      emissions: ``(T, N, C)``-array; graphs: ``N`` ``duoloss.gtn.Graph``;
      input_lengths: ``(N,)``; weights, arc_weight_index: as in [`graph_loss`][duoloss.jax.graph_loss].

    Returns:
      ``(labels, scores, arcs)``: ``(N, T)`` frame labels, ``(N,)`` scores and
      ``(N, T)`` arc indices (``-1`` past each sequence).

    NB: no gradient.  Ties: the first arc in arc order wins.

    Examples:
        >>> import numpy as np
        >>> import duoloss.jax as d
        >>> from duoloss.graphs import ctc_graph
        >>> probs = [[[0.1, 0.8, 0.1]], [[0.8, 0.1, 0.1]], [[0.1, 0.1, 0.8]]]  # (T, N, C)
        >>> labels, scores, arcs = d.graph_align(np.log(np.array(probs)), [ctc_graph([1, 2])], np.array([3]))
        >>> labels.tolist(), round(float(scores[0]), 4)  # as ctc_align: '1', blank, '2'
        ([[1, 0, 2]], -0.6694)
    """
    fn = "graph_align"
    em, w, il, packed = prepare_graphs(fn, emissions, graphs, input_lengths, weights,
                                       arc_weight_index)
    if w is None:
        w = jnp.zeros(0, em.dtype)
    t_max, n, _ = em.shape
    specs = (jax.ShapeDtypeStruct((n, t_max), index_dtype()),
             jax.ShapeDtypeStruct((n,), em.dtype),
             jax.ShapeDtypeStruct((n, t_max), index_dtype()))
    return host_call(_graph_align_host, specs, em, w, il, *(jnp.asarray(x) for x in packed))


def _graph_align_host(em, w, il, *packed):
    return _graph_align(em, packed, il, weights=w)


def token_spans(labels: ArrayLike, log_probs: ArrayLike, *, blank: int = 0,
                num_spans: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    r"""Token spans of CTC frame alignments (``torchaudio.functional.merge_tokens`` for a
    batch); same arguments and results as [`duoloss.torch.token_spans`][duoloss.torch.token_spans].

    Args:
      labels: ``(N, T)`` integer frame labels in ``[-1, C)`` (``ctc_align``'s), or
        ``(T,)`` for unbatched ``log_probs``.
      log_probs: ``(T, N, C)`` (or ``(T, C)``) array: the log-probabilities aligned.
      blank: the blank class.
      num_spans: span slots per sequence (a static int).  ``None`` takes the
        largest number of spans in the batch, which needs concrete ``labels``:
        under ``jit`` pass it (e.g. the padded target length).

    Returns:
      ``(tokens, starts, ends, scores)``, each ``(N, K)`` (``(K,)`` unbatched):
      integer tokens, start and end (exclusive) frames, and the mean frame
      probability of each span, ``exp(log_probs[t, b, token])`` averaged over
      ``start <= t < end``, in ``log_probs``' dtype; unused slots hold ``-1`` and
      score ``0``.

    NB: no gradient.  Under ``jit``, a sequence with more than ``num_spans`` spans
    keeps its first ``num_spans`` and labels out of range are not checked.

    Examples:
        >>> import jax.numpy as jnp
        >>> import duoloss.jax as d
        >>> lp = jnp.log(jnp.array([[0.9, 0.1], [0.5, 0.5], [0.3, 0.7], [0.8, 0.2]]))  # (T, C)
        >>> tokens, starts, ends, scores = d.token_spans(jnp.array([0, 1, 1, 0]), lp)
        >>> tokens.tolist(), starts.tolist(), ends.tolist(), round(float(scores[0]), 6)  # (0.5 + 0.7) / 2
        ([1], [1], [3], 0.6)
    """
    fn = "token_spans"
    labels = as_array(fn, "labels", labels)
    log_probs = as_array(fn, "log_probs", log_probs)
    check_token_spans_args(fn, labels.shape, labels.dtype, log_probs.shape, log_probs.dtype,
                           blank, num_spans)
    if is_concrete(labels):
        count = count_token_spans(np.asarray(labels), log_probs.shape[-1], blank, fn)
        num_spans = count if num_spans is None else num_spans
    elif num_spans is None:
        raise ValueError(f"{fn}: num_spans is required when labels are traced (under jit "
                         "or vmap): pass a static int, e.g. the padded target length")
    batched = log_probs.ndim == 3
    lab = labels if batched else labels[None]
    lp = log_probs if batched else log_probs[:, None]
    n = lab.shape[0]
    k = int(num_spans)
    idx = index_dtype()
    specs = (jax.ShapeDtypeStruct((n, k), idx), jax.ShapeDtypeStruct((n, k), idx),
             jax.ShapeDtypeStruct((n, k), idx), jax.ShapeDtypeStruct((n, k), lp.dtype))
    host = functools.partial(_token_spans_host, int(blank), k)
    out = host_call(host, specs, lab, lp)
    return out if batched else tuple(o[0] for o in out)


def _token_spans_host(blank, k, lab, lp):
    n_cls = lp.shape[-1]
    lab = np.where((lab < -1) | (lab >= n_cls), -1, lab)  # traced values: never index out
    return _token_spans(lab, lp, blank=blank, num_spans=k)
