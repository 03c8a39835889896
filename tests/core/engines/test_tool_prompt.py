"""Tools on a template without them (app/core/engines/tool_prompt.py): the fallback prompt, earlier calls and results
as plain turns, and the forced call's schema with the tools' own $defs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.core.chat.events import ChatMessage
from app.core.engines.backend import ResponseFormat
from app.core.engines.constrained import GrammarCompiler, grammar_for_format, tool_call_schema
from app.core.engines.lite.engine import load_tokenizer
from app.core.engines.tool_prompt import AUTO_RULE, TOOLS_INTRO, fallback_messages, forced_tool_name

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
RECORD = {"type": "function", "function": {"name": "record", "parameters": {
    "$defs": {"Mayor": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}},
    "type": "object", "properties": {"mayor": {"$ref": "#/$defs/Mayor"}}, "required": ["mayor"]}}}  # fmt: skip


def test_the_tools_join_the_system_prompt_with_the_call_format() -> None:
    out = fallback_messages([ChatMessage("system", "Be brief."), ChatMessage("user", "Weather?")], [WEATHER],
                            forced=False)  # fmt: skip
    system = out[0].content
    assert system.startswith("Be brief.\n\n" + TOOLS_INTRO)
    assert '- get_weather: The weather in a city. Arguments: {"type": "object"' in system
    assert system.endswith(AUTO_RULE) and "<tool_call>" in AUTO_RULE
    assert [m.role for m in out] == ["system", "user"]
    alone = fallback_messages([ChatMessage("user", "Weather?")], [WEATHER, RECORD], forced=True, only="record")
    assert alone[0].role == "system" and "get_weather" not in alone[0].content
    assert alone[0].content.endswith('Call the tool record now: reply with only {"name": "TOOL_NAME", "arguments": '
                                     "{ARGUMENTS}} and nothing else.")  # fmt: skip


def test_earlier_calls_and_results_become_turns_any_template_renders() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    history = [
        ChatMessage("user", "Weather in Oslo?"),
        ChatMessage("assistant", "", {"tool_calls": [call]}),
        ChatMessage("tool", "Snow, -3 C.", {"tool_call_id": "call_1"}),
    ]
    out = fallback_messages(history, [WEATHER], forced=False)
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[2].content == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert out[3].content == "The result of the tool get_weather:\nSnow, -3 C."
    assert all(not m.extra for m in out)


def test_a_forced_call_names_its_tool() -> None:
    assert forced_tool_name(ResponseFormat("json_schema", tool_call_schema([WEATHER, RECORD], only="record"))) == (
        "record"
    )
    assert forced_tool_name(ResponseFormat("json_schema", tool_call_schema([WEATHER, RECORD]))) is None


@pytest.mark.parametrize("tools", [[RECORD], [WEATHER, RECORD]], ids=["one", "two"])
def test_a_tool_s_own_references_resolve_inside_the_call(
    default_tokenizer_folder: Path, tools: list[dict[str, Any]]
) -> None:
    compiler = GrammarCompiler(load_tokenizer(default_tokenizer_folder), 49152, {2})
    grammar = grammar_for_format(ResponseFormat("json_schema", tool_call_schema(tools)))
    assert grammar is not None
    mask = compiler.mask(grammar)
    text = json.dumps({"name": "record", "arguments": {"mayor": {"age": 61}}}, separators=(",", ":"))
    for token in compiler.tokenizer(text, add_special_tokens=False)["input_ids"]:
        assert mask.allowed()[token]
        mask.accept(token)
    assert mask.finished
