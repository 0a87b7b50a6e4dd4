# Two commands for a newcomer (Python 3.11, nothing else installed):
#   make demo   set up .venv and run every example against NumPy (GPU if there is one, else the
#               simulator); one summary line per check. The compile reports of the kernels:
#               .venv/bin/python examples/demo.py --reports
#   make test   set up .venv and run all test tiers
# On a machine with a GPU (no network needed: the Python found there runs it):
#   make gpu-check  the GPU tier and the GPU benchmarks, into benchmarks/results/
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test gpu-check lint format bench clean

$(VENV)/.installed: pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/python examples/demo.py

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHON=$(BIN)/python bash tests/run_tiers.sh

# The Python a GPU machine has: .venv's where make setup ran, else the one on PATH.
GPU_PYTHON ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .ruff_cache
