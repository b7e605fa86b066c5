"""``ctc_decoder`` for JAX: torchaudio's CTC beam-search decoder, run by duoloss's core.

Eager calls hand the emissions to the core and return ``jnp`` arrays; ``decoder.padded`` is
one ``pure_callback`` returning fixed-shape arrays, usable inside ``jax.jit``.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from duoloss.core._validate import dtype_name
from duoloss.core.decoding import ctc_beam as _cb
from duoloss.core.decoding.arpa import ArpaLM
from duoloss.core.decoding.ctc_beam import CTCDecoderLM, CTCDecoderLMState, CTCHypothesis

from ._callback import _writeable
from ._callback import pure_callback

__all__ = ["CTCDecoder", "CTCDecoderLM", "CTCDecoderLMState", "ctc_decoder"]


def _concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


class CTCDecoder(_cb.DecoderFrontend):
    """A CTC beam-search decoder for JAX emissions; build it with
    [`ctc_decoder`][duoloss.jax.ctc_decoder].

    ``decoder(emissions, lengths)`` decodes a ``(B, T, C)`` batch eagerly and returns, per
    utterance, up to ``nbest`` hypotheses best first: ``CTCHypothesis(tokens, words, score,
    timesteps)`` with ``tokens`` and ``timesteps`` as ``jnp`` integer arrays.  Inside
    ``jax.jit`` use ``decoder.padded(emissions, lengths)`` (fixed-shape arrays, one host
    callback).
    """

    def _check(self, emissions: Any, lengths: Any) -> Tuple[Any, Optional[Any]]:
        if not hasattr(emissions, "shape") or not hasattr(emissions, "dtype"):
            if isinstance(emissions, (str, bytes)):
                raise TypeError(f"ctc_decoder: argument 'emissions' must be an array, got "
                                f"{type(emissions).__name__}")
            try:
                emissions = jnp.asarray(emissions)
            except TypeError as err:
                raise TypeError(f"ctc_decoder: argument 'emissions' must be an array, got "
                                f"{type(emissions).__name__}") from err
        _cb.check_emissions(tuple(emissions.shape), dtype_name(emissions.dtype),
                            len(self.core.tokens))
        if lengths is not None:
            if not hasattr(lengths, "dtype"):
                lengths = np.asarray(lengths)
            if _concrete(lengths):
                _cb.check_lengths(np.asarray(lengths), dtype_name(lengths.dtype),
                                  emissions.shape[0], emissions.shape[1])
            elif dtype_name(lengths.dtype) not in _cb._INTS or tuple(lengths.shape) != (emissions.shape[0],):
                _cb.check_lengths(np.zeros(lengths.shape, np.int64), dtype_name(lengths.dtype),
                                  emissions.shape[0], emissions.shape[1])
        return emissions, lengths

    def __call__(self, emissions: ArrayLike, lengths: Optional[ArrayLike] = None
                 ) -> List[List[CTCHypothesis]]:
        """Decode a batch eagerly.

        Args:
            emissions: ``(B, T, C)`` float array of log-probabilities (or scores) per frame.
            lengths: ``(B,)`` integer array of valid frames per utterance, or None for ``T``.

        Returns:
            Per utterance, up to ``nbest`` hypotheses, best first; ``[]`` for an utterance
            whose first ``length`` frames contain a NaN.
        """
        emissions, lengths = self._check(emissions, lengths)
        if not (_concrete(emissions) and (lengths is None or _concrete(lengths))):
            raise TypeError("ctc_decoder: the decoder returns Python lists and cannot run on "
                            "traced arrays (inside jax.jit/vmap); use decoder.padded(emissions, "
                            "lengths) there")
        em = _writeable(np.asarray(jnp.asarray(emissions, jnp.float32)
                                   if dtype_name(emissions.dtype) in ("float16", "bfloat16")
                                   else emissions))
        lens = None if lengths is None else np.asarray(lengths).astype(np.int64)
        as_jnp = lambda x: jnp.asarray(x.astype(np.int32))    # noqa: E731
        return self._decode(em, lens, as_jnp, as_jnp)

    def padded(self, emissions: ArrayLike, lengths: Optional[ArrayLike] = None
               ) -> Tuple[jax.Array, ...]:
        """The hypotheses as fixed-shape arrays, through one ``jax.pure_callback`` (works
        under ``jax.jit``).

        Args:
            emissions: ``(B, T, C)`` float array.
            lengths: ``(B,)`` integer array, or None for ``T``.

        Returns:
            ``(tokens, n_tokens, timesteps, scores, words, n_words)``: ``(B, nbest, T + 2)``
            int32 token ids padded with -1, ``(B, nbest)`` int32 counts, ``(B, nbest, T + 2)``
            int32 timesteps padded with -1, ``(B, nbest)`` scores in the emissions' dtype
            (``-inf`` for missing hypotheses), ``(B, nbest, T + 1)`` int32 word ids (into
            ``decoder.words``) padded with -1, ``(B, nbest)`` int32 word counts.
        """
        emissions, lengths = self._check(emissions, lengths)
        emissions = jnp.asarray(emissions)
        if dtype_name(emissions.dtype) in ("float16", "bfloat16"):
            emissions = emissions.astype(jnp.float32)
        B, T = emissions.shape[0], emissions.shape[1]
        nb = self.core.nbest
        if lengths is None:
            lengths = jnp.full((B,), T, jnp.int32)
        lengths = jnp.asarray(lengths).astype(jnp.int32)
        sdt = emissions.dtype
        specs = (jax.ShapeDtypeStruct((B, nb, T + 2), jnp.int32),
                 jax.ShapeDtypeStruct((B, nb), jnp.int32),
                 jax.ShapeDtypeStruct((B, nb, T + 2), jnp.int32),
                 jax.ShapeDtypeStruct((B, nb), sdt),
                 jax.ShapeDtypeStruct((B, nb, T + 1), jnp.int32),
                 jax.ShapeDtypeStruct((B, nb), jnp.int32))
        core = self.core

        def host(em, lens):
            lens = np.asarray(lens).astype(np.int64)
            if (lens < 0).any() or (lens > T).any():   # traced lengths: checked here
                lens = np.clip(lens, 0, T)
            out = core.decode_padded(np.asarray(em), lens)
            return out[:3] + (out[3].astype(sdt),) + out[4:]

        return tuple(pure_callback(host, specs, emissions, lengths, vmap_method="sequential"))


def ctc_decoder(tokens: Union[str, "os.PathLike[str]", Sequence[str]],
                lexicon: Optional[Union[str, "os.PathLike[str]"]] = None,
                lm: Optional[Union[str, "os.PathLike[str]", ArpaLM, CTCDecoderLM]] = None,
                nbest: int = 1, beam_size: int = 50, beam_size_token: Optional[int] = None,
                beam_threshold: float = 50, lm_weight: float = 2, word_score: float = 0,
                unk_score: float = float("-inf"), sil_score: float = 0, log_add: bool = False,
                blank_token: str = "-", sil_token: str = "|", unk_word: str = "<unk>",
                hotwords: Optional[Sequence[Union[str, Tuple[str, float]]]] = None,
                hotword_weight: float = 10.0,
                lm_dict: Optional[Union[str, "os.PathLike[str]"]] = None) -> CTCDecoder:
    """A CTC beam-search decoder with torchaudio's ``ctc_decoder`` arguments, for JAX.

    The same arguments, search and results as [`duoloss.torch.ctc_decoder`][duoloss.torch.ctc_decoder]
    (the same core): ``tokens`` and ``timesteps`` of each hypothesis are ``jnp`` arrays.
    Inside ``jax.jit`` use the decoder's ``padded`` method (one host callback).

    Args:
        tokens: the tokens, id -> token: a list, or a file with one token per line (the
            emissions may have more classes: those past the tokens are never emitted).
        lexicon: a lexicon file (``word t o k e n |`` per line), or None for lexicon-free.
        lm: an ARPA file path (or a KenLM binary when ``kenlm`` is installed), an ``ArpaLM``,
            a ``CTCDecoderLM``, or None.
        nbest: how many hypotheses to return per utterance.
        beam_size: hypotheses kept after each frame.
        beam_size_token: tokens tried per frame (the best ones); None for all.
        beam_threshold: hypotheses more than this below the frame's best are dropped.
        lm_weight: weight of the LM's log10 scores.
        word_score: added per word (lexicon decoding).
        unk_score: added per unknown word; ``-inf`` disables unknown words.
        sil_score: added per frame of silence.
        log_add: merge the alignments of a hypothesis by log-sum-exp instead of max.
        blank_token: the CTC blank.
        sil_token: the silence (word boundary) token.
        unk_word: the word reported for an unknown word.
        hotwords: phrases to boost: each a str or a ``(phrase, weight)`` pair.
        hotword_weight: weight of the hotwords given as plain strings.
        lm_dict: torchaudio's ``lm_dict`` (the LM's words, one per line), as in torch.

    Returns:
        A callable ``decoder(emissions (B, T, C), lengths (B,) or None)`` returning, per
        utterance, up to ``nbest`` ``CTCHypothesis`` best first (``[]`` for NaN emissions).

    Raises:
        ValueError: naming ``ctc_decoder`` and the argument (and file and line), as in torch.
        TypeError: for arguments of the wrong type.

    Examples:
        >>> import math
        >>> import jax.numpy as jnp
        >>> import duoloss.jax as dj
        >>> decoder = dj.ctc_decoder(["-", "|", "a", "b"])
        >>> em = jnp.log(jnp.array([[[.1, .1, .7, .1], [.8, .1, .05, .05]]]))
        >>> hyp = decoder(em)[0][0]
        >>> decoder.idxs_to_tokens(hyp.tokens), hyp.timesteps.tolist()
        (['|', 'a', '|'], [0, 1, 3])
        >>> abs(hyp.score - math.log(0.7 * 0.8)) < 1e-6
        True
    """
    return CTCDecoder(_cb.build_decoder(**locals()))
