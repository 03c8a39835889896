"""Constrained decoding with llguidance on the real tokenizer (app/core/engines/constrained.py): the mask lets only
valid, finishing JSON through; schemas are bounded and checked, and refused in their own terms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.engines import constrained
from app.core.engines.backend import ResponseFormat
from app.core.engines.constrained import (
    GrammarCompiler,
    SchemaError,
    bounded_schema,
    grammar_for_format,
    grammar_for_tool_calls,
)
from app.core.engines.lite.engine import load_tokenizer
from app.core.models.gguf_tokenizer import load_gguf_tokenizer
from app.core.models.model_source import default_model_gguf

REPO = Path(__file__).resolve().parents[3]
VOCAB = 49152
EOS = 2  # <|im_end|>
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


@pytest.fixture(scope="module", params=["transformers", "standalone"])
def tokenizer(request: pytest.FixtureRequest, default_tokenizer_folder: Path) -> Any:
    """The default model's tokenizer as a folder gives it (transformers') and as its GGUF does (Hearth's own, which
    hands llguidance its backend's JSON without transformers)."""
    if request.param == "standalone":
        return load_gguf_tokenizer(default_model_gguf())
    return load_tokenizer(default_tokenizer_folder)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, VOCAB, {EOS})


def spec(schema: dict[str, Any] | None, kind: str = "json_schema") -> constrained.GrammarSpec:
    found = grammar_for_format(ResponseFormat(kind, schema))  # type: ignore[arg-type]
    assert found is not None
    return found


def decode(
    compiler: GrammarCompiler, grammar: constrained.GrammarSpec, prefer: str = "", steps: int = 120, seed: int = 0
) -> str:
    """A stand-in model through the mask: random logits, plus a strong pull towards `prefer`'s tokens (a small model
    that keeps writing "1"); greedy. Returns the text once the grammar is finished; fails if it never is."""
    mask = compiler.mask(grammar)
    rng = np.random.default_rng(seed)
    pulled = compiler.tokenizer(prefer, add_special_tokens=False)["input_ids"] if prefer else []
    picked: list[int] = []
    for _ in range(steps):
        logits = rng.standard_normal(VOCAB).astype(np.float32)
        logits[pulled] += 50.0
        token = int(mask.apply(logits).argmax())
        mask.accept(token)
        picked.append(token)
        if mask.finished:
            break
    assert mask.finished, compiler.tokenizer.decode(picked)
    return str(compiler.tokenizer.decode(picked))


def run_allowed(compiler: GrammarCompiler, grammar: constrained.GrammarSpec, prefix: str, piece: str) -> int:
    """How many times in a row `piece` may follow `prefix` (up to 60)."""
    mask = compiler.mask(grammar)
    for token in compiler.tokenizer(prefix, add_special_tokens=False)["input_ids"]:
        mask.accept(token)
    tokens = compiler.tokenizer(piece, add_special_tokens=False)["input_ids"]
    for count in range(60):
        for token in tokens:
            if not mask.allowed()[token]:
                return count
            mask.accept(token)
    return 60


def test_a_schema_s_mask_spells_valid_json(compiler: GrammarCompiler) -> None:
    assert set(json.loads(decode(compiler, spec(SCHEMA)))) == {"ok"}
    assert isinstance(json.loads(decode(compiler, spec(None, "json_object"), prefer='{"a":1}')), dict)


def test_text_has_no_grammar() -> None:
    assert grammar_for_format(ResponseFormat()) is None


def test_a_model_that_keeps_writing_digits_still_finishes(compiler: GrammarCompiler) -> None:
    """The runaway `"population": 1111…` of issue 31: at most 15 digits, then the grammar closes the number."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert abs(json.loads(decode(compiler, spec(schema), prefer="1"))["n"]) == 111_111_111_111_111


def test_integers_and_numbers_have_bounded_digits(compiler: GrammarCompiler) -> None:
    schema = spec({"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}}})
    assert run_allowed(compiler, schema, '{"n":', "1") == 15
    assert run_allowed(compiler, schema, '{"n":-', "1") == 15
    assert run_allowed(compiler, schema, '{"n":1,"x":', "1") == 15
    assert run_allowed(compiler, schema, '{"n":1,"x":1.', "1") == 9
    assert run_allowed(compiler, spec(None, "json_object"), '{"a":', "1") == 15  # any JSON: numbers bounded too
    assert run_allowed(compiler, spec(None, "json_object"), '{"a":[{"b":', "1") == 15


def test_the_schema_s_own_bounds_and_lengths_are_kept(compiler: GrammarCompiler) -> None:
    assert run_allowed(compiler, spec({"type": "integer", "minimum": 0, "maximum": 10**18}), "", "1") == 18
    small = compiler.mask(spec({"type": "integer", "minimum": 1, "maximum": 7}))
    digits = {d: compiler.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"}
    assert {d for d, token in digits.items() if small.allowed()[token]} == set("1234567")
    assert run_allowed(compiler, spec({"type": "string", "maxLength": 5}), '"', "a") == 5
    items = {"type": "array", "items": {"type": "integer", "maximum": 9, "minimum": 0}, "maxItems": 3}
    assert run_allowed(compiler, spec(items), "[1", ",1") == 2


def test_bounds_are_added_only_where_the_schema_has_none() -> None:
    bounded = bounded_schema({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer", "minimum": 5}, "c": {"type": ["number", "null"]},
        "d": {"type": "number", "maximum": 1e-12, "minimum": 0}, "e": {}}}, "The schema")  # fmt: skip
    properties = bounded["properties"]
    assert (properties["a"]["minimum"], properties["a"]["maximum"]) == (-(10**15 - 1), 10**15 - 1)
    assert properties["b"]["minimum"] == 5 and "multipleOf" not in properties["b"]
    assert properties["c"]["multipleOf"] == 1e-9
    assert "multipleOf" not in properties["d"]  # finer bounds than 1e-9: no step that would rule them out
    assert properties["e"] == {"$ref": f"#/$defs/{constrained.ANY_VALUE}"}  # "any value", with bounded numbers
    assert bounded["additionalProperties"] is False  # listed properties only, as OpenAI's strict mode


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("https://example.com/city.json", "outside the schema: Hearth enforces only references within the schema"),
        ("file:///etc/passwd", "and never fetches one"),
        ("other.json#/$defs/x", "outside the schema"),
        ("#/$defs/missing", "which is not in the schema"),
        ("#", "leads back to / without any property or item in between"),
    ],
)
def test_references_that_can_not_be_enforced_are_refused_in_the_schema_s_terms(reference: str, message: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": reference}}} if reference != "#" else {"$ref": "#"}
    with pytest.raises(SchemaError, match=message) as raised:
        spec(schema)
    assert ".cc" not in str(raised.value) and "json_schema_converter" not in str(raised.value)


def test_local_references_and_recursion_through_properties_compile(compiler: GrammarCompiler) -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v", "kids"]}},
        "$ref": "#/$defs/node"}  # fmt: skip
    assert "v" in json.loads(decode(compiler, spec(tree), steps=400))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 60} for i in range(999)}},
         "bytes; Hearth enforces schemas of at most 65,536 bytes"),
        ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1001)}},
         "names 1,001 properties; Hearth enforces at most 1,000"),
        ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(201)}},
         "leaves 201 properties of the object at / optional; Hearth enforces at most 200"),
        (json.loads('{"type":"array","items":' * 40 + "{}" + "}" * 40), "more than 32 deep"),
    ],
)  # fmt: skip
def test_schemas_over_the_documented_limits_are_refused_naming_the_limit(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        spec(schema)


def test_a_compile_over_the_time_limit_is_refused_and_remembered(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = GrammarCompiler(tokenizer, VOCAB, {EOS})
    compiler.llg_tokenizer()
    slow = spec({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(800)},
                 "required": [f"p{i}" for i in range(800)]})  # fmt: skip
    monkeypatch.setattr(constrained, "COMPILE_SECONDS", 0.0005)
    with pytest.raises(SchemaError, match=r"took longer than 0.0005 s to compile into a grammar \(Hearth's limit"):
        compiler.compile(slow)
    monkeypatch.setattr(constrained, "COMPILE_SECONDS", 60.0)
    with pytest.raises(SchemaError, match="took longer than"):  # refused again at once, not compiled again
        compiler.compile(slow)


def test_a_grammar_that_fails_at_its_first_step_is_refused_before_the_reply(compiler: GrammarCompiler) -> None:
    patterned = spec({"type": "string", "pattern": "^(a|b)(?=c)$"})  # a lookahead: llguidance has none
    with pytest.raises(SchemaError, match="The JSON schema in response_format cannot be enforced"):
        compiler.compile(patterned)


def follows(compiler: GrammarCompiler, mask: constrained.LogitsMask, text: str) -> bool:
    """Whether the grammar lets `text`'s tokens through, one by one (accepting them)."""
    for token in compiler.tokenizer(text, add_special_tokens=False)["input_ids"]:
        if not mask.allowed()[token]:
            return False
        mask.accept(token)
    return True


def test_tool_calls_grammar_allows_text_or_a_valid_call(compiler: GrammarCompiler) -> None:
    grammar = grammar_for_tool_calls([WEATHER_TOOL])
    text = compiler.mask(grammar)
    assert follows(compiler, text, "Hello there, it is sunny.")
    assert text.allowed()[EOS]  # free text may end
    call = compiler.mask(grammar)
    assert follows(compiler, call, '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>')
    assert call.allowed()[EOS]
    assert not follows(compiler, compiler.mask(grammar), '<tool_call>{"name":"get_time"')  # only the tools' names
    assert not follows(compiler, compiler.mask(grammar), '<tool_call>{"name":"get_weather","arguments":{"town"')
    assert not follows(compiler, compiler.mask(grammar), "<b>bold</b>")  # text can't start like a call


def test_masking_never_imports_torch(default_tokenizer_folder: Path) -> None:
    """The torch-free runtime masks its numpy logits with this module: no torch, no xgrammar."""
    code = (
        "import sys, numpy as np\n"
        "from app.core.engines.backend import ResponseFormat\n"
        "from app.core.engines.constrained import GrammarCompiler, grammar_for_format\n"
        "from app.core.engines.lite.engine import load_tokenizer\n"
        f"tok = load_tokenizer(__import__('pathlib').Path({str(default_tokenizer_folder)!r}))\n"
        "mask = GrammarCompiler(tok, 49152, {2}).mask(grammar_for_format(ResponseFormat('json_object')))\n"
        "allowed = int(np.isfinite(mask.apply(np.zeros(49152, dtype=np.float32))).sum())\n"
        "assert 0 < allowed < 49152, allowed\n"
        "print('ok', 'torch' in sys.modules, 'xgrammar' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": ""}, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["ok", "False", "False"]
