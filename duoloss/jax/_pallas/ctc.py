r"""CTC forward-backward as Pallas kernels: the numbers of `duoloss.jax._xla.ctc`
(and so of the numba core) without a ``lax.scan`` step per frame.

Shapes: ``T`` frames, ``N`` sequences, ``C`` classes, ``S`` padded target
positions, ``S' = 2S + 1`` extended states, ``W`` the lattice row: ``S'``
rounded up to a power of two (Triton's blocks) and to a multiple of 128 on a
TPU (its lanes).  The recursion, the loss and the gradient are those of
`duoloss.jax._xla.ctc` (its docstring has the formulas and the NaN/inf policy):

.. math::

    \alpha_{t}(s) = lp_t(s) + \log\big(e^{\alpha_{t-1}(s)} + e^{\alpha_{t-1}(s-1)}
        + [\text{skip}_s]\, e^{\alpha_{t-1}(s-2)}\big),

``d loss / d log_probs[t, n, c] = -\sum_{s: ext_n(s) = c} \text{posterior}_t(s)``.

Two kernels, each a ``pallas_call`` with one program per sequence (GPU) or per
block of 8 sequences (TPU), a ``fori_loop`` over frames whose trip count is the
sequence's input length read from a ref:

* **alpha** writes every frame's ``alpha_t`` (the residual of the backward) and
  ``log Z``;
* **beta** runs the backward recursion from each sequence's last frame down and
  writes every frame's ``beta_hat`` ``(T, N, W)`` (GPU form; with
  `POSTERIOR_IN_KERNEL`, and always in the TPU form, it forms the posteriors
  ``exp(alpha + beta - log Z)`` frame by frame instead and writes ``-posterior``).

The gradient is then parallel XLA work: the posteriors, each frame normalised by
its own total as the core (`_posterior_grad`, one fused pass), and their
contraction with the one-hot extended labels back to ``(T, N, C)`` (``C <= 512``; a
scatter-add above), the transpose of the label gather: deterministic (no atomics),
on the tensor cores / MXU.  The posteriors are finite, so the one-hot product is
exact (``Precision.HIGHEST``: no TF32/bf16 rounding of the summands).

**GPU form** (Triton lowering, chosen through its ``CompilerParams``): a
sequence's row of ``W`` states lives in registers; the shifted reads
``alpha_{t-1}(s-1)``, ``alpha_{t-1}(s-2)`` are loads at offsets 1 and 0 of the
previous frame's stored row, which has two ``-inf`` guard columns in front
(Pallas-Triton has no gather/pad/roll on values, and a load from a ref at an
offset is a pointer shift), with one CTA barrier per frame between the store and
the shifted loads.  The label gather ``log_probs[t, n, ext_n(s)]`` is a load from
the input ref indexed by the ``(W,)`` state-to-class row: Triton's pointer
gather, so the kernel reads ``log_probs`` where it lies (no gathered copy of the
lattice).

**TPU form** (Mosaic): a block of 8 sequences on the sublanes and ``W`` states
on the lanes, carried in vregs; the shifts are ``pltpu.roll`` along the lanes
with an iota mask.  The label gather is done before the kernel, in XLA
(``take_along_axis``): a one-hot product on the MXU would mix every class into
every state, and ``0 * (-inf)`` and ``0 * NaN`` are NaN, which would break the
policy that ``-inf`` log-probabilities never give NaN and that unread classes are
never read; Mosaic has no general lane gather.  The gradient's scatter is the
one-hot product described above (finite values, exact).  float64 is refused on
TPUs (`duoloss.jax._pallas.backend_for`).

Batching: ``vmap`` folds its axis into the sequence axis (a ``custom_vmap`` on
each kernel call), so a vmapped loss is one launch over ``k * N`` programs.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import core as jax_core
from jax.experimental import pallas as pl

from .._adapter import _gradient
from .._sharding import mark_varying, varying_axes
from .._xla.ctc import prepare
from . import pallas_call_options, pallas_target

__all__ = ["ctc_losses"]

_NAME = "ctc_loss (impl='pallas')"
_NEG_INF = float("-inf")
#: Up to this many classes the gradient's scatter is a one-hot contraction (a matmul).
_ONE_HOT_MAX_CLASSES = 512
#: GPU form: the beta kernel also forms the posteriors frame by frame (two row
#: reductions inside the serial loop) instead of writing beta for one parallel XLA
#: pass (`_posterior_grad`).  Read when a call is traced; the TPU form always does.
POSTERIOR_IN_KERNEL = False
#: Warps per program of the GPU kernels (one program per sequence); ``None``: from the
#: row width, `_num_warps`.  Read when a call is traced.
NUM_WARPS = None


def _num_warps(w: int) -> int:
    """About 2 states per thread, 1 to 8 warps: fewer warps make the per-frame barrier
    and the row reductions cheaper (measured register use on sm_90, no spills, at
    W = 256/512: 27-56 registers)."""
    if NUM_WARPS is not None:
        return int(NUM_WARPS)
    return min(8, max(1, w // 64))


def _row_width(s_ext: int, form: str) -> int:
    w = 1 << max(int(s_ext) - 1, 0).bit_length()          # next power of two >= s_ext
    if form == "tpu":
        w = max(w, 128)
    return max(w, 2)


def ctc_losses(log_probs, targets, input_lengths, target_lengths, blank: int,
               zero_infinity: bool, backend: str):
    """Per-sequence CTC losses ``(N,)`` from the Pallas kernels, differentiable
    w.r.t. ``log_probs``; arguments as `duoloss.jax._xla.ctc.ctc_losses`, and
    ``backend`` one of `duoloss.jax._pallas.backend_for`'s Pallas answers."""
    form, interpret = pallas_target(backend)
    t_max, n, _ = log_probs.shape
    if form == "tpu" and log_probs.dtype == jnp.float64:
        raise ValueError("ctc_loss: impl='pallas' computes in float32 or narrower on a TPU "
                         "(Mosaic has no float64), got float64 log_probs; use impl='xla'")
    s_max = targets.shape[1]
    dtype = log_probs.dtype
    lp_all, il, tl, valid, labels = prepare(log_probs, targets, input_lengths,
                                            target_lengths, blank)
    s_ext = 2 * s_max + 1
    w = _row_width(s_ext, form)
    ext = jnp.stack([jnp.full_like(labels, blank), labels], axis=2).reshape(n, 2 * s_max)
    ext = jnp.concatenate([ext, jnp.full((n, w - 2 * s_max), blank, jnp.int32)], axis=1)
    # skip[s]: the s-2 -> s transition (a label differing from the one two states back)
    prev2 = jnp.concatenate([jnp.full((n, 2), blank, jnp.int32), ext[:, :-2]], axis=1)
    state = jnp.arange(w)[None]
    skip = (state % 2 == 1) & (state >= 2) & (ext != prev2)
    il_c = jnp.where(valid, il, 0)
    tl_c = jnp.where(valid, tl, 0)
    if t_max == 0:                       # no frame: the empty target has probability one
        z = jnp.where(tl_c == 0, 0.0, _NEG_INF).astype(lp_all.dtype)
        losses = _finish(z, valid, bool(zero_infinity)) + 0.0 * jnp.sum(lp_all)
        return losses.astype(dtype)
    losses = _ctc_core(lp_all, ext, skip.astype(jnp.int32), il_c, tl_c, valid.astype(jnp.int32),
                       bool(zero_infinity), form, bool(interpret))
    return losses.astype(dtype)


def _finish(z, valid, zero_infinity):
    loss = jnp.where(valid, -z, jnp.nan) + 0.0      # -0.0 -> 0.0
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), 0.0, loss)
    return loss


# -- the kernels (GPU form) ---------------------------------------------------------


def _const(v, dt):
    """A typed scalar (Pallas-Triton mistypes weak Python floats inside ``where``)."""
    return jnp.full((), v, dt)


def _lse3(a, b, c):
    m = jnp.maximum(jnp.maximum(a, b), c)
    m0 = jnp.where(m == _NEG_INF, jnp.zeros_like(m), m)
    return m0 + jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0) + jnp.exp(c - m0))


def _barrier(interpret):
    """One CTA barrier between a frame's store and the next frame's shifted loads
    (the interpreter runs a program's vector operations in order: none needed)."""
    if not interpret:
        from jax.experimental.pallas import triton as plgpu
        plgpu.debug_barrier()


def _alpha_kernel_gpu(lp_ref, ext_ref, skip_ref, il_ref, tl_ref, a_ref, z_ref, *, w,
                      interpret):
    n = pl.program_id(0)
    length = il_ref[n]
    u = tl_ref[n]
    ext = ext_ref[n, :]
    skip = skip_ref[n, pl.ds(0, w)] != 0
    s = lax.broadcasted_iota(jnp.int32, (w,), 0)
    live = s < 2 * u + 1
    dt = a_ref.dtype
    ninf = jnp.full((w,), _NEG_INF, dt)
    guard = jnp.full((2,), _NEG_INF, dt)

    def emit(t):
        return lp_ref[t, n, ext]

    a0 = jnp.where((s < 2) & live & (length > 0), emit(0), ninf)
    a_ref[0, n, pl.ds(0, 2)] = guard
    a_ref[0, n, pl.ds(2, w)] = a0
    _barrier(interpret)

    t_last = lp_ref.shape[0] - 1

    def step(t, carry):
        a, lp_t = carry
        lp_next = emit(jnp.minimum(t + 1, t_last))   # issued early: hides its latency
        p1 = a_ref[t - 1, n, pl.ds(1, w)]
        p2 = a_ref[t - 1, n, pl.ds(0, w)]
        new = _lse3(a, p1, jnp.where(skip, p2, ninf)) + lp_t
        new = jnp.where(live, new, ninf)
        a_ref[t, n, pl.ds(0, 2)] = guard
        a_ref[t, n, pl.ds(2, w)] = new
        _barrier(interpret)
        return new, lp_next

    a_last, _ = lax.fori_loop(1, length, step, (a0, emit(jnp.minimum(1, t_last))))
    end = (s == 2 * u) | ((s == 2 * u - 1) & (u > 0))
    e = jnp.where(end, a_last, ninf)
    m = jnp.max(e)
    m0 = jnp.where(m == _NEG_INF, jnp.zeros_like(m), m)
    z = m0 + jnp.log(jnp.sum(jnp.exp(e - m0)))
    empty = jnp.where(u == 0, _const(0.0, dt), _const(_NEG_INF, dt))
    z_ref[n] = jnp.where(length == 0, empty, z)


def _beta_kernel_gpu(lp_ref, ext_ref, skip_ref, il_ref, tl_ref, a_ref, z_ref, ok_ref,
                     g_ref, c_ref, *, w, t_max, interpret, posterior):
    """Frames from the last one down.  ``posterior``: write each frame's state
    gradient ``-posterior`` (two row reductions per frame); else write ``beta_hat``
    only (rows ``t < L``; the gradient is then one parallel XLA pass, `_posterior_grad`)."""
    n = pl.program_id(0)
    length = il_ref[n]
    u = tl_ref[n]
    z = z_ref[n]
    ok = ok_ref[n] != 0
    ext = ext_ref[n, :]
    skip_into = skip_ref[n, pl.ds(2, w)] != 0          # s -> s + 2 allowed
    s = lax.broadcasted_iota(jnp.int32, (w,), 0)
    live = s < 2 * u + 1
    dt = g_ref.dtype
    ninf = jnp.full((w,), _NEG_INF, dt)
    zero = jnp.zeros((w,), dt)
    nan = jnp.full((w,), jnp.nan, dt)
    final = live & ((s == 2 * u) | (s == 2 * u - 1))
    init = jnp.where(final, zero, ninf)
    use = ~(z == _NEG_INF) & ok                        # infeasible: zero gradient
    nan_z = jnp.isnan(z)
    c_ref[n, 0, pl.ds(w, 2)] = jnp.full((2,), _NEG_INF, dt)   # guards behind each row
    c_ref[n, 1, pl.ds(w, 2)] = jnp.full((2,), _NEG_INF, dt)

    def step(i, carry):
        c0, lp_t, a_t = carry                          # c0: row t + 1 of c, in registers
        t = length - 1 - i
        prev = jnp.maximum(t - 1, 0)                   # frame t - 1's reads, issued early
        lp_prev = lp_ref[prev, n, ext]
        a_prev = a_ref[prev, n, pl.ds(2, w)] if posterior else a_t
        r = (t + 1) % 2
        c1 = c_ref[n, r, pl.ds(1, w)]
        c2 = c_ref[n, r, pl.ds(2, w)]
        trans = jnp.where(live, _lse3(c0, c1, jnp.where(skip_into, c2, ninf)), ninf)
        bh = jnp.where(i == 0, init, trans)
        c = bh + lp_t
        c_ref[n, t % 2, pl.ds(0, w)] = c
        if not posterior:
            g_ref[t, n, :] = bh
            _barrier(interpret)
            return c, lp_prev, a_prev
        ab = jnp.where(live, a_t + bh, ninf)
        m = jnp.max(ab)
        e = jnp.exp(ab - jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m)))
        total = jnp.sum(e)
        post = e / jnp.where(total > 0, total, jnp.ones_like(total))
        post = jnp.where(nan_z, nan, post)
        g = jnp.where(live & use, -post, zero)
        g_ref[t, n, :] = jnp.where(ok, g, nan)
        _barrier(interpret)
        return c, lp_prev, a_prev

    last = jnp.maximum(length - 1, 0)
    a_last = a_ref[last, n, pl.ds(2, w)] if posterior else zero
    lax.fori_loop(0, length, step, (ninf, lp_ref[last, n, ext], a_last))
    if not posterior:
        return

    def rest(t, carry):                               # frames past the input length
        g_ref[t, n, :] = jnp.where(ok, zero, nan)
        return carry

    lax.fori_loop(length, t_max, rest, 0)


def _out(shape, dtype, axes):
    """An output's ``ShapeDtypeStruct``, varying over the ``shard_map`` axes ``axes``
    (inside ``shard_map`` with ``check_vma=True`` a ``pallas_call`` must say so)."""
    if not axes:
        return jax.ShapeDtypeStruct(shape, dtype)
    mat = getattr(jax_core, "ManualAxisType", None)
    if mat is not None:
        try:
            return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat(varying=axes))
        except TypeError:  # pragma: no cover - another JAX spelling
            pass
    try:  # pragma: no cover - JAX versions that spell it vma=
        return jax.ShapeDtypeStruct(shape, dtype, vma=frozenset(axes))
    except TypeError:  # pragma: no cover - neither: pallas_call's own error says what to do
        return jax.ShapeDtypeStruct(shape, dtype)


def _alpha_call(lp, ext, skip, il, tl, *, form, interpret, axes=frozenset()):
    t_max, n, _ = lp.shape
    w = ext.shape[1]
    if form == "tpu":
        return _alpha_call_tpu(lp, ext, skip, il, tl, interpret=interpret, axes=axes)
    kernel = functools.partial(_alpha_kernel_gpu, w=w, interpret=interpret)
    a, z = pl.pallas_call(
        kernel, grid=(n,),
        out_shape=(_out((t_max, n, w + 2), lp.dtype, axes), _out((n,), lp.dtype, axes)),
        name="duoloss_ctc_alpha",
        **pallas_call_options("pallas-interpret" if interpret else "pallas-gpu",
                              num_warps=_num_warps(w)))(lp, ext, _pad_skip(skip), il, tl)
    return a, z


def _pad_skip(skip):
    """``skip`` with two trailing zero columns (read at offset 2 by the backward)."""
    return jnp.concatenate([skip, jnp.zeros((skip.shape[0], 2), skip.dtype)], axis=1)


def _beta_call(lp, ext, skip, il, tl, a, z, ok, *, form, interpret, posterior,
               axes=frozenset()):
    t_max, n, _ = lp.shape
    w = ext.shape[1]
    if form == "tpu":
        return _beta_call_tpu(lp, ext, skip, il, tl, a, z, ok, interpret=interpret, axes=axes)
    kernel = functools.partial(_beta_kernel_gpu, w=w, t_max=t_max, interpret=interpret,
                               posterior=posterior)
    g, _ = pl.pallas_call(
        kernel, grid=(n,),
        out_shape=(_out((t_max, n, w), lp.dtype, axes), _out((n, 2, w + 2), lp.dtype, axes)),
        name="duoloss_ctc_beta",
        **pallas_call_options("pallas-interpret" if interpret else "pallas-gpu",
                              num_warps=_num_warps(w)))(lp, ext, _pad_skip(skip), il, tl, a, z, ok)
    return g


# -- the custom VJP ---------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _ctc_core(lp, ext, skip, il, tl, ok, zero_infinity, form, interpret):
    return _ctc_fwd(lp, ext, skip, il, tl, ok, zero_infinity, form, interpret)[0]


def _ctc_fwd(lp, ext, skip, il, tl, ok, zero_infinity, form, interpret):
    # (stop_gradient: see _ctc_bwd)
    a, z = _alpha(lax.stop_gradient(lp), ext, skip, il, tl, form, interpret)
    loss = _finish(z, ok != 0, zero_infinity)
    return loss, (lp, ext, skip, il, tl, ok, a, z)


def _ctc_bwd(zero_infinity, form, interpret, res, g):
    lp, ext, skip, il, tl, ok, a, z = res
    # the kernels are not differentiated: a second derivative reaches _gradient's
    # rule (NotImplementedError, as on the host path) instead of pallas_call's JVP
    sg = lax.stop_gradient
    posterior = form == "tpu" or POSTERIOR_IN_KERNEL
    gs = _beta(sg(lp), ext, skip, il, tl, sg(a), sg(z), ok, form, interpret,
               posterior)                                                    # (T, N, W)
    if not posterior:                               # gs holds beta_hat
        gs = _posterior_grad(sg(a)[:, :, 2:], gs, il, tl, sg(z), ok)
    grad = _scatter_states(gs, ext, lp.shape[2])
    return (_gradient(_NAME, 1, grad, lp, g.astype(lp.dtype)),
            None, None, None, None, None)


_ctc_core.defvjp(_ctc_fwd, _ctc_bwd)


def _posterior_grad(alphas, bh, il, tl, z, ok):
    """The state gradients ``-posterior`` ``(T, N, W)`` from the stored alphas and
    betas, in one parallel pass (`duoloss.jax._xla.ctc`'s formula: each frame
    normalised by its own total, relative to its best state).  Rows past each input
    length and states past ``2U + 1`` are never read (``where``: the kernels leave
    them unwritten)."""
    t_max, _, w = bh.shape
    live = jnp.arange(w)[None] < (2 * tl + 1)[:, None]
    read = (jnp.arange(t_max)[:, None, None] < il[None, :, None]) & live[None]
    ab = jnp.where(read, alphas + bh, _NEG_INF)
    m = jnp.max(ab, axis=2, keepdims=True)
    e = jnp.exp(ab - jnp.where(jnp.isfinite(m), m, 0.0))
    total = jnp.sum(e, axis=2, keepdims=True)
    post = e / jnp.where(total > 0, total, 1.0)
    post = jnp.where(jnp.isnan(z)[None, :, None], jnp.nan, post)
    use = ~(jnp.isinf(z) & (z < 0)) & (ok != 0)     # infeasible: zero gradient
    grad = jnp.where(read & use[None, :, None], -post, 0.0)
    return jnp.where((ok != 0)[None, :, None], grad, jnp.nan).astype(bh.dtype)


def _scatter_states(gs, ext, n_cls):
    """``grad[t, n, c] = sum_{s: ext[n, s] = c} gs[t, n, s]``: the transpose of the
    label gather (a NaN state gradient spreads over its frame's classes, as the
    XLA path's)."""
    if n_cls <= _ONE_HOT_MAX_CLASSES:
        onehot = jax.nn.one_hot(ext, n_cls, dtype=gs.dtype)                   # (N, W, C)
        return jnp.einsum("tns,nsc->tnc", gs, onehot, precision=lax.Precision.HIGHEST)
    t_max, n = gs.shape[:2]
    out = jnp.zeros((t_max, n, n_cls), gs.dtype).at[
        jnp.arange(t_max)[:, None, None], jnp.arange(n)[None, :, None], ext[None]].add(gs)
    # a NaN state gradient poisons its whole frame (as the one-hot product does)
    bad = jnp.isnan(gs).any(axis=2, keepdims=True)
    return jnp.where(bad, jnp.nan, out)


# -- vmap: fold the mapped axis into the sequence axis -----------------------------
#
# Each kernel call is a custom_vmap whose rule moves the mapped axis next to the
# sequence axis and merges the two: a vmapped loss (per-example gradients,
# ensembles) is one launch over k * N programs, not k launches.


def _fold(x, batched, k, axis):
    """``x`` with a leading mapped axis of size ``k`` merged into ``axis`` (unbatched
    inputs broadcast)."""
    if not batched:
        x = jnp.broadcast_to(x[None], (k,) + x.shape)
    x = jnp.moveaxis(x, 0, axis)
    shape = x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:]
    return x.reshape(shape)


def _unfold(x, k, axis):
    n = x.shape[axis] // k
    x = x.reshape(x.shape[:axis] + (k, n) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


# batch (sequence) axis of each argument and result
_ALPHA_IN_AXES = (1, 0, 0, 0, 0)
_ALPHA_OUT_AXES = (1, 0)
_BETA_IN_AXES = (1, 0, 0, 0, 0, 1, 0, 0)


def _alpha(lp, ext, skip, il, tl, form, interpret):
    @jax.custom_batching.custom_vmap
    def call(lp, ext, skip, il, tl):
        axes = varying_axes(lp, ext, skip, il, tl)
        a, z = _alpha_call(lp, ext, skip, il, tl, form=form, interpret=interpret, axes=axes)
        return mark_varying(a, axes), mark_varying(z, axes)

    @call.def_vmap
    def _rule(axis_size, in_batched, *args):
        folded = [_fold(x, b, axis_size, ax) for x, b, ax in zip(args, in_batched, _ALPHA_IN_AXES)]
        a, z = call(*folded)
        return (_unfold(a, axis_size, 1), _unfold(z, axis_size, 0)), (True, True)

    return call(lp, ext, skip, il, tl)


def _beta(lp, ext, skip, il, tl, a, z, ok, form, interpret, posterior):
    @jax.custom_batching.custom_vmap
    def call(lp, ext, skip, il, tl, a, z, ok):
        axes = varying_axes(lp, ext, skip, il, tl, a, z, ok)
        g = _beta_call(lp, ext, skip, il, tl, a, z, ok, form=form, interpret=interpret,
                       posterior=posterior, axes=axes)
        return mark_varying(g, axes)

    @call.def_vmap
    def _rule(axis_size, in_batched, *args):
        folded = [_fold(x, b, axis_size, ax) for x, b, ax in zip(args, in_batched, _BETA_IN_AXES)]
        return _unfold(call(*folded), axis_size, 1), True

    return call(lp, ext, skip, il, tl, a, z, ok)


# -- the kernels (TPU form) ---------------------------------------------------------
#
# A program holds 8 sequences (the sublanes) and walks its frames in blocks of
# ``tt`` (the grid's second, sequential axis), the lattice rows (8, W) in vregs and
# the carried row in a VMEM scratch between blocks.  Every program runs all frames
# (8 sequences share it): past its input length a sequence keeps its alpha (and has
# beta = -inf), exactly the XLA scan's masking.

_SUB = 8


def _frame_block(t_max: int, w: int) -> int:
    """Frames per grid step: a (tt, 8, W) float32 block of at most 1 MiB."""
    tt = max(8, (1 << 20) // (4 * _SUB * w))
    return max(1, min(tt, t_max))


def _roll(x, k, interpret):
    """``y[..., s] = x[..., s - k]`` (cyclic) along the lanes."""
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.roll(x, k % x.shape[-1], 1)


def _alpha_kernel_tpu(lp_ref, skip_ref, il_ref, tl_ref, a_ref, z_ref, carry, *, w, tt,
                      interpret):
    tb = pl.program_id(1)
    s = lax.broadcasted_iota(jnp.int32, (_SUB, w), 1)
    il = il_ref[:, 0:1]
    u = tl_ref[:, 0:1]
    live = s < 2 * u + 1
    skip = skip_ref[...] != 0
    ninf = jnp.full((_SUB, w), _NEG_INF, jnp.float32)

    @pl.when(tb == 0)
    def _():
        # alpha_{-1}: one unit of mass before state 0, so frame 0 is an ordinary step
        carry[...] = jnp.where(s == 0, jnp.zeros_like(ninf), ninf)

    def step(j, a):
        t = tb * tt + j
        p1 = jnp.where(s >= 1, _roll(a, 1, interpret), ninf)
        p2 = jnp.where(skip & (s >= 2), _roll(a, 2, interpret), ninf)
        new = jnp.where(live, _lse3(a, p1, p2) + lp_ref[j], ninf)
        a = jnp.where(t < il, new, a)
        a_ref[j] = a
        return a

    a = lax.fori_loop(0, tt, step, carry[...])
    carry[...] = a

    @pl.when(tb == pl.num_programs(1) - 1)
    def _():
        end = (s == 2 * u) | ((s == 2 * u - 1) & (u > 0))
        e = jnp.where(end, a, ninf)
        m = jnp.max(e, axis=1, keepdims=True)
        m0 = jnp.where(m == _NEG_INF, jnp.zeros_like(m), m)
        z = m0 + jnp.log(jnp.sum(jnp.exp(e - m0), axis=1, keepdims=True))
        zero1 = jnp.zeros_like(z)
        empty = jnp.where(u == 0, zero1, zero1 + _NEG_INF)
        z = jnp.where(il == 0, empty, z)
        z_ref[...] = jnp.broadcast_to(z, z_ref.shape)


def _beta_kernel_tpu(lp_ref, skip_ref, il_ref, tl_ref, z_ref, ok_ref, a_ref, g_ref, carry, *,
                     w, tt, n_tb, interpret):
    tb = n_tb - 1 - pl.program_id(1)                  # frame blocks from the last one down
    s = lax.broadcasted_iota(jnp.int32, (_SUB, w), 1)
    il = il_ref[:, 0:1]
    u = tl_ref[:, 0:1]
    z = z_ref[:, 0:1]
    ok = ok_ref[:, 0:1] != 0
    live = s < 2 * u + 1
    skip = skip_ref[...] != 0
    ninf = jnp.full((_SUB, w), _NEG_INF, jnp.float32)
    zero = jnp.zeros((_SUB, w), jnp.float32)
    nan = zero + jnp.nan
    # s -> s + 2 allowed: skip of state s + 2, rolled back by two lanes
    skip_into = (_roll(skip.astype(jnp.float32), w - 2, interpret) != 0) & (s < w - 2)
    final = live & ((s == 2 * u) | (s == 2 * u - 1))
    init = jnp.where(final, zero, ninf)
    use = ~(z == _NEG_INF) & ok
    nan_z = jnp.isnan(z)

    @pl.when(pl.program_id(1) == 0)
    def _():
        carry[...] = ninf

    def step(i, c):
        j = tt - 1 - i
        t = tb * tt + j
        c1 = jnp.where(s < w - 1, _roll(c, w - 1, interpret), ninf)
        c2 = jnp.where(skip_into, _roll(c, w - 2, interpret), ninf)
        trans = _lse3(c, c1, c2)
        bh = jnp.where(t == il - 1, init, jnp.where((t < il - 1) & live, trans, ninf))
        read = live & (t < il)
        ab = jnp.where(read, a_ref[j] + bh, ninf)
        m = jnp.max(ab, axis=1, keepdims=True)
        e = jnp.exp(ab - jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m)))
        total = jnp.sum(e, axis=1, keepdims=True)
        post = e / jnp.where(total > 0, total, jnp.ones_like(total))
        post = jnp.where(nan_z, nan, post)
        g = jnp.where(read & use, -post, zero)
        g_ref[j] = jnp.where(ok, g, nan)
        return bh + lp_ref[j]

    carry[...] = lax.fori_loop(0, tt, step, carry[...])


def _tpu_layout(lp, ext, skip, il, tl, extra=()):
    """The lattice gathered in XLA and padded for the TPU kernels: ``(lpx (Tp, Np, W),
    skip (Np, W), per-sequence scalars as (Np, 128) lane-broadcast int32/float32)``."""
    t_max, n, _ = lp.shape
    w = ext.shape[1]
    tt = _frame_block(t_max, w)
    tp = -(-t_max // tt) * tt
    npad = -(-n // _SUB) * _SUB - n
    lpx = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (t_max, n, w)), axis=2)
    lpx = jnp.pad(lpx, ((0, tp - t_max), (0, npad), (0, 0)), constant_values=_NEG_INF)
    skip = jnp.pad(skip, ((0, npad), (0, 0)))
    lanes = [jnp.broadcast_to(jnp.pad(x, (0, npad))[:, None], (n + npad, 128))
             for x in (il, tl) + tuple(extra)]
    return lpx, skip, lanes, tt, tp


def _tpu_params():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=(
        getattr(pltpu, "PARALLEL", "parallel"), getattr(pltpu, "ARBITRARY", "arbitrary")))


def _alpha_call_tpu(lp, ext, skip, il, tl, *, interpret, axes=frozenset()):
    from jax.experimental.pallas import tpu as pltpu
    t_max, n, _ = lp.shape
    w = ext.shape[1]
    lpx, skip_p, (il_l, tl_l), tt, tp = _tpu_layout(lp, ext, skip, il, tl)
    n_p = lpx.shape[1]
    grid = (n_p // _SUB, tp // tt)
    frame = pl.BlockSpec((tt, _SUB, w), lambda nb, tb: (tb, nb, 0))
    row = pl.BlockSpec((_SUB, w), lambda nb, tb: (nb, 0))
    lane = pl.BlockSpec((_SUB, 128), lambda nb, tb: (nb, 0))
    kernel = functools.partial(_alpha_kernel_tpu, w=w, tt=tt, interpret=interpret)
    opts = {"interpret": True} if interpret else {"compiler_params": _tpu_params()}
    a, z = pl.pallas_call(
        kernel, grid=grid, in_specs=[frame, row, lane, lane], out_specs=[frame, lane],
        out_shape=(_out((tp, n_p, w), jnp.float32, axes), _out((n_p, 128), jnp.float32, axes)),
        scratch_shapes=[pltpu.VMEM((_SUB, w), jnp.float32)],
        name="duoloss_ctc_alpha_tpu", **opts)(lpx, skip_p, il_l, tl_l)
    return a[:t_max, :n], z[:n, 0]


def _beta_call_tpu(lp, ext, skip, il, tl, a, z, ok, *, interpret, axes=frozenset()):
    from jax.experimental.pallas import tpu as pltpu
    t_max, n, _ = lp.shape
    w = ext.shape[1]
    lpx, skip_p, (il_l, tl_l, z_l, ok_l), tt, tp = _tpu_layout(lp, ext, skip, il, tl, (z, ok))
    n_p = lpx.shape[1]
    a = jnp.pad(a, ((0, tp - t_max), (0, n_p - n), (0, 0)))
    n_tb = tp // tt
    grid = (n_p // _SUB, n_tb)
    frame = pl.BlockSpec((tt, _SUB, w), lambda nb, tb: (n_tb - 1 - tb, nb, 0))
    row = pl.BlockSpec((_SUB, w), lambda nb, tb: (nb, 0))
    lane = pl.BlockSpec((_SUB, 128), lambda nb, tb: (nb, 0))
    kernel = functools.partial(_beta_kernel_tpu, w=w, tt=tt, n_tb=n_tb, interpret=interpret)
    opts = {"interpret": True} if interpret else {"compiler_params": _tpu_params()}
    g = pl.pallas_call(
        kernel, grid=grid, in_specs=[frame, row, lane, lane, lane, lane, frame],
        out_specs=frame,
        out_shape=_out((tp, n_p, w), jnp.float32, axes),
        scratch_shapes=[pltpu.VMEM((_SUB, w), jnp.float32)],
        name="duoloss_ctc_beta_tpu", **opts)(lpx, skip_p, il_l, tl_l, z_l, ok_l, a)
    return g[:t_max, :n]
