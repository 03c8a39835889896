"""What every local engine shares: a prompt from messages (chat template, context policy), then a reply as a plain
generator of typed events (PromptEvent, TokenEvent…, StatsEvent, DoneEvent) with the response cache, stop strings,
cancel within one token and the reply's prefill and decode figures. Torch-free: the torch engine
(app.core.engines.engine) and the torch-free one (app.core.engines.lite.engine) supply the model's steps and sampling.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from app.core.chat.chat_format import format_prompt, supports_tools
from app.core.chat.detok import IncrementalDetokenizer
from app.core.chat.events import (
    ChatMessage,
    ContextUsage,
    DoneEvent,
    Event,
    FinishReason,
    PromptEvent,
    ReplyStats,
    StatsEvent,
    TokenEvent,
)
from app.core.chat.response_cache import CachedReply, ResponseCache, cache_key
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.batching import BatchStep, DecodeStep, PrefillStep, ReplyItem, prompt_takes
from app.core.engines.constrained import GrammarCompiler, GrammarSpec, grammar_for_format, grammar_for_tool_calls
from app.core.engines.lookup import LookupDecoder, LookupPlanner, LookupTally, NgramIndex
from app.core.engines.tool_prompt import TOOL_CALL_FORMAT, fallback_messages, forced_tool_name
from app.core.errors import ContextOverflowError, HearthError

log = logging.getLogger(__name__)

PREFILL_CHUNK = 512  # bounds the prefill activation peak; also lets cancel act between chunks
MEMORY_SAMPLE_EVERY = 16  # tokens between RSS samples on the CPU (a psutil call is ~10 µs)
_GRAMMARS_LOCK = threading.Lock()


def token_ids(values: Iterable[Any]) -> set[int]:
    """The token ids in config values that are an id, a list of ids or absent (eos_token_id's shapes)."""
    found: set[int] = set()
    for value in values:
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list | tuple):
            found.update(int(v) for v in value if isinstance(v, int))
    return found


class KVCache(Protocol):
    """A conversation's KV cache and the exact token ids it holds."""

    @property
    def ids(self) -> list[int]: ...

    def reset(self) -> None: ...

    def nbytes(self) -> int: ...

    def reuse_for(self, prompt_ids: list[int]) -> int:
        """Crop to the longest common prefix with the new prompt (always leaving its last token to run) and return
        how many tokens are reused."""
        ...


class Constraint(Protocol):
    """A response format's grammar for one reply: masks each step's logits, follows the picked tokens."""

    @property
    def finished(self) -> bool: ...

    def apply(self, logits: Any) -> Any: ...

    def accept(self, token: int) -> None: ...


class Sampler(Protocol):
    """One reply's token choice: greedy or seeded sampling after the warpers (temperature, top-k/p, min-p,
    repetition penalty over the prompt and the tokens accepted so far)."""

    def pick(self, logits: Any) -> int: ...

    def accept(self, token: int) -> None: ...


@dataclass(frozen=True)
class PreparedPrompt:
    ids: list[int]
    dropped_turns: int
    used_fallback_template: bool
    kept: tuple[ChatMessage, ...] = ()  # the messages the prompt holds (old turns dropped to fit are not)
    constraint: Constraint | None = None  # the response format's grammar, for this one reply


class ReplyEngine(ABC):
    """A loaded model's replies; subclasses set the attributes below and implement the model's steps."""

    tokenizer: Any
    response_cache: ResponseCache | None
    context_window: int
    eos_ids: set[int]
    vocab_size: int
    decode_path: str
    decode_path_note: str
    model_id: str  # with quantization: the response cache's key
    quantization: str
    display_name: str
    device_name: str  # where memory is counted ("cpu", "cuda:0")
    polls_memory: bool  # sample the process's memory every MEMORY_SAMPLE_EVERY tokens (the CPU's RSS)
    _grammar_compiler: GrammarCompiler | None = None

    # -- what a model supplies ---------------------------------------------------------------
    @abstractmethod
    def new_kv(self) -> KVCache: ...

    @abstractmethod
    def _prefill(self, ids: list[int], kv: Any) -> Any:
        """Run prompt ids (at most PREFILL_CHUNK) on top of the cache; the last position's logits."""

    @abstractmethod
    def _decode_step(self, token: int, kv: Any) -> Any:
        """Run one generated token on top of the cache; its logits."""

    @abstractmethod
    def _sampler(self, params: SamplingParams, prompt_ids: list[int]) -> Sampler: ...

    @abstractmethod
    def _memory_now(self) -> int: ...

    @abstractmethod
    def _cache_identity(self, budget: int) -> dict[str, Any]:
        """What besides the prompt decides a greedy reply (response cache key): weights, decode path, kernel."""

    def _constraint(self, spec: GrammarSpec) -> Constraint:
        """One reply's state of the grammar (compiled once per engine and grammar); the torch engine wraps it
        to mask tensors."""
        return self._grammars().mask(spec)

    def _grammars(self) -> GrammarCompiler:
        """This engine's compiled grammars (made on first use; they go with the engine when its model is closed)."""
        with _GRAMMARS_LOCK:  # the server's compile thread and the model's thread may both ask first
            if self._grammar_compiler is None:
                self._grammar_compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_ids)
            return self._grammar_compiler

    def _begin_reply(self) -> None:  # noqa: B027 (optional: most engines have nothing to do)
        """Before a reply's first step (the GPU's peak memory counter is reset here)."""

    def _synchronize(self) -> None:  # noqa: B027
        """After prefill, before its time is read (a GPU's queued work)."""

    def _inference(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def _restore(self, prompt_ids: list[int], kv: Any, reused: int) -> int:
        """Extend the cache's reused prefix of `prompt_ids` from a store of prefixes; the new reused length (an engine
        with none keeps `reused`)."""
        del prompt_ids, kv
        return reused

    # Prompt-lookup decoding (app.core.engines.lookup): a planner where the engine's forward computes each row
    # exactly as a decode step does, and `lookup_state` names the choice in the stats ("on", or "off (why)").
    lookup: LookupPlanner | None = None
    lookup_state = ""
    last_lookup: LookupTally | None = None  # the last reply's checks (benchmarks read them)

    def _forward_rows(self, tokens: list[int], kv: Any) -> Any:
        """Run `tokens` after the cache's positions; the logits after each of them [len(tokens), vocab]."""
        raise NotImplementedError

    def _truncate(self, kv: Any, length: int) -> None:
        """Keep the cache's first `length` positions."""
        raise NotImplementedError

    def _after_reply(self, prompt_ids: list[int], kv: Any) -> None:  # noqa: B027 (optional: a prefix store's save)
        """Called once a reply's last token is out: a chance to keep the prompt's cache for later."""

    # -- prompts ---------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        """`text` as the prompt holds a message's content: special-token strings in it are text (chat_format)."""
        return len(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def prepare_prompt(
        self,
        messages: list[ChatMessage],
        *,
        assistant_prefix: str = "",
        context_policy: str = "error",
        tools: list[dict[str, Any]] | None = None,
    ) -> PreparedPrompt:
        """Token ids for the messages; raises ContextOverflowError rather than truncate, unless the
        policy allows dropping whole old turns (never the system prompt or the newest message)."""
        working = list(messages)
        dropped = 0
        while True:
            formatted = format_prompt(self.tokenizer, working, assistant_prefix, tools)
            if len(formatted.ids) < self.context_window:
                return PreparedPrompt(formatted.ids, dropped, formatted.used_fallback, tuple(working))
            droppable = [i for i, m in enumerate(working[:-1]) if m.role != "system"]
            if context_policy != "drop-oldest" or not droppable:
                raise ContextOverflowError(len(formatted.ids), self.context_window)
            first = droppable[0]
            # Drop a whole exchange (user + its reply) so the template still alternates roles.
            end = first + 2 if first + 1 < len(working) - 1 and working[first + 1].role == "assistant" else first + 1
            del working[first:end]
            dropped += end - first

    def prepare(self, request: ReplyRequest) -> PreparedPrompt:
        """The request's prompt as token ids, tokenized once; raises the user's errors (the prompt does not fit, a
        feature this engine cannot honour, a schema it cannot enforce) before any event."""
        by_prompt = self._tools_by_prompt(request)
        if request.raw_prompt is not None:  # a plain completion: the text as is, with the tokenizer's own BOS
            ids = list(self.tokenizer(request.raw_prompt)["input_ids"])
            if len(ids) >= self.context_window:
                raise ContextOverflowError(len(ids), self.context_window)
            prompt = PreparedPrompt(ids, 0, False)
        else:
            messages, tools = list(request.messages), list(request.tools) or None
            if by_prompt:
                forced = request.response_format.name == TOOL_CALL_FORMAT
                only = forced_tool_name(request.response_format) if forced else None
                messages, tools = fallback_messages(messages, list(request.tools), forced=forced, only=only), None
            prompt = self.prepare_prompt(
                messages,
                assistant_prefix=request.assistant_prefix,
                context_policy=request.context_policy,
                tools=tools,
            )
        spec = self.grammar(request)  # a bad schema raises
        return replace(prompt, constraint=self._constraint(spec)) if spec is not None else prompt

    def grammar(self, request: ReplyRequest) -> GrammarSpec | None:
        """What the reply must match: the response format's schema (a forced tool call's too), or on a template
        without tools the fallback prompt's format (free text or tool calls); None for free text."""
        if self._tools_by_prompt(request) and request.response_format.kind == "text":
            return grammar_for_tool_calls(list(request.tools))
        forced = request.response_format.name == TOOL_CALL_FORMAT
        source = "The tools' parameters" if forced else "The JSON schema in response_format"
        return grammar_for_format(request.response_format, source)

    def compile_grammar(self, request: ReplyRequest) -> None:
        """Compile the request's grammar now, so that its reply finds it compiled: the server calls this off the
        model's thread. SchemaError when it can't be enforced (or takes longer than the compile limit)."""
        spec = self.grammar(request)
        if spec is not None:
            self._grammars().compile(spec)

    def _tools_by_prompt(self, request: ReplyRequest) -> bool:
        """Whether the request's tools go through the fallback prompt (the template has no tools); HearthError
        when the request refuses that."""
        if not request.tools or supports_tools(self.tokenizer):
            return False
        if not request.tool_prompt_fallback:
            raise HearthError(
                f"The chat template of {self.display_name} does not support tools: send the request without "
                "'tools', or load a model whose template has them (e.g. Qwen2.5 or Llama 3.1 Instruct)."
            )
        return True

    def context_usage(self, request: ReplyRequest, prompt: PreparedPrompt) -> ContextUsage:
        """How the prepared prompt fills the window: the system prompt and the newest message counted alone, the
        template's tokens and older turns as history."""
        kept = prompt.kept
        system = sum(self.count_tokens(m.content) for m in kept if m.role == "system")
        last_user = next((m for m in reversed(kept) if m.role == "user"), None)
        current = self.count_tokens(last_user.content) if last_user else 0
        reply = self.count_tokens(request.assistant_prefix) if request.assistant_prefix else 0
        history = max(len(prompt.ids) - system - current - reply, 0)
        return ContextUsage(system, history, current, reply, self.context_window)

    # -- generation ------------------------------------------------------------------------
    def generate(
        self, request: ReplyRequest, *, kv: KVCache | None = None, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Stream one reply: PromptEvent, TokenEvent…, StatsEvent, DoneEvent. Errors that are the user's (context
        overflow) raise before the first event; failures during generation end the stream with DoneEvent('error')
        and leave the engine usable."""
        started = time.perf_counter()
        prompt = self.prepare(request)
        yield from self.generate_prepared(prompt, request, kv=kv, cancel=cancel, started=started)

    def generate_prepared(
        self,
        prompt: PreparedPrompt,
        request: ReplyRequest,
        *,
        kv: KVCache | None = None,
        cancel: threading.Event | None = None,
        started: float | None = None,
    ) -> Iterator[Event]:
        """`generate` for a prompt already prepared (by a caller that had to raise the user's errors first)."""
        return cast(Iterator[Event], self.reply_steps(prompt, request, kv=kv, cancel=cancel, started=started))

    def reply_steps(
        self,
        prompt: PreparedPrompt,
        request: ReplyRequest,
        *,
        kv: KVCache | None = None,
        cancel: threading.Event | None = None,
        started: float | None = None,
        batched: bool = False,
    ) -> Iterator[ReplyItem]:
        """`generate_prepared`; `batched`: each decode step is yielded as a DecodeStep for the caller to run with
        other replies' (decode_batch) instead of run here (app.core.engines.batching)."""
        started = started if started is not None else time.perf_counter()
        yield PromptEvent(self.context_usage(request, prompt), prompt.dropped_turns)
        yield from self._reply_from_ids(
            prompt.ids,
            request.params,
            kv=kv,
            cancel=cancel,
            use_response_cache=request.use_response_cache,
            dropped_turns=prompt.dropped_turns,
            started=started,
            stop=tuple(request.stop),
            constraint=prompt.constraint,
            batched=batched,
        )

    def decode_batch(self, steps: Sequence[BatchStep]) -> None:
        """Run the pending steps of several batched replies (each on its own cache): decode steps get their logits,
        prompts run a chunk (`prompt_takes`) and get theirs after their last token. A reply decoding alone checks its
        prompt-lookup guesses as in a chat; in a batch, a reply whose last check guessed this token takes that row
        and the others run (`_decode_rows`)."""
        with self._inference():
            if len(steps) == 1 and isinstance(steps[0], DecodeStep) and steps[0].lookup is not None:
                steps[0].logits = steps[0].lookup.next_logits(steps[0].token)
                return
            running: list[BatchStep] = []
            for step in steps:
                if isinstance(step, DecodeStep):
                    step.logits = step.lookup.take_row(step.token) if step.lookup is not None else None
                    if step.logits is not None:
                        continue
                running.append(step)
            if running:
                self._decode_rows(running, prompt_takes(running, PREFILL_CHUNK))

    def _decode_rows(self, steps: Sequence[BatchStep], takes: Sequence[int]) -> None:
        """Run each step (a prompt its `takes` tokens) and set its logits: one after another here; an engine with a
        batched forward runs them together."""
        for step, take in zip(steps, takes, strict=True):
            if isinstance(step, DecodeStep):
                step.logits = self._decode_step(step.token, step.kv)
            elif take:
                logits = self._prefill(step.tokens[:take], step.kv)
                step.ran = take
                step.logits = logits if take == len(step.tokens) else None

    def generate_from_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        kv: KVCache | None = None,
        cancel: threading.Event | None = None,
        use_response_cache: bool = True,
        dropped_turns: int = 0,
        started: float | None = None,
        stop: tuple[str, ...] = (),
        constraint: Constraint | None = None,
    ) -> Iterator[Event]:
        """`stop`: end the reply at the first of these strings (the DoneEvent's text is cut before it; token events
        may already hold part of it). `constraint`: mask each step's logits to the response format's grammar."""
        replies = self._reply_from_ids(
            prompt_ids, params, kv=kv, cancel=cancel, use_response_cache=use_response_cache,
            dropped_turns=dropped_turns, started=started, stop=stop, constraint=constraint,
        )  # fmt: skip
        return cast(Iterator[Event], replies)

    def _reply_from_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        kv: KVCache | None,
        cancel: threading.Event | None,
        use_response_cache: bool,
        dropped_turns: int,
        started: float | None,
        stop: tuple[str, ...],
        constraint: Constraint | None,
        batched: bool = False,
    ) -> Iterator[ReplyItem]:
        started = started if started is not None else time.perf_counter()
        if len(prompt_ids) >= self.context_window:
            raise ContextOverflowError(len(prompt_ids), self.context_window)
        if len(prompt_ids) == 0:
            raise ValueError("empty prompt")
        budget = min(params.max_new_tokens, self.context_window - len(prompt_ids))
        key = None
        if self.response_cache is not None and params.greedy and not stop and constraint is None:
            key = cache_key(self.model_id, self.quantization, prompt_ids, self._cache_identity(budget))
            if use_response_cache and (hit := self.response_cache.get(key)) is not None:
                yield from self._replay(hit, prompt_ids, started, dropped_turns)
                return
        kv = kv if kv is not None else self.new_kv()
        pieces: list[str] = []
        finish: FinishReason = "error"
        error: str | None = None
        cut: str | None = None  # the reply as the decode loop ended it (before a stop string)
        try:
            decoding = self._decode(
                prompt_ids, params, budget, kv, cancel, started, dropped_turns, stop, constraint, batched
            )
            for event in decoding:
                if isinstance(event, TokenEvent):
                    pieces.append(event.text)
                elif isinstance(event, DoneEvent):
                    finish, cut = event.finish_reason, event.text
                    continue
                yield event
        except Exception as exc:  # keep the engine usable: the cache may be half-written, drop it
            log.exception("generation failed")
            kv.reset()
            error = f"{type(exc).__name__}: {exc}"
            finish = "error"
        text = cut if cut is not None else "".join(pieces)
        if key is not None and self.response_cache is not None and finish in ("stop", "length"):
            self.response_cache.put(key, CachedReply(pieces, finish, len(pieces)))
        yield DoneEvent(finish_reason=finish, text=text, error=error, notices=self._take_notices())

    def recovery_notices(self) -> tuple[str, ...]:
        """Derived files found damaged and rebuilt while the engine started (response cache, packed copies)."""
        return self._take_notices()

    def _take_notices(self) -> tuple[str, ...]:
        return tuple(self.response_cache.take_notices()) if self.response_cache is not None else ()

    def _replay(self, hit: CachedReply, prompt_ids: list[int], started: float, dropped_turns: int) -> Iterator[Event]:
        for piece in hit.pieces:
            yield TokenEvent(piece)
        elapsed = time.perf_counter() - started
        yield StatsEvent(
            ReplyStats(
                ttft_s=elapsed,
                prompt_tokens=len(prompt_ids),
                cached_tokens=len(prompt_ids),
                prefill_tokens_per_s=0.0,
                decode_tokens_per_s=0.0,
                generated_tokens=hit.generated_tokens,
                prefill_s=0.0,
                decode_s=0.0,
                peak_memory_bytes=self._memory_now(),
                memory_device=self.device_name,
                from_response_cache=True,
                dropped_turns=dropped_turns,
                decode_path="response-cache",
                context_window=self.context_window,
            )
        )
        yield DoneEvent(finish_reason=hit.finish_reason, text=hit.text)  # type: ignore[arg-type]

    def _decode(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        budget: int,
        kv: Any,
        cancel: threading.Event | None,
        started: float,
        dropped_turns: int,
        stop: tuple[str, ...] = (),
        constraint: Constraint | None = None,
        batched: bool = False,
    ) -> Iterator[ReplyItem]:
        stop_at: int | None = None  # where in the reply text a stop string begins
        self._begin_reply()
        peak = self._memory_now()
        reused = kv.reuse_for(prompt_ids)
        restore_started = time.perf_counter()
        restored = self._restore(prompt_ids, kv, reused) - reused  # from the prompt cache on disk, where it has them
        restore_s = time.perf_counter() - restore_started if restored else 0.0
        reused += restored
        sampler = self._sampler(params, prompt_ids)
        detok = IncrementalDetokenizer(self.tokenizer)
        generated = 0
        finish: FinishReason = "length"
        first_token_at: float | None = None
        prefill_started = time.perf_counter()
        prefill_done = prefill_started
        lookup = self._lookup_decoder(prompt_ids, kv, budget, lambda: generated)
        # A batched reply holds the engine's inference context only while it computes here: its decode steps run in
        # decode_batch, with other replies' steps, while this generator waits.
        with nullcontext() if batched else self._inference():
            pending = prompt_ids[reused:]
            logits = None
            while pending:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                if batched:  # the driver runs it with the other replies' steps, a chunk at a time
                    prompt_step = PrefillStep(pending, kv)
                    yield prompt_step
                    pending, logits = pending[prompt_step.ran :], prompt_step.logits
                else:
                    logits = self._prefill(pending[:PREFILL_CHUNK], kv)
                    pending = pending[PREFILL_CHUNK:]
            self._synchronize()
            prefill_done = time.perf_counter()
            peak = max(peak, self._memory_now())
            while logits is not None and finish != "cancelled":
                if constraint is not None:  # before the warpers: top-p then picks among the allowed tokens
                    logits = constraint.apply(logits)
                token = sampler.pick(logits)
                generated += 1
                if constraint is not None:
                    constraint.accept(token)
                if token in self.eos_ids:
                    finish = "stop"
                    break
                text = detok.add(token)
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if text:
                    yield TokenEvent(text)
                if stop and text and (stop_at := _stop_position(detok.emitted, stop, len(text))) is not None:
                    finish = "stop"
                    break
                if constraint is not None and constraint.finished:
                    finish = "stop"
                    break
                if generated >= budget:
                    finish = "length"
                    break
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                sampler.accept(token)
                if batched:
                    step = DecodeStep(token, kv, lookup=lookup)
                    yield step
                    logits = step.result()
                else:
                    logits = lookup.next_logits(token) if lookup is not None else self._decode_step(token, kv)
                if self.polls_memory and generated % MEMORY_SAMPLE_EVERY == 0:
                    peak = max(peak, self._memory_now())
            if lookup is not None:
                lookup.finish()
        tally = self.last_lookup = lookup.tally if lookup is not None else None
        tail = detok.flush()
        if tail:
            yield TokenEvent(tail)
        finished = time.perf_counter()
        if first_token_at is None:
            first_token_at = finished
        peak = max(peak, self._memory_now())
        prefill_s = prefill_done - prefill_started
        decode_s = finished - first_token_at
        new_tokens = len(prompt_ids) - reused
        yield StatsEvent(
            ReplyStats(
                ttft_s=first_token_at - started,
                prompt_tokens=len(prompt_ids),
                cached_tokens=reused,
                prefill_tokens_per_s=new_tokens / prefill_s if prefill_s > 0 else 0.0,
                decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
                generated_tokens=generated,
                prefill_s=prefill_s,
                decode_s=decode_s,
                peak_memory_bytes=peak,
                memory_device=self.device_name,
                dropped_turns=dropped_turns,
                decode_path=self.decode_path,
                decode_path_note=self.decode_path_note,
                context_window=self.context_window,
                restored_tokens=restored,
                restore_s=restore_s,
                lookup=self.lookup_state,
                lookup_checks=tally.checks if tally is not None else 0,
                lookup_proposed=tally.proposed if tally is not None else 0,
                lookup_accepted=tally.accepted if tally is not None else 0,
            )
        )
        self._after_reply(prompt_ids, kv)  # after the last token: never slows the reply
        yield DoneEvent(finish_reason=finish, text=detok.emitted[:stop_at] if stop_at is not None else detok.emitted)

    def _lookup_decoder(
        self, prompt_ids: list[int], kv: Any, budget: int, generated: Callable[[], int]
    ) -> LookupDecoder | None:
        planner = self.lookup
        if planner is None:
            return None

        def room() -> int:  # guesses the budget and the context window leave after the current token
            return min(budget - generated() - 1, self.context_window - len(kv.ids) - 1)

        return LookupDecoder(
            planner,
            NgramIndex(prompt_ids),
            step=lambda token: self._decode_step(token, kv),
            forward=lambda tokens: self._forward_rows(tokens, kv),
            truncate=lambda length: self._truncate(kv, length),
            length=lambda: len(kv.ids),
            room=room,
        )


def _stop_position(text: str, stops: tuple[str, ...], new: int) -> int | None:
    """Where the earliest stop string that the last `new` characters completed begins, if any."""
    found: int | None = None
    for stop in stops:
        at = text.find(stop, max(0, len(text) - new - len(stop) + 1))
        if at != -1 and (found is None or at < found):
            found = at
    return found
