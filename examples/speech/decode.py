"""Decoding, WER and forced alignment with duoloss's own decoders, for both frameworks.

* CTC greedy: ``ctc_greedy_decode``;
* CTC beam search with the recipe's lexicon and ARPA word n-gram LM: ``ctc_decoder``;
* transducer greedy and beam: ``rnnt_greedy_decode`` and ``rnnt_beam_search`` (icefall's
  modified beam search) over the model's predictor and joiner;
* WER with ``jiwer``;
* forced alignment of the reference texts with ``ctc_align`` + ``token_spans``: each word's
  first and last letter spans give its start and end, compared with eSpeak NG's word times.

Every function takes the framework's module (``duoloss.torch`` or ``duoloss.jax``) through
a small adapter, so the two frameworks run the same code path with their own decoders.
"""
from __future__ import annotations

import jiwer
import numpy as np

from common import BLANK, SPACE, SUBSAMPLE, TOKENS, decode as ids_to_text, encode, joint_lengths


def wer(refs, hyps):
    """Word error rate in percent (jiwer)."""
    return 100.0 * jiwer.wer(list(refs), [h if h.strip() else "<empty>" for h in hyps])


def _pad(arrays):
    """Stack ``(T_i, ...)`` numpy arrays into ``(N, T, ...)`` zero padded, with the lengths."""
    lens = np.array([len(a) for a in arrays], np.int64)
    out = np.zeros((len(arrays), lens.max(), *arrays[0].shape[1:]), np.float32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return out, lens


def _chunks(n, size):
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


class TorchSide:
    """torch adapter: tensors in, numpy out."""

    name = "torch"

    def __init__(self, model):
        import torch

        import duoloss.torch as d
        self.torch, self.d, self.model = torch, d, model

    def _t(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x))

    def greedy_ctc(self, lp, lens):
        tokens, n, _ = self.d.ctc_greedy_decode(self._t(lp), self._t(lens), BLANK,
                                                batch_first=True)
        return [tokens[i, : n[i]].numpy() for i in range(len(lens))]

    def beam_ctc(self, decoder, lp, lens):
        return decoder(self._t(lp), self._t(lens))

    def stack(self, enc):
        return self.model.stack(self._t(enc)).numpy()

    def _predict(self, tokens, state):
        emb = self.model.embed(tokens)[:, None, :]
        h0 = None if state is None else state.transpose(0, 1).contiguous()
        out, h = self.model.pred_rnn(emb, h0)
        return out[:, 0], h.transpose(0, 1)

    def _join(self, enc, pred):
        return self.model.joiner(enc, pred)

    def greedy_rnnt(self, enc, lens):
        with self.torch.no_grad():
            tokens, n, _ = self.d.rnnt_greedy_decode(self._t(enc), self._t(lens), self._predict,
                                                     self._join, blank=BLANK)
        return [tokens[i, : n[i]].numpy() for i in range(len(lens))]

    def beam_rnnt(self, enc, lens, beam):
        with self.torch.no_grad():
            tokens, n, _, _ = self.d.rnnt_beam_search(self._t(enc), self._t(lens), self._predict,
                                                      self._join, blank=BLANK, beam=beam)
        return [tokens[i, 0, : n[i, 0]].numpy() for i in range(len(lens))]

    def align(self, lp, lens, targets, target_lens):
        lpt = self._t(lp).transpose(0, 1)
        labels, _ = self.d.ctc_align(lpt, self._t(targets), self._t(lens), self._t(target_lens),
                                     blank=BLANK)
        tok, start, end, _ = self.d.token_spans(labels, lpt, blank=BLANK)
        return tok.numpy(), start.numpy(), end.numpy()

    def ctc_decoder(self, **kw):
        return self.d.ctc_decoder(**kw)


class JaxSide:
    """JAX adapter: the flax model's predictor and joiner as pure functions of the params."""

    name = "jax"

    def __init__(self, model, params):
        import flax.linen as nn
        import jax
        import jax.numpy as jnp

        import duoloss.jax as d
        self.jax, self.jnp, self.d = jax, jnp, d
        variables = {"params": params}

        def predict(tokens, state):
            def f(m):
                emb = m.embed(tokens)
                carry = (m.pred_cell.initialize_carry(jax.random.key(0), emb.shape)
                         if state is None else state)
                carry, out = m.pred_cell(carry, emb)
                return out, carry
            return nn.apply(f, model)(variables)

        def join(enc, pred):
            return nn.apply(lambda m: m.joiner(enc, pred), model)(variables)

        self._greedy = jax.jit(lambda e, n: d.rnnt_greedy_decode(e, n, predict, join, blank=BLANK))
        self._beam = jax.jit(lambda e, n, beam: d.rnnt_beam_search(e, n, predict, join,
                                                                   blank=BLANK, beam=beam),
                             static_argnums=2)
        self._ctc_greedy = jax.jit(lambda lp, n: d.ctc_greedy_decode(lp, n, BLANK,
                                                                     batch_first=True))

    def stack(self, enc):
        from train_jax import stack
        return np.asarray(stack(enc))

    def greedy_ctc(self, lp, lens):
        tokens, n, _ = self._ctc_greedy(lp, lens.astype(np.int32))
        tokens, n = np.asarray(tokens), np.asarray(n)
        return [tokens[i, : n[i]] for i in range(len(lens))]

    def beam_ctc(self, decoder, lp, lens):
        return decoder(lp, lens)

    def greedy_rnnt(self, enc, lens):
        tokens, n, _ = self._greedy(enc, lens.astype(np.int32))
        tokens, n = np.asarray(tokens), np.asarray(n)
        return [tokens[i, : n[i]] for i in range(len(lens))]

    def beam_rnnt(self, enc, lens, beam):
        tokens, n, _, _ = self._beam(enc, lens.astype(np.int32), beam)
        tokens, n = np.asarray(tokens), np.asarray(n)
        return [tokens[i, 0, : n[i, 0]] for i in range(len(lens))]

    def align(self, lp, lens, targets, target_lens):
        lpt = np.swapaxes(lp, 0, 1)
        labels, _ = self.d.ctc_align(lpt, targets, lens.astype(np.int32),
                                     target_lens.astype(np.int32), blank=BLANK)
        tok, start, end, _ = self.d.token_spans(labels, lpt, blank=BLANK)
        return np.asarray(tok), np.asarray(start), np.asarray(end)

    def ctc_decoder(self, **kw):
        return self.d.ctc_decoder(**kw)


def _bucket(n_frames, size):
    """Chunks of utterance indices sorted by length (less padding per batch)."""
    order = np.argsort(n_frames, kind="stable")
    return [order[i: i + size] for i in range(0, len(order), size)]


def run_decoders(side, enc, lp, refs, *, lexicon, arpa, beam_size=50, lm_weight=1.0,
                 word_score=0.0, rnnt_beam=4, batch=64, progress=None):
    """Decode a split every way; returns ``{decoder: (WER %, hypotheses)}``."""
    n = len(lp)
    hyps = {k: [""] * n for k in ("ctc_greedy", "ctc_beam_lm", "rnnt_greedy", "rnnt_beam")}
    decoder = side.ctc_decoder(tokens=TOKENS, lexicon=str(lexicon), lm=str(arpa),
                               beam_size=beam_size, lm_weight=lm_weight, word_score=word_score,
                               blank_token=TOKENS[BLANK], sil_token=TOKENS[SPACE])
    groups = _bucket([len(x) for x in lp], batch)
    bar = progress(total=n, desc=f"{side.name} decode") if progress else None
    for idx in groups:
        lps, lens = _pad([lp[i] for i in idx])
        encs, _ = _pad([enc[i] for i in idx])
        encs, jlens = side.stack(encs), joint_lengths(lens)
        for i, t in zip(idx, side.greedy_ctc(lps, lens)):
            hyps["ctc_greedy"][i] = ids_to_text(t)
        for i, h in zip(idx, side.beam_ctc(decoder, lps, lens)):
            hyps["ctc_beam_lm"][i] = " ".join(h[0].words) if h else ""
        for i, t in zip(idx, side.greedy_rnnt(encs, jlens)):
            hyps["rnnt_greedy"][i] = ids_to_text(t)
        for i, t in zip(idx, side.beam_rnnt(encs, jlens, rnnt_beam)):
            hyps["rnnt_beam"][i] = ids_to_text(t)
        if bar:
            bar.update(len(idx))
    if bar:
        bar.close()
    return {k: (wer(refs, v), v) for k, v in hyps.items()}


def word_boundaries(side, lp, texts, frame_s):
    """Forced-align each reference text; per utterance ``(starts, ends)`` in seconds.

    The word's start is the first frame of its first letter's span and its end the last
    frame (exclusive) of its last letter's span, times the encoder's frame period
    (``SUBSAMPLE * frame_s``); an encoder frame ``t`` is centred on feature frame
    ``SUBSAMPLE * t``.
    """
    out = [None] * len(lp)
    period = SUBSAMPLE * frame_s
    for idx in _bucket([len(x) for x in lp], 64):
        lps, lens = _pad([lp[i] for i in idx])
        ys = [encode(texts[i]) for i in idx]
        ylens = np.array([len(y) for y in ys], np.int64)
        targets = np.zeros((len(idx), ylens.max()), np.int64)
        for r, y in enumerate(ys):
            targets[r, : len(y)] = y
        tok, start, end = side.align(lps, lens, targets, ylens)
        for r, i in enumerate(idx):
            keep = tok[r] >= 0
            tk, st, en = tok[r][keep], start[r][keep], end[r][keep]
            # letter spans, in order; a word is the run of letter spans between "|" spans
            starts, ends, cur = [], [], None
            for k, s, e in zip(tk, st, en):
                if k == SPACE:
                    if cur is not None:
                        starts.append(cur[0] * period)
                        ends.append(cur[1] * period)
                        cur = None
                    continue
                cur = (s, e) if cur is None else (cur[0], e)
            if cur is not None:
                starts.append(cur[0] * period)
                ends.append(cur[1] * period)
            out[i] = (starts, ends)
    return out


def latency(aligned, utts):
    """The aligner's constant latency: median signed start and end errors (seconds).

    CTC emits a letter somewhere inside its sound, not at its onset, so the first letter's
    span starts a roughly constant time after the word does (about 0.1 s for the recipe's
    models) and the last letter's span ends a little after it. Estimated on the dev split
    (which has the synthesiser's timings, like the LM weight it is never the test set) and
    subtracted from the test set's boundaries by :func:`shift`. ``(0, 0)`` without timings.
    """
    a = boundary_errors(aligned, utts)
    if not a["boundaries"]:
        return 0.0, 0.0
    return a["start_signed_median_ms"] / 1000, a["end_signed_median_ms"] / 1000


def shift(aligned, offsets):
    """``aligned`` with ``offsets = (start, end)`` seconds subtracted from every boundary
    (a start never moves before 0 nor after its word's end)."""
    ds, de = offsets
    out = []
    for starts, ends in aligned:
        ends2 = [e - de for e in ends]
        starts2 = [min(max(0.0, s - ds), e) for s, e in zip(starts, ends2)]
        out.append((starts2, ends2))
    return out


def boundary_errors(aligned, utts):
    """Absolute errors (seconds) of the aligned word starts and ends vs the synthesiser's."""
    start_err, end_err = [], []
    for (starts, ends), u in zip(aligned, utts):
        if u["word_starts"] is None:
            continue  # a real corpus without word timings
        if len(starts) != len(u["word_starts"]):
            continue  # cannot happen for a feasible alignment; skipped rather than mis-paired
        for s, ts in zip(starts, u["word_starts"]):
            if ts is not None:
                start_err.append(s - ts)
        for e, te in zip(ends, u["word_ends"]):
            if te is not None:
                end_err.append(e - te)
    start_signed, end_signed = np.array(start_err), np.array(end_err)
    start_err, end_err = np.abs(start_signed), np.abs(end_signed)
    if len(start_err) == 0:
        return {"median_ms": None, "within_100ms": None, "start_median_ms": None,
                "end_median_ms": None, "start_within_100ms": None, "end_within_100ms": None,
                "start_signed_median_ms": None, "end_signed_median_ms": None, "boundaries": 0}
    both = np.concatenate([start_err, end_err])
    return {"median_ms": 1000 * float(np.median(both)),
            "within_100ms": float(np.mean(both <= 0.1)),
            "start_median_ms": 1000 * float(np.median(start_err)),
            "end_median_ms": 1000 * float(np.median(end_err)),
            "start_within_100ms": float(np.mean(start_err <= 0.1)),
            "end_within_100ms": float(np.mean(end_err <= 0.1)),
            # signed: aligned minus true (positive: the aligner is late)
            "start_signed_median_ms": 1000 * float(np.median(start_signed)),
            "end_signed_median_ms": 1000 * float(np.median(end_signed)),
            "boundaries": int(len(both))}
