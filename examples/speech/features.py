"""Log-mel features in numpy (no torchaudio or librosa needed).

``log_mel`` frames the waveform with a Hann window (25 ms at 22,050 Hz: 512 samples, hop
220 samples, about 10 ms), takes the power spectrum, applies a triangular mel filter bank
(64 bands, 20 Hz to 8 kHz, HTK mel scale) and returns ``log(energy + 1e-6)``, normalised
per utterance (each band to mean 0 and variance 1): speakers and levels differ between the
training and test sets, and per-utterance normalisation takes that off the model's hands.
"""
from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 22050
N_FFT = 512
HOP = 220
N_MELS = 64
FRAME_S = HOP / SAMPLE_RATE  # seconds per feature frame


@functools.lru_cache(maxsize=8)
def mel_filters(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                fmin: float = 20.0, fmax: float = 8000.0) -> np.ndarray:
    """``(n_mels, n_fft // 2 + 1)`` triangular filters on the HTK mel scale."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(fmin), mel(fmax), n_mels + 2))
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs - lo) / (mid - lo)
    down = (hi - freqs) / (hi - mid)
    return np.maximum(0.0, np.minimum(up, down)).astype(np.float32)


def log_mel(audio: np.ndarray, sr: int = SAMPLE_RATE, *, normalise: bool = True) -> np.ndarray:
    """``(T, N_MELS)`` float32 log-mel features of a ``(L,)`` waveform.

    Frame ``t`` covers samples ``[t * HOP, t * HOP + N_FFT)`` of the waveform padded with
    ``N_FFT // 2`` zeros on each side, so frame ``t`` is centred on sample ``t * HOP``.
    """
    if sr != SAMPLE_RATE:
        raise ValueError(f"log_mel: sr must be {SAMPLE_RATE} (resample first), got {sr}")
    x = np.pad(np.asarray(audio, np.float32), N_FFT // 2)
    n = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(x, (n, N_FFT), (x.strides[0] * HOP, x.strides[0]))
    spec = np.abs(np.fft.rfft(frames * np.hanning(N_FFT).astype(np.float32), axis=1)) ** 2
    feats = np.log(spec @ mel_filters(sr).T + 1e-6).astype(np.float32)
    if normalise:
        feats = (feats - feats.mean(0)) / (feats.std(0) + 1e-5)
    return feats
