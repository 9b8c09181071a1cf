# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint unit integration e2e bench clean docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[postgres,embedded,api,llm,otel,dev]'
	touch $(STAMP)

# make demo KEEP=1: the dashboard, Flower and the nodes stay up after the summary (Ctrl-C stops).
demo: $(STAMP)
	$(PY) -m bidding.demo $(if $(KEEP),--keep)

# Two pytest processes (most of a test's time is spent waiting on workers and services): each
# test module runs whole in one of them, the end-to-end tests all in one (tests/conftest.py).
# TEST_PROCESSES=1 runs them in this one process, in order.
TEST_PROCESSES ?= 2
PYTEST_PARALLEL := $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder)

test: $(STAMP) lint
	$(PY) -m pytest $(PYTEST_PARALLEL)

lint: $(STAMP)
	$(VENV)/bin/ruff check bidding tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest tests/unit

integration: $(STAMP)
	$(PY) -m pytest tests/integration

e2e: $(STAMP)
	$(PY) -m pytest tests/e2e

# The docs site (mkdocs.yml, pages under docs/) into site/; --strict: a broken link fails.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf site .demo .pytest_cache .mypy_cache .ruff_cache .hypothesis
