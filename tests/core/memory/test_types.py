"""The memory types the GUI displays are importable without torch, and serialise to plain JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from app.core.memory.types import MemoryPlan


def test_memory_package_does_not_import_torch() -> None:
    code = "import sys, app.core.memory, app.core.memory.calibration; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_plan_to_json_dict_is_plain_json() -> None:
    plan = MemoryPlan(
        model="m",
        model_type="llama",
        quantization="nf4",
        device="cpu",
        context=10,
        model_max_context=20,
        parameters=1,
        quantized_parameters=0,
        weights_bytes=2,
        weights_by_device={"cpu": 2},
        kv_bytes_per_token=3,
        kv_bytes_per_token_long=3,
        kv_bytes=30,
        kv_dtype="bf16",
        kv_layers=1,
        kv_sliding_layers=0,
        overhead_bytes=4,
        overhead={"runtime": 4},
        total_bytes=36,
        free_bytes=100,
        free_source="stated",
        free_after_bytes=64,
        fits="yes",
        max_context=20,
        notes=("a note",),
    )
    data = json.loads(json.dumps(plan.to_json_dict()))
    assert data["notes"] == ["a note"] and data["weights_by_device"] == {"cpu": 2} and data["fits"] == "yes"
