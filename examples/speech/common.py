"""What the torch and JAX halves of the recipe share: the token set, batching, augmentation.

Both frameworks see exactly the same batches in the same order (same seed), so that the
comparison of their results measures the frameworks' training, not different data.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

BLANK = 0
SPACE = 1
#: the output tokens: blank (0), the word separator "|" (1), the apostrophe and a..z
TOKENS = ["<b>", "|", "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
_INDEX = {t: i for i, t in enumerate(TOKENS)}
SUBSAMPLE = 2  # the encoder's frame rate is 1 / SUBSAMPLE of the features'
#: encoder frames stacked per transducer frame: 1, every 20 ms frame (2 would halve the
#: joint tensor, but the modified beam search emits one token per frame and fast speech has
#: more than one letter per 40 ms)
JOINT_STACK = 1


def encode(text: str) -> np.ndarray:
    """Token ids of a sentence: its letters, ``|`` between words."""
    return np.array([_INDEX["|" if c == " " else c] for c in text], np.int32)


def decode(ids) -> str:
    """A sentence from token ids (blanks dropped, ``|`` read as a space, spaces squeezed)."""
    s = "".join(TOKENS[int(i)] for i in ids if int(i) != BLANK).replace("|", " ")
    return " ".join(s.split())


def out_lengths(n_frames):
    """Encoder frames for ``n_frames`` feature frames (a stride-2 convolution, kernel 3, pad 1)."""
    return (np.asarray(n_frames) - 1) // 2 + 1


def joint_lengths(out_lens):
    """Transducer frames: the joiner sees ``JOINT_STACK`` encoder frames stacked."""
    return (np.asarray(out_lens) + JOINT_STACK - 1) // JOINT_STACK


@dataclass
class Batch:
    """A padded batch.

    Attributes:
        feats: ``(N, T, F)`` float32 features (zero padded).
        feat_lens: ``(N,)`` int32 feature frames.
        out_lens: ``(N,)`` int32 encoder frames.
        joint_lens: ``(N,)`` int32 transducer frames (``joint_lengths(out_lens)``).
        targets: ``(N, S)`` int32 token ids (zero padded).
        target_lens: ``(N,)`` int32.
        index: ``(N,)`` positions of the utterances in their split.
    """

    feats: np.ndarray
    feat_lens: np.ndarray
    out_lens: np.ndarray
    joint_lens: np.ndarray
    targets: np.ndarray
    target_lens: np.ndarray
    index: np.ndarray


#: padding granularity of batches: every padded shape costs the JAX step one compile
#: (about 3 s on the 2-core CPU), every padded frame a share of a step (the encoders mask
#: padded frames, so padding changes no result). 32 frames: 13 CTC step shapes over the
#: recipe's 30 epochs and 5 % padded frames (128: 7 shapes, 25 %)
PAD_FRAMES, PAD_TOKENS = 32, 16


def _round_up(n, k):
    return -(-int(n) // k) * k


def make_batch(feats, texts, index) -> Batch:
    """Pad the utterances ``index`` of a split into one :class:`Batch`.

    Frames are padded to a multiple of ``PAD_FRAMES`` and tokens to one of ``PAD_TOKENS``, so
    that a jitted JAX step sees a handful of shapes (one compile each), not one per batch.
    """
    lens = np.array([len(feats[i]) for i in index], np.int32)
    x = np.zeros((len(index), _round_up(lens.max(), PAD_FRAMES), feats[index[0]].shape[1]),
                 np.float32)
    for row, i in enumerate(index):
        x[row, : lens[row]] = feats[i]
    ys = [encode(texts[i]) for i in index]
    ylens = np.array([len(y) for y in ys], np.int32)
    y = np.zeros((len(index), _round_up(max(1, ylens.max()), PAD_TOKENS)), np.int32)
    for row, t in enumerate(ys):
        y[row, : len(t)] = t
    out_lens = out_lengths(lens).astype(np.int32)
    return Batch(x, lens, out_lens, joint_lengths(out_lens).astype(np.int32), y, ylens,
                 np.asarray(index))


def batches(feats, texts, batch_size, rng=None):
    """Batches of utterances of similar length (shuffled buckets when ``rng`` is given)."""
    order = np.argsort([len(f) for f in feats], kind="stable")
    groups = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    for g in groups:
        yield make_batch(feats, texts, g)


def speed_perturb(batch: Batch, rng, *, low=0.9, high=1.1) -> Batch:
    """Tempo perturbation on the features: each utterance's frames resampled (linear
    interpolation along time) to ``1 / r`` of its length, ``r`` uniform in ``[low, high]``
    (Ko et al., 2015, "Audio augmentation for speech recognition", on the waveform; here
    on the log-mel frames, so the pitch stays). The batch is padded again as `make_batch`
    pads (multiples of ``PAD_FRAMES``)."""
    n, _, f = batch.feats.shape
    outs = []
    for b in range(n):
        length = int(batch.feat_lens[b])
        new = max(1, int(round(length / rng.uniform(low, high))))
        pos = np.linspace(0.0, length - 1, new)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, length - 1)
        w = (pos - lo)[:, None].astype(np.float32)
        x = batch.feats[b]
        outs.append(x[lo] * (1 - w) + x[hi] * w)
    lens = np.array([len(o) for o in outs], np.int32)
    x = np.zeros((n, _round_up(lens.max(), PAD_FRAMES), f), np.float32)
    for b, o in enumerate(outs):
        x[b, : len(o)] = o
    out_lens = out_lengths(lens).astype(np.int32)
    return Batch(x, lens, out_lens, joint_lengths(out_lens).astype(np.int32), batch.targets,
                 batch.target_lens, batch.index)


def spec_augment(batch: Batch, rng, *, freq_masks=2, freq_width=8, time_masks=2,
                 time_width=10) -> Batch:
    """SpecAugment's frequency and time masks (set to 0, the normalised mean)."""
    x = batch.feats.copy()
    n, _, f = x.shape
    for b in range(n):
        for _ in range(freq_masks):
            w = int(rng.integers(0, freq_width + 1))
            f0 = int(rng.integers(0, f - w + 1))
            x[b, :, f0: f0 + w] = 0.0
        for _ in range(time_masks):
            w = int(rng.integers(0, time_width + 1))
            t0 = int(rng.integers(0, max(1, batch.feat_lens[b] - w)))
            x[b, t0: t0 + w] = 0.0
    return Batch(x, batch.feat_lens, batch.out_lens, batch.joint_lens, batch.targets,
                 batch.target_lens, batch.index)


def lr_at(step, total, peak, warmup=100):
    """Linear warm-up to ``peak``, then cosine decay to ``peak / 20``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * min(1.0, frac))))


def train_loop(name, feats, texts, step_fn, *, epochs, batch_size, lr, seed, progress, log,
               max_steps, augment_from, warmup):
    """The schedule both frameworks train on: ``epochs`` passes over the same batches
    (SortaGrad: the first epoch in order of length, short first; from epoch
    ``augment_from`` tempo perturbation (`speed_perturb`) and SpecAugment), at most ``max_steps`` steps, the learning rate of `lr_at`.

    ``step_fn(batch, lr_now) -> (ctc, rnnt)`` takes one optimiser step and returns the two
    losses as Python floats. Returns the history: per-step ``ctc``, ``rnnt``, ``time``
    (seconds since the start) and ``cpu`` (this process's CPU seconds since the start: all
    its threads; on a shared machine the honest measure of the work).
    """
    steps_per_epoch = -(-len(feats) // batch_size)
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    rng = np.random.default_rng(seed)
    hist = {"ctc": [], "rnnt": [], "time": [], "cpu": []}
    start, cpu0, step = time.perf_counter(), time.process_time(), 0
    bar = progress(total=total, desc=f"{name} train") if progress else None
    for epoch in range(epochs):
        for batch in batches(feats, texts, batch_size, rng if epoch > 0 else None):
            if step >= total:
                break
            if epoch >= augment_from:
                batch = spec_augment(speed_perturb(batch, rng), rng)
            ctc, rnnt = step_fn(batch, lr_at(step, total, lr, warmup))
            hist["ctc"].append(ctc)
            hist["rnnt"].append(rnnt)
            hist["time"].append(time.perf_counter() - start)
            hist["cpu"].append(time.process_time() - cpu0)
            step += 1
            if bar:
                bar.update(1)
                bar.set_postfix(ctc=f"{ctc:.3f}", rnnt=f"{rnnt:.3f}")
        if log and step <= total:
            n = steps_per_epoch
            log(f"{name} epoch {epoch + 1}: ctc {np.mean(hist['ctc'][-n:]):.3f} "
                f"rnnt {np.mean(hist['rnnt'][-n:]):.3f} ({hist['time'][-1]:.0f} s)")
    if bar:
        bar.close()
    return hist


def join_histories(ctc_phase, transducer_phase):
    """One history of the two training phases (`train_loop` results) of a framework:
    per-step ``ctc``, ``rnnt`` (NaN during the CTC phase), ``time`` and ``cpu`` (seconds
    since the start of the first phase), ``phase_steps`` (the CTC phase's), ``phase_s``
    and ``phase_cpu_s`` (wall and CPU seconds of each phase)."""
    def last(h, key):
        return h[key][-1] if h[key] else 0.0

    t1, c1 = last(ctc_phase, "time"), last(ctc_phase, "cpu")
    return {"ctc": ctc_phase["ctc"] + transducer_phase["ctc"],
            "rnnt": [float("nan")] * len(ctc_phase["ctc"]) + transducer_phase["rnnt"],
            "time": ctc_phase["time"] + [t1 + t for t in transducer_phase["time"]],
            "cpu": ctc_phase["cpu"] + [c1 + c for c in transducer_phase["cpu"]],
            "phase_steps": len(ctc_phase["ctc"]),
            "phase_s": [t1, last(transducer_phase, "time")],
            "phase_cpu_s": [c1, last(transducer_phase, "cpu")]}
