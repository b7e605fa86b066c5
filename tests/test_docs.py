"""The README and the docs site say what the code does: every ``python`` block runs.

Each page's ```` ```python ```` blocks run in order in one namespace per page (blocks share
it, as a reader would run them), from a scratch directory; all pages run in one fresh
interpreter, so torch and jax are imported once.
A block whose first lines hold ``# docs-test: requires MOD[, MOD...]`` is skipped, with
the reason, when one of those modules is not installed; nothing else is skipped.

Also checked here: the README stays short and its links resolve; the bad-input table
that the docs build writes (``docs/hooks/bad_input_table.py``) has one row per case of
``tests/bad_inputs.py``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_REQUIRES = re.compile(r"^#\s*docs-test:\s*requires\s+(.+)$", re.M)


def _pages():
    pages = [ROOT / "README.md"]
    for p in sorted(DOCS.rglob("*.md")):
        rel = p.relative_to(DOCS).parts
        if rel[0] in ("_incoming", "hooks"):
            continue  # not part of the site (see mkdocs.yml's exclude_docs)
        pages.append(p)
    return pages


def python_blocks(text: str) -> list:
    """The ```python blocks of a Markdown page, in order (fences at the line start)."""
    return [m.group(1) for m in _FENCE.finditer(text)]


def missing_requirements(block: str) -> list:
    """Modules named by the block's ``# docs-test: requires`` line that are not installed."""
    head = "\n".join(block.splitlines()[:3])
    names = []
    for m in _REQUIRES.finditer(head):
        names += [n.strip() for n in m.group(1).split(",") if n.strip()]
    return [n for n in names if importlib.util.find_spec(n) is None]


_RUNNER = r"""
import io, json, os, sys, traceback
pages = json.load(open(sys.argv[1]))
results = {}
for page, blocks in pages.items():
    # each page in a fresh namespace and its own scratch directory, as a reader would run it
    ns = {"__name__": "__main__"}
    os.makedirs(page.replace("/", "_"), exist_ok=True)
    os.chdir(page.replace("/", "_"))
    results[page] = {"ok": True, "skipped": [], "error": ""}
    for i, (skip, code) in enumerate(blocks, 1):
        if skip:
            results[page]["skipped"].append(f"block {i}: {skip}")
            continue
        try:
            exec(compile(code, f"<{page} block {i}>", "exec"), ns)
        except BaseException:
            results[page].update(ok=False, error=f"block {i} failed:\n{code}\n{traceback.format_exc()}")
            break
    os.chdir("..")
json.dump(results, open(sys.argv[2], "w"))
"""

_PAGES_WITH_CODE = [p for p in _pages() if python_blocks(p.read_text())]


@pytest.fixture(scope="module")
def page_results(tmp_path_factory):
    """Run every page's blocks in one fresh interpreter (one import of torch and jax)."""
    tmp = tmp_path_factory.mktemp("docs")
    todo = {}
    for page in _PAGES_WITH_CODE:
        blocks = []
        for code in python_blocks(page.read_text()):
            missing = missing_requirements(code)
            blocks.append([f"needs {', '.join(missing)}" if missing else "", code])
        todo[str(page.relative_to(ROOT))] = blocks
    (tmp / "pages.json").write_text(json.dumps(todo))
    (tmp / "runner.py").write_text(_RUNNER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("MPLBACKEND", "Agg")
    res = subprocess.run([sys.executable, "runner.py", "pages.json", "results.json"], cwd=tmp,
                         env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, f"the docs runner crashed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("page", _PAGES_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page, page_results):
    result = page_results[str(page.relative_to(ROOT))]
    assert result["ok"], f"{page.relative_to(ROOT)}: {result['error']}"
    if result["skipped"]:
        print(f"{page.name}: skipped {'; '.join(result['skipped'])}")


def test_block_extraction():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\n# docs-test: requires no_such_mod_xyz\nb = 2\n```\n"
    blocks = python_blocks(text)
    assert blocks == ["a = 1\n", "# docs-test: requires no_such_mod_xyz\nb = 2\n"]
    assert missing_requirements(blocks[0]) == []
    assert missing_requirements(blocks[1]) == ["no_such_mod_xyz"]
    assert missing_requirements("# docs-test: requires json, no_such_mod_xyz\n") == ["no_such_mod_xyz"]


def test_every_page_has_its_blocks_found():
    """A fence the extractor misses (e.g. ```` ```py ````) would silently go untested."""
    for page in _pages():
        text = page.read_text()
        opened = len(re.findall(r"^```(?:py|python3|pycon)\b", text, re.M))
        assert opened == 0, f"{page}: use ```python fences so the block is tested"


def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (ROOT / target).exists(), f"README links to missing {target}"


def test_docs_links_resolve():
    for page in _pages()[1:]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (page.parent / target).resolve().exists(), f"{page} links to missing {target}"


def test_bad_input_table_has_one_row_per_case():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    spec = importlib.util.spec_from_file_location("_docs_hook_bad_input_table", DOCS / "hooks" / "bad_input_table.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.PLACEHOLDER in (DOCS / "hardening.md").read_text()
    table = hook.bad_input_table()
    rows = [ln for ln in table.splitlines()[2:] if ln.startswith("| ")]
    sys.path.insert(0, str(ROOT / "tests"))
    from bad_inputs import all_cases

    cases = all_cases()
    assert len(rows) == len(cases) > 200
    # the first CTC case, read off the validation layer's contract
    assert rows[0].startswith("| 1 | torch = jax | `ctc_loss` |")
    assert "ctc_loss: argument 'log_probs' must have a floating dtype" in rows[0]
    page = hook.on_page_markdown((DOCS / "hardening.md").read_text(), None, None, None)
    assert hook.PLACEHOLDER not in page and rows[-1] in page


# --- release metadata ----------------------------------------------------------------------

def _pins():
    pins = {}
    for ln in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        ln = ln.split("#")[0].strip()
        if "==" in ln:
            name, ver = ln.split("==")
            pins[name.strip().lower()] = ver.strip()
    return pins


def _version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_release_metadata():
    import tomllib

    import duoloss

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["license-files"] == ["LICENSE"]
    # one version source: setuptools reads duoloss.__version__
    assert "version" in project["dynamic"] and "version" not in project
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "duoloss.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", duoloss.__version__)
    assert (ROOT / "duoloss" / "py.typed").exists()
    assert f"## [{duoloss.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_lower_bounds_are_the_tested_versions():
    """Every lower bound in pyproject is a version CI installs (requirements/constraints.txt):
    no bound admits an older release that no test has run."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    checked = 0
    for req in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9.]+)",
                         req.split(";")[0].replace(" ", ""))  # an environment marker aside
        assert m, f"pyproject: {req!r} should be 'name>=tested version'"
        name, bound = m.group(1).lower(), m.group(2)
        assert name in pins, f"{name} is not pinned in requirements/constraints.txt"
        assert _version_tuple(bound) <= _version_tuple(pins[name]), (name, bound, pins[name])
        checked += 1
    for name in ("torch", "jax", "jaxlib", "numpy", "numba"):   # the core and the frameworks: exact
        bound = next(re.search(r">=([0-9.]+)", r).group(1) for r in reqs
                     if re.match(rf"{name}\b(?!-)", r))
        assert _version_tuple(bound)[:2] == _version_tuple(pins[name])[:2], (name, bound, pins[name])
    assert checked >= 10
