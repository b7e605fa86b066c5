"""duoloss: sequence losses with the same numbers in PyTorch and JAX.

Frontends: ``duoloss.torch`` and ``duoloss.jax`` (import the one you use);
the framework-free engine is ``duoloss.core``.
"""
__version__ = "0.1.0"

__all__ = ["__version__"]
