"""duoloss's framework-free engine: numpy buffers in, numpy buffers out.

Nothing here imports torch or jax.  Each loss family lives in its own private
module and is described to the frontends by a [`LossKernel`][duoloss.core.LossKernel].
"""
# First: settles numba's kernel cache location before any @njit(cache=True) runs.
from . import _numba_setup  # noqa: F401  isort: skip
from .losses.align import asg_align
from .losses.align import asg_viterbi
from .losses.align import ctc_align
from .losses.align import graph_align
from .losses.asg import ASG_KERNEL
from .losses.asg import ASG_NO_TRANSITIONS_KERNEL
from .losses.asg import asg_loss_and_grad
from .losses.ctc import CTC_KERNEL
from .losses.ctc import concat_to_padded
from .losses.ctc import ctc_loss_and_grad
from ._spec import LossKernel
from ._reduce import reduce_losses
from ._reduce import reduction_weights
from ._reduce import run_reduced
from ._threading import threading_layer
from .losses.transducer import RNNT_TYPES
from .losses.transducer import TRANSDUCER_KERNEL
from .losses.transducer import transducer_loss_and_grad
from .losses.transducer import transducer_viterbi
from .losses.tdt import MULTIBLANK_KERNEL
from .losses.tdt import TDT_KERNEL
from .losses.tdt import multiblank_loss_and_grad
from .losses.tdt import tdt_loss_and_grad
from .losses.graph_loss import GRAPH_LOSS_KERNEL
from .losses.graph_loss import graph_loss_and_grad
from .losses.graph_loss import pack_graphs
from .losses.graph_loss import PackedGraphs

__all__ = [
    "PackedGraphs",
    "GRAPH_LOSS_KERNEL",
    "graph_loss_and_grad",
    "pack_graphs",
    "ASG_KERNEL",
    "ASG_NO_TRANSITIONS_KERNEL",
    "asg_loss_and_grad",
    "asg_align",
    "asg_viterbi",
    "ctc_align",
    "graph_align",
    "CTC_KERNEL",
    "LossKernel",
    "reduce_losses",
    "reduction_weights",
    "run_reduced",
    "concat_to_padded",
    "ctc_loss_and_grad",
    "threading_layer",
    "RNNT_TYPES",
    "TRANSDUCER_KERNEL",
    "transducer_loss_and_grad",
    "transducer_viterbi",
    "MULTIBLANK_KERNEL",
    "TDT_KERNEL",
    "multiblank_loss_and_grad",
    "tdt_loss_and_grad",
]
