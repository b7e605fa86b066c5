"""Framework-free decoding: ARPA n-gram LMs, lexicons and the searches (numpy + numba).

Nothing here imports torch or jax.
"""
from .arpa import ArpaLM
from .ctc_beam import CTCDecoder
from .ctc_beam import CTCDecoderLM
from .ctc_beam import CTCDecoderLMState
from .ctc_beam import CTCHypothesis
from .ctc_beam import build_decoder
from .arpa import read_arpa
from .lexicon import read_lexicon

__all__ = [
    "CTCDecoder",
    "CTCDecoderLM",
    "CTCDecoderLMState",
    "CTCHypothesis",
    "build_decoder",
    "ArpaLM",
    "read_arpa",
    "read_lexicon",
]
