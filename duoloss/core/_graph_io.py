"""Text and DOT formats for :class:`~duoloss.core._graph.Graph`.

GTN's text format::

    <start node ids separated by spaces>      (line 1, may be empty)
    <accept node ids separated by spaces>     (line 2, may be empty)
    src dst ilabel [olabel [weight]]          (one line per arc, in arc order)

Weights are written with the shortest decimal that round-trips the float32
value (GTN writes 6 significant digits, which loses precision).  The node count
is not stored: it is one more than the largest id mentioned, unless given.
"""
from __future__ import annotations

import io
import os
from typing import Dict, Optional, Union

import numpy as np

from ._graph import EPSILON, MAX_LABEL, Graph

__all__ = ["to_text", "from_text", "savetxt", "loadtxt", "to_dot", "draw"]


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
      ValueError: malformed text (names the line), ids out of range.
    """
    if not isinstance(text, str):
        raise TypeError(f"loadtxt: text must be str, got {type(text).__name__}")
    lines = text.split("\n")
    while len(lines) < 2:
        lines.append("")

    def ids(line: str, what: str):
        try:
            return [int(t) for t in line.split()]
        except ValueError:
            raise ValueError(f"loadtxt: line for {what} must hold node ids, got {line!r}") from None

    starts = ids(lines[0], "start nodes (line 1)")
    accepts = ids(lines[1], "accept nodes (line 2)")
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
        src.append(s)
        dst.append(d)
        il.append(i)
        ol.append(o)
        w.append(wt)
    mentioned = starts + accepts + src + dst
    if num_nodes is None:
        num_nodes = (max(mentioned) + 1) if mentioned else 0
    return Graph.from_arrays(
        num_nodes, np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(il, np.int64),
        np.asarray(ol, np.int64), np.asarray(w, np.float64).astype(np.float32),
        np.asarray(starts, np.int64), np.asarray(accepts, np.int64), calc_grad=calc_grad,
    )


def savetxt(g: Graph, file_name: Union[str, os.PathLike, io.TextIOBase]) -> None:
    """Write ``g`` in GTN's text format to a path or a text file object."""
    if not isinstance(g, Graph):
        raise TypeError(f"savetxt: g must be a Graph, got {type(g).__name__}")
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
