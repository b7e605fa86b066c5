"""Framework-free array maths shared by the torch and JAX frontends (private).

The algorithms here are written once against a small vocabulary of array
operations (`duoloss._xp._backend`, after einops' ``_backends.py``): each
takes the namespace ``xp`` of the caller's framework first and that
framework's arrays, so autograd (torch) and tracing (``jit``/``grad``/``vmap``,
JAX) flow through them unchanged.  The frontends keep only argument
validation and coercion, and the autograd / ``custom_vjp`` wiring; device paths
(Triton, XLA) reuse the same functions.

* `duoloss._xp._backend` — the vocabulary (``NumpyOps``, ``TorchOps``,
  ``JaxOps``, `namespace_of`); its docstring lists
  every operation and its meaning.
* `duoloss._xp.k2` — k2's lattice builders, pruning ranges and pruning.
* `duoloss._xp.ctc` — the CTC gather plan and the gathered lattice.

Nothing here validates: callers pass checked arguments.  Importing this package
imports neither torch nor JAX (a namespace imports its framework when first
asked for).
"""
from ._backend import JaxOps, NumpyOps, TorchOps, namespace_of

__all__ = ["JaxOps", "NumpyOps", "TorchOps", "namespace_of"]
