"""Framework-free decoding: ARPA n-gram LMs, lexicons and the searches (numpy + numba).

Nothing here imports torch or jax.
"""
from .arpa import ArpaLM
from .arpa import read_arpa
from .lexicon import read_lexicon

__all__ = [
    "ArpaLM",
    "read_arpa",
    "read_lexicon",
]
