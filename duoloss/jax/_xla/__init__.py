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
* `use_device`: what ``impl="auto" | "host" | "device"`` resolves to.
"""
from __future__ import annotations

import jax

from duoloss.core._validate import IMPLS, check_impl

__all__ = ["IMPLS", "check_impl", "use_device"]

_ACCELERATORS = ("gpu", "tpu", "cuda", "rocm", "metal")


def _on_accelerator(x) -> bool:
    if isinstance(x, jax.core.Tracer):
        return jax.default_backend() in _ACCELERATORS
    if isinstance(x, jax.Array):
        try:
            return any(d.platform in _ACCELERATORS for d in x.devices())
        except (AttributeError, RuntimeError):  # pragma: no cover - deleted arrays
            return False
    return False  # numpy arrays, lists: host memory


def use_device(fn: str, impl, *arrays) -> bool:
    """Whether the XLA device path runs: ``'device'`` always, ``'host'`` never,
    ``'auto'`` when an input lives on an accelerator (a ``jax.Array`` committed
    to a GPU/TPU device, or a traced value while the default backend is one).
    Raises ``ValueError`` for any other ``impl``."""
    impl = check_impl(fn, impl)
    if impl != "auto":
        return impl == "device"
    return any(_on_accelerator(x) for x in arrays if x is not None)
