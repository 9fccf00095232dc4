# `make test` and `make demo` each bootstrap .venv on first use (and rebuild the C core when
# csrc/ changes); nothing else needs to be installed first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py engine/_build.py $(wildcard csrc/*.c csrc/*.h)

.PHONY: test demo bench lint test-sanitize clean

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check engine
	$(VENV)/bin/mypy engine

test: lint
	$(VENV)/bin/pytest -q

demo: $(STAMP)
	$(VENV)/bin/lanes demo

bench: $(STAMP)
	$(PY) bench/bench_claim.py

clean:
	rm -rf $(VENV) build *.egg-info engine/_core*.so engine/_core.c
