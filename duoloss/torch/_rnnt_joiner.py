"""The full RNN-T loss from the joiner, in bounded memory: ``rnnt_loss_from_joiner``.

``rnnt_loss(joiner(enc[:, :, None], pred[:, None]), ...)`` holds the whole
``(N, T, U + 1, V)`` joiner output, its gradient and the joiner's own activations
of that size.  Here the joiner runs on chunks of frames; of each chunk only the
two lattice values per cell are kept (``px``: the next label's log-probability,
``py``: the blank's, exactly as `duoloss.torch._rnnt._lattice` forms them),
the transducer recursion runs once on the whole ``(N, U(+1), T(+1))`` lattice
(`duoloss.core.losses.transducer`), and each chunk is a recomputed region
(`_checkpointed`): the forward builds the chunk's autograd graph but keeps none
of the tensors it saves (saved-tensor hooks store a placeholder), and the first
time the backward asks for one of them the chunk is run again under
``torch.enable_grad()`` to recover them all; each is dropped once handed over.
So the backward pushes ``d loss / d px, py`` through ``log_softmax``, the gathers
and the joiner, one chunk at a time, into whatever the joiner used (its
parameters, ``encoder_out``, ``predictor_out``, any tensor it closes over), and
``torch.autograd.grad`` works as well as ``.backward()``.  Hand-written rather
than ``torch.utils.checkpoint``, whose first call imports ``torch._dynamo``
(about 150 MiB of resident memory).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Literal, Optional, Sequence

import torch

from duoloss.core import _pool
from duoloss.core.losses.joiner import (check_chunk_size, check_joiner_output,
                                        transducer_log_probs, transducer_log_probs_grad)
from duoloss.core.losses.transducer import TRANSDUCER_KERNEL, check_rnnt_options

from ._adapter import apply_kernel
from ._args import check_tensor
from ._joiner import _view, lattice_backward, supported
from ._private import maybe_legacy_batched, transforms_active
from ._rnnt import _ClampGrad, _ScaleGrad, _boundary, _delay, _lattice, _validate

__all__ = ["rnnt_loss_from_joiner"]

#: The default chunk holds about this many joiner outputs (8 MiB of float32): the
#: chunk's output, its gradient and the joiner's activations are the call's memory.
CHUNK_ELEMENTS = 1 << 21


def _malloc_trim():
    """glibc's ``malloc_trim`` (None elsewhere)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


#: Each chunk frees its joiner output and activations (megabytes) while the
#: lattice values and autograd nodes it keeps stay on the heap behind them; glibc
#: then keeps the freed pages resident (its heap is fragmented, and past the first
#: large ``free`` its mmap threshold has risen to the chunk size), so the process
#: grows by several MiB per chunk.  Returning the free pages after each chunk
#: keeps it at one chunk's worth (measured: 900 MiB -> 100 MiB of growth at
#: (16, 500, 100, 500)).
_TRIM = _malloc_trim()


def _release(x):
    if _TRIM is not None and x.device.type == "cpu":
        _TRIM(0)


class _Region:
    """One recomputed chunk: ``fn(*args)``'s saved tensors, recovered on demand."""

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args
        self.count = 0  # tensors saved by the forward
        self.saved = None  # the recomputed ones (None: not recomputed, or all handed over)
        self.left = 0
        self.rng = torch.get_rng_state()

    def pack(self, _tensor):
        i = self.count
        self.count += 1
        return (self, i)

    def recompute(self):
        _release(self.args[2])  # the previous chunk's pages
        saved = []

        def keep(x):
            saved.append(x.detach())

        args = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                     else a for a in self.args)
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(keep, lambda _h: None):
            torch.set_rng_state(self.rng)
            self.fn(*args)
        if len(saved) != self.count:
            raise RuntimeError("rnnt_loss_from_joiner: the joiner saved a different number of "
                               f"tensors when recomputed ({len(saved)} vs {self.count}); it must "
                               "be deterministic (same operations on every call)")
        self.saved = saved
        self.left = len(saved)


def _unpack(handle):
    region, i = handle
    if region.saved is None or region.saved[i] is None:
        region.recompute()  # first use (or a second backward with retain_graph=True)
    x = region.saved[i]
    region.saved[i] = None
    region.left -= 1
    if region.left == 0:
        region.saved = None
    return x


class _ChunkLattice(torch.autograd.Function):
    """``(px, py)`` of a CPU chunk: the core kernels `duoloss.torch._joiner`'s
    operators run (so the same bits as `duoloss.torch._rnnt._lattice`), called
    directly: eager only, and no ``torch.library`` dispatch, whose first call
    imports ``torch._dynamo``."""

    @staticmethod
    def forward(ctx, x, tg, il, tl, blank):
        with _pool.openmp_batches():
            px, py, lse = transducer_log_probs(_view(x, x.shape), _view(tg, tg.shape),
                                               _view(il, -1), _view(tl, -1), blank)
        lse = torch.from_numpy(lse)
        ctx.blank = blank
        ctx.save_for_backward(x, tg, il, tl, lse)
        return torch.from_numpy(px), torch.from_numpy(py)

    @staticmethod
    def backward(ctx, g_px, g_py):
        x, tg, il, tl, lse = ctx.saved_tensors
        if maybe_legacy_batched(g_px) or maybe_legacy_batched(g_py):
            # cotangents batched by the legacy vmap (gradcheck's batched-gradient
            # check): the same kernel as a torch.library operator, which that vmap
            # runs once per cotangent (no host read of a batched tensor)
            return (lattice_backward(x, lse, tg, il, tl, g_px, g_py, ctx.blank),
                    None, None, None, None)
        with _pool.openmp_batches():
            out = transducer_log_probs_grad(_view(x, x.shape), _view(lse, lse.shape),
                                            _view(tg, tg.shape), _view(il, -1), _view(tl, -1),
                                            ctx.blank, _view(g_px, g_px.shape),
                                            _view(g_py, g_py.shape))
        return torch.from_numpy(out), None, None, None, None


def _checkpointed(fn, *args):
    """``fn(*args)`` with its autograd graph but none of its saved tensors: the
    backward recomputes them (the chunk's joiner and lattice) once per chunk."""
    region = _Region(fn, args)
    with torch.autograd.graph.saved_tensors_hooks(region.pack, _unpack):
        return fn(*args)


def _check_shapes(fn, enc, pred, targets):
    check_tensor(fn, "encoder_out", enc)
    check_tensor(fn, "predictor_out", pred)
    check_tensor(fn, "targets", targets)
    if enc.dim() != 3:
        raise ValueError(f"{fn}: argument 'encoder_out' must be an (N, T, D)-tensor, "
                         f"got shape {tuple(enc.shape)}")
    if pred.dim() != 3 or pred.shape[0] != enc.shape[0]:
        raise ValueError(f"{fn}: argument 'predictor_out' must be an (N, U + 1, D')-tensor "
                         f"with N = {enc.shape[0]}, got shape {tuple(pred.shape)}")
    if targets.dim() != 2 or tuple(targets.shape) != (enc.shape[0], pred.shape[1] - 1):
        raise ValueError(f"{fn}: argument 'targets' must have shape (N, U) = "
                         f"({enc.shape[0]}, {pred.shape[1] - 1}) (from encoder_out and "
                         f"predictor_out), got {tuple(targets.shape)}")


def _joined(fn, joiner, enc, pred, t_len, n_cls=None, frames=None):
    out = joiner(enc[:, :, None], pred[:, None])
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    check_joiner_output(fn, shape, (enc.shape[0], t_len, pred.shape[1]), n_cls, "tensor", frames)
    return out


def rnnt_loss_from_joiner(joiner: Callable, encoder_out: torch.Tensor, predictor_out: torch.Tensor,
                          targets: torch.Tensor, logit_lengths: torch.Tensor | Sequence[int],
                          target_lengths: torch.Tensor | Sequence[int], *, blank: int = -1,
                          clamp: float = -1, reduction: Literal["none", "sum", "mean"] = "mean",
                          fused_log_softmax: bool = True, fastemit_lambda: float = 0.0,
                          delay_penalty: float = 0.0, chunk_size: Optional[int] = None
                          ) -> torch.Tensor:
    r"""The RNN-T loss of ``joiner(encoder_out[:, :, None], predictor_out[:, None])``
    without ever holding that ``(N, T, U + 1, V)`` output or its gradient.

    The same loss and gradients as [`duoloss.torch.rnnt_loss`][duoloss.torch.rnnt_loss] on the whole
    joiner output (same maths: $\text{loss}_b = -\log \sum_{\text{alignments}}
    \prod \operatorname{softmax}(\text{joiner}(e_{b,t}, p_{b,u}))_k$), computed in
    chunks of ``chunk_size`` frames: the forward keeps only the two lattice values
    per cell (the log-probabilities of the next label and of the blank,
    ``(N, U, T + 1)`` and ``(N, U + 1, T)``), and the backward recomputes each
    chunk's joiner output (a recomputed region per chunk), so the
    memory of the joiner's output, its activations and their gradients is that of
    one chunk.  The cost is one more joiner forward.

    Args:
      joiner: any callable (e.g. an ``nn.Module``) mapping ``(N, t, 1, D)`` and
        ``(N, 1, U + 1, D')`` to the logits ``(N, t, U + 1, V)`` by broadcasting,
        as ``joiner(enc[:, :, None], pred[:, None])``.  Gradients reach every
        tensor it uses (its parameters, closed-over tensors), as if it were
        called once on the whole input.  It must be deterministic (no dropout
        unless it draws from the CPU generator, whose state is restored for the recomputation).
      encoder_out: ``(N, T, D)``.
      predictor_out: ``(N, U + 1, D')``.
      targets: ``(N, U)`` integer targets, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      logit_lengths: ``(N,)`` frame counts, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      target_lengths: ``(N,)`` target lengths, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      blank: the blank index (``-1``: the last class), as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      clamp: gradient clamp (``< 0``: none), as in [`rnnt_loss`][duoloss.torch.rnnt_loss] (here it bounds the gradient w.r.t. the joiner's output).
      reduction: ``'none'``, ``'sum'`` or ``'mean'``, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      fused_log_softmax: as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      fastemit_lambda: FastEmit regularisation, as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      delay_penalty: as in [`rnnt_loss`][duoloss.torch.rnnt_loss].
      chunk_size: frames per chunk; ``None`` picks about ``2**21`` joiner outputs
        per chunk (8 MiB in float32).

    Returns:
      The reduced loss, or ``(N,)`` losses for ``reduction='none'``.

    NB: the joiner is called once on the first frame of the first sequence
    (to learn ``V``) before the chunks.  Eager mode (``torch.compile`` and
    ``torch.func`` transforms are not supported here).  Typical joiner:
    ``lambda e, p: head(torch.tanh(e + p))`` with ``head`` an ``nn.Linear(H, V)``.

    Examples:
        >>> import torch
        >>> import duoloss.torch as d
        >>> enc, pred = torch.randn(1, 2, 3), torch.randn(1, 2, 3)  # (N, T, D), (N, U + 1, D)
        >>> joiner = lambda e, p: 0 * (e + p)  # uniform logits over V = D = 3 classes
        >>> loss = d.rnnt_loss_from_joiner(joiner, enc, pred, torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1]), blank=0, chunk_size=1)
        >>> round(loss.item(), 4)  # 2 alignments of 3 moves at 1/3 each: log(27 / 2)
        2.6027
    """
    fn = "rnnt_loss_from_joiner"
    check_rnnt_options(fn, reduction, clamp, fused_log_softmax, fastemit_lambda, delay_penalty)
    if not callable(joiner):
        raise TypeError(f"{fn}: argument 'joiner' must be callable, got {type(joiner).__name__}")
    chunk_size = check_chunk_size(fn, chunk_size)
    _check_shapes(fn, encoder_out, predictor_out, targets)
    n, t_max, _ = encoder_out.shape
    u1 = predictor_out.shape[1]
    with torch.no_grad():  # V, dtype and device of the joiner's output (an empty one if T = 0)
        probe = _joined(fn, joiner, encoder_out[:1, :1], predictor_out[:1], min(t_max, 1))
    n_cls, dtype, device = probe.shape[3], probe.dtype, probe.device
    shape_only = torch.empty((), dtype=dtype, device=device).expand(n, t_max, u1, n_cls)
    blank, il, tl = _validate(fn, shape_only, targets, logit_lengths, target_lengths, blank)
    if chunk_size is None:
        chunk_size = max(1, CHUNK_ELEMENTS // max(1, n * u1 * n_cls))
    chunk_size = min(chunk_size, max(t_max, 1))
    bound = 0.0
    if clamp > 0:
        bound = float(clamp) / max(n, 1) if reduction == "mean" else float(clamp)
    fused, lam = bool(fused_log_softmax), float(fastemit_lambda)

    def chunk(t0, t1, enc_c, pred):
        x = _joined(fn, joiner, enc_c, pred, t1 - t0, n_cls, (t0, t1))
        if bound > 0:
            x = _ClampGrad.apply(x, bound)
        il_c = (il - t0).clamp(0, t1 - t0)
        if fused and supported(x) and not transforms_active():
            tg, _ = _boundary(x, targets, il_c, tl, blank)
            px, py = _ChunkLattice.apply(x, tg, il_c, tl, blank)
            if lam > 0:
                px = _ScaleGrad.apply(px, 1.0 + lam)
        else:
            px, py, _ = _lattice(x, targets, il_c, tl, blank, fused, lam, 0.0)
        return px[..., :t1 - t0], py

    pxs, pys = [], []
    for t0 in range(0, t_max, chunk_size):
        t1 = min(t_max, t0 + chunk_size)
        args = (t0, t1, encoder_out[:, t0:t1], predictor_out)
        if torch.is_grad_enabled() and not transforms_active():
            # (torch.func has no saved-tensor hooks: under its transforms the
            # chunks' activations are kept, not recomputed)
            px, py = _checkpointed(chunk, *args)
        else:
            px, py = chunk(*args)
        _release(encoder_out)
        pxs.append(px)
        pys.append(py)
    del probe
    if pxs:
        px = torch.cat(pxs, dim=2)
        py = torch.cat(pys, dim=2)
    else:
        px = torch.zeros((n, u1 - 1, 0), dtype=dtype, device=device)
        py = torch.zeros((n, u1, 0), dtype=dtype, device=device)
    if px.dtype in (torch.float16, torch.bfloat16):
        px, py = px.float(), py.float()
    px = torch.nn.functional.pad(px, (0, 1), value=float("-inf"))
    if delay_penalty > 0:
        px = px + _delay(il, t_max, float(delay_penalty), px)
    _, boundary = _boundary(shape_only, targets, il, tl, blank)
    losses = apply_kernel(TRANSDUCER_KERNEL, (px, py, boundary), rnnt_type="regular")
    if fastemit_lambda > 0:
        losses = losses + lam * losses.detach()
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / max(n, 1)
