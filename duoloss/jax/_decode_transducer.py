"""Transducer decoding (RNN-T, TDT, multi-blank) from the user's predictor and joiner, in jnp ops.

The searches are written once for both frameworks in `duoloss._xp.transducer_decode`;
here they run on `_JaxSearchOps`: ``lax.while_loop``/``fori_loop`` loops, every step plain
XLA, so each function works under ``jax.jit`` and on any backend.  Outside a jit, the
model is staged on every call (`_stage_model`: one step of ``predict`` and ``join`` traced
to jaxprs whose closed-over arrays are hoisted as arguments) and the compiled search is
looked up by the staged program (`_run`), never by the callables: the weights are this
call's, and nothing of the model outlives the call.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core import _validate as _v
from duoloss._xp import transducer_decode as _search

from ._args import as_array, as_int_array, index_dtype, is_concrete

__all__ = ["multiblank_greedy_decode", "rnnt_beam_search", "rnnt_greedy_decode",
           "tdt_beam_search", "tdt_greedy_decode"]

#: ``predict(tokens (N,) int, state or None) -> (predictor_out (N, ...), state)``
Predict = Callable[[jax.Array, Any], tuple[Any, Any]]
#: ``join(encoder_frames (N, ...), predictor_out (N, ...)) -> logits (N, V[+D])``
Join = Callable[[jax.Array, Any], jax.Array]

_NEG_INF = float("-inf")


class _JaxSearchOps:
    """The array vocabulary of `duoloss._xp.transducer_decode` in JAX."""

    def __init__(self):
        self.idx = index_dtype()

    def full(self, shape, value, kind):
        return jnp.full(shape, value, self.idx if kind == "int" else bool)

    @staticmethod
    def zeros_float(shape, like):
        return jnp.zeros(shape, like.dtype)

    def const_int(self, values):
        return jnp.asarray(np.asarray(list(values), np.int64), self.idx)

    def arange(self, n):
        return jnp.arange(n, dtype=self.idx)

    where = staticmethod(jnp.where)
    minimum = staticmethod(jnp.minimum)
    maximum = staticmethod(jnp.maximum)
    isnan = staticmethod(jnp.isnan)
    logaddexp = staticmethod(jnp.logaddexp)

    def argmax(self, x):
        return jnp.argmax(x, -1).astype(self.idx)

    @staticmethod
    def log_softmax(x):
        return jax.nn.log_softmax(x, -1)

    def astype_int(self, x):
        return x.astype(self.idx)

    @staticmethod
    def any(x):
        return jnp.any(x)

    @staticmethod
    def any_(x, axis):
        return jnp.any(x, axis)

    @staticmethod
    def all_(x, axis):
        return jnp.all(x, axis)

    @staticmethod
    def reshape(x, shape):
        return jnp.reshape(x, shape)

    @staticmethod
    def concat(xs, axis):
        return jnp.concatenate(xs, axis)

    @staticmethod
    def gather(x, idx, axis):
        return jnp.take_along_axis(x, idx, axis)

    @staticmethod
    def lse(x, axes):
        return jax.nn.logsumexp(x, axis=axes)

    @staticmethod
    def topk(x, k):
        """The ``k`` largest along the last axis, best first, ties to the lower index."""
        return jax.lax.top_k(x, k)

    @staticmethod
    def frame_rows(enc, rows, frames):
        return enc[rows, frames]

    @staticmethod
    def set_rows(buf, slot, val, mask):
        rows = jnp.arange(buf.shape[0])
        return buf.at[rows, slot].set(jnp.where(mask, val, buf[rows, slot]))

    @staticmethod
    def kill(x, idx, mask):
        rows = jnp.arange(x.shape[0])[:, None]
        return x.at[rows, jnp.where(mask, idx, x.shape[1])].set(_NEG_INF, mode="drop")

    @staticmethod
    def take_tree(tree, rows):
        return jax.tree_util.tree_map(lambda a: a[rows], tree)

    @staticmethod
    def predict_where(predict, mask, tokens, pred, state):
        new_pred, new_state = predict(tokens, state)

        def pick(new, old):
            m = mask.reshape(mask.shape + (1,) * (new.ndim - 1))
            return jnp.where(m, new, old).astype(old.dtype)

        return (jax.tree_util.tree_map(pick, new_pred, pred),
                jax.tree_util.tree_map(pick, new_state, state))

    @staticmethod
    def while_loop(cond, body, carry):
        return jax.lax.while_loop(cond, body, carry)

    def frame_rounds(self, t_max, rounds, body, any_expanding, carry):
        idx = self.idx

        def frame(t, c):
            def cond(rc):
                r, c = rc
                return (r < rounds) & any_expanding(t, c)

            def step(rc):
                r, c = rc
                return r + 1, body(t, r, c)

            return jax.lax.while_loop(cond, step, (jnp.asarray(0, idx), c))[1]

        return jax.lax.fori_loop(jnp.asarray(0, idx), jnp.asarray(t_max, idx), frame, carry)


# ------------------------------------------------------------------------- arguments
def _check_common(fn, encoder_out, encoder_lengths, predict, join):
    encoder_out = as_array(fn, "encoder_out", encoder_out)
    _v.check_dtype(fn, "encoder_out", encoder_out.dtype, _v.FLOAT_DTYPES, "a floating")
    il = as_int_array(fn, "encoder_lengths", encoder_lengths)
    _v.check_dtype(fn, "encoder_lengths", il.dtype, _v.INT_DTYPES, "an integer")
    _search.check_model_args(fn, tuple(encoder_out.shape), tuple(il.shape),
                             np.asarray(il) if is_concrete(il) else None, predict, join)
    return encoder_out, jnp.clip(il.astype(index_dtype()), 0, encoder_out.shape[1])


# ------------------------------------------------------------------------- the model, staged
class _Staged(NamedTuple):
    """One of the model's calls as a jaxpr whose closed-over arrays are its first inputs."""

    jaxpr: Any        # jax.extend.core.Jaxpr (no constants inside: they are ``consts``)
    in_tree: Any
    out_tree: Any

    def bind(self, consts):
        """The call as a function of its arguments, with ``consts`` for the closed-over arrays."""
        def call(*args):
            flat, tree = jax.tree.flatten(args)
            if tree != self.in_tree:
                raise TypeError(f"predict/join called with arguments of structure {tree}, "
                                f"traced with {self.in_tree}")
            flat = [a if a.dtype == v.aval.dtype else a.astype(v.aval.dtype)  # (int32 top_k picks)
                    for a, v in zip(flat, self.jaxpr.invars)]
            return jax.tree.unflatten(self.out_tree, jax.core.eval_jaxpr(self.jaxpr, consts, *flat))
        return call


def _stage(f, *specs):
    """``(staged, consts, output shapes)`` of ``f(*specs)``, traced once (nothing runs): the
    arrays ``f`` reads from its enclosing scope come out as ``consts``, current values."""
    # (a new function each time: jax's trace cache, keyed by the function, would hand back
    # the constants of an earlier trace)
    closed, shapes = jax.make_jaxpr(lambda *a: f(*a), return_shape=True)(*specs)
    staged = _Staged(closed.jaxpr, jax.tree.structure(specs), jax.tree.structure(shapes))
    return staged, list(closed.consts), shapes


class _Model(NamedTuple):
    """``predict``'s first call (state None), its later calls, and ``join``, staged for
    ``rows`` rows: the compiled search takes the three constant lists as arguments."""

    first: _Staged
    step: _Staged
    join: _Staged
    key: tuple        # the three jaxprs' text and structures (what the compiled search bakes in)

    def callables(self, consts):
        first, step, join = (s.bind(c) for s, c in zip(self, consts))

        def predict(tokens, state):
            return first(tokens) if state is None else step(tokens, state)

        return predict, join


def _stage_model(fn, predict, join, encoder_out, rows):
    """The model staged for ``rows`` rows, its constants, and the joiner's ``(V', dtype)``."""
    tok = jax.ShapeDtypeStruct((rows,), index_dtype())
    frame = jax.ShapeDtypeStruct((rows,) + tuple(encoder_out.shape[2:]), encoder_out.dtype)
    first, c_first, (pred, state) = _stage(lambda t: predict(t, None), tok)
    step, c_step, _ = (first, c_first, None) if state is None else _stage(predict, tok, state)
    joint, c_join, out = _stage(join, frame, pred)
    n_out = _search.check_logits(fn, tuple(out.shape) if hasattr(out, "shape") else None, rows)
    key = tuple((str(s.jaxpr), s.in_tree, s.out_tree) for s in (first, step, joint))
    return _Model(first, step, joint, key), (c_first, c_step, c_join), n_out, out.dtype


def _greedy(fn, kind, encoder_out, encoder_lengths, predict, join, blank, extra,
            max_symbols_per_frame, start_token):
    encoder_out, lengths = _check_common(fn, encoder_out, encoder_lengths, predict, join)
    max_sym = _v.check_int_scalar(fn, "max_symbols_per_frame", max_symbols_per_frame, 1)
    extra = _search.check_extra(fn, kind, extra)
    staged = _staged_or_none(fn, predict, join, encoder_out, encoder_out.shape[0])
    blank, start, extra = _search.resolve_classes(fn, kind, staged and staged[2], blank, extra,
                                                  start_token)
    return _run(_greedy_run, staged, encoder_out, lengths, predict, join, kind=kind, blank=blank,
                max_sym=max_sym, extra=tuple(extra), start=start)


def _beam(fn, kind, encoder_out, encoder_lengths, predict, join, blank, durations, beam,
          max_symbols_per_frame, start_token):
    encoder_out, lengths = _check_common(fn, encoder_out, encoder_lengths, predict, join)
    beam = _v.check_int_scalar(fn, "beam", beam, 1)
    max_sym = _v.check_int_scalar(fn, "max_symbols_per_frame", max_symbols_per_frame, 1)
    durations = _search.check_extra(fn, kind, durations)
    staged = _staged_or_none(fn, predict, join, encoder_out, encoder_out.shape[0] * beam)
    blank, start, durations = _search.resolve_classes(fn, kind, staged and staged[2], blank,
                                                      durations, start_token)
    dtype = staged[3] if staged else encoder_out.dtype
    score_dtype = np.dtype(jnp.promote_types(dtype, jnp.float32)).name
    return _run(_beam_run, staged, encoder_out, lengths, predict, join, kind=kind, blank=blank,
                beam=beam, max_sym=max_sym, durations=tuple(durations), start=start,
                score_dtype=score_dtype)


def _staged_or_none(fn, predict, join, encoder_out, rows):
    """`_stage_model`, or None when there is no frame to decode (nothing to learn V from)."""
    if encoder_out.shape[0] == 0 or encoder_out.shape[1] == 0:
        return None
    return _stage_model(fn, predict, join, encoder_out, rows)


def _greedy_run(encoder_out, lengths, predict, join, *, kind, blank, max_sym, extra, start):
    return _search.greedy_search(_JaxSearchOps(), kind, encoder_out, lengths, predict, join,
                                 blank, max_sym, list(extra), start)


def _beam_run(encoder_out, lengths, predict, join, *, kind, blank, beam, max_sym, durations,
              start, score_dtype):
    like = jnp.zeros((), score_dtype)
    return _search.beam_search(_JaxSearchOps(), kind, encoder_out, lengths, predict, join,
                               blank, beam, max_sym, list(durations), start, like)


#: Compiled searches kept, most recent first: each holds its model's jaxprs (no arrays: the
#: model's constants are arguments), so what it keeps alive is bounded by this count.
_CACHE_SIZE = 16
_COMPILED: "OrderedDict[tuple, Callable]" = OrderedDict()
_COMPILED_LOCK = threading.Lock()


def _run(run, staged, encoder_out, lengths, predict, join, **static):
    """``run`` compiled once per model structure and shapes, the model's arrays as arguments.

    The model's callables are staged on every call (`_stage_model`), so the arrays they
    read from their enclosing scope are this call's, never a copy from an earlier call;
    the compiled search is shared by every call whose staged model prints the same (the
    same callables or rebuilt ones) and holds no reference to the callables or their arrays.
    Without a frame there is nothing to compile: the search runs as it is."""
    if staged is None:
        return run(encoder_out, lengths, predict, join, **static)
    model, consts = staged[0], staged[1]
    key = (run, tuple(sorted(static.items())), model.key, jax.config.jax_enable_x64,
           jax.typeof(encoder_out), jax.typeof(lengths))
    with _COMPILED_LOCK:
        fn = _COMPILED.get(key)
        if fn is not None:
            _COMPILED.move_to_end(key)
    if fn is None:
        def compiled(encoder_out, lengths, consts):
            return run(encoder_out, lengths, *model.callables(consts), **static)

        fn = jax.jit(compiled)
        with _COMPILED_LOCK:
            fn = _COMPILED.setdefault(key, fn)
            _COMPILED.move_to_end(key)
            while len(_COMPILED) > _CACHE_SIZE:
                _COMPILED.popitem(last=False)
    return fn(encoder_out, lengths, consts)


_PROTOCOL = """
    The model enters as two callables, as in the torch twin:
    ``predict(tokens (N,) int, state) -> (predictor_out, state)`` (``state`` is ``None`` on
    the first call, then any pytree of arrays with the ``N`` rows first, kept with the same
    shapes and dtypes) and ``join(encoder_frames (N, ...), predictor_out) -> (N, V[+D])``
    logits.  Each call traces one step of each (nothing runs) and passes the arrays they
    read from their enclosing scope (the model's weights) to the compiled ``lax`` loops as
    arguments: a model updated between calls decodes with its new weights, and the
    compiled search (shared by every model that traces to the same program) keeps no
    reference to the callables or their arrays.  Inside your own ``jax.jit`` make the
    weights its argument: ``jax.jit(lambda params, e, l: dj.rnnt_greedy_decode(e, l,
    *make_model(params)))``.
"""


def rnnt_greedy_decode(encoder_out: ArrayLike, encoder_lengths: ArrayLike | Sequence[int],
                       predict: Predict, join: Join, blank: int = -1, *,
                       max_symbols_per_frame: int = 10,
                       start_token: Optional[int] = None
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Batched RNN-T greedy decoding: same arguments and results as
    `duoloss.torch.rnnt_greedy_decode`, in one ``lax.while_loop``.
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integers in ``[0, T]`` (checked when concrete, clamped
        under ``jit``).
      predict: the predictor step.
      join: the joiner; ``(N, V)`` logits.
      blank: the blank's class index in ``[-V, V)`` (``-1``: the last class).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens (N, T * max_symbols_per_frame), lengths (N,), frames)``, ``-1`` padded;
      int64 with ``jax_enable_x64``, else int32.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> V = 3                                   # classes 0, 1 and the blank 2
        >>> def predict(tokens, state):             # a stateless "predictor": the last token
        ...     return tokens, None
        >>> def join(frame, last):                  # frame f: token f on frame f, then blank
        ...     want = frame[:, 0].astype(last.dtype)
        ...     return jax.nn.one_hot(jnp.where(last == want, V - 1, want), V)
        >>> enc = jnp.array([[[0.], [1.], [1.]]])    # (N=1, T=3, 1): frames ask for 0, 1, 1
        >>> tokens, lengths, frames = dj.rnnt_greedy_decode(enc, [3], predict, join)
        >>> tokens[0, :int(lengths[0])].tolist(), frames[0, :int(lengths[0])].tolist()
        ([0, 1], [0, 1])
    """
    return _greedy("rnnt_greedy_decode", "rnnt", encoder_out, encoder_lengths, predict, join,
                   blank, None, max_symbols_per_frame, start_token)


def tdt_greedy_decode(encoder_out: ArrayLike, encoder_lengths: ArrayLike | Sequence[int],
                      predict: Predict, join: Join, blank: int, durations: Sequence[int], *,
                      max_symbols_per_frame: int = 10,
                      start_token: Optional[int] = None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Batched TDT greedy decoding: same arguments and results as
    `duoloss.torch.tdt_greedy_decode` (``join`` returns ``V + D`` logits: tokens, then
    durations), in one ``lax.while_loop``.
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integers in ``[0, T]``.
      predict: the predictor step.
      join: the joiner; ``(N, V + D)`` logits.
      blank: the blank's index among the ``V`` token classes, in ``[-V, V)``.
      durations: the ``D`` distinct durations (ints >= 0, one at least positive).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, frames)`` as `rnnt_greedy_decode`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # V = 2 (token 0, blank 1), durations [1, 2]
        ...     n = frame.shape[0]                  # token 0 with duration 2, then blank
        ...     tok = jax.nn.one_hot(jnp.where(last == 0, 1, 0), 2)
        ...     return jnp.concatenate([tok, jnp.tile(jnp.array([[0., 1.]]), (n, 1))], 1)
        >>> enc = jnp.zeros((1, 5, 1))              # 5 frames
        >>> tokens, lengths, frames = dj.tdt_greedy_decode(enc, [5], predict, join, 1, [1, 2])
        >>> tokens[0, :int(lengths[0])].tolist(), frames[0, :int(lengths[0])].tolist()
        ([0], [0])
    """
    return _greedy("tdt_greedy_decode", "tdt", encoder_out, encoder_lengths, predict, join,
                   blank, durations, max_symbols_per_frame, start_token)


def multiblank_greedy_decode(encoder_out: ArrayLike, encoder_lengths: ArrayLike | Sequence[int],
                             predict: Predict, join: Join, blank: int,
                             big_blank_durations: Sequence[int], *,
                             max_symbols_per_frame: int = 10,
                             start_token: Optional[int] = None
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Batched multi-blank transducer greedy decoding: same arguments and results as
    `duoloss.torch.multiblank_greedy_decode` (big blank ``i`` at ``blank - 1 - i`` moves
    ``big_blank_durations[i]`` frames), in one ``lax.while_loop``.
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integers in ``[0, T]``.
      predict: the predictor step.
      join: the joiner; ``(N, V)`` logits, big blanks included.
      blank: the standard blank's index in ``[-V, V)``.
      big_blank_durations: the big blanks' durations (ints >= 1).
      max_symbols_per_frame: tokens allowed on one frame (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens, lengths, frames)`` as `rnnt_greedy_decode`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # classes: 0, 1 tokens, 2 big blank (2 frames), 3 blank
        ...     want = frame[:, 0].astype(last.dtype)  # the token a frame asks for (9: none)
        ...     return jax.nn.one_hot(jnp.where((want == last) | (want == 9), 2, want), 4)
        >>> enc = jnp.array([[[0.], [9.], [1.], [9.]]])   # frame 1 is skipped by a big blank
        >>> tokens, lengths, frames = dj.multiblank_greedy_decode(enc, [4], predict, join, 3, [2])
        >>> tokens[0, :int(lengths[0])].tolist(), frames[0, :int(lengths[0])].tolist()
        ([0, 1], [0, 2])
    """
    return _greedy("multiblank_greedy_decode", "multiblank", encoder_out, encoder_lengths,
                   predict, join, blank, big_blank_durations, max_symbols_per_frame, start_token)


def rnnt_beam_search(encoder_out: ArrayLike, encoder_lengths: ArrayLike | Sequence[int],
                     predict: Predict, join: Join, blank: int = -1, *, beam: int = 4,
                     start_token: Optional[int] = None
                     ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Batched RNN-T modified beam search (one symbol per frame, ``beam`` hypotheses per
    utterance, identical token sequences merged by log-add before the beam is cut): same
    arguments and results as `duoloss.torch.rnnt_beam_search`, in ``lax`` loops.
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integers in ``[0, T]``.
      predict: the predictor step (called on ``N * beam`` rows).
      join: the joiner; ``(N * beam, V)`` logits.
      blank: the blank's class index in ``[-V, V)`` (``-1``: the last class).
      beam: hypotheses kept per utterance (>= 1).
      start_token: the predictor's first input (default: the blank).

    Returns:
      ``(tokens (N, beam, T), lengths (N, beam), scores (N, beam), frames (N, beam, T))``,
      best first; unused slots have score ``-inf`` and length 0.

    Examples:
        >>> import math, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # uniform over V = 2 (token 0, blank 1)
        ...     return jnp.zeros((frame.shape[0], 2))
        >>> enc = jnp.zeros((1, 2, 1))              # 2 frames: '', '0' (2 paths), '00'
        >>> tokens, lengths, scores, frames = dj.rnnt_beam_search(enc, [2], predict, join, beam=3)
        >>> lengths[0].tolist(), [round(math.exp(s), 4) for s in scores[0].tolist()]
        ([1, 0, 2], [0.5, 0.25, 0.25])
    """
    return _beam("rnnt_beam_search", "rnnt", encoder_out, encoder_lengths, predict, join, blank,
                 None, beam, 1, start_token)


def tdt_beam_search(encoder_out: ArrayLike, encoder_lengths: ArrayLike | Sequence[int],
                    predict: Predict, join: Join, blank: int, durations: Sequence[int], *,
                    beam: int = 4, max_symbols_per_frame: int = 2,
                    start_token: Optional[int] = None
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Batched TDT beam search over `tdt_loss`'s lattice: same arguments and results as
    `duoloss.torch.tdt_beam_search`, in ``lax`` loops.
    {protocol}
    Args:
      encoder_out: ``(N, T, ...)`` encoder output, batch first.
      encoder_lengths: ``(N,)`` integers in ``[0, T]``.
      predict: the predictor step (called on ``N * beam`` rows).
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
        >>> import math, jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> def predict(tokens, state):
        ...     return tokens, None
        >>> def join(frame, last):                  # V = 2 (token 0, blank 1), durations [1]
        ...     return jnp.zeros((frame.shape[0], 3))
        >>> enc = jnp.zeros((1, 1, 1))              # 1 frame: token or blank, 1/2 each
        >>> tokens, lengths, scores, frames = dj.tdt_beam_search(enc, [1], predict, join, 1, [1])
        >>> lengths[0, :2].tolist(), [round(math.exp(s), 4) for s in scores[0, :2].tolist()]
        ([0, 1], [0.5, 0.5])
    """
    return _beam("tdt_beam_search", "tdt", encoder_out, encoder_lengths, predict, join, blank,
                 durations, beam, max_symbols_per_frame, start_token)


for _f in (rnnt_greedy_decode, tdt_greedy_decode, multiblank_greedy_decode, rnnt_beam_search,
           tdt_beam_search):
    if _f.__doc__:  # (None under python -OO)
        _f.__doc__ = _f.__doc__.replace("{protocol}", _PROTOCOL)
