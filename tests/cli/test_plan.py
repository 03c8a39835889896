"""`hearth plan`: the table, the --json object, size parsing and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.memory.types import format_bytes, parse_size

JSON_FIELDS = {
    "parameters",
    "weights_bytes",
    "kv_bytes_per_token",
    "kv_bytes",
    "overhead_bytes",
    "total_bytes",
    "free_bytes",
    "fits",
    "max_context",
}


def test_plan_json_has_the_documented_fields(tiny_model_dir, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tiny_model_dir("llama")
    code = main(
        ["plan", str(folder), "--quant", "nf4", "--context", "256", "--device", "cpu", "--free", "1GiB", "--json"]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= JSON_FIELDS
    assert data["fits"] == "yes" and data["free_bytes"] == 2**30 and data["free_source"] == "stated"
    assert data["max_context"] == 512 and data["quantization"] == "nf4" and data["context"] == 256
    assert data["total_bytes"] == data["weights_bytes"] + data["kv_bytes"] + data["overhead_bytes"]


def test_plan_table_for_a_folder_holding_only_config_json(
    tiny_model_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "just-config"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_model_dir("gemma3") / "config.json").read_text())
    assert main(["plan", str(bare), "--quant", "bf16", "--device", "cpu", "--free", "8M"]) == 0
    out = capsys.readouterr().out
    assert "just-config · bf16 · cpu · 512 tokens of context" in out
    assert "1 capped by a sliding window" in out
    assert "verdict" in out and "does not fit" in out  # 8 MiB cannot hold even the overhead
    assert "largest context        0 tokens" in out


def test_plan_cuda_with_stated_free_memory(tiny_model_dir, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tiny_model_dir("llama")
    assert main(["plan", str(folder), "--device", "cuda", "--free", "24GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cuda:0" and data["quantization"] == "nf4"  # auto on CUDA is nf4
    assert data["overhead"]["cuda_context"] > 0


@pytest.mark.parametrize("bad", ["12XB", "GiB", "-3G", "1.2.3G", "0"])
def test_bad_sizes_are_refused_with_a_clear_message(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--device", "cpu", f"--free={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hearth: --free:") and "is not a memory size" in err


def test_missing_model_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "nope"), "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bad_context_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--context", "0", "--device", "cpu"]) == 2
    assert "--context must be at least 1" in capsys.readouterr().err


def test_parse_and_format_sizes() -> None:
    assert parse_size("24GiB") == 24 * 2**30
    assert parse_size("8G") == 8 * 2**30
    assert parse_size("8GB") == 8 * 10**9
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5g") == int(1.5 * 2**30)
    assert parse_size("1048576") == 2**20
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(-200 * 2**20) == "-200.0 MiB"


def test_ignore_fit_flag_is_accepted_by_model_commands() -> None:
    from app.cli import build_parser

    assert build_parser().parse_args(["chat", "--ignore-fit", "hi"]).ignore_fit is True
    assert build_parser().parse_args(["chat", "hi"]).ignore_fit is False


def test_the_default_gguf_plan_says_what_served_replies_may_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    """hearth serve's admission rule for replies decoded together, as the plan states it: a quarter of 1 GiB over 4
    replies of the default model's 23,040 bytes of KV per token (30 layers x 3 KV heads x 64 x 2 x bf16)."""
    assert main(["plan", "--free", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert (
        "reserve at most 256.0 MiB of KV cache, a quarter of the memory free at load: 4 at once of up to 2,912" in out
    )


def test_a_plan_for_several_served_replies_counts_a_cache_for_each(capsys: pytest.CaptureFixture[str]) -> None:
    """4 replies of 4,096 tokens: four caches in the KV figure and the total, the largest context per reply a quarter
    of one reply's, and the note says how many of them the server's budget (a quarter of 1 GiB: 256 MiB, 90 MiB a
    reply) runs together."""
    base = ["plan", "--free", "1GiB", "--context", "4096", "--json"]
    assert main(base) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*base, "--parallel", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert one["replies"] == 1 and four["replies"] == 4
    assert four["kv_bytes"] == 4 * one["kv_bytes"] == 4 * 4096 * 23_040
    assert four["total_bytes"] == one["total_bytes"] + 3 * one["kv_bytes"]
    room = one["free_bytes"] - (one["total_bytes"] - one["kv_bytes"])
    assert four["max_context"] == min(room // (4 * 23_040), four["model_max_context"])
    assert "At 4,096 tokens each, 2 of the 4 run together and the others wait" in four["notes"][-1]
    assert main(["plan", "--free", "1GiB", "--context", "4096", "--parallel", "4"]) == 0
    out = capsys.readouterr().out
    assert "360.0 MiB for 4 replies at 4,096 tokens each" in out and "tokens per reply" in out


def test_the_torch_runtime_plans_one_cache_whatever_parallel_says(
    tiny_model_dir, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tiny_model_dir("llama")
    command = ["plan", str(folder), "--quant", "nf4", "--context", "256", "--device", "cpu", "--free", "1GiB", "--json"]
    assert main(command) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*command, "--parallel", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["replies"] == 1 and data["kv_bytes"] == alone["kv_bytes"]
    assert "served replies decode one at a time on this runtime" in data["notes"][-1]


@pytest.mark.parametrize("count", ["0", "17"])
def test_parallel_out_of_range_is_refused(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--parallel", count]) == 2
    assert f"--parallel must be between 1 and 16 (got {count})." in capsys.readouterr().err
