"""No device-to-host synchronisation in the torch device path's code (static, no GPU).

Issue 27 point 4: with tensors on a device, an eager call may copy its small integer
arguments to the host once to validate them (as ``F.ctc_loss`` does) and nothing else.
On a GPU, ``python -m benchmarks.device --check`` runs every device loss under
``torch.cuda.set_sync_debug_mode("error")`` and inside a CUDA graph capture; here, with
no GPU, the source is parsed (``ast``) and every conversion of a tensor to a Python value
is refused in the device-path modules (`duoloss.torch._triton`, the gather plan of
`duoloss._xp.ctc`, and the ``if device:`` branches of the torch loss modules):
``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, and ``bool()``/``int()``/
``float()`` or an ``if``/``while`` test of anything computed by a method call,
comparison or indexing (a tensor).  ``bool(flag)``/``int(d)`` of a plain name (the
caller's Python arguments) stay allowed.  The one exception would be a function named
in `VALIDATION_HELPERS` (none today: the device path reads nothing back).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "duoloss"

#: Whole modules on the device path (``_aot`` is a development tool, not a launcher).
MODULES = sorted(p for p in (PKG / "torch" / "_triton").glob("*.py") if p.name != "_aot.py")
MODULES += [PKG / "_xp" / "ctc.py"]
#: Modules whose ``if device:`` branches are the device path.
BRANCHES = [PKG / "torch" / f for f in ("_ctc.py", "_rnnt.py", "_rnnt_k2.py", "_tdt.py",
                                         "_align.py")]
#: Functions allowed to read tensors back (the eager validation copy).
VALIDATION_HELPERS: frozenset = frozenset()

SYNC_METHODS = {"item", "tolist", "cpu", "numpy"}
CONVERSIONS = {"bool", "int", "float"}


def _tensorish(node: ast.AST) -> bool:
    """Whether an expression may be a tensor: it holds a method call, a comparison,
    an indexing or arithmetic on such (a plain name or constant is a Python value)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in ("stride", "dim", "numel", "size", "get", "startswith"):
                continue  # Python ints / strings
            return True
        if isinstance(sub, (ast.Compare, ast.Subscript)):
            return True
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self, path: Path):
        self.path = path
        self.where: List[str] = []
        self.found: List[Tuple[str, int, str]] = []

    def _add(self, node, what):
        fn = self.where[-1] if self.where else "<module>"
        if fn not in VALIDATION_HELPERS:
            self.found.append((f"{self.path.relative_to(ROOT)}:{node.lineno}", fn, what))

    def visit_FunctionDef(self, node):
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in SYNC_METHODS:
            self._add(node, f".{f.attr}()")
        if (isinstance(f, ast.Name) and f.id in CONVERSIONS and len(node.args) == 1
                and _tensorish(node.args[0])):
            self._add(node, f"{f.id}({ast.unparse(node.args[0])})")
        self.generic_visit(node)

    def _test(self, node):
        t = node.test
        if (isinstance(t, ast.Call) and isinstance(t.func, ast.Attribute)
                and t.func.attr in ("any", "all")):
            self._add(node, f"truth value of {ast.unparse(t)}")
        self.generic_visit(node)

    visit_If = visit_While = _test


def _device_branches(tree: ast.AST) -> Iterator[ast.AST]:
    """The bodies of ``if device:`` / ``if <...device...>:`` statements."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "device" in ast.unparse(node.test).split("(")[0]:
            yield from node.body


def scan() -> List[Tuple[str, int, str]]:
    found = []
    for path in MODULES:
        f = _Finder(path)
        f.visit(ast.parse(path.read_text(), str(path)))
        found += f.found
    for path in BRANCHES:
        f = _Finder(path)
        for stmt in _device_branches(ast.parse(path.read_text(), str(path))):
            f.visit(stmt)
        found += f.found
    return found


def test_device_path_reads_nothing_back():
    found = scan()
    assert not found, "host synchronisations on the device path:\n" + "\n".join(
        f"  {loc} in {fn}: {what}" for loc, fn, what in found)


@pytest.mark.parametrize("src, hits", [
    ("def f(x):\n    return x.item()", 1),
    ("def f(g):\n    if bool((g == 1).all()):\n        pass", 1),
    ("def f(g):\n    if g.any():\n        pass", 1),
    ("def f(t):\n    return int(t.sum()), float(t[0])", 2),
    ("def f(t):\n    return t.cpu().numpy()", 2),
    ("def f(flag, d, t):\n    return bool(flag), int(d), int(t.stride(0)), t.dim()", 0),
])
def test_the_scanner_finds_what_it_should(src, hits, tmp_path):
    """The scanner itself, on snippets with a known number of host reads."""
    path = ROOT / "tests" / "_snippet.py"  # (relative_to(ROOT) in messages)
    f = _Finder(path)
    f.visit(ast.parse(src))
    assert len(f.found) == hits, f.found


def test_the_scanner_sees_the_device_modules():
    names = {p.name for p in MODULES}
    assert {"_ops.py", "_rnnt_ops.py", "_dur_ops.py", "_frontend.py", "__init__.py",
            "_kernels.py", "_ctc_kernels.py", "_rnnt_kernels.py", "_dur_kernels.py"} <= names
    assert all(p.exists() for p in MODULES + BRANCHES)
