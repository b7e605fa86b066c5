"""duoloss for PyTorch: each loss as an autograd function and an ``nn.Module``."""
from ._ctc import CTCLoss
from ._ctc import ctc_loss

__all__ = [
    "CTCLoss",
    "ctc_loss",
]
