"""``ctc_decoder`` for PyTorch: torchaudio's CTC beam-search decoder, run by duoloss's core."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from duoloss.core._validate import dtype_name
from duoloss.core.decoding import ctc_beam as _cb
from duoloss.core.decoding.arpa import ArpaLM
from duoloss.core.decoding.ctc_beam import CTCDecoderLM, CTCDecoderLMState, CTCHypothesis

__all__ = ["CTCDecoder", "CTCDecoderLM", "CTCDecoderLMState", "ctc_decoder"]


class CTCDecoder(_cb.DecoderFrontend):
    """A CTC beam-search decoder for torch emissions; build it with
    [`ctc_decoder`][duoloss.torch.ctc_decoder].

    ``decoder(emissions, lengths)`` decodes a ``(B, T, C)`` batch (any device; the search runs
    on the CPU) and returns, per utterance, up to ``nbest`` hypotheses best first:
    ``CTCHypothesis(tokens, words, score, timesteps)`` with ``tokens`` a ``LongTensor`` and
    ``timesteps`` an ``IntTensor``, as torchaudio returns them.
    """

    def _arrays(self, emissions: torch.Tensor, lengths: Optional[torch.Tensor]
                ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        if not isinstance(emissions, torch.Tensor):
            raise TypeError(f"ctc_decoder: argument 'emissions' must be a torch.Tensor, got "
                            f"{type(emissions).__name__}")
        _cb.check_emissions(tuple(emissions.shape), dtype_name(emissions.dtype),
                            len(self.core.tokens))
        lens = None
        if lengths is not None:
            if not isinstance(lengths, torch.Tensor):
                lengths = torch.as_tensor(np.asarray(lengths))
            lens = _cb.check_lengths(lengths.detach().cpu().numpy(), dtype_name(lengths.dtype),
                                     emissions.shape[0], emissions.shape[1])
        em = emissions.detach()
        if em.dtype in (torch.float16, torch.bfloat16):
            em = em.float()
        return em.cpu().numpy(), lens

    def __call__(self, emissions: torch.Tensor, lengths: Optional[torch.Tensor] = None
                 ) -> List[List[CTCHypothesis]]:
        """Decode a batch.

        Args:
            emissions: ``(B, T, C)`` float tensor of log-probabilities (or scores) per frame.
            lengths: ``(B,)`` integer tensor of valid frames per utterance, or None for ``T``.

        Returns:
            Per utterance, up to ``nbest`` hypotheses, best first; ``[]`` for an utterance
            whose first ``length`` frames contain a NaN.
        """
        em, lens = self._arrays(emissions, lengths)
        return self._decode(em, lens, lambda x: torch.from_numpy(x.astype(np.int64)),
                            lambda x: torch.from_numpy(x.astype(np.int32)))

    def padded(self, emissions: torch.Tensor, lengths: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, ...]:
        """The hypotheses as padded tensors (see ``CTCDecoder.decode_padded`` in the core):
        ``(tokens, n_tokens, timesteps, scores, words, n_words)``."""
        em, lens = self._arrays(emissions, lengths)
        return tuple(torch.from_numpy(a) for a in self.core.decode_padded(em, lens))


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
    """A CTC beam-search decoder with torchaudio's ``ctc_decoder`` arguments.

    The search is that of flashlight-text (torchaudio's backend): lexicon-free, or restricted
    to the words of a lexicon; with an n-gram LM read from an ARPA file by duoloss itself (no
    KenLM needed), a Python LM (``CTCDecoderLM``) or none; with hotwords.  A hypothesis's
    score is the acoustic score of its best alignment (all merged alignments summed with
    ``log_add=True``) + ``lm_weight`` x the LM's log10 score + ``word_score`` per word +
    ``unk_score`` per unknown word + ``sil_score`` per silence frame + the hotword bonus.
    See the [decoding page](../../decoding.md) for the details and the differences from
    torchaudio.

    Args:
        tokens: the tokens, id -> token: a list, or a file with one token per line (several
            tokens on a line share the id).  The emissions' ``C`` must be at least
            ``len(tokens)``; classes past the tokens (a padded vocabulary) are never emitted,
            as in torchaudio.
        lexicon: a lexicon file (``word t o k e n |`` per line, several spellings per word
            allowed), or None for lexicon-free decoding.
        lm: an ARPA file path (or a KenLM binary when the ``kenlm`` package is installed), an
            ``ArpaLM``, a ``CTCDecoderLM``, or None.  With a lexicon the LM scores words;
            without one it scores tokens.
        nbest: how many hypotheses to return per utterance.
        beam_size: hypotheses kept after each frame.
        beam_size_token: tokens tried per frame (the best ones); None for all.
        beam_threshold: hypotheses more than this below the frame's best are dropped.
        lm_weight: weight of the LM's log10 scores.
        word_score: added per word (lexicon decoding).
        unk_score: added per unknown word (a spelling that is a prefix in the lexicon but no
            word); ``-inf`` (default) disables unknown words.
        sil_score: added per frame of silence.
        log_add: merge the alignments of a hypothesis by log-sum-exp instead of max.
        blank_token: the CTC blank.
        sil_token: the silence (word boundary) token.
        unk_word: the word reported for an unknown word.
        hotwords: phrases to boost: each a str (weight ``hotword_weight``) or a
            ``(phrase, weight)`` pair.  A hypothesis earns the ``weight`` of every phrase it
            spells, each time (a phrase inside a longer, unfinished one included); on the
            way a phrase of ``n`` units (tokens, or words with a lexicon) holds
            ``weight / n`` per matched unit, taken back when the phrase is abandoned.
        hotword_weight: weight of the hotwords given as plain strings.
        lm_dict: torchaudio's ``lm_dict``: a file of the LM's words, one per line in the LM's
            index order.  With a lexicon a ``CTCDecoderLM`` sees each word as its index in
            this file (without ``lm_dict``: its index in the lexicon, ``unk_word`` last), and
            the file must list every lexicon word and ``unk_word``; without a lexicon a
            ``CTCDecoderLM`` sees token ids, and an n-gram LM scores token ``i`` as the word
            on line ``i``.  An ARPA LM with a lexicon looks words up by name either way.

    Returns:
        A callable ``decoder(emissions (B, T, C), lengths (B,) or None)`` returning, per
        utterance, a list of up to ``nbest`` ``CTCHypothesis(tokens, words, score, timesteps)``,
        best first (``[]`` for an utterance with NaN emissions).

    Raises:
        ValueError: naming ``ctc_decoder`` and the argument (and the file and line) for an
            unknown blank or silence token, a malformed lexicon or ARPA file, a word spelled with
            a token not in ``tokens``, bad numbers; at call time for emissions with fewer classes
            than ``tokens`` and negative or too-long lengths.
        TypeError: for arguments of the wrong type.

    Examples:
        Two frames, the first ``a``, the second blank; lexicon-free, the hypothesis starts and
        ends in silence as torchaudio reports it, and its score is ``log 0.7 + log 0.8``:

        >>> import math, torch
        >>> import duoloss.torch as dt
        >>> decoder = dt.ctc_decoder(["-", "|", "a", "b"])
        >>> em = torch.tensor([[[.1, .1, .7, .1], [.8, .1, .05, .05]]]).log()
        >>> hyp = decoder(em)[0][0]
        >>> decoder.idxs_to_tokens(hyp.tokens), hyp.timesteps.tolist()
        (['|', 'a', '|'], [0, 1, 3])
        >>> abs(hyp.score - math.log(0.7 * 0.8)) < 1e-6
        True
    """
    return CTCDecoder(_cb.build_decoder(**locals()))
