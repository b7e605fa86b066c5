"""GTN's Python API on duoloss's numpy/numba graph engine (work in progress)."""
from duoloss.core._graph import EPSILON as epsilon
from duoloss.core._graph import Graph
from duoloss.core._graph import backward
from duoloss.core._graph import graph_arrays
