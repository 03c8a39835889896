"""OpenAI request bodies to ReplyRequests (app/core/server/protocol.py), without a server: each rule and its
boundaries, and the exact sentence (and field) of each refusal, as an API client reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.server import protocol
from app.core.server.protocol import ApiError, Limits, ToolMode

LIMITS = Limits(max_tokens=100, default_max_tokens=50, max_messages=3)
HI = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "required": ["q"]}}}
OTHER = {"type": "function", "function": {"name": "other"}}


def refusal(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value


def test_error_bodies_are_openai_shaped() -> None:
    error = ApiError(429, "Slow down.", param="x", code="rate")
    assert error.body() == {
        "error": {"message": "Slow down.", "type": "rate_limit_error", "param": "x", "code": "rate"}
    }
    assert ApiError(400, "m").body()["error"]["type"] == "invalid_request_error"
    assert ApiError(418, "m").body()["error"]["type"] == "server_error"
    assert ApiError(503, "m", headers={"Retry-After": "3"}).headers == {"Retry-After": "3"}
    assert str(error) == "Slow down."  # what logs and tracebacks show


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"  ", "The request body is empty; send a JSON object."),
        (b"[1, 2]", "The request body must be a JSON object, not list."),
    ],
)
def test_bodies_that_are_not_json_objects(raw: bytes, message: str) -> None:
    assert refusal(protocol.decode_json, raw).message == message


def test_a_body_that_does_not_parse_says_why() -> None:
    assert refusal(protocol.decode_json, b"{nope").message.startswith("The request body is not valid JSON (")
    assert protocol.decode_json(b'{"a": 1}') == {"a": 1}


def test_sampling_defaults_are_openais() -> None:
    params = protocol.sampling({}, LIMITS, 0)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, 0, 0.0)
    assert params.repetition_penalty == 1.0 and params.seed is None
    assert params.max_new_tokens == 50  # the server's default, not the most a request may ask


def test_sampling_reads_every_field() -> None:
    body = {"temperature": 0, "top_p": 0.5, "top_k": 7.0, "min_p": 0.1, "repetition_penalty": 1.2, "seed": 3}
    params = protocol.sampling({**body, "max_tokens": 9}, LIMITS, 0)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.0, 0.5, 7, 0.1)
    assert (params.repetition_penalty, params.seed, params.max_new_tokens) == (1.2, 3, 9)
    assert protocol.sampling({"presence_penalty": 0, "frequency_penalty": 0.0}, LIMITS, 0).max_new_tokens == 50


def test_max_tokens_bounds_come_from_the_server_and_the_context_window() -> None:
    assert protocol.sampling({"max_tokens": 1}, LIMITS, 0).max_new_tokens == 1
    assert protocol.sampling({"max_tokens": 100}, LIMITS, 0).max_new_tokens == 100
    error = refusal(protocol.sampling, {"max_tokens": 101}, LIMITS, 0)
    assert (error.message, error.param) == (
        "'max_tokens' must be between 1 and 100 on this server (got 101).",
        "max_tokens",
    )
    assert refusal(protocol.sampling, {"max_tokens": 0}, LIMITS, 0).param == "max_tokens"
    # A 40-token window leaves room for 39; the default shrinks to fit too.
    assert protocol.sampling({"max_tokens": 39}, LIMITS, 40).max_new_tokens == 39
    assert "between 1 and 39" in refusal(protocol.sampling, {"max_tokens": 40}, LIMITS, 40).message
    assert protocol.sampling({}, LIMITS, 40).max_new_tokens == 39
    assert protocol.sampling({}, LIMITS, 1).max_new_tokens == 1
    # max_completion_tokens (the newer name) wins over max_tokens, and errors name it.
    both = {"max_completion_tokens": 5, "max_tokens": 500}
    assert protocol.sampling(both, LIMITS, 0).max_new_tokens == 5
    assert refusal(protocol.sampling, {"max_completion_tokens": 500}, LIMITS, 0).param == "max_completion_tokens"


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"n": 2}, "'n' must be 1: Hearth generates one choice per request (got 2).", "n"),
        (
            {"presence_penalty": 0.5},
            "'presence_penalty' is not supported (only 0); use 'repetition_penalty' (multiplicative, 1 = off) instead.",
            "presence_penalty",
        ),
        (
            {"frequency_penalty": -1},
            "'frequency_penalty' is not supported (only 0); use 'repetition_penalty' (multiplicative, 1 = off) "
            "instead.",
            "frequency_penalty",
        ),
        ({"logprobs": True}, "'logprobs' is not supported.", "logprobs"),
        ({"top_logprobs": 2}, "'logprobs' is not supported.", "logprobs"),
        ({"logit_bias": {"1": 5}}, "'logit_bias' is not supported.", "logit_bias"),
        ({"temperature": 2.5}, "'temperature' must be between 0 and 2 (got 2.5).", "temperature"),
        ({"temperature": "hot"}, "'temperature' must be a number, not 'hot'.", "temperature"),
        ({"top_p": True}, "'top_p' must be a number, not true.", "top_p"),
        ({"seed": 1.5}, "'seed' must be an integer, not 1.5.", "seed"),
        ({"max_tokens": False}, "'max_tokens' must be an integer, not false.", "max_tokens"),
    ],
)
def test_sampling_refusals_name_the_field(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(protocol.sampling, body, LIMITS, 0)
    assert (error.message, error.param) == (message, param)


def test_a_long_bad_value_is_shown_cut_to_40_characters() -> None:
    shown = "'" + "x" * 40 + "… (100 characters)'"
    assert (
        refusal(protocol.sampling, {"top_p": "x" * 100}, LIMITS, 0).message == f"'top_p' must be a number, not {shown}."
    )
    assert (
        refusal(protocol.sampling, {"seed": "x" * 100}, LIMITS, 0).message == f"'seed' must be an integer, not {shown}."
    )


def test_sampling_accepts_its_edges_and_passes_on_the_sampling_rules_sentence() -> None:
    assert protocol.sampling({"temperature": 2, "n": 1}, LIMITS, 0).temperature == 2.0
    error = refusal(protocol.sampling, {"top_p": 1.5}, LIMITS, 0)
    assert (error.message, error.param) == ("'top_p' must be in (0, 1] (got 1.5).", "top_p")


def test_stop_sequences() -> None:
    assert protocol.stop_sequences({}) == ()
    assert protocol.stop_sequences({"stop": "END"}) == ("END",)
    assert protocol.stop_sequences({"stop": ["a", "", "b", "x" * 200]}) == ("a", "b", "x" * 200)  # empty ones dropped
    message = ("'stop' takes at most 4 strings of at most 200 characters.", "stop")
    too_many = refusal(protocol.stop_sequences, {"stop": ["a", "b", "c", "d", "e"]})
    assert (too_many.message, too_many.param) == message
    too_long = refusal(protocol.stop_sequences, {"stop": ["x" * 201]})
    assert (too_long.message, too_long.param) == message
    error = refusal(protocol.stop_sequences, {"stop": ["a", 3]})
    assert (error.message, error.param) == ("'stop' must be a string or a list of strings.", "stop")
    assert refusal(protocol.stop_sequences, {"stop": 7}).param == "stop"


def test_response_formats() -> None:
    assert protocol.response_format({}).kind == "text"
    assert protocol.response_format({"response_format": {"type": "text"}}).kind == "text"
    assert protocol.response_format({"response_format": {"type": "json_object"}}).kind == "json_object"
    spec = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    fmt = protocol.response_format({"response_format": spec})
    assert (fmt.kind, fmt.json_schema, fmt.name) == ("json_schema", {"type": "object"}, "answer")
    bare = protocol.response_format({"response_format": {"type": "json_schema", "json_schema": {}}})
    assert (bare.kind, bare.json_schema, bare.name) == ("json_schema", {}, "")
    bad_schema = {"type": "json_schema", "json_schema": {"schema": [1]}}
    error = refusal(protocol.response_format, {"response_format": bad_schema})
    assert error.message == "'response_format.json_schema' must be an object with a 'schema' object."
    assert error.param == "response_format"
    assert refusal(protocol.response_format, {"response_format": {"type": "json_schema"}}).param == "response_format"
    error = refusal(protocol.response_format, {"response_format": "json"})
    assert error.message == "'response_format.type' must be 'text', 'json_object' or 'json_schema'."
    assert error.param == "response_format"


def test_messages_roles_and_content() -> None:
    body = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
            {"role": "tool", "content": None, "tool_call_id": 7, "name": "lookup"},
        ]
    }
    system, user, tool = protocol.messages(body, LIMITS)
    assert (system.role, system.content) == ("system", "Be brief.")
    assert (user.role, user.content) == ("user", "Hello")
    assert (tool.role, tool.content, tool.extra) == ("tool", "", {"tool_call_id": "7", "name": "lookup"})
    nameless = protocol.messages({"messages": [{"role": "tool", "content": "42"}]}, LIMITS)[0]
    assert nameless.extra == {"tool_call_id": ""}
    # Only an assistant's message carries tool calls; on a user's the field is ignored, never parsed.
    user_with_calls = {"role": "user", "content": "Hi", "tool_calls": ["not a call"]}
    assert protocol.messages({"messages": [user_with_calls]}, LIMITS)[0].extra == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "'messages' must be a non-empty list of {role, content} objects."),
        ("hi", "'messages' must be a non-empty list of {role, content} objects."),
        ([HI[0]] * 4, "'messages' has 4 items; this server takes at most 3."),
        (["hi"], "messages[0] must be an object with 'role' and 'content'."),
        (
            [HI[0], {"role": "robot", "content": "x"}],
            "messages[1].role must be system, developer, user, assistant or tool (got 'robot').",
        ),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string or a list of text parts."),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content: only text parts are supported (got 'image_url').",
        ),
        ([{"role": "user", "content": ["text"]}], "messages[0].content: only text parts are supported (got 'str')."),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content: only text parts are "
         "supported (got 'text')."),
        ([{"role": "assistant", "content": "", "tool_calls": {"id": 1}}], "messages[0].tool_calls must be a list."),
    ],
)  # fmt: skip
def test_bad_messages_are_named(raw: Any, message: str) -> None:
    error = refusal(protocol.messages, {"messages": raw}, LIMITS)
    assert (error.message, error.param) == (message, "messages")


def test_three_messages_fit_a_limit_of_three() -> None:
    assert len(protocol.messages({"messages": HI * 3}, LIMITS)) == 3


def test_earlier_tool_calls_reach_the_template_with_object_arguments() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "kettle"}'}},
        {"function": {"name": "other", "arguments": {"n": 1}}},
        {"function": {"name": "bare"}},
    ]
    (message,) = protocol.messages({"messages": [{"role": "assistant", "content": "", "tool_calls": calls}]}, LIMITS)
    assert message.extra["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": {"q": "kettle"}}},
        {"id": "", "type": "function", "function": {"name": "other", "arguments": {"n": 1}}},
        {"id": "", "type": "function", "function": {"name": "bare", "arguments": {}}},
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("lookup", "messages[1].tool_calls: each needs a function with a name."),
        ({"function": "lookup"}, "messages[1].tool_calls: each needs a function with a name."),
        ({"function": {"name": 3}}, "messages[1].tool_calls: each needs a function with a name."),
        ({"function": {"name": "f", "arguments": "{nope"}}, "messages[1].tool_calls: arguments must be a JSON object "
         "string."),
    ],
)  # fmt: skip
def test_malformed_earlier_tool_calls_are_a_400(call: Any, message: str) -> None:
    body = {"messages": [HI[0], {"role": "assistant", "content": "", "tool_calls": [call]}]}
    error = refusal(protocol.messages, body, LIMITS)
    assert (error.message, error.param) == (message, "messages")


def test_tool_choices() -> None:
    assert protocol.tools({}) == ((), ToolMode())
    assert protocol.tools({"tool_choice": "auto"}) == ((), ToolMode())
    assert protocol.tools({"tool_choice": "none"}) == ((), ToolMode())
    assert protocol.tools({"tools": [TOOL], "tool_choice": "none"}) == ((), ToolMode())
    tool_list, mode = protocol.tools({"tools": [TOOL, OTHER]})
    assert tool_list == (TOOL, OTHER) and mode == ToolMode("auto", names=("lookup", "other")) and not mode.forced
    assert protocol.tools({"tools": [TOOL], "tool_choice": "auto"})[1].choice == "auto"
    required = protocol.tools({"tools": [TOOL, OTHER], "tool_choice": "required"})[1]
    assert required == ToolMode("required", names=("lookup", "other")) and required.forced
    named = protocol.tools({"tools": [TOOL, OTHER], "tool_choice": {"type": "function", "function": {"name": "other"}}})
    assert named[1] == ToolMode("function", function="other", names=("lookup", "other")) and named[1].forced


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"tool_choice": "required"}, "'tool_choice' needs 'tools'.", "tool_choice"),
        ({"tools": {"a": 1}}, "'tools' must be a list of {type: 'function', function: {...}} objects.", "tools"),
        ({"tools": ["f"]}, "tools[0] must be {type: 'function', function: {name, parameters}}.", "tools"),
        ({"tools": [TOOL, {"type": "code", "function": {}}]}, "tools[1] must be {type: 'function', function: "
         "{name, parameters}}.", "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name is missing.", "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         "tools[0].function.parameters must be a JSON schema object.", "tools"),
        ({"tools": [TOOL], "tool_choice": {"function": {"name": "nope"}}},
         "'tool_choice' names 'nope', which is not in 'tools'.", "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "always"},
         "'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', function: {name}}.", "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tools_are_named(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(protocol.tools, body)
    assert (error.message, error.param) == (message, param)


def test_a_forced_call_is_held_to_its_tools_schema() -> None:
    one = protocol.forced_tool_schema((TOOL,), ToolMode("required", names=("lookup",)))
    assert one == {
        "type": "object",
        "properties": {"name": {"const": "lookup"}, "arguments": {"type": "object", "required": ["q"]}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    both = protocol.forced_tool_schema((TOOL, OTHER), ToolMode("required", names=("lookup", "other")))
    assert [option["properties"]["name"]["const"] for option in both["anyOf"]] == ["lookup", "other"]
    assert both["anyOf"][1]["properties"]["arguments"] == {"type": "object"}  # no parameters: any object
    named = protocol.forced_tool_schema(
        (TOOL, OTHER), ToolMode("function", function="other", names=("lookup", "other"))
    )
    assert named["properties"]["name"] == {"const": "other"}


def test_chat_requests() -> None:
    parsed = protocol.chat_request({"messages": HI, "model": "m", "stop": "X", "seed": 1}, LIMITS, 0)
    assert (parsed.stream, parsed.include_usage, parsed.model, parsed.endpoint) == (False, False, "m", "chat")
    reply = parsed.reply
    assert reply.conversation_id is None and reply.use_response_cache is False and reply.model is None
    assert reply.stop == ("X",) and reply.params.seed == 1 and reply.messages[0].content == "Hi"
    streamed = protocol.chat_request(
        {"messages": HI, "stream": True, "stream_options": {"include_usage": True}}, LIMITS, 0
    )
    assert streamed.stream and streamed.include_usage
    unstreamed = protocol.chat_request({"messages": HI, "stream_options": {"include_usage": True}}, LIMITS, 0)
    assert not unstreamed.include_usage  # usage chunks belong to a stream
    assert protocol.chat_request({"messages": HI, "model": None}, LIMITS, 0).model == ""
    assert protocol.chat_request({"messages": HI}, LIMITS, 40).reply.params.max_new_tokens == 39  # the window bounds it


def test_a_forced_tool_call_becomes_a_json_schema_format() -> None:
    body = {"messages": HI, "tools": [TOOL], "tool_choice": "required"}
    parsed = protocol.chat_request(body, LIMITS, 0)
    fmt = parsed.reply.response_format
    assert (fmt.kind, fmt.name) == ("json_schema", protocol.TOOL_CALL_FORMAT)
    assert fmt.json_schema == protocol.forced_tool_schema((TOOL,), parsed.tools)
    assert parsed.reply.tools == (TOOL,)
    error = refusal(protocol.chat_request, {**body, "response_format": {"type": "json_object"}}, LIMITS, 0)
    assert error.message == "A forced 'tool_choice' and a 'response_format' cannot be combined."
    assert error.param == "response_format"
    auto = protocol.chat_request(
        {"messages": HI, "tools": [TOOL], "response_format": {"type": "json_object"}}, LIMITS, 0
    )
    assert auto.reply.response_format.kind == "json_object"


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"messages": HI, "stream": "yes"}, "'stream' must be true or false.", "stream"),
        ({"messages": HI, "stream_options": [1]}, "'stream_options' must be an object.", "stream_options"),
    ],
)
def test_bad_chat_request_fields(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(protocol.chat_request, body, LIMITS, 0)
    assert (error.message, error.param) == (message, param)


def test_completion_requests() -> None:
    parsed = protocol.completion_request({"prompt": ["Once"], "stream": True, "stream_options": {"include_usage": 1}},
                                         LIMITS, 0)  # fmt: skip
    assert parsed.reply.raw_prompt == "Once" and parsed.reply.messages == () and parsed.endpoint == "completions"
    assert parsed.stream and parsed.include_usage and parsed.reply.use_response_cache is False
    plain = protocol.completion_request({"prompt": "Once", "stop": ["."], "model": "m", "temperature": 0}, LIMITS, 0)
    assert (plain.stream, plain.include_usage, plain.model, plain.reply.stop) == (False, False, "m", (".",))
    assert plain.reply.params.greedy and plain.reply.params.max_new_tokens == 50  # the body's sampling, the default
    assert protocol.completion_request({"prompt": "Once"}, LIMITS, 0).model == ""
    # The context window bounds max_tokens here too.
    assert protocol.completion_request({"prompt": "Once"}, LIMITS, 40).reply.params.max_new_tokens == 39
    assert refusal(protocol.completion_request, {"prompt": "Once", "max_tokens": 40}, LIMITS, 40).param == "max_tokens"
    odd = protocol.completion_request({"prompt": "Once", "stream": True, "stream_options": "x"}, LIMITS, 0)
    assert not odd.include_usage


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"prompt": ""}, "'prompt' must be a non-empty string (one prompt per request).", "prompt"),
        ({"prompt": ["a", "b"]}, "'prompt' must be a non-empty string (one prompt per request).", "prompt"),
        ({"prompt": "a", "echo": True}, "'echo' is not supported.", "echo"),
        ({"prompt": "a", "suffix": "z"}, "'suffix' is not supported.", "suffix"),
        ({"prompt": "a", "stream": 1}, "'stream' must be true or false.", "stream"),
    ],
)
def test_bad_completion_requests(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(protocol.completion_request, body, LIMITS, 0)
    assert (error.message, error.param) == (message, param)


def test_tool_calls_are_read_from_a_reply() -> None:
    auto = ToolMode("auto", names=("lookup", "other"))
    text = (
        'Let me check. <tool_call>{"name": "lookup", "arguments": {"q": "é"}}</tool_call> and '
        "<tool_call>not json</tool_call>"  # skipped, and the calls after it still read
        '<tool_call> {"name": "other", "parameters": {"n": 1}} </tool_call> <tool_call>{"name": "rm"}</tool_call>'
    )
    assert protocol.parse_tool_calls(text, auto) == [
        {"name": "lookup", "arguments": json.dumps({"q": "é"}, ensure_ascii=False)},
        {"name": "other", "arguments": '{"n": 1}'},
    ]
    assert protocol.parse_tool_calls('<tool_call>{"name": "lookup"}</tool_call>', auto) == [
        {"name": "lookup", "arguments": "{}"}
    ]
    assert protocol.parse_tool_calls(text, ToolMode()) == []
    forced = ToolMode("required", names=("lookup",))
    assert protocol.parse_tool_calls(' {"name": "lookup", "arguments": {}} ', forced) == [
        {"name": "lookup", "arguments": "{}"}
    ]
    assert (
        protocol.parse_tool_calls('<tool_call>{"name": "lookup"}</tool_call>', forced) == []
    )  # forced: the whole text
    assert protocol.parse_tool_calls("[1, 2]", forced) == []
