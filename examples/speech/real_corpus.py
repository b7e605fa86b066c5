"""Point the recipe at a real corpus: a folder of audio files with their transcripts.

Two layouts are read:

* LibriSpeech's: ``<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` files with one
  ``<utterance-id> <TRANSCRIPT>`` line per utterance, beside ``<utterance-id>.flac`` (or
  ``.wav``) files;
* one transcript per audio file: ``name.wav`` beside ``name.txt``.

Transcripts are lower-cased and reduced to the recipe's tokens (letters, apostrophe, space).
WAV is read with the standard library; FLAC needs the ``soundfile`` package
(``pip install soundfile``).  Audio is resampled to the features' 22,050 Hz (scipy).  The
result has the same form as :func:`corpus.build`'s splits, without word timings (the
alignment score then has nothing to compare with and is skipped).
"""
from __future__ import annotations

import re
import wave
from fractions import Fraction
from pathlib import Path

import numpy as np

from features import SAMPLE_RATE, log_mel


def _read_audio(path: Path):
    if path.suffix.lower() == ".wav":
        with wave.open(str(path)) as w:
            sr, n, width, ch = w.getframerate(), w.getnframes(), w.getsampwidth(), w.getnchannels()
            raw = w.readframes(n)
        if width != 2:
            raise ValueError(f"real_corpus: {path}: only 16-bit PCM WAV is read, got "
                             f"{8 * width}-bit")
        audio = np.frombuffer(raw, np.int16).astype(np.float32).reshape(-1, ch).mean(1) / 32768
        return audio, sr
    try:
        import soundfile
    except ImportError as e:
        raise ImportError(f"real_corpus: reading {path.suffix} files needs the soundfile "
                          f"package (pip install soundfile)") from e
    audio, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    return audio.mean(1), sr


def _resample(audio, sr):
    if sr == SAMPLE_RATE:
        return audio
    from scipy.signal import resample_poly
    f = Fraction(SAMPLE_RATE, sr).limit_denominator(1000)
    return resample_poly(audio, f.numerator, f.denominator).astype(np.float32)


def _clean(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


def find(root) -> list[tuple[Path, str]]:
    """``(audio path, transcript)`` pairs under ``root`` (either layout), sorted by path."""
    root = Path(root)
    pairs = []
    for trans in sorted(root.rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            if not line.strip():
                continue
            uid, _, text = line.partition(" ")
            audio = next((trans.parent / f"{uid}{ext}" for ext in (".flac", ".wav")
                          if (trans.parent / f"{uid}{ext}").exists()), None)
            if audio is not None:
                pairs.append((audio, text))
    if not pairs:
        for audio in sorted(root.rglob("*.wav")):
            txt = audio.with_suffix(".txt")
            if txt.exists():
                pairs.append((audio, txt.read_text().strip()))
    if not pairs:
        raise ValueError(f"real_corpus.find: no audio with transcripts under {root} "
                         f"(LibriSpeech's *.trans.txt layout or name.wav + name.txt)")
    return pairs


def load(root, *, limit: int | None = None) -> dict:
    """A split (``{"feats", "utts", "audio"}``) from the corpus under ``root``."""
    feats, utts = [], []
    for path, text in find(root)[:limit]:
        audio, sr = _read_audio(path)
        audio = _resample(audio, sr)
        feats.append(log_mel(audio))
        utts.append({"text": _clean(text), "voice": str(path), "rate": None, "pitch": None,
                     "snr_db": None, "duration_s": len(audio) / SAMPLE_RATE,
                     "word_starts": None, "word_ends": None})
    return {"feats": feats, "utts": utts, "audio": [None] * len(feats)}
