r"""Target-graph loss: one acceptor per sequence intersected with its frames.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``K`` learnable arc
weights; sequence ``b`` has ``T_b = input_lengths[b]`` frames and a graph
$G_b$ (a ``duoloss.gtn.Graph``) whose arc ``a`` goes ``src_a -> dst_a``
with label $k_a \in [0, C)$ and weight

.. math::

    w_a = \text{graph weight}_a + \theta_{i_a} \quad (\text{only if } i_a \ge 0),

where $\theta$ (``weights``, ``(K,)``) is shared by all graphs and
``arc_weight_index`` gives $i_a$ (``-1``: no learnable part).  Tied
weights (many arcs with the same index) express transition models, lexicons
and n-gram token graphs.

A path through $G_b \circ E_b$ takes exactly one arc per frame (the
intersection with the linear graph of ``T_b`` frames is acyclic even when
$G_b$ has self-loops or cycles): with $e_t(k)$ =
``emissions[t, b, k]``,

.. math::

    \alpha_0(n) = [n \in \text{start}], \quad
    \alpha_{t+1}(n) = \sum_{a: \text{dst}_a = n} \alpha_t(\text{src}_a)\,
        e^{w_a + e_t(k_a)}, \quad
    \log Z_b = \log \sum_{n \in \text{accept}} \alpha_{T_b}(n), \\
    \text{loss}_b = -\log Z_b + [\text{normalize}] \sum_{t < T_b}
        \operatorname{logsumexp}_k e_t(k).

This is GTN's ``-forward_score(intersect(G_b, E_b))`` (``normalize=False``) or
``forward_score(E_b) - forward_score(intersect(G_b, E_b))``.  Graphs are
matched on their *input* labels (a transducer behaves like
``compose(E_b, G_b)``).  With the CTC graph of a target it equals CTC.

Gradients: ``d loss / d emissions[t, b, k]`` = (softmax of frame ``t`` if
``normalize``) minus the posterior probability that frame ``t`` is consumed by
an arc labelled ``k``; ``d loss / d weights[i]`` = minus the expected number of
uses of the arcs tied to ``i``.

Epsilon arcs (input label ``-1``) consume no frame, as in ``duoloss.gtn``'s
epsilon-aware ``compose``: with $\epsilon^*$ the closure over the
epsilon arcs (weights $e^{w_a}$), each $\alpha_t$ above is followed
by $\alpha_t \leftarrow \alpha_t \epsilon^*$ (start and accept included,
so epsilon arcs may leave a start node or enter an accept node, and ``T_b = 0``
sums the epsilon-only paths).  Cycles of epsilon arcs are rejected (the sum
would be infinite or need a fixed point).

Denominators (`GRAPH_MMI_KERNEL`, LF-MMI):
$\text{loss}_b = -\log Z(G_b \circ E_b) + \log Z(D_b \circ E_b)$, both
terms by the kernel above; gradients are differences of posteriors / expected
counts.

Implementation: as in `duoloss.core.losses.ctc`, a linear-space float64
forward-backward over the arcs with per-frame rescaling (frame arcs relative to
their largest weight; epsilon arcs, processed in topological order after each
frame, with absolute weights), a per-frame check that the arc posteriors sum to
one, and an exact log-space fallback.  The backward pass runs also when no
gradient is wanted: its check is what detects paths the forward lost to
underflow, so a loss without gradient (``torch.no_grad``, a jitted loss) is
bit-identical to the one computed with it.  Cost ``O(T_b * A_b)`` per
sequence, twice that for the forward-only loss.

NB: ``T_b = 0`` scores the paths without frame arcs.  A graph
without an accepting path of ``T_b`` frame arcs gives ``+inf`` (zero gradient, or the
normaliser's gradient with ``normalize``), or 0 and zero gradients with
``zero_infinity``.  NaN scores, or invalid runtime values, make that sequence
NaN.

References:
  Hannun, Pratap, Kahn, Hsu, "Differentiable Weighted Finite-State Transducers",
  arXiv:2010.01003, 2020.
  Moritz, Hori, Le Roux, "Semi-supervised speech recognition via graph-based
  temporal classification", ICASSP 2021.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numba
import numpy as np
import numpy.typing as npt

from .. import _numerics
from .._numerics import HELPER
from .._numerics import CHECK_TOL as _CHECK_TOL
from .._numerics import FALLBACK as _FALLBACK
from .._numerics import NAN as _NAN
from .._numerics import NEG_INF as _NEG_INF
from .._numerics import OK as _OK
from .._numerics import logaddexp as _lae
from .._pool import run_batch
from .._spec import LossKernel
from ..graph.graph import Graph

__all__ = ["GRAPH_LOSS_KERNEL", "GRAPH_MMI_KERNEL", "PackedGraphs", "check_denominator",
           "check_graph_args", "graph_loss_and_grad", "pack_graphs"]

_TINY = 1e-200
_PARALLEL_MIN_CELLS = 40_000

# Buffers in these kernels: only np.empty(n, np.int64 / np.float64 / np.bool_) and
# np.empty((m, n), np.float64), zeroed by loops: every other form of
# np.zeros/np.full/np.empty is one more overload numba compiles at the first call.


@numba.njit(cache=True, nogil=True, inline="always")
def _zeros1(n):
    out = np.empty(n, np.float64)
    for i in range(n):
        out[i] = 0.0
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _zeros2(m, n):
    out = np.empty((m, n), np.float64)
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
    return out


@numba.njit(**HELPER)
def _graph_linear(b, tb, v_n, a_e, src, dst, lab, w, omega, start, accept, probs, fmax,
                  want_cnt, ge, cnt):
    """Linear-space forward-backward; returns ``(logZ, status)``.

    Arcs ``0 .. a_e-1`` consume a frame (weights ``w`` relative to ``omega``);
    arcs ``a_e ..`` are epsilon arcs in topological order of their sources
    (weights ``w`` absolute).  The backward pass always runs: its per-frame
    check that the arc posteriors sum to one is what detects paths the forward
    lost to underflow, so a loss without gradient takes the same decision (and
    has the same value) as one with.  Adds label posteriors to ``ge`` and (if
    ``want_cnt``) arc counts to ``cnt``.

    Kept specialised (not a semiring instance of `_frames_forward`):
    products of rescaled probabilities need no ``exp``/``log`` per arc and
    frame, and the backward pass needs no ``logaddexp`` either.  Measured here
    (B=8, T=200, CTC graphs of 40 labels, forward and backward): 7.0 ms, against
    13.5 ms for a batch that takes the log-space path (`_graph_log`).
    """
    a_n = src.shape[0]
    alpha = _zeros2(tb + 1, v_n)
    log_a = np.empty(tb + 1, np.float64)
    c = 0.0
    for n in range(v_n):
        if start[n]:
            alpha[0, n] = 1.0
    for a in range(a_e, a_n):
        alpha[0, dst[a]] += alpha[0, src[a]] * w[a]
    for n in range(v_n):
        c += alpha[0, n]
    if c == 0.0:
        return _NEG_INF, _OK
    if not (c >= _TINY and c < np.inf):
        return 0.0, _FALLBACK
    for n in range(v_n):
        alpha[0, n] /= c
    log_a[0] = math.log(c)
    for t in range(tb):
        pt = probs[t, b]
        at = alpha[t]
        an = alpha[t + 1]
        for a in range(a_e):
            x = at[src[a]]
            if x != 0.0:
                an[dst[a]] += x * w[a] * pt[lab[a]]
        for a in range(a_e, a_n):
            an[dst[a]] += an[src[a]] * w[a]
        c = 0.0
        for n in range(v_n):
            c += an[n]
        if c != c or c == np.inf:
            return np.nan, _NAN
        if c < _TINY:
            return 0.0, _FALLBACK
        inv = 1.0 / c
        for n in range(v_n):
            an[n] *= inv
        log_a[t + 1] = log_a[t] + math.log(c) + fmax[t, b] + omega
    zf = 0.0
    for n in range(v_n):
        if accept[n]:
            zf += alpha[tb, n]
    if zf < _TINY:
        return 0.0, _FALLBACK
    logz = log_a[tb] + math.log(zf)
    beta = _zeros1(v_n)
    nb = _zeros1(v_n)
    u = np.empty(a_n if want_cnt else 0, np.float64)
    for n in range(v_n):
        if accept[n]:
            beta[n] = 1.0
    if a_n > a_e:
        for a in range(a_n - 1, a_e - 1, -1):
            beta[src[a]] += w[a] * beta[dst[a]]
        if want_cnt:
            inv = 1.0 / zf
            for a in range(a_e, a_n):
                cnt[a] += alpha[tb, src[a]] * w[a] * beta[dst[a]] * inv
    log_b = 0.0  # log scale of beta at frame t+1
    n_cls = ge.shape[1]
    for t in range(tb - 1, -1, -1):
        r = 0.0
        pt = probs[t, b]
        get = ge[t]
        at = alpha[t]
        for n in range(v_n):
            nb[n] = 0.0
        # One pass: unnormalised arc posteriors go straight into row t of ge.
        for a in range(a_e):
            y = beta[dst[a]]
            q = 0.0
            if y != 0.0:
                ua = w[a] * pt[lab[a]] * y
                nb[src[a]] += ua
                q = at[src[a]] * ua
                r += q
                get[lab[a]] += q
            if want_cnt:
                u[a] = q
        expected = math.exp(logz - log_a[t] - log_b - fmax[t, b] - omega)
        if not (abs(r - expected) <= _CHECK_TOL * expected and r >= _TINY):
            return logz, _FALLBACK  # (an underflowed r would divide by zero below)
        inv = 1.0 / r
        for k in range(n_cls):
            get[k] *= inv
        if a_n > a_e:
            for a in range(a_n - 1, a_e - 1, -1):
                nb[src[a]] += w[a] * nb[dst[a]]
        if want_cnt:
            for a in range(a_e):
                cnt[a] += u[a] * inv
            for a in range(a_e, a_n):
                cnt[a] += at[src[a]] * w[a] * nb[dst[a]] * inv
        if t == 0:
            break
        d = 0.0
        for n in range(v_n):
            d += nb[n]
        if not (d >= _TINY and d < np.inf):
            return logz, _FALLBACK
        inv_d = 1.0 / d
        for n in range(v_n):
            beta[n] = nb[n] * inv_d
        log_b += math.log(d) + fmax[t, b] + omega
    return logz, _OK


@numba.njit(cache=True, nogil=True, inline="always")
def _relax(table, back, t, node, arc, value, tropical):
    """One arc's contribution to ``table[t, node]`` in the log or tropical semiring.

    Log: ``logaddexp``.  Tropical: the value wins when strictly larger (first
    maximum in arc order), or when it is NaN and no arc has won yet (NaN
    propagates); ``back[t, node]`` records the winning arc.
    """
    if tropical:
        if value > table[t, node] or (value != value and back[t, node] < 0):
            table[t, node] = value
            back[t, node] = arc
    else:
        table[t, node] = _lae(table[t, node], value)


@numba.njit(cache=True, nogil=True, inline="always")
def _frames_forward(b, tb, v_n, a_e, src, dst, lab, lw, start, em, table, back, tropical):
    r"""Forward scores over the graph x frames trellis, log or tropical semiring.

    The one recursion behind the log-space loss (`_graph_log`) and the
    Viterbi alignment (`duoloss.core.losses.align._graph_align_one`).  Arcs
    ``0 .. a_e-1`` consume a frame, arcs ``a_e ..`` are epsilon arcs in
    topological order of their sources; ``lw`` are the arcs' log weights.  Fills
    ``table[t, n]`` (``(tb+1, v_n)``, all ``-inf`` on entry) with the
    ``logsumexp`` (log) or the maximum (tropical, with the winning arc in
    ``back``) of the paths of ``t`` frame arcs from a start node to ``n``, the
    epsilon arcs taken after each frame:

    .. math::

        \text{table}_t(n) = \bigoplus_{a: \text{dst}_a = n,\, a < a_e}
            \text{table}_{t-1}(\text{src}_a) + w_a + e_{t-1}(k_a)
            \;\oplus \bigoplus_{a: \text{dst}_a = n,\, a \ge a_e}
            \text{table}_t(\text{src}_a) + w_a.

    ``tropical`` is a constant of the caller (the function is inlined there and
    the other semiring's branch is dropped by the compiler).
    """
    a_n = src.shape[0]
    for n in range(v_n):
        if start[n]:
            table[0, n] = 0.0
    for t in range(tb + 1):
        if t > 0:
            for a in range(a_e):
                x = table[t - 1, src[a]]
                if x != _NEG_INF:
                    _relax(table, back, t, dst[a], a,
                           x + lw[a] + np.float64(em[t - 1, b, lab[a]]), tropical)
        for a in range(a_e, a_n):
            x = table[t, src[a]]
            if x != _NEG_INF:
                _relax(table, back, t, dst[a], a, x + lw[a], tropical)


@numba.njit(**HELPER)
def _graph_log(b, tb, v_n, a_e, src, dst, lab, lw, start, accept, em, want, ge, cnt):
    """Exact log-space forward-backward (slow fallback); returns logZ.

    The forward is `_frames_forward` in the log semiring."""
    a_n = src.shape[0]
    la = np.full((tb + 1, v_n), _NEG_INF)
    _frames_forward(b, tb, v_n, a_e, src, dst, lab, lw, start, em, la,
                    np.empty((0, 0), np.int64), False)
    logz = _NEG_INF
    for n in range(v_n):
        if accept[n]:
            logz = _lae(logz, la[tb, n])
    if not want or logz == _NEG_INF or logz != logz:
        return logz
    lb = np.full(v_n, _NEG_INF)
    for n in range(v_n):
        if accept[n]:
            lb[n] = 0.0
    for t in range(tb, -1, -1):
        if t < tb:
            nb = np.full(v_n, _NEG_INF)
            for a in range(a_e):
                y = lb[dst[a]]
                if y == _NEG_INF:
                    continue
                ua = lw[a] + np.float64(em[t, b, lab[a]]) + y
                nb[src[a]] = _lae(nb[src[a]], ua)
                z = la[t, src[a]] + ua - logz
                if z > -745.0:
                    p = math.exp(z)
                    ge[t, lab[a]] += p
                    cnt[a] += p
            lb = nb
        for a in range(a_n - 1, a_e - 1, -1):
            y = lb[dst[a]]
            if y != _NEG_INF:
                lb[src[a]] = _lae(lb[src[a]], lw[a] + y)
        for a in range(a_e, a_n):
            z = la[t, src[a]] + lw[a] + lb[dst[a]] - logz
            if z > -745.0:
                cnt[a] += math.exp(z)
    return logz


@numba.njit(cache=True, nogil=True)
def _eps_order(v_n, src, dst, lab, perm):
    """Frame arcs first (in graph order), then epsilon arcs in topological order
    of their sources; writes ``perm`` and returns the number of frame arcs, or -1
    for a cycle of epsilon arcs."""
    a_n = src.shape[0]
    a_e = 0
    indeg = np.empty(v_n, np.int64)
    for n in range(v_n):
        indeg[n] = 0
    n_eps = 0
    for a in range(a_n):
        if lab[a] >= 0:
            perm[a_e] = a
            a_e += 1
        else:
            indeg[dst[a]] += 1
            n_eps += 1
    if n_eps == 0:
        return a_e
    # Kahn's algorithm on the epsilon subgraph (adjacency by a counting sort).
    out_off = np.empty(v_n + 1, np.int64)
    for n in range(v_n + 1):
        out_off[n] = 0
    for a in range(a_n):
        if lab[a] < 0:
            out_off[src[a] + 1] += 1
    for n in range(v_n):
        out_off[n + 1] += out_off[n]
    fill = out_off[:v_n].copy()
    out = np.empty(n_eps, np.int64)
    for a in range(a_n):
        if lab[a] < 0:
            out[fill[src[a]]] = a
            fill[src[a]] += 1
    queue = np.empty(v_n, np.int64)
    head = tail = 0
    for n in range(v_n):
        if indeg[n] == 0:
            queue[tail] = n
            tail += 1
    k = a_e
    while head < tail:
        n = queue[head]
        head += 1
        for i in range(out_off[n], out_off[n + 1]):
            a = out[i]
            perm[k] = a
            k += 1
            indeg[dst[a]] -= 1
            if indeg[dst[a]] == 0:
                queue[tail] = dst[a]
                tail += 1
    if tail < v_n:
        return -1
    return a_e


@numba.njit(**HELPER)
def _load_graph(b, n_cls, t_max, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all,
                gw_all, start_all, accept_all, widx_all):
    """Sequence ``b``'s graph (``b % G``), checked and with its arcs in trellis order.

    Shared by the loss (`_graph_one`) and the alignment
    (`duoloss.core.losses.align._graph_align_one`).

    Returns:
      ``(ok, a0, v_n, a_e, perm, src, dst, lab, lw, start, accept)``.  ``ok`` is
      False (and the arrays empty) when ``input_lengths[b]`` is outside ``[0, T]``,
      an offset, node id, label or weight index is out of range, or the epsilon
      arcs form a cycle.  Arc ``i`` of the returned arrays is the graph's local
      arc ``perm[i]`` (global ``a0 + perm[i]``): the ``a_e`` frame arcs first, in
      graph order, then the epsilon arcs in topological order (`_eps_order`);
      ``lw`` is its log weight, graph weight plus its tied ``theta`` (float64).
    """
    n_graphs = node_off.shape[0] - 1
    tb = in_len[b]
    ok = n_graphs > 0 and 0 <= tb <= t_max
    n0 = n1 = a0 = a1 = 0
    if ok:
        g = b % n_graphs
        n0, n1 = node_off[g], node_off[g + 1]
        a0, a1 = arc_off[g], arc_off[g + 1]
        ok = (0 <= n0 <= n1 <= start_all.shape[0] and n1 <= accept_all.shape[0]
              and 0 <= a0 <= a1 <= src_all.shape[0] and a1 <= dst_all.shape[0]
              and a1 <= lab_all.shape[0] and a1 <= gw_all.shape[0] and a1 <= widx_all.shape[0])
    v_n = n1 - n0
    a_n = a1 - a0
    if ok:
        for a in range(a0, a1):
            s, d, k, j = src_all[a], dst_all[a], lab_all[a], widx_all[a]
            if (s < 0 or s >= v_n or d < 0 or d >= v_n or k < -1 or k >= n_cls
                    or j < -1 or j >= theta.shape[0]):
                ok = False
                break
    perm = np.empty(a_n if ok else 0, np.int64)
    a_e = -1
    if ok:
        a_e = _eps_order(v_n, src_all[a0:a1], dst_all[a0:a1], lab_all[a0:a1], perm)
    if a_e < 0:
        empty_i = np.empty(0, np.int64)
        empty_b = np.empty(0, np.bool_)
        return (False, a0, 0, 0, empty_i, empty_i, empty_i, empty_i, np.empty(0, np.float64),
                empty_b,
                empty_b)
    src = np.empty(a_n, np.int64)
    dst = np.empty(a_n, np.int64)
    lab = np.empty(a_n, np.int64)
    lw = np.empty(a_n, np.float64)
    for i in range(a_n):
        o = a0 + perm[i]
        src[i] = src_all[o]
        dst[i] = dst_all[o]
        lab[i] = lab_all[o]
        j = widx_all[o]
        x = np.float64(gw_all[o])
        if j >= 0:
            x += np.float64(theta[j])
        lw[i] = x
    start = np.empty(v_n, np.bool_)
    accept = np.empty(v_n, np.bool_)
    for n in range(v_n):
        start[n] = start_all[n0 + n] != 0
        accept[n] = accept_all[n0 + n] != 0
    return True, a0, v_n, a_e, perm, src, dst, lab, lw, start, accept


@numba.njit(cache=True, nogil=True, inline="always")
def _linear_weights(lw, a_e):
    """Linear-space arc weights for `_graph_linear`: ``(omega, w, eps_ok)``.

    Frame arcs are taken relative to ``omega``, the largest finite frame-arc
    log weight (0 if none); epsilon arcs keep absolute weights (they take no
    per-frame factor), and ``eps_ok`` is False when one of them is too large,
    too small (but not ``-inf``) or NaN for linear space.
    """
    a_n = lw.shape[0]
    omega = _NEG_INF
    for i in range(a_e):
        if lw[i] > omega:
            omega = lw[i]
    if omega == _NEG_INF or omega != omega:
        omega = 0.0
    w = np.empty(a_n, np.float64)
    eps_ok = True
    for i in range(a_n):
        if i < a_e:
            w[i] = math.exp(lw[i] - omega)
        else:
            w[i] = math.exp(lw[i])
            if lw[i] > 30.0 or (lw[i] < -600.0 and lw[i] != _NEG_INF) or lw[i] != lw[i]:
                eps_ok = False
    return omega, w, eps_ok


@numba.njit(cache=True, nogil=True, inline="always")
def _normaliser(b, tb, probs, fmax, ge):
    """Forward score of the unconstrained emissions of sequence ``b`` (``normalize``).

    Returns ``(lognorm, nan)``: ``sum_t logsumexp_k e_t(k)`` (``-inf`` when a
    frame has every class at ``-inf``), and whether a frame sum is NaN or
    ``+inf``.  Writes the softmax of each frame into ``ge[t]``.
    """
    n_cls = probs.shape[2]
    lognorm = 0.0
    for t in range(tb):
        s = 0.0
        for k in range(n_cls):
            s += probs[t, b, k]
        if s != s or s == np.inf:
            return lognorm, True
        if s == 0.0:  # every class -inf: no path at all
            return _NEG_INF, False
        lognorm += fmax[t, b] + math.log(s)
        inv = 1.0 / s
        for k in range(n_cls):
            ge[t, k] = probs[t, b, k] * inv
    return lognorm, False


@numba.njit(**HELPER)
def _graph_one(b, em, probs, fmax, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all,
               gw_all, start_all, accept_all, widx_all, normalize, want_e, want_w, zero_inf,
               losses, g_em, g_w, pending):
    """Loss and gradients of sequence ``b`` by the linear-space forward-backward
    (`_graph_linear`); writes ``losses[b]``, ``g_em[:, b]``, ``g_w[b]`` and
    ``pending[b]`` only.  When linear space reports a fallback, ``pending[b]`` is
    set (its gradient rows left zero) and the driver runs the exact log-space one
    afterwards (`_graph_log_batch`, a kernel compiled only when first needed)."""
    t_max, _, n_cls = em.shape
    k_n = theta.shape[0]
    pending[b] = 0
    if want_e:
        for t in range(t_max):
            for k in range(n_cls):
                g_em[t, b, k] = 0.0
    if want_w:
        for k in range(k_n):
            g_w[b, k] = 0.0
    tb = in_len[b]
    ok, a0, v_n, a_e, perm, src, dst, lab, lw, start, accept = _load_graph(
        b, n_cls, t_max, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all, gw_all,
        start_all, accept_all, widx_all)
    if not ok:
        _graph_nan(b, t_max, want_e, want_w, losses, g_em, g_w)
        return
    a_n = src.shape[0]
    omega, w, eps_ok = _linear_weights(lw, a_e)
    lognorm = 0.0
    ge = _zeros2(max(tb, 1), n_cls)
    if normalize:
        lognorm, nan = _normaliser(b, tb, probs, fmax, ge)
        if nan:
            _graph_nan(b, t_max, want_e, want_w, losses, g_em, g_w)
            return
    ne = _zeros2(tb, n_cls)
    cnt = _zeros1(a_n)
    st = _FALLBACK
    logz = 0.0
    if eps_ok:
        logz, st = _graph_linear(b, tb, v_n, a_e, src, dst, lab, w, omega, start, accept, probs,
                                 fmax, want_w, ne, cnt)
    if st == _FALLBACK:
        pending[b] = 1
        return
    _graph_finish(b, st, logz, lognorm, ge, ne, cnt, a0, perm, widx_all, tb, t_max, normalize,
                  want_e, want_w, zero_inf, losses, g_em, g_w)


@numba.njit(**HELPER)
def _graph_finish(b, st, logz, lognorm, ge, ne, cnt, a0, perm, widx_all, tb, t_max, normalize,
                  want_e, want_w, zero_inf, losses, g_em, g_w):
    """Sequence ``b``'s loss and gradients from its forward-backward's result
    (status ``st``, ``logz``, posteriors ``ne`` per frame and class, expected arc
    counts ``cnt``) and the normaliser (``lognorm``, softmax ``ge``)."""
    n_cls = ge.shape[1]
    a_n = cnt.shape[0]
    if st == _NAN:
        _graph_nan(b, t_max, want_e, want_w, losses, g_em, g_w)
        return
    if logz == _NEG_INF or lognorm == _NEG_INF:
        if zero_inf or lognorm == _NEG_INF:
            losses[b] = 0.0 if zero_inf else np.inf
            return
        losses[b] = np.inf
        if want_e and normalize:
            for t in range(tb):
                for k in range(n_cls):
                    g_em[t, b, k] = ge[t, k]
        return
    losses[b] = lognorm - logz
    if want_e:
        for t in range(tb):
            for k in range(n_cls):
                g_em[t, b, k] = ge[t, k] - ne[t, k] if normalize else -ne[t, k]
    if want_w:
        for i in range(a_n):
            j = widx_all[a0 + perm[i]]
            if j >= 0:
                g_w[b, j] -= cnt[i]


@numba.njit(cache=True, nogil=True)
def _graph_log_batch(order, em, probs, fmax, theta, in_len, node_off, arc_off, src_all, dst_all,
                     lab_all, gw_all, start_all, accept_all, widx_all, normalize, want_e, want_w,
                     zero_inf, losses, g_em, g_w, pending):
    """The sequences of ``order`` that `_graph_one` marked in ``pending``, by the
    exact log-space forward-backward (`_graph_log`): the same steps, in the same
    order, as if `_graph_one` had run them itself (their gradient rows are zero)."""
    t_max, _, n_cls = em.shape
    for i in range(order.shape[0]):
        b = order[i]
        if pending[b] == 0:
            continue
        tb = in_len[b]
        _, a0, v_n, a_e, perm, src, dst, lab, lw, start, accept = _load_graph(
            b, n_cls, t_max, theta, in_len, node_off, arc_off, src_all, dst_all, lab_all,
            gw_all, start_all, accept_all, widx_all)  # ok: _graph_one checked it
        lognorm = 0.0
        ge = _zeros2(max(tb, 1), n_cls)
        if normalize:
            lognorm, _ = _normaliser(b, tb, probs, fmax, ge)
        ne = _zeros2(tb, n_cls)
        cnt = _zeros1(src.shape[0])
        logz = _graph_log(b, tb, v_n, a_e, src, dst, lab, lw, start, accept, em,
                          want_e or want_w, ne, cnt)
        st = _NAN if (logz != logz or logz == np.inf) else _OK
        _graph_finish(b, st, logz, lognorm, ge, ne, cnt, a0, perm, widx_all, tb, t_max,
                      normalize, want_e, want_w, zero_inf, losses, g_em, g_w)


@numba.njit(cache=True, nogil=True, inline="always")
def _graph_nan(b, t_max, want_e, want_w, losses, g_em, g_w):
    losses[b] = np.nan
    if want_e:
        for t in range(t_max):
            for k in range(g_em.shape[2]):
                g_em[t, b, k] = np.nan
    if want_w:
        for k in range(g_w.shape[1]):
            g_w[b, k] = np.nan



@numba.njit(cache=True, nogil=True)
def _graph_batch_serial(order, em, probs, fmax, theta, in_len, node_off, arc_off, src, dst,
                        lab, gw, start, accept, widx, normalize, want_e, want_w, zero_inf,
                        losses, g_em, g_w, pending):
    for i in range(order.shape[0]):
        _graph_one(order[i], em, probs, fmax, theta, in_len, node_off, arc_off, src, dst, lab,
                   gw, start, accept, widx, normalize, want_e, want_w, zero_inf, losses, g_em,
                   g_w, pending)


class PackedGraphs(NamedTuple):
    """A batch of graphs as flat arrays (a pytree for JAX: pass it through ``jit``).

    ``G`` graphs; graph ``g`` owns nodes ``node_off[g]:node_off[g+1]`` and arcs
    ``arc_off[g]:arc_off[g+1]`` of the concatenated arrays (entries past
    ``node_off[-1]`` / ``arc_off[-1]`` are padding and ignored).  ``src``/``dst``
    are node ids local to their graph, ``label`` the input labels, ``weight`` the
    graphs' own (constant) arc weights, ``start``/``accept`` 0/1 flags per node,
    ``arc_weight_index`` the index of each arc's tied learnable weight (``-1``:
    none).

    Examples:
        >>> from duoloss.core import PackedGraphs, pack_graphs  # also in duoloss.torch and duoloss.jax
        >>> from duoloss.graphs import ctc_graph
        >>> packed = pack_graphs([ctc_graph([1]), ctc_graph([2, 2])])  # 2L + 1 nodes each
        >>> isinstance(packed, PackedGraphs), packed.node_off.tolist()
        (True, [0, 3, 8])
    """

    node_off: Any
    arc_off: Any
    src: Any
    dst: Any
    label: Any
    weight: Any
    start: Any
    accept: Any
    arc_weight_index: Any


def pack_graphs(graphs: Sequence[Graph], arc_weight_index: Sequence[Any] | None = None, *,
                num_nodes: int | None = None, num_arcs: int | None = None) -> PackedGraphs:
    """Concatenate graphs into a [`PackedGraphs`][duoloss.torch.PackedGraphs] of numpy arrays.

    Args:
      graphs: sequence of ``duoloss.gtn.Graph`` (one per sequence).
      arc_weight_index: ``None`` or one integer array per graph (one entry per
        arc) of indices into the shared weights, ``-1`` for none.
      num_nodes: pad the node arrays to this total (static shapes, so a jitted
        JAX step does not retrace for every batch); ``None``: no padding.
      num_arcs: pad the arc arrays to this total; ``None``: no padding.

    Returns:
      ``PackedGraphs`` with ``int64`` offsets ``(G+1,)``, ``int64`` ``src``,
      ``dst``, ``label`` and ``arc_weight_index`` ``(A,)``, ``float64`` ``weight``
      ``(A,)`` and ``int8`` ``start``/``accept`` ``(V,)``.

    Raises:
      TypeError/ValueError: not a list of graphs, bad ``arc_weight_index`` shapes,
        or totals larger than ``num_nodes``/``num_arcs``.

    Examples:
        >>> from duoloss.core import PackedGraphs, pack_graphs  # also in duoloss.torch and duoloss.jax
        >>> from duoloss.graphs import ctc_graph
        >>> packed = pack_graphs([ctc_graph([1]), ctc_graph([2, 2])])  # 2L + 1 nodes each
        >>> isinstance(packed, PackedGraphs), packed.node_off.tolist()
        (True, [0, 3, 8])
    """
    from ..graph.graph import Graph, graph_arrays

    fn = "pack_graphs"
    if isinstance(graphs, Graph) or not isinstance(graphs, (list, tuple)):
        raise TypeError(f"{fn}: argument 'graphs' must be a list or tuple of duoloss.gtn.Graph "
                        f"(one per sequence), got {type(graphs).__name__}")
    for b, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"{fn}: argument 'graphs' must hold duoloss.gtn.Graph objects, "
                            f"got {type(g).__name__} at index {b}")
    parts = [graph_arrays(g) for g in graphs]
    n_nodes = np.array([p[0] for p in parts], np.int64)
    n_arcs = np.array([p[1].shape[0] for p in parts], np.int64)
    node_off = np.concatenate([[0], np.cumsum(n_nodes)]).astype(np.int64)
    arc_off = np.concatenate([[0], np.cumsum(n_arcs)]).astype(np.int64)

    def cat(i, dtype):
        if not parts:
            return np.zeros(0, dtype)
        return np.concatenate([np.asarray(p[i], dtype) for p in parts])

    src, dst, lab = cat(1, np.int64), cat(2, np.int64), cat(3, np.int64)
    weight = cat(5, np.float64)
    start, accept = cat(6, np.int8), cat(7, np.int8)
    if arc_weight_index is None:
        widx = np.full(int(arc_off[-1]), -1, np.int64)
    else:
        if not isinstance(arc_weight_index, (list, tuple)) or len(arc_weight_index) != len(graphs):
            raise ValueError(f"{fn}: argument 'arc_weight_index' must be a list of "
                             f"{len(graphs)} integer arrays (one per graph), got "
                             f"{type(arc_weight_index).__name__}"
                             + (f" of length {len(arc_weight_index)}"
                                if isinstance(arc_weight_index, (list, tuple)) else ""))
        idx = []
        for b, (g, x) in enumerate(zip(graphs, arc_weight_index)):
            x = np.asarray(x)
            if x.dtype.kind not in "iu":
                raise TypeError(f"{fn}: argument 'arc_weight_index' must hold integer arrays, "
                                f"got dtype {x.dtype} at graph {b}")
            if x.shape != (g.num_arcs(),):
                raise ValueError(f"{fn}: argument 'arc_weight_index' must hold one index per "
                                 f"arc, shape ({g.num_arcs()},) at graph {b}, got "
                                 f"{tuple(x.shape)}")
            idx.append(x.astype(np.int64))
        widx = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    for arg, total, want in (("num_nodes", int(node_off[-1]), num_nodes),
                             ("num_arcs", int(arc_off[-1]), num_arcs)):
        if want is not None and (isinstance(want, bool) or not isinstance(want, (int, np.integer))
                                 or want < total):
            raise ValueError(f"{fn}: argument '{arg}' must be an int >= the batch's total "
                             f"({total}), got {want!r}")
    if num_nodes is not None:
        pad = int(num_nodes) - start.shape[0]
        start = np.concatenate([start, np.zeros(pad, np.int8)])
        accept = np.concatenate([accept, np.zeros(pad, np.int8)])
    if num_arcs is not None:
        pad = int(num_arcs) - src.shape[0]
        zeros = np.zeros(pad, np.int64)
        src, dst, lab = (np.concatenate([x, zeros]) for x in (src, dst, lab))
        weight = np.concatenate([weight, np.zeros(pad)])
        widx = np.concatenate([widx, np.full(pad, -1, np.int64)])
    return PackedGraphs(node_off, arc_off, src, dst, lab, weight, start, accept, widx)


def check_graph_args(fn, emissions, graphs, input_lengths, weights, arc_weight_index, *,
                     concrete=True, graphs_concrete=True):
    """Validate ``graph_loss``/``graph_align`` arguments; returns a `PackedGraphs`.

    ``graphs`` is a list of ``N`` ``duoloss.gtn.Graph`` (packed here, with
    ``arc_weight_index``) or an already packed `PackedGraphs` of ``N``
    graphs (its own ``arc_weight_index``; the argument must then be ``None``).
    ``emissions``/``weights``/``input_lengths`` need ``.shape`` and ``.dtype``;
    the values of ``input_lengths`` are checked when ``concrete``, those of
    packed graphs when ``graphs_concrete`` (Graph objects always are).
    """
    from .. import _validate as v

    v.check_ndim(fn, "emissions", emissions.shape, (3,), "a (T, N, C)-array")
    v.check_dtype(fn, "emissions", emissions.dtype, v.FLOAT_DTYPES, "a floating")
    t_max, n, n_cls = (int(s) for s in emissions.shape)
    v.check_ndim(fn, "input_lengths", input_lengths.shape, (1,), f"an (N,)-array with N = {n}")
    v.check_dtype(fn, "input_lengths", input_lengths.dtype, v.INT_DTYPES, "an integer")
    if int(input_lengths.shape[0]) != n:
        raise ValueError(f"{fn}: argument 'input_lengths' must be an (N,)-array with N = {n}, "
                         f"got shape {v.shape_str(input_lengths.shape)}"
                         + v.batch_first_hint(emissions.shape, input_lengths.shape[0],
                                              "emissions"))
    n_w = 0
    if weights is not None:
        v.check_ndim(fn, "weights", weights.shape, (1,), "a (K,)-array of arc weights")
        if v.dtype_name(weights.dtype) != v.dtype_name(emissions.dtype):
            raise TypeError(f"{fn}: argument 'weights' must have the dtype of 'emissions' "
                            f"({v.dtype_name(emissions.dtype)}), got "
                            f"{v.dtype_name(weights.dtype)}")
        n_w = int(weights.shape[0])
    packed_in = isinstance(graphs, PackedGraphs)
    if packed_in:
        if arc_weight_index is not None:
            raise ValueError(f"{fn}: argument 'arc_weight_index' must be None when 'graphs' is "
                             f"a PackedGraphs (it carries its own), got "
                             f"{type(arc_weight_index).__name__}")
        packed = graphs
        _check_packed_static(fn, packed, n)
    else:
        if weights is not None and arc_weight_index is None:
            raise ValueError(f"{fn}: argument 'arc_weight_index' must be given with 'weights' "
                             f"(one integer array per graph), got None")
        if arc_weight_index is not None and weights is None:
            raise ValueError(f"{fn}: argument 'weights' must be given with 'arc_weight_index', "
                             f"got None")
        if isinstance(graphs, (list, tuple)) and len(graphs) != n:
            raise ValueError(f"{fn}: argument 'graphs' must hold N = {n} graphs (one per "
                             f"sequence of emissions), got {len(graphs)}"
                             + v.batch_first_hint(emissions.shape, len(graphs), "emissions"))
        try:
            packed = pack_graphs(graphs, arc_weight_index)
        except (TypeError, ValueError) as err:  # re-raise under this function's name
            raise type(err)(str(err).replace("pack_graphs: ", f"{fn}: ", 1)) from None
        graphs_concrete = True
    if graphs_concrete:
        _check_packed_values(fn, packed, n_cls, n_w, weights is not None or not packed_in)
    if concrete:
        v.check_lengths(fn, "input_lengths", np.asarray(input_lengths).astype(np.int64), t_max,
                        "T, the number of frames")
    return packed


def _check_packed_static(fn, packed, n):
    for name, x in zip(PackedGraphs._fields, packed):
        if len(x.shape) != 1:
            raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) must hold 1-D arrays, "
                             f"got '{name}' of shape {tuple(x.shape)}")
    if packed.node_off.shape[0] != n + 1 or packed.arc_off.shape[0] != n + 1:
        raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) must hold N = {n} graphs "
                         f"(offsets of shape ({n + 1},)), got {packed.node_off.shape[0] - 1}")
    a_n = packed.src.shape[0]
    v_n = packed.start.shape[0]
    for name in ("dst", "label", "weight", "arc_weight_index"):
        if getattr(packed, name).shape[0] != a_n:
            raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) arrays 'src' and "
                             f"'{name}' must have the same length, got {a_n} and "
                             f"{getattr(packed, name).shape[0]}")
    if packed.accept.shape[0] != v_n:
        raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) arrays 'start' and 'accept' "
                         f"must have the same length, got {v_n} and {packed.accept.shape[0]}")


def _check_packed_values(fn, packed, n_cls, n_w, has_weights):
    node_off, arc_off, src, dst, lab = (np.asarray(x).astype(np.int64) for x in packed[:5])
    widx = np.asarray(packed.arc_weight_index).astype(np.int64)
    for name, off, size in (("node_off", node_off, packed.start.shape[0]),
                            ("arc_off", arc_off, packed.src.shape[0])):
        if off.size and (off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] > size):
            raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) '{name}' must rise from "
                             f"0 to at most {size}, got {off.tolist()[:8]}")
    a_tot = int(arc_off[-1]) if arc_off.size else 0
    owner = np.searchsorted(arc_off, np.arange(a_tot), side="right") - 1
    n_nodes = (node_off[1:] - node_off[:-1])[owner] if a_tot else np.zeros(0, np.int64)

    def first(mask, what):
        a = int(np.flatnonzero(mask)[0])
        b = int(owner[a])
        return f"{what} at graph {b}, arc {a - int(arc_off[b])}"

    lab, src, dst, widx = lab[:a_tot], src[:a_tot], dst[:a_tot], widx[:a_tot]
    if np.any(lab < -1):
        raise ValueError(f"{fn}: argument 'graphs' must have arc labels >= -1 (-1: epsilon), "
                         f"got " + first(lab < -1, str(int(lab[lab < -1][0]))))
    if np.any(lab >= n_cls):
        bad = lab >= n_cls
        raise ValueError(f"{fn}: argument 'graphs' must have arc labels in [0, {n_cls}) "
                         f"(C from emissions), got " + first(bad, str(int(lab[bad][0]))))
    bad = (src < 0) | (src >= n_nodes) | (dst < 0) | (dst >= n_nodes)
    if np.any(bad):
        raise ValueError(f"{fn}: argument 'graphs' (PackedGraphs) must have arc ends inside "
                         f"their graph, got a bad node id " + first(bad, "").strip())
    if np.any(lab == -1):
        for b in np.unique(owner[lab == -1]):
            a0, a1 = int(arc_off[b]), int(arc_off[b + 1])
            if _has_eps_cycle(int(node_off[b + 1] - node_off[b]), src[a0:a1], dst[a0:a1],
                              lab[a0:a1]):
                raise ValueError(f"{fn}: argument 'graphs' must not contain a cycle of epsilon "
                                 f"arcs (a path consuming no frame that returns to its node), "
                                 f"got one in graph {int(b)}")
    bad = (widx < -1) | (widx >= n_w)
    if np.any(bad):
        if not has_weights:
            raise ValueError(f"{fn}: argument 'weights' must be given: the packed graphs' "
                             f"'arc_weight_index' refers to weights, got None")
        raise ValueError(f"{fn}: argument 'arc_weight_index' must be in [-1, {n_w}) "
                         f"(K = {n_w} weights), got " + first(bad, str(int(widx[bad][0]))))


def _has_eps_cycle(v_n, src, dst, lab):
    perm = np.empty(src.shape[0], np.int64)
    return _eps_order(v_n, np.ascontiguousarray(src, np.int64), np.ascontiguousarray(dst, np.int64),
                      np.ascontiguousarray(lab, np.int64), perm) < 0


def graph_loss_and_grad(emissions: npt.ArrayLike, packed: PackedGraphs,
                        input_lengths: npt.ArrayLike, *, weights: npt.ArrayLike | None = None,
                        normalize: bool = False, want_grad: bool | tuple[bool, bool] = (True, True),
                        zero_infinity: bool = False
                        ) -> tuple[np.ndarray, tuple[np.ndarray | None, np.ndarray | None]]:
    """Per-sequence graph losses and gradients (see the module docstring).

    Args:
      emissions: ``(T, N, C)`` float array.
      packed: the output of [`pack_graphs`][duoloss.core.pack_graphs] (``G`` graphs; sequence ``b`` uses
        graph ``b % G``).
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      weights: ``(K,)`` shared learnable arc weights, or ``None``.
      normalize: add the unconstrained emissions' forward score.
      want_grad: booleans ``(emissions, weights)``.
      zero_infinity: infeasible sequences get loss 0 and zero gradients.

    Returns:
      ``(losses, (g_emissions, g_weights))`` with ``(N,)``, ``(T, N, C)`` and
      ``(N, K)`` arrays (``None`` where not wanted).
    """
    em = np.ascontiguousarray(emissions)
    dtype = em.dtype
    t_max, n, n_cls = em.shape
    node_off, arc_off, src, dst, lab, gw, start, accept, widx = (
        np.ascontiguousarray(x) for x in packed)
    node_off, arc_off, src, dst, lab, widx = (
        x.astype(np.int64, copy=False) for x in (node_off, arc_off, src, dst, lab, widx))
    start = start.astype(np.int8, copy=False)
    accept = accept.astype(np.int8, copy=False)
    gw = gw.astype(np.float64, copy=False)
    theta = (np.zeros(0) if weights is None
             else np.ascontiguousarray(weights).astype(np.float64, copy=False))
    want_e = bool(want_grad[0])
    want_w = bool(want_grad[1]) and weights is not None
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    losses = np.empty(n, np.float64)
    f64 = np.float64  # float64 buffers only: one compiled signature per kernel
    g_em = np.empty((t_max, n, n_cls), f64) if want_e else np.empty((0, 0, 0), f64)
    g_w = (np.empty((n, theta.shape[0]), f64) if want_w else np.empty((0, 0), f64))
    if n:
        lp = em.astype(np.float64, copy=False)
        fmax = lp.max(axis=2)
        fmax[~np.isfinite(fmax)] = 0.0
        probs = np.exp(lp - fmax[:, :, None])
        n_g = max(node_off.shape[0] - 1, 1)
        arcs = np.diff(arc_off) if node_off.shape[0] > 1 else np.zeros(1, np.int64)
        cells = np.clip(il, 0, t_max) * (arcs[np.arange(n) % n_g] + 1)
        order = np.argsort(-cells, kind="stable").astype(np.int64)
        args = (lp, probs, fmax, theta, il, node_off, arc_off, src, dst, lab, gw, start,
                accept, widx, bool(normalize), want_e, want_w, bool(zero_infinity), losses,
                g_em, g_w, np.zeros(n, np.int8))
        run_batch(_graph_batch_serial, order, int(cells.sum()), _PARALLEL_MIN_CELLS, args)
        # The exact log-space fallback compiles only when a call first needs it (and
        # under duoloss.warmup, with no sequence to run, so that it is cached).
        fallback = np.flatnonzero(args[-1])
        if fallback.size or _numerics._compile_both:
            run_batch(_graph_log_batch, fallback, int(cells[fallback].sum()),
                      _PARALLEL_MIN_CELLS, args)
    return losses.astype(dtype, copy=False), (g_em.astype(dtype, copy=False) if want_e else None,
                                              g_w.astype(dtype, copy=False) if want_w else None)


def _graph_run(arrays, want_grad, *, normalize=False, zero_infinity=False):
    emissions, weights, input_lengths = arrays[:3]
    packed = arrays[3:]
    losses, (ge, gw) = graph_loss_and_grad(
        emissions, packed, input_lengths, weights=weights, normalize=normalize,
        want_grad=(want_grad[0], want_grad[1]), zero_infinity=zero_infinity)
    return losses, (ge, gw) + (None,) * (len(arrays) - 2)


#: The graph loss for the frontends' adapters: arrays are ``(emissions (T,N,C),
#: weights (K,), input_lengths (N,), *pack_graphs(...))`` (9 packed arrays,
#: shared by the batch: sequence ``b`` uses graph ``b % G``, so folding vmapped
#: copies of the emissions into the batch keeps each sequence on its graph);
#: static ``normalize`` and ``zero_infinity``.
GRAPH_LOSS_KERNEL = LossKernel(
    name="graph_loss",
    run=_graph_run,
    batch_axes=(1, None, 0) + (None,) * 9,
    differentiable=(True, True) + (False,) * 10,
)


# --------------------------------------------------------------------------- #
# Denominator graphs (LF-MMI)                                                  #
# --------------------------------------------------------------------------- #
def check_denominator(fn, emissions, denominator, weights, index, *, graphs_concrete=True):
    r"""Validate a ``denominator`` argument; returns a `PackedGraphs`.

    ``denominator`` is one ``Graph`` (shared by the batch, packed once: ``G =
    1``), a list of ``N`` graphs, or a `PackedGraphs` of 1 or ``N``
    graphs (then ``index``, the ``denominator_arc_weight_index``, must be
    ``None``).  ``index`` is one integer array (a shared graph) or ``N`` of them.
    """
    from ..graph.graph import Graph

    n, n_cls = int(emissions.shape[1]), int(emissions.shape[2])
    n_w = 0 if weights is None else int(weights.shape[0])

    def rename(err):
        msg = str(err).replace("pack_graphs: ", f"{fn}: ", 1)
        msg = msg.replace("argument 'arc_weight_index'", "argument 'denominator_arc_weight_index'")
        msg = msg.replace("argument 'graphs'", "argument 'denominator'")
        return type(err)(msg)

    if isinstance(denominator, PackedGraphs):
        if index is not None:
            raise ValueError(f"{fn}: argument 'denominator_arc_weight_index' must be None when "
                             f"'denominator' is a PackedGraphs (it carries its own), got an "
                             f"index")
        g = int(denominator.node_off.shape[0]) - 1
        if g not in (1, n):
            raise ValueError(f"{fn}: argument 'denominator' (PackedGraphs) must hold 1 or "
                             f"N = {n} graphs, got {g}")
        try:
            _check_packed_static(fn, denominator, g)
            if graphs_concrete:
                _check_packed_values(fn, denominator, n_cls, n_w, weights is not None)
        except (TypeError, ValueError) as err:
            raise rename(err) from None
        return denominator
    if isinstance(denominator, Graph):
        graphs = [denominator]
        if index is not None and not isinstance(index, (list, tuple)):
            index = [index]
    elif isinstance(denominator, (list, tuple)):
        graphs = list(denominator)
        if len(graphs) != n:
            raise ValueError(f"{fn}: argument 'denominator' must be one Graph or a list of "
                             f"N = {n} graphs, got a list of {len(graphs)}")
    else:
        raise TypeError(f"{fn}: argument 'denominator' must be a duoloss.gtn.Graph, a list of "
                        f"N graphs or a PackedGraphs, got {type(denominator).__name__}")
    if index is not None and weights is None:
        raise ValueError(f"{fn}: argument 'weights' must be given with "
                         f"'denominator_arc_weight_index', got None")
    try:
        packed = pack_graphs(graphs, index)
        _check_packed_values(fn, packed, n_cls, n_w, True)
    except (TypeError, ValueError) as err:
        raise rename(err) from None
    return packed


def _graph_mmi_run(arrays, want_grad, *, zero_infinity=False):
    emissions, weights, input_lengths = arrays[:3]
    num, den = arrays[3:12], arrays[12:21]
    wg = (want_grad[0], want_grad[1])
    ln, (gen, gwn) = graph_loss_and_grad(emissions, num, input_lengths, weights=weights,
                                         want_grad=wg)
    ld, (ged, gwd) = graph_loss_and_grad(emissions, den, input_lengths, weights=weights,
                                         want_grad=wg)
    num_inf = np.isposinf(ln)
    den_inf = np.isposinf(ld) & ~num_inf
    with np.errstate(invalid="ignore"):
        losses = ln - ld
    losses[num_inf] = np.inf
    losses[den_inf] = -np.inf
    ge = gw = None
    if gen is not None:
        ge = gen - ged
        ge[:, num_inf] = -ged[:, num_inf]  # only the denominator's (normaliser's) part
        ge[:, num_inf & np.isposinf(ld)] = 0.0
        ge[:, den_inf] = gen[:, den_inf]
    if gwn is not None:
        gw = gwn - gwd
        gw[num_inf] = -gwd[num_inf]
        gw[num_inf & np.isposinf(ld)] = 0.0
        gw[den_inf] = gwn[den_inf]
    if zero_infinity:
        bad = np.isinf(losses)
        losses[bad] = 0.0
        if ge is not None:
            ge[:, bad] = 0.0
        if gw is not None:
            gw[bad] = 0.0
    return losses, (ge, gw) + (None,) * (len(arrays) - 2)


#: LF-MMI: arrays are ``(emissions, weights, input_lengths, *numerator (9),
#: *denominator (9))`` (two `PackedGraphs`; sequence ``b`` uses numerator
#: ``b % G_num`` and denominator ``b % G_den``); loss
#: ``-log Z(num_b o E_b) + log Z(den_b o E_b)``; static ``zero_infinity``.
GRAPH_MMI_KERNEL = LossKernel(
    name="graph_loss",
    run=_graph_mmi_run,
    batch_axes=(1, None, 0) + (None,) * 18,
    differentiable=(True, True) + (False,) * 19,
)
