"""Composition (and intersection) of two graphs: the state-pair table, label
matching, epsilon handling and the emission of the composed graph's arrays.

Same conventions as `duoloss.core.graph.scores` (module-level
``@numba.njit(cache=True, nogil=True)`` kernels on validated arrays, problems
reported through a status code).
"""
from __future__ import annotations

import numba
import numpy as np

from .._numerics import HELPER
from .scores import csr, csr_into


@numba.njit(**HELPER)
def _slot(key, mask):
    """Hash slot of a non-negative key (splitmix-style mixing in uint64)."""
    x = np.uint64(key)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    return np.int64(x & np.uint64(mask))


@numba.njit(**HELPER)
def _sorted_csr(n, src, lab):
    m = src.shape[0]
    ordered = True   # arcs already sorted by (source, label), e.g. linear graphs
    for a in range(1, m):
        if src[a] < src[a - 1] or (src[a] == src[a - 1] and lab[a] < lab[a - 1]):
            ordered = False
            break
    if ordered:
        ptr = np.zeros(n + 1, np.int64)
        idx = np.empty(m, np.int64)
        for a in range(m):
            ptr[src[a] + 1] += 1
            idx[a] = a
        for i in range(n):
            ptr[i + 1] += ptr[i]
        return ptr, idx
    ptr, idx = csr(n, src)
    # sort each node's arcs by label (insertion sort: out-degrees are small or
    # already sorted, e.g. linear graphs); stable.
    for u in range(n):
        lo = ptr[u]
        hi = ptr[u + 1]
        if hi - lo > 32:
            seg = idx[lo:hi].copy()
            keys = np.empty(hi - lo, np.int64)
            for j in range(hi - lo):
                keys[j] = lab[seg[j]]
            perm = np.argsort(keys, kind="mergesort")
            for j in range(hi - lo):
                idx[lo + j] = seg[perm[j]]
        else:
            for j in range(lo + 1, hi):
                a = idx[j]
                la = lab[a]
                p = j - 1
                while p >= lo and lab[idx[p]] > la:
                    idx[p + 1] = idx[p]
                    p -= 1
                idx[p + 1] = a
    return ptr, idx


@numba.njit(**HELPER)
def _find(key, dense, table, hkeys, hvals, mask):
    """(slot, state) of ``key``; state ``-1`` when absent (slot is where to insert)."""
    if dense:
        return key, table[key]
    h = _slot(key, mask)
    while hkeys[h] != -1 and hkeys[h] != key:
        h = (h + 1) & mask
    if hkeys[h] == -1:
        return h, -1
    return h, hvals[h]


@numba.njit(**HELPER)
def _put(slot, key, state, dense, table, hkeys, hvals):
    if dense:
        table[slot] = state
    else:
        hkeys[slot] = key
        hvals[slot] = state


@numba.njit(**HELPER)
def _reset(dense, table, sq1, sq2, sf, ns, n1, nf):
    """Restore the touched entries of a dense state table to -1."""
    if dense:
        for s in range(ns):
            table[(sq2[s] * n1 + sq1[s]) * nf + sf[s]] = -1


@numba.njit(**HELPER)
def _label_table(n, ptr, slab, enabled):
    """``(K, ok, lo, hi)``: for node ``u`` and label ``0 <= l < K`` its out-arcs
    labelled ``l`` are CSR positions ``lo[u*K+l] : hi[u*K+l]`` (``lo = -1``:
    none).  ``slab`` holds the labels in CSR order, sorted within each node.
    Built only when ``n * K`` is small next to the graph (``ok``); otherwise,
    and for labels below ``-1``, the caller merges the label-sorted lists (any
    int64 label works there)."""
    m = slab.shape[0]
    K = 0
    if not enabled:
        return 0, False, np.zeros(0, np.int64), np.zeros(0, np.int64)
    # the table may hold ``budget`` entries; ``K <= budget // n`` is checked
    # label by label *before* ``l + 1`` or ``n * K`` is formed, so neither can
    # overflow int64 for any stored label (up to 2**63 - 1)
    budget = 4 * (m + n) + 4096
    kmax = budget // max(n, 1)
    for k in range(m):
        l = slab[k]
        if l < -1 or l >= kmax:
            return 0, False, np.zeros(0, np.int64), np.zeros(0, np.int64)
        if l + 1 > K:
            K = l + 1
    size = n * K
    lo = np.full(size, -1, np.int64)
    hi = np.empty(size, np.int64)
    for u in range(n):
        for k in range(ptr[u], ptr[u + 1]):
            l = slab[k]
            if l >= 0:
                j = u * K + l
                if lo[j] < 0:
                    lo[j] = k
                hi[j] = k + 1
    return K, True, lo, hi


@numba.njit(**HELPER)
def _side(n, src, lab, tables):
    """One graph's arcs for matching: CSR ``(ptr, idx)`` sorted by (source, label), the
    labels in that order (one indirection less in the matching loops), its
    ``(node, label)`` table (`_label_table`) and whether it has epsilons."""
    p, i = _sorted_csr(n, src, lab)
    sl = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        sl[k] = lab[i[k]]
    K, use, lo, hi = _label_table(n, p, sl, tables)
    eps = False
    for a in range(lab.shape[0]):
        if lab[a] == -1:
            eps = True
            break
    return p, i, sl, K, use, lo, hi, eps


@numba.njit(**HELPER)
def _workspace(ws, cap, state_cap, arc_cap):
    """The kernel's tables as views of ``ws`` (the layout `compose_emit` reads too):
    ``hvals, sq1, sq2, sf, asrc, adst, aa1, aa2, t_ptr, t_idx, stack, newid``."""
    o = 0
    hvals = ws[o:o + cap]
    o += cap
    sq1 = ws[o:o + state_cap]
    o += state_cap
    sq2 = ws[o:o + state_cap]
    o += state_cap
    sf = ws[o:o + state_cap]
    o += state_cap
    asrc = ws[o:o + arc_cap]
    o += arc_cap
    adst = ws[o:o + arc_cap]
    o += arc_cap
    aa1 = ws[o:o + arc_cap]
    o += arc_cap
    aa2 = ws[o:o + arc_cap]
    o += arc_cap
    t_ptr = ws[o:o + state_cap + 1]
    o += state_cap + 1
    t_idx = ws[o:o + arc_cap]
    o += arc_cap
    stack = ws[o:o + state_cap]
    o += state_cap
    newid = ws[o:o + state_cap]
    return hvals, sq1, sq2, sf, asrc, adst, aa1, aa2, t_ptr, t_idx, stack, newid


@numba.njit(**HELPER)
def _seed(n1, start1, n2, start2, nf, dense, table, hkeys, hvals, mask, sq1, sq2, sf,
          state_cap):
    """The start pairs as the first states: their count, or -1 when ``state_cap`` is too
    small (the table restored)."""
    ns = 0
    for s1 in range(n1):
        if not start1[s1]:
            continue
        for s2 in range(n2):
            if not start2[s2]:
                continue
            if ns == state_cap:
                _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                return -1
            key = (s2 * n1 + s1) * nf
            h, found = _find(key, dense, table, hkeys, hvals, mask)
            if found < 0:
                _put(h, key, ns, dense, table, hkeys, hvals)
                sq1[ns] = s1
                sq2[ns] = s2
                sf[ns] = 0
                ns += 1
    return ns


@numba.njit(cache=True, nogil=True)
def _explore_tight(ns, n1, p1, i1, sl1, dst1, p2, i2, dst2, K2, lo2, hi2, table, sq1, sq2, sf,
                   asrc, adst, aa1, aa2, state_cap, arc_cap):
    """`_explore` for the common case (no epsilons, a dense state table, a ``(node,
    label)`` table for the second graph, e.g. a CTC graph with an emission graph): the
    same states, arcs and order, tighter.  Returns ``(status, ns, na, forward_ids)``."""
    forward_ids = True
    na = 0
    head = 0
    sd1 = np.empty(i1.shape[0], np.int64)
    for k in range(i1.shape[0]):
        sd1[k] = dst1[i1[k]]
    sd2 = np.empty(i2.shape[0], np.int64)
    for k in range(i2.shape[0]):
        sd2[k] = dst2[i2[k]]
    while head < ns:
        q1 = sq1[head]
        base2 = sq2[head] * K2
        for xx in range(p1[q1], p1[q1 + 1]):
            l1 = sl1[xx]
            if l1 >= K2:
                break
            y = lo2[base2 + l1]
            if y < 0:
                continue
            ye = hi2[base2 + l1]
            a1 = i1[xx]
            t1 = sd1[xx]
            for yy in range(y, ye):
                t2 = sd2[yy]
                key = t2 * n1 + t1
                t = table[key]
                fresh = t < 0
                if ns < state_cap:
                    sq1[ns] = t1
                    sq2[ns] = t2
                    sf[ns] = 0
                elif fresh:
                    _reset(True, table, sq1, sq2, sf, ns, n1, 1)
                    return 1, ns, na, False
                t = ns if fresh else t
                table[key] = t
                ns += 1 if fresh else 0
                if t <= head:
                    forward_ids = False
                if na == arc_cap:
                    _reset(True, table, sq1, sq2, sf, ns, n1, 1)
                    return 1, ns, na, False
                asrc[na] = head
                adst[na] = t
                aa1[na] = a1
                aa2[na] = i2[yy]
                na += 1
        head += 1
    return 0, ns, na, forward_ids


@numba.njit(cache=True, nogil=True)
def _explore(head, ns, na, n1, nf, eps, dense, p1, i1, sl1, dst1, K1, use1, lo1, hi1, p2, i2,
             sl2, dst2, K2, use2, lo2, hi2, table, hkeys, hvals, mask, sq1, sq2, sf, asrc,
             adst, aa1, aa2, state_cap, arc_cap):
    """Breadth-first creation of the states reachable from states ``head..ns`` and of their
    arcs: per state, its real matches (by a ``(node, label)`` table or by merging the two
    label-sorted arc lists), then its epsilon moves under the filter.  Returns
    ``(status, ns, na)`` (status 1: a buffer is too small; the table is restored).

    NB: one function on purpose, its sections marked by comments.  Per-state steps as
    functions of their own (``_match_by_table``, ``_match_by_merge``, ``_eps_moves``,
    each taking the state tables as arrays) were tried and measured (one thread,
    2026-11-28): composing two 1,500-node graphs with epsilons on both sides went from
    0.41 to 4.4 ms, two 6,000-node chains (hashed states) from 0.33 to 3.5 ms: numba
    passes ~30 arrays per call with their reference counts, once per explored state.
    numba's IR inlining (``inline="always"``) rejects them."""
    while head < ns:
        q1 = sq1[head]
        q2 = sq2[head]
        f = sf[head]
        k1 = p1[q1]
        e1 = p1[q1 + 1]
        k2 = p2[q2]
        e2 = p2[q2 + 1]
        b1 = k1
        while b1 < e1 and sl1[b1] == -1:
            b1 += 1
        b2 = k2
        while b2 < e2 and sl2[b2] == -1:
            b2 += 1
        # real matches: groups of equal labels (x..xe on side 1, y..ye on side 2),
        # in increasing label order.  The side with fewer arcs is walked and its
        # labels looked up in the other side's (node, label) table when there is
        # one; otherwise the two label-sorted lists are merged.
        if use2 and (e1 - b1 <= e2 - b2 or not use1):
            mode = 1
        elif use1:
            mode = 2
        else:
            mode = 0
        x = b1
        y = b2
        if mode == 1:
            # each side-1 arc (label-sorted) with its label's side-2 arcs: the same
            # (label, x, y) order as the merge, one short loop per state
            for xx in range(b1, e1):
                l1 = sl1[xx]
                if l1 >= K2:
                    break
                j = q2 * K2 + l1
                y = lo2[j]
                if y < 0:
                    continue
                ye = hi2[j]
                a1 = i1[xx]
                t1 = dst1[a1]
                for yy in range(y, ye):
                    a2 = i2[yy]
                    t2 = dst2[a2]
                    key = (t2 * n1 + t1) * nf
                    if dense:
                        # branch-free state lookup: whether the state is new is
                        # unpredictable (about half the arcs here)
                        t = table[key]
                        fresh = t < 0
                        if ns < state_cap:
                            sq1[ns] = t1
                            sq2[ns] = t2
                            sf[ns] = 0
                        elif fresh:
                            _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                            return 1, ns, na
                        t = ns if fresh else t
                        table[key] = t
                        ns += 1 if fresh else 0
                        if na == arc_cap:
                            _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                            return 1, ns, na
                        asrc[na] = head
                        adst[na] = t
                        aa1[na] = a1
                        aa2[na] = a2
                        na += 1
                        continue
                    else:
                        h = _slot(key, mask)
                        while hkeys[h] != -1 and hkeys[h] != key:
                            h = (h + 1) & mask
                        t = -1 if hkeys[h] == -1 else hvals[h]
                    if t < 0:
                        if ns == state_cap:
                            _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                            return 1, ns, na
                        if dense:
                            table[key] = ns
                        else:
                            hkeys[h] = key
                            hvals[h] = ns
                        sq1[ns] = t1
                        sq2[ns] = t2
                        sf[ns] = 0
                        t = ns
                        ns += 1
                    if na == arc_cap:
                        _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                        return 1, ns, na
                    asrc[na] = head
                    adst[na] = t
                    aa1[na] = a1
                    aa2[na] = a2
                    na += 1
        while mode != 1:
            found = False
            xe = x
            ye = y
            if mode == 2:
                while y < e2:
                    l2 = sl2[y]
                    ye = y + 1
                    while ye < e2 and sl2[ye] == l2:
                        ye += 1
                    if l2 < K1:
                        x = lo1[q1 * K1 + l2]
                        if x >= 0:
                            xe = hi1[q1 * K1 + l2]
                            found = True
                            break
                    y = ye
            else:
                while x < e1 and y < e2:
                    l1 = sl1[x]
                    l2 = sl2[y]
                    if l1 < l2:
                        x += 1
                    elif l1 > l2:
                        y += 1
                    else:
                        xe = x + 1
                        while xe < e1 and sl1[xe] == l1:
                            xe += 1
                        ye = y + 1
                        while ye < e2 and sl2[ye] == l1:
                            ye += 1
                        found = True
                        break
            if not found:
                break
            for xx in range(x, xe):
                a1 = i1[xx]
                t1 = dst1[a1]
                for yy in range(y, ye):
                    a2 = i2[yy]
                    t2 = dst2[a2]
                    key = (t2 * n1 + t1) * nf
                    # state lookup, inlined (a helper call costs ~40% here)
                    if dense:
                        h = key
                        t = table[key]
                    else:
                        h = _slot(key, mask)
                        while hkeys[h] != -1 and hkeys[h] != key:
                            h = (h + 1) & mask
                        t = -1 if hkeys[h] == -1 else hvals[h]
                    if t < 0:
                        if ns == state_cap:
                            _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                            return 1, ns, na
                        if dense:
                            table[key] = ns
                        else:
                            hkeys[h] = key
                            hvals[h] = ns
                        sq1[ns] = t1
                        sq2[ns] = t2
                        sf[ns] = 0
                        t = ns
                        ns += 1
                    if na == arc_cap:
                        _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                        return 1, ns, na
                    asrc[na] = head
                    adst[na] = t
                    aa1[na] = a1
                    aa2[na] = a2
                    na += 1
            x = xe
            y = ye
        if eps:
            # 1: first side alone on epsilon; 2: second side alone; 3: both together
            for phase in range(1, 4):
                if phase == 1:
                    if f == 2:
                        continue
                    xs, xe0, ys, ye0 = k1, b1, 0, 1
                elif phase == 2:
                    if f == 1:
                        continue
                    xs, xe0, ys, ye0 = 0, 1, k2, b2
                else:
                    if f != 0:
                        continue
                    xs, xe0, ys, ye0 = k1, b1, k2, b2
                for xx in range(xs, xe0):
                    for yy in range(ys, ye0):
                        if phase == 3:
                            a1 = i1[xx]
                            a2 = i2[yy]
                            t1 = dst1[a1]
                            t2 = dst2[a2]
                            tf = 0
                        elif phase == 1:
                            a1 = i1[xx]
                            a2 = -1
                            t1 = dst1[a1]
                            t2 = q2
                            tf = 1
                        else:
                            a1 = -1
                            a2 = i2[yy]
                            t1 = q1
                            t2 = dst2[a2]
                            tf = 2
                        if nf == 1:
                            tf = 0   # one-sided epsilons: no filter state
                        key = (t2 * n1 + t1) * nf + tf
                        # state lookup, inlined (a helper call costs ~40% here)
                        if dense:
                            h = key
                            t = table[key]
                        else:
                            h = _slot(key, mask)
                            while hkeys[h] != -1 and hkeys[h] != key:
                                h = (h + 1) & mask
                            t = -1 if hkeys[h] == -1 else hvals[h]
                        if t < 0:
                            if ns == state_cap:
                                _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                                return 1, ns, na
                            if dense:
                                table[key] = ns
                            else:
                                hkeys[h] = key
                                hvals[h] = ns
                            sq1[ns] = t1
                            sq2[ns] = t2
                            sf[ns] = tf
                            t = ns
                            ns += 1
                        if na == arc_cap:
                            _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
                            return 1, ns, na
                        asrc[na] = head
                        adst[na] = t
                        aa1[na] = a1
                        aa2[na] = a2
                        na += 1
        head += 1
    return 0, ns, na


@numba.njit(cache=True, nogil=True)
def _trim(ns, na, forward_ids, accept1, accept2, sq1, sq2, asrc, adst, t_ptr, t_idx, stack,
          newid):
    """Keep the co-accessible states, renumbered in creation order (``newid``, -1 for
    the others).  Returns ``(n_out, m_out)``, the kept states and arcs."""
    # newid = -2 unvisited, -1 visited (renumbered below)
    for s in range(ns):
        newid[s] = -1 if (accept1[sq1[s]] and accept2[sq2[s]]) else -2
    m_out = -1
    if forward_ids:
        # arcs were emitted in source order and every arc goes to a later state:
        # one backward sweep settles co-accessibility (e.g. products with a chain);
        # a target's state is final when its in-arcs come, so they are counted here
        m_out = 0
        for k in range(na - 1, -1, -1):
            keep = newid[adst[k]] == -1
            if keep:
                newid[asrc[k]] = -1
            m_out += 1 if keep else 0
    else:
        _coaccessible_dfs(ns, na, asrc, adst, t_ptr, t_idx, stack, newid)
    n_out = 0
    for s in range(ns):
        if newid[s] == -1:
            newid[s] = n_out
            n_out += 1
    if m_out < 0:
        m_out = 0
        for k in range(na):
            if newid[adst[k]] >= 0:
                m_out += 1
    return n_out, m_out


@numba.njit(**HELPER)
def _coaccessible_dfs(ns, na, asrc, adst, t_ptr, t_idx, stack, newid):
    """Mark (-1) every state from which a marked state is reachable: the reverse
    adjacency of the explored arcs (their CSR by target), then a DFS."""
    csr_into(ns, adst[:na], t_ptr, t_idx)
    top = 0
    for s in range(ns):
        if newid[s] == -1:
            stack[top] = s
            top += 1
    while top > 0:
        top -= 1
        v = stack[top]
        for k in range(t_ptr[v], t_ptr[v + 1]):
            u = asrc[t_idx[k]]
            if newid[u] == -2:
                newid[u] = -1
                stack[top] = u
                top += 1


@numba.njit(cache=True, nogil=True)
def compose_kernel(n1, src1, dst1, lab1, start1, accept1, oil1, w1, n2, src2, dst2, lab2,
                   start2, accept2, ool2, w2, state_cap, arc_cap, hkeys, ws, table, tables=True):
    """Composition / intersection of two graphs with an epsilon filter.

    Matches arc ``a1`` of the first graph with arc ``a2`` of the second when
    ``lab1[a1] == lab2[a2] != -1``.  Epsilons (``-1``) move one side alone.  When
    only one side has epsilons, the interleaving of every pair of input paths is
    unique and no filter is needed (one state per node pair).  When both do, the
    three-state epsilon-matching filter of Allauzen, Riley & Schalkwyk (2009)
    keeps exactly one output path for every pair of input paths:

    * filter 0: any move; epsilon on both sides together stays in 0;
    * first side alone on epsilon -> filter 1 (allowed from 0 and 1);
    * second side alone on epsilon -> filter 2 (allowed from 0 and 2);
    * a real match returns to 0.

    Output states are created breadth first from the start pairs and then trimmed
    to the co-accessible ones (renumbered in creation order).  Buffers have the
    fixed sizes ``state_cap`` / ``arc_cap`` (no reallocation inside the loops,
    which keeps numba's reference counting out of them); when they are too small
    the kernel returns ``status = 1`` and the caller retries with larger ones.

    Args (besides the two graphs' arrays): ``oil1`` / ``ool2`` are the labels the
    output arcs copy from each side (``-1`` when that side does not move), ``w1``
    / ``w2`` the weights (output weight ``w1 + w2``); ``hkeys`` (a power-of-two
    length ``>= 2 * state_cap``) and ``ws`` (``>= len(hkeys) + 6 * state_cap +
    5 * arc_cap + 1`` entries) are caller-owned scratch buffers, reused across
    calls so that large temporaries are not re-allocated (and page-faulted).
    ``table``: when it has at least ``n1 * n2 * nf`` entries (``nf`` = 3 with
    epsilons, else 1) it is used as a dense state index instead of the hash
    table; it must hold only ``-1`` on entry and is restored to that on return.

    Returns:
      ``(status, ns, na, nstart, n_out, m_out, topo)``: the explored and trimmed
      sizes, and whether every arc goes to a later state (then the result's node
      ids are a topological order and its arcs are grouped by source);
      `compose_emit` then writes the result (so the caller can allocate its
      arrays, e.g. from a pool).  Output arc ``k`` records the input arcs behind
      it (``-1``: that side did not move).

    The steps: each side's sorted arcs and tables (`_side`), the scratch tables
    (`_workspace`), the start states (`_seed`), the breadth-first exploration
    (`_explore_tight` for the common case, else `_explore`: per state
    `_match_by_table` or `_match_by_merge`, then `_eps_moves`), and the trim
    (`_trim`).  The steps are called once per call, or once per explored state;
    the per-arc work (the state lookup) stays inside them: a split at that level
    (a helper taking the state tables as arrays in the innermost loop) made the
    one-sequence intersect stage of ``benchmarks/graphs.py`` 2-5x slower.
    """
    p1, i1, sl1, K1, use1, lo1, hi1, eps1 = _side(n1, src1, lab1, tables)
    p2, i2, sl2, K2, use2, lo2, hi2, eps2 = _side(n2, src2, lab2, tables)
    eps = eps1 or eps2
    # the filter is needed only when both sides have epsilons: with one side
    # alone the interleaving of a pair of paths is already unique
    nf = 3 if (eps1 and eps2) else 1
    dense = table.shape[0] >= n1 * n2 * nf
    cap = hkeys.shape[0]
    if (cap < 2 * state_cap or (cap & (cap - 1)) != 0
            or ws.shape[0] < cap + 6 * state_cap + 5 * arc_cap + 1):
        return 2, 0, 0, 0, 0, 0, False
    mask = cap - 1
    if not dense:
        hkeys[:] = -1
    hvals, sq1, sq2, sf, asrc, adst, aa1, aa2, t_ptr, t_idx, stack, newid = _workspace(
        ws, cap, state_cap, arc_cap)
    ns = _seed(n1, start1, n2, start2, nf, dense, table, hkeys, hvals, mask, sq1, sq2, sf,
               state_cap)
    if ns < 0:
        return 1, 0, 0, 0, 0, 0, False
    nstart = ns
    if dense and not eps and use2:
        status, ns, na, forward_ids = _explore_tight(
            ns, n1, p1, i1, sl1, dst1, p2, i2, dst2, K2, lo2, hi2, table, sq1, sq2, sf,
            asrc, adst, aa1, aa2, state_cap, arc_cap)
    else:
        status, ns, na = _explore(
            0, ns, 0, n1, nf, eps, dense, p1, i1, sl1, dst1, K1, use1, lo1, hi1, p2, i2, sl2,
            dst2, K2, use2, lo2, hi2, table, hkeys, hvals, mask, sq1, sq2, sf, asrc, adst,
            aa1, aa2, state_cap, arc_cap)
        forward_ids = True
        for k in range(na):
            if adst[k] <= asrc[k]:
                forward_ids = False
                break
    if status != 0:
        return status, 0, 0, 0, 0, 0, False
    _reset(dense, table, sq1, sq2, sf, ns, n1, nf)
    n_out, m_out = _trim(ns, na, forward_ids, accept1, accept2, sq1, sq2, asrc, adst, t_ptr,
                         t_idx, stack, newid)
    return 0, ns, na, nstart, n_out, m_out, forward_ids


@numba.njit(cache=True, nogil=True)
def compose_emit(ns, na, nstart, n_out, m_out, accept1, accept2, oil1, w1, ool2, w2,
                 state_cap, arc_cap, cap, ws, out_src, out_dst, out_a1, out_a2, out_il,
                 out_ol, out_w, out_start, out_accept):
    """Second half of `compose_kernel`: write the trimmed result into
    caller-owned arrays (``m_out`` arcs, ``n_out`` nodes), reading the explored
    states and arcs that `compose_kernel` left in ``ws``.  Returns 0, or 2
    when a buffer is too small (nothing is written then)."""
    if (out_src.shape[0] < m_out or out_dst.shape[0] < m_out or out_a1.shape[0] < m_out
            or out_a2.shape[0] < m_out or out_il.shape[0] < m_out or out_ol.shape[0] < m_out
            or out_w.shape[0] < m_out or out_start.shape[0] < n_out
            or out_accept.shape[0] < n_out or ws.shape[0] < cap + 6 * state_cap + 5 * arc_cap + 1
            or ns > state_cap or na > arc_cap):
        return 2
    o = cap
    sq1 = ws[o:o + state_cap]
    o += state_cap
    sq2 = ws[o:o + state_cap]
    o += 2 * state_cap
    asrc = ws[o:o + arc_cap]
    o += arc_cap
    adst = ws[o:o + arc_cap]
    o += arc_cap
    aa1 = ws[o:o + arc_cap]
    o += arc_cap
    aa2 = ws[o:o + arc_cap]
    o += 2 * arc_cap + 2 * state_cap + 1
    newid = ws[o:o + state_cap]
    for i in range(n_out):
        out_start[i] = False
        out_accept[i] = False
    for s in range(ns):
        if newid[s] >= 0:
            if s < nstart:
                out_start[newid[s]] = True
            if accept1[sq1[s]] and accept2[sq2[s]]:
                out_accept[newid[s]] = True
    j = 0
    for k in range(na):
        if newid[adst[k]] >= 0:
            a1 = aa1[k]
            a2 = aa2[k]
            out_src[j] = newid[asrc[k]]
            out_dst[j] = newid[adst[k]]
            out_a1[j] = a1
            out_a2[j] = a2
            wt = np.float32(0.0)
            if a1 >= 0:
                out_il[j] = oil1[a1]
                wt += w1[a1]
            else:
                out_il[j] = -1
            if a2 >= 0:
                out_ol[j] = ool2[a2]
                wt += w2[a2]
            else:
                out_ol[j] = -1
            out_w[j] = wt
            j += 1
    return 0


@numba.njit(cache=True, nogil=True)
def has_label(lab1, lab2, label):
    """Whether ``label`` occurs in ``lab1`` or ``lab2``."""
    for a in range(lab1.shape[0]):
        if lab1[a] == label:
            return True
    for a in range(lab2.shape[0]):
        if lab2[a] == label:
            return True
    return False
