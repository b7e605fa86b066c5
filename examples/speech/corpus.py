"""A spoken command corpus synthesised offline with eSpeak NG, cached on disk.

The text comes from a closed-vocabulary grammar (digits, times, smart-home commands, names,
cities, days): the kind of task a small on-device recogniser serves.  The test set differs
from the training set in its sentences (no test word sequence occurs in training) and in its
voice settings (voice variants, speaking rates, pitches and noise levels that training never
uses).  Each utterance keeps eSpeak NG's word start times as the ground truth of the
alignment scores.

The corpus is made by a process pool (one synthesiser per process: eSpeak NG keeps global
state), features included, and cached as one ``.npz`` per split plus a JSON of its texts and
timings; a second run with the same settings loads the cache.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from features import FRAME_S, log_mel  # noqa: E402  (examples/speech is run as a folder)

# ----------------------------------------------------------------------------- the grammar
NAMES = ("anna ben carlos diana emma frank grace henry isabel jack kevin laura maria nathan "
         "olivia peter quentin rachel samuel tina victor wendy xavier yvonne zoe alice bruno "
         "chloe daniel elena felix george hannah ivan julia lucas mia noah oscar paula").split()
CITIES = ("paris london berlin madrid rome tokyo boston chicago denver seattle dallas miami "
          "toronto sydney dublin oslo vienna prague lisbon athens cairo delhi moscow austin "
          "portland houston atlanta phoenix").split()
ROOMS = ["kitchen", "bedroom", "bathroom", "garage", "office", "hallway", "basement",
         "attic", "porch", "garden", "living room", "dining room"]
DEVICES = ["lights", "lamp", "fan", "heater", "radio", "television", "oven", "speaker",
           "heating", "air conditioner", "coffee machine", "dishwasher", "printer"]
OPENABLE = ["garage door", "front door", "back door", "window", "blinds", "curtains", "gate"]
GENRES = ["jazz", "rock", "classical", "blues", "country", "reggae", "pop", "folk",
          "disco", "soul", "metal", "hip hop"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
        "today", "tomorrow", "tonight"]
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]
ONES = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
DIGITS = ["zero", *ONES]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
         "seventeen", "eighteen", "nineteen"]
TENS = ["twenty", "thirty", "forty", "fifty"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
            "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
            "twentieth", "twenty first", "twenty second", "thirtieth"]


def _number(rng, lo, hi):
    """A number in words, lo <= n <= hi < 60."""
    n = int(rng.integers(lo, hi + 1))
    if n < 10:
        return DIGITS[n]
    if n < 20:
        return TEENS[n - 10]
    return TENS[n // 10 - 2] + ("" if n % 10 == 0 else " " + ONES[n % 10 - 1])


def _time(rng):
    hour = ONES[int(rng.integers(0, 9))] if rng.random() < 0.75 else rng.choice(TEENS[:3])
    r = rng.random()
    if r < 0.25:
        minutes = "o'clock"
    elif r < 0.4:
        minutes = "oh " + ONES[int(rng.integers(0, 9))]
    else:
        minutes = _number(rng, 10, 59)
    out = f"{hour} {minutes}"
    if rng.random() < 0.4:
        out += rng.choice([" in the morning", " in the evening", " at night"])
    return out


def _pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


_TEMPLATES = [
    lambda r: f"set an alarm for {_time(r)}",
    lambda r: f"wake me up at {_time(r)} {_pick(r, DAYS)}",
    lambda r: f"remind me to call {_pick(r, NAMES)} at {_time(r)}",
    lambda r: f"call {_pick(r, NAMES)}",
    lambda r: f"call {_pick(r, NAMES)} {_pick(r, ['on her mobile', 'on his mobile', 'at work', 'at home'])}",
    lambda r: f"send a message to {_pick(r, NAMES)} saying i will be late",
    lambda r: f"text {_pick(r, NAMES)} that i am {_pick(r, ['on my way', 'at home', 'running late'])}",
    lambda r: f"turn {_pick(r, ['on', 'off'])} the {_pick(r, ROOMS)} {_pick(r, DEVICES)}",
    lambda r: f"switch {_pick(r, ['on', 'off'])} the {_pick(r, DEVICES)} in the {_pick(r, ROOMS)}",
    lambda r: f"{_pick(r, ['open', 'close', 'lock', 'unlock'])} the {_pick(r, OPENABLE)}",
    lambda r: f"set the {_pick(r, ROOMS)} temperature to {_number(r, 15, 29)} degrees",
    lambda r: f"dim the {_pick(r, ROOMS)} lights to {_number(r, 10, 59)} percent",
    lambda r: f"play some {_pick(r, GENRES)} music in the {_pick(r, ROOMS)}",
    lambda r: f"play {_pick(r, GENRES)} {_pick(r, ['please', 'for me', 'from my playlist'])}",
    lambda r: f"what is the weather in {_pick(r, CITIES)} {_pick(r, DAYS)}",
    lambda r: f"will it rain in {_pick(r, CITIES)} on {_pick(r, DAYS)}",
    lambda r: f"what time is it in {_pick(r, CITIES)}",
    lambda r: f"book a table for {_number(r, 2, 9)} at {_time(r)}",
    lambda r: f"add a meeting with {_pick(r, NAMES)} on {_pick(r, MONTHS)} {_pick(r, ORDINALS)}",
    lambda r: f"dial {' '.join(_pick(r, DIGITS) for _ in range(int(r.integers(3, 6))))}",
    lambda r: f"start a timer for {_number(r, 2, 59)} minutes",
    lambda r: f"navigate to {_pick(r, CITIES)}",
    lambda r: f"how far is {_pick(r, CITIES)} from {_pick(r, CITIES)}",
    lambda r: f"{_pick(r, ['volume up', 'volume down', 'stop the music', 'pause', 'next song', 'cancel'])}",
]


def sentence(rng: np.random.Generator) -> str:
    """One random sentence of the grammar."""
    return _pick(rng, _TEMPLATES)(rng)


def vocabulary() -> list[str]:
    """The grammar's words (what the lexicon and the n-gram LM may use), sorted."""
    rng = np.random.default_rng(0)
    words = set()
    for _ in range(40000):
        words.update(sentence(rng).split())
    return sorted(words)


# ----------------------------------------------------------------------------- voices
# eSpeak NG voice variants (espeak-ng-data/voices/!v); test variants never occur in training
TRAIN_VOICES = ["en-us", "en-us+m1", "en-us+m2", "en-us+m3", "en-us+m4", "en-us+f1",
                "en-us+f2", "en-us+f3", "en+m1", "en+f2", "en-us+klatt", "en+m3"]
TEST_VOICES = ["en-us+m5", "en-us+f4", "en+m2", "en-us+m6"]
TRAIN_RATES, TEST_RATES = (140, 160, 180, 200, 220), (150, 170, 190, 210)
TRAIN_PITCH, TEST_PITCH = (30, 40, 50, 60, 70), (35, 45, 55, 65)
TRAIN_SNR_DB, TEST_SNR_DB = (15.0, 35.0), (18.0, 28.0)
SPLITS = ("train", "dev", "test")


@dataclass
class Utterance:
    """One utterance's text, voice settings and eSpeak NG's word start times (seconds)."""

    text: str
    voice: str
    rate: int
    pitch: int
    snr_db: float
    duration_s: float
    word_starts: list
    word_ends: list


_SYNTH = None


def _worker_init():
    global _SYNTH
    from espeak import ESpeak
    _SYNTH = ESpeak()


def _make(job):
    """Synthesise, add noise and compute features for one utterance (in a worker)."""
    text, voice, rate, pitch, snr_db, seed, keep_audio = job
    rng = np.random.default_rng(seed)
    spoken = _SYNTH.speak(text, voice=voice, rate=rate, pitch=pitch)
    audio = spoken.audio
    sr = spoken.sample_rate
    # pad a little silence on both sides (eSpeak starts speaking on sample 0)
    lead = int(rng.uniform(0.05, 0.25) * sr)
    tail = int(rng.uniform(0.05, 0.2) * sr)
    audio = np.concatenate([np.zeros(lead, np.float32), audio, np.zeros(tail, np.float32)])
    # coloured noise at the chosen SNR (relative to the speech power)
    noise = rng.standard_normal(len(audio) + 2).astype(np.float32)
    tilt = rng.uniform(-0.9, 0.9)
    noise = noise[2:] + tilt * noise[1:-1]
    p_speech = float(np.mean(spoken.audio ** 2)) + 1e-12
    noise *= np.sqrt(p_speech / (10 ** (snr_db / 10)) / (np.mean(noise ** 2) + 1e-12))
    audio = audio + noise
    # word events carry the 1-based character position of their word in the text
    offsets = [m.start() + 1 for m in re.finditer(r"\S+", text)]
    by_pos = dict(spoken.words)
    if not set(by_pos) <= set(offsets):
        raise RuntimeError(f"corpus: eSpeak NG's word events {sorted(by_pos)} do not match the "
                           f"words of {text!r} at {offsets}")
    # eSpeak joins some unstressed words to the previous one ("in the" -> one event): their
    # start (and the previous word's end) is then unknown (None) and left out of the scores
    starts = [lead / sr + by_pos[o] if o in by_pos else None for o in offsets]
    # a word ends where the next one starts; the last one where the speech stops
    # (eSpeak speaks a sentence without pauses; the final silence is not a word)
    speech_end = (lead + len(spoken.audio)) / sr
    ends = starts[1:] + [speech_end - _trailing_silence(spoken.audio, sr)]
    feats = log_mel(audio, sr).astype(np.float16)
    utt = Utterance(text, voice, rate, pitch, float(snr_db), len(audio) / sr, starts, ends)
    return utt, feats, (audio.astype(np.float32) if keep_audio else None)


def _trailing_silence(audio, sr, threshold=0.01):
    """Seconds of near-silence at the end of eSpeak's output."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    return 0.0 if len(loud) == 0 else (len(audio) - 1 - loud[-1]) / sr


def _texts(n_train, n_dev, n_test, seed):
    """Training, dev and test sentences; no dev or test sentence occurs in training."""
    rng = np.random.default_rng(seed)
    held, seen = [], set()
    while len(held) < n_test + n_dev:
        s = sentence(rng)
        if s not in seen:
            seen.add(s)
            held.append(s)
    test, dev = held[:n_test], held[n_test:]
    train = []
    while len(train) < n_train:
        s = sentence(rng)
        if s not in seen:  # unseen word sequences only in the test set
            train.append(s)
    return train, dev, test


def build(out_dir: str | os.PathLike, *, n_train: int = 2000, n_dev: int = 150,
          n_test: int = 300, seed: int = 0,
          workers: int | None = None, audio_examples: int = 4, progress=None) -> dict:
    """Make (or load from ``out_dir``) the corpus.

    Args:
        out_dir: cache folder (``corpus-<hash>.npz`` and ``.json`` are written there).
        n_train: training utterances.
        n_dev: development utterances (training voices, unseen sentences: for tuning the
            decoder's LM weight, never the test set).
        n_test: test utterances.
        seed: random seed of texts, voices and noise.
        workers: processes (default: ``os.cpu_count()``).
        audio_examples: test utterances whose waveform is kept (for the figure).
        progress: ``callable(iterable, total=, desc=)`` wrapping the work (e.g. ``tqdm``).

    Returns:
        ``{"train": split, "dev": split, "test": split, "frame_s": float}`` where a
        split is ``{"feats": list of (T, F) float32 arrays, "utts": list of Utterance dicts,
        "audio": list of waveforms or None}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(json.dumps([n_train, n_dev, n_test, seed, TRAIN_VOICES, TEST_VOICES,
                                   TRAIN_RATES, TEST_RATES, TRAIN_PITCH, TEST_PITCH,
                                   TRAIN_SNR_DB, TEST_SNR_DB, FRAME_S, 2]).encode()).hexdigest()[:10]
    npz, meta = out / f"corpus-{key}.npz", out / f"corpus-{key}.json"
    if npz.exists() and meta.exists():
        return _load(npz, meta)
    train_txt, dev_txt, test_txt = _texts(n_train, n_dev, n_test, seed)
    rng = np.random.default_rng(seed + 1)
    jobs = []
    for split, texts in (("train", train_txt), ("dev", dev_txt), ("test", test_txt)):
        voices, rates, pitches, snr = ((TRAIN_VOICES, TRAIN_RATES, TRAIN_PITCH, TRAIN_SNR_DB)
                                       if split != "test" else
                                       (TEST_VOICES, TEST_RATES, TEST_PITCH, TEST_SNR_DB))
        for i, text in enumerate(texts):
            jobs.append((split, (text, _pick(rng, voices), int(_pick(rng, rates)),
                                 int(_pick(rng, pitches)), float(rng.uniform(*snr)),
                                 int(rng.integers(2 ** 31)),
                                 split == "test" and i < audio_examples)))
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        it = pool.imap(_make, [j for _, j in jobs], chunksize=16)
        if progress is not None:
            it = progress(it, total=len(jobs), desc="corpus")
        results = list(it)
    data = {}
    for split in SPLITS:
        rows = [r for (s, _), r in zip(jobs, results) if s == split]
        data[split] = {"feats": [r[1] for r in rows], "utts": [asdict(r[0]) for r in rows],
                       "audio": [r[2] for r in rows]}
    arrays = {}
    for split in SPLITS:
        arrays[f"{split}_feats"] = np.concatenate(data[split]["feats"])
        arrays[f"{split}_lens"] = np.array([len(f) for f in data[split]["feats"]])
        for i, a in enumerate(data[split]["audio"]):
            if a is not None:
                arrays[f"{split}_audio_{i}"] = a
    np.savez(npz, **arrays)
    meta.write_text(json.dumps({s: data[s]["utts"] for s in SPLITS}))
    return _load(npz, meta)


def _load(npz, meta):
    arrays = np.load(npz)
    utts = json.loads(Path(meta).read_text())
    data = {"frame_s": FRAME_S}
    for split in SPLITS:
        lens = arrays[f"{split}_lens"]
        flat = arrays[f"{split}_feats"].astype(np.float32)
        feats = np.split(flat, np.cumsum(lens)[:-1])
        audio = [arrays[f"{split}_audio_{i}"] if f"{split}_audio_{i}" in arrays.files else None
                 for i in range(len(lens))]
        data[split] = {"feats": feats, "utts": utts[split], "audio": audio}
    return data
