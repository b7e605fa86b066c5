# Two commands do all set-up on a fresh machine:
#   make demo   -- creates .venv (pinned versions) if needed, runs the demo (table + PNG)
#   make test   -- creates .venv if needed, runs the whole test suite
# and: make docs (mkdocs build --strict into ./site), make bench, make sdist,
# make recipe (the speech recipe, examples/speech: about 30 min on an idle 2-core machine).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs bench sdist install clean recipe

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[torch,jax,cuda,test,examples,plot,docs,recipe]"
# decoding test peer: pyctcdecode 0.5.0 declares numpy<2 (it runs on numpy 2), so no deps
	$(PY) -m pip install --quiet --no-deps -c requirements/constraints.txt pyctcdecode pygtrie
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m duoloss

# two workers (pytest-xdist), each taking whole test files (--dist loadfile: a file's tests
# keep their order and module fixtures); the suite needs a few GB of memory per worker
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# the speech recipe end to end (examples/speech): corpus, torch + JAX training, decoding,
# alignment; writes build/recipe/results.json, results.md and recipe.png
recipe: $(STAMP)
	$(PY) examples/speech/run.py --out build/recipe

bench: $(STAMP)
	$(PY) benchmarks/ctc.py --cold-start

sdist: $(STAMP)
	$(PY) -m pip install --quiet -c requirements/constraints.txt build
	$(PY) -m build --sdist --outdir dist .

clean:
	rm -rf $(VENV) build dist site *.egg-info duoloss-demo.png
