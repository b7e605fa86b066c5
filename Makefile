# Two commands do all set-up on a fresh machine:
#   make demo   -- creates .venv (pinned versions) if needed, runs the demo
#   make test   -- creates .venv if needed, runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[torch,jax,test,examples]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m duoloss

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/ctc.py --cold-start

clean:
	rm -rf $(VENV) build *.egg-info
