"""ARPA n-gram language models, read by duoloss itself (no KenLM).

[`read_arpa`][duoloss.core.decoding.read_arpa] parses an ARPA text file into an
[`ArpaLM`][duoloss.core.decoding.ArpaLM]: plain Python dictionaries from word-id tuples to
``(log10 probability, log10 backoff)``.  ``ArpaLM.score`` is the reference semantics of the
model (the searches compile the same tables into numba arrays themselves):

.. math::

    \\log_{10} p(w \\mid h) =
    \\begin{cases}
      \\log_{10} p(h\\,w) & \\text{if } h\\,w \\text{ is an n-gram of the file} \\\\
      \\mathrm{bo}(h) + \\log_{10} p(w \\mid h_{2:}) & \\text{otherwise}
    \\end{cases}

with ``bo(h) = 0`` when ``h`` is not an n-gram of the file, exactly as SRILM and KenLM read
ARPA files.  Scores are base-10 logarithms, like KenLM's (and so like the ``lm_weight`` a
torchaudio/flashlight user tuned).
"""
from __future__ import annotations

import gzip
import math
import os
import re
import zlib
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ._text import ASCII_SPACE, fields as _fields, lines as _lines

__all__ = ["ArpaLM", "read_arpa"]

#: log10 probability given to ``<unk>`` when the file has no ``<unk>`` unigram (KenLM's default).
UNK_LOG10 = -100.0

_NGRAM_COUNT = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION = re.compile(r"^\\(\d+)-grams:$")


class ArpaLM:
    """An n-gram language model read from an ARPA file.

    Attributes:
        order: the model's order ``N`` (the longest n-gram).
        words: word id -> word; contains ``"<s>"``, ``"</s>"`` and ``"<unk>"`` (added with
            the usual scores when the file lacks them: ``<unk>`` gets log10 probability
            ``-100``, ``<s>`` ``-99``, ``</s>`` ``-100``, no backoff).
        word_index: word -> word id (inverse of ``words``).
        bos: id of ``"<s>"``.
        eos: id of ``"</s>"``.
        unk: id of ``"<unk>"``.
        ngrams: ``ngrams[k]`` maps each ``(k+1)``-gram (a tuple of ``k+1`` word ids) to
            ``(log10 probability, log10 backoff)``; the backoff is ``0.0`` where the file gives
            none (always for the highest order).
        path: the file the model was read from (None when built otherwise).

    Examples:
        >>> import tempfile, os
        >>> text = ("\\\\data\\\\\\nngram 1=3\\n\\n\\\\1-grams:\\n"
        ...         "-99\\t<s>\\n-0.3\\ta\\n-0.6\\t</s>\\n\\n\\\\end\\\\\\n")
        >>> path = os.path.join(tempfile.mkdtemp(), "lm.arpa")
        >>> _ = open(path, "w").write(text)
        >>> lm = read_arpa(path)
        >>> round(lm.sentence_log10(["a"]), 6)   # p(a) + p(</s>): a unigram model
        -0.9
    """

    def __init__(self, order: int, words: List[str],
                 ngrams: List[Dict[Tuple[int, ...], Tuple[float, float]]],
                 path: Optional[str] = None) -> None:
        self.order = int(order)
        self.words = list(words)
        self.word_index = {w: i for i, w in enumerate(self.words)}
        self.ngrams = ngrams
        self.path = path
        for special, logp in (("<s>", -99.0), ("</s>", -100.0), ("<unk>", UNK_LOG10)):
            if special not in self.word_index:
                self.word_index[special] = len(self.words)
                self.words.append(special)
                self.ngrams[0][(self.word_index[special],)] = (logp, 0.0)
        self.bos = self.word_index["<s>"]
        self.eos = self.word_index["</s>"]
        self.unk = self.word_index["<unk>"]

    def __repr__(self) -> str:
        counts = ", ".join(f"{k + 1}-grams: {len(g)}" for k, g in enumerate(self.ngrams))
        return f"ArpaLM(order={self.order}, {counts})"

    @property
    def vocab_size(self) -> int:
        """Number of words (``len(words)``)."""
        return len(self.words)

    def word_id(self, word: str) -> int:
        """Id of ``word``, or ``unk`` when the model does not know it."""
        return self.word_index.get(word, self.unk)

    def begin(self) -> Tuple[int, ...]:
        """The context at the start of a sentence: ``(bos,)``."""
        return (self.bos,)

    def score(self, context: Tuple[int, ...], word: int) -> Tuple[float, Tuple[int, ...]]:
        """log10 p(word | context) with ARPA backoff, and the context after ``word``.

        Args:
            context: word ids of the history, oldest first (only the last ``order - 1``
                matter); ``()`` for no history.
            word: the word id to score (``unk`` for a word the model does not know).

        Returns:
            ``(log10 probability, new context)``; the new context is the longest suffix of
            ``context + (word,)`` that is an n-gram of the model, at most ``order - 1`` long.
        """
        ngrams = self.ngrams
        n_max = self.order - 1
        ctx = tuple(context[-n_max:]) if n_max > 0 else ()
        if (word,) not in ngrams[0]:
            word = self.unk
        # Longest n-gram ending in word whose history is a suffix of ctx.
        total_bo = 0.0
        logp = None
        n = len(ctx)
        while n >= 0:
            hist = ctx[len(ctx) - n:]
            entry = ngrams[n].get(hist + (word,)) if n < len(ngrams) else None
            if entry is not None:
                logp = entry[0]
                break
            # Back off from hist: add its backoff weight (0 when hist is not an n-gram).
            if n > 0:
                h = ngrams[n - 1].get(hist)
                if h is not None:
                    total_bo += h[1]
            n -= 1
        if logp is None:  # unreachable: every word is a unigram
            logp = ngrams[0][(self.unk,)][0]
        full = ctx + (word,)
        new = ()
        for m in range(min(len(full), n_max), 0, -1):
            suffix = full[len(full) - m:]
            if suffix in ngrams[m - 1]:
                new = suffix
                break
        return total_bo + logp, new

    def sentence_log10(self, words: Sequence[str], bos: bool = True, eos: bool = True) -> float:
        """Total log10 probability of a sentence (KenLM's ``LanguageModel.score``).

        Args:
            words: the sentence's words; words the model does not know score as ``<unk>``.
            bos: start from ``<s>`` (otherwise from an empty context).
            eos: add ``log10 p(</s> | ...)`` at the end.

        Returns:
            The sum of the words' log10 probabilities.
        """
        ctx = self.begin() if bos else ()
        total = 0.0
        for w in words:
            s, ctx = self.score(ctx, self.word_id(w))
            total += s
        if eos:
            s, ctx = self.score(ctx, self.eos)
            total += s
        return total


def _q(text: str) -> str:
    """Quote a line for a message without doubling its backslashes (``'\\data\\'``)."""
    return "'" + text + "'"


def _err(path: str, lineno: Optional[int], msg: str) -> ValueError:
    where = f"{path}:{lineno}" if lineno is not None else f"{path}"
    return ValueError(f"read_arpa: {where}: {msg}")


def _float(path: str, lineno: int, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _err(path, lineno, f"{what} must be a number, got {text!r}") from None
    if math.isnan(value):
        raise _err(path, lineno, f"{what} must be a number, got {text!r}")
    return value


def read_arpa(path: Union[str, "os.PathLike[str]"]) -> ArpaLM:
    """Read an n-gram language model from an ARPA text file.

    Any order; fields separated by tabs or spaces (only: a word may contain any other
    character, a no-break space included); a UTF-8 byte-order mark before ``\\data\\`` is
    skipped; backoff weights optional (``0.0`` when absent); ``<s>``, ``</s>`` and ``<unk>``
    added when the file lacks them (see [`ArpaLM`][duoloss.core.decoding.ArpaLM]).  The whole file is checked before the model is
    returned.

    Args:
        path: the ARPA file: UTF-8 text, or that text gzip-compressed (``.arpa.gz``).

    Returns:
        The model, with ``ArpaLM.score`` giving ARPA/KenLM backoff semantics in log10.

    Raises:
        ValueError: naming ``read_arpa``, the file and the line, for a missing file, a file that
            does not start with ``\\data\\``, ``ngram k=N`` counts that are missing, out of order
            or disagree with the entries, a section out of order, an entry with the wrong number
            of fields or a non-numeric score, a word of a longer n-gram that is not a unigram, a
            repeated n-gram, or a missing ``\\end\\``.
        TypeError: when ``path`` is not a string or path.

    Examples:
        >>> from duoloss.core.decoding import read_arpa
        >>> lm = read_arpa("tests/data/tiny.arpa")        # doctest: +SKIP
        >>> lm.score(lm.begin(), lm.word_index["the"])    # doctest: +SKIP
        (-1.2, (1, 5))
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_arpa: argument 'path' must be a str or os.PathLike, "
                        f"got {type(path).__name__}")
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"read_arpa: ARPA file {spath!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"read_arpa: ARPA file {spath!r} is a directory") from None
    if data[:2] == b"\x1f\x8b":  # gzip (e.g. LibriSpeech's 4-gram.arpa.gz)
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"read_arpa: ARPA file {spath!r} is not a valid gzip file "
                             f"({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"read_arpa: ARPA file {spath!r} is not UTF-8 text ({e.reason} at "
                         f"byte {e.start})") from None
    return _parse(spath, _lines(text))


def _parse(path: str, lines: List[str]) -> ArpaLM:
    n_lines = len(lines)
    i = 0
    while i < n_lines and not lines[i].strip(ASCII_SPACE):
        i += 1
    if i == n_lines:
        raise _err(path, None, "the file is empty (expected an ARPA header '\\data\\')")
    head = lines[i].strip(ASCII_SPACE)
    if head != "\\data\\":
        hidden = sorted({f"U+{ord(c):04X}" for c in head if not c.isprintable()})
        raise _err(path, i + 1, f"expected the ARPA header '\\data\\', got {_q(head)}"
                                + (f" (with the invisible characters {', '.join(hidden)})"
                                   if hidden else ""))
    i += 1
    counts: List[int] = []
    count_lines: List[int] = []
    while i < n_lines:
        line = lines[i].strip(ASCII_SPACE)
        if not line:
            i += 1
            if counts:
                break
            continue
        m = _NGRAM_COUNT.match(line)
        if m is None:
            if line.startswith("\\"):
                break
            raise _err(path, i + 1, f"expected 'ngram {len(counts) + 1}=<count>', got {_q(line)}")
        k, c = int(m.group(1)), int(m.group(2))
        if k != len(counts) + 1:
            raise _err(path, i + 1, f"expected 'ngram {len(counts) + 1}=<count>' "
                                    f"(counts in increasing order), got {_q(line)}")
        counts.append(c)
        count_lines.append(i + 1)
        i += 1
    if not counts:
        raise _err(path, i + 1 if i < n_lines else None,
                   "no 'ngram 1=<count>' line after '\\data\\'")
    order = len(counts)
    words: List[str] = []
    word_index: Dict[str, int] = {}
    ngrams: List[Dict[Tuple[int, ...], Tuple[float, float]]] = [{} for _ in range(order)]
    for k in range(1, order + 1):
        while i < n_lines and not lines[i].strip(ASCII_SPACE):
            i += 1
        if i == n_lines:
            raise _err(path, None, f"the file ends before the '\\{k}-grams:' section "
                                   "(expected sections up to "
                                   f"'\\{order}-grams:' and then '\\end\\')")
        header = lines[i].strip(ASCII_SPACE)
        m = _SECTION.match(header)
        if m is None or int(m.group(1)) != k:
            if header == "\\end\\":
                raise _err(path, i + 1, f"'\\end\\' before the '\\{k}-grams:' section "
                                        f"('ngram {k}={counts[k - 1]}' announced it)")
            raise _err(path, i + 1, f"expected the section header '\\{k}-grams:', got {_q(header)}")
        i += 1
        table = ngrams[k - 1]
        n_entries = 0
        while i < n_lines:
            raw = lines[i]
            line = raw.strip(ASCII_SPACE)
            if not line:
                i += 1
                continue
            if line.startswith("\\"):
                break
            fields = _fields(line)
            lineno = i + 1
            if len(fields) not in (k + 1, k + 2) or (k == order and len(fields) != k + 1):
                expected = (f"{k + 1} (log10 probability and {k} word{'s' if k > 1 else ''})"
                            if k == order else
                            f"{k + 1} or {k + 2} (log10 probability, {k} "
                            f"word{'s' if k > 1 else ''}, optional log10 backoff)")
                raise _err(path, lineno, f"a {k}-gram entry must have {expected} fields, "
                                         f"got {len(fields)}: {_q(line)}")
            logp = _float(path, lineno, fields[0], "the log10 probability")
            bo = (_float(path, lineno, fields[k + 1], "the log10 backoff")
                  if len(fields) == k + 2 else 0.0)
            if k == 1:
                w = fields[1]
                if w in word_index:
                    raise _err(path, lineno, f"the 1-gram {w!r} appears twice")
                word_index[w] = len(words)
                words.append(w)
                table[(word_index[w],)] = (logp, bo)
            else:
                key = []
                for w in fields[1:k + 1]:
                    wid = word_index.get(w)
                    if wid is None:
                        raise _err(path, lineno, f"the word {w!r} of this {k}-gram is not "
                                                 "among the 1-grams")
                    key.append(wid)
                tkey = tuple(key)
                if tkey in table:
                    raise _err(path, lineno, f"the {k}-gram {' '.join(fields[1:k + 1])!r} "
                                             "appears twice")
                table[tkey] = (logp, bo)
            n_entries += 1
            i += 1
        if n_entries != counts[k - 1]:
            raise _err(path, count_lines[k - 1],
                       f"'ngram {k}={counts[k - 1]}' disagrees with the {n_entries} entries of "
                       f"the '\\{k}-grams:' section")
    while i < n_lines and not lines[i].strip(ASCII_SPACE):
        i += 1
    if i == n_lines:
        raise _err(path, None, "missing '\\end\\' at the end of the file")
    if lines[i].strip(ASCII_SPACE) != "\\end\\":
        raise _err(path, i + 1, f"expected '\\end\\' after the '\\{order}-grams:' section, "
                                f"got {_q(lines[i].strip(ASCII_SPACE))} (more sections than the "
                                f"{order} counted in '\\data\\'?)")
    return ArpaLM(order, words, ngrams, path=path)
