"""ARPA language models and lexicon files read by duoloss (``duoloss.core.decoding``).

* ``ArpaLM.score``/``sentence_log10`` equal a hand computation of ARPA backoff semantics on a
  tiny trigram file whose numbers are chosen so that every expected value is written out below
  (``p(c | a b)`` found, ``bo(a b) + bo(b) + p(a)`` after two back-offs, a history that is not an
  n-gram contributing no backoff, ``<unk>``), for tab- and space-separated fields, a unigram
  model and a 4-gram model;
* the same scores as KenLM inside flashlight-text (``flashlight.lib.text.decoder.KenLM``) on a
  random 4-gram ARPA file (skipped when flashlight-text is not installed);
* every malformed file raises a ``ValueError`` naming the function, the file and the line.
"""
from __future__ import annotations


import numpy as np
import pytest

from duoloss.core.decoding import ArpaLM, read_arpa, read_lexicon

import _decode_peers as P

TRIGRAM = """\
\\data\\
ngram 1=6
ngram 2=4
ngram 3=2

\\1-grams:
-99\t<s>\t-0.5
-0.7\ta\t-0.25
-0.9\tb\t-0.125
-1.1\tc\t-0.375
-0.6\t</s>
-2.0\t<unk>

\\2-grams:
-0.3\t<s> a\t-0.0625
-0.4\ta b\t-0.2
-0.5\tb c\t-0.15
-0.2\tc </s>

\\3-grams:
-0.05\t<s> a b
-0.08\ta b c

\\end\\
"""


def _write(tmp_path, text, name="lm.arpa"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def trigram(tmp_path):
    return read_arpa(_write(tmp_path, TRIGRAM))


def _ids(lm, *words):
    return tuple(lm.word_index[w] for w in words)


def test_structure(trigram):
    lm = trigram
    assert isinstance(lm, ArpaLM)
    assert lm.order == 3
    assert lm.words[:6] == ["<s>", "a", "b", "c", "</s>", "<unk>"]
    assert (lm.bos, lm.eos, lm.unk) == (0, 4, 5)
    assert lm.begin() == (0,)
    assert [len(g) for g in lm.ngrams] == [6, 4, 2]
    assert lm.ngrams[1][_ids(lm, "a", "b")] == (-0.4, -0.2)
    assert lm.ngrams[2][_ids(lm, "a", "b", "c")] == (-0.08, 0.0)
    assert lm.ngrams[0][_ids(lm, "</s>")] == (-0.6, 0.0)


@pytest.mark.parametrize("context,word,expected,new", [
    (("<s>", "a"), "b", -0.05, ("a", "b")),                 # trigram found
    (("a", "b"), "c", -0.08, ("b", "c")),                   # trigram found
    (("<s>",), "a", -0.3, ("<s>", "a")),                    # bigram found
    (("a", "b"), "a", -0.2 + -0.125 + -0.7, ("a",)),        # bo(a b) + bo(b) + p(a)
    (("b", "c"), "</s>", -0.15 + -0.2, ("c", "</s>")),      # bo(b c) + p(</s> | c)
    (("<s>", "b"), "c", -0.5, ("b", "c")),                  # (<s> b) is no bigram: no backoff
    (("<s>",), "c", -0.5 + -1.1, ("c",)),                   # bo(<s>) + p(c)
    (("c",), "a", -0.375 + -0.7, ("a",)),                   # bo(c) + p(a)
    (("c", "a"), "</s>", -0.25 + -0.6, ("</s>",)),          # (c a) no bigram; bo(a) + p(</s>)
    ((), "b", -0.9, ("b",)),                                # empty history: the unigram
    (("x", "y", "<s>", "a"), "b", -0.05, ("a", "b")),       # only the last order-1 words count
    (("a",), "<unk>", -0.25 + -2.0, ()),                    # <unk>: bo(a) + p(<unk>)
])
def test_score_is_the_hand_computed_arpa_backoff(trigram, context, word, expected, new):
    lm = trigram
    ctx = tuple(lm.word_index.get(w, lm.unk) for w in context)
    score, state = lm.score(ctx, lm.word_index[word])
    assert score == pytest.approx(expected, abs=1e-6)
    # the new context: the longest suffix of context + word that is an n-gram (<= 2 words)
    if word == "<unk>":
        assert state == (lm.unk,)
    else:
        assert state == tuple(lm.word_index[w] for w in new)


def test_sentence_totals_are_hand_computed(trigram):
    lm = trigram
    # <s> a b c </s>: p(a|<s>) + p(b|<s> a) + p(c|a b) + bo(b c) + p(</s>|c)
    assert lm.sentence_log10(["a", "b", "c"]) == pytest.approx(-0.3 - 0.05 - 0.08 - 0.15 - 0.2,
                                                               abs=1e-6)
    # <s> c a </s>: bo(<s>) + p(c); bo(c) + p(a); bo(a) + p(</s>)
    assert lm.sentence_log10(["c", "a"]) == pytest.approx(
        (-0.5 - 1.1) + (-0.375 - 0.7) + (-0.25 - 0.6), abs=1e-6)
    # an unknown word is <unk>: bo(<s>) + p(<unk>); then (<unk> </s>) backs off to p(</s>)
    assert lm.sentence_log10(["zzz"]) == pytest.approx(-0.5 - 2.0 - 0.6, abs=1e-6)
    # without <s>: p(a) + p(b|a) ; without </s>
    assert lm.sentence_log10(["a", "b"], bos=False, eos=False) == pytest.approx(-0.7 - 0.4,
                                                                                abs=1e-6)
    assert lm.word_id("zzz") == lm.unk


def test_space_separated_fields_and_blank_lines_read_the_same(tmp_path, trigram):
    spaced = TRIGRAM.replace("\t", "  ").replace("\\data\\\n", "\n\n\\data\\\n")
    lm = read_arpa(_write(tmp_path, spaced, "spaced.arpa"))
    assert lm.words == trigram.words
    assert lm.ngrams == trigram.ngrams


def test_unigram_model_and_missing_specials(tmp_path):
    text = "\\data\\\nngram 1=2\n\n\\1-grams:\n-0.25 x\n-0.5 y\n\n\\end\\\n"
    lm = read_arpa(_write(tmp_path, text))
    assert lm.order == 1
    assert lm.words == ["x", "y", "<s>", "</s>", "<unk>"]
    # <unk> absent from the file: KenLM's default log10 probability -100
    assert lm.score((lm.word_index["x"],), lm.word_index["y"])[0] == pytest.approx(-0.5)
    assert lm.score((), lm.unk) == (-100.0, ())
    assert lm.sentence_log10(["x", "y", "x"], eos=False) == pytest.approx(-1.0)


def test_fourgram_backoff_chain(tmp_path):
    text = """\\data\\
ngram 1=5
ngram 2=3
ngram 3=2
ngram 4=1

\\1-grams:
-99 <s> -0.1
-1.0 p -0.2
-1.5 q -0.3
-2.0 r -0.4
-0.5 </s>

\\2-grams:
-0.6 <s> p -0.05
-0.7 p q -0.15
-0.8 q r -0.25

\\3-grams:
-0.9 <s> p q -0.35
-0.45 p q r -0.55

\\4-grams:
-0.11 <s> p q r

\\end\\
"""
    lm = read_arpa(_write(tmp_path, text))
    i = lm.word_index
    assert lm.score((i["<s>"], i["p"], i["q"]), i["r"]) == (pytest.approx(-0.11),
                                                            (i["p"], i["q"], i["r"]))
    # p(</s> | p q r): bo(p q r) + bo(q r) + bo(r) + p(</s>)
    s, st = lm.score((i["p"], i["q"], i["r"]), i["</s>"])
    assert s == pytest.approx(-0.55 - 0.25 - 0.4 - 0.5)
    assert st == (i["</s>"],)
    # p(p | <s> p q): bo(<s> p q) + bo(p q) + bo(q) + p(p)
    assert lm.score((i["<s>"], i["p"], i["q"]), i["p"])[0] == pytest.approx(
        -0.35 - 0.15 - 0.3 - 1.0)
    # <s> p q r </s>
    assert lm.sentence_log10(["p", "q", "r"]) == pytest.approx(
        -0.6 - 0.9 - 0.11 + (-0.55 - 0.25 - 0.4 - 0.5))


@pytest.mark.skipif(not P.flashlight_available(), reason="flashlight-text is not installed")
@pytest.mark.parametrize("randomised", [False, True])
def test_scores_equal_kenlm_in_flashlight(tmp_path, randomised):
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    rng = np.random.default_rng(7 + randomised)
    vocab = P.make_vocabulary(rng, 40)
    sentences = P.WordChain(rng, vocab).sentences(rng, 300)
    tables = P.estimate_ngrams(sentences, 4)
    if randomised:  # arbitrary scores and backoffs (also positive ones)
        tables = P.random_scores(tables, rng)
    path = P.write_arpa_tables(str(tmp_path / "r.arpa"), tables)
    lm = read_arpa(path)
    assert [len(g) for g in lm.ngrams] == [len(t) for t in tables]

    query = vocab + ["</s>", "<unk>", "never-seen"]
    kenlm = KenLM(path, Dictionary(query))
    kid = {w: k for k, w in enumerate(query)}
    n_checked = 0
    for i, sent in enumerate(sentences[:40]
                             + P.WordChain(rng, vocab + ["never-seen"]).sentences(rng, 40)):
        null = i % 4 == 3  # KenLM's start(True): no <s>, an empty context
        ks = kenlm.start(null)
        ctx = () if null else lm.begin()
        for w in list(sent) + ["</s>"]:
            ks, ref = kenlm.score(ks, kid[w])
            got, ctx = lm.score(ctx, lm.word_id(w))
            assert got == pytest.approx(ref, abs=2e-5), (sent, w)  # KenLM keeps float32
            n_checked += 1
    assert n_checked > 400


# ----------------------------------------------------------------------------- errors
def _expect(tmp_path, text, line, match):
    path = _write(tmp_path, text, "bad.arpa")
    with pytest.raises(ValueError) as info:
        read_arpa(path)
    msg = str(info.value)
    assert msg.startswith("read_arpa: "), msg
    where = f"{path}:{line}" if line is not None else path
    assert where in msg, msg
    assert match in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"read_arpa: ARPA file .*nope\.arpa' does not exist"):
        read_arpa(str(tmp_path / "nope.arpa"))
    with pytest.raises(ValueError, match="read_arpa: .* is a directory"):
        read_arpa(str(tmp_path))
    with pytest.raises(TypeError, match="read_arpa: argument 'path' must be a str"):
        read_arpa(3)  # type: ignore[arg-type]


def test_empty_and_wrong_header(tmp_path):
    _expect(tmp_path, "\n\n", None, "the file is empty")
    _expect(tmp_path, "\n# comment\n\\data\\\n", 2, "expected the ARPA header '\\data\\'")
    _expect(tmp_path, "\\data\\\n\n\\1-grams:\n-1 a\n\\end\\\n", 3, "no 'ngram 1=<count>'")
    _expect(tmp_path, "\\data\\\nngram 2=1\n", 2, "expected 'ngram 1=<count>'")
    _expect(tmp_path, "\\data\\\nngram 1=1\nngram 1=1\n", 3, "expected 'ngram 2=<count>'")
    _expect(tmp_path, "\\data\\\nngram 1=x\n", 2, "expected 'ngram 1=<count>'")


def test_counts_that_disagree(tmp_path):
    # the error points at the count line (line 2 for 1-grams, line 3 for 2-grams)
    bad1 = TRIGRAM.replace("ngram 1=6", "ngram 1=7")
    _expect(tmp_path, bad1, 2, "'ngram 1=7' disagrees with the 6 entries")
    bad2 = TRIGRAM.replace("ngram 2=4", "ngram 2=3")
    _expect(tmp_path, bad2, 3, "'ngram 2=3' disagrees with the 4 entries")


def test_non_numeric_scores(tmp_path):
    _expect(tmp_path, TRIGRAM.replace("-0.9\tb\t-0.125", "-0.9\tb\tbo"), 9,
            "the log10 backoff must be a number, got 'bo'")
    _expect(tmp_path, TRIGRAM.replace("-0.4\ta b", "high\ta b"), 16,
            "the log10 probability must be a number, got 'high'")
    _expect(tmp_path, TRIGRAM.replace("-0.08\ta b c", "nan\ta b c"), 22,
            "the log10 probability must be a number, got 'nan'")


def test_wrong_number_of_fields(tmp_path):
    _expect(tmp_path, TRIGRAM.replace("-0.5\tb c\t-0.15", "-0.5\tb c d e"), 17,
            "a 2-gram entry must have 3 or 4")
    _expect(tmp_path, TRIGRAM.replace("-0.05\t<s> a b", "-0.05\t<s> a b\t-0.1"), 21,
            "a 3-gram entry must have 4 (log10 probability and 3 words) fields, got 5")
    _expect(tmp_path, TRIGRAM.replace("-2.0\t<unk>", "-2.0"), 12, "a 1-gram entry must have")


def test_sections_and_end(tmp_path):
    _expect(tmp_path, TRIGRAM.replace("\\end\\\n", ""), None, "missing '\\end\\'")
    _expect(tmp_path, TRIGRAM.replace("\\3-grams:", "\\4-grams:"), 20,
            "expected the section header '\\3-grams:', got '\\4-grams:'")
    cut = TRIGRAM.split("\\3-grams:")[0] + "\\end\\\n"
    _expect(tmp_path, cut, 20, "'\\end\\' before the '\\3-grams:' section")
    _expect(tmp_path, TRIGRAM.split("\\3-grams:")[0], None,
            "the file ends before the '\\3-grams:' section")
    extra = TRIGRAM.replace("\\end\\", "\\4-grams:\n-1 a b c a\n\\end\\")
    _expect(tmp_path, extra, 24, "expected '\\end\\' after the '\\3-grams:' section")


def test_unknown_words_and_duplicates(tmp_path):
    _expect(tmp_path, TRIGRAM.replace("-0.2\tc </s>", "-0.2\tc d"), 18,
            "the word 'd' of this 2-gram is not among the 1-grams")
    _expect(tmp_path, TRIGRAM.replace("-1.1\tc\t-0.375", "-1.1\ta\t-0.375"), 10,
            "the 1-gram 'a' appears twice")
    _expect(tmp_path, TRIGRAM.replace("-0.2\tc </s>", "-0.2\ta b"), 18,
            "the 2-gram 'a b' appears twice")


def test_gzip_and_not_utf8(tmp_path, trigram):
    import gzip

    path = tmp_path / "lm.arpa.gz"
    path.write_bytes(gzip.compress(TRIGRAM.encode()))
    lm = read_arpa(path)
    assert lm.words == trigram.words and lm.ngrams == trigram.ngrams
    path.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(ValueError, match="read_arpa: ARPA file .* is not a valid gzip file"):
        read_arpa(str(path))
    path = tmp_path / "latin1.arpa"
    path.write_bytes(TRIGRAM.replace("c", "\xe7").encode("latin-1"))
    with pytest.raises(ValueError, match="read_arpa: ARPA file .* is not UTF-8 text"):
        read_arpa(str(path))


# ---------------------------------------------------------------------------- lexicon
def test_read_lexicon_spellings(tmp_path):
    path = tmp_path / "lexicon.txt"
    path.write_text("hello\th e l l o |\nworld w o r l d |\n\nhello h e l o |\n"
                    "hello\th e l l o |\n")
    tokens = ["-", "|", "d", "e", "h", "l", "o", "r", "w"]
    t = {c: i for i, c in enumerate(tokens)}
    got = read_lexicon(str(path), tokens)
    assert got == [("hello", [[t[c] for c in "hello|"], [t[c] for c in "helo|"]]),
                   ("world", [[t[c] for c in "world|"]])]
    assert read_lexicon(path, t) == got  # a mapping token -> id, a PathLike


def test_read_lexicon_errors(tmp_path):
    tokens = ["-", "|", "a", "b"]
    path = tmp_path / "lexicon.txt"
    path.write_text("ab a b |\nba b a |\nabc a b c |\n")
    with pytest.raises(ValueError) as info:
        read_lexicon(str(path), tokens)
    assert str(info.value) == (f"read_lexicon: {path}:3: the word 'abc' is spelled with the "
                               "token 'c', which is not in 'tokens'")
    path.write_text("ab a b |\nba\n")
    with pytest.raises(ValueError, match=rf"read_lexicon: {path}:2: a lexicon line must be a "
                                         r"word followed by its spelling"):
        read_lexicon(str(path), tokens)
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="read_lexicon: lexicon file .* has no entries"):
        read_lexicon(str(path), tokens)
    with pytest.raises(ValueError, match="read_lexicon: lexicon file .*none.txt' does not exist"):
        read_lexicon(str(tmp_path / "none.txt"), tokens)
    with pytest.raises(TypeError, match="read_lexicon: argument 'tokens' must be a sequence"):
        read_lexicon(str(path), "ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="read_lexicon: argument 'path'"):
        read_lexicon(None, tokens)  # type: ignore[arg-type]
