# Primus Flow's two entry points. Each sets itself up: Python environment, JVM jars, services.
#   make demo   run the main job end to end on the embedded local stack
#   make test   lint, type-check, import rules, unit and integration tests
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# --compile-bytecode: uv, unlike pip, leaves the .pyc files to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (CI's machine) no import ever writes them: every process then
# compiled torch, pyspark and mlflow again (12 s of CPU against 4.5 s, 2026-11-29).
UV := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
# CI and developer machines carry a CPU build of torch beside the checkout; PyPI's is CUDA.
TORCH_WHEEL := $(firstword $(wildcard ../shared/wheels/torch-*.whl))

.PHONY: demo test unit checks setup jars down clean

demo: setup
	$(BIN)/flow demo

test: setup checks
	$(BIN)/pytest -m "not integration" -n 2
	@# Two workers, each with a stack of its own (tests/conftest.py: its own FLOW_HOME and free
	@# ports); --dist loadscope keeps a module's or class's tests on one worker, so module and
	@# class fixtures (stacks, archives) are built once. 26 min against 41 serially, 2026-11-29.
	$(BIN)/pytest -m integration -n 2 --dist loadscope --durations=40

unit: setup
	$(BIN)/pytest -m "not integration and not slow" -n 2

checks: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

setup: $(STAMP) jars

$(STAMP): pyproject.toml requirements/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed: set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	@# uv installs the same pinned set as pip in a third of the time (this step: 50 s against
	@# 159 s on 2 cores, docs/experiments/2026-11-29-ci-time.md); the venv keeps pip for users.
	$(BIN)/pip install --quiet -c requirements/constraints.txt uv
	@if [ -n "$(TORCH_WHEEL)" ]; then echo "installing $(TORCH_WHEEL)"; $(UV) "$(TORCH_WHEEL)"; fi
	$(UV) -c requirements/constraints.txt -e '.[spark,train,dev]'
	touch $@

jars: $(STAMP)
	$(BIN)/flow jars fetch

down:
	@if [ -x $(BIN)/flow ]; then $(BIN)/flow services down; fi

clean: down
	rm -rf $(VENV) .flow .mypy_cache .ruff_cache .pytest_cache
