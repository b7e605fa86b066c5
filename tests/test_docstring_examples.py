"""Every public function and class has an ``Examples`` section, and it runs (doctest).

The public API is what ``duoloss.torch``, ``duoloss.jax`` and ``duoloss.graphs`` export
(``__all__``) plus ``duoloss.warmup`` when it exists; the API reference renders these
docstrings. Each example prints a value known independently of duoloss (an analytic case:
uniform scores count paths, e.g. CTC over 2 uniform frames of 3 classes gives ``log 3``),
a documented shape, or an identity between two functions. Only the public object's own
docstring is collected (not its methods or private helpers), on tiny inputs; a
```` ```python ```` block in an Examples section runs as written.

Also here: every public object has its entry (``::: name``) on a page of the docs (the API reference; duoloss.warmup on its own page).
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

MODULES = ["duoloss.torch", "duoloss.jax", "duoloss.graphs"]
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _public_objects():
    out, seen = [], set()
    for modname in MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:  # a framework that is not installed
            continue
        for name in mod.__all__:
            obj = getattr(mod, name)
            if id(obj) in seen:  # PackedGraphs/pack_graphs: one object, exported by both
                continue
            seen.add(id(obj))
            out.append((f"{modname}.{name}", obj))
    duoloss = importlib.import_module("duoloss")
    if hasattr(duoloss, "warmup"):
        out.append(("duoloss.warmup", duoloss.warmup))
    return out


_OBJECTS = _public_objects()


def test_the_public_api_is_collected():
    names = {n for n, _ in _OBJECTS}
    assert {"duoloss.torch.ctc_loss", "duoloss.jax.rnnt_loss", "duoloss.graphs.ctc_graph"} <= names
    assert len(names) >= 45


@pytest.mark.parametrize("name,obj", _OBJECTS, ids=[n for n, _ in _OBJECTS])
def test_docstring_example_runs(name, obj):
    doc = obj.__doc__ or ""
    assert "\n    Examples:\n" in doc or "\nExamples:\n" in doc, f"{name}: no 'Examples:' section"
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    examples = sum(len(t.examples) for t in tests)
    section = inspect.cleandoc(doc).split("Examples:", 1)[1]
    fenced = re.findall(r"^\s*```python\n(.*?)^\s*```", section, re.S | re.M)
    assert examples >= 2 or fenced, f"{name}: the Examples section has no doctest lines ('>>> ...')"
    for code in fenced:  # a ```python block in the Examples section runs as written
        exec(compile(textwrap.dedent(code), f"<{name} example>", "exec"), {"__name__": "__main__"})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list = []
    for t in tests:
        runner.run(t, out=report.append)
    assert runner.failures == 0, f"{name}: docstring example failed:\n{''.join(report)}"


def test_every_public_object_is_on_an_api_page():
    rendered = set()
    for page in DOCS.rglob("*.md"):
        rendered |= set(re.findall(r"^::: (\S+)", page.read_text(), re.M))
    for modname in ("duoloss.graphs", "duoloss.gtn", "duoloss.core"):
        if f"{modname}" in rendered:  # a module page renders its public members
            rendered |= {f"{modname}.{n}" for n in importlib.import_module(modname).__all__}
    missing = [n for n, _ in _OBJECTS if n not in rendered]
    # PackedGraphs/pack_graphs are collected once (under duoloss.torch) but rendered per frontend
    assert not missing, f"public objects without a '::: name' entry in docs/: {missing}"


_SPHINX = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|math):`|^\s*\.\. (?:math|note|code)::", re.M)
_GROUPED = re.compile(r"^\s+([A-Za-z_]\w*(?:, [A-Za-z_]\w*)+):", re.M)


def _rendered_docstrings():
    """The docstrings the API reference renders: public objects, their public methods, and
    the module pages' members (duoloss.graphs, duoloss.gtn, duoloss.core)."""
    out = list(_OBJECTS)
    for modname in ("duoloss.gtn", "duoloss.core"):
        mod = importlib.import_module(modname)
        out += [(f"{modname}.{n}", getattr(mod, n)) for n in mod.__all__]
    for name, obj in list(out):
        if inspect.isclass(obj):
            out += [(f"{name}.{k}", v) for k, v in vars(obj).items()
                    if inspect.isfunction(v) and (not k.startswith("_") or k == "__init__")]
    return [(n, o.__doc__) for n, o in out if isinstance(getattr(o, "__doc__", None), str)]


def test_rendered_docstrings_use_the_renderers_syntax():
    """mkdocstrings renders Markdown: Sphinx roles and directives come out as literal text,
    and a grouped parameter line (``x, y: ...``) as one parameter named "x, y", "required"."""
    bad = []
    for name, doc in _rendered_docstrings():
        if _SPHINX.search(doc):
            bad.append(f"{name}: {_SPHINX.search(doc).group(0).strip()}")
        args = re.split(r"\n\s*(?:Returns|Raises|Yields|Examples|Attributes|NB|References):", doc.split("Args:", 1)[1])[0] \
            if "Args:" in doc else ""
        for m in _GROUPED.finditer(args):
            bad.append(f"{name}: grouped parameters '{m.group(1)}'")
    assert not bad, "docstrings the reference renders:\n" + "\n".join(bad)
