"""Array-backed weighted finite-state graphs with reverse-mode differentiation.

This module is the data structure of the graph engine (``duoloss.gtn`` is its
public face).  A `Graph` is a weighted finite-state acceptor or
transducer stored as flat numpy arrays:

* nodes ``0 .. num_nodes-1`` with boolean ``start`` / ``accept`` flags;
* arcs ``0 .. num_arcs-1`` in creation order, each with ``src``, ``dst``,
  ``ilabel``, ``olabel`` (``int64``; `EPSILON` ``= -1`` is the empty label)
  and a ``float32`` ``weight``.

Arc *indices* are stable: every gradient is an array in arc order.  Graphs carry
no initial or final weights: a path's score is the sum of its arc weights
(multiplication in the log / tropical semirings).

Automatic differentiation follows GTN (Hannun et al., 2020): an operation's
output graph remembers its input graphs and a *gradient function*; calling
`backward` on a result walks that record in reverse topological order and
*accumulates* ``d output / d arc weight`` into the ``grad`` of every graph built
with ``calc_grad=True``.

Interface for other duoloss modules (stable):

* `graph_arrays` ``(g) -> (num_nodes, src, dst, ilabel, olabel, weight,
  start, accept)`` returns read-only views of a graph's arrays (no copy);
* `Graph.from_arrays` builds a graph from such arrays (one copy, validated).

NB: this module never imports torch or jax.

References:
  A. Hannun, V. Pratap, J. Kahn, W.-N. Hsu, "Differentiable Weighted Finite-State
  Transducers", arXiv:2010.01003, 2020.
"""
from __future__ import annotations

import itertools
import operator
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["EPSILON", "MAX_LABEL", "Graph", "graph_arrays", "backward"]

#: The epsilon (empty) label.
EPSILON = -1

#: The largest label a graph can hold (labels are stored as int64).  Every
#: label in ``[EPSILON, MAX_LABEL]`` is supported by every operation: the
#: (node, label) lookup tables of ``compose``/``intersect`` are only built when
#: ``num_nodes * (max label + 1)`` is small, and that bound is checked without
#: forming the product (no int64 overflow); otherwise a label-sorted merge is
#: used.  Larger values raise ``ValueError``.
MAX_LABEL = 2 ** 63 - 1
_LABEL_RANGE = "[-1, 2**63 - 1] (-1 = epsilon)"

_GRAD_LOCK = threading.Lock()
_IDS = itertools.count()

GradFn = Callable[[np.ndarray, Sequence["Graph"]], Sequence[Optional[np.ndarray]]]


def _grow(arr: np.ndarray, need: int) -> np.ndarray:
    cap = max(8, 2 * arr.shape[0])
    while cap < need:
        cap *= 2
    out = np.empty(cap, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _as_index_array(name: str, value, size: Optional[int] = None) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"Graph.from_arrays: {name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == object and arr.size and all(isinstance(x, int) for x in arr.tolist()):
        # Python ints beyond int64 (numpy keeps them as objects)
        raise ValueError(f"Graph.from_arrays: {name} must fit int64, got values in "
                         f"[{min(arr.tolist())}, {max(arr.tolist())}]")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > MAX_LABEL:
        raise ValueError(f"Graph.from_arrays: {name} must fit int64, got {int(arr.max())}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"Graph.from_arrays: {name} must hold integers, got dtype {arr.dtype}")
    if size is not None and arr.shape[0] != size:
        raise ValueError(
            f"Graph.from_arrays: {name} must have {size} entries (one per arc), got {arr.shape[0]}"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def _int_arg(fn: str, arg: str, value) -> int:
    """``value`` as an int (anything with ``__index__``: int, numpy or 0-d tensor
    integers, as GTN's bindings accept); ``TypeError`` naming ``fn`` and ``arg``."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {arg} must be an int, got {type(value).__name__}") from None


def _float_arg(fn: str, arg: str, value) -> float:
    """``value`` as a float; ``TypeError`` naming ``fn`` and ``arg`` otherwise."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{fn}: {arg} must be a float, got {type(value).__name__}")

class Graph:
    """A weighted finite-state acceptor or transducer (GTN's ``gtn.Graph``).

    Args:
      calc_grad: whether gradients with respect to this graph's arc weights are
        wanted.  Outputs of operations require a gradient when any input does.

    Example::

        g = Graph()
        g.add_node(start=True)
        g.add_node(accept=True)
        g.add_arc(0, 1, 0, 0, 0.5)    # src, dst, ilabel, olabel, weight

    NB: a graph is not thread-safe while it is being *built*; finished graphs may
    be read and differentiated from several threads (gradient accumulation is
    locked).
    """

    __slots__ = (
        "_n", "_na", "_start", "_accept", "_src", "_dst", "_ilabel", "_olabel",
        "_weight", "_calc_grad", "_grad", "_grad_lazy", "_inputs", "_grad_fn", "_id",
        "_ilabel_sorted", "_olabel_sorted", "_topo", "__weakref__",
    )

    def __init__(self, calc_grad: bool = True) -> None:
        self._n = 0
        self._na = 0
        self._start = np.zeros(8, np.bool_)
        self._accept = np.zeros(8, np.bool_)
        self._src = np.zeros(8, np.int64)
        self._dst = np.zeros(8, np.int64)
        self._ilabel = np.zeros(8, np.int64)
        self._olabel = np.zeros(8, np.int64)
        self._weight = np.zeros(8, np.float32)
        self._calc_grad = bool(calc_grad)
        self._grad: Optional[np.ndarray] = None
        self._grad_lazy: Optional[np.ndarray] = None  # see _add_grad
        self._topo: Optional[bool] = None  # node ids a topological order, arcs by source
        self._inputs: Tuple["Graph", ...] = ()
        self._grad_fn: Optional[GradFn] = None
        self._id = next(_IDS)
        self._ilabel_sorted = False
        self._olabel_sorted = False

    # ------------------------------------------------------------------ build
    @classmethod
    def from_arrays(
        cls,
        num_nodes: int,
        src,
        dst,
        ilabel,
        olabel=None,
        weight=None,
        start=None,
        accept=None,
        *,
        calc_grad: bool = True,
    ) -> "Graph":
        """Build a graph from arc and node arrays (validated, copied once).

        Args:
          num_nodes: number of nodes ``N``.
          src: ``(A,)`` integer source nodes of the arcs, in ``[0, N)``.
          dst: ``(A,)`` integer destination nodes of the arcs, in ``[0, N)``.
          ilabel: ``(A,)`` integer input labels (``>= 0`` or ``-1`` = epsilon).
          olabel: ``(A,)`` output labels; ``None`` makes an acceptor (``olabel = ilabel``).
          weight: ``(A,)`` weights (cast to float32); ``None`` means zeros.
          start: ``(N,)`` boolean flags, or a sequence of node ids; ``None``
            means no start node.
          accept: ``(N,)`` boolean flags, or a sequence of node ids; ``None``
            means no accept node.
          calc_grad: whether the new graph requires a gradient.

        Returns:
          A new [`Graph`][duoloss.gtn.Graph] whose arc ``a`` is ``src[a] -> dst[a]``.

        Raises:
          ValueError / TypeError: shapes, dtypes or ranges are wrong.
        """
        n = int(num_nodes)
        if n < 0:
            raise ValueError(f"Graph.from_arrays: num_nodes must be >= 0, got {num_nodes}")
        src_a = _as_index_array("src", src)
        A = src_a.shape[0]
        dst_a = _as_index_array("dst", dst, A)
        il = _as_index_array("ilabel", ilabel, A)
        ol = il.copy() if olabel is None else _as_index_array("olabel", olabel, A)
        if weight is None:
            w = np.zeros(A, np.float32)
        else:
            w = np.asarray(weight)
            if w.ndim != 1 or w.shape[0] != A:
                raise ValueError(
                    f"Graph.from_arrays: weight must have shape ({A},), got {w.shape}"
                )
            w = np.ascontiguousarray(w, dtype=np.float32)
            if w is weight:
                w = w.copy()
        if A:
            for name, arr in (("src", src_a), ("dst", dst_a)):
                lo, hi = int(arr.min()), int(arr.max())
                if lo < 0 or hi >= n:
                    raise ValueError(
                        f"Graph.from_arrays: {name} must lie in [0, {n}), got values in [{lo}, {hi}]"
                    )
            for name, arr in (("ilabel", il), ("olabel", ol)):
                if int(arr.min()) < EPSILON:
                    raise ValueError(
                        f"Graph.from_arrays: {name} must lie in {_LABEL_RANGE}, "
                        f"got {int(arr.min())}"
                    )
        flags = []
        for name, f in (("start", start), ("accept", accept)):
            if f is None:
                flags.append(np.zeros(n, np.bool_))
                continue
            fa = np.asarray(f)
            if fa.dtype == np.bool_:
                if fa.shape != (n,):
                    raise ValueError(
                        f"Graph.from_arrays: boolean {name} must have shape ({n},), got {fa.shape}"
                    )
                flags.append(fa.copy())
            else:
                ids = _as_index_array(name, fa.reshape(-1))
                if ids.size and (ids.min() < 0 or ids.max() >= n):
                    raise ValueError(
                        f"Graph.from_arrays: {name} node ids must lie in [0, {n}), got {ids.tolist()}"
                    )
                fl = np.zeros(n, np.bool_)
                fl[ids] = True
                flags.append(fl)
        return cls._from_trusted(n, src_a, dst_a, il, ol, w, flags[0], flags[1], calc_grad)

    @classmethod
    def _from_trusted(cls, n, src, dst, ilabel, olabel, weight, start, accept, calc_grad,
                      inputs=(), grad_fn=None) -> "Graph":
        """Wrap arrays without validation or copy (internal: arrays must be owned)."""
        g = cls.__new__(cls)
        g._n = int(n)
        g._na = int(src.shape[0])
        g._start = start
        g._accept = accept
        g._src = src
        g._dst = dst
        g._ilabel = ilabel
        g._olabel = olabel
        g._weight = weight
        g._grad = None
        g._grad_lazy = None
        g._topo = None
        g._id = next(_IDS)
        g._ilabel_sorted = False
        g._olabel_sorted = False
        g._calc_grad = bool(calc_grad)
        if g._calc_grad and grad_fn is not None:
            g._inputs = tuple(inputs)
            g._grad_fn = grad_fn
        else:
            g._inputs = ()
            g._grad_fn = None
        return g

    def add_node(self, start: bool = False, accept: bool = False) -> int:
        """Add a node and return its id.

        Args:
          start: mark the node as a start state.
          accept: mark the node as an accepting state.
        """
        n = self._n
        if n == self._start.shape[0]:
            self._start = _grow(self._start, n + 1)
            self._accept = _grow(self._accept, n + 1)
        self._start[n] = bool(start)
        self._accept[n] = bool(accept)
        self._n = n + 1
        return n

    def add_arc(self, src_node: int, dst_node: int, ilabel: Optional[int] = None,
                olabel: Optional[int] = None, weight: float = 0.0, *,
                label: Optional[int] = None) -> int:
        """Add an arc and return its index.

        ``add_arc(src, dst, label)`` (or ``label=...``) adds an acceptor arc
        (``olabel = ilabel``) with weight 0, as in GTN;
        ``add_arc(src, dst, ilabel, olabel, weight=0.0)`` a transducer arc.
        Any accumulated gradient is dropped.

        Raises:
          ValueError: a node id is out of range or a label lies outside
            ``[-1, MAX_LABEL]`` (``MAX_LABEL = 2**63 - 1``).
          TypeError: both or neither of ``ilabel`` and ``label`` are given, or
            ``label`` is combined with ``olabel``/``weight``.
        """
        n = self._n
        fn = "Graph.add_arc"
        if label is not None:
            if ilabel is not None or olabel is not None or weight != 0.0:
                raise TypeError("Graph.add_arc: label= makes an acceptor arc of weight 0; "
                                "use ilabel=, olabel=, weight= instead of combining them")
            ilabel = label
        elif ilabel is None:
            raise TypeError("Graph.add_arc: missing the label (ilabel or label)")
        s, d = _int_arg(fn, "src_node", src_node), _int_arg(fn, "dst_node", dst_node)
        if not (0 <= s < n and 0 <= d < n):
            raise ValueError(
                f"Graph.add_arc: src_node and dst_node must lie in [0, {n}), got {s} and {d}"
            )
        il = _int_arg(fn, "ilabel", ilabel)
        ol = il if olabel is None else _int_arg(fn, "olabel", olabel)
        weight = _float_arg(fn, "weight", weight)
        if not (EPSILON <= il <= MAX_LABEL and EPSILON <= ol <= MAX_LABEL):
            raise ValueError(
                f"Graph.add_arc: labels must lie in {_LABEL_RANGE}, got ilabel={il}, olabel={ol}"
            )
        a = self._na
        if a == self._src.shape[0]:
            self._src = _grow(self._src, a + 1)
            self._dst = _grow(self._dst, a + 1)
            self._ilabel = _grow(self._ilabel, a + 1)
            self._olabel = _grow(self._olabel, a + 1)
            self._weight = _grow(self._weight, a + 1)
        self._src[a] = s
        self._dst[a] = d
        self._ilabel[a] = il
        self._olabel[a] = ol
        self._weight[a] = weight
        self._na = a + 1
        self._ilabel_sorted = self._olabel_sorted = False
        self._grad = None  # a gradient no longer matches the arcs
        self._grad_lazy = None
        self._topo = None
        return a

    # ---------------------------------------------------------------- queries
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self._n

    def num_arcs(self) -> int:
        """Number of arcs."""
        return self._na

    def num_start(self) -> int:
        """Number of start nodes."""
        return int(np.count_nonzero(self._start[: self._n]))

    def num_accept(self) -> int:
        """Number of accepting nodes."""
        return int(np.count_nonzero(self._accept[: self._n]))

    def is_start(self, node: int) -> bool:
        """Whether ``node`` is a start node."""
        return bool(self._start[self._check_node("is_start", node)])

    def is_accept(self, node: int) -> bool:
        """Whether ``node`` is an accepting node."""
        return bool(self._accept[self._check_node("is_accept", node)])

    def _check_node(self, fn: str, node) -> int:
        i = int(node)
        if not 0 <= i < self._n:
            raise ValueError(f"Graph.{fn}: node must lie in [0, {self._n}), got {i}")
        return i

    def start(self) -> List[int]:
        """Ids of the start nodes, increasing."""
        return np.flatnonzero(self._start[: self._n]).tolist()

    def accept(self) -> List[int]:
        """Ids of the accepting nodes, increasing."""
        return np.flatnonzero(self._accept[: self._n]).tolist()

    def acceptor(self) -> bool:
        """True when every arc has ``ilabel == olabel``."""
        return bool(np.array_equal(self._ilabel[: self._na], self._olabel[: self._na]))

    def item(self) -> float:
        """The weight of a single-arc graph (e.g. a score) as a Python float.

        Raises:
          ValueError: the graph does not have exactly one arc.
        """
        if self._na != 1:
            raise ValueError(f"Graph.item: graph must have exactly one arc, got {self._na}")
        return float(self._weight[0])

    def weights(self) -> int:
        """The address of the float32 weight storage (GTN's ``Graph.weights()``).

        NB: the address changes when arcs are added; it is valid while the graph
        lives and no arc is added.
        """
        return int(self._weight.ctypes.data)

    def weights_to_list(self) -> List[float]:
        """The arc weights as a list of floats (arc order)."""
        return self._weight[: self._na].tolist()

    def weights_to_numpy(self) -> np.ndarray:
        """The arc weights as a float32 numpy array.

        NB: as in GTN, this is a *view* of the graph's storage (no copy); writing
        to it changes the weights.
        """
        return self._weight[: self._na]

    def labels_to_list(self, ilabel: bool = True) -> List[int]:
        """The input (``ilabel=True``) or output labels as a list (arc order)."""
        arr = self._ilabel if ilabel else self._olabel
        return arr[: self._na].tolist()

    def set_weights(self, weights: Any) -> None:
        """Overwrite all arc weights.

        Args:
          weights: one of
            * a sequence or numpy array (any real dtype) of ``num_arcs`` values;
            * an ``int``: the address of ``num_arcs`` contiguous float32 values
              (e.g. ``tensor.data_ptr()`` of a contiguous float32 CPU tensor), as
              GTN accepts. The values are copied immediately.

        Raises:
          ValueError: the number of values differs from ``num_arcs``, or the
            address is 0.
          TypeError: ``weights`` has an unsupported type.

        NB: an address cannot be checked: it must point to at least
        ``num_arcs`` float32 values that stay alive during the call.
        """
        A = self._na
        if isinstance(weights, (bool, np.bool_)):
            raise TypeError("Graph.set_weights: weights must be a sequence, an array or an int address, got bool")
        if isinstance(weights, (int, np.integer)):
            addr = int(weights)
            if addr == 0:
                raise ValueError("Graph.set_weights: the address of the weights is 0 (NULL)")
            if A:
                import ctypes

                buf = (ctypes.c_float * A).from_address(addr)
                self._weight[:A] = np.frombuffer(buf, dtype=np.float32, count=A)
            return
        try:
            arr = np.asarray(weights)
        except Exception as exc:  # pragma: no cover - exotic objects
            raise TypeError(
                f"Graph.set_weights: weights must be a sequence, an array or an int address, got {type(weights).__name__}"
            ) from exc
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise TypeError(
                f"Graph.set_weights: weights must be numeric, got dtype {arr.dtype} ({type(weights).__name__})"
            )
        if arr.size != A:
            raise ValueError(
                f"Graph.set_weights: expected {A} weights (one per arc), got {arr.size} (shape {arr.shape})"
            )
        self._weight[:A] = arr.reshape(-1)

    def arc_sort(self, olabel: bool = False) -> None:
        """Mark the graph as sorted by input (or output) label, as GTN does.

        GTN reorders its per-node adjacency lists; duoloss's operations sort
        internally, so this only records the flag.  Arc indices and weights never
        change (the same holds in GTN).
        """
        self.mark_arc_sorted(olabel)

    def mark_arc_sorted(self, olabel: bool = False) -> None:
        """Record that the arcs are sorted by ``olabel`` (or ``ilabel``)."""
        if olabel:
            self._olabel_sorted = True
        else:
            self._ilabel_sorted = True

    def ilabel_sorted(self) -> bool:
        """Whether [`arc_sort`][duoloss.gtn.Graph.arc_sort] was called for input labels."""
        return self._ilabel_sorted

    def olabel_sorted(self) -> bool:
        """Whether [`arc_sort`][duoloss.gtn.Graph.arc_sort] was called for output labels."""
        return self._olabel_sorted

    # --------------------------------------------------------------- gradients
    @property
    def calc_grad(self) -> bool:
        """Whether gradients are computed for this graph (settable)."""
        return self._calc_grad

    @calc_grad.setter
    def calc_grad(self, value: bool) -> None:
        self._calc_grad = bool(value)
        if not self._calc_grad:
            self._inputs = ()
            self._grad_fn = None

    def is_grad_available(self) -> bool:
        """Whether a gradient has been accumulated into this graph."""
        return self._grad is not None or self._grad_lazy is not None

    def grad(self) -> "Graph":
        """The gradient as a graph with this graph's structure (``calc_grad=False``).

        Its arc weights are ``d output / d weight`` accumulated by [`backward`][duoloss.gtn.backward].

        Raises:
          RuntimeError: no gradient has been computed (as in GTN).
        """
        self._materialize_grad()
        if self._grad is None:
            raise RuntimeError("Graph.grad: gradient not calculated yet (call backward first)")
        n, A = self._n, self._na
        # The structure arrays are shared (as exact-length views): no graph ever
        # changes an existing node or arc in place (add_node / add_arc write past
        # the end or reallocate), only weights, and those are copied.
        return Graph._from_trusted(
            n, self._src[:A], self._dst[:A], self._ilabel[:A], self._olabel[:A],
            self._grad.astype(np.float32, copy=True), self._start[:n], self._accept[:n], False,
        )

    def zero_grad(self) -> None:
        """Forget the accumulated gradient."""
        self._grad = None
        self._grad_lazy = None

    def _materialize_grad(self) -> None:
        """Turn a gradient kept by reference (see `_add_grad`) into float32."""
        with _GRAD_LOCK:
            lazy = self._grad_lazy
            if lazy is not None:
                self._grad_lazy = None
                self._grad = np.array(lazy, dtype=np.float32, copy=True).reshape(self._na)

    def _add_grad(self, delta: np.ndarray, owned: bool = False) -> None:
        """Accumulate ``delta`` (float32 storage, as GTN).

        ``owned=True`` (from `backward`: an array no one modifies later)
        lets the first gradient be kept by reference and converted to float32
        only when it is read or added to: most intermediate graphs' gradients
        are never read.
        """
        if not self._calc_grad:
            return
        with _GRAD_LOCK:
            lazy = self._grad_lazy
            if lazy is not None:
                self._grad_lazy = None
                self._grad = np.array(lazy, dtype=np.float32, copy=True).reshape(self._na)
            if self._grad is None or self._grad.shape[0] != self._na:
                if owned and delta.dtype == np.float64 and delta.shape == (self._na,):
                    self._grad = None
                    self._grad_lazy = delta
                else:
                    self._grad = np.array(delta, dtype=np.float32, copy=True).reshape(self._na)
            else:
                self._grad += delta

    def id(self) -> int:
        """A unique integer identifying this graph object."""
        return self._id

    def __repr__(self) -> str:
        from .io import to_text

        return to_text(self)

    def __len__(self) -> int:  # pragma: no cover - convenience
        return self._na

    def __bool__(self) -> bool:
        """Always true, as GTN's graphs (``if graph:`` must not test ``len``)."""
        return True


def graph_arrays(g: Graph) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                  np.ndarray, np.ndarray]:
    """The arrays of a graph, as read-only views (no copy).

    Args:
      g: a [`Graph`][duoloss.gtn.Graph] (``duoloss.gtn.Graph`` is the same class).

    Returns:
      ``(num_nodes, src, dst, ilabel, olabel, weight, start, accept)`` with
      ``src, dst, ilabel, olabel`` ``int64[A]``, ``weight`` ``float32[A]`` and
      ``start, accept`` ``bool[num_nodes]``.  Arc ``a`` goes ``src[a] -> dst[a]``.

    Raises:
      TypeError: ``g`` is not a [`Graph`][duoloss.gtn.Graph].

    NB: the views alias the graph's storage; ``weight`` changes when the graph's
    weights are set.  Copy them if the graph may change.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"graph_arrays: g must be a duoloss.gtn.Graph, got {type(g).__name__}")
    n, A = g._n, g._na
    out = []
    for arr, size in ((g._src, A), (g._dst, A), (g._ilabel, A), (g._olabel, A),
                      (g._weight, A), (g._start, n), (g._accept, n)):
        v = arr[:size]
        v.flags.writeable = False
        out.append(v)
    return (n, *out)


def _released(gout, inputs):  # pragma: no cover - a marker, never called
    """Marks an operation whose record a ``backward`` without ``retain_graph`` freed."""
    raise ValueError("backward: cannot backward twice without retaining the graph")


def backward(g: Graph, grad: Optional[Graph] = None, retain_graph: bool = False) -> None:
    """Accumulate ``d g / d w`` into every graph ``g`` was computed from.

    The seed is ``grad``'s arc weights (default: ones, one per arc of ``g``).
    Walking the recorded operations in reverse topological order, each output's
    gradient is pushed to its inputs by the operation's gradient function and
    *added* to their ``grad`` (so repeated calls accumulate, as in GTN).

    Args:
      g: the graph to differentiate (usually a one-arc score graph).
      grad: optional seed gradient graph with ``g.num_arcs()`` arcs.
      retain_graph: keep the record of operations so ``backward`` can be called
        again; by default it is released as it is consumed (GTN semantics).

    Raises:
      TypeError / ValueError: bad arguments; ``g`` has ``calc_grad=False``;
        the record behind ``g`` was released by an earlier ``backward``
        without ``retain_graph=True`` (GTN's rule).
    """
    if not isinstance(g, Graph):
        raise TypeError(f"backward: g must be a Graph, got {type(g).__name__}")
    if not g._calc_grad:
        raise ValueError("backward: g does not require a gradient (calc_grad=False)")
    if grad is None:
        seed = np.ones(g._na, np.float32)
    else:
        if isinstance(grad, Graph):
            seed = np.asarray(grad._weight[: grad._na], np.float32)
        else:
            try:
                seed = np.asarray(grad, np.float32).reshape(-1)
            except (TypeError, ValueError):
                raise TypeError(f"backward: grad must be a Graph or a sequence of {g._na} "
                                f"floats, got {type(grad).__name__}") from None
        if seed.shape[0] != g._na:
            raise ValueError(
                f"backward: grad must have {g._na} arc weights (one per arc of g), got {seed.shape[0]}"
            )
    # Topological order of the computation record (iterative DFS post-order).
    if g._grad_fn is _released:
        raise ValueError("backward: cannot backward twice without retaining the graph "
                         "(pass retain_graph=True to the first backward)")
    order: List[Graph] = []
    seen = {g._id}
    stack = [(g, 0)]
    while stack:
        node, i = stack.pop()
        if i < len(node._inputs):
            stack.append((node, i + 1))
            child = node._inputs[i]
            if child._grad_fn is _released:
                raise ValueError("backward: cannot backward twice without retaining the graph "
                                 "(an intermediate result's record was released by an earlier "
                                 "backward; pass retain_graph=True to it)")
            if child._calc_grad and child._id not in seen:
                seen.add(child._id)
                stack.append((child, 0))
        else:
            order.append(node)
    # Gradients flowing in this call (kept apart from the accumulated .grad).
    flow = {g._id: seed.astype(np.float64)}
    g._add_grad(seed)
    for node in reversed(order):
        gout = flow.pop(node._id, None)
        fn = node._grad_fn
        inputs = node._inputs
        if gout is not None and fn is not None:
            grads = fn(gout, inputs)
            for inp, gi in zip(inputs, grads):
                if gi is None or not inp._calc_grad:
                    continue
                gi = np.asarray(gi, dtype=np.float64)
                # gradient arrays are never modified in place below (nor by the
                # gradient functions): the input may keep a reference
                inp._add_grad(gi, owned=True)
                prev = flow.get(inp._id)
                flow[inp._id] = gi if prev is None else prev + gi
        if not retain_graph and fn is not None:
            # released: a later backward through ``node`` raises (as GTN)
            node._inputs = ()
            node._grad_fn = _released
