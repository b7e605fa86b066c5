"""GTN's Python API on duoloss's numpy/numba graph engine.

``import duoloss.gtn as gtn`` runs GTN code unchanged: weighted finite-state
acceptors/transducers ([`Graph`][duoloss.gtn.Graph]), differentiable operations, scores in the
log and tropical semirings, [`backward`][duoloss.gtn.backward], text/DOT I/O and
[`parallel_for`][duoloss.gtn.parallel_for].  The engine lives in ``duoloss.core.graph.graph*`` (numpy and
numba; no torch or jax).  Differences from GTN are listed in
the docs page "Coming from GTN" (``docs/coming-from/gtn.md``).
"""
from duoloss.core.graph.graph import EPSILON as epsilon
from duoloss.core.graph.graph import MAX_LABEL as max_label
from duoloss.core.graph.graph import Graph
from duoloss.core.graph.graph import graph_arrays
from duoloss.gtn._api import add
from duoloss.gtn._api import backward
from duoloss.gtn._api import clone
from duoloss.gtn._api import closure
from duoloss.gtn._api import compose
from duoloss.gtn._api import concat
from duoloss.gtn._api import draw
from duoloss.gtn._api import equal
from duoloss.gtn._api import forward_score
from duoloss.gtn._api import intersect
from duoloss.gtn._api import isomorphic
from duoloss.gtn._api import linear_graph
from duoloss.gtn._api import load
from duoloss.gtn._api import loadtxt
from duoloss.gtn._api import negate
from duoloss.gtn._api import parallel_for
from duoloss.gtn._api import project_input
from duoloss.gtn._api import project_output
from duoloss.gtn._api import rand_equivalent
from duoloss.gtn._api import remove
from duoloss.gtn._api import sample
from duoloss.gtn._api import save
from duoloss.gtn._api import savetxt
from duoloss.gtn._api import scalar_graph
from duoloss.gtn._api import subtract
from duoloss.gtn._api import to_dot
from duoloss.gtn._api import union
from duoloss.gtn._api import viterbi_path
from duoloss.gtn._api import viterbi_score
from duoloss.gtn._api import write_dot

__all__ = [
    "Graph",
    "add",
    "backward",
    "clone",
    "closure",
    "compose",
    "concat",
    "draw",
    "epsilon",
    "equal",
    "forward_score",
    "graph_arrays",
    "intersect",
    "isomorphic",
    "linear_graph",
    "load",
    "loadtxt",
    "max_label",
    "negate",
    "parallel_for",
    "project_input",
    "project_output",
    "rand_equivalent",
    "remove",
    "sample",
    "save",
    "savetxt",
    "scalar_graph",
    "subtract",
    "to_dot",
    "union",
    "viterbi_path",
    "viterbi_score",
    "write_dot",
]
