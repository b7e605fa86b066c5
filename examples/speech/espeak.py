"""eSpeak NG through ctypes: audio plus word and phoneme events with their sample positions.

The library and its data come from the ``espeakng-loader`` wheel (no system install).  eSpeak
NG reports, for every word and phoneme it speaks, an event carrying the audio position (in
ms from the start of the utterance) where it begins: the recipe keeps those as the ground
truth of its alignment scores.

Only the few API calls the recipe needs are bound (``speak_lib.h``):
``espeak_Initialize``, ``espeak_SetSynthCallback``, ``espeak_SetVoiceByName``,
``espeak_SetParameter``, ``espeak_Synth`` and ``espeak_Synchronize``.  One process holds one
synthesiser; the corpus builder uses a process pool for parallelism.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

# espeak_AUDIO_OUTPUT, espeak_EVENT_TYPE, espeak_PARAMETER, espeakINITIALIZE_* (speak_lib.h)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_EVENT_WORD, _EVENT_END, _EVENT_MSG_TERMINATED, _EVENT_PHONEME = 1, 5, 6, 7
_RATE, _VOLUME, _PITCH, _RANGE, _WORDGAP = 1, 2, 3, 4, 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EventId)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.POINTER(_Event))


@dataclass
class Spoken:
    """One synthesised utterance.

    Attributes:
        audio: ``(L,)`` float32 waveform in [-1, 1] at ``sample_rate``.
        sample_rate: samples per second (22,050 for eSpeak NG).
        words: ``(text_position, start_s)`` per word event, in speaking order.
        phonemes: ``(phoneme, start_s)`` per phoneme event.
    """

    audio: np.ndarray
    sample_rate: int
    words: list = field(default_factory=list)
    phonemes: list = field(default_factory=list)


class ESpeak:
    """A synthesiser in this process (eSpeak NG keeps global state: one per process).

    Args:
        lib_path: ``libespeak-ng.so``; default from ``espeakng_loader``.
        data_path: its ``espeak-ng-data`` folder; default from ``espeakng_loader``.
    """

    def __init__(self, lib_path: str | None = None, data_path: str | None = None):
        if lib_path is None or data_path is None:
            import espeakng_loader
            lib_path = lib_path or espeakng_loader.get_library_path()
            data_path = data_path or espeakng_loader.get_data_path()
        self._lib = ctypes.CDLL(lib_path)
        self._lib.espeak_Initialize.restype = ctypes.c_int
        self.sample_rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), _INITIALIZE_PHONEME_EVENTS)
        if self.sample_rate <= 0:
            raise RuntimeError(f"ESpeak: espeak_Initialize failed with {self.sample_rate} "
                               f"(data path {data_path!r})")
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[int, int, int, bytes]] = []
        self._callback = _CALLBACK(self._on_audio)  # keep a reference: C holds the pointer
        self._lib.espeak_SetSynthCallback(self._callback)

    def _on_audio(self, wav, n, events):
        if n > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        i = 0
        while events[i].type != 0:  # LIST_TERMINATED
            e = events[i]
            if e.type in (_EVENT_WORD, _EVENT_PHONEME):
                name = bytes(e.id.string).split(b"\0")[0] if e.type == _EVENT_PHONEME else b""
                self._events.append((e.type, e.text_position, e.audio_position, name))
            i += 1
        return 0

    def speak(self, text: str, *, voice: str = "en-us", rate: int = 175, pitch: int = 50,
              pitch_range: int = 50, word_gap: int = 0) -> Spoken:
        """Synthesise ``text``.

        Args:
            text: the sentence (plain words).
            voice: an eSpeak NG voice name, optionally with a variant (``"en-us+m3"``).
            rate: words per minute (80..450).
            pitch: base pitch 0..100.
            pitch_range: pitch range 0..100.
            word_gap: extra pause between words, in units of 10 ms at the default rate.

        Returns:
            A :class:`Spoken` with the audio and the word and phoneme start times.
        """
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"ESpeak.speak: unknown voice {voice!r}")
        for param, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range),
                             (_WORDGAP, word_gap)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._chunks, self._events = [], []
        data = text.encode() + b"\0"
        rc = self._lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if rc != 0:
            raise RuntimeError(f"ESpeak.speak: espeak_Synth returned {rc}")
        self._lib.espeak_Synchronize()
        audio = (np.concatenate(self._chunks).astype(np.float32) / 32768.0
                 if self._chunks else np.zeros(0, np.float32))
        words = [(pos, ms / 1000.0) for kind, pos, ms, _ in self._events if kind == _EVENT_WORD]
        phonemes = [(name.decode(errors="replace"), ms / 1000.0)
                    for kind, _, ms, name in self._events if kind == _EVENT_PHONEME]
        return Spoken(audio, self.sample_rate, words, phonemes)
