"""The server over HTTP with the real engine: the embedded SmolLM2 (session fixture) and a tiny random model whose
chat template supports tools. Cached prefixes, seeds, stop sequences, JSON schemas and tool calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app.core.engines.local import EngineBackend

# A Hermes/Qwen-style template: tools listed in the system turn, calls as <tool_call>{json}</tool_call>.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n{% for tool in tools %}"
    '{{ tool | tojson }}\n{% endfor %}Answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>.'
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer",
                           "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def smol(default_loaded: Any) -> Iterator[EngineBackend]:
    backend = EngineBackend(default_loaded)
    yield backend
    for kv in backend._caches.values():
        kv.reset()


def ask(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return client.chat.completions.create(model="x", messages=messages, **{"temperature": 0, **kwargs})


def test_resent_conversation_reuses_the_cached_prefix(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    client = server.client()
    first_turn = [{"role": "user", "content": "Name three colours of the rainbow."}]
    first = ask(client, first_turn, max_tokens=24)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second_turn = [*first_turn, {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "And three more?"}]  # fmt: skip
    second = ask(client, second_turn, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Everything up to the first reply is reused (the reply's re-tokenized tail may differ by a token or two).
    assert cached >= first.usage.prompt_tokens
    assert cached < second.usage.prompt_tokens
    assert second.model_extra["timings"]["cache_n"] == cached
    assert second.model_extra["timings"]["prompt_n"] == second.usage.prompt_tokens - cached


def test_two_clients_keep_their_own_cached_prefixes(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    client = server.client()
    alice = [{"role": "user", "content": "Alice asks: what is a kettle used for?"}]
    bob = [{"role": "user", "content": "Bob asks: why is the sky blue at noon?"}]
    alice_1 = ask(client, alice, max_tokens=12)
    ask(client, bob, max_tokens=12)  # another conversation in between
    alice_2 = ask(client, [*alice, {"role": "assistant", "content": alice_1.choices[0].message.content},
                           {"role": "user", "content": "Thanks."}], max_tokens=4)  # fmt: skip
    assert alice_2.usage.prompt_tokens_details.cached_tokens >= alice_1.usage.prompt_tokens


def test_same_seed_same_reply(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    client = server.client()
    question = [{"role": "user", "content": "Write one sentence about the sea."}]
    replies = [ask(client, question, temperature=1.0, seed=seed, max_tokens=20).choices[0].message.content
               for seed in (7, 7, 8)]  # fmt: skip
    assert replies[0] == replies[1]
    assert replies[0] != replies[2]


def test_stop_sequence_on_the_real_model(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    client = server.client()
    question = [{"role": "user", "content": "Count from one to ten in words."}]
    full = ask(client, question, max_tokens=40).choices[0].message.content
    words = full.split()
    assert len(words) > 3, full
    stop = words[2]
    cut = ask(client, question, max_tokens=40, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < 40


def test_json_schema_reply_parses_and_validates(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    client = server.client()
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
            "capital": {"type": "boolean"},
            "rank": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "capital", "rank"],
        "additionalProperties": False,
    }
    for stream in (False, True):
        kwargs: dict[str, Any] = {"max_tokens": 60, "response_format": {
            "type": "json_schema", "json_schema": {"name": "city", "schema": schema}}}  # fmt: skip
        question = [{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}]
        if stream:
            chunks = list(client.chat.completions.create(model="x", messages=question, stream=True, **kwargs))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = ask(client, question, **kwargs).choices[0].message.content
        data = json.loads(text)
        assert set(data) == {"city", "capital", "rank"}
        assert data["city"] in ("Paris", "London", "Rome")
        assert isinstance(data["capital"], bool) and isinstance(data["rank"], int) and 1 <= data["rank"] <= 9


def test_json_object_reply_is_an_object(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    reply = ask(server.client(), [{"role": "user", "content": "Give me an empty JSON object."}], max_tokens=40,
                response_format={"type": "json_object"})  # fmt: skip
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut at max_tokens: still the start of an object
        assert reply.choices[0].message.content.startswith("{")


def test_bad_schema_is_a_400(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    with pytest.raises(openai.BadRequestError) as raised:
        ask(server.client(), [{"role": "user", "content": "Hi"}], max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})  # fmt: skip
    assert "The JSON schema in response_format cannot be enforced" in raised.value.message


def test_tools_on_a_template_without_tools_go_through_the_fallback_prompt(serve: Any, smol: EngineBackend) -> None:
    """The torch engine masks its tensors with the same grammar (app/core/engines/engine.py TensorMask)."""
    server = serve(smol)
    reply = ask(server.client(), [{"role": "user", "content": "What is the weather in Paris for two days?"}],
                tools=[WEATHER_TOOL], tool_choice="required", max_tokens=60)  # fmt: skip
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] in ("Paris", "Oslo")
    assert 1 <= arguments["days"] <= 7


@pytest.fixture(scope="module")
def tool_model(tiny_model_dir: Any) -> Iterator[EngineBackend]:
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir("llama")), quantization="fp32", device="cpu")
    loaded.tokenizer.chat_template = TOOL_TEMPLATE
    backend = EngineBackend(loaded)
    yield backend


def test_forced_tool_call_streams_as_the_openai_client_expects(serve: Any, tool_model: EngineBackend) -> None:
    server = serve(tool_model)
    client = server.client()
    question = [{"role": "user", "content": "What is the weather in Paris for two days?"}]
    reply = ask(client, question, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=60)
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in ("Paris", "Oslo") and 1 <= arguments["days"] <= 7

    with client.chat.completions.stream(model="x", messages=question, tools=[WEATHER_TOOL], temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                        max_tokens=60) as stream:  # fmt: skip
        for _event in stream:
            pass
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert streamed.function.name == "get_weather"
    assert json.loads(streamed.function.arguments) == arguments  # greedy: the same call

    # The client sends the call and its result back: the template renders both, the model answers.
    follow_up = [*question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."}]  # fmt: skip
    answer = ask(client, follow_up, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=5)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_completions_on_the_real_model(serve: Any, smol: EngineBackend) -> None:
    server = serve(smol)
    reply = server.client().completions.create(model="x", prompt="The capital of France is", max_tokens=6,
                                               temperature=0)  # fmt: skip
    assert reply.choices[0].text.strip()
    assert reply.usage.prompt_tokens == 5
