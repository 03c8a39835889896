#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with an NVIDIA GPU, PyTorch and transformers, and no network.
#
#   make gpu-wheels                    # here, once: the wheels the GPU image lacks, into .gpu-wheels/ (23 MiB)
#   bash bench/gpu_check.sh            # there: Llama-3.1-8B shape, random weights: NF4 (bitsandbytes) then bf16
#   bash bench/gpu_check.sh --tiny     # dry run (any machine, CPU included): a tiny Llama shape
#
# First, before anything imports: the wheels in .gpu-wheels/ (or GPU_WHEELS) are installed with pip --no-index into a
# folder of their own that goes first on PYTHONPATH, so they win over the image's older copies (transformers 5.17,
# huggingface_hub 1.33, ...) without touching it. Prints, per precision: decode tok/s, TTFT at a 2,048-token prompt,
# fraction of the bandwidth roofline (bandwidth measured in the same run), and the memory planner's estimate vs the
# measured peak. Sized for under 8 minutes on an H100/H200 class GPU; the whole run is capped at 9.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
# The project's venv when there is one (`make install`), else python3 on PATH; PYTHON overrides both.
if [ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
    PYTHON="$ROOT/.venv/bin/python"
fi
PY="${PYTHON:-python3}"
cd "$ROOT"

WHEELS="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="$(mktemp -d "${TMPDIR:-/tmp}/hearth-gpu-site.XXXXXX")"
    trap 'rm -rf "$SITE"' EXIT
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
        "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS"
fi

missing="$("$PY" - <<'PY'
import importlib.util
needed = ["torch", "transformers", "accelerate", "safetensors", "tokenizers", "psutil", "platformdirs", "pydantic",
          "gguf", "bitsandbytes"]
print(" ".join(name for name in needed if importlib.util.find_spec(name) is None))
PY
)"
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing (run \`make gpu-wheels\` where pip works, carry .gpu-wheels)" >&2
    exit 2
fi

timeout 540 "$PY" "$HERE/gpu_check.py" "$@"
