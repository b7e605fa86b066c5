"""torchaudio's own ``ctc_decoder`` tests, run against ``duoloss.torch.ctc_decoder``.

Our rewrite of pytorch/audio's ``test/torchaudio_unittest/models/decoder/ctc_decoder_test.py``
(and the LMs of ``ctc_decoder_utils.py``) in pytest: the same cases and assertions, with
duoloss's imports.  Their assets (a 7-token list, a 3-word lexicon, a 3-gram ARPA LM and two
LM word lists) are recreated under ``tests/data/torchaudio_decoder/`` (torchaudio is BSD-2;
see the README there).  Emissions are ``torch.rand(4, 15, 8)``: 8 classes for 7 tokens, as
torchaudio's tests use them.

Left out or adapted, because they depend on torchaudio's private helpers:

* ``test_get_timesteps`` and ``test_get_tokens_and_idxs`` call the decoder's private
  ``_get_timesteps``/``_get_tokens``; duoloss computes the same in its core (tested in
  ``test_decode_ctc_beam.py``: tokens and timesteps against exhaustive search).
* ``test_custom_kenlm_decoder`` wraps torchaudio's private ``_KenLM``; here the Python LM
  wraps duoloss's ``read_arpa`` model instead (the same comparison: a Python LM against the
  built-in ARPA LM on the same file).
* ``BiasedLM`` reads its word list with torchaudio's private ``_Dictionary``; here a plain
  list of the file's lines.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from duoloss.core.decoding import read_arpa                      # noqa: E402
from duoloss.torch import CTCDecoderLM, CTCDecoderLMState, ctc_decoder   # noqa: E402

ASSETS = Path(__file__).resolve().parent / "data" / "torchaudio_decoder"
NUM_TOKENS = 8


def get_asset_path(name: str) -> str:
    return str(ASSETS / name.split("/", 1)[1])


def _same(a, b) -> bool:
    """torchaudio's ``assertEqual`` on lists of hypothesis lists."""
    if len(a) != len(b):
        return False
    for ha, hb in zip(a, b):
        if len(ha) != len(hb):
            return False
        for x, y in zip(ha, hb):
            if not (torch.equal(x.tokens, y.tokens) and x.words == y.words
                    and torch.equal(x.timesteps, y.timesteps)
                    and x.score == pytest.approx(y.score, rel=1.3e-6, abs=1e-5)):
                return False
    return True


# ------------------------------------------------------------------ ctc_decoder_utils.py

class CustomZeroLM(CTCDecoderLM):
    def __init__(self):
        CTCDecoderLM.__init__(self)

    def start(self, start_with_nothing: bool):
        return CTCDecoderLMState()

    def score(self, state: CTCDecoderLMState, token_index: int):
        return (state.child(token_index), 0.0)

    def finish(self, state: CTCDecoderLMState):
        return (state, 0.0)


class CustomArpaLM(CTCDecoderLM):
    """torchaudio's ``CustomKenLM`` with duoloss's ARPA reader in place of ``_KenLM``: units
    are the lexicon's words in file order (then ``<unk>``), as torchaudio's word dict."""

    def __init__(self, arpa_file, dict_file):
        CTCDecoderLM.__init__(self)
        self.model = read_arpa(arpa_file)
        words = [line.split()[0] for line in Path(dict_file).read_text().splitlines() if line]
        self.units = [self.model.word_id(w) for w in words + ["<unk>"]]

    def start(self, start_with_nothing: bool):
        return () if start_with_nothing else self.model.begin()

    def score(self, state, token_index: int):
        p, ctx = self.model.score(state, self.units[token_index])
        return ctx, p

    def finish(self, state):
        p, ctx = self.model.score(state, self.model.eos)
        return ctx, p


class BiasedLM(torch.nn.Module):
    def __init__(self, dict_file, keyword):
        super(BiasedLM, self).__init__()
        self.dictionary = [line.strip() for line in Path(dict_file).read_text().splitlines()
                           if line.strip()]
        self.keyword = keyword

    def forward(self, token_idx):
        if self.dictionary[token_idx] == self.keyword:
            return torch.tensor(10)
        elif self.dictionary[token_idx] == "<unk>":
            return torch.tensor(-torch.inf)
        return torch.tensor(-10)


class CustomBiasedLM(CTCDecoderLM):
    def __init__(self, model, dict_file):
        CTCDecoderLM.__init__(self)
        self.model = model
        self.vocab = [line.strip() for line in Path(dict_file).read_text().splitlines()
                      if line.strip()]
        self.eos = self.vocab.index("|")
        self.states = {}

        model.eval()

    def start(self, start_with_nothing: bool = False):
        state = CTCDecoderLMState()
        with torch.no_grad():
            score = self.model(self.eos)

        self.states[state] = score
        return state

    def score(self, state: CTCDecoderLMState, token_index: int):
        outstate = state.child(token_index)
        if outstate not in self.states:
            score = self.model(token_index)
            self.states[outstate] = score
        score = self.states[outstate]

        return outstate, score

    def finish(self, state: CTCDecoderLMState):
        return self.score(state, self.eos)


# ------------------------------------------------------------------ ctc_decoder_test.py

def _get_custom_kenlm(kenlm_file):
    dict_file = get_asset_path("decoder/lexicon.txt")
    return CustomArpaLM(kenlm_file, dict_file)


def _get_biased_nnlm(dict_file, keyword):
    model = BiasedLM(dict_file, keyword)
    return CustomBiasedLM(model, dict_file)


def _get_decoder(tokens=None, lm=None, use_lexicon=True, **kwargs):
    lexicon_file = get_asset_path("decoder/lexicon.txt") if use_lexicon else None
    if tokens is None:
        tokens = get_asset_path("decoder/tokens.txt")

    return ctc_decoder(
        lexicon=lexicon_file,
        tokens=tokens,
        lm=lm,
        **kwargs,
    )


def _get_emissions():
    B, T, N = 4, 15, NUM_TOKENS
    return torch.rand(B, T, N)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)       # TorchaudioTestCase seeds every test


@pytest.mark.parametrize("tokens,lm,use_lexicon", list(itertools.product(
    [get_asset_path("decoder/tokens.txt"), ["-", "|", "f", "o", "b", "a", "r"]],
    [None, get_asset_path("decoder/kenlm.arpa")],
    [True, False])))
def test_construct_basic_decoder(tokens, lm, use_lexicon):
    _get_decoder(tokens=tokens, lm=lm, use_lexicon=use_lexicon)


@pytest.mark.parametrize("use_lexicon", [True, False])
def test_shape(use_lexicon):
    emissions = _get_emissions()
    decoder = _get_decoder(use_lexicon=use_lexicon)

    results = decoder(emissions)
    assert len(results) == emissions.shape[0]


@pytest.mark.parametrize("use_lexicon", [True, False])
def test_timesteps_shape(use_lexicon):
    """Each token should correspond with a timestep"""
    emissions = _get_emissions()
    decoder = _get_decoder(use_lexicon=use_lexicon)

    results = decoder(emissions)
    for i in range(emissions.shape[0]):
        result = results[i][0]
        assert result.tokens.shape == result.timesteps.shape


def test_no_lm_decoder():
    """Check that the following produce the same result
    - using no LM (C++ based implementation)
    - using no LM (Custom Python based wrapper)
    - using a (Ken)LM with 0 weight
    """
    emissions = _get_emissions()
    custom_zerolm = CustomZeroLM()
    zerolm_decoder_custom = _get_decoder(lm=custom_zerolm)
    zerolm_decoder_cpp = _get_decoder(lm=None)
    kenlm_file = get_asset_path("decoder/kenlm.arpa")
    kenlm_decoder = _get_decoder(lm=kenlm_file, lm_weight=0)

    zerolm_custom_results = zerolm_decoder_custom(emissions)
    zerolm_cpp_results = zerolm_decoder_cpp(emissions)
    kenlm_results = kenlm_decoder(emissions)

    assert _same(zerolm_cpp_results, zerolm_custom_results)
    assert _same(zerolm_cpp_results, kenlm_results)


def test_custom_kenlm_decoder():
    """Check that a custom Python LM wrapper of the ARPA model produces the same results as
    the built-in ARPA LM"""
    emissions = _get_emissions()

    kenlm_file = get_asset_path("decoder/kenlm.arpa")
    custom_kenlm = _get_custom_kenlm(kenlm_file)
    kenlm_decoder_custom = _get_decoder(lm=custom_kenlm)
    kenlm_decoder_cpp = _get_decoder(lm=kenlm_file)

    kenlm_custom_results = kenlm_decoder_custom(emissions)
    kenlm_cpp_results = kenlm_decoder_cpp(emissions)

    assert _same(kenlm_custom_results, kenlm_cpp_results)


@pytest.mark.parametrize("lm_dict,keyword,use_lexicon", [
    (get_asset_path("decoder/nnlm_lex_dict.txt"), "foo", True),
    (get_asset_path("decoder/nnlm_lexfree_dict.txt"), "f", False),
])
def test_custom_nnlm_decoder(lm_dict, keyword, use_lexicon):
    """Check that biased NNLM only produces biased words"""
    emissions = _get_emissions()
    custom_nnlm = _get_biased_nnlm(lm_dict, keyword)
    nnlm_decoder = _get_decoder(lm=custom_nnlm, lm_dict=lm_dict, use_lexicon=use_lexicon,
                                lm_weight=10)
    nnlm_results = nnlm_decoder(emissions)

    if use_lexicon:
        output = [result[0].words for result in nnlm_results]
    else:
        tokens = [nnlm_decoder.idxs_to_tokens(result[0].tokens) for result in nnlm_results]
        output = [list(filter(("|").__ne__, t)) for t in tokens]  # filter out silence characters

    lens = [len(out) for out in output]
    expected = [[keyword] * len for len in lens]  # all of output should match the biased keyword
    assert expected == output


@pytest.mark.parametrize("tokens", [get_asset_path("decoder/tokens.txt"),
                                    ["-", "|", "f", "o", "b", "a", "r"]])
def test_index_to_tokens(tokens):
    # decoder tokens: '-' '|' 'f' 'o' 'b' 'a' 'r'
    decoder = _get_decoder(tokens)

    idxs = torch.LongTensor((1, 2, 1, 3, 5))
    tokens = decoder.idxs_to_tokens(idxs)

    expected_tokens = ["|", "f", "|", "o", "a"]
    assert tokens == expected_tokens
