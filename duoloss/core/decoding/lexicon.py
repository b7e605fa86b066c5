"""Lexicon files in flashlight's format (torchaudio's ``ctc_decoder(lexicon=...)``).

One word per line followed by its spelling in tokens, fields separated by spaces or tabs
(only those: a word or token may contain any other character, a no-break space included;
a UTF-8 byte-order mark at the start is skipped)::

    hello h e l l o |
    hello h e l o |        # a second spelling of the same word
    world w o r l d |

A word may have several spellings (several lines); each token must be one of the decoder's
``tokens``.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Sequence, Tuple, Union

from ._text import ASCII_SPACE, fields as _fields, lines as _lines

__all__ = ["read_lexicon"]


def read_lexicon(path: Union[str, "os.PathLike[str]"],
                 tokens: Union[Sequence[str], Mapping[str, int]]
                 ) -> List[Tuple[str, List[List[int]]]]:
    """Read a flashlight-format lexicon and spell its words with token ids.

    Args:
        path: the lexicon file: ``word tok1 tok2 ...`` per line (spaces or tabs); blank lines
            are skipped; a word on several lines has several spellings.
        tokens: the decoder's tokens, id -> token (a sequence of strings), or a mapping
            token -> id.

    Returns:
        ``[(word, [spelling, ...]), ...]`` in order of each word's first line; a spelling is a
        list of token ids.  A spelling repeated for the same word is kept once.

    Raises:
        ValueError: naming ``read_lexicon``, the file and the line, for a missing file, a line
            with a word but no spelling, or a spelling token that is not in ``tokens``.
        TypeError: when ``path`` is not a string or path, or ``tokens`` not a sequence of
            strings or a mapping.

    Examples:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "lexicon.txt")
        >>> _ = open(path, "w").write("ab a b |\\nba b a |\\nab a a b |\\n")
        >>> read_lexicon(path, ["-", "|", "a", "b"])
        [('ab', [[2, 3, 1], [2, 2, 3, 1]]), ('ba', [[3, 2, 1]])]
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_lexicon: argument 'path' must be a str or os.PathLike, "
                        f"got {type(path).__name__}")
    if isinstance(tokens, Mapping):
        index: Dict[str, int] = {}
        for t, i in tokens.items():
            if not isinstance(t, str):
                raise TypeError(f"read_lexicon: argument 'tokens' must map str to int, "
                                f"got a key of type {type(t).__name__}")
            index[t] = int(i)
    elif isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"read_lexicon: argument 'tokens' must be a sequence of str or a "
                        f"mapping str -> int, got {type(tokens).__name__}")
    else:
        index = {}
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"read_lexicon: argument 'tokens' must be a sequence of str, "
                                f"got an item of type {type(t).__name__} at index {i}")
            index.setdefault(t, i)
    spath = os.fspath(path)
    try:
        with open(spath, "r", encoding="utf-8") as f:
            lines = _lines(f.read())
    except FileNotFoundError:
        raise ValueError(f"read_lexicon: lexicon file {spath!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"read_lexicon: lexicon file {spath!r} is a directory") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"read_lexicon: lexicon file {spath!r} is not UTF-8 text "
                         f"({e.reason} at byte {e.start})") from None
    entries: Dict[str, List[List[int]]] = {}
    for lineno, line in enumerate(lines, 1):
        fields = _fields(line)
        if not fields:
            continue
        if len(fields) < 2:
            raise ValueError(f"read_lexicon: {spath}:{lineno}: a lexicon line must be a word "
                             f"followed by its spelling in tokens, got {line.strip(ASCII_SPACE)!r}")
        spelling = []
        for tok in fields[1:]:
            tid = index.get(tok)
            if tid is None:
                raise ValueError(f"read_lexicon: {spath}:{lineno}: the word {fields[0]!r} is "
                                 f"spelled with the token {tok!r}, which is not in 'tokens'")
            spelling.append(tid)
        spellings = entries.setdefault(fields[0], [])
        if spelling not in spellings:
            spellings.append(spelling)
    if not entries:
        raise ValueError(f"read_lexicon: lexicon file {spath!r} has no entries")
    return list(entries.items())
