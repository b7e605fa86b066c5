"""Every alignment of a transducer lattice, for the brute-force references of the RNN-T tests.

The lattice has ``n_symbols + 1`` rows (``s``: symbols emitted so far) and frames
``t``.  A move is ``('x', s, t)`` (emit symbol ``s`` at frame ``t``: k2's
``px[s, t]``) or ``('y', s, t)`` (a blank at frame ``t``: k2's ``py[s, t]``).

* ``modified=False`` (k2's ``regular``, torchaudio's RNN-T): a symbol keeps the
  frame, a blank advances it; the path goes from ``(0, 0)`` to
  ``(n_symbols, n_frames)``.  With ``last_is_blank=True`` (the transducer's
  termination: the final blank at the last frame) only paths whose last move is a
  blank count.
* ``modified=True`` (k2's ``modified``/``constrained``): every move advances the
  frame, so there are exactly ``n_frames`` moves.
"""
from __future__ import annotations

import itertools

__all__ = ["lattice_paths"]


def lattice_paths(n_symbols, n_frames, modified=False, last_is_blank=False, s0=0, t0=0):
    """All monotone paths as lists of moves, offset by ``(s0, t0)``."""
    if n_symbols < 0 or n_frames < 0:
        return []
    if modified:
        n_moves = n_frames
    else:
        n_moves = n_symbols + n_frames - (1 if last_is_blank else 0)
        if last_is_blank and n_frames == 0:
            return []
    if n_symbols > n_moves:
        return []
    out = []
    for xs in itertools.combinations(range(n_moves), n_symbols):
        s, t, path = s0, t0, []
        for k in range(n_moves):
            if k in xs:
                path.append(("x", s, t))
                s += 1
                t += 1 if modified else 0
            else:
                path.append(("y", s, t))
                t += 1
        if last_is_blank and not modified:
            path.append(("y", s, t))
            t += 1
        out.append(path)
    return out
