"""Loader for GTN's golden fixtures, vendored in ``tests/data/gtn/public``.

The files are GTN's own outputs (see ``tests/data/gtn/PROVENANCE.md``). They ship with every
clone and with the sdist, so a missing file is an error, not a reason to skip:
``DUOLOSS_GTN_FIXTURES`` may point at another copy (a directory holding ``public/``).
"""
from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

FIXTURE_DIR = Path(os.environ.get("DUOLOSS_GTN_FIXTURES")
                   or Path(__file__).resolve().parents[1] / "data" / "gtn")
PUBLIC = FIXTURE_DIR / "public"


@lru_cache(maxsize=None)
def _read(family: str) -> tuple:
    path = PUBLIC / f"{family}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"GTN fixture file {path} is missing: it is part of the repository "
            f"(tests/data/gtn/public/); restore it or set DUOLOSS_GTN_FIXTURES")
    with open(path) as f:
        return tuple(json.load(f)["cases"])


def load_family(family: str) -> list:
    """The list of cases of ``public/<family>.json`` (each call gets fresh copies)."""
    return copy.deepcopy(list(_read(family)))


def case_ids(family: str) -> list:
    """Case ids for parametrisation (raises if the fixtures are missing)."""
    return [c["id"] for c in _read(family)]


@lru_cache(maxsize=None)
def _by_id(family: str) -> dict:
    return {c["id"]: c for c in _read(family)}


def get_case(family: str, case_id: str) -> dict:
    """A fresh copy of one case (``KeyError`` if the id is unknown)."""
    return copy.deepcopy(_by_id(family)[case_id])


def parse_graph(text: str, num_nodes: int):
    """``(num_nodes, src, dst, ilabel, olabel, weight, start, accept)`` from GTN text
    (independent of duoloss's own parser)."""
    lines = text.split("\n")
    start = np.zeros(num_nodes, bool)
    accept = np.zeros(num_nodes, bool)
    for tok in lines[0].split():
        start[int(tok)] = True
    for tok in lines[1].split():
        accept[int(tok)] = True
    rows = [ln.split() for ln in lines[2:] if ln.strip()]
    src = np.array([int(r[0]) for r in rows], np.int64)
    dst = np.array([int(r[1]) for r in rows], np.int64)
    il = np.array([int(r[2]) for r in rows], np.int64)
    ol = np.array([int(r[3]) for r in rows], np.int64)
    w = np.array([np.float32(float(r[4])) for r in rows], np.float32)
    return num_nodes, src, dst, il, ol, w, start, accept
