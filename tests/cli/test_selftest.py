"""`hearth --self-test`: the real default model answers, and the memory accounting adds up."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.cli import main, selftest
from app.core.engines.backend import ReplyRequest
from app.core.models import model_source


def test_self_test_passes_with_the_default_model(default_loaded: object) -> None:
    report = selftest.run_checks(default_loaded)  # type: ignore[arg-type]
    names = [check.name for check in report.checks]
    assert names[:4] == ["model", "answer", "weights memory", "KV cache memory"]
    assert names[4:] in ([], ["memory snapshot"])  # the live accounting, where it is in the build
    assert report.passed, selftest.format_report(report)
    answer = report.checks[1].detail
    assert "tokyo" in answer.lower()
    text = selftest.format_report(report)
    assert text.startswith("Hearth ")
    assert text.splitlines()[-1].startswith("self-test passed in ")
    assert "matches the shape" in text


def test_kv_check_fails_when_the_cache_does_not_match_the_model_shape(default_loaded: object) -> None:
    from app.core.chat.events import ChatMessage
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState

    kv = KVState()
    engine = Engine(default_loaded, response_cache=None)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.0, max_new_tokens=2)
    list(engine.generate(ReplyRequest([ChatMessage("user", "Hi")], params, use_response_cache=False), kv=kv))
    assert selftest.kv_check(default_loaded, kv).ok  # type: ignore[arg-type]
    kv.ids.append(kv.ids[-1])  # the bookkeeping claims one token more than the tensors hold
    result = selftest.kv_check(default_loaded, kv)  # type: ignore[arg-type]
    assert not result.ok
    assert f"measured for {len(kv.ids)} tokens but the model's shape gives" in result.detail


def test_kv_check_fails_on_an_empty_cache(default_loaded: object) -> None:
    from app.core.engines.engine import KVState

    result = selftest.kv_check(default_loaded, KVState())  # type: ignore[arg-type]
    assert not result.ok
    assert result.detail == "0 bytes for 0 tokens after the reply"


def test_snapshot_check_catches_a_cache_the_accounting_does_not_see(default_loaded: object) -> None:
    from app.core.chat.events import ChatMessage
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState

    kv = KVState()
    engine = Engine(default_loaded, response_cache=None)  # type: ignore[arg-type]
    list(
        engine.generate(
            ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0.0, max_new_tokens=2)), kv=kv
        )
    )
    passed = selftest.snapshot_check(default_loaded, kv)  # type: ignore[arg-type]
    assert passed is not None and passed.ok, passed
    kv.ids.append(kv.ids[-1])
    failed = selftest.snapshot_check(default_loaded, kv)  # type: ignore[arg-type]
    assert failed is not None and not failed.ok
    assert f"but the cache holds {len(kv.ids) - 1}" in failed.detail


def test_snapshot_check_passes_for_a_q4_model_whose_embedding_stays_mapped(tiny_model_dir: Any) -> None:
    from app.core.chat.events import ChatMessage
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model
    from app.core.fastpath.packed import mapped_tensor_bytes

    loaded = load_model(str(tiny_model_dir("llama")), quantization="q4", device="cpu")
    if loaded.quantization != "q4":
        pytest.skip(f"no fused decode kernel here: {loaded.notices}")
    assert mapped_tensor_bytes(loaded.model) > 0  # placed on the CPU, left out of the accounting's weights
    kv = KVState()
    engine = Engine(loaded, response_cache=None)
    request = ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0.0, max_new_tokens=2))
    list(engine.generate(request, kv=kv))
    result = selftest.snapshot_check(loaded, kv)
    assert result is not None and result.ok, result


def test_expected_kv_bytes_uses_kv_heads_and_head_dim() -> None:
    from transformers import LlamaConfig

    gqa = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert selftest.expected_kv_bytes(gqa, tokens=10, element_size=2) == 2 * 30 * 3 * 64 * 10 * 2
    explicit = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, head_dim=32, hidden_size=64)
    assert selftest.expected_kv_bytes(explicit, tokens=1, element_size=4) == 2 * 2 * 4 * 32 * 1 * 4


def test_weights_check_fails_without_placements(default_loaded: object) -> None:
    empty = SimpleNamespace(placements=[])
    result = selftest.weights_check(empty)  # type: ignore[arg-type]
    assert not result.ok
    assert result.detail == "the device placements account for 0 bytes"


def test_self_test_flag_reports_a_missing_default_model_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(model_source, "DEFAULT_MODEL_PACKAGE", "no_such_model_package")
    assert main(["--self-test"]) == selftest.EXIT_FAILED
    out = capsys.readouterr().out
    assert "  FAIL  model: The embedded default model (SmolLM2-135M-Instruct) is not installed" in out
    assert out.strip().splitlines()[-1] == "self-test FAILED: model"


def test_self_test_forces_offline_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    selftest.force_offline()
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_a_wrong_answer_fails_the_answer_check(default_loaded: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selftest, "EXPECTED_WORD", "kyoto")
    report = selftest.run_checks(default_loaded)  # type: ignore[arg-type]
    assert not report.passed
    assert report.first_failure is not None and report.first_failure.name == "answer"
    assert report.first_failure.detail.startswith("expected 'kyoto' in the reply, got ")
    assert selftest.format_report(report).splitlines()[-1] == "self-test FAILED: answer"
