# Two commands on a fresh clone: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test bench gpu-check install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/shoal up

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	@$(BIN)/python -m pip install --quiet -e '.[dev,bench]' && $(BIN)/python benchmarks/api.py

# On a machine with an NVIDIA GPU, the MPS driver tools and torch (see tests/gpu/README.md).
gpu-check: $(STAMP)
	$(BIN)/python tests/gpu/check_mps.py --json gpu-check.json

clean:
	rm -rf $(VENV) .shoal .pytest_cache
