"""Transducer decoding (RNN-T, TDT, multi-blank) from the user's predictor and joiner, in torch ops.

The searches themselves are written once for both frameworks in
`duoloss._xp.transducer_decode`; this module holds the torch namespace they run on,
the argument checks, and the public functions.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils import _pytree

from duoloss.core import _validate as _v
from duoloss._xp import transducer_decode as _search

from ._adapter import check_not_torchscript
from ._args import check_tensor, int_array

__all__ = ["multiblank_greedy_decode", "rnnt_beam_search", "rnnt_greedy_decode",
           "tdt_beam_search", "tdt_greedy_decode"]

#: ``predict(tokens (N,) int64, state or None) -> (predictor_out (N, ...), state)``
Predict = Callable[[torch.Tensor, Any], tuple[Any, Any]]
#: ``join(encoder_frames (N, ...), predictor_out (N, ...)) -> logits (N, V[+D])``
Join = Callable[[torch.Tensor, Any], torch.Tensor]


def _tree_map(f, tree, *others):
    """``f`` on the tensors of a nest of lists/tuples/dicts; other leaves (None) unchanged."""
    return _pytree.tree_map(lambda a, *b: f(a, *b) if isinstance(a, torch.Tensor) else a,
                            tree, *others)


class _TorchSearchOps:
    """The array vocabulary of `duoloss._xp.transducer_decode` in torch."""

    def __init__(self, device):
        self.device = device

    def full(self, shape, value, kind):
        dtype = {"int": torch.int64, "bool": torch.bool}[kind]
        return torch.full(shape, value, dtype=dtype, device=self.device)

    def zeros_float(self, shape, like):
        return torch.zeros(shape, dtype=like.dtype, device=self.device)

    def const_int(self, values):
        return torch.tensor(list(values), dtype=torch.int64, device=self.device)

    def arange(self, n):
        return torch.arange(n, device=self.device)

    where = staticmethod(torch.where)
    isnan = staticmethod(torch.isnan)
    logaddexp = staticmethod(torch.logaddexp)

    @staticmethod
    def maximum(x, v):
        return torch.clamp(x, min=v)

    @staticmethod
    def minimum(x, v):
        return torch.clamp(x, max=v) if not isinstance(v, torch.Tensor) else torch.minimum(x, v)

    @staticmethod
    def argmax(x):
        return x.argmax(-1)

    @staticmethod
    def log_softmax(x):
        return torch.log_softmax(x, -1)

    @staticmethod
    def astype_int(x):
        return x.to(torch.int64)

    @staticmethod
    def any(x):
        return bool(x.any())

    @staticmethod
    def any_(x, axis):
        return x.any(axis)

    @staticmethod
    def all_(x, axis):
        return x.all(axis)

    @staticmethod
    def reshape(x, shape):
        return x.reshape(shape)

    @staticmethod
    def concat(xs, axis):
        return torch.cat(xs, axis)

    @staticmethod
    def gather(x, idx, axis):
        return torch.gather(x, axis, idx)

    @staticmethod
    def lse(x, axes):
        return torch.logsumexp(x, dim=axes)

    @staticmethod
    def topk(x, k):
        """The ``k`` largest along the last axis, best first, ties to the lower index
        (as ``jax.lax.top_k``)."""
        vals, idx = torch.sort(x, stable=True, dim=-1, descending=True)
        return vals[..., :k], idx[..., :k]

    @staticmethod
    def frame_rows(enc, rows, frames):
        return enc[rows, frames]

    @staticmethod
    def set_rows(buf, slot, val, mask):
        """``buf[n, slot[n]] = val[n]`` where ``mask[n]`` (a new tensor)."""
        old = buf.gather(1, slot[:, None])[:, 0]
        return buf.scatter(1, slot[:, None], torch.where(mask, val, old)[:, None])

    @staticmethod
    def kill(x, idx, mask):
        """``x[b, idx[b, k]] = -inf`` where ``mask[b, k]`` (a new tensor)."""
        m = x.shape[1]
        pad = torch.cat([x, x.new_full((x.shape[0], 1), float("-inf"))], 1)
        return pad.scatter(1, torch.where(mask, idx, m), float("-inf"))[:, :m]

    @staticmethod
    def take_tree(tree, rows):
        return _tree_map(lambda a: a[rows], tree)

    @staticmethod
    def predict_where(predict, mask, tokens, pred, state):
        """The predictor advanced on the rows of ``mask``, the others unchanged."""
        if not bool(mask.any()):
            return pred, state
        new_pred, new_state = predict(tokens, state)

        def pick(new, old):
            m = mask.reshape(mask.shape + (1,) * (new.dim() - 1))
            return torch.where(m, new, old)

        return _tree_map(pick, new_pred, pred), _tree_map(pick, new_state, state)

    @staticmethod
    def while_loop(cond, body, carry):
        while cond(carry):
            carry = body(carry)
        return carry

    @staticmethod
    def frame_rounds(t_max, rounds, body, any_expanding, carry):
        for t in range(t_max):
            for r in range(rounds):
                if not any_expanding(t, carry):
                    break
                carry = body(t, r, carry)
        return carry


# ------------------------------------------------------------------------- arguments
def _check_common(fn, encoder_out, encoder_lengths, predict, join):
    check_not_torchscript(fn)
    check_tensor(fn, "encoder_out", encoder_out)
    _v.check_dtype(fn, "encoder_out", encoder_out.dtype, _v.FLOAT_DTYPES, "a floating")
    host = int_array(fn, "encoder_lengths", encoder_lengths)
    _v.check_dtype(fn, "encoder_lengths", host.dtype, _v.INT_DTYPES, "an integer")
    _search.check_model_args(fn, tuple(encoder_out.shape), host.shape, host, predict, join)
    return torch.as_tensor(host.astype("int64"), device=encoder_out.device)


def _width(fn, logits, rows):
    """``(V', dtype)`` of the joiner's logits for ``rows`` rows, checked."""
    tensor = isinstance(logits, torch.Tensor)
    return (_search.check_logits(fn, tuple(logits.shape) if tensor else None, rows),
            logits.dtype)


def _first_call(fn, kind, encoder_out, rows, predict, join, blank, extra, start_token):
    """The model's first calls, as documented: ``predict(start_token for every row, None)``,
    then ``join`` on one row of the first frame for the class count ``V``.

    Returns ``(blank, start, extra, dtype, first)``: `_search.resolve_classes`'s values,
    the logits' dtype and ``first = (predictor_out, state)`` for the search to start from
    (None without a frame).  When the start token depends on ``V`` (a negative ``blank``
    and no ``start_token``), one row of token 0 learns ``V`` first; so does a first call
    that fails, to tell a bad ``blank``/``start_token`` from an error of the model."""
    n = encoder_out.shape[0]
    if n == 0 or encoder_out.shape[1] == 0:
        return _search.resolve_classes(fn, kind, None, blank, extra, start_token) + (None, None)
    start = _search.known_start(fn, blank, start_token)
    first = None
    if start is not None:
        try:
            first = predict(torch.full((rows,), start, dtype=torch.int64,
                                       device=encoder_out.device), None)
        except Exception:
            _search.resolve_classes(fn, kind, _width_from_zero(fn, encoder_out, predict, join)[0],
                                    blank, extra, start_token)
            raise  # (blank and start_token are valid: the model's own error)
        n_out, dtype = _width(fn, join(encoder_out[:1, 0], _take_tree(first[0], slice(0, 1))), 1)
    else:
        n_out, dtype = _width_from_zero(fn, encoder_out, predict, join)
    blank, start, extra = _search.resolve_classes(fn, kind, n_out, blank, extra, start_token)
    if first is None:
        first = predict(torch.full((rows,), start, dtype=torch.int64, device=encoder_out.device),
                        None)
    return blank, start, extra, dtype, first


def _width_from_zero(fn, encoder_out, predict, join):
    """`_width` of the logits for one row from the predictor's output on token 0."""
    out, _ = predict(torch.zeros(1, dtype=torch.int64, device=encoder_out.device), None)
    return _width(fn, join(encoder_out[:1, 0], out), 1)


def _take_tree(tree, rows):
    return _tree_map(lambda a: a[rows], tree)


def _greedy(fn, kind, encoder_out, encoder_lengths, predict, join, blank, extra,
            max_symbols_per_frame, start_token):
    lengths = _check_common(fn, encoder_out, encoder_lengths, predict, join)
    max_sym = _v.check_int_scalar(fn, "max_symbols_per_frame", max_symbols_per_frame, 1)
    extra = _search.check_extra(fn, kind, extra)
    with torch.no_grad():
        blank, start, extra, _, first = _first_call(fn, kind, encoder_out, encoder_out.shape[0],
                                                    predict, join, blank, extra, start_token)
        o = _TorchSearchOps(encoder_out.device)
        return _search.greedy_search(o, kind, encoder_out, lengths, predict, join, blank,
                                     max_sym, extra, start, first)


_PROTOCOL = """
    The model enters as two callables (the protocol every transducer search here takes):

    * ``predict(tokens, state) -> (predictor_out, state)``: ``tokens`` ``(N,)`` int64;
      ``state`` is ``None`` on the first call (the predictor's initial state), then whatever
      ``predict`` returned: any nesting of lists/tuples/dicts of tensors whose first axis is
      the ``N`` rows (or ``None``); ``predictor_out`` likewise (a tensor ``(N, ...)`` or a
      nest).  The first call gets ``start_token`` (default: the blank) for every row;
      only with a negative ``blank`` and no ``start_token`` (the start token's index then
      depends on the class count ``V``) does one call ``predict(tensor([0]), None)`` and
      ``join`` on one row come first, to learn ``V``.
    * ``join(encoder_frames, predictor_out) -> logits``: ``encoder_frames``
      ``(N, ...)``, one frame of ``encoder_out`` per row; ``logits`` ``(N, V)`` scores
      (unnormalised is fine).
"""


def rnnt_greedy_decode(encoder_out: torch.Tensor,
                       encoder_lengths: torch.Tensor | Sequence[int],
                       predict: Predict, join: Join, blank: int = -1, *,
                       max_symbols_per_frame: int = 10,
                       start_token: Optional[int] = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched RNN-T greedy decoding from a predictor and a joiner.

    Per sequence, from frame 0: ``join`` the frame with the predictor's output and take the
    best class; a token is emitted (and fed to ``predict``) and the search stays on the
    frame, the blank moves to the next frame; after ``max_symbols_per_frame`` tokens on one
    frame the search moves on.  All sequences advance together, one batched ``join`` (and at
    most one batched ``predict``, on the rows that emitted) per step; rows whose predictor
    did not advance keep their output and state.  Runs under ``torch.no_grad()``, on
    ``encoder_out``'s device; each step reads one flag on the host (whether any row is
    still decoding).
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first (what ``join`` takes per
        frame: e.g. icefall's joiner-projected ``(N, T, J)``).
      encoder_lengths: ``(N,)`` integer tensor or tuple of ints in ``[0, T]``.
      predict: the predictor step (see above).
      join: the joiner (see above); ``(N, V)`` logits.
      blank: the blank's class index in ``[-V, V)`` (``-1``: the last class, torchaudio's
        convention; icefall uses 0).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank, as torchaudio, icefall
        and NeMo).

    Returns:
      ``(tokens, lengths, frames)``: ``tokens`` ``(N, T * max_symbols_per_frame)`` int64
      padded with ``-1``, ``lengths`` ``(N,)``, ``frames`` (same shape as ``tokens``): the
      frame each token was emitted on (``-1`` past the length).

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> V = 3                                   # classes 0, 1 and the blank 2
        >>> def predict(tokens, state):             # a stateless "predictor": the last token
        ...     return tokens, None
        >>> def join(frame, last):                  # frame f: token f on frame f, then blank
        ...     best = torch.where(last == frame[:, 0].long(), V - 1, frame[:, 0].long())
        ...     return torch.nn.functional.one_hot(best, V).double()
        >>> enc = torch.tensor([[[0.], [1.], [1.]]])  # (N=1, T=3, 1): frames ask for 0, 1, 1
        >>> tokens, lengths, frames = dt.rnnt_greedy_decode(enc, [3], predict, join)
        >>> tokens[0, :lengths[0]].tolist(), frames[0, :lengths[0]].tolist()
        ([0, 1], [0, 1])
    """
    return _greedy("rnnt_greedy_decode", "rnnt", encoder_out, encoder_lengths, predict, join,
                   blank, None, max_symbols_per_frame, start_token)


def tdt_greedy_decode(encoder_out: torch.Tensor,
                      encoder_lengths: torch.Tensor | Sequence[int],
                      predict: Predict, join: Join, blank: int, durations: Sequence[int], *,
                      max_symbols_per_frame: int = 10,
                      start_token: Optional[int] = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched TDT (token-and-duration transducer) greedy decoding.

    ``join`` returns ``V + D`` logits per row, the ``V`` token logits (the blank among them)
    then the ``D = len(durations)`` duration logits, as `tdt_loss` takes them.  Each step
    takes the best token and the best duration (NeMo's ``GreedyTDTInfer``): a token is
    emitted and the search moves ``durations[d]`` frames (0: it stays); the blank moves
    ``durations[d]`` frames, 1 when that is 0; the ``max_symbols_per_frame``-th token on
    one frame moves at least 1 frame too.  A move past the last frame ends the sequence.  Batched as `rnnt_greedy_decode` (rows move independently).
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integer tensor or tuple of ints in ``[0, T]``.
      predict: the predictor step (see above).
      join: the joiner; ``(N, V + D)`` logits.
      blank: the blank's index among the ``V`` token classes, in ``[-V, V)``.
      durations: the ``D`` distinct durations (ints >= 0, one at least positive), in
        the order of the duration logits.
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, frames)`` as `rnnt_greedy_decode`.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # V = 2 (token 0, blank 1), durations [1, 2]
        ...     n = frame.shape[0]                  # token 0 with duration 2, then blank
        ...     tok = torch.where(last == 0, 1, 0)
        ...     return torch.cat([torch.nn.functional.one_hot(tok, 2).double(),
        ...                       torch.tensor([[0., 1.]]).expand(n, 2)], 1)
        >>> enc = torch.zeros(1, 5, 1)              # 5 frames
        >>> tokens, lengths, frames = dt.tdt_greedy_decode(enc, [5], predict, join, 1, [1, 2])
        >>> tokens[0, :lengths[0]].tolist(), frames[0, :lengths[0]].tolist()
        ([0], [0])
    """
    return _greedy("tdt_greedy_decode", "tdt", encoder_out, encoder_lengths, predict, join,
                   blank, durations, max_symbols_per_frame, start_token)


def multiblank_greedy_decode(encoder_out: torch.Tensor,
                             encoder_lengths: torch.Tensor | Sequence[int],
                             predict: Predict, join: Join, blank: int,
                             big_blank_durations: Sequence[int], *,
                             max_symbols_per_frame: int = 10,
                             start_token: Optional[int] = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched multi-blank transducer greedy decoding.

    As `rnnt_greedy_decode`, with `multiblank_rnnt_loss`'s classes: the standard blank at
    ``blank`` moves one frame, big blank ``i`` at ``blank - 1 - i`` moves
    ``big_blank_durations[i]`` frames; every other class is a token (it stays on the frame).
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integer tensor or tuple of ints in ``[0, T]``.
      predict: the predictor step (see above).
      join: the joiner; ``(N, V)`` logits, big blanks included.
      blank: the standard blank's index in ``[-V, V)``.
      big_blank_durations: the big blanks' durations (ints >= 1).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, frames)`` as `rnnt_greedy_decode`.

    Examples:
        >>> import torch
        >>> import duoloss.torch as dt
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # classes: 0, 1 tokens, 2 big blank (2 frames), 3 blank
        ...     want = frame[:, 0].long()             # the token a frame asks for (9: none)
        ...     best = torch.where((want == last) | (want == 9), 2, want)
        ...     return torch.nn.functional.one_hot(best, 4).double()
        >>> enc = torch.tensor([[[0.], [9.], [1.], [9.]]])   # frame 1 is skipped by a big blank
        >>> tokens, lengths, frames = dt.multiblank_greedy_decode(enc, [4], predict, join, 3, [2])
        >>> tokens[0, :lengths[0]].tolist(), frames[0, :lengths[0]].tolist()
        ([0, 1], [0, 2])
    """
    return _greedy("multiblank_greedy_decode", "multiblank", encoder_out, encoder_lengths,
                   predict, join, blank, big_blank_durations, max_symbols_per_frame, start_token)


def _beam(fn, kind, encoder_out, encoder_lengths, predict, join, blank, durations, beam,
          max_symbols_per_frame, start_token):
    lengths = _check_common(fn, encoder_out, encoder_lengths, predict, join)
    beam = _v.check_int_scalar(fn, "beam", beam, 1)
    max_sym = _v.check_int_scalar(fn, "max_symbols_per_frame", max_symbols_per_frame, 1)
    durations = _search.check_extra(fn, kind, durations)
    with torch.no_grad():
        blank, start, durations, dtype, first = _first_call(
            fn, kind, encoder_out, encoder_out.shape[0] * beam, predict, join, blank, durations,
            start_token)
        o = _TorchSearchOps(encoder_out.device)
        like = torch.zeros((), dtype=torch.promote_types(dtype or encoder_out.dtype, torch.float32),
                           device=encoder_out.device)
        return _search.beam_search(o, kind, encoder_out, lengths, predict, join, blank, beam,
                                   max_sym, durations, start, like, first)


_BEAM_DOC = """
    Hypotheses with the same tokens on the same frame are merged by log-add (their
    probabilities summed; the frames of the one already in the beam kept), *before* the
    beam is cut, so that
    with a beam that keeps every hypothesis the scores are exact: each sequence's score is
    the log of the sum of the probabilities of all its paths (moves as described above).
    Scores are sums of ``log_softmax`` of the joiner's logits (no length normalisation;
    divide by the lengths to rank as icefall's ``length_norm``).  NaN logits count as
    probability 0 (a sequence whose every path meets one gets no hypothesis).
"""


def rnnt_beam_search(encoder_out: torch.Tensor,
                     encoder_lengths: torch.Tensor | Sequence[int],
                     predict: Predict, join: Join, blank: int = -1, *, beam: int = 4,
                     start_token: Optional[int] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched RNN-T beam search (icefall's *modified beam search*): n-best with scores and frames.

    Frame-synchronous: on each frame every hypothesis takes exactly one move, a token
    (emitted on that frame) or the blank, both moving to the next frame ("at most one
    symbol per frame"); of the ``beam * V`` extensions of an utterance's ``beam``
    hypotheses the best ``beam`` are kept.  One batched ``join`` and one batched ``predict``
    (on the ``N * beam`` rows) per frame; runs under ``torch.no_grad()`` on
    ``encoder_out``'s device.
    {beam_doc}{protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integer tensor or tuple of ints in ``[0, T]``.
      predict: the predictor step (see above; called on ``N * beam`` rows).
      join: the joiner; ``(N * beam, V)`` logits.
      blank: the blank's class index in ``[-V, V)`` (``-1``: the last class).
      beam: hypotheses kept per utterance (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, scores, frames)``, best first: ``tokens`` ``(N, beam, T)`` int64
      padded with ``-1``, ``lengths`` ``(N, beam)``, ``scores`` ``(N, beam)`` log-probabilities
      (``-inf`` for unused slots, which have length 0), ``frames`` ``(N, beam, T)``: each
      token's frame.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # uniform over V = 2 (token 0, blank 1)
        ...     return torch.zeros(frame.shape[0], 2, dtype=torch.float64)
        >>> enc = torch.zeros(1, 2, 1)              # 2 frames: '', '0' (2 paths), '00'
        >>> tokens, lengths, scores, frames = dt.rnnt_beam_search(enc, [2], predict, join, beam=3)
        >>> lengths[0].tolist(), [round(math.exp(s), 4) for s in scores[0].tolist()]
        ([1, 0, 2], [0.5, 0.25, 0.25])
    """
    return _beam("rnnt_beam_search", "rnnt", encoder_out, encoder_lengths, predict, join, blank,
                 None, beam, 1, start_token)


def tdt_beam_search(encoder_out: torch.Tensor,
                    encoder_lengths: torch.Tensor | Sequence[int],
                    predict: Predict, join: Join, blank: int, durations: Sequence[int], *,
                    beam: int = 4, max_symbols_per_frame: int = 2,
                    start_token: Optional[int] = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched TDT beam search: n-best with scores and frames.

    Frame-synchronous over the TDT lattice of `tdt_loss`: on frame ``t`` each hypothesis
    sitting on ``t`` takes one move, a token with any duration or the blank with a positive
    one (probability: token times duration, from the ``V + D`` logits); a token of duration 0
    keeps it on ``t`` for another round, at most ``max_symbols_per_frame`` tokens per frame
    (the last must move on).  Hypotheses ahead of ``t`` wait; the best ``beam`` of the kept
    and the extended hypotheses survive each round.  A move past the last frame ends the
    sequence.
    {beam_doc}{protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integer tensor or tuple of ints in ``[0, T]``.
      predict: the predictor step (see above; called on ``N * beam`` rows).
      join: the joiner; ``(N * beam, V + D)`` logits.
      blank: the blank's index among the ``V`` token classes, in ``[-V, V)``.
      durations: the ``D`` distinct durations (ints >= 0, one at least positive).
      beam: hypotheses kept per utterance (>= 1).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, scores, frames)`` as `rnnt_beam_search`, with
      ``T * max_symbols_per_frame`` token slots.

    Examples:
        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # V = 2 (token 0, blank 1), durations [1]
        ...     return torch.zeros(frame.shape[0], 3, dtype=torch.float64)
        >>> enc = torch.zeros(1, 1, 1)              # 1 frame: token or blank, 1/2 each
        >>> tokens, lengths, scores, frames = dt.tdt_beam_search(enc, [1], predict, join, 1, [1])
        >>> lengths[0, :2].tolist(), [round(math.exp(s), 4) for s in scores[0, :2].tolist()]
        ([0, 1], [0.5, 0.5])
    """
    return _beam("tdt_beam_search", "tdt", encoder_out, encoder_lengths, predict, join, blank,
                 durations, beam, max_symbols_per_frame, start_token)


for _f in (rnnt_greedy_decode, tdt_greedy_decode, multiblank_greedy_decode, rnnt_beam_search,
           tdt_beam_search):
    if _f.__doc__:  # (None under python -OO)
        _f.__doc__ = _f.__doc__.replace("{protocol}", _PROTOCOL).replace("{beam_doc}", _BEAM_DOC)
