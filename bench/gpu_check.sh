#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with an NVIDIA GPU, PyTorch and transformers, and no network.
#
#   bash bench/gpu_check.sh            # Llama-3.1-8B shape, random weights: NF4 (bitsandbytes) then bf16
#   bash bench/gpu_check.sh --tiny     # dry run (any machine, CPU included): a tiny Llama shape
#
# bitsandbytes is installed, if missing, from a wheel carried next to this script (pip --no-index). Prints, per
# precision: decode tok/s, TTFT at a 2,048-token prompt, fraction of the bandwidth roofline (bandwidth measured in
# the same run), and the memory planner's estimate vs the measured peak. Sized for under 8 minutes on an H100/H200
# class GPU; the whole run is capped at 9.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
# The project's venv when there is one (`make install`), else python3 on PATH; PYTHON overrides both.
if [ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
    PYTHON="$ROOT/.venv/bin/python"
fi
PY="${PYTHON:-python3}"
cd "$ROOT"

if ! "$PY" -c "import bitsandbytes" >/dev/null 2>&1; then
    wheel="$(ls "$HERE"/bitsandbytes-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -z "$wheel" ]; then
        echo "gpu_check: bitsandbytes is not installed and no bitsandbytes-*.whl lies next to $0" >&2
        exit 2
    fi
    "$PY" -m pip install --quiet --no-index --no-deps "$wheel"
fi

missing="$("$PY" - <<'PY'
import importlib.util
needed = ["torch", "transformers", "accelerate", "safetensors", "tokenizers", "psutil", "platformdirs"]
print(" ".join(name for name in needed if importlib.util.find_spec(name) is None))
PY
)"
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing" >&2
    exit 2
fi

exec timeout 540 "$PY" "$HERE/gpu_check.py" "$@"
