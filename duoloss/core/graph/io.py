"""Text and DOT formats for `Graph`.

GTN's text format::

    <start node ids separated by spaces>      (line 1, may be empty)
    <accept node ids separated by spaces>     (line 2, may be empty)
    src dst ilabel [olabel [weight]]          (one line per arc, in arc order)

Weights are written with the shortest decimal that round-trips the float32
value (GTN writes 6 significant digits, which loses precision).  The node count
is not stored: it is one more than the largest id mentioned, unless given.

GTN's binary format (`save` / `load`), all little-endian::

    int32  num_nodes, num_arcs, num_start, num_accept
    int32  start node ids [num_start], accept node ids [num_accept]
    int32  src, dst, ilabel, olabel   (one quadruple per arc, in arc order)
    float32 weights [num_arcs]

NB: the binary format stores int32, so `save` accepts only graphs whose
labels and sizes fit (labels in ``[-1, 2**31 - 1]``); the text format keeps any
label.
"""
from __future__ import annotations

import io
import os
from typing import Dict, Optional, Union

import numpy as np

from .graph import EPSILON, MAX_LABEL, Graph

__all__ = ["to_text", "from_text", "savetxt", "loadtxt", "save", "load", "to_dot", "draw"]

#: The most nodes a graph read from a file may have (``2**28``).  The text format
#: has no node count (it is one more than the largest id), so one mistyped id
#: would otherwise allocate per-node storage for every id below it.
_MAX_NODES = 2 ** 28


def _fmt_weight(w: np.float32) -> str:
    return str(np.float32(w))


def to_text(g: Graph) -> str:
    """The graph in GTN's text format (exact float32 weights)."""
    n, A = g._n, g._na
    lines = [
        " ".join(str(i) for i in np.flatnonzero(g._start[:n])),
        " ".join(str(i) for i in np.flatnonzero(g._accept[:n])),
    ]
    src, dst = g._src[:A].tolist(), g._dst[:A].tolist()
    il, ol = g._ilabel[:A].tolist(), g._olabel[:A].tolist()
    w = g._weight[:A]
    for a in range(A):
        lines.append(f"{src[a]} {dst[a]} {il[a]} {ol[a]} {_fmt_weight(w[a])}")
    return "\n".join(lines) + "\n"


def from_text(text: str, num_nodes: Optional[int] = None, *, calc_grad: bool = True) -> Graph:
    """Parse GTN's text format (empty start/accept lines allowed).

    Args:
      text: the graph text.
      num_nodes: the node count; default ``1 + max id`` mentioned (isolated
        nodes that are neither start nor accept cannot be represented otherwise).
      calc_grad: of the new graph.

    Raises:
      ValueError: malformed text (names the line), node ids outside ``[0, 2**28)``
        (names the line) or labels outside ``[-1, 2**63 - 1]``, ``num_nodes``
        below ``1 + max id`` or above ``2**28``.
      TypeError: ``num_nodes`` is not an int.
    """
    if not isinstance(text, str):
        raise TypeError(f"loadtxt: text must be str, got {type(text).__name__}")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()   # the newline ending the last line
    if len(lines) < 2:
        raise ValueError("loadtxt: expected a start-node line and an accept-node line "
                         f"(either may be empty), got {len(lines)} line(s)")

    def node_range(k: int, line: str, values):
        bad = [v for v in values if not 0 <= v < _MAX_NODES]
        if bad:
            raise ValueError(f"loadtxt: line {k}: node ids must lie in [0, 2**28) "
                             f"(duoloss's limit on a graph read from a file), got {bad[0]} "
                             f"in {line!r}")

    def ids(line: str, what: str, k: int):
        try:
            out = [int(t) for t in line.split()]
        except ValueError:
            raise ValueError(f"loadtxt: line for {what} must hold node ids, got {line!r}") from None
        node_range(k, line, out)
        return out

    starts = ids(lines[0], "start nodes (line 1)", 1)
    accepts = ids(lines[1], "accept nodes (line 2)", 2)
    for what, lst in (("start", starts), ("accept", accepts)):
        if len(set(lst)) != len(lst):
            raise ValueError(f"loadtxt: repeated {what} node id in {lst}")
    src, dst, il, ol, w = [], [], [], [], []
    for k, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if not parts:
            continue
        if not 3 <= len(parts) <= 5:
            raise ValueError(
                f"loadtxt: line {k} must be 'src dst ilabel [olabel [weight]]', got {line!r}"
            )
        try:
            s, d, i = int(parts[0]), int(parts[1]), int(parts[2])
            o = int(parts[3]) if len(parts) > 3 else i
            wt = float(parts[4]) if len(parts) > 4 else 0.0
        except ValueError:
            raise ValueError(f"loadtxt: cannot parse line {k}: {line!r}") from None
        if not (EPSILON <= i <= MAX_LABEL and EPSILON <= o <= MAX_LABEL):
            raise ValueError(f"loadtxt: line {k}: labels must lie in [-1, 2**63 - 1] "
                             f"(-1 = epsilon), got {line!r}")
        node_range(k, line, (s, d))
        src.append(s)
        dst.append(d)
        il.append(i)
        ol.append(o)
        w.append(wt)
    mentioned = starts + accepts + src + dst
    need = (max(mentioned) + 1) if mentioned else 0
    if num_nodes is None:
        num_nodes = need
    else:
        if isinstance(num_nodes, (bool, np.bool_)) or not isinstance(num_nodes,
                                                                      (int, np.integer)):
            raise TypeError(f"loadtxt: num_nodes must be an int, got "
                            f"{type(num_nodes).__name__}")
        if not need <= num_nodes <= _MAX_NODES:
            raise ValueError(f"loadtxt: num_nodes must lie in [{need}, 2**28] (at least one "
                             f"more than the largest node id in the text), got {num_nodes}")
    return Graph.from_arrays(
        num_nodes, np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(il, np.int64),
        np.asarray(ol, np.int64), np.asarray(w, np.float64).astype(np.float32),
        np.asarray(starts, np.int64), np.asarray(accepts, np.int64), calc_grad=calc_grad,
    )


def _file_and_graph(fn: str, first, second):
    """GTN's ``(file_name, graph)`` order, or duoloss's earlier ``(graph, file_name)``."""
    if isinstance(first, Graph) and not isinstance(second, Graph):
        first, second = second, first
    if not isinstance(second, Graph):
        raise TypeError(f"{fn}: graph must be a Graph, got {type(second).__name__}")
    if not (hasattr(first, "write") or isinstance(first, (str, bytes, os.PathLike))):
        raise TypeError(f"{fn}: file_name must be a path or a file object, "
                        f"got {type(first).__name__}")
    return first, second


def savetxt(file_name: Union[str, os.PathLike, io.TextIOBase], graph: Graph) -> None:
    """Write ``graph`` in GTN's text format to a path or a text file object.

    GTN's argument order ``savetxt(file_name, graph)``; the reverse order
    ``savetxt(graph, file_name)`` (earlier duoloss versions) is accepted too.
    """
    file_name, g = _file_and_graph("savetxt", file_name, graph)
    text = to_text(g)
    if hasattr(file_name, "write"):
        file_name.write(text)
        return
    with open(file_name, "w") as f:
        f.write(text)


def loadtxt(file_name: Union[str, os.PathLike, io.TextIOBase], num_nodes: Optional[int] = None,
            calc_grad: bool = True) -> Graph:
    """Read a graph in GTN's text format from a path or a text file object.

    Unlike GTN, empty start / accept lines (which GTN's own ``savetxt`` writes)
    are accepted.  ``num_nodes`` (a duoloss extension) keeps trailing isolated
    nodes.
    """
    if hasattr(file_name, "read"):
        text = file_name.read()
    else:
        with open(file_name) as f:
            text = f.read()
    return from_text(text, num_nodes, calc_grad=calc_grad)


_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


def save(file_name: Union[str, os.PathLike, io.BufferedIOBase], graph: Graph) -> None:
    """Write ``graph`` in GTN's binary format (``gtn.save(file_name, graph)``).

    ``file_name`` is a path or a binary file object; ``save(graph, file_name)``
    is accepted too.

    Raises:
      ValueError: a label, node id or count does not fit int32 (the format's
        storage; use `savetxt` for larger labels).
    """
    file_name, g = _file_and_graph("save", file_name, graph)
    n, A = g._n, g._na
    lim = 2 ** 31 - 1
    if n > lim or A > lim:
        raise ValueError(f"save: the binary format holds at most 2**31 - 1 nodes and arcs, "
                         f"got {n} nodes and {A} arcs")
    starts = np.flatnonzero(g._start[:n])
    accepts = np.flatnonzero(g._accept[:n])
    quads = np.stack([g._src[:A], g._dst[:A], g._ilabel[:A], g._olabel[:A]], axis=1)
    if A and int(quads[:, 2:].max()) > lim:
        raise ValueError(f"save: labels must lie in [-1, 2**31 - 1] for the binary format, "
                         f"got {int(quads[:, 2:].max())} (savetxt keeps any label)")
    blob = b"".join([
        np.array([n, A, starts.size, accepts.size], _I32).tobytes(),
        starts.astype(_I32).tobytes(), accepts.astype(_I32).tobytes(),
        quads.astype(_I32).tobytes(), g._weight[:A].astype(_F32).tobytes(),
    ])
    if hasattr(file_name, "write"):
        file_name.write(blob)
        return
    with open(file_name, "wb") as f:
        f.write(blob)


def load(file_name: Union[str, os.PathLike, io.BufferedIOBase], calc_grad: bool = True) -> Graph:
    """Read a graph written by `save` or by GTN's ``gtn.save``.

    Raises:
      ValueError: the data is truncated or holds out-of-range ids or labels.
    """
    if hasattr(file_name, "read"):
        data = file_name.read()
    else:
        with open(file_name, "rb") as f:
            data = f.read()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"load: file_name must be opened in binary mode, got {type(data).__name__} data")
    if len(data) < 16:
        raise ValueError(f"load: expected at least 16 bytes (the header), got {len(data)}")
    n, A, ns, nacc = (int(x) for x in np.frombuffer(data, _I32, 4))
    if min(n, A, ns, nacc) < 0:
        raise ValueError(f"load: negative count in the header: nodes={n}, arcs={A}, "
                         f"start={ns}, accept={nacc}")
    if n > _MAX_NODES:
        raise ValueError(f"load: the header asks for {n} nodes, more than duoloss's limit of "
                         f"2**28 nodes for a graph read from a file")
    need = 16 + 4 * (ns + nacc) + 16 * A + 4 * A
    if len(data) != need:
        raise ValueError(f"load: the header (nodes={n}, arcs={A}, start={ns}, accept={nacc}) "
                         f"needs {need} bytes, got {len(data)}")
    o = 16
    starts = np.frombuffer(data, _I32, ns, o).astype(np.int64)
    o += 4 * ns
    accepts = np.frombuffer(data, _I32, nacc, o).astype(np.int64)
    o += 4 * nacc
    quads = np.frombuffer(data, _I32, 4 * A, o).astype(np.int64).reshape(A, 4)
    o += 16 * A
    w = np.frombuffer(data, _F32, A, o).astype(np.float32)
    try:
        return Graph.from_arrays(n, quads[:, 0], quads[:, 1], quads[:, 2], quads[:, 3], w,
                                 starts, accepts, calc_grad=calc_grad)
    except ValueError as err:
        raise ValueError(f"load: {err}") from None


def _sym(label: int, table: Optional[Dict[int, str]]) -> str:
    if label == EPSILON:
        return "ε"
    if table and label in table:
        return str(table[label])
    return str(label)


def to_dot(g: Graph, isymbols: Optional[Dict[int, str]] = None,
           osymbols: Optional[Dict[int, str]] = None) -> str:
    """The graph in Graphviz DOT syntax (start nodes bold, accept nodes double circles)."""
    n, A = g._n, g._na
    out = ["digraph FST {", "  margin = 0;", "  rankdir = LR;",
           "  node [shape = circle, style = solid];"]
    for v in range(n):
        attrs = []
        if g._accept[v]:
            attrs.append("shape = doublecircle")
        if g._start[v]:
            attrs.append("style = bold")
        out.append(f"  {v} [label = \"{v}\"{', ' if attrs else ''}{', '.join(attrs)}];")
    for a in range(A):
        il, ol = int(g._ilabel[a]), int(g._olabel[a])
        lab = _sym(il, isymbols)
        if il != ol or osymbols:
            lab += ":" + _sym(ol, osymbols)
        lab += "/" + _fmt_weight(g._weight[a])
        out.append(f"  {int(g._src[a])} -> {int(g._dst[a])} [label = \"{lab}\"];")
    out.append("}")
    return "\n".join(out) + "\n"


def draw(g: Graph, file_name: Union[str, os.PathLike], isymbols: Optional[Dict[int, str]] = None,
         osymbols: Optional[Dict[int, str]] = None) -> str:
    """Render ``g`` with Graphviz to ``file_name`` (format from its extension).

    If Graphviz's ``dot`` is not installed, or the extension is ``.dot``/``.gv``,
    the DOT text is written instead (to ``file_name`` when it ends in
    ``.dot``/``.gv``, else to ``file_name + '.dot'``).

    Returns:
      The path that was written.
    """
    import shutil
    import subprocess

    if not isinstance(g, Graph):
        raise TypeError(f"draw: g must be a Graph, got {type(g).__name__}")
    path = os.fspath(file_name)
    dot = to_dot(g, isymbols, osymbols)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    exe = shutil.which("dot")
    if ext in ("dot", "gv") or not ext or exe is None:
        target = path if ext in ("dot", "gv") else path + ".dot"
        with open(target, "w") as f:
            f.write(dot)
        return target
    subprocess.run([exe, f"-T{ext}", "-o", path], input=dot.encode(), check=True)
    return path
