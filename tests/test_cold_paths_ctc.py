"""The cold-compile restructuring of CTC (issue 19 point 3) keeps every bit.

* ``_first_invalid`` (numpy now) returns what the loops it replaced returned.
"""
import numpy as np
import pytest

from duoloss.core.losses.ctc import _first_invalid


def _first_invalid_loops(targets, in_len, tg_len, t_max, n_cls, blank):
    """The former numba kernel, line for line, in Python."""
    n, s_cap = targets.shape
    for b in range(n):
        if in_len[b] < 0 or in_len[b] > t_max:
            return 1, b, 0, in_len[b]
    for b in range(n):
        if tg_len[b] < 0 or tg_len[b] > s_cap:
            return 2, b, 0, tg_len[b]
    for b in range(n):
        for i in range(tg_len[b]):
            y = targets[b, i]
            if y < 0 or y >= n_cls:
                return 3, b, i, y
            if y == blank:
                return 4, b, i, y
    return 0, 0, 0, 0


@pytest.mark.parametrize("seed", range(300))
def test_first_invalid_matches_loops(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 5))
    s_cap = int(rng.integers(0, 5))
    t_max = int(rng.integers(0, 6))
    n_cls = int(rng.integers(1, 6))
    blank = int(rng.integers(0, n_cls))
    p = rng.choice([0.0, 0.05, 0.3])
    targets = rng.integers(-1 if p else 0, n_cls + (1 if p else 0), (n, s_cap)).astype(np.int64)
    if not p:
        targets[targets == blank] = (blank + 1) % n_cls if n_cls > 1 else blank
    in_len = rng.integers(-1 if p else 0, t_max + (2 if p else 1), n).astype(np.int64)
    tg_len = rng.integers(-1 if p else 0, s_cap + (2 if p else 1), n).astype(np.int64)
    got = _first_invalid(targets, in_len, tg_len, t_max, n_cls, blank)
    want = _first_invalid_loops(targets, in_len, tg_len, t_max, n_cls, blank)
    assert tuple(int(v) for v in got) == tuple(int(v) for v in want)
