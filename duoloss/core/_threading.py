"""numba's threading layer, which duoloss does not use.

duoloss's batch kernels are serial loops compiled with ``nogil=True``; a large batch
is spread over a pool of Python threads (`duoloss.core._pool`), never over numba's
``prange`` and threading layer.  So neither of the layer's trade-offs reaches
duoloss's users: GNU OpenMP (not fork-safe: numba kills a child forked after the
parent's first parallel kernel), ``tbb`` (rarely loadable in a virtual environment)
and ``workqueue`` (aborts the process on concurrent launches) are all irrelevant, and
duoloss leaves ``NUMBA_THREADING_LAYER`` / ``numba.config.THREADING_LAYER`` to the
user's own numba code.
"""
from __future__ import annotations

import numba

__all__ = ["threading_layer"]


def threading_layer() -> str:
    """numba's threading layer in this process: ``'unknown'`` unless other numba code
    started one (duoloss's kernels never do)."""
    try:
        return numba.threading_layer()
    except ValueError:
        return "unknown"
