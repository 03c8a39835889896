"""OpenAI request bodies in, ReplyRequest out; one clear message (and the field it is about) for each bad value.

Mapped: temperature, top_p, max_tokens / max_completion_tokens, seed, stop, n=1, response_format (text,
json_object, json_schema: enforced while decoding), tools / tool_choice, stream, stream_options.include_usage.
Hearth extras (as llama-server accepts them): top_k, min_p, repetition_penalty.
Rejected with 400: n > 1, logprobs, a non-zero presence_penalty or frequency_penalty (Hearth has only the
multiplicative repetition_penalty, which is not the same thing; sending 0 is accepted), images and audio.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.core.chat.events import ChatMessage
from app.core.chat.sampling import MAX_TOP_K, SamplingParams
from app.core.engines.backend import ReplyRequest, ResponseFormat
from app.core.engines.constrained import tool_call_schema
from app.core.engines.tool_prompt import TOOL_CALL_FORMAT
from app.core.errors import InvalidSettingError
from app.core.server.logsafe import echo, printable
from app.core.storage.schema import check_field

MAX_STOP_SEQUENCES = 4  # as OpenAI
MAX_STOP_CHARS = 200
MAX_JSON_DEPTH = 64  # far beyond any real request (a tool schema nests a dozen levels), far below Python's stack


class ApiError(Exception):
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with this HTTP status."""

    TYPES: ClassVar[dict[int, str]] = {
             400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
             429: "rate_limit_error", 503: "server_overloaded", 500: "server_error"}  # fmt: skip

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None, log_message: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        # The log's version: without the client's own values, which may be prompt text (the log never holds one).
        self.log_message = log_message if log_message is not None else message

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 4096  # the most a request may ask for (also capped by the context window)
    default_max_tokens: int = 1024  # when the request says nothing: a missing max_tokens must not run away
    max_body_bytes: int = 4 * 2**20
    max_messages: int = 1024
    # Tools on a model whose template has none: the fallback prompt (docs/structured-output.md), or a 400 when
    # False (`hearth serve --strict-tools`).
    tool_prompt_fallback: bool = True


@dataclass(frozen=True)
class ToolMode:
    """How the reply may call tools: 'none', 'auto' (the model chooses; parsed from its text), 'required' or a
    named function (the reply is forced, while decoding, to be a call of one of the tools)."""

    choice: str = "none"
    function: str | None = None
    names: tuple[str, ...] = ()

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")


@dataclass(frozen=True)
class ParsedRequest:
    reply: ReplyRequest
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    tools: ToolMode = field(default_factory=ToolMode)
    endpoint: str = "chat"


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _bad_value(template: str, value: Any, param: str | None = None) -> ApiError:
    """A 400 that quotes the client's value ({got} in `template`): bounded and escaped in the reply, left out of the
    log line."""
    return ApiError(400, template.format(got=echo(value)), param=param, log_message=template.format(got="(not logged)"))


def decode_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise _bad("The request body is empty; send a JSON object.")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _bad(f"The request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"The request body is not valid JSON ({exc}).") from None
    if not isinstance(body, dict):
        raise _bad(f"The request body must be a JSON object, not {type(body).__name__}.")
    check_values(body)
    return body


def check_values(body: dict[str, Any]) -> None:
    """Refuse what JSON allows but no model can take: nesting deeper than MAX_JSON_DEPTH, and text that is not
    Unicode (a lone surrogate such as \\ud800, which no tokenizer can encode); the error names where it is."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise _bad(
                f"The request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep (at {path}).",
                _top(path),
            )
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, f"{path}.{key}" if path else key)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        else:
            stack.extend((item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = f"\\u{ord(text[exc.start]):04x}"
        raise _bad(
            f"{printable(path, 80)} holds a lone UTF-16 surrogate ({code} at character {exc.start}), which is not "
            "Unicode text; send the character itself or its surrogate pair.",
            _top(path),
        ) from None


def _top(path: str) -> str:
    """The top-level field a JSON path is under ('messages[0].content' -> 'messages')."""
    return path.split(".")[0].split("[")[0] or path


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_value(f"'{name}' must be a number, not {{got}}.", value, name)
    if not math.isfinite(value):  # Python's json reads NaN and Infinity, which JSON itself does not have
        raise _bad_value(f"'{name}' must be a finite number, not {{got}}.", value, name)
    return float(value)


def _integer(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad_value(f"'{name}' must be an integer, not {{got}}.", value, name)
    return value


def _whole_number(body: dict[str, Any], name: str, default: int) -> int:
    """An integer that may be written as a float (top_k: 40.0), but not 40.5, NaN or Infinity."""
    value = float(_number(body, name, default))
    if not value.is_integer():
        raise _bad_value(f"'{name}' must be a whole number, not {{got}}.", body.get(name), name)
    return int(value)


# The OpenAI field for each SamplingParams field, so a value out of range is a 400 naming the field the client sent.
SAMPLING_FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "seed": "seed",
}  # fmt: skip


def sampling(body: dict[str, Any], limits: Limits, context_window: int) -> SamplingParams:
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _bad(f"'n' must be 1: Hearth generates one choice per request (got {n}).", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0) != 0.0:
            raise _bad(
                f"'{name}' is not supported (only 0); use 'repetition_penalty' (multiplicative, 1 = off) instead.",
                name,
            )
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _bad("'logprobs' is not supported.", "logprobs")
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported.", "logit_bias")
    requested = _integer(body, "max_completion_tokens")
    param = "max_completion_tokens"
    if requested is None:
        requested, param = _integer(body, "max_tokens"), "max_tokens"
    cap = min(limits.max_tokens, max(context_window - 1, 1)) if context_window else limits.max_tokens
    if requested is not None and not 1 <= requested <= cap:
        raise _bad(f"'{param}' must be between 1 and {cap} on this server (got {requested}).", param)
    temperature = _number(body, "temperature", 1.0)  # OpenAI's defaults: temperature 1, top_p 1
    if not 0 <= temperature <= 2:
        raise _bad(f"'temperature' must be between 0 and 2 (got {temperature:g}).", "temperature")
    top_k = _whole_number(body, "top_k", 0)
    if not 0 <= top_k <= MAX_TOP_K:
        raise _bad(f"'top_k' must be between 0 (off) and {MAX_TOP_K} (got {echo(top_k)}).", "top_k")
    values: dict[str, Any] = {
        "temperature": temperature,
        "top_p": _number(body, "top_p", 1.0),
        "top_k": top_k,
        "min_p": _number(body, "min_p", 0.0),
        "repetition_penalty": _number(body, "repetition_penalty", 1.0),
        "seed": _integer(body, "seed"),
    }
    for name, value in values.items():  # each range checked here, so the 400 names the field the client sent
        try:
            check_field(SamplingParams, name, value, key=f"'{SAMPLING_FIELDS[name]}'")
        except InvalidSettingError as exc:
            raise _bad(str(exc) + ".", SAMPLING_FIELDS[name]) from None
    return SamplingParams(
        **values, max_new_tokens=requested if requested is not None else min(limits.default_max_tokens, cap)
    )


def stop_sequences(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad("'stop' must be a string or a list of strings.", "stop")
    if len(items) > MAX_STOP_SEQUENCES or any(len(s) > MAX_STOP_CHARS for s in items):
        raise _bad(f"'stop' takes at most {MAX_STOP_SEQUENCES} strings of at most {MAX_STOP_CHARS} characters.", "stop")
    return tuple(s for s in items if s)


def response_format(body: dict[str, Any]) -> ResponseFormat:
    value = body.get("response_format")
    if value is None:
        return ResponseFormat()
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return ResponseFormat()
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad("'response_format.json_schema' must be an object with a 'schema' object.", "response_format")
        return ResponseFormat("json_schema", spec.get("schema") or {}, str(spec.get("name") or ""))
    raise _bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'.", "response_format")


def _content(value: Any, index: int) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad_value(
                    f"messages[{index}].content: only text parts are supported (got {{got}}).", kind, "messages"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{index}].content must be a string or a list of text parts.", "messages")


def messages(body: dict[str, Any], limits: Limits) -> tuple[ChatMessage, ...]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list of {role, content} objects.", "messages")
    if len(raw) > limits.max_messages:
        raise _bad(f"'messages' has {len(raw)} items; this server takes at most {limits.max_messages}.", "messages")
    out: list[ChatMessage] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _bad(f"messages[{index}] must be an object with 'role' and 'content'.", "messages")
        role = item.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise _bad_value(
                f"messages[{index}].role must be system, developer, user, assistant or tool (got {{got}}).",
                role,
                "messages",
            )
        extra: dict[str, Any] = {}
        if role == "assistant" and item.get("tool_calls"):
            calls = item["tool_calls"]
            if not isinstance(calls, list):
                raise _bad(f"messages[{index}].tool_calls must be a list.", "messages")
            extra["tool_calls"] = [_template_tool_call(call, index) for call in calls]
        if role == "tool":
            extra["tool_call_id"] = str(item.get("tool_call_id") or "")
            if item.get("name"):
                extra["name"] = str(item["name"])
        out.append(ChatMessage(role, _content(item.get("content"), index), extra))
    return tuple(out)


def _template_tool_call(call: Any, index: int) -> dict[str, Any]:
    """An assistant's earlier tool call, as chat templates expect it (arguments as an object)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _bad(f"messages[{index}].tool_calls: each needs a function with a name.", "messages")
    arguments: Any = function.get("arguments") or "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise _bad(f"messages[{index}].tool_calls: arguments must be a JSON object string.", "messages") from None
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def tools(body: dict[str, Any]) -> tuple[tuple[dict[str, Any], ...], ToolMode]:
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if not raw:
        if choice not in (None, "none", "auto"):
            raise _bad("'tool_choice' needs 'tools'.", "tool_choice")
        return (), ToolMode()
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list of {type: 'function', function: {...}} objects.", "tools")
    names: list[str] = []
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise _bad(f"tools[{index}] must be {{type: 'function', function: {{name, parameters}}}}.", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"tools[{index}].function.name is missing.", "tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise _bad(f"tools[{index}].function.parameters must be a JSON schema object.", "tools")
        names.append(function["name"])
    if choice is None or choice == "auto":
        mode = ToolMode("auto", names=tuple(names))
    elif choice == "none":
        return (), ToolMode()
    elif choice == "required":
        mode = ToolMode("required", names=tuple(names))
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise _bad_value("'tool_choice' names {got}, which is not in 'tools'.", name, "tool_choice")
        mode = ToolMode("function", function=name, names=tuple(names))
    else:
        raise _bad("'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', function: {name}}.",
                   "tool_choice")  # fmt: skip
    return tuple(raw), mode


def forced_tool_schema(tool_list: tuple[dict[str, Any], ...], mode: ToolMode) -> dict[str, Any]:
    """The JSON schema a forced tool call's text must match: {"name": one of the tools, "arguments": its params}."""
    return tool_call_schema(list(tool_list), only=mode.function)


def chat_request(body: dict[str, Any], limits: Limits, context_window: int) -> ParsedRequest:
    params = sampling(body, limits, context_window)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false.", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options")
    tool_list, mode = tools(body)
    fmt = response_format(body)
    if mode.forced:
        if fmt.kind != "text":
            raise _bad("A forced 'tool_choice' and a 'response_format' cannot be combined.", "response_format")
        fmt = ResponseFormat("json_schema", forced_tool_schema(tool_list, mode), TOOL_CALL_FORMAT)
    reply = ReplyRequest(
        messages=messages(body, limits),
        params=params,
        conversation_id=None,  # the server picks the cached KV whose tokens share the longest prefix
        use_response_cache=False,  # an API client asking again wants a new sample, and seeds are honoured
        stop=stop_sequences(body),
        response_format=fmt,
        tools=tool_list,
        tool_prompt_fallback=limits.tool_prompt_fallback,
        model=None,
    )
    return ParsedRequest(
        reply, stream=stream, include_usage=bool(options.get("include_usage")) and stream,
        model=str(body.get("model") or ""), tools=mode,
    )  # fmt: skip


def completion_request(body: dict[str, Any], limits: Limits, context_window: int) -> ParsedRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("'prompt' must be a non-empty string (one prompt per request).", "prompt")
    if body.get("echo"):
        raise _bad("'echo' is not supported.", "echo")
    if body.get("suffix"):
        raise _bad("'suffix' is not supported.", "suffix")
    params = sampling(body, limits, context_window)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false.", "stream")
    options = body.get("stream_options") or {}
    reply = ReplyRequest(
        messages=(),
        params=params,
        use_response_cache=False,
        stop=stop_sequences(body),
        raw_prompt=prompt,
    )
    return ParsedRequest(
        reply, stream=stream, include_usage=isinstance(options, dict) and bool(options.get("include_usage")) and stream,
        model=str(body.get("model") or ""), endpoint="completions",
    )  # fmt: skip


def parse_tool_calls(text: str, mode: ToolMode) -> list[dict[str, Any]]:
    """Tool calls in a reply: the whole text when the call was forced, else <tool_call>{...}</tool_call> blocks
    (the Hermes/Qwen layout most tool-capable templates ask for). Each: {"name", "arguments" (a JSON string)}."""
    if mode.choice == "none":
        return []
    candidates: list[str] = []
    if mode.forced:
        candidates = [text]
    else:
        rest = text
        while "<tool_call>" in rest:
            _, _, after = rest.partition("<tool_call>")
            inner, _, rest = after.partition("</tool_call>")
            candidates.append(inner)
    calls = []
    for candidate in candidates:
        try:
            data = json.loads(candidate.strip())
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("name") in mode.names:
            arguments = data.get("arguments", data.get("parameters", {}))
            calls.append({"name": data["name"], "arguments": json.dumps(arguments, ensure_ascii=False)})
    return calls
