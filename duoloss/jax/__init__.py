"""duoloss for JAX: each loss as a ``custom_vjp`` over host callbacks into the core."""
from ._ctc import ctc_loss
from ._ctc import optax_ctc_loss

__all__ = [
    "ctc_loss",
    "optax_ctc_loss",
]
