"""The public API is fully annotated (``py.typed`` ships) and mypy accepts it as users call it.

* Every public function, class ``__init__``/``forward`` of ``duoloss.torch``, ``duoloss.jax``,
  ``duoloss.graphs``, ``duoloss.gtn``, ``duoloss.core`` and ``duoloss.warmup`` annotates every parameter and its
  return value.
* ``mypy --strict`` on ``tests/typecheck/public_api.py`` (each public function called as a
  user writes it, ``assert_type`` on the results): the annotations are valid, resolve, and
  promise the documented result types; ``--strict`` makes a call to an unannotated function
  an error. Errors inside duoloss itself are not reported (``--follow-imports=silent``): this
  checks the API's contract, not the implementation.
* The same run rejects a wrong call (a ``str`` blank), so the check can fail.

mypy keeps its cache in ``.mypy_cache`` at the repository root: a cold run reads torch's
and jax's stubs (about 20 s of CPU), a warm one takes seconds.
"""
from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["duoloss.torch", "duoloss.jax", "duoloss.graphs", "duoloss.gtn", "duoloss.core", "duoloss"]


def _callables():
    for modname in MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if name == "PackedGraphs" or not callable(obj):  # a NamedTuple: its fields are the annotations
                continue
            if inspect.isclass(obj):
                yield f"{modname}.{name}.__init__", obj.__init__
                yield from ((f"{modname}.{name}.{k}", v) for k, v in vars(obj).items()
                            if inspect.isfunction(v) and not k.startswith("_"))
            else:
                yield f"{modname}.{name}", obj


def test_public_api_is_fully_annotated():
    missing = []
    for name, fn in _callables():
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty:
                missing.append(f"{name}({p.name})")
        if sig.return_annotation is inspect.Signature.empty:
            missing.append(f"{name} -> ?")
    assert not missing, "public API without annotations: " + ", ".join(missing)


def _mypy(*args):
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--python-version",
         "3.11", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_strict_accepts_the_public_api_as_users_call_it():
    pytest.importorskip("mypy")
    res = _mypy("tests/typecheck/public_api.py")
    assert res.returncode == 0, f"mypy:\n{res.stdout}\n{res.stderr}"


def test_mypy_rejects_a_wrong_call():
    pytest.importorskip("mypy")
    wrong = ("import torch\nimport duoloss.torch as dt\n"
             "x = torch.zeros(2, 1, 3)\n"
             "dt.ctc_loss(x, torch.tensor([[1]]), [2], [1], blank='0')\n")
    res = _mypy("-c", wrong)
    assert res.returncode == 1, res.stdout + res.stderr
    assert 'Argument "blank" to "ctc_loss" has incompatible type "str"; expected "int"' in res.stdout
