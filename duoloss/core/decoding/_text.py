"""Reading the decoders' text files as flashlight and KenLM read them.

Lines end at ``\\n`` only (a ``\\r`` before it is dropped) and fields are separated by
ASCII spaces and tabs only, so that a word may hold any other character -- a no-break
space (U+00A0), a line separator (U+2028) -- which ``str.split()`` and ``str.splitlines()``
would take for whitespace.  A UTF-8 byte-order mark at the start of a file is skipped.
"""
from __future__ import annotations

import re
from typing import List

__all__ = ["ASCII_SPACE", "fields", "lines"]

#: the characters that separate fields (and are stripped from the ends of a line)
ASCII_SPACE = " \t\r\v\f"
_SPLIT = re.compile("[ \t\r\v\f]+")
_OTHER_SPACE = re.compile("[\x1c-\x1f]")     # ASCII characters str.split also splits on


def lines(text: str) -> List[str]:
    """The lines of a file's text, without a leading byte-order mark."""
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.split("\n")


def fields(line: str) -> List[str]:
    """The fields of a line, split on runs of ASCII spaces and tabs."""
    if line.isascii() and _OTHER_SPACE.search(line) is None:
        return line.split()  # the common case, at str.split's speed
    return [f for f in _SPLIT.split(line) if f]
