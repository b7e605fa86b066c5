"""Transducer greedy and beam searches written once for torch and JAX (private).

The searches of `duoloss.torch._decode_transducer` and `duoloss.jax._decode_transducer`
run this code with an ``o`` namespace of array operations from their framework
(``TorchSearchOps``, ``JaxSearchOps``): the user's ``predict``/``join`` are called
batched, every step is a handful of tensor operations on the encoder's device, and the
loops are Python loops (torch) or ``lax`` loops (JAX).  Nothing here validates: the
frontends pass checked arguments.  Importing this module imports neither framework.

The moves of a hypothesis at frame ``t`` (one ``join`` call gives them all):

* RNN-T (greedy): a token stays on ``t``, the blank moves to ``t + 1``; the
  ``max_symbols_per_frame``-th token on a frame also moves to ``t + 1``.
* RNN-T (modified beam search): every move, token or blank, moves to ``t + 1``.
* multi-blank: labels stay, the blank moves 1 frame, big blank ``i`` (class
  ``blank - 1 - i``) ``big_blank_durations[i]`` frames.
* TDT: the first ``V`` logits score the token (blank included), the last ``D`` the
  duration; a token moves by its duration (0 allowed), the blank by a positive one
  (greedy, as NeMo: a blank of best duration 0 moves 1 frame); a hypothesis that has
  emitted ``max_symbols_per_frame - 1`` tokens on ``t`` must leave it (beam: only positive
  durations; greedy: duration 0 becomes 1).

A move landing past a sequence's last frame ends it (its frame becomes ``T_b``).
"""
from __future__ import annotations

from duoloss.core import _validate as _v

__all__ = ["beam_search", "check_extra", "check_ints", "check_logits", "check_model_args",
           "greedy_search",
           "multiblank_moves", "resolve_blank", "resolve_classes"]

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- arguments
def check_ints(fn, arg, values, lo, *, distinct=True, positive_one=False):
    """A non-empty list of ints ``>= lo`` (``durations``, ``big_blank_durations``), checked."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in values) or not values:
        raise TypeError(f"{fn}: argument '{arg}' must be a non-empty list of ints, got {values!r}")
    if any(d < lo for d in values):
        raise ValueError(f"{fn}: argument '{arg}' must hold ints >= {lo}, got {list(values)}")
    if distinct and len(set(values)) != len(values):
        raise ValueError(f"{fn}: argument '{arg}' must hold distinct values, got {list(values)}")
    if positive_one and not any(d > 0 for d in values):
        raise ValueError(f"{fn}: argument '{arg}' must hold a positive duration, got {list(values)}")
    return [int(d) for d in values]


def check_model_args(fn, enc_shape, lengths_shape, lengths, predict, join):
    """The framework-free checks of a search's arguments: ``encoder_out`` ``(N, T, ...)``,
    ``encoder_lengths`` ``(N,)`` in ``[0, T]`` (``lengths``: its values on the host, or None
    when they are not known yet), ``predict`` and ``join`` callable."""
    if len(enc_shape) < 2:
        raise ValueError(f"{fn}: argument 'encoder_out' must be (N, T, ...), "
                         f"got shape {_v.shape_str(enc_shape)}")
    n, t_max = enc_shape[0], enc_shape[1]
    if tuple(lengths_shape) != (n,):
        raise ValueError(f"{fn}: argument 'encoder_lengths' must be shape ({n},), "
                         f"got shape {_v.shape_str(tuple(lengths_shape))}")
    if lengths is not None:
        _v.check_lengths(fn, "encoder_lengths", lengths, t_max, "the number of frames T")
    for name, f in (("predict", predict), ("join", join)):
        if not callable(f):
            raise TypeError(f"{fn}: argument '{name}' must be callable, got {type(f).__name__}")


def check_extra(fn, kind, extra):
    """TDT's ``durations`` or multi-blank's ``big_blank_durations``, checked before the
    model runs (``[]`` for RNN-T)."""
    if kind == "tdt":
        return check_ints(fn, "durations", extra, 0, positive_one=True)
    if kind == "multiblank":
        return check_ints(fn, "big_blank_durations", extra, 1, distinct=False)
    return []


def resolve_classes(fn, kind, n_out, blank, extra, start_token):
    """``(blank, start, extra)`` once the joiner's width ``n_out`` is known (None: no frame):
    the blank and the start token as indices in ``[0, V)``, and for multi-blank ``extra``
    turned into each class's move (`multiblank_moves`)."""
    n_cls = n_out
    if kind == "tdt" and n_out is not None:
        if n_out <= len(extra):
            raise ValueError(f"{fn}: 'join' must return V + D logits with V > 0 for "
                             f"D = {len(extra)} durations, got {n_out}")
        n_cls = n_out - len(extra)
    blank, start = resolve_blank(fn, blank, start_token, n_cls)
    if kind == "multiblank":
        extra = multiblank_moves(fn, extra, blank, n_cls)
    return blank, start, list(extra)


def check_logits(fn, shape, rows):
    """The joiner's output for ``rows`` rows must be ``(rows, V)`` (``shape``: its shape,
    or None for something that is not an array); returns ``V``."""
    if shape is not None and len(shape) == 2 and shape[0] == rows:
        return int(shape[1])
    if shape is None:
        got = "no array"
    elif len(shape) and shape[0] == rows:  # (the row count as N: the same for any N)
        got = "(N" + "".join(f", {d}" for d in shape[1:]) + ")"
    else:
        got = f"{_v.shape_str(tuple(shape))} for N = {rows}"
    raise ValueError(f"{fn}: 'join' must return (N, V) logits for N rows, got {got}")


def known_start(fn, blank, start_token):
    """The predictor's first token when it is known before the class count ``V`` (a given
    ``start_token``, or a non-negative ``blank``), else None (also for a negative
    ``start_token``: refused once ``V`` is known, with the range); types checked."""
    _v.check_int_type(fn, "blank", blank)
    if start_token is not None:
        start = _v.check_int_type(fn, "start_token", start_token)
        return start if start >= 0 else None
    return int(blank) if blank >= 0 else None


def resolve_blank(fn, blank, start_token, n_cls):
    """``(blank, start)`` as indices in ``[0, V)`` (``n_cls = V``; None: nothing to decode)."""
    if n_cls is None:
        _v.check_int_type(fn, "blank", blank)
        return 0, 0
    blank = _v.check_int_scalar(fn, "blank", blank, -n_cls, n_cls) % n_cls
    start = blank if start_token is None else _v.check_int_scalar(fn, "start_token", start_token,
                                                                  0, n_cls)
    return blank, start


def multiblank_moves(fn, big_blank_durations, blank, n_cls):
    """The frames each of the ``n_cls`` classes moves (0: a token), checked."""
    big = check_ints(fn, "big_blank_durations", big_blank_durations, 1, distinct=False)
    if n_cls is not None and blank - len(big) < 0:
        raise ValueError(f"{fn}: argument 'big_blank_durations' must leave the big blanks "
                         f"at indices >= 0 (blank - {len(big)} >= 0), got blank = {blank}")
    moves = [0] * (n_cls or 0)
    if n_cls:
        moves[blank] = 1
        for i, d in enumerate(big):
            moves[blank - 1 - i] = d
    return moves


# ----------------------------------------------------------------------------- greedy
def _decide(o, kind, logits, sym, blank, n_tok, max_sym, durations):
    """``(token, emit, advance)`` of one greedy step from ``(N, V[+D])`` logits."""
    if kind == "tdt":
        # NeMo's GreedyTDTInfer: the best token and the best duration; a duration of 0
        # becomes 1 for a blank, and for the max_sym-th token on a frame
        tok = o.argmax(logits[:, :n_tok])
        emit = tok != blank
        durs = o.const_int(durations)                                   # (D,)
        adv = durs[o.argmax(logits[:, n_tok:])]
        must_leave = (~emit) | (sym + 1 >= max_sym)                       # (N,)
        return tok, emit, o.where(must_leave & (adv == 0), 1, adv)
    tok = o.argmax(logits)
    if kind == "rnnt":
        emit = tok != blank
        adv = o.where(emit & (sym + 1 < max_sym), 0, 1)
        return tok, emit, adv
    # multi-blank: durations is the (V,) move of each class, 0 for labels
    moves = o.const_int(durations)
    step = moves[tok]
    emit = step == 0
    adv = o.where(emit, o.where(sym + 1 < max_sym, 0, 1), step)
    return tok, emit, adv


def greedy_search(o, kind, encoder_out, lengths, predict, join, blank, max_sym, durations,
                  start, first=None):
    """Batched greedy decoding.  ``encoder_out`` ``(N, T, ...)``, ``lengths`` ``(N,)``
    (int, in ``[0, T]``), ``blank`` a non-negative class index, ``durations``: TDT's
    durations, or multi-blank's per-class moves; ``start`` the predictor's first token.
    ``first``: the result of ``predict`` on ``start`` for the ``N`` rows, when the caller
    has it already.
    Returns ``(tokens (N, T * max_sym), lengths (N,), frames (N, T * max_sym))``."""
    n, t_max = encoder_out.shape[0], encoder_out.shape[1]
    cap = t_max * max_sym
    n_tok = None
    pred, state = first or predict(o.full((n,), start, "int"), None)
    carry = dict(t=o.full((n,), 0, "int"), u=o.full((n,), 0, "int"), sym=o.full((n,), 0, "int"),
                 tokens=o.full((n, cap), -1, "int"), frames=o.full((n, cap), -1, "int"),
                 pred=pred, state=state)
    if kind == "tdt":
        n_tok = -len(durations)  # logits[:, :n_tok] are the tokens

    def cond(c):
        return o.any(c["t"] < lengths)

    def body(c):
        t, u, sym = c["t"], c["u"], c["sym"]
        active = t < lengths
        enc = o.frame_rows(encoder_out, o.arange(n), o.minimum(t, t_max - 1))
        logits = join(enc, c["pred"])
        tok, emit, adv = _decide(o, kind, logits, sym, blank, n_tok, max_sym, durations)
        emit = emit & active
        adv = o.where(active, adv, 0)
        slot = o.minimum(u, cap - 1)
        tokens = o.set_rows(c["tokens"], slot, tok, emit)
        frames = o.set_rows(c["frames"], slot, t, emit)
        pred, state = o.predict_where(predict, emit, o.where(emit, tok, start), c["pred"],
                                      c["state"])
        return dict(t=t + adv, u=u + o.astype_int(emit),
                    sym=o.where(adv > 0, 0, sym + o.astype_int(emit)),
                    tokens=tokens, frames=frames, pred=pred, state=state)

    if t_max > 0:
        carry = o.while_loop(cond, body, carry)
    return carry["tokens"], carry["u"], carry["frames"]


# ----------------------------------------------------------------------------- beam
def _seq_relations(o, tokens, lens, valid, b, h):
    """Per utterance, over its ``h`` slots: ``eq[b, q, q2]`` (same token sequence) and
    ``pre[b, q, p]`` (``seq(q) == seq(p) + [last(q)]``), and ``last[b, q]``."""
    cap = tokens.shape[-1]
    tk = o.reshape(tokens, (b, h, cap))
    ln = o.reshape(lens, (b, h))
    vd = o.reshape(valid, (b, h))
    pos = o.arange(cap)
    last = o.gather(tk, o.maximum(ln - 1, 0)[..., None], 2)[..., 0]
    last = o.where(ln > 0, last, -1)
    trunc = o.where(pos[None, None, :] == (ln - 1)[..., None], -1, tk)      # seq(q) minus its last
    both = vd[:, :, None] & vd[:, None, :]
    eq = both & o.all_(tk[:, :, None, :] == tk[:, None, :, :], -1)
    pre = both & (ln[:, :, None] == ln[:, None, :] + 1) & o.all_(
        trunc[:, :, None, :] == tk[:, None, :, :], -1)
    return eq, pre, last


def _first_true(o, mask):
    """``(index of the first True along the last axis, whether there is one)``."""
    return o.argmax(o.astype_int(mask)), o.any_(mask, -1)


def beam_search(o, kind, encoder_out, lengths, predict, join, blank, beam, max_sym,
                durations, start, float_like, first=None):
    """Batched frame-synchronous beam search (icefall's modified beam search for RNN-T:
    one move per frame; TDT: the moves above, up to ``max_sym`` rounds per frame).
    Hypotheses with the same tokens on the same frame are merged by log-add.  Returns
    ``(tokens (N, beam, L), lengths (N, beam), scores (N, beam), frames (N, beam, L))``,
    best first; unused slots have score ``-inf``, length 0 and ``-1`` tokens.  ``first``:
    the result of ``predict`` on ``start`` for the ``N * beam`` rows, when the caller has it."""
    b, t_max = encoder_out.shape[0], encoder_out.shape[1]
    h = beam
    bh = b * h
    if kind == "tdt":
        durs_list = list(durations)
        rounds = max_sym
        cap = t_max * max_sym
    else:
        durs_list = [1]
        rounds = 1
        cap = t_max
    nd = len(durs_list)
    durs = o.const_int(durs_list)                                        # (D,)
    utt = o.arange(bh) // h                                              # row -> utterance
    len_row = lengths[utt]
    pred, state = first or predict(o.full((bh,), start, "int"), None)
    first = (o.arange(bh) % h) == 0
    carry = dict(score=o.where(first, o.zeros_float((bh,), float_like), NEG_INF),
                 th=o.full((bh,), 0, "int"), ln=o.full((bh,), 0, "int"),
                 tokens=o.full((bh, cap), -1, "int"), frames=o.full((bh, cap), -1, "int"),
                 pred=pred, state=state)
    if t_max == 0:
        return _finish(o, carry, b, h)

    def round_body(t, r, c):
        score, th, ln, tokens = c["score"], c["th"], c["ln"], c["tokens"]
        valid = score > NEG_INF
        x = valid & (th == t) & (t < len_row)                           # expanding slots
        enc = o.frame_rows(encoder_out, utt, o.minimum(o.full((bh,), 0, "int") + t, t_max - 1))
        logits = join(enc, c["pred"])
        if kind == "tdt":
            lp = o.log_softmax(logits[:, :-nd])
            ld = o.log_softmax(logits[:, -nd:])
        else:
            lp = o.log_softmax(logits)
            ld = o.zeros_float((bh, 1), lp)
        lp = o.where(o.isnan(lp), NEG_INF, lp)
        ld = o.where(o.isnan(ld), NEG_INF, ld)
        v = lp.shape[-1]
        blank_ok = durs > 0                                              # (D,)
        tok_ok = (durs > 0) | (r < rounds - 1)
        not_blank = o.arange(v) != blank                                 # (V,)
        c0 = o.where(valid & ~x, score, NEG_INF)                           # (BH,)
        cb = o.where(x[:, None] & blank_ok[None, :],
                     score[:, None] + lp[:, blank][:, None] + ld, NEG_INF)      # (BH, D)
        ct = o.where(x[:, None, None] & tok_ok[None, None, :] & not_blank[None, :, None],
                     score[:, None, None] + lp[:, :, None] + ld[:, None, :], NEG_INF)  # (BH, V, D)
        # ---- merges (see the module docstring of the frontends: identical token sequences
        # on the same frame are one hypothesis)
        eq, pre, last = _seq_relations(o, tokens, ln, valid, b, h)
        x_b = o.reshape(x, (b, h))
        carried = o.reshape(valid & ~x, (b, h))
        th_b = o.reshape(th, (b, h))
        land = o.minimum(t + durs[None, :], o.reshape(len_row, (b, h))[:, :1])  # (B, D)
        # durations clamped onto the same landing frame (past the end): one candidate,
        # kept at the first such duration index
        same = land[:, :, None] == land[:, None, :]                          # (B, D, D')
        rep = o.argmax(o.astype_int(same))                                   # (B, D): first D'
        fold = rep[:, :, None] == o.arange(nd)[None, None, :]                # (B, D, D')
        cb_b = o.lse(o.where(fold[:, None, :, :], o.reshape(cb, (b, h, nd))[..., None], NEG_INF), (2,))
        ct_b = o.lse(o.where(fold[:, None, None, :, :],
                             o.reshape(ct, (b, h, v, nd))[..., None], NEG_INF), (3,))
        ct_b = o.reshape(ct_b, (b, h * v * nd))                              # flat (p, k, d)
        c0_b = o.reshape(c0, (b, h))
        # (1) blank of expanding q lands on carried q2 with the same tokens
        m1 = (x_b[:, :, None, None] & carried[:, None, None, :] & eq[:, :, None, :]
              & (land[:, None, :, None] == th_b[:, None, None, :]))          # (B, q, D, q2)
        c0_add = o.lse(o.where(m1, cb_b[..., None], NEG_INF), (1, 2))        # (B, q2)
        kill_b = o.any_(m1, -1)                                              # (B, q, D)
        # (2) token k of expanding p lands on carried q2 with seq(q2) == seq(p) + [k]
        par2, has2 = _first_true(o, pre & x_b[:, None, :])                   # (B, q2)
        d_of = (land[:, None, :] == th_b[:, :, None])                          # (B, q2, D)
        d2, hasd2 = _first_true(o, d_of)
        ok2 = carried & has2 & hasd2 & (last >= 0)
        idx2 = par2 * (v * nd) + o.maximum(last, 0) * nd + d2                  # flat in (p, k, d)
        c0_add2 = o.where(ok2, o.gather(ct_b, idx2, 1), NEG_INF)
        # (3) token k of expanding p lands where the blank of expanding q does,
        # seq(q) == seq(p) + [k] (positive durations only)
        par3, has3 = par2, has2                                              # (B, q)
        ok3 = x_b & has3 & (last >= 0)                                       # (B, q)
        base3 = par3 * (v * nd) + o.maximum(last, 0) * nd                     # (B, q)
        idx3 = base3[:, :, None] + o.arange(nd)[None, None, :]               # (B, q, D)
        ok3d = ok3[:, :, None] & blank_ok[None, None, :]
        cb_add = o.where(ok3d, o.reshape(o.gather(ct_b, o.reshape(idx3, (b, h * nd)), 1),
                                          (b, h, nd)), NEG_INF)
        new_c0 = o.logaddexp(o.logaddexp(c0_b, c0_add), c0_add2)
        new_cb = o.where(kill_b, NEG_INF, o.logaddexp(cb_b, cb_add))
        new_ct = o.kill(ct_b, idx2, ok2)
        new_ct = o.kill(new_ct, o.reshape(idx3, (b, h * nd)), o.reshape(ok3d, (b, h * nd)))
        cand = o.concat([new_c0, o.reshape(new_cb, (b, h * nd)), new_ct], 1)
        top, pick = o.topk(cand, h)                                          # (B, H)
        # ---- the chosen candidates as the new slots
        is_carry = pick < h
        is_blank = (pick >= h) & (pick < h + h * nd)
        j_b = pick - h
        j_t = pick - h - h * nd
        parent = o.where(is_carry, pick, o.where(is_blank, j_b // nd, j_t // (v * nd)))
        d_idx = o.where(is_blank, j_b % nd, j_t % nd)
        tok = o.where(is_carry | is_blank, blank, (j_t // nd) % v)
        emit = ~is_carry & ~is_blank
        rows = o.reshape(parent + o.arange(b)[:, None] * h, (bh,))
        emit = o.reshape(emit, (bh,))
        tok = o.reshape(tok, (bh,))
        is_carry = o.reshape(is_carry, (bh,))
        new_th = o.where(is_carry, th[rows],
                         o.minimum(t + durs[o.reshape(o.maximum(d_idx, 0) % nd, (bh,))], len_row))
        p_ln = ln[rows]
        slot = o.minimum(p_ln, cap - 1)
        n_tokens = o.set_rows(tokens[rows], slot, tok, emit)
        n_frames = o.set_rows(c["frames"][rows], slot, o.full((bh,), 0, "int") + t, emit)
        p_pred = o.take_tree(c["pred"], rows)
        p_state = o.take_tree(c["state"], rows)
        pred, state = o.predict_where(predict, emit, o.where(emit, tok, start), p_pred, p_state)
        new_score = o.reshape(top, (bh,))
        new_score = o.where(o.isnan(new_score), NEG_INF, new_score)
        return dict(score=new_score, th=new_th, ln=p_ln + o.astype_int(emit),
                    tokens=n_tokens, frames=n_frames, pred=pred, state=state)

    def any_expanding(t, c):
        return o.any((c["score"] > NEG_INF) & (c["th"] == t) & (t < len_row))

    carry = o.frame_rounds(t_max, rounds, round_body, any_expanding, carry)
    return _finish(o, carry, b, h)


def _finish(o, c, b, h):
    """The slots of each utterance best first, unused ones blanked out."""
    score = o.reshape(c["score"], (b, h))
    cap = c["tokens"].shape[-1]
    _, order = o.topk(score, h)
    rows = o.reshape(order + o.arange(b)[:, None] * h, (b * h,))
    s = o.reshape(c["score"][rows], (b, h))
    valid = s > NEG_INF
    ln = o.where(valid, o.reshape(c["ln"][rows], (b, h)), 0)
    keep = valid[..., None]
    tokens = o.where(keep, o.reshape(c["tokens"][rows], (b, h, cap)), -1)
    frames = o.where(keep, o.reshape(c["frames"][rows], (b, h, cap)), -1)
    return tokens, ln, s, frames
