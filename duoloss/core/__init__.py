"""duoloss's framework-free engine: numpy buffers in, numpy buffers out.

Nothing here imports torch or jax.  Each loss family lives in its own private
module and is described to the frontends by a :class:`LossKernel`.
"""
# First: settles numba's kernel cache location before any @njit(cache=True) runs.
from . import _numba_setup  # noqa: F401  isort: skip
from ._align import asg_align
from ._align import asg_viterbi
from ._align import ctc_align
from ._align import graph_align
from ._asg import ASG_KERNEL
from ._asg import ASG_NO_TRANSITIONS_KERNEL
from ._asg import asg_loss_and_grad
from ._ctc import CTC_KERNEL
from ._ctc import concat_to_padded
from ._ctc import ctc_loss_and_grad
from ._spec import LossKernel
from ._threading import threading_layer
from ._transducer import RNNT_TYPES
from ._transducer import TRANSDUCER_KERNEL
from ._transducer import transducer_loss_and_grad
from ._transducer import transducer_viterbi
from ._graph_loss import GRAPH_LOSS_KERNEL
from ._graph_loss import graph_loss_and_grad
from ._graph_loss import pack_graphs
from ._graph_loss import PackedGraphs

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
    "concat_to_padded",
    "ctc_loss_and_grad",
    "threading_layer",
    "RNNT_TYPES",
    "TRANSDUCER_KERNEL",
    "transducer_loss_and_grad",
    "transducer_viterbi",
]
