"""duoloss for PyTorch: each loss as an autograd function and an ``nn.Module``."""
from ._decode_ctc import CTCDecoderLM
from ._decode_ctc import CTCDecoderLMState
from ._decode_ctc import ctc_decoder
from ._align import asg_align
from ._align import asg_viterbi
from ._align import ctc_align
from ._align import graph_align
from ._align import token_spans
from ._asg import ASGLoss
from ._asg import asg_loss
from ._ctc import CTCLoss
from ._ctc import ctc_loss
from ._decode_greedy import ctc_greedy_decode
from ._decode_transducer import multiblank_greedy_decode
from ._decode_transducer import rnnt_beam_search
from ._decode_transducer import rnnt_greedy_decode
from ._decode_transducer import tdt_beam_search
from ._decode_transducer import tdt_greedy_decode
from ._graph_loss import GraphLoss
from ._decode_graph import graph_decode
from ._graph_loss import graph_loss
from ._rnnt_k2 import do_rnnt_pruning
from ._rnnt_k2 import get_rnnt_logprobs
from ._rnnt_k2 import get_rnnt_logprobs_pruned
from ._rnnt_k2 import get_rnnt_logprobs_smoothed
from ._rnnt_k2 import get_rnnt_prune_ranges
from ._rnnt_k2 import rnnt_loss_pruned
from ._rnnt_k2 import rnnt_loss_simple
from ._rnnt_k2 import rnnt_loss_smoothed
from ._rnnt import RNNTLoss
from ._rnnt import rnnt_align
from ._rnnt import rnnt_loss
from ._rnnt_joiner import rnnt_loss_from_joiner
from ._tdt import MultiblankRNNTLoss
from ._tdt import TDTLoss
from ._tdt import multiblank_rnnt_loss
from ._tdt import tdt_loss
from duoloss.core.losses.graph_loss import PackedGraphs
from duoloss.core.losses.graph_loss import pack_graphs

__all__ = [
    "CTCDecoderLM",
    "CTCDecoderLMState",
    "ctc_decoder",
    "do_rnnt_pruning",
    "get_rnnt_logprobs",
    "get_rnnt_logprobs_pruned",
    "get_rnnt_logprobs_smoothed",
    "get_rnnt_prune_ranges",
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "PackedGraphs",
    "pack_graphs",
    "GraphLoss",
    "graph_loss",
    "graph_decode",
    "ASGLoss",
    "asg_align",
    "asg_loss",
    "asg_viterbi",
    "ctc_align",
    "graph_align",
    "token_spans",
    "CTCLoss",
    "ctc_loss",
    "ctc_greedy_decode",
    "multiblank_greedy_decode",
    "rnnt_beam_search",
    "rnnt_greedy_decode",
    "tdt_beam_search",
    "tdt_greedy_decode",
    "RNNTLoss",
    "rnnt_align",
    "rnnt_loss",
    "rnnt_loss_from_joiner",
    "MultiblankRNNTLoss",
    "multiblank_rnnt_loss",
    "TDTLoss",
    "tdt_loss",
]
