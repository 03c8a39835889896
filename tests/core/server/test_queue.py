"""The server's request queue (app.core.server.queue): replies decoded together where the model can, one at a time
where it can't; cancel, a client gone, a failed step and the window's priority. The scheduling runs on a scripted
batched model (fast, every step visible); the real default model checks that a batch changes no reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, MemoryReading, ModelInfo, ReplyRequest
from app.core.engines.batching import PROMPT_TOKENS_BESIDE_DECODE, DecodeStep, NoRoomYet, ReplyItem
from app.core.engines.lite.backend import LiteBackend, open_lite_backend
from app.core.server.queue import End, JobItem, RequestQueue
from tests.helpers.lookup_planners import CheapForwards

INFO = ModelInfo("scripted", "none", "cpu", 4096)


def request(name: str, tokens: int = 4) -> ReplyRequest:
    """A scripted request: `name` says whose reply it is, max_new_tokens how many steps it runs."""
    return ReplyRequest(messages=[ChatMessage("user", name)], params=SamplingParams(max_new_tokens=tokens))


@dataclass
class ScriptedBatches:
    """A batched model whose reply to `name` is name:0 name:1 ...: each token after a DecodeStep whose logits
    decode_batch sets to the step's position; every batch's members are recorded."""

    info: ModelInfo = INFO
    max_batch: int = 8
    batches: list[list[str]] = field(default_factory=list)
    fail_on_batch: int | None = None  # decode_batch raises on this call (0-based)
    refuse: str = ""  # reply_steps raises for this name before any item
    room: int = 99  # replies whose KV memory fits at once (NoRoomYet beyond)
    running: int = 0

    def reply_steps(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[ReplyItem]:
        name = request.messages[-1].content
        if name == self.refuse:
            raise ValueError(f"{name} is refused")
        if self.running >= self.room:
            raise NoRoomYet(f"{name} waits for memory")
        self.running += 1
        return self._reply(name, request.params.max_new_tokens, cancel)

    def _reply(self, name: str, tokens: int, cancel: threading.Event) -> Iterator[ReplyItem]:
        try:
            for position in range(tokens):
                step = DecodeStep(position, name)
                yield step
                yield TokenEvent(f"{name}:{step.result()} ")
                if cancel.is_set():
                    yield DoneEvent("cancelled", "")
                    return
            yield DoneEvent("length", "")
        finally:
            self.running -= 1

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Any]:
        raise AssertionError("a batched model's replies go through reply_steps")

    def decode_batch(self, steps: Sequence[DecodeStep]) -> None:
        if self.fail_on_batch == len(self.batches):
            self.batches.append(["failed"])
            raise RuntimeError("the kernel refused the batch")
        self.batches.append([step.kv for step in steps])
        for step in steps:
            step.logits = step.token

    def memory(self) -> MemoryReading:
        return MemoryReading(())


class Collected:
    """One job's items, as its sink received them (from the queue's thread)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.items: list[JobItem] = []
        self.ended = threading.Event()
        self.fail_after = fail_after  # the client's loop goes away after this many tokens

    def sink(self, item: JobItem) -> None:
        tokens = sum(isinstance(seen, TokenEvent) for seen in self.items)
        self.items.append(item)
        if isinstance(item, End):
            self.ended.set()
        elif self.fail_after is not None and isinstance(item, TokenEvent) and tokens + 1 >= self.fail_after:
            raise RuntimeError("the client's event loop is closed")

    @property
    def text(self) -> str:
        return "".join(item.text for item in self.items if isinstance(item, TokenEvent))

    @property
    def done(self) -> DoneEvent:
        return next(item for item in self.items if isinstance(item, DoneEvent))

    def wait(self) -> None:
        assert self.ended.wait(60), "the job never ended"


def run_jobs(
    queue: RequestQueue, jobs: list[tuple[ReplyRequest, Collected]], cancels: list[threading.Event] | None = None
) -> None:
    """Submit every job before the worker starts (so they start together), then wait for each to end."""
    cancels = cancels or [threading.Event() for _ in jobs]
    for (reply, collected), cancel in zip(jobs, cancels, strict=True):
        queue.submit(reply, cancel, collected.sink)
    queue.start()
    try:
        for _, collected in jobs:
            collected.wait()
    finally:
        queue.stop()


def test_requests_are_decoded_together_up_to_the_parallel_limit() -> None:
    model = ScriptedBatches()
    jobs = [(request(name, tokens), Collected()) for name, tokens in (("a", 3), ("b", 5), ("c", 2), ("d", 2))]
    run_jobs(RequestQueue(model, parallel=2), jobs)
    assert [collected.text for _, collected in jobs] == [
        "a:0 a:1 a:2 ", "b:0 b:1 b:2 b:3 b:4 ", "c:0 c:1 ", "d:0 d:1 ",
    ]  # fmt: skip
    assert max(len(batch) for batch in model.batches) == 2
    # c joins at the step after a ends, d after b and c: a finished reply's slot is taken at once
    assert model.batches == [["a", "b"]] * 3 + [["b", "c"]] * 2 + [["d"]] * 2


def test_a_request_without_kv_memory_left_starts_when_a_running_reply_ends() -> None:
    model = ScriptedBatches(room=2)
    jobs = [(request(name, tokens), Collected()) for name, tokens in (("a", 2), ("b", 4), ("c", 2))]
    run_jobs(RequestQueue(model, parallel=4), jobs)
    assert model.batches == [["a", "b"]] * 2 + [["b", "c"]] * 2  # c waited for a's memory, then joined
    assert [collected.text for _, collected in jobs] == ["a:0 a:1 ", "b:0 b:1 b:2 b:3 ", "c:0 c:1 "]
    assert all(not isinstance(item, Exception) for _, collected in jobs for item in collected.items)


def test_the_models_own_limit_caps_the_batch() -> None:
    queue = RequestQueue(ScriptedBatches(max_batch=3), parallel=8)
    assert queue.parallel == 3


def test_a_cancelled_reply_leaves_at_the_next_step_and_the_others_run_on() -> None:
    model = ScriptedBatches()
    jobs = [(request(name, 6), Collected()) for name in "abc"]
    cancels = [threading.Event() for _ in jobs]

    class CancelAfterTwo(Collected):
        def sink(self, item: JobItem) -> None:
            super().sink(item)
            if isinstance(item, TokenEvent) and self.text.count(":") == 2:
                cancels[1].set()  # the user pressed Stop on b after its second token

    jobs[1] = (jobs[1][0], CancelAfterTwo())
    run_jobs(RequestQueue(model, parallel=4), jobs, cancels)
    assert jobs[1][1].done.finish_reason == "cancelled"
    assert jobs[1][1].text == "b:0 b:1 "
    assert sum("b" in batch for batch in model.batches) == 2  # no step ran for b after it was cancelled
    for index in (0, 2):
        assert jobs[index][1].done.finish_reason == "length"
        assert jobs[index][1].text.count(":") == 6


def test_a_client_that_goes_away_frees_its_slot_within_one_step() -> None:
    model = ScriptedBatches()
    gone = Collected(fail_after=2)  # its event loop closes as its second token is delivered
    jobs = [(request("a", 6), Collected()), (request("b", 6), gone), (request("c", 3), Collected())]
    run_jobs(RequestQueue(model, parallel=2), jobs)
    b_steps = [index for index, batch in enumerate(model.batches) if "b" in batch]
    c_steps = [index for index, batch in enumerate(model.batches) if "c" in batch]
    assert len(b_steps) == 2  # the step that made its second token was its last
    assert c_steps[0] == b_steps[-1] + 1  # and the waiting request took its slot at the next step
    assert jobs[2][1].text == "c:0 c:1 c:2 "


def test_a_failed_step_ends_the_replies_in_it_with_the_error_and_the_queue_serves_on() -> None:
    model = ScriptedBatches(fail_on_batch=1)
    jobs = [(request("a", 3), Collected()), (request("b", 3), Collected()), (request("c", 2), Collected())]
    run_jobs(RequestQueue(model, parallel=2), jobs)
    for _, collected in jobs[:2]:
        errors = [item for item in collected.items if isinstance(item, RuntimeError)]
        assert [str(error) for error in errors] == ["the kernel refused the batch"]
    assert jobs[2][1].text == "c:0 c:1 "


def test_a_request_the_model_refuses_gets_its_error_and_the_others_run() -> None:
    model = ScriptedBatches(refuse="b")
    jobs = [(request(name, 2), Collected()) for name in "abc"]
    run_jobs(RequestQueue(model, parallel=4), jobs)
    assert [str(item) for item in jobs[1][1].items if isinstance(item, Exception)] == ["b is refused"]
    assert [jobs[0][1].text, jobs[2][1].text] == ["a:0 a:1 ", "c:0 c:1 "]


def test_the_windows_request_joins_a_full_batch_before_waiting_clients() -> None:
    model = ScriptedBatches()
    queue = RequestQueue(model, parallel=2)
    collected = {name: Collected() for name in "abcw"}
    for name in "abc":
        queue.submit(request(name, 3), threading.Event(), collected[name].sink)
    queue.submit(request("w", 2), threading.Event(), collected["w"].sink, priority=True)
    queue.start()
    try:
        for each in collected.values():
            each.wait()
    finally:
        queue.stop()
    assert model.batches[0] == ["w", "a", "b"]  # in at once, beside the two clients' slots; c still waits
    assert "c" not in model.batches[1]


def test_a_model_without_batches_serves_one_at_a_time_with_the_window_first() -> None:
    order: list[str] = []

    class OneAtATime:
        info = INFO

        def generate(self, reply: ReplyRequest, cancel: threading.Event) -> Iterator[Any]:
            order.append(reply.messages[-1].content)
            yield TokenEvent("x")
            yield DoneEvent("stop", "x")

        def memory(self) -> MemoryReading:
            return MemoryReading(())

    queue = RequestQueue(OneAtATime(), parallel=4)
    assert queue.parallel == 1
    jobs = {name: Collected() for name in "abw"}
    queue.submit(request("a"), threading.Event(), jobs["a"].sink)
    queue.submit(request("b"), threading.Event(), jobs["b"].sink)
    queue.submit(request("w"), threading.Event(), jobs["w"].sink, priority=True)
    queue.start()
    try:
        for each in jobs.values():
            each.wait()
    finally:
        queue.stop()
    assert order == ["w", "a", "b"]


def test_stopping_the_queue_ends_every_running_reply_as_cancelled() -> None:
    model = ScriptedBatches()
    jobs = [(request(name, 10_000), Collected()) for name in "ab"]
    queue = RequestQueue(model, parallel=2)
    for reply, collected in jobs:
        queue.submit(reply, threading.Event(), collected.sink)
    queue.start()
    deadline = time.monotonic() + 30
    while len(model.batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    queue.stop()
    for _, collected in jobs:
        collected.wait()
        assert collected.done.finish_reason == "cancelled"


# -- the real default model ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lite_default() -> Iterator[LiteBackend]:
    opened = open_lite_backend(LoadRequest(None, device="cpu", response_cache=False, prompt_cache_gib=0))
    assert isinstance(opened, LiteBackend), opened
    yield opened
    opened.close()


def test_the_default_model_tells_the_window_what_served_replies_may_take(lite_default: LiteBackend) -> None:
    info = lite_default.info
    assert info.served_together == lite_default.max_batch > 1
    assert info.served_kv_budget_bytes == lite_default.kv_budget_bytes > 0
    assert info.kv_bytes_per_token == lite_default.engine.model.config.kv_bytes_per_token > 0


@contextmanager
def batch_sizes(backend: LiteBackend) -> Iterator[list[int]]:
    """The number of replies in each batched step the backend runs while inside."""
    sizes: list[int] = []
    real_decode_batch = backend.decode_batch

    def counted(steps: Sequence[DecodeStep]) -> None:
        sizes.append(len(steps))
        real_decode_batch(steps)

    backend.decode_batch = counted  # type: ignore[method-assign]
    try:
        yield sizes
    finally:
        del backend.decode_batch


QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea. " * 12,  # a longer prompt: its cache is at other positions
    "List three colors.",
)


def test_batched_replies_of_the_default_model_are_token_identical_to_each_alone(lite_default: LiteBackend) -> None:
    params = [SamplingParams(temperature=0.0, max_new_tokens=24)] * 2 + [
        SamplingParams(temperature=0.8, seed=11, max_new_tokens=24)
    ]
    requests = [
        ReplyRequest(messages=[ChatMessage("user", text)], params=param, use_response_cache=False)
        for text, param in zip(QUESTIONS, params, strict=True)
    ]
    alone = []
    for reply in requests:
        events = list(lite_default.generate(reply, threading.Event()))
        alone.append(next(e for e in events if isinstance(e, DoneEvent)).text)
    with batch_sizes(lite_default) as sizes:
        jobs = [(reply, Collected()) for reply in requests]
        run_jobs(RequestQueue(lite_default, parallel=4), jobs)
    assert max(sizes) == 3  # the three ran together
    assert [collected.done.text for _, collected in jobs] == alone
    for _, collected in jobs:
        stats = next(item for item in collected.items if isinstance(item, StatsEvent)).stats
        assert stats.lookup == "on"  # where a reply runs alone, it checks its prompt-lookup guesses
        assert stats.generated_tokens > 1


def test_a_cancelled_reply_of_the_default_model_leaves_the_others_unchanged(lite_default: LiteBackend) -> None:
    requests = [
        ReplyRequest(
            messages=[ChatMessage("user", text)], params=SamplingParams(temperature=0.0, max_new_tokens=20),
            use_response_cache=False,
        )
        for text in QUESTIONS
    ]  # fmt: skip
    alone = [
        next(e for e in lite_default.generate(reply, threading.Event()) if isinstance(e, DoneEvent)).text
        for reply in requests
    ]
    cancels = [threading.Event() for _ in requests]

    class CancelAtThird(Collected):
        def sink(self, item: JobItem) -> None:
            super().sink(item)
            if sum(isinstance(seen, TokenEvent) for seen in self.items) == 3:
                cancels[1].set()

    jobs = [(requests[0], Collected()), (requests[1], CancelAtThird()), (requests[2], Collected())]
    run_jobs(RequestQueue(lite_default, parallel=4), jobs, cancels)
    assert jobs[1][1].done.finish_reason == "cancelled"
    assert [jobs[0][1].done.text, jobs[2][1].done.text] == [alone[0], alone[2]]
    assert lite_default.pooled_in_use == 0  # every reply's cache went back to the pool, the cancelled one's too


def test_the_default_models_replies_reserve_kv_memory_and_wait_for_it(lite_default: LiteBackend) -> None:
    """A budget with room for the first two replies' caches: the third waits until one ends, then runs (nothing is
    refused)."""
    requests = [
        ReplyRequest(
            messages=[ChatMessage("user", text)], params=SamplingParams(temperature=0.0, max_new_tokens=6 + 4 * index),
            use_response_cache=False,
        )
        for index, text in enumerate(QUESTIONS)
    ]  # fmt: skip
    needs = [len(lite_default.engine.prepare(reply).ids) + reply.params.max_new_tokens for reply in requests]
    budget, per_token = lite_default.kv_budget_bytes, lite_default.engine.model.config.kv_bytes_per_token
    lite_default.kv_budget_bytes = (needs[0] + needs[1]) * per_token  # the first two fit, not the third beside them
    try:
        with batch_sizes(lite_default) as sizes:
            jobs = [(reply, Collected()) for reply in requests]
            run_jobs(RequestQueue(lite_default, parallel=4), jobs)
    finally:
        lite_default.kv_budget_bytes = budget
    assert max(sizes) == 2
    assert [collected.done.finish_reason for _, collected in jobs] == ["length"] * 3
    assert lite_default.pooled_in_use == 0


def test_cleared_caches_hold_no_memory_and_the_next_reply_prefills_its_whole_prompt(lite_default: LiteBackend) -> None:
    reply = ReplyRequest(
        messages=[ChatMessage("user", QUESTIONS[0])], params=SamplingParams(temperature=0.0, max_new_tokens=4),
        use_response_cache=False,
    )  # fmt: skip

    def cached_tokens() -> int:
        events = list(lite_default.generate(reply, threading.Event()))
        return next(e for e in events if isinstance(e, StatsEvent)).stats.cached_tokens

    cached_tokens()
    assert cached_tokens() > 0  # the pool kept the prompt's cache
    lite_default.clear_caches()
    assert lite_default.memory().devices[0].kv_bytes == 0
    assert cached_tokens() == 0


def test_a_served_reply_checks_prompt_lookup_guesses_alone_and_takes_confirmed_rows_in_a_batch(
    lite_default: LiteBackend,
) -> None:
    """A copying reply beside a short one: its guesses are checked while it runs alone and rows its last check
    confirmed are taken inside the batch; its tokens are those of the reply run alone."""
    copy = "Repeat this list exactly, line by line:\n" + "\n".join(
        f"- item {n}: the {color} box on shelf {n % 4}" for n, color in enumerate(["red", "blue", "green"] * 4)
    )
    requests = [
        ReplyRequest(
            messages=[ChatMessage("user", text)], params=SamplingParams(temperature=0.0, max_new_tokens=tokens),
            use_response_cache=False,
        )
        for text, tokens in ((copy, 80), (QUESTIONS[0], 12))
    ]  # fmt: skip
    engine = lite_default.engine
    planner = engine.lookup
    engine.lookup = CheapForwards(max_draft=4)
    try:
        alone = [
            next(e for e in lite_default.generate(reply, threading.Event()) if isinstance(e, DoneEvent)).text
            for reply in requests
        ]
        jobs = [(reply, Collected()) for reply in requests]
        run_jobs(RequestQueue(lite_default, parallel=4), jobs)
    finally:
        engine.lookup = planner
    assert [collected.done.text for _, collected in jobs] == alone
    stats = next(item for item in jobs[0][1].items if isinstance(item, StatsEvent)).stats
    assert stats.lookup == "on" and stats.lookup_accepted > 0


def test_a_long_prompt_runs_in_chunks_beside_the_running_replies_and_changes_no_reply(
    lite_default: LiteBackend,
) -> None:
    """A document question arrives while two replies decode: its prompt runs PROMPT_TOKENS_BESIDE_DECODE tokens a
    step in the same forward as their next tokens (they keep streaming), and every reply is the one it gets alone."""
    document = "Summarise this report in one line:\n" + " ".join(
        f"In week {n} the {color} team shipped {n * 3} fixes and closed {n + 7} tickets." for n, color in
        enumerate(["red", "blue", "green", "amber"] * 3)
    )  # fmt: skip
    requests = [
        ReplyRequest(
            messages=[ChatMessage("user", text)], params=SamplingParams(temperature=0.0, max_new_tokens=tokens),
            use_response_cache=False,
        )
        for text, tokens in ((QUESTIONS[0], 40), (QUESTIONS[2], 40), (document, 8))
    ]  # fmt: skip
    model = lite_default.engine.model
    steps: list[list[tuple[int, bool]]] = []  # each forward's parts: (tokens, wants logits)
    real_run = model.run_sequences

    def recorded(parts: Sequence[tuple[Sequence[int], Any, bool]]) -> Any:
        steps.append([(len(tokens), wants) for tokens, _, wants in parts])
        return real_run(parts)

    queue = RequestQueue(lite_default, parallel=4)
    late = Collected()

    class SubmitsTheDocument(Collected):
        def sink(self, item: JobItem) -> None:
            super().sink(item)
            if sum(isinstance(seen, TokenEvent) for seen in self.items) == 3 and isinstance(item, TokenEvent):
                queue.submit(requests[2], threading.Event(), late.sink)

    lite_default.clear_caches()
    jobs = [(requests[0], SubmitsTheDocument()), (requests[1], Collected())]
    model.run_sequences = recorded  # type: ignore[method-assign]
    try:
        for reply, collected in jobs:
            queue.submit(reply, threading.Event(), collected.sink)
        queue.start()
        for collected in (*(collected for _, collected in jobs), late):  # the document joins at the third token
            collected.wait()
    finally:
        queue.stop()
        del model.run_sequences
    prompt = len(lite_default.engine.prepare(requests[2]).ids)
    assert prompt > 2 * PROMPT_TOKENS_BESIDE_DECODE
    beside = [step for step in steps if any(tokens > 1 for tokens, _ in step) and (1, True) in step]
    assert len(beside) >= 2  # the prompt took several steps, each beside the others' decode tokens
    assert all(max(tokens for tokens, _ in step) <= PROMPT_TOKENS_BESIDE_DECODE for step in beside)
    lite_default.clear_caches()
    alone = [
        next(e for e in lite_default.generate(reply, threading.Event()) if isinstance(e, DoneEvent)).text
        for reply in requests
    ]
    assert [jobs[0][1].done.text, jobs[1][1].done.text, late.done.text] == alone
