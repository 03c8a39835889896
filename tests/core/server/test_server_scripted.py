"""The server over HTTP with the scripted backend: protocol shapes, stop sequences, cancel, safety, the queue."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx2 as httpx
import openai
import pytest

from app.core.engines.backend import ReplyRequest, ScriptedBackend
from app.core.errors import HearthError
from app.core.server import ServerConfig, ServerHandle

HELLO = [{"role": "user", "content": "Hi"}]
LONG_REPLY = " ".join(f"word{i}" for i in range(400))
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class CancelProbe:
    """Wraps a backend: records every request, how many tokens came out after its cancel was set, and how many
    replies were generating at once. With a `gate`, the first reply holds after its first token until the gate
    opens, so a test decides when it may go on instead of racing it."""

    def __init__(self, backend: ScriptedBackend, gate: threading.Event | None = None) -> None:
        self.backend = backend
        self.info = backend.info
        self.gate = gate
        self.requests: list[ReplyRequest] = []
        self.tokens_after_cancel: list[int] = []
        self.generated: list[int] = []
        self.finish: list[str] = []
        self.finished = threading.Event()
        self.active = self.most_active = 0
        self._count = threading.Lock()

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Any:
        self.requests.append(request)
        events = self.backend.generate(request, cancel)
        gate = self.gate if len(self.requests) == 1 else None

        def watch() -> Any:
            with self._count:
                self.active += 1
                self.most_active = max(self.most_active, self.active)
            late = tokens = 0
            try:
                for event in events:
                    if event.type == "token":
                        tokens += 1
                        late += int(cancel.is_set())
                    if event.type == "done":
                        self.finish.append(event.finish_reason)
                    yield event
                    if gate is not None and tokens == 1:
                        assert gate.wait(30), "the test never opened the gate"
            finally:
                with self._count:
                    self.active -= 1
            self.tokens_after_cancel.append(late)
            self.generated.append(tokens)
            self.finished.set()

        return watch()

    def memory(self) -> Any:
        return self.backend.memory()


def sse_lines(response: httpx.Response) -> list[dict[str, Any] | str]:
    out: list[dict[str, Any] | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_completion_has_usage_and_timings(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["Hello there, friend."]))
    reply = server.client().chat.completions.create(model="any", messages=HELLO, max_tokens=50)
    assert reply.choices[0].message.content == "Hello there, friend."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "Scripted model"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.prompt_tokens_details is not None and reply.usage.prompt_tokens_details.cached_tokens == 0
    timings = reply.model_extra["timings"]
    assert timings["predicted_n"] == 3 and timings["prompt_n"] == reply.usage.prompt_tokens
    assert {"prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second", "cache_n"} <= set(timings)


def test_stream_with_include_usage_ends_with_a_usage_chunk(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["One two three four."]))
    chunks = list(server.client().chat.completions.create(
        model="m", messages=HELLO, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "One two three four."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 4
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    assert finals[0].model_extra["timings"]["predicted_n"] == 4


def test_stream_without_include_usage_has_no_usage_chunk(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["A b."]))
    chunks = list(server.client().chat.completions.create(model="m", messages=HELLO, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_stop_sequence_cuts_the_reply_and_stops_the_model(serve: Any) -> None:
    probe = CancelProbe(ScriptedBackend(replies=["Alpha beta. END gamma delta " + LONG_REPLY]))
    server = serve(probe)
    client = server.client()
    reply = client.chat.completions.create(model="m", messages=HELLO, stop=["END"], max_tokens=400)
    assert reply.choices[0].message.content == "Alpha beta. "
    assert reply.choices[0].finish_reason == "stop"
    assert probe.requests[0].stop == ("END",)
    assert probe.generated[0] <= 4  # the model was stopped right after the stop string, not at 400 tokens
    # Streamed, a stop string split across tokens is never sent in part.
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, stop=["a. E"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Alpha bet"


def test_disconnect_cancels_the_generation_and_the_queue_moves_on(serve: Any) -> None:
    probe = CancelProbe(ScriptedBackend(replies=[LONG_REPLY, "Next one."], tokens_per_s=20))
    server = serve(probe)
    received = 0
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", f"{server.base_url}/chat/completions",
        json={"model": "m", "messages": HELLO, "stream": True, "max_tokens": 1000},
    ) as response:  # fmt: skip
        for line in response.iter_lines():
            if line.startswith("data: ") and "word" in line:
                received += 1
            if received == 3:
                break
    assert probe.finished.wait(10), "the generation did not stop after the client left"
    assert probe.finish == ["cancelled"]
    assert probe.tokens_after_cancel[0] <= 1  # cancelled within one token (the one being produced)
    assert probe.generated[0] < 60  # 400 tokens would take 20 s
    reply = server.client().chat.completions.create(model="m", messages=HELLO)
    assert reply.choices[0].message.content == "Next one."
    deadline = time.monotonic() + 5
    while not any(r.status == 499 for r in server.records) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(r.status == 499 and r.error == "client disconnected" for r in server.records)


def test_full_queue_answers_503_with_retry_after(serve: Any) -> None:
    probe = CancelProbe(ScriptedBackend(replies=[LONG_REPLY], tokens_per_s=50))
    server = serve(probe, max_queue=1)
    body = {"model": "m", "messages": HELLO, "stream": True, "max_tokens": 1000}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server.base_url}/chat/completions", json=body) as r1:
        lines = r1.iter_lines()  # kept: a dropped line iterator closes the response
        next(lines)  # the first is generating
        waiting = threading.Thread(target=lambda: httpx.post(f"{server.base_url}/chat/completions", json=body,
                                                              timeout=30), daemon=True)  # fmt: skip
        waiting.start()
        deadline = time.monotonic() + 10
        while server.handle.queue.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.handle.queue.waiting == 1
        health = httpx.get(f"{server.root}/health").json()
        assert health["queue_depth"] == 1 and health["running"] == 1
        with pytest.raises(openai.APIStatusError) as raised:
            server.client().chat.completions.create(model="m", messages=HELLO)
        assert raised.value.status_code == 503
        assert int(raised.value.response.headers["retry-after"]) >= 1
        assert raised.value.body["code"] == "queue_full"  # type: ignore[index]
        metrics = httpx.get(f"{server.root}/metrics").text
        assert "hearth_queue_depth 1" in metrics
    server.handle.stop()


def test_models_health_and_metrics(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["Fine."]))
    client = server.client()
    assert [m.id for m in client.models.list()] == ["Scripted model"]
    client.chat.completions.create(model="m", messages=HELLO)
    assert httpx.get(f"{server.root}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{server.root}/metrics").text
    for name in ("hearth_requests_total{endpoint=\"chat\",status=\"200\"} 1", "hearth_prompt_tokens_total",
                 "hearth_cached_tokens_total", "hearth_completion_tokens_total 1", "hearth_ttft_seconds_bucket",
                 "hearth_decode_tokens_per_second_count", "hearth_queue_depth 0", "hearth_kv_cache_bytes"):  # fmt: skip
        assert name in metrics, name
    assert [r.path for r in server.records] == ["/v1/chat/completions"]
    assert server.records[0].completion_tokens == 1


def test_completions_endpoint(serve: Any) -> None:
    probe = CancelProbe(ScriptedBackend(replies=["the end. Extra"]))
    server = serve(probe)
    reply = server.client().completions.create(model="m", prompt="Once upon a time", max_tokens=20, stop=[" Extra"])
    assert reply.choices[0].text == "the end."
    assert probe.requests[0].raw_prompt == "Once upon a time"
    chunks = list(server.client().completions.create(model="m", prompt="Again", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "the end. Extra"


def test_parameters_reach_the_backend(serve: Any) -> None:
    probe = CancelProbe(ScriptedBackend(replies=["ok"]))
    server = serve(probe)
    server.client().chat.completions.create(
        model="m", messages=[{"role": "developer", "content": "Be brief."}, *HELLO], temperature=0.2, top_p=0.5,
        max_completion_tokens=7, seed=42, extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )  # fmt: skip
    params = probe.requests[0].params
    assert (params.temperature, params.top_p, params.max_new_tokens, params.seed) == (0.2, 0.5, 7, 42)
    assert (params.top_k, params.repetition_penalty) == (5, 1.1)
    assert probe.requests[0].messages[0].role == "system"
    assert probe.requests[0].conversation_id is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "The request body is not valid JSON"),
        (b"[1, 2]", "The request body must be a JSON object, not list."),
        (b"", "The request body is empty"),
        (json.dumps({"model": "m"}).encode(), "'messages' must be a non-empty list"),
        (json.dumps({"messages": HELLO, "n": 2}).encode(), "'n' must be 1"),
        (json.dumps({"messages": HELLO, "presence_penalty": 0.5}).encode(), "'presence_penalty' is not supported"),
        (json.dumps({"messages": HELLO, "frequency_penalty": 1}).encode(), "'frequency_penalty' is not supported"),
        (json.dumps({"messages": HELLO, "max_tokens": 10**6}).encode(), "'max_tokens' must be between 1 and"),
        (json.dumps({"messages": HELLO, "temperature": "hot"}).encode(), "'temperature' must be a number"),
        (json.dumps({"messages": HELLO, "temperature": 3}).encode(), "'temperature' must be between 0 and 2"),
        (json.dumps({"messages": HELLO, "top_p": 0}).encode(), "'top_p' must be in (0, 1] (got 0.0)."),
        (json.dumps({"messages": HELLO, "stop": [1]}).encode(), "'stop' must be a string or a list of strings."),
        (json.dumps({"messages": HELLO, "stop": list("abcde")}).encode(), "'stop' takes at most 4"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages[0].role must be"),
        (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
         "only text parts are supported"),
        (json.dumps({"messages": HELLO, "response_format": {"type": "xml"}}).encode(), "'response_format.type'"),
        (json.dumps({"messages": HELLO, "tools": [{"type": "function"}]}).encode(), "tools[0] must be"),
        (json.dumps({"messages": HELLO, "tool_choice": "required"}).encode(), "'tool_choice' needs 'tools'."),
        (json.dumps({"messages": HELLO, "stream": "yes"}).encode(), "'stream' must be true or false."),
        (json.dumps({"messages": HELLO, "logprobs": True}).encode(), "'logprobs' is not supported."),
        (json.dumps({"messages": HELLO, "logit_bias": {"1": 5}}).encode(), "'logit_bias' is not supported."),
        (json.dumps({"messages": HELLO, "seed": "7"}).encode(), "'seed' must be an integer"),
        (json.dumps({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": 3}}).encode(),
         "'response_format.json_schema' must be an object with a 'schema' object."),
        (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
         "messages[0].content must be a string or a list of text parts."),
        (json.dumps({"messages": ["hi"]}).encode(), "messages[0] must be an object with 'role' and 'content'."),
        (json.dumps({"messages": [{"role": "user", "content": "x"}] * 1025}).encode(),
         "'messages' has 1025 items; this server takes at most 1024."),
        (json.dumps({"messages": [{"role": "assistant", "content": "", "tool_calls": 1}]}).encode(),
         "messages[0].tool_calls must be a list."),
        (json.dumps({"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]}).encode(),
         "messages[0].tool_calls: each needs a function with a name."),
        (json.dumps({"messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": "{oops"}}]}]}).encode(),
         "messages[0].tool_calls: arguments must be a JSON object string."),
        (json.dumps({"messages": HELLO, "tools": {"a": 1}}).encode(), "'tools' must be a list of"),
        (json.dumps({"messages": HELLO, "tools": [{"type": "function", "function": {}}]}).encode(),
         "tools[0].function.name is missing."),
        (json.dumps({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]}
                    ).encode(), "tools[0].function.parameters must be a JSON schema object."),
        (json.dumps({"messages": HELLO, "tools": [TOOL], "tool_choice": {"type": "function", "function": {
            "name": "g"}}}).encode(), "'tool_choice' names 'g', which is not in 'tools'."),
        (json.dumps({"messages": HELLO, "tools": [TOOL], "tool_choice": "always"}).encode(),
         "'tool_choice' must be 'none', 'auto', 'required' or"),
        (json.dumps({"messages": HELLO, "tools": [TOOL], "tool_choice": "required",
                     "response_format": {"type": "json_object"}}).encode(),
         "A forced 'tool_choice' and a 'response_format' cannot be combined."),
        (json.dumps({"messages": HELLO, "stream_options": 1}).encode(), "'stream_options' must be an object."),
    ],
)  # fmt: skip
def test_malformed_bodies_get_one_clear_400(serve: Any, body: bytes, message: str) -> None:
    server = serve(ScriptedBackend())
    response = httpx.post(f"{server.base_url}/chat/completions", content=body,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": ""}, "'prompt' must be a non-empty string (one prompt per request)."),
        ({"prompt": "a", "echo": True}, "'echo' is not supported."),
        ({"prompt": "a", "suffix": "b"}, "'suffix' is not supported."),
        ({"prompt": "a", "stream": 1}, "'stream' must be true or false."),
    ],
)
def test_completions_bodies(serve: Any, body: dict[str, Any], message: str) -> None:
    server = serve(ScriptedBackend())
    response = httpx.post(f"{server.base_url}/completions", json={"model": "m", **body})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message


def test_a_failure_mid_reply_is_an_error(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["one two three four"], fail_mid_stream=2))
    client = server.client()
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="m", messages=HELLO)
    assert "RuntimeError: scripted failure" in raised.value.message
    with pytest.raises(openai.APIError, match="The model failed mid-reply: RuntimeError: scripted failure"):
        list(client.chat.completions.create(model="m", messages=HELLO, stream=True))


def test_a_taken_port_is_one_clear_error(serve: Any) -> None:
    first = serve(ScriptedBackend())
    second = ServerHandle(ServerConfig(port=first.handle.port))
    with pytest.raises(HearthError, match=r"could not listen on 127\.0\.0\.1:\d+ \(is the port in use\? try --port 0"):
        second.start(ScriptedBackend())
    with pytest.raises(HearthError, match=r"The server is not running\."):
        _ = second.address
    with pytest.raises(HearthError, match=r"The server is already running\."):
        first.handle.start(ScriptedBackend())


def test_backend_user_error_is_a_400_before_the_stream_starts(serve: Any) -> None:
    from app.core.errors import ContextOverflowError

    server = serve(ScriptedBackend(error_before_first=ContextOverflowError(5000, 2048)))
    with pytest.raises(openai.BadRequestError) as raised:
        list(server.client().chat.completions.create(model="m", messages=HELLO, stream=True))
    assert raised.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "context window is 2,048 tokens" in raised.value.message


def test_unknown_path_and_method(serve: Any) -> None:
    server = serve(ScriptedBackend())
    missing = httpx.get(f"{server.base_url}/embeddings")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"].startswith("There is no /v1/embeddings here")
    wrong = httpx.get(f"{server.base_url}/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_body_size_is_bounded(serve: Any) -> None:
    from app.core.server.protocol import Limits

    server = serve(ScriptedBackend(), limits=Limits(max_body_bytes=1024))
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 4096}]}
    response = httpx.post(f"{server.base_url}/chat/completions", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "The request body is larger than this server's limit of 1 KiB."
    # Without a Content-Length (chunked), the body is counted as it arrives.
    chunked = httpx.post(f"{server.base_url}/chat/completions", content=iter([json.dumps(big).encode()]))
    assert chunked.status_code == 413


def test_api_key_is_required_when_set(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["ok"]), api_key="s3cret-key")
    with pytest.raises(openai.AuthenticationError) as raised:
        server.client("wrong").chat.completions.create(model="m", messages=HELLO)
    assert raised.value.status_code == 401
    assert raised.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert "s3cret-key" not in raised.value.message
    assert httpx.get(f"{server.base_url}/models").status_code == 401
    assert server.client("s3cret-key").chat.completions.create(model="m", messages=HELLO).choices
    assert httpx.get(f"{server.root}/health").status_code == 200  # liveness stays public, as llama-server's


def test_refuses_to_listen_off_loopback_without_flag_and_key() -> None:
    with pytest.raises(HearthError, match=r"Refusing to listen on 0\.0\.0\.0: other machines .* --allow-network"):
        ServerHandle(ServerConfig(host="0.0.0.0"))
    with pytest.raises(HearthError, match=r"Refusing to listen on 192\.168\.1\.5 without an API key"):
        ServerHandle(ServerConfig(host="192.168.1.5", allow_network=True))
    ServerHandle(ServerConfig(host="0.0.0.0", allow_network=True, api_key="k"))  # both given: allowed
    ServerHandle(ServerConfig(host="::1"))  # IPv6 loopback needs neither


def test_foreign_host_header_is_refused(serve: Any) -> None:
    server = serve(ScriptedBackend())
    response = httpx.get(f"{server.base_url}/models", headers={"host": "attacker.example:8080"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "host_not_allowed"
    assert "DNS rebinding" in response.json()["error"]["message"]
    port = server.handle.port
    assert httpx.get(f"{server.base_url}/models", headers={"host": f"localhost:{port}"}).status_code == 200


def test_cors_is_off_unless_origins_are_listed(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["ok"]))
    page = {"origin": "https://evil.example"}
    response = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HELLO}, headers=page)
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers
    assert "--cors-origin https://evil.example" in response.json()["error"]["message"]

    allowed = serve(ScriptedBackend(replies=["ok"]), cors_origins=("http://localhost:3000",))
    origin = {"origin": "http://localhost:3000"}
    preflight = httpx.options(f"{allowed.base_url}/chat/completions",
                              headers={**origin, "access-control-request-method": "POST"})  # fmt: skip
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    answer = httpx.post(f"{allowed.base_url}/chat/completions", json={"messages": HELLO}, headers=origin)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:3000"
    other = httpx.post(f"{allowed.base_url}/chat/completions", json={"messages": HELLO}, headers=page)
    assert other.status_code == 403


def test_request_log_never_holds_the_key(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["ok"]), api_key="k-123456")
    server.client("k-123456").chat.completions.create(model="m", messages=HELLO)
    httpx.get(f"{server.base_url}/models", headers={"authorization": "Bearer nope"})
    assert [r.status for r in server.records] == [200, 401]
    assert "k-123456" not in repr(server.records) and "k-123456" not in repr(server.handle.config)


def test_sse_wire_format(serve: Any) -> None:
    server = serve(ScriptedBackend(replies=["Hi you."]))
    with httpx.stream("POST", f"{server.base_url}/chat/completions",
                      json={"messages": HELLO, "stream": True}) as response:  # fmt: skip
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_lines(response)
    assert events[-1] == "[DONE]"
    assert all(isinstance(e, dict) and e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_the_windows_chat_shares_the_queue_while_a_client_streams(serve: Any) -> None:
    """A second caller submits to the same queue from its own thread (as the window's worker does through
    app/ui/serving.py): served in turn, never at the same time."""
    import queue as stdlib_queue

    from app.core.chat.events import ChatMessage, TokenEvent
    from app.core.server.queue import End

    gate = threading.Event()
    probe = CancelProbe(ScriptedBackend(replies=[LONG_REPLY[:200], "From the window."]), gate=gate)
    server = serve(probe)
    window_text: list[str] = []
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", f"{server.base_url}/chat/completions", json={"messages": HELLO, "stream": True}
    ) as response:  # fmt: skip
        lines = response.iter_lines()
        next(lines)  # the client's reply is streaming
        request = ReplyRequest((ChatMessage("user", "Hello from the window"),), conversation_id=3)

        def chat() -> None:
            mailbox: stdlib_queue.SimpleQueue[Any] = stdlib_queue.SimpleQueue()
            server.handle.queue.submit(request, threading.Event(), mailbox.put)
            while not isinstance(item := mailbox.get(timeout=30), End):
                if isinstance(item, TokenEvent):
                    window_text.append(item.text)

        window = threading.Thread(target=chat)
        window.start()
        # The client's reply is held after its first token: the window's request must wait, not start beside it.
        deadline = time.monotonic() + 10
        while server.handle.queue.waiting != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.handle.queue.waiting == 1 and probe.active == 1
        gate.set()
        client_text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in lines if line.startswith("data: {") and '"choices":[{' in line
        )  # fmt: skip
        window.join(30)
    assert client_text == LONG_REPLY[:200]
    assert "".join(window_text) == "From the window."
    assert [r.conversation_id for r in probe.requests] == [None, 3]  # one after the other, in arrival order
    assert probe.most_active == 1  # never two replies at once


def test_auto_tool_call_is_read_from_the_reply(serve: Any) -> None:
    call = '<tool_call>{"name": "lookup", "arguments": {"q": "kettle"}}</tool_call>'
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    server = serve(ScriptedBackend(replies=[f"Let me check. {call}"]))
    client = server.client()
    reply = client.chat.completions.create(model="m", messages=HELLO, tools=[tool])
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.content == "Let me check. "
    (made,) = reply.choices[0].message.tool_calls
    assert (made.function.name, json.loads(made.function.arguments)) == ("lookup", {"q": "kettle"})
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, tools=[tool], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Let me check. " and "<tool_call>" not in text
    pieces = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].function.name == "lookup" and pieces[0].id
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"q": "kettle"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    # A call of a tool that was not offered stays text.
    server2 = serve(ScriptedBackend(replies=[call.replace("lookup", "rm_rf")]))
    other = server2.client().chat.completions.create(model="m", messages=HELLO, tools=[tool])
    assert other.choices[0].message.content == call.replace("lookup", "rm_rf")
    assert other.choices[0].message.tool_calls is None


def test_a_client_that_leaves_while_waiting_is_skipped(serve: Any) -> None:
    gate = threading.Event()  # the first reply holds after its first token until the second client has left
    probe = CancelProbe(ScriptedBackend(replies=[LONG_REPLY[:300], "Second."]), gate=gate)
    server = serve(probe)
    body = {"messages": HELLO, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server.base_url}/chat/completions", json=body) as r1:
        lines = r1.iter_lines()
        next(lines)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the first, then gives up
            httpx.post(f"{server.base_url}/chat/completions", json={"messages": HELLO}, timeout=0.5)
        deadline = time.monotonic() + 10
        while server.handle.queue.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.handle.queue.waiting == 0  # a request whose client left no longer counts
        gate.set()
        assert "".join(lines).endswith("[DONE]")  # the first client's reply goes on to its end
    reply = server.client().chat.completions.create(model="m", messages=HELLO)
    assert reply.choices[0].message.content == "Second."
    assert len(probe.requests) == 2  # the abandoned request never reached the model
    assert any(r.status == 499 and r.error == "client disconnected while waiting" for r in server.records)
