r"""The transducer joiner's normaliser on numpy buffers: ``log_softmax`` over the
classes and the two lattice gathers in one pass, and its backward in one pass.

A transducer loss reads two log-probabilities per lattice cell from the joiner
output ``x`` (``N * T * (U + 1)`` rows of ``V`` logits): the blank and the
cell's next target label.  With $m_r = \max_v x_{r,v}$ and

.. math::

    \operatorname{lse}_r = m_r + \log \sum_v e^{x_{r,v} - m_r}, \qquad
    \text{label}_r = x_{r,y_r} - \operatorname{lse}_r, \qquad
    \text{blank}_r = x_{r,\varnothing} - \operatorname{lse}_r,

and, for cotangents $g^y_r$ (label) and $g^\varnothing_r$ (blank),
$c_r = -(g^y_r + g^\varnothing_r)$,

.. math::

    \frac{\partial}{\partial x_{r,v}} = e^{x_{r,v} - \operatorname{lse}_r}\, c_r
        + [v = y_r]\, g^y_r + [v = \varnothing]\, g^\varnothing_r .

Shapes: ``x`` ``(R, V)`` C-contiguous float32 or float64; ``labels`` ``(R,)``
int64: ``y_r >= 0``, ``-1`` for a row without a label (the last target
position: its label output is ``-inf``), ``-2`` for a row the lattice never
reads (frames past a sequence's length, positions past its target): its
outputs are 0 and its gradient row is 0 whatever the cotangents.  Every row
with ``c_r = 0`` gets an exact zero softmax term (a NaN logit there stays out
of the gradient).

Why it exists (measured, ``benchmarks/rnnt.py``): on a CPU tensor this is the
whole framework-side cost of a transducer loss, and torch's own
``log_softmax`` + ``gather`` + ``softmax`` backward took 2-3x the time of these
two passes (slow on short rows such as ``V = 28``; full-size temporaries at
large ``V``).  The forward reads each row twice (max, then the exponentials
into an L1-sized row buffer that is summed in float64), the backward reads it
once and writes the gradient once.  For float32 rows the exponential is a
vectorisable float32 polynomial (``_exp32``: about 1 ulp on ``[-87, 0.5]``)
and the sums, ``lse`` and the gathered values are float64; float64 rows use
the float64 ``exp`` of `duoloss.core._numerics`.  Rows whose maximum is
NaN or ``+inf`` take the C library's ``exp`` and give NaN, as
``torch.log_softmax``; a NaN logit makes its row's outputs NaN.  A row whose
logits are all ``-inf`` has no probability to share: ``lse``, the label and
the blank outputs are ``-inf`` (every move from the cell is impossible, where
``torch.log_softmax`` gives NaN) and its softmax term is 0.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

# NB: the kernels inline exp_core and call transducer._one_linear; numba's
# on-disk cache is keyed on this file's mtime only, so touch it after editing
# _numerics.py or transducer.py.
from .. import _buffers, _numerics
from .._numerics import HELPER, _bits_to_f32, _f32_to_bits, exp_core, exp_poly, log_poly
from .._pool import run_batch
from .._reduce import flush_subnormals
from .transducer import _batch_serial, _lane_sum, _one_linear, run_fallback

__all__ = ["NO_LABEL", "INACTIVE", "log_softmax_gather", "log_softmax_gather_grad",
           "transducer_log_probs", "transducer_log_probs_grad", "rnnt_loss_from_logits",
           "check_chunk_size", "check_joiner_output"]

def check_chunk_size(fn, chunk_size):
    """``rnnt_loss_from_joiner``'s ``chunk_size`` as a Python int (``None`` kept):
    any integer ``>= 1`` (numpy integers too, as for ``blank``), else a
    ``ValueError`` naming ``fn``."""
    if chunk_size is not None and (isinstance(chunk_size, (bool, np.bool_))
                                   or not isinstance(chunk_size, (int, np.integer))
                                   or chunk_size < 1):
        raise ValueError(f"{fn}: argument 'chunk_size' must be None or an int >= 1, "
                         f"got {chunk_size!r}")
    return None if chunk_size is None else int(chunk_size)


def check_joiner_output(fn, shape, want, n_cls=None, kind="tensor", frames=None):
    """Check one joiner call of ``rnnt_loss_from_joiner`` (the probe and every chunk).

    Args:
      fn: the public name for the message.
      shape: the output's shape, or the type name of a non-array output (a str).
      want: ``(N, t, U + 1)``, what the first three axes must be.
      n_cls: ``V`` learnt from the probe (``None``: this is the probe); every
        chunk's output must have it, or targets would be read against another
        vocabulary.
      kind: ``'tensor'`` or ``'array'``, for the message.
      frames: ``(t0, t1)`` of the chunk, for the message.
    """
    want = tuple(int(d) for d in want)
    if isinstance(shape, str) or len(shape) != 4 or tuple(shape[:3]) != want:
        raise ValueError(f"{fn}: the joiner must map (N, t, 1, D) and (N, 1, U + 1, D') to an "
                         f"(N, t, U + 1, V)-{kind} = {want + ('V',)}, got {shape}")
    if n_cls is not None and int(shape[3]) != int(n_cls):
        where = "" if frames is None else f" (frames {frames[0]} to {frames[1] - 1})"
        raise ValueError(f"{fn}: the joiner must give every chunk of frames the same number of "
                         f"classes V = {n_cls} (from its first call): expected an output of shape "
                         f"{want + (int(n_cls),)}, got {tuple(shape)}{where}")


#: ``labels`` value of a row without a label (its label output is ``-inf``).
NO_LABEL = -1
#: ``labels`` value of a row that is not computed (outputs 0, zero gradient).
INACTIVE = -2

# Rows of about this many logits per work item (a chunk a thread takes).
_CHUNK_ELEMS = 1 << 16
_PARALLEL_MIN_ELEMS = 1 << 18


_F = np.float32
_LOG2E = _F(1.4426950408889634)
_ROUND = _F(12582912.0)                 # 1.5 * 2**23: k + _ROUND rounds k to an integer
_ROUND_BITS = np.int32(0x4B400000)      # its bits
_LN2_HI = _F(0.693359375)               # ln 2 in two parts (Cody-Waite): exact k * _LN2_HI
_LN2_LO = _F(-2.12194440e-4)
_ONE = _F(1.0)
_P2, _P3, _P4 = _F(1 / 2), _F(1 / 6), _F(1 / 24)
_P5, _P6, _P7 = _F(1 / 120), _F(1 / 720), _F(1 / 5040)
_LOW32 = _F(-87.0)                      # exp(-87) ~ 1.6e-38: still a normal float32
_LOW64 = -708.0
_HIGH32 = _F(88.0)                      # exp(88) ~ 1.7e38: still finite in float32
_HIGH64 = 700.0
_EXP_BIAS = np.int32(127)
_MANT = np.int32(23)


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def _exp32(d):
    """float32 ``exp(d)`` for ``-87 <= d <= 0.5`` (degree-7 Taylor on ``|r| <= ln2/2``)."""
    kf = d * _LOG2E + _ROUND
    k = _f32_to_bits(kf) - _ROUND_BITS
    kf = kf - _ROUND
    r = (d - kf * _LN2_HI) - kf * _LN2_LO
    p = _ONE + r * (_ONE + r * (_P2 + r * (_P3 + r * (_P4 + r * (_P5 + r * (_P6 + r * _P7))))))
    return p * _bits_to_f32((k + _EXP_BIAS) << _MANT)


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def _exp32_clamped(d):
    """float32 ``exp(d)`` for any ``d``: 0 below the normal range (``d < -87``),
    clamped at ``exp(88)`` above, NaN for NaN (selects, no branches)."""
    dc = d if not d < _LOW32 else _LOW32
    dc = dc if not dc > _HIGH32 else _HIGH32
    e = _exp32(dc)
    return e if not d < _LOW32 else _F(0.0)


def _exp_nonpos(d):
    """``exp(d)`` for ``d <= 0.5`` in ``d``'s own precision: 0 below the normal
    range, NaN for NaN (vectorisable: selects, no branches)."""
    raise NotImplementedError  # pragma: no cover  (numba only)


@overload(_exp_nonpos, jit_options={"fastmath": {"contract"}})
def _exp_nonpos_impl(d):
    if isinstance(d, types.Float) and d.bitwidth == 32:
        return lambda d: _exp32_clamped(d)  # the upper clamp never acts for d <= 0.5

    def exp64(d):
        dc = d if not d < _LOW64 else _LOW64
        e = exp_core(dc)
        return e if not d < _LOW64 else 0.0
    return exp64


def _cast_like(a, value):
    """``value`` converted to the dtype of the array ``a``."""
    raise NotImplementedError  # pragma: no cover  (numba only)


@overload(_cast_like)
def _cast_like_impl(a, value):
    if a.dtype == types.float32:
        return lambda a, value: np.float32(value)
    return lambda a, value: np.float64(value)


#: float64 sum of ``buf[:n]`` (C-contiguous, any float dtype) in a fixed order of
#: lanes (`duoloss.core.losses.transducer._lane_sum`, inlined: rows of a few dozen
#: logits are summed back to back): vectorised without fastmath reassociation, so
#: the normaliser's bits do not depend on the CPU's vector width (a reassociated
#: loop's order is the vectoriser's choice for the target).
_sum64 = _lane_sum


#: The exponential loops run over whole blocks of this many entries (LLVM
#: vectorises them 8 lanes x 4 deep): a row's last ``V % _BLOCK`` logits go
#: through a padded block buffer instead of a scalar remainder loop (which made
#: rows of ``V = 28`` 3x slower).
_BLOCK = 32


@numba.njit(cache=True, nogil=True, inline="always")
def _tail_buffer(n_cls, dtype_like):
    """The padded tail block (``-inf`` beyond the row) and the exponentials buffer."""
    tail = np.full(_BLOCK, -np.inf, dtype_like.dtype)
    buf = np.empty(n_cls - n_cls % _BLOCK + _BLOCK, dtype_like.dtype)
    return tail, buf


@numba.njit(**HELPER)
def _row_lse(row, tail, buf):
    """``(m, log s)``: the row's max ``m`` and ``s = sum_v exp(row_v - m)``, kept
    apart so that ``log_softmax = (row - m) - log s`` keeps every digit of
    ``log s`` when ``|m|`` is large (``m + log s`` rounded loses them: three
    tied logits at 1e15 gave -1.125 for -log 3)."""
    n_cls = row.shape[0]
    m = row[0]
    for v in range(1, n_cls):
        xv = row[v]
        m = xv if xv > m else m
    if m == -np.inf:
        # every logit -inf: no move leaves the cell (probability 0), not NaN
        return np.float64(m), -np.inf
    if not abs(m) < np.inf:
        # NaN first entry or +inf: the C library's exp (NaN, as torch)
        s = 0.0
        for v in range(n_cls):
            s += math.exp(np.float64(row[v]) - np.float64(m))
        return np.float64(m), math.log(s)
    body = n_cls - n_cls % _BLOCK
    for v in range(body):
        buf[v] = _exp_nonpos(row[v] - m)
    for v in range(body, n_cls):
        tail[v - body] = row[v]
    for j in range(_BLOCK):           # entries past the row are -inf: exp gives 0
        buf[body + j] = _exp_nonpos(tail[j] - m)
    return np.float64(m), math.log(_sum64(buf, body + _BLOCK))


def _exp_unshifted(d):
    """``exp(d)`` in ``d``'s precision for any ``d``: 0 below the normal range,
    clamped above (float32 at ``88``, float64 at ``700``), NaN for NaN."""
    raise NotImplementedError  # pragma: no cover  (numba only)


@overload(_exp_unshifted, jit_options={"fastmath": {"contract"}})
def _exp_unshifted_impl(d):
    if isinstance(d, types.Float) and d.bitwidth == 32:
        return lambda d: _exp32_clamped(d)
    return lambda d: exp_poly(d if not d > _HIGH64 else _HIGH64)


def _unshifted_range(a):
    """``(lo, hi)``: a row's normaliser ``lse`` may come from unshifted
    exponentials when ``lo <= lse <= hi`` (see `_forward_block`)."""
    raise NotImplementedError  # pragma: no cover  (numba only)


@overload(_unshifted_range)
def _unshifted_range_impl(a):
    if a.dtype == types.float32:
        return lambda a: (-16.0, 80.0)
    return lambda a: (-500.0, 690.0)


#: Rows are processed in blocks of about this many logits (L1-resident buffers).
_BLOCK_ELEMS = 4096
#: Rows at least this long need no block-wide pass to vectorise.
_LONG_ROW = 256


@numba.njit(cache=True, nogil=True, inline="always")
def _unshifted_logs(xs, nb, n_cls, e, sums):
    """The ``nb`` rows of ``n_cls`` logits in the flat ``xs``: their unshifted
    exponentials into ``e`` (one vectorised pass), then per row the log of their
    float64 sum into ``sums[i]``, or NaN where that sum lies outside
    `_unshifted_range` (the rows the max-shifted path must redo)."""
    lo, hi = _unshifted_range(xs)
    s_lo = math.exp(lo)
    s_hi = math.exp(hi)
    for i in range(xs.shape[0]):
        e[i] = _exp_unshifted(xs[i])
    for i in range(nb):
        sums[i] = _sum64(e[i * n_cls:], n_cls)
    for i in range(nb):
        sv = sums[i]
        ok = s_lo <= sv <= s_hi
        sums[i] = log_poly(sv if ok else 1.0) if ok else np.nan


@numba.njit(cache=True, nogil=True, inline="always")
def _forward_block(x, r0, r1, labs, blank, lab_o, blank_o, lse_o, e, sums):
    """Rows ``[r0, r1)`` of ``x``, all read by the lattice: one vectorised pass
    of *unshifted* exponentials over the block (into ``e``), per row a float64
    sum, one vectorised pass of logs.  Row ``r0 + i`` has the label
    ``labs[i]`` (or `NO_LABEL`); its normaliser and gathered values go
    to ``lse_o[i]``, ``blank_o[i]`` and ``lab_o[i]``.

    Without the max shift, ``sum_v exp(x_v)`` is exact to the dtype's rounding
    whenever its log ``lse`` lies in `_unshifted_range` (float32:
    ``[-16, 80]``): no exponential overflows (inputs are clamped, and a clamped
    one takes ``lse`` out of the range), and the ones that underflow to 0
    (``x < -87``) weigh below ``e**-71`` of the row.  Other rows (and NaN/inf
    rows, whose sum is NaN or out of range) need the max-shifted path
    (`_row_lse`): the block writes NaN to their three outputs and
    `_shifted_forward` fills them in afterwards (a pass of its own, so that a
    call which meets no such row never compiles it).
    """
    n_cls = x.shape[1]
    nb = r1 - r0
    _unshifted_logs(x.reshape(-1)[r0 * n_cls:r1 * n_cls], nb, n_cls, e, sums)
    for i in range(nb):
        row = x[r0 + i]
        lse = sums[i]
        k = labs[i]
        if lse != lse:  # max-shifted: left to `_shifted_forward`
            lse_o[i] = np.nan
            blank_o[i] = np.nan
            lab_o[i] = np.nan
            continue
        lse_o[i] = lse
        blank_o[i] = np.float64(row[blank]) - lse
        lab_o[i] = np.float64(row[k]) - lse if k >= 0 else -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def _run_end(labels, r, lim):
    """End of the run of rows from ``r`` (below ``lim``) that are not ``INACTIVE``."""
    end = r + 1
    while end < lim and labels[end] != INACTIVE:
        end += 1
    return end


@numba.njit(cache=True, nogil=True, inline="always")
def _shifted_row(row, k, blank, tail, buf):
    """``(lse, log p(blank), log p(k))`` of a row by the max-shifted path
    (`_row_lse`; ``-inf`` for ``k < 0``): subtract the max first, then log s."""
    m, ls = _row_lse(row, tail, buf)
    if m == -np.inf:  # every logit -inf: every move from the cell has probability 0
        return m, m, m
    return (m + ls, (np.float64(row[blank]) - m) - ls,
            (np.float64(row[k]) - m) - ls if k >= 0 else -np.inf)


@numba.njit(cache=True, nogil=True, inline="always")
def _shifted_grad_row(row, ls, c, o, k, g_label, g_blank, blank, tail, buf):
    """Gradient row ``o`` by the max-shifted path, then its gathered entries
    (the part of `_backward_block` a row outside `_unshifted_range` skips)."""
    _backward_row_shifted(row, ls, c, o, tail, buf)
    if k >= 0:
        o[k] += g_label
    o[blank] += g_blank


@numba.njit(cache=True, nogil=True, inline="always")
def _forward_rows(x, labels, blank, r0, r1, lab_out, blank_out, lse_out):
    """Rows ``[r0, r1)`` of the row API (`log_softmax_gather`)."""
    n_cls = x.shape[1]
    per = max(1, _BLOCK_ELEMS // n_cls)
    scratch = np.empty(per * n_cls, x.dtype)
    sums = np.empty(per)
    tail, buf = _tail_buffer(n_cls, x)
    r = r0
    while r < r1:  # blocks of consecutive rows the lattice reads; others cost nothing
        if labels[r] == INACTIVE:
            lse_out[r] = 0.0
            lab_out[r] = 0.0
            blank_out[r] = 0.0
            r += 1
            continue
        end = _run_end(labels, r, min(r + per, r1))
        _forward_block(x, r, end, labels[r:end], blank, lab_out[r:end], blank_out[r:end],
                       lse_out[r:end], scratch, sums)
        r = end
    for r in range(r0, r1):
        if lse_out[r] != lse_out[r]:
            lse, lp_blank, lp_label = _shifted_row(x[r], labels[r], blank, tail, buf)
            lse_out[r] = lse
            blank_out[r] = lp_blank
            lab_out[r] = lp_label


@numba.njit(**HELPER)
def _backward_row_shifted(row, ls, c, o, tail, buf):
    """``o = softmax(row) * c`` by the max-shifted path (any ``ls``).

    ``softmax = exp(row - m) / s`` with the row's max ``m`` and ``s = sum_v
    exp(row_v - m)`` recomputed here (not ``exp(row - lse)``: ``lse = m + log
    s`` rounded loses ``log s``'s digits when ``|m|`` is large; three tied
    logits at 1e15 gave ``e**-1.125`` for 1/3)."""
    n_cls = row.shape[0]
    body = n_cls - n_cls % _BLOCK
    if ls == -np.inf:
        # every logit -inf (`_shifted_row`): no probability to move, a zero softmax term
        for v in range(n_cls):
            o[v] = 0.0
    elif abs(ls) < np.inf:
        m = row[0]
        for v in range(1, n_cls):
            xv = row[v]
            m = xv if xv > m else m
        for v in range(body):
            o[v] = _exp_nonpos(row[v] - m)
        for v in range(body, n_cls):
            tail[v - body] = row[v]
        for j in range(_BLOCK):           # entries past the row are -inf: exp gives 0
            buf[j] = _exp_nonpos(tail[j] - m)
        cc = _cast_like(o, c / (_sum64(o, body) + _sum64(buf, _BLOCK)))
        for v in range(body):
            o[v] *= cc
        for v in range(body, n_cls):
            o[v] = buf[v - body] * cc
    else:
        for v in range(n_cls):
            o[v] = math.exp(np.float64(row[v]) - ls) * c


@numba.njit(cache=True, nogil=True, inline="always")
def _backward_block(x, r0, r1, labs, blank, lse_l, gl_l, gb_l, out, in_out, kb, cs):
    """Gradient rows ``[r0, r1)`` (all read by the lattice; row ``r0 + i`` has
    label ``labs[i]``, normaliser ``lse_l[i]`` and cotangents ``gl_l[i]``
    (label, ignored without one) and ``gb_l[i]`` (blank)):
    ``exp(x) * (c e**-lse)`` where ``lse`` lies in `_unshifted_range`
    (see `_forward_block`), exact zeros where ``c = 0``; rows that need the
    max-shifted path are left to `_shifted_backward` (which writes them
    whole).  With ``in_out``, ``out``'s rows already hold ``exp(x)``
    (the forward's exponentials) and are scaled in place; else the
    exponentials are computed in one vectorised pass over the block: ``kb``
    holds each row's factor once per logit (an L1-sized buffer), ``cs`` each
    row's ``c``."""
    n_cls = x.shape[1]
    lo, hi = _unshifted_range(x)
    for i in range(r1 - r0):
        k = labs[i]
        c = 0.0 - ((gl_l[i] if k >= 0 else 0.0) + gb_l[i])
        cs[i] = c
        ls = lse_l[i]
        kr = _cast_like(kb, c * math.exp(-ls) if (c != 0.0 and lo <= ls <= hi) else 0.0)
        if in_out or n_cls >= _LONG_ROW:  # no block-wide pass needed to vectorise
            o = out[r0 + i]
            if in_out:
                for v in range(n_cls):
                    o[v] *= kr
            else:
                row = x[r0 + i]
                for v in range(n_cls):
                    o[v] = _exp_unshifted(row[v]) * kr
            continue
        kb_row = kb[i * n_cls:(i + 1) * n_cls]
        for v in range(n_cls):
            kb_row[v] = kr
    if not in_out and n_cls < _LONG_ROW:
        xs = x.reshape(-1)[r0 * n_cls:r1 * n_cls]
        os = out.reshape(-1)[r0 * n_cls:r1 * n_cls]
        for j in range(xs.shape[0]):
            os[j] = _exp_unshifted(xs[j]) * kb[j]
    for i in range(r1 - r0):
        o = out[r0 + i]
        k = labs[i]
        c = cs[i]
        ls = lse_l[i]
        if c == 0.0:
            for v in range(n_cls):
                o[v] = 0.0
        elif not lo <= ls <= hi:
            continue  # max-shifted: left to `_shifted_backward`
        if k >= 0:
            o[k] += gl_l[i]
        o[blank] += gb_l[i]


@numba.njit(cache=True, nogil=True, inline="always")
def _backward_rows(x, lse, labels, blank, g_lab, g_blank, r0, r1, out):
    n_cls = x.shape[1]
    per = max(1, _BLOCK_ELEMS // n_cls)
    kb = np.empty(per * n_cls, x.dtype)
    cs = np.empty(per)
    tail, buf = _tail_buffer(n_cls, x)
    r = r0
    while r < r1:
        if labels[r] == INACTIVE:
            o = out[r]
            for v in range(n_cls):
                o[v] = 0.0
            r += 1
            continue
        end = _run_end(labels, r, min(r + per, r1))
        _backward_block(x, r, end, labels[r:end], blank, lse[r:end], g_lab[r:end],
                        g_blank[r:end], out, False, kb, cs)
        r = end
    lo, hi = _unshifted_range(x)
    for r in range(r0, r1):
        k = labels[r]
        if k == INACTIVE:
            continue
        c = 0.0 - ((g_lab[r] if k >= 0 else 0.0) + g_blank[r])
        if c != 0.0 and not lo <= lse[r] <= hi:
            _shifted_grad_row(x[r], lse[r], c, out[r], k, g_lab[r], g_blank[r], blank, tail, buf)



# The row and frame kernels take the chunks to compute (int64 indices, each
# ``rows_per_chunk`` rows or ``per_chunk`` frames): `run_batch` gives each
# thread its own chunks.  The frame kernels call the same compiled frame loops
# as the fused kernel (`_frames_forward_fn`, `_frames_backward_fn`, below)
# rather than inlining a second copy.


@numba.njit(cache=True, nogil=True)
def _forward_serial(chunks, x, labels, blank, rows_per_chunk, lab_out, blank_out, lse_out):
    n_rows = x.shape[0]
    for i in range(chunks.shape[0]):
        r0 = chunks[i] * rows_per_chunk
        _forward_rows(x, labels, blank, r0, min(r0 + rows_per_chunk, n_rows), lab_out,
                      blank_out, lse_out)



@numba.njit(cache=True, nogil=True)
def _backward_serial(chunks, x, lse, labels, blank, g_lab, g_blank, rows_per_chunk, out):
    n_rows = x.shape[0]
    for i in range(chunks.shape[0]):
        r0 = chunks[i] * rows_per_chunk
        _backward_rows(x, lse, labels, blank, g_lab, g_blank, r0,
                       min(r0 + rows_per_chunk, n_rows), out)


def _rows(fn, x, labels, blank):
    """Checked ``(x (R, V), labels (R,) int64, blank)``; raises before any kernel."""
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{fn}: 'x' must be a 2-D float32/float64 array (R, V), got "
                        f"{x.ndim}-D {x.dtype}")
    n_rows, n_cls = x.shape
    if n_cls < 1:
        raise ValueError(f"{fn}: 'x' must have at least one class, got shape {x.shape}")
    x = np.ascontiguousarray(x)
    labels = np.ascontiguousarray(labels, dtype=np.int64).reshape(-1)
    if labels.shape[0] != n_rows:
        raise ValueError(f"{fn}: 'labels' must have {n_rows} entries (one per row of x), "
                         f"got {labels.shape[0]}")
    if n_rows and (labels.min() < INACTIVE or labels.max() >= n_cls):
        raise ValueError(f"{fn}: 'labels' must lie in [{INACTIVE}, {n_cls - 1}], got "
                         f"[{labels.min()}, {labels.max()}]")
    blank = int(blank)
    if not 0 <= blank < n_cls:
        raise ValueError(f"{fn}: 'blank' must lie in [0, {n_cls - 1}], got {blank}")
    return x, labels, blank, max(1, _CHUNK_ELEMS // n_cls)


def _out_array(fn, out, x):
    """``out`` checked to be a writeable C-contiguous array like ``x``, or a new one
    (a cached buffer when large: `duoloss.core._buffers`; the kernels write every
    entry)."""
    if out is None:
        return _buffers.empty(x.shape, x.dtype)
    if (out.shape != x.shape or out.dtype != x.dtype or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ValueError(f"{fn}: 'out' must be a writeable C-contiguous {x.dtype} array of "
                         f"shape {x.shape}, got {out.dtype} {out.shape}")
    return out


def log_softmax_gather(x, labels, blank):
    """``(label, blank, lse)``: each row's gathered log-probabilities and normaliser.

    Args:
      x: ``(R, V)`` float32/float64 logits.
      labels: ``(R,)`` integers: the label to gather per row, `NO_LABEL`
        or `INACTIVE` (see the module doc).
      blank: the blank class in ``[0, V)``.
    Returns:
      ``label (R,)`` and ``blank (R,)`` in ``x``'s dtype, ``lse (R,)`` float64
      (keep it for `log_softmax_gather_grad`).
    """
    x, labels, blank, rows_per_chunk = _rows("log_softmax_gather", x, labels, blank)
    n_rows = x.shape[0]
    lab_out = np.empty(n_rows, x.dtype)
    blank_out = np.empty(n_rows, x.dtype)
    lse = np.empty(n_rows, np.float64)
    if n_rows:
        args = (x, labels, blank, rows_per_chunk, lab_out, blank_out, lse)
        run_batch(_forward_serial, np.arange(-(-n_rows // rows_per_chunk)), x.size,
                  _PARALLEL_MIN_ELEMS, args)
    return lab_out, blank_out, lse


def log_softmax_gather_grad(x, lse, labels, blank, g_label, g_blank, out=None):
    """The gradient w.r.t. ``x`` of ``sum(g_label * label + g_blank * blank)``.

    Args:
      x, labels, blank: as in `log_softmax_gather`.
      lse: ``(R,)`` float64 from `log_softmax_gather`.
      g_label, g_blank: ``(R,)`` cotangents (``g_label`` is ignored on rows
        without a label).
      out: optional ``(R, V)`` C-contiguous array of ``x``'s dtype to write into.

    Returns:
      ``(R, V)`` gradient in ``x``'s dtype (``out`` when given).
    """
    fn = "log_softmax_gather_grad"
    x, labels, blank, rows_per_chunk = _rows(fn, x, labels, blank)
    n_rows = x.shape[0]
    lse = np.ascontiguousarray(lse, dtype=np.float64).reshape(-1)
    g_label = np.ascontiguousarray(g_label, dtype=np.float64).reshape(-1)
    g_blank = np.ascontiguousarray(g_blank, dtype=np.float64).reshape(-1)
    for name, a in (("lse", lse), ("g_label", g_label), ("g_blank", g_blank)):
        if a.shape[0] != n_rows:
            raise ValueError(f"{fn}: '{name}' must have {n_rows} entries, got {a.shape[0]}")
    out = _out_array(fn, out, x)
    if n_rows:
        args = (x, lse, labels, blank, g_label, g_blank, rows_per_chunk, out)
        run_batch(_backward_serial, np.arange(-(-n_rows // rows_per_chunk)), x.size,
                  _PARALLEL_MIN_ELEMS, args)
    return out


# --------------------------------------------------------------------------- #
# The RNN-T lattice straight from the joiner output                            #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True, inline="always")
def _cell(il, tl, u_max, b, t):
    """How many positions of frame ``t`` of sequence ``b`` the lattice reads
    (positions ``0 .. U_b``; none past its frames)."""
    if t >= il[b]:
        return 0
    return min(max(tl[b], -1), u_max) + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _block_labels(targets, b, u0, u1, u_max, n_cls, labs):
    """``labs[u - u0]``: the label of position ``u`` (clamped target, or
    `NO_LABEL` on the last position)."""
    for u in range(u0, u1):
        labs[u - u0] = min(max(targets[b, u], 0), n_cls - 1) if u < u_max else NO_LABEL


@numba.njit(cache=True, nogil=True, inline="always")
def _frame_buffers(x):
    """Per-call scratch of the frame kernels, for blocks of ``per`` rows:
    ``(per, row block (per * V, x's dtype), three (per,) float64 buffers,
    (per,) int64 labels)``."""
    n_cls = x.shape[3]
    per = max(1, _BLOCK_ELEMS // n_cls)
    return (per, np.empty(per * n_cls, x.dtype), np.empty(per, np.float64),
            np.empty(per, np.float64), np.empty(per, np.float64), np.empty(per, np.int64))


@numba.njit(cache=True, nogil=True, inline="always")
def _lattice_forward_frames(x, targets, il, tl, blank, f0, f1, px, py, lse, keep):
    """Frames ``f = b * (T + 1) + t`` in ``[f0, f1)``: the rows ``x[b, t, u]``
    the lattice reads, written straight into ``px[b, :, t]``, ``py[b, :, t]``
    and ``lse[b, t, :]`` (frame ``T`` only sets ``px[b, :, T]`` to ``-inf``).
    The exponentials go to the rows of ``keep`` (``(R, V)``) when it has any."""
    n, t_max, u1, n_cls = x.shape
    u_max = u1 - 1
    x2 = x.reshape(-1, n_cls)
    lse1 = lse.reshape(-1)
    per, scratch, sums, lab_l, blk_l, labs = _frame_buffers(x)
    for f in range(f0, f1):
        b = f // (t_max + 1)
        t = f - b * (t_max + 1)
        if t == t_max or t >= il[b]:  # no symbol from here on (k2's fix_for_boundary)
            for s in range(u_max):
                px[b, s, t] = -np.inf
            if t < t_max:
                for s in range(u1):
                    py[b, s, t] = 0.0
                    lse[b, t, s] = 0.0
            continue
        n_act = _cell(il, tl, u_max, b, t)
        for s in range(n_act, u1):  # positions past the target: never read
            if s < u_max:
                px[b, s, t] = 0.0
            py[b, s, t] = 0.0
            lse[b, t, s] = 0.0
        rb = (b * t_max + t) * u1
        u0 = 0
        while u0 < n_act:
            ue = min(u0 + per, n_act)
            _block_labels(targets, b, u0, ue, u_max, n_cls, labs)
            _forward_block(x2, rb + u0, rb + ue, labs, blank, lab_l, blk_l,
                           lse1[rb + u0:rb + ue],
                           keep.reshape(-1)[(rb + u0) * n_cls:(rb + ue) * n_cls]
                           if keep.shape[0] > 0 else scratch, sums)
            for u in range(u0, ue):
                py[b, u, t] = blk_l[u - u0]
                if u < u_max:
                    px[b, u, t] = lab_l[u - u0]
            u0 = ue


@numba.njit(cache=True, nogil=True, inline="always")
def _lattice_backward_frames(x, lse, targets, il, tl, blank, g_px, g_py, f0, f1, out, in_out):
    """Frames ``f = b * T + t`` in ``[f0, f1)``: the gradient rows
    ``out[b, t, :]`` from the cotangents ``g_px[b, :, t]``, ``g_py[b, :, t]``
    (zero rows where the lattice reads nothing); ``in_out``: ``out`` holds the
    forward's exponentials (see `_backward_block`)."""
    n, t_max, u1, n_cls = x.shape
    u_max = u1 - 1
    x2 = x.reshape(-1, n_cls)
    out2 = out.reshape(-1, n_cls)
    lse1 = lse.reshape(-1)
    per, kb, cs, gl_l, gb_l, labs = _frame_buffers(x)
    for f in range(f0, f1):
        b = f // t_max
        t = f - b * t_max
        n_act = _cell(il, tl, u_max, b, t)
        rb = f * u1
        for r in range(rb + n_act, rb + u1):
            o = out2[r]
            for v in range(n_cls):
                o[v] = 0.0
        u0 = 0
        while u0 < n_act:
            ue = min(u0 + per, n_act)
            _block_labels(targets, b, u0, ue, u_max, n_cls, labs)
            for u in range(u0, ue):
                gl_l[u - u0] = g_px[b, u, t] if u < u_max else 0.0
                gb_l[u - u0] = g_py[b, u, t]
            _backward_block(x2, rb + u0, rb + ue, labs, blank, lse1[rb + u0:rb + ue], gl_l, gb_l,
                            out2, in_out, kb, cs)
            u0 = ue


# The max-shifted rows, in passes of their own after the frame loops: rows whose
# normaliser the unshifted exponentials cannot give (logits far from 0, NaN or
# inf).  Separate functions so that a first call that meets no such row does not
# compile them (issue 19; the fused kernel checks for such rows and hands their
# sequences to the two-pass kernels).  Each pass writes exactly what the block
# would have written for such a row, from the same values, so every result is
# the same number as if the block had done it.


@numba.njit(**HELPER)
def _shifted_forward(x, targets, il, tl, blank, f0, f1, px, py, lse):
    """`_lattice_forward_frames`'s rows left NaN (frames ``[f0, f1)``, same
    numbering) by the max-shifted path."""
    n, t_max, u1, n_cls = x.shape
    u_max = u1 - 1
    tail, buf = _tail_buffer(n_cls, x)
    for f in range(f0, f1):
        b = f // (t_max + 1)
        t = f - b * (t_max + 1)
        if t == t_max or t >= il[b]:
            continue
        for u in range(_cell(il, tl, u_max, b, t)):
            if lse[b, t, u] == lse[b, t, u]:
                continue
            k = min(max(targets[b, u], 0), n_cls - 1) if u < u_max else NO_LABEL
            v, lp_blank, lp_label = _shifted_row(x[b, t, u], k, blank, tail, buf)
            lse[b, t, u] = v
            py[b, u, t] = lp_blank
            if u < u_max:
                px[b, u, t] = lp_label


@numba.njit(**HELPER)
def _shifted_backward(x, lse, targets, il, tl, blank, g_px, g_py, f0, f1, out):
    """`_lattice_backward_frames`'s rows outside `_unshifted_range` with a
    nonzero cotangent (frames ``[f0, f1)``, same numbering), by the
    max-shifted path."""
    n, t_max, u1, n_cls = x.shape
    u_max = u1 - 1
    lo, hi = _unshifted_range(x)
    tail, buf = _tail_buffer(n_cls, x)
    for f in range(f0, f1):
        b = f // t_max
        t = f - b * t_max
        for u in range(_cell(il, tl, u_max, b, t)):
            ls = lse[b, t, u]
            if lo <= ls <= hi:
                continue
            k = min(max(targets[b, u], 0), n_cls - 1) if u < u_max else NO_LABEL
            g_label = np.float64(g_px[b, u, t]) if u < u_max else 0.0
            g_blank = np.float64(g_py[b, u, t])
            c = 0.0 - ((g_label if k >= 0 else 0.0) + g_blank)
            if c != 0.0:
                _shifted_grad_row(x[b, t, u], ls, c, out[b, t, u], k, g_label, g_blank, blank,
                                  tail, buf)


@numba.njit(cache=True, nogil=True)
def _lattice_forward_serial(chunks, x, targets, il, tl, blank, per_chunk, px, py, lse):
    n_frames = x.shape[0] * (x.shape[1] + 1)
    for i in range(chunks.shape[0]):
        f0 = chunks[i] * per_chunk
        f1 = min(f0 + per_chunk, n_frames)
        _frames_forward_fn(x, targets, il, tl, blank, f0, f1, px, py, lse,
                           x.reshape(-1, x.shape[3])[:0])
        _shifted_forward(x, targets, il, tl, blank, f0, f1, px, py, lse)


@numba.njit(cache=True, nogil=True)
def _lattice_backward_serial(chunks, x, lse, targets, il, tl, blank, g_px, g_py, per_chunk, out):
    n_frames = x.shape[0] * x.shape[1]
    for i in range(chunks.shape[0]):
        f0 = chunks[i] * per_chunk
        f1 = min(f0 + per_chunk, n_frames)
        _frames_backward_fn(x, lse, targets, il, tl, blank, g_px, g_py, f0, f1, out, False)
        _shifted_backward(x, lse, targets, il, tl, blank, g_px, g_py, f0, f1, out)


def _lattice_args(fn, x, targets, logit_lengths, target_lengths, blank):
    """Checked ``(x, targets, il, tl, blank, frames per chunk)``; raises before any kernel."""
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"{fn}: 'x' must be a 4-D (N, T, U + 1, V) array, got shape {x.shape}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{fn}: 'x' must be float32 or float64, got {x.dtype}")
    n, t_max, u1, n_cls = x.shape
    if u1 < 1 or n_cls < 1:
        raise ValueError(f"{fn}: 'x' must have at least one position and one class, got "
                         f"shape {x.shape}")
    targets = np.asarray(targets)
    if targets.shape != (n, u1 - 1) or targets.dtype.kind not in "iu":
        raise ValueError(f"{fn}: 'targets' must be an integer ({n}, {u1 - 1}) array, got "
                         f"{targets.dtype} {targets.shape}")
    lens = []
    for name, a in (("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        a = np.asarray(a)
        if a.shape != (n,) or a.dtype.kind not in "iu":
            raise ValueError(f"{fn}: '{name}' must be an integer ({n},) array, got "
                             f"{a.dtype} {a.shape}")
        lens.append(np.ascontiguousarray(a, dtype=np.int64))
    blank = int(blank)
    if not 0 <= blank < n_cls:
        raise ValueError(f"{fn}: 'blank' must lie in [0, {n_cls - 1}], got {blank}")
    return (np.ascontiguousarray(x), np.ascontiguousarray(targets, dtype=np.int64), lens[0],
            lens[1], blank, max(1, _CHUNK_ELEMS // (u1 * n_cls)))


def transducer_log_probs(x, targets, logit_lengths, target_lengths, blank):
    """The RNN-T lattice's log-probabilities from the joiner output, in the
    layout of `transducer`.

    Args:
      x: ``(N, T, U + 1, V)`` float32/float64 logits.
      targets: ``(N, U)`` integer targets (clamped to ``[0, V)`` when read).
      logit_lengths, target_lengths: ``(N,)`` integers ``T_b``, ``U_b``.
      blank: the blank class in ``[0, V)``.

    Returns:
      ``px`` ``(N, U, T + 1)``: ``log_softmax(x)[b, t, s, y_s]`` for
      ``t < T_b`` and ``s <= U_b``, ``-inf`` for ``t >= T_b``, 0 elsewhere;
      ``py`` ``(N, U + 1, T)``: ``log_softmax(x)[b, t, s, blank]`` for
      ``t < T_b`` and ``s <= U_b``, 0 elsewhere; ``lse`` ``(N, T, U + 1)``
      float64 (for `transducer_log_probs_grad`).  Cells the lattice never
      reads cost nothing.  One pass over ``x`` writes them all (no row-major
      intermediates to transpose).
    """
    x, targets, il, tl, blank, per_chunk = _lattice_args(
        "transducer_log_probs", x, targets, logit_lengths, target_lengths, blank)
    n, t_max, u1, n_cls = x.shape
    px = np.empty((n, u1 - 1, t_max + 1), x.dtype)
    py = np.empty((n, u1, t_max), x.dtype)
    lse = np.empty((n, t_max, u1))
    if n:
        args = (x, targets, il, tl, blank, per_chunk, px, py, lse)
        run_batch(_lattice_forward_serial, np.arange(-(-n * (t_max + 1) // per_chunk)), x.size,
                  _PARALLEL_MIN_ELEMS, args)
    return px, py, lse


def transducer_log_probs_grad(x, lse, targets, logit_lengths, target_lengths, blank, g_px,
                              g_py, out=None):
    """The gradient w.r.t. ``x`` of ``sum(g_px * px + g_py * py)`` for
    `transducer_log_probs` (``(N, T, U + 1, V)``, ``x``'s dtype); cells
    past a sequence's frames or target get exact zeros; ``out``: an optional
    C-contiguous array of ``x``'s dtype and shape to write into."""
    fn = "transducer_log_probs_grad"
    x, targets, il, tl, blank, per_chunk = _lattice_args(fn, x, targets, logit_lengths,
                                                         target_lengths, blank)
    n, t_max, u1, n_cls = x.shape
    lse = np.asarray(lse)
    g_px = np.asarray(g_px)
    g_py = np.asarray(g_py)
    for name, a, shape in (("lse", lse, (n, t_max, u1)), ("g_px", g_px, (n, u1 - 1, t_max + 1)),
                           ("g_py", g_py, (n, u1, t_max))):
        if a.shape != shape or a.dtype.kind != "f":
            raise ValueError(f"{fn}: '{name}' must be a float array of shape {shape}, got "
                             f"{a.dtype} {a.shape}")
    lse = np.ascontiguousarray(lse, dtype=np.float64)
    g_px = np.ascontiguousarray(g_px, dtype=x.dtype)
    g_py = np.ascontiguousarray(g_py, dtype=x.dtype)
    out = _out_array(fn, out, x)
    if n:
        args = (x, lse, targets, il, tl, blank, g_px, g_py, per_chunk, out)
        run_batch(_lattice_backward_serial, np.arange(-(-n * t_max // per_chunk)), x.size,
                  _PARALLEL_MIN_ELEMS, args)
    return out


# --------------------------------------------------------------------------- #
# The whole RNN-T loss, one sequence at a time                                 #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True, inline="always")
def _scaled_cotangents(b, scale, gx, gy, cx, cy):
    """``cx[b]``, ``cy[b]``: the cotangents ``gx[b] * scale``, ``gy[b] * scale``
    rounded to their dtype (as a framework multiplies them), subnormals
    flushed to (signed) zero, as the general path's core reduction
    (duoloss.core._reduce.flush_subnormals) hands them out."""
    sc = _cast_like(cx, scale)
    tiny = _cast_like(cx, 1.1754943508222875e-38 if cx.itemsize == 4
                      else 2.2250738585072014e-308)
    for s in range(gx.shape[1]):
        for t in range(gx.shape[2]):
            v = gx[b, s, t] * sc
            cx[b, s, t] = v * 0 if abs(v) < tiny else v
    for s in range(gy.shape[1]):
        for t in range(gy.shape[2]):
            v = gy[b, s, t] * sc
            cy[b, s, t] = v * 0 if abs(v) < tiny else v


# Compile time (a user's first call, issue 19): the serial kernel calls the
# frame loops (`_frames_forward_fn`, `_frames_backward_fn`) and `_one_linear`'s
# sweeps as functions of their own, straight from its body (`_fused_grad` and
# `_one_linear` are inlined glue): numba types a few
# mid-sized functions much faster than one large inlined body, and every
# level of calls re-optimises and re-emits the code of all the functions below
# it (numba links callees into each caller's module), so the call tree is kept
# flat.  A large batch runs the same kernel on several threads (`run_batch`).
# ``modified`` (False: regular RNN-T) is a runtime argument, not a literal, so that
# `_one_linear`'s sweeps share one compiled signature per dtype with the two-pass
# path's kernel (a literal made a second one, with no measurable speed difference:
# 7.5 ms either way for (32, 150, 40, 28)).  ``in_out`` reaches the backward frame
# loop as a literal (True here, False from the two-pass path): passed at run time,
# the fused path's first call compiled 0.25 s longer.
_frames_forward_fn = numba.njit(**HELPER)(_lattice_forward_frames.py_func)
_frames_backward_fn = numba.njit(**HELPER)(_lattice_backward_frames.py_func)


@numba.njit(cache=True, nogil=True, inline="always")
def _fused_grad(b, x, targets, il, tl, blank, scale, lse, gx, gy, cx, cy, out):
    """The gradient ``out[b]`` of sequence ``b`` for the cotangents ``gx * scale``
    and ``gy * scale`` (`_scaled_cotangents`); ``out[b]`` holds the forward's
    exponentials."""
    t_max = x.shape[1]
    _scaled_cotangents(b, scale, gx, gy, cx, cy)
    _frames_backward_fn(x, lse, targets, il, tl, blank, cx, cy, b * t_max, (b + 1) * t_max, out,
                        True)


@numba.njit(cache=True, nogil=True, inline="always")
def _unshifted_only(lse, b, rows):
    """Whether every normaliser of sequence ``b`` lies in `_unshifted_range` (of
    the dtype of ``rows``; no NaN): then the frame loops computed all its rows,
    and its gradient rows need no max-shifted pass either.  (Cells the lattice
    does not read hold 0.)"""
    lo, hi = _unshifted_range(rows)
    for t in range(lse.shape[1]):
        for u in range(lse.shape[2]):
            if not lo <= lse[b, t, u] <= hi:
                return False
    return True


#: ``pending`` mark of a sequence the fused kernel left to the two-pass kernels.
_SHIFTED = 3


# The fused kernel: the argument list ``(order, inputs..., outputs...)``; it
# processes exactly the sequences listed in the int64 array ``order`` and writes
# only their entries of the outputs (``px`` .. ``pending``).


@numba.njit(cache=True, nogil=True)
def _fused_serial(order, x, targets, il, tl, blank, bd, modified, scale, want, px, py, lse,
                  losses, gx, gy, cx, cy, out, pending):
    """Per sequence ``b``: its lattices from ``x[b]``, the lattice loss and move
    gradients (`_one_linear`), then, when ``want``, its gradient (`_fused_grad`)
    while ``x[b]`` is still in cache -- unless `_one_linear` marked it in
    ``pending`` (`rnnt_loss_from_logits` finishes it then).  A sequence with a
    row the unshifted exponentials cannot take is marked `_SHIFTED` right
    after its lattices (nothing else of it written yet): the driver computes
    it with the two-pass path's kernels."""
    t_max = x.shape[1]
    # with a gradient, the exponentials wait in out[b] (in cache) for the second pass
    keep = out.reshape(-1, x.shape[3])
    for i in range(order.shape[0]):
        b = order[i]
        _frames_forward_fn(x, targets, il, tl, blank, b * (t_max + 1), (b + 1) * (t_max + 1),
                           px, py, lse, keep if want else keep[:0])
        if not _unshifted_only(lse, b, keep):
            pending[b] = _SHIFTED
            continue
        status = _one_linear(b, px, py, bd, modified, want, want, losses, gx, gy)
        pending[b] = status
        if want and status == 0:
            _fused_grad(b, x, targets, il, tl, blank, scale, lse, gx, gy, cx, cy, out)


def rnnt_loss_from_logits(x, targets, logit_lengths, target_lengths, blank, boundary,
                          scale=1.0, want_grad=True):
    """The RNN-T loss of each sequence straight from the joiner output, and its
    gradient, one sequence at a time.

    The same numbers as `transducer_log_probs`, then
    `transducer_loss_and_grad` on its
    lattices, then `transducer_log_probs_grad` with the cotangents
    ``g_px * scale`` and ``g_py * scale`` rounded to ``x``'s dtype; but each
    sequence's logits are read from memory once: its gradient is written while
    they are still in cache (the two-pass form reads all ``N * T * (U + 1) * V``
    logits twice).  What the torch frontend runs for ``rnnt_loss`` on CPU in
    eager mode, where the cotangent of a reduced loss is known in advance
    (``scale``: 1 for a sum, the framework's ``1 / N`` for a mean).

    Args:
      x, targets, logit_lengths, target_lengths, blank: as in
        `transducer_log_probs`.
      boundary: ``(N, 4)`` integer rows ``[0, 0, U_b, T_b]`` of the lattice
        kernel (``-1`` entries make a sequence's loss NaN, as there).
      scale: the cotangent of every sequence's loss.
      want_grad: compute the gradients (else only the losses).

    Returns:
      ``(losses, lse, g_px, g_py, grad)``: ``(N,)`` float64 losses, the ``(N,
      T, U + 1)`` normaliser, the lattice gradients ``(N, U, T + 1)`` /
      ``(N, U + 1, T)`` in ``x``'s dtype (unscaled) and the ``(N, T, U + 1, V)``
      gradient w.r.t. ``x`` for the cotangent ``scale`` (the last three
      ``None`` without ``want_grad``).
    """
    fn = "rnnt_loss_from_logits"
    x, targets, il, tl, blank, _ = _lattice_args(fn, x, targets, logit_lengths, target_lengths,
                                                 blank)
    n, t_max, u1, n_cls = x.shape
    bd = np.asarray(boundary)
    if bd.shape != (n, 4) or bd.dtype.kind not in "iu":
        raise ValueError(f"{fn}: 'boundary' must be an integer ({n}, 4) array, got "
                         f"{bd.dtype} {bd.shape}")
    bd = np.ascontiguousarray(bd, dtype=np.int64)
    want = bool(want_grad)
    px = np.empty((n, u1 - 1, t_max + 1), x.dtype)
    py = np.empty((n, u1, t_max), x.dtype)
    lse = np.empty((n, t_max, u1))
    losses = np.empty(n)
    shape_x, shape_y = (px.shape, py.shape) if want else ((0, 0, 0), (0, 0, 0))
    gx = np.zeros(shape_x, x.dtype)
    gy = np.zeros(shape_y, x.dtype)
    cx = np.empty(shape_x, x.dtype)
    cy = np.empty(shape_y, x.dtype)
    # (the joiner's size: a cached buffer, see duoloss.core._buffers)
    out = _buffers.empty(x.shape if want else (0,) + x.shape[1:], x.dtype)
    pending = np.zeros(n, np.int8)
    if n:
        args = (x, targets, il, tl, blank, bd, False, float(scale), want, px, py, lse, losses,
                gx, gy, cx, cy, out, pending)
        run_batch(_fused_serial, np.arange(n, dtype=np.int64), x.size, _PARALLEL_MIN_ELEMS, args)
        per_seq = x.size // n
        # The rarer cases go through the two-pass path's kernels, which give the
        # same numbers (tests/test_rnnt_fused_normaliser.py) and which only a call
        # that needs them compiles (issue 19).  Sequences with max-shifted rows:
        # their lattices with those rows (each sequence's frames are one chunk),
        # then the lattice kernel.
        shifted = np.flatnonzero(pending == _SHIFTED).astype(np.int64, copy=False)
        if shifted.size or _numerics._compile_both:
            run_batch(_lattice_forward_serial, shifted, shifted.size * per_seq,
                      _PARALLEL_MIN_ELEMS, (x, targets, il, tl, blank, t_max + 1, px, py, lse))
            run_batch(_batch_serial, shifted, shifted.size * per_seq, _PARALLEL_MIN_ELEMS,
                      (px, py, bd, False, want, want, losses, gx, gy, pending))
        # the sequences the linear sweep could not certify: exactly in log space
        todo = run_fallback((px, py, bd, False, want, want, losses, gx, gy, pending))
        # the gradients not yet written: of those two kinds of sequences
        rest = np.union1d(shifted[pending[shifted] == 0], todo).astype(np.int64, copy=False)
        if want and (rest.size or _numerics._compile_both):
            # the cotangents as `_scaled_cotangents` makes them
            cx[rest] = flush_subnormals(gx[rest] * x.dtype.type(scale))
            cy[rest] = flush_subnormals(gy[rest] * x.dtype.type(scale))
            run_batch(_lattice_backward_serial, rest, rest.size * per_seq, _PARALLEL_MIN_ELEMS,
                      (x, lse, targets, il, tl, blank, cx, cy, t_max, out))
    if not want:
        return losses, lse, None, None, None
    return losses, lse, gx, gy, out
