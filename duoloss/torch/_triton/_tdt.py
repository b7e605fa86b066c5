r"""The torch device path of the duration transducers: TDT, multi-blank RNN-T
(and TDT's ``omega`` RNN-T).

Same contract and numbers as `duoloss.core.losses.tdt` (its docstring has the
lattice, the FastEmit/clamp scope and the NaN/inf policy) and the same maths as
JAX's device path (`duoloss.jax._xla.tdt`): one recursion whose moves come
from small static tables -- label moves ``(d, i)`` (duration ``d``,
duration-logit index ``i`` or ``-1``) and blank moves ``(k, d, i)`` (symbol
``k``).  Torch operations on the inputs' device form the move weights
(``log_softmax`` of the token logits minus ``sigma`` at the move's symbol, plus
the duration's ``log_softmax``; ``-inf`` outside each sequence's box), the
Triton kernel (`duoloss.torch._triton._tdt_kernels`) runs the alpha/beta
recursion, and torch operations form every move's posterior
``exp(alpha + w + beta_dest - log Z)`` and each cell's gradient row exactly as the
core.  The forward keeps only the gradient's ``(N, T, U + 1)``-sized factors; the
backward writes the gradient into its own buffer in place (an
``autograd.Function``): beyond the logits and their gradient, memory stays
``O(N T (U + 1) (D + number of blank symbols))`` plus a quarter of the logits for
the normaliser's temporary (measured: ``benchmarks/device_memory.py``).

``torch.compile`` does not trace this path: the frontends send traced calls to
the host path.
"""
from __future__ import annotations

import sys

import torch

from ._ops import _GradScale, _launch_device, int_to, launch, warps

__all__ = ["kernels_interpreted", "multiblank_losses", "tdt_losses"]

_NEG = float("-inf")
_HALF = (torch.float16, torch.bfloat16)


def kernels_interpreted():
    """None before the kernel is imported, else whether it was defined under the
    Triton interpreter."""
    mod = sys.modules.get(__package__ + "._tdt_kernels")
    return None if mod is None else mod.INTERPRETED


def tdt_losses(logits, targets, il, tl, *, blank, durations, sigma, fastemit_lambda, clamp,
               omega):
    """Per-sequence TDT losses ``(N,)`` (``(1 - omega) * tdt + omega * rnnt``, times
    ``1 + fastemit_lambda``), differentiable w.r.t. ``logits`` ``(N, T, U + 1, V + D)``;
    arguments already validated, ``blank`` in ``[0, V)``."""
    _check_lattice("tdt_loss", logits)
    durations = tuple(int(d) for d in durations)
    n_dur = len(durations)
    n_lab = logits.shape[-1] - n_dur
    tdt_tab = (tuple((d, i) for i, d in enumerate(durations)),
               tuple((blank, d, i) for i, d in enumerate(durations) if d > 0))
    rnnt_tab = (((0, -1),), ((blank, 1, -1),))
    common = (n_lab, n_dur, float(fastemit_lambda), float(clamp))
    omega = float(omega)
    specs = []
    if omega < 1.0:
        specs.append(((tdt_tab, float(sigma), True) + common, 1.0 - omega))
    if omega > 0.0:
        specs.append(((rnnt_tab, 0.0, False) + common, omega))
    return _apply(logits, targets, il, tl, tuple(specs))


def multiblank_losses(logits, targets, il, tl, *, blank, big_blank_durations, sigma,
                      fastemit_lambda, clamp):
    """Per-sequence multi-blank RNN-T losses ``(N,)``, differentiable w.r.t. ``logits``
    ``(N, T, U + 1, V)``; big blank ``i`` at ``blank - 1 - i``."""
    _check_lattice("multiblank_rnnt_loss", logits)
    big = tuple(int(d) for d in big_blank_durations)
    tab = (((0, -1),), ((blank, 1, -1),) + tuple((blank - 1 - i, d, -1)
                                                   for i, d in enumerate(big)))
    spec = (tab, float(sigma), False, logits.shape[-1], 0, float(fastemit_lambda), float(clamp))
    return _apply(logits, targets, il, tl, ((spec, 1.0),))


# ----------------------------------------------------------------- helpers
def _lse_raw(x, dim):
    """``log sum exp`` as the core's normaliser (keepdim): NaN for a row holding NaN
    or ``+inf``, ``-inf`` for a row of ``-inf`` only (its moves then weigh ``-inf``:
    probability 0, see `_logp`)."""
    m = x.amax(dim=dim, keepdim=True)
    ms = torch.where(m == _NEG, 0.0, m)
    return ms + torch.log(torch.exp(x - ms).sum(dim=dim, keepdim=True))


def _logp(x, lse):
    """``x - lse``, a log-probability: ``-inf`` for every entry of a row of ``-inf``
    only (``lse = -inf``; a move out of such a cell has probability 0, never NaN)."""
    return torch.where(lse == _NEG, _NEG, x - lse)


def _lse_chunked(x):
    """`_lse_raw` over the last axis, a few sequences at a time: its ``exp``
    temporary stays a fraction of ``x`` (each row's value as in one call)."""
    n = x.shape[0]
    step = max(1, -(-n // 4))
    if n <= 1:
        return _lse_raw(x, -1)
    return torch.cat([_lse_raw(c, -1) for c in x.split(step, 0)], 0)


def _lse_safe(x, dim):
    """``log sum exp`` over ``dim``: ``-inf`` for only ``-inf`` entries, NaN in, NaN out."""
    m = x.amax(dim=dim, keepdim=True)
    m0 = torch.where(m == _NEG, torch.zeros_like(m), m)
    return m0.squeeze(dim) + torch.log(torch.exp(x - m0).sum(dim=dim))


def _path(*terms):
    """The sum of log-weights along a path, ``-inf`` where any term is ``-inf``: a
    move out of a cell no path reaches (or into one that reaches no end) is never
    read, whatever the logits of that cell (NaN, ``+inf``), as on the host."""
    total = terms[0]
    dead = terms[0] == _NEG
    for x in terms[1:]:
        total = total + x
        dead = dead | (x == _NEG)
    return torch.where(dead, _NEG, total)


def _shift(x, k, dim, fill=_NEG):
    """``y[i] = x[i - k]`` along ``dim`` (``k < 0``: ``x[i + |k|]``), ``fill`` outside."""
    n = x.shape[dim]
    out = torch.full_like(x, fill)
    if abs(k) >= n:
        return out
    if k >= 0:
        out.narrow(dim, k, n - k).copy_(x.narrow(dim, 0, n - k))
    else:
        out.narrow(dim, 0, n + k).copy_(x.narrow(dim, -k, n + k))
    return out


#: The kernel addresses one sequence's ``(T, U + 1)`` lattice with 32-bit offsets
#: (from 64-bit per-sequence bases): every offset it forms is below ``(T + 1) (U + 1)``.
_MAX_CELLS = 2 ** 31 - 1


def _check_lattice(fn: str, logits) -> None:
    """``ValueError`` when one sequence's lattice is too large for the kernel's 32-bit
    in-sequence offsets (``(T + 1) (U + 1) > 2**31 - 1``; the batch and the logits'
    total size are not limited).  Shapes only: no host synchronisation."""
    t_max, u1 = logits.shape[1], logits.shape[2]
    if (t_max + 1) * u1 > _MAX_CELLS:
        raise ValueError(f"{fn}: argument 'logits' of shape {tuple(logits.shape)} has a "
                         f"lattice of T * (U + 1) = {t_max * u1} cells per sequence; the "
                         f"device path supports (T + 1) * (U + 1) <= {_MAX_CELLS} (use "
                         f"impl='host' or shorter sequences)")


def _pack(durations) -> int:
    """Durations as one compile-time integer, 12 bits each (the kernel unpacks them)."""
    out = 0
    for m, d in enumerate(durations):
        if not 0 <= d < 4096:
            raise ValueError(f"tdt_loss: argument 'durations' must hold values below 4096 on "
                             f"the device path, got {d}")
        out |= int(d) << (12 * m)
    return out


def _maxnreg(num_warps: int) -> int:
    """Registers per thread the kernel may use: the register file of an SM (64 K on
    sm_80/sm_90) for one program, at most 255.  Without the bound ``ptxas`` budgets
    registers for two programs per SM at ``BLOCK = 2048`` (16 warps: 64 per thread)
    and spilled the duration-0 chain's scan in float64 (20 bytes on sm_80); with it
    no TDT variant of ``benchmarks/aot_table.py`` spills."""
    return min(255, 65536 // (32 * num_warps))


def _block(n: int) -> int:
    b = 2
    while b < n:
        b *= 2
    return b


def _prepare(x, tg, il, tl, spec):
    """Validity, box mask and the masked move weights ``(N, T, U1)``."""
    (lab_moves, blk_moves), sigma, _, n_lab, n_dur, _, _ = spec
    n, t_max, u1, _ = x.shape
    dev = x.device
    u_cap = u1 - 1
    in_tg = torch.arange(u_cap, device=dev)[None] < tl[:, None]
    lab_ok = (tg >= 0) & (tg < n_lab)
    for k in sorted({k for k, _, _ in blk_moves}):
        lab_ok = lab_ok & (tg != k)
    valid = ((il >= 0) & (il <= t_max) & (tl >= 0) & (tl <= u_cap)
             & (lab_ok | ~in_tg).all(dim=1))
    tok = x[..., :n_lab]
    lse = _lse_chunked(tok)                                         # (N, T, U1, 1)
    y = torch.cat([tg.clamp(0, n_lab - 1), tg.new_zeros((n, 1))], dim=1).to(torch.int64)
    lab = torch.gather(tok, -1, y[:, None, :, None].expand(n, t_max, u1, 1))[..., 0]
    lab = _logp(lab, lse[..., 0]) - sigma
    dlp = _logp(x[..., n_lab:], _lse_raw(x[..., n_lab:], -1)) if n_dur else None
    t = torch.arange(t_max, device=dev)[None, :, None]
    u = torch.arange(u1, device=dev)[None, None, :]
    tb, ub = il[:, None, None], tl[:, None, None]
    inbox = valid[:, None, None] & (t < tb) & (u <= ub)
    lab_w = []
    for d, i in lab_moves:
        w = lab + dlp[..., i] if i >= 0 else lab
        lab_w.append(torch.where(inbox & (u < ub) & (t + d < tb), w, _NEG))
    blk_w, term_w = [], []
    for k, d, i in blk_moves:
        w = _logp(tok[..., k], lse[..., 0]) - sigma
        if i >= 0:
            w = w + dlp[..., i]
        blk_w.append(torch.where(inbox & (t + d < tb), w, _NEG))
        term_w.append(torch.where(inbox & (u == ub) & (t + d == tb), w, _NEG))
    return valid, inbox, lse, y, lab_w, blk_w, term_w


def _tables(x, il, lab_moves, blk_moves, lab_w, blk_w, term, want_beta):
    """``(alpha, beta or None)`` ``(N, T, U1)`` from the Triton kernel."""
    from . import _tdt_kernels
    n, t_max, u1 = term.shape
    dev = x.device
    if dev.type == "cpu" and not _tdt_kernels.INTERPRETED:
        raise RuntimeError("impl='device' on CPU tensors needs TRITON_INTERPRET=1 in the "
                           "environment before the first device call (the kernel was defined "
                           "for a GPU)")
    pos = [(d, w) for (d, _), w in zip(lab_moves, lab_w) if d > 0]
    zero = [w for (d, _), w in zip(lab_moves, lab_w) if d == 0]
    lab = (torch.stack([w for _, w in pos]) if pos else term.new_empty((1,))).contiguous()
    blk = torch.stack(blk_w).contiguous()
    w0 = (zero[0] if zero else term).contiguous()
    alpha = torch.full((n, t_max, u1), _NEG, dtype=term.dtype, device=dev)
    beta = torch.full_like(alpha, _NEG) if want_beta else alpha
    ilk = il.clamp(0, t_max).to(torch.int32).contiguous()
    block = _block(u1)
    nw = warps(block, 4)
    if n and t_max:
        with _launch_device(x):
            # the durations are compile-time constants of the kernel (packed 12 bits
            # each): no table crosses to the device per call
            launch(_tdt_kernels.tdt_kernel, (n,), (
                lab, blk, w0, term.contiguous(), ilk, alpha, beta, n, t_max, u1),
                dict(LAB_D=_pack([d for d, _ in pos]), L=len(pos),
                     BLK_D=_pack([d for _, d, _ in blk_moves]), J=len(blk_moves),
                     HAS_ZERO=bool(zero), WANT_BETA=bool(want_beta), BLOCK=block,
                     num_warps=nw, maxnreg=_maxnreg(nw)))
    return alpha, (beta if want_beta else None)


def _run(x, tg, il, tl, spec, want):
    """``(losses (N,), recipe or None)`` in the work dtype (the core's numbers).

    The recipe holds the gradient's ``(N, T, U + 1)``-sized factors (posteriors,
    occupations, normalisers, masks); `_grad` turns it into the ``(N, T, U + 1, V +
    D)`` gradient in the backward, written in place into the gradient's own buffer:
    no logits-sized temporary is kept between forward and backward."""
    (lab_moves, blk_moves), _, dur_grad, n_lab, n_dur, lam, clamp = spec
    n, t_max, u1, _ = x.shape
    if n == 0 or t_max == 0:
        labels_ok = (tg >= 0) & (tg < n_lab)
        for k, _, _ in blk_moves:
            labels_ok = labels_ok & (tg != k)
        in_tg = torch.arange(u1 - 1, device=x.device)[None] < tl[:, None]
        valid = (il == 0) & (tl >= 0) & (tl <= u1 - 1) & (labels_ok | ~in_tg).all(dim=1)
        zero = x.new_zeros((n,))
        loss = torch.where(valid, torch.where(tl == 0, zero, float("inf")), float("nan"))
        return loss, ({} if want else None)
    valid, inbox, lse, y, lab_w, blk_w, term_w = _prepare(x, tg, il, tl, spec)
    term = torch.stack(term_w)
    term = _lse_safe(term, 0) if len(term_w) > 1 else term[0]         # (N, T, U1)
    alpha, beta = _tables(x, il, lab_moves, blk_moves, lab_w, blk_w, term, want)
    logz = _lse_safe(_path(alpha, term).reshape(n, -1), 1)
    nll = torch.where(il == 0, torch.where(tl == 0, 0.0, float("inf")).to(x.dtype), -logz)
    loss = torch.where(valid, nll * (1.0 + lam), float("nan"))
    if not want:
        return loss, None
    use = valid & (il > 0) & torch.isfinite(logz)
    z = torch.where(use, logz, 0.0)[:, None, None]
    plab = torch.zeros_like(alpha)
    pdur = [torch.zeros_like(alpha) for _ in range(n_dur)]
    for (d, i), w in zip(lab_moves, lab_w):
        p = torch.exp(_path(alpha, w, _shift(_shift(beta, -d, 1), -1, 2)) - z)
        plab = plab + p
        if i >= 0:
            pdur[i] = pdur[i] + p
    pblk = {}
    for (k, d, i), w, tw in zip(blk_moves, blk_w, term_w):
        p = torch.exp(_path(alpha, w, _shift(beta, -d, 1)) - z) + torch.exp(_path(alpha, tw) - z)
        pblk[k] = pblk[k] + p if k in pblk else p
        if i >= 0:
            pdur[i] = pdur[i] + p
    occ = plab + sum(pblk.values())
    rec = {"lse": lse, "y": y, "plab": plab, "occ": occ, "use": use, "valid": valid,
           "inbox": inbox, "logz": logz}
    rec.update({f"pblk{k}": p for k, p in pblk.items()})
    if n_dur and dur_grad:
        rec["dur"] = torch.exp(x[..., n_lab:] - _lse_raw(x[..., n_lab:], -1)) * occ[..., None] \
            - torch.stack(pdur, dim=-1)                                 # (N, T, U1, D)
    return loss, rec


def _grad(x, rec, spec):
    """The gradient ``(N, T, U + 1, V + D)`` of one spec from its recipe (`_run`),
    built in place in one new buffer (the core's formula: ``softmax * (occ + lam
    plab)`` minus the label and blank posteriors at their classes, clamped; the
    duration columns; zero where a cell holds no mass; NaN for a NaN lattice or an
    invalid sequence)."""
    (_, blk_moves), _, _, n_lab, n_dur, lam, clamp = spec
    g = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not rec:
        return g.zero_()
    n, t_max, u1, _ = x.shape
    gt = g[..., :n_lab] if n_dur else g
    gt.copy_(x[..., :n_lab]).sub_(rec["lse"]).exp_()
    gt.mul_((rec["occ"] + lam * rec["plab"])[..., None])
    gt.scatter_add_(-1, rec["y"][:, None, :, None].expand(n, t_max, u1, 1),
                    ((-(1.0 + lam)) * rec["plab"])[..., None])
    for k in sorted({k for k, _, _ in blk_moves}):
        gt[..., k].sub_(rec[f"pblk{k}"])
    if clamp > 0:
        gt.clamp_(-clamp, clamp)
    if n_dur:
        if "dur" in rec:
            g[..., n_lab:].copy_(rec["dur"])
        else:
            g[..., n_lab:].zero_()
    keep = (rec["occ"] != 0) & rec["use"][:, None, None]
    g.masked_fill_(~keep[..., None], 0.0)
    # a NaN the lattice read: the whole box NaN; an invalid row: the whole sequence NaN
    valid, logz = rec["valid"], rec["logz"]
    g.masked_fill_((rec["inbox"] & (valid & torch.isnan(logz))[:, None, None])[..., None],
                   float("nan"))
    g.masked_fill_(~valid[:, None, None, None], float("nan"))
    return g


def _forward(x, tg, il, tl, specs, want):
    """``(losses in x's dtype, recipes)`` of the weighted specs (``(spec, weight)``)."""
    xw = x.float() if x.dtype in _HALF else x
    with torch.no_grad():
        out = [_run(xw, tg, il, tl, spec, want) for spec, _ in specs]
        loss = out[0][0] if len(specs) == 1 else sum(w * o[0] for (_, w), o in zip(specs, out))
    return loss.to(x.dtype), [o[1] for o in out]


def _backward(x, specs, recipes, loss, ct):
    """``ct``-scaled gradient w.r.t. ``x`` (one logits-sized buffer; a second one
    only while combining TDT with its ``omega`` RNN-T)."""
    xw = x.float() if x.dtype in _HALF else x
    with torch.no_grad():
        g = _grad(xw, recipes[0], specs[0][0])
        if len(specs) > 1:
            (_, wa), (sb, wb) = specs
            g.mul_(wa).add_(_grad(xw, recipes[1], sb).mul_(wb))
            g.masked_fill_(torch.isinf(loss)[:, None, None, None], 0.0)
        g.mul_(ct.to(g.dtype)[:, None, None, None])
    return g.to(x.dtype)


class _TDT(torch.autograd.Function):
    @staticmethod
    def forward(x, tg, il, tl, specs, want):
        loss, recipes = _forward(x, tg, il, tl, specs, want)
        flat = [t for rec in recipes if rec is not None for _, t in sorted(rec.items())]
        return (loss, *flat)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, specs, want = inputs[0], inputs[4], inputs[5]
        ctx.mark_non_differentiable(*output[1:])
        ctx.specs = specs
        # the recipes' keys, in the order forward flattened them
        ctx.keys = [_recipe_keys(x, spec) for spec, _ in specs] if want else None
        ctx.save_for_backward(x, output[0], *output[1:])

    @staticmethod
    def backward(ctx, ct, *_unused):
        x, loss, *flat = ctx.saved_tensors
        if ctx.keys is None:
            raise RuntimeError("tdt_loss: the device path computed no gradient (its input "
                               "did not require grad when called)")
        recipes, i = [], 0
        for keys in ctx.keys:
            recipes.append(dict(zip(keys, flat[i:i + len(keys)])))
            i += len(keys)
        g = _backward(x, ctx.specs, recipes, loss, ct)
        if torch.is_grad_enabled():  # create_graph: a node whose own backward raises
            g = _GradScale.apply(g, torch.ones((), dtype=g.dtype, device=g.device), x)
        return g, None, None, None, None, None


def _recipe_keys(x, spec):
    """The sorted keys of `_run`'s recipe for ``x`` and ``spec``."""
    (_, blk_moves), _, dur_grad, _, n_dur, _, _ = spec
    if x.shape[0] == 0 or x.shape[1] == 0:
        return []
    keys = ["lse", "y", "plab", "occ", "use", "valid", "inbox", "logz"]
    keys += [f"pblk{k}" for k in {k for k, _, _ in blk_moves}]
    if n_dur and dur_grad:
        keys.append("dur")
    return sorted(keys)


def _apply(x, tg, il, tl, specs):
    tg = int_to(tg, x.device)
    il = int_to(il, x.device).reshape(-1)
    tl = int_to(tl, x.device).reshape(-1)
    want = torch.is_grad_enabled() and x.requires_grad
    return _TDT.apply(x, tg, il, tl, specs, want)[0]

