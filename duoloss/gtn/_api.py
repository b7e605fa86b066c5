"""GTN's Python functions on the duoloss engine (list overloads, parallel_for)."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import (Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, TextIO, Union,
                    cast, overload)

from duoloss.core.graph import compare as _cmp
from duoloss.core.graph import io as _io
from duoloss.core.graph import ops as _ops
from duoloss.core.graph.graph import EPSILON, Graph
from duoloss.core.graph.graph import backward as _backward

_POOL: Optional[ThreadPoolExecutor] = None
#: A path, or an open file object (text for ``savetxt``/``loadtxt``, binary for ``save``/``load``).
PathOrFile = Union[str, "os.PathLike[str]", TextIO, Any]
#: Symbol tables for drawing: label -> name.
Symbols = Optional[Dict[int, str]]


class _UnaryOp(Protocol):
    """A graph operation on one graph, or on a list of graphs (in parallel)."""

    @overload
    def __call__(self, g: Graph) -> Graph: ...
    @overload
    def __call__(self, g: Sequence[Graph]) -> List[Graph]: ...


class _BinaryOp(Protocol):
    """A graph operation on two graphs, or on two lists of graphs (in parallel)."""

    @overload
    def __call__(self, g1: Graph, g2: Graph) -> Graph: ...
    @overload
    def __call__(self, g1: Sequence[Graph], g2: Sequence[Graph]) -> List[Graph]: ...
_POOL_LOCK = threading.Lock()
_IN_WORKER = threading.local()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                workers = int(os.environ.get("DUOLOSS_NUM_THREADS", 0)) or (os.cpu_count() or 1)
                _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="duoloss-gtn")
    return _POOL


def _run(fn: Callable[[Any], Any], items: Sequence[Any]) -> List[Any]:
    def task(x):
        _IN_WORKER.active = True
        try:
            return fn(x)
        finally:
            _IN_WORKER.active = False

    if len(items) <= 1 or getattr(_IN_WORKER, "active", False):
        return [fn(x) for x in items]
    futures = [_pool().submit(task, x) for x in items]
    return [f.result() for f in futures]


def parallel_for(function: Callable[[Any], Any], inputs: Iterable[Any]) -> None:
    """Call ``function(x)`` for every ``x`` in ``inputs`` on a thread pool.

    The pool has ``os.cpu_count()`` threads (``DUOLOSS_NUM_THREADS`` overrides).
    The compiled graph kernels release the GIL, so graph work runs in parallel.
    Returns when every call has finished; the first exception raised by a call is
    re-raised.  Called from inside a worker it runs serially (no deadlock).

    Like GTN, results are not returned: write them into preallocated lists.
    """
    if not callable(function):
        raise TypeError(f"parallel_for: function must be callable, got {type(function).__name__}")
    try:
        items = list(inputs)
    except TypeError:
        raise TypeError(f"parallel_for: inputs must be iterable, "
                        f"got {type(inputs).__name__}") from None
    _run(function, items)


def _is_graph_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(g, Graph) for g in x) and len(x) > 0 \
        or (isinstance(x, (list, tuple)) and len(x) == 0)


def _unary(op: Callable[[Graph], Graph], name: str) -> _UnaryOp:
    def fn(g: Graph | Sequence[Graph]) -> Graph | List[Graph]:
        if isinstance(g, Graph):
            return op(g)
        if isinstance(g, (list, tuple)):
            for i, x in enumerate(g):
                if not isinstance(x, Graph):
                    raise TypeError(f"{name}: graphs[{i}] must be a Graph, got {type(x).__name__}")
            return _run(op, list(g))
        raise TypeError(f"{name}: expected a Graph or a list of Graphs, got {type(g).__name__}")

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = (op.__doc__ or "") + f"\n\n    Also accepts a list of graphs and returns the list of results (computed in parallel).\n"
    return cast(_UnaryOp, fn)


def _binary(op: Callable[[Graph, Graph], Graph], name: str) -> _BinaryOp:
    def fn(g1: Graph | Sequence[Graph], g2: Graph | Sequence[Graph]) -> Graph | List[Graph]:
        if isinstance(g1, Graph) and isinstance(g2, Graph):
            return op(g1, g2)
        if isinstance(g1, (list, tuple)) and isinstance(g2, (list, tuple)):
            if len(g1) != len(g2):
                raise ValueError(f"{name}: graphs1 and graphs2 must have the same length, got {len(g1)} and {len(g2)}")
            for lst, nm in ((g1, "graphs1"), (g2, "graphs2")):
                for i, x in enumerate(lst):
                    if not isinstance(x, Graph):
                        raise TypeError(f"{name}: {nm}[{i}] must be a Graph, got {type(x).__name__}")
            return _run(lambda p: op(*p), list(zip(g1, g2)))
        raise TypeError(
            f"{name}: expected two Graphs or two lists of Graphs, got {type(g1).__name__} and {type(g2).__name__}")

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = (op.__doc__ or "") + "\n\n    Also accepts two equal-length lists of graphs (pairwise, in parallel).\n"
    return fn


clone = _unary(_ops.clone, "clone")
negate = _unary(_ops.negate, "negate")
project_input = _unary(_ops.project_input, "project_input")
project_output = _unary(_ops.project_output, "project_output")
closure = _unary(_ops.closure, "closure")
forward_score = _unary(_ops.forward_score, "forward_score")
viterbi_score = _unary(_ops.viterbi_score, "viterbi_score")
viterbi_path = _unary(_ops.viterbi_path, "viterbi_path")
add = _binary(_ops.add, "add")
subtract = _binary(_ops.subtract, "subtract")
intersect = _binary(_ops.intersect, "intersect")
compose = _binary(_ops.compose, "compose")


def union(graphs: Sequence[Graph] | Sequence[Sequence[Graph]]) -> Graph | List[Graph]:
    """Union of a list of graphs (see `duoloss.core.graph.ops.union`).

    A list of lists of graphs gives the list of their unions (in parallel).
    """
    if isinstance(graphs, (list, tuple)) and graphs and all(isinstance(x, (list, tuple)) for x in graphs):
        return _run(_ops.union, [list(x) for x in graphs])
    return _ops.union(graphs)


def concat(*args: Graph | Sequence[Graph] | Sequence[Sequence[Graph]]) -> Graph | List[Graph]:
    """``concat(g1, g2)``, ``concat([g1, g2, ...])``; lists of lists / two lists of
    graphs map over their elements (see `duoloss.core.graph.ops.concat`)."""
    if len(args) == 2 and all(isinstance(a, (list, tuple)) for a in args):
        g1, g2 = args
        if len(g1) != len(g2):
            raise ValueError(f"concat: graphs1 and graphs2 must have the same length, got {len(g1)} and {len(g2)}")
        return _run(lambda p: _ops.concat(*p), list(zip(g1, g2)))
    if len(args) == 1 and isinstance(args[0], (list, tuple)) and args[0] and \
            all(isinstance(x, (list, tuple)) for x in args[0]):
        return _run(lambda gl: _ops.concat(list(gl)), list(args[0]))
    return _ops.concat(*args)


def remove(g: Graph | Sequence[Graph], ilabel: Any = EPSILON, olabel: Optional[int] = None
           ) -> Graph | List[Graph]:
    """Epsilon removal (see `duoloss.core.graph.ops.remove`).

    ``remove(graphs, labels)`` maps over a list of graphs with one label each.
    """
    if isinstance(g, (list, tuple)):
        labels = ilabel if isinstance(ilabel, (list, tuple)) else [ilabel] * len(g)
        if len(labels) == 1 and len(g) != 1:
            labels = list(labels) * len(g)
        if len(labels) != len(g):
            raise ValueError(f"remove: labels must have one entry per graph ({len(g)}), got {len(labels)}")
        return _run(lambda p: _ops.remove(p[0], p[1]), list(zip(g, labels)))
    return _ops.remove(g, ilabel, olabel)


def _broadcast(name: str, what: str, value, count: int) -> list:
    """GTN's ``parallel_map`` rule: a list of one entry serves every graph."""
    if not isinstance(value, (list, tuple)):
        return [value] * count
    if len(value) == 1:
        return list(value) * count
    if len(value) != count:
        raise ValueError(f"{name}: {what} must have 1 or {count} entries (one per graph), "
                         f"got {len(value)}")
    return list(value)


def backward(g: Graph | Sequence[Graph], grad: Any = None, retain_graph: Any = False) -> None:
    """Accumulate gradients into every input of ``g`` (GTN's ``gtn.backward``).

    ``backward(g)``, ``backward(g, retain_graph)``, ``backward(g, grad)`` or
    ``backward(g, grad, retain_graph)``; see `duoloss.core.graph.graph.backward`.
    With a list of graphs (run in parallel), ``grad`` and ``retain_graph`` may be
    lists with one entry per graph, or with a single entry that serves all of
    them (GTN's ``backward(graphs, grads, retain_graphs)``).

    Raises:
      ValueError: the record of operations was released by an earlier
        ``backward`` without ``retain_graph=True`` (as GTN).
    """
    if isinstance(grad, bool) or (isinstance(grad, (list, tuple)) and grad
                                   and all(isinstance(x, (bool, int)) and not isinstance(x, Graph)
                                           for x in grad) and isinstance(g, (list, tuple))):
        grad, retain_graph = None, grad
    if isinstance(g, (list, tuple)):
        for i, x in enumerate(g):
            if not isinstance(x, Graph):
                raise TypeError(f"backward: graphs[{i}] must be a Graph, got {type(x).__name__}")
        grads = _broadcast("backward", "grads", grad, len(g))
        retains = [bool(r) for r in _broadcast("backward", "retain_graphs", retain_graph, len(g))]
        _run(lambda p: _backward(p[0], p[1], p[2]), list(zip(g, grads, retains)))
        return
    _backward(g, grad, bool(retain_graph))


def scalar_graph(weight: float = 0.0, calc_grad: bool = True) -> Graph:
    """A one-arc graph ``0 -> 1`` holding ``weight`` (see the core docstring)."""
    return _ops.scalar_graph(weight, calc_grad)


def linear_graph(M: int, N: int, calc_grad: bool = True) -> Graph:
    """``M+1`` nodes with ``N`` arcs per step; arc ``t*N+c`` has label ``c``."""
    return _ops.linear_graph(M, N, calc_grad)


def sample(g: Graph, max_length: int = 1000) -> Graph:
    """A uniformly random path of ``g`` as a linear graph (see core ``sample``)."""
    return _ops.sample(g, max_length)


def rand_equivalent(g1: Graph, g2: Graph, num_samples: int = 1000, tol: float = 1e-4,
                    max_length: int = 1000) -> bool:
    """Randomised check that two graphs have the same weighted language."""
    return _cmp.rand_equivalent(g1, g2, num_samples, tol, max_length)


def equal(first: Graph, second: Graph) -> bool:
    """Exact equality (same numbering and arc order)."""
    return _cmp.equal(first, second)


def isomorphic(first: Graph, second: Graph) -> bool:
    """Equality up to node renumbering."""
    return _cmp.isomorphic(first, second)


def savetxt(file_name: PathOrFile, graph: Graph) -> None:
    """Write ``graph`` in GTN's text format (``savetxt(file_name, graph)``, GTN's
    order; ``savetxt(graph, file_name)`` works too).  ``file_name``: a path or a
    text file object."""
    _io.savetxt(file_name, graph)


def loadtxt(file_name: PathOrFile, num_nodes: Optional[int] = None, calc_grad: bool = True) -> Graph:
    """Read a graph in GTN's text format (empty start/accept lines allowed)."""
    return _io.loadtxt(file_name, num_nodes, calc_grad)


def save(file_name: PathOrFile, graph: Graph) -> None:
    """Write ``graph`` in GTN's binary format (``save(file_name, graph)``; a path
    or a binary file object).  Labels must fit int32 there."""
    _io.save(file_name, graph)


def load(file_name: PathOrFile, calc_grad: bool = True) -> Graph:
    """Read a graph in GTN's binary format (from [`save`][duoloss.gtn.save] or GTN)."""
    return _io.load(file_name, calc_grad)


def draw(graph: Graph, file_name: Union[str, "os.PathLike[str]"], isymbols: Symbols = None,
         osymbols: Symbols = None) -> str:
    """Render with Graphviz, or write DOT text when Graphviz is missing."""
    return _io.draw(graph, file_name, isymbols, osymbols)


write_dot = draw


def to_dot(graph: Graph, isymbols: Symbols = None, osymbols: Symbols = None) -> str:
    """The graph in Graphviz DOT syntax."""
    return _io.to_dot(graph, isymbols, osymbols)
