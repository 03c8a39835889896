"""The server's grammars and tools on the torch-free runtime (the one `hearth serve` opens for the default model):
structured output that finishes, tools on a template without them, a forced call cut short, grammars compiled off
the model's thread, schemas refused in their own terms."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from app.core.engines import constrained
from app.core.engines.backend import LoadRequest
from app.core.engines.lite.backend import LiteBackend, open_lite_backend
from app.core.fastpath import kernel
from app.core.server.protocol import Limits

KERNEL = kernel.load_library()
pytestmark = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no kernel library here: {KERNEL}")

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "population": {"type": "integer"},
        "area_km2": {"type": "number"},
        "kind": {"type": "string", "enum": ["city", "town", "village"]},
        "mayor": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"], "additionalProperties": False},
    },
    "required": ["name", "population", "area_km2", "kind", "mayor"],
    "additionalProperties": False,
}  # fmt: skip
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer",
                   "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": False},
}}  # fmt: skip
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris for the next two days?"}]


@pytest.fixture(scope="module")
def lite() -> Iterator[LiteBackend]:
    """The default model on the torch-free runtime, as `hearth serve` opens it (its packed copy written first)."""
    from app.core.engines.loader import load_model

    load_model(None, quantization="q4", device="cpu")
    opened = open_lite_backend(LoadRequest(None, device="cpu", response_cache=False))
    assert isinstance(opened, LiteBackend), opened
    yield opened
    opened.close()


def ask(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return client.chat.completions.create(model="x", messages=messages, **{"temperature": 0, **kwargs})


def test_a_schema_with_numbers_an_enum_and_a_nested_object_finishes(serve: Any, lite: LiteBackend) -> None:
    client = serve(lite).client()
    question = [{"role": "user", "content": "Describe the city of Lyon as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    reply = ask(client, question, max_tokens=300, response_format=fmt)
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    jsonschema.validate(json.loads(reply.choices[0].message.content), CITY)
    chunks = list(client.chat.completions.create(model="x", messages=question, max_tokens=300, temperature=0,
                                                 response_format=fmt, stream=True))  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(streamed), CITY)  # (a reused prefix may flip a near-tie: not the same reply)


def test_tools_on_a_template_without_them_go_through_the_fallback_prompt(serve: Any, lite: LiteBackend) -> None:
    client = serve(lite).client()
    reply = ask(client, WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=80)
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])

    # Streamed: OpenAI-style tool_calls deltas, joined by the client into the same call.
    with client.chat.completions.stream(model="x", messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                        max_tokens=80) as stream:  # fmt: skip
        deltas = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert len(deltas) >= 1 and json.loads(streamed.function.arguments) == json.loads(call.function.arguments)

    # The client sends the call and its result back: the fallback renders both as turns the template can show.
    follow_up = [*WEATHER_QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C, then rain."}]  # fmt: skip
    answer = ask(client, follow_up, tools=[WEATHER_TOOL], max_tokens=40)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls


def test_strict_tools_keeps_the_400(serve: Any, lite: LiteBackend) -> None:
    client = serve(lite, limits=Limits(tool_prompt_fallback=False)).client()
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, WEATHER_QUESTION, tools=[WEATHER_TOOL], max_tokens=5)
    assert "The chat template of SmolLM2-135M-Instruct does not support tools: send the request without" in (
        raised.value.message
    )


def test_a_forced_tool_call_cut_by_the_length_limit_is_an_error(serve: Any, lite: LiteBackend) -> None:
    client = serve(lite).client()
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=4)
    assert raised.value.code == "tool_call_incomplete"
    assert "The forced tool call was cut by the length limit after 4 tokens" in raised.value.message
    with pytest.raises(openai.APIError, match="cut by the length limit"):  # streamed: an error event, not a success
        list(ask(client, WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=4, stream=True))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "properties": {f"field_{i}": {"type": "integer"} for i in range(20_000)}},
         "bytes; Hearth enforces schemas of at most 65,536 bytes (its limit on schema size)"),
        ({"$ref": "#"}, "has a $ref at / that leads back to / without any property or item in between"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
         "outside the schema: Hearth enforces only references within the schema ('#/$defs/…') and never fetches"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}, "which is not in the schema"),
    ],
)  # fmt: skip
def test_schemas_it_can_not_enforce_are_400s_in_their_own_terms(
    serve: Any, lite: LiteBackend, schema: dict[str, Any], message: str
) -> None:
    server = serve(lite)
    with pytest.raises(openai.BadRequestError) as raised:
        ask(server.client(), [{"role": "user", "content": "Hi"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})  # fmt: skip
    assert message in raised.value.message
    assert raised.value.code == "invalid_schema" and raised.value.param == "response_format"
    assert server.records[-1].status == 400


def test_a_slow_compile_holds_no_other_request(serve: Any, lite: LiteBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grammar compiles in the server's compile thread: while one is held there, another request is answered."""
    entered, release = threading.Event(), threading.Event()
    build = constrained.GrammarCompiler._build

    def held(self: constrained.GrammarCompiler, spec: constrained.GrammarSpec) -> Any:
        entered.set()
        release.wait(120)
        return build(self, spec)

    monkeypatch.setattr(constrained.GrammarCompiler, "_build", held)
    monkeypatch.setattr(constrained, "COMPILE_SECONDS", 300.0)
    client = serve(lite).client()
    schema = {"type": "object", "properties": {"held": {"type": "boolean"}}, "required": ["held"]}
    results: list[Any] = []
    structured = threading.Thread(target=lambda: results.append(ask(
        client, [{"role": "user", "content": "Answer in JSON."}], max_tokens=20,
        response_format={"type": "json_schema", "json_schema": {"name": "held", "schema": schema}})))  # fmt: skip
    structured.start()
    try:
        assert entered.wait(60)
        plain = ask(client, [{"role": "user", "content": "Say hi."}], max_tokens=4)
        assert plain.choices[0].message.content and not results  # answered while the other still compiles
    finally:
        release.set()
        structured.join(120)
    (reply,) = results
    assert set(json.loads(reply.choices[0].message.content)) == {"held"}


def test_a_long_repeat_pattern_is_served_not_stuck_compiling(serve: Any, lite: LiteBackend) -> None:
    """Issue 28's 222-byte schema (xgrammar compiled `^a{40000}$` for 75 s on the model's thread): llguidance builds
    its lexer lazily, a step at a time within its fuel, so the reply starts at once and ends at its length limit."""
    reply = ask(serve(lite).client(), [{"role": "user", "content": "Write the letter a many times."}], max_tokens=6,
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {
                    "type": "string", "pattern": "^a{40000}$"}}})  # fmt: skip
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith('"a') and set(reply.choices[0].message.content[1:]) == {"a"}
