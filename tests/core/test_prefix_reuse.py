"""A reused KV prefix gives the reply a fresh run gives, bit for bit, on every CPU kernel variant this machine can run
(issue 28: on an AMX Xeon an edited turn that reused the cache answered differently from a fresh run).

CPU kernels choose their blocking, tail handling, split-K reduction and instruction set by the shape of a call, so a
row computed in a prefill call of 45 rows and the same row computed in one of 80 can differ in the last bits, enough
to flip a greedy near-tie. The engine therefore never reuses part of a prefill call: a prefix that ends inside one is
cut back to the call's start (app.core.engines.engine.KVState.reuse_for), and every row after it is computed by the
same calls, of the same shapes, as in a run without the cache. That needs no kernel to be row-invariant, only to give
the same bits for the same call, which each variant below is checked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.core.engines.engine import KVState, call_start
from app.core.engines.generation import PREFILL_CHUNK
from app.core.fastpath import cpu

REPO_ROOT = Path(__file__).resolve().parents[2]
X86 = cpu.machine_arch() == "x86_64"
FLAGS = cpu.cpu_flags()
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FLAGS
AVX2 = {"avx2", "fma"} <= FLAGS

# The kernel variants a CPU of another kind would run, forced here through the switches their libraries document:
# torch's ATEN_CPU_CAPABILITY (its own vectorized kernels), oneDNN's ONEDNN_MAX_CPU_ISA (its GEMMs; below AVX-512
# torch also stops routing bf16 GEMMs to oneDNN, and Hearth's prefill upcasts them to fp32, as on an AVX2-only CPU),
# and Hearth's HEARTH_KERNEL_TARGET (the fused decode step and the Q4_1 prefill kernel).
VARIANTS: dict[str, dict[str, str]] = {
    "this-cpu": {},
    "avx512-without-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "HEARTH_KERNEL_TARGET": "avx2"},
    "no-simd": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "HEARTH_KERNEL_TARGET": "scalar"},
}
RUNNABLE = {
    "this-cpu": True,
    "avx512-without-bf16": X86 and AVX512,
    "avx2": X86 and AVX2,
    "no-simd": X86,
}


class FakeCache:
    """Just what reuse_for touches: crop and an empty layer list (no sliding windows)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.layers: list[Any] = []

    def crop(self, amount: int) -> None:
        self.length += amount


def state(ids: list[int], calls: list[tuple[int, int]]) -> KVState:
    return KVState(cache=FakeCache(len(ids)), ids=list(ids), prefill_calls=list(calls))  # type: ignore[arg-type]


def test_a_prefix_that_ends_inside_a_prefill_call_is_cut_back_to_the_calls_start() -> None:
    prompt = list(range(100, 700))  # 600 tokens: prefilled as [0, 512) and [512, 600), then 20 decoded
    reply = list(range(900, 920))
    kv = state(prompt + reply, [(0, 512), (512, 600)])
    edited = [*prompt[:550], 5, 6, 7]
    assert kv.reuse_for(edited) == 512  # 550 shared, inside the second call: it runs again whole
    assert kv.ids == prompt[:512] and kv.prefill_calls == [(0, 512)] and kv.cache.length == 512  # type: ignore[union-attr]

    kv = state(prompt + reply, [(0, 512), (512, 600)])
    assert kv.reuse_for(prompt) == 512  # regenerate: the prompt's last call runs again, not just its last token
    kv = state(prompt + reply, [(0, 512), (512, 600)])
    assert kv.reuse_for([*prompt, *reply[:10], 1, 2]) == 610  # the next turn keeps the decoded reply it shares
    assert kv.prefill_calls == [(0, 512), (512, 600)]
    kv = state(prompt + reply, [(0, 512), (512, 600)])
    assert kv.reuse_for([*prompt[:300], 1]) == 0 and kv.cache is None  # inside the first call: nothing is kept


def test_call_start_names_the_call_that_wrote_a_position() -> None:
    calls = [(0, 512), (512, 600), (620, 700)]
    assert [call_start(calls, p) for p in (0, 1, 511, 512, 513, 600, 610, 620, 650, 700)] == [
        0, 0, 0, 512, 512, 600, 610, 620, 620, 700,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reuse_model(tiny_model_dir: Any) -> Path:
    """Wide enough that every GEMM goes to the libraries' blocked kernels (oneDNN, MKL), not their tiny-size paths."""
    return tiny_model_dir(
        "llama-untied", hidden_size=256, intermediate_size=512, num_attention_heads=4, head_dim=64,
        max_position_embeddings=2048,
    )  # fmt: skip


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_an_edited_turn_reuses_the_prefix_and_replies_as_a_fresh_run_bit_for_bit(
    variant: str, reuse_model: Path, tmp_path: Path
) -> None:
    if not RUNNABLE[variant]:
        pytest.skip(f"this CPU can't run the {variant} kernels")
    env = {**os.environ, **VARIANTS[variant], "HEARTH_CACHE_DIR": os.environ["HEARTH_CACHE_DIR"]}
    quantizations = "bf16,q4" if variant in ("this-cpu", "avx2") else "bf16"  # q4 runs the fused kernel's variants
    result = subprocess.run(
        [sys.executable, "-m", "tests.core.prefix_reuse_probe", str(reuse_model), quantizations],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["quantization"] for line in lines] == quantizations.split(",")
    if variant == "avx2":  # the fused step and the Q4_1 prefill run the AVX2 kernel, as on an AVX2-only CPU
        assert lines[1]["decode_path"] == "fused-q4" and "AVX2" in lines[1]["note"], lines[1]
        # neither VNNI kernel ("AVX-512 VNNI", "AVX2 with AVX-VNNI"); a compile's flags may name -DHEARTH_NO_AVXVNNI
        assert "AVX-512 VNNI" not in lines[1]["note"] and "AVX-VNNI" not in lines[1]["note"], lines[1]
    elif variant == "no-simd":  # the plain C build is refused: torch's kernels decode
        assert lines[0]["decode_path"] == "eager" and "lacks AVX2+FMA" in lines[0]["note"], lines[0]
    for line in lines:
        # A short first turn is one prefill call: the edit runs it again whole. A long one reuses its full chunk.
        assert line["short-calls"] == {"cached": 0, "kv_equal": True, "text_equal": True}, line
        assert line["long-calls"] == {"cached": PREFILL_CHUNK, "kv_equal": True, "text_equal": True}, line
