"""Loader for the GTN golden fixtures in ``../shared/fixtures/gtn/public``.

Tests that need them are skipped, with the reason, when the directory is absent.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "gtn"
PUBLIC = FIXTURE_DIR / "public"


def load_family(family: str) -> list:
    """The list of cases of ``public/<family>.json`` (skips the test if missing)."""
    path = PUBLIC / f"{family}.json"
    if not path.exists():
        pytest.skip(f"GTN fixtures not found at {path} (the shared fixtures directory is absent)")
    with open(path) as f:
        return json.load(f)["cases"]


def case_ids(family: str) -> list:
    """Case ids for parametrisation (empty if the fixtures are absent)."""
    path = PUBLIC / f"{family}.json"
    if not path.exists():
        return []
    with open(path) as f:
        return [c["id"] for c in json.load(f)["cases"]]


def get_case(family: str, case_id: str) -> dict:
    for c in load_family(family):
        if c["id"] == case_id:
            return c
    raise KeyError(case_id)


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
