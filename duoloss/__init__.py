"""duoloss: sequence losses with the same numbers in PyTorch and JAX.

Frontends: ``duoloss.torch`` and ``duoloss.jax`` (import the one you use);
GTN's Python API: ``duoloss.gtn``; the framework-free engine: ``duoloss.core``.
``python -m duoloss`` trains a tiny CTC model in every installed framework;
``duoloss.warmup()`` / ``python -m duoloss warmup`` compile and cache the kernels ahead
of the first call.
Documentation: ``docs/`` (``make docs``).
"""
__version__ = "0.1.0"  # the one version source (pyproject.toml reads it)

from ._warmup import warmup

__all__ = ["__version__", "warmup"]
