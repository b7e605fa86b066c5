"""The JAX device path: CTC and the transducer recursion written in XLA itself.

No callback, no host round trip: every function here is plain ``jax.numpy`` /
``lax.scan`` code with a ``jax.custom_vjp`` whose backward rule runs the
backward (beta) recursion and forms the posteriors, so the program stays on
the device the arrays live on (CPU, GPU, TPU) and JAX never differentiates
through a scan.  The numba core (`duoloss.core`) is the oracle these
modules are tested against (``tests/test_device_jax.py``).

* `.ctc`: CTC forward-backward over the gathered ``(T, N, 2S + 1)`` lattice.
* `.transducer`: k2's mutual-information recursion over ``(px, py,
  boundary)`` (regular, modified), serving ``rnnt_loss`` and the k2 losses.
* `use_device`: whether a call without a Pallas kernel takes this path.
"""
from __future__ import annotations

from duoloss.core._validate import IMPLS

from .._pallas import backend_for, check_impl

__all__ = ["IMPLS", "check_impl", "use_device"]


def use_device(fn: str, impl, *arrays) -> bool:
    """Whether the XLA device path runs, for a function with no Pallas kernel
    (`duoloss.jax._pallas.backend_for` with ``has_pallas=False``): ``'device'``
    and ``'xla'`` always, ``'host'`` never, ``'auto'`` when an input lives on an
    accelerator (a ``jax.Array`` committed to a GPU/TPU device, or a traced value
    while the default backend is one); ``'pallas'`` raises ``NotImplementedError``.
    Raises ``ValueError`` for any other ``impl``."""
    return backend_for(fn, impl, *arrays, has_pallas=False) != "host"
