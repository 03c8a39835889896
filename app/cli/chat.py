"""`hearth chat`: stream a reply, or an interactive chat that keeps its KV cache between turns."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from app.cli import Subparsers
from app.cli.attach import add_attach_flags, message_with_documents, read_attachments
from app.cli.common import add_model_flags, progress_to_stderr, settings_from_args
from app.core.chat.events import DoneEvent, Event, ReplyStats, StatsEvent, TokenEvent, event_to_json
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest
from app.core.errors import HearthError
from app.core.settings import CONTEXT_POLICIES, Settings
from app.core.stats_text import reply_stats_text


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model (one prompt, or interactive)")
    parser.add_argument("prompt", nargs="?", help="the question; without it, an interactive chat")
    add_model_flags(parser)
    parser.add_argument("--system", help="system prompt (default: from settings)")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", "-t", type=float, help="0 = greedy (deterministic)")
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int, help="0 = off")
    sampling.add_argument("--min-p", type=float, help="0 = off")
    sampling.add_argument("--repeat-penalty", type=float, help="1 = off")
    sampling.add_argument("--max-tokens", type=int, help="most new tokens per reply")
    sampling.add_argument("--seed", type=int, help="same seed + same prompt = same reply")
    parser.add_argument(
        "--context-policy",
        choices=CONTEXT_POLICIES,
        help="when the chat outgrows the context: error (default) or drop-oldest turns",
    )
    parser.add_argument(
        "--no-response-cache", action="store_true", help="always generate, never replay a cached greedy reply"
    )
    parser.add_argument(
        "--no-lookup",
        action="store_true",
        help="plain decode only: never check guesses copied from the conversation (prompt lookup; same tokens)",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print TTFT, prefill/decode speed, cached tokens and memory after each reply",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="events as JSON lines (see README); with no PROMPT, each stdin line is a turn",
    )
    parser.add_argument(
        "--engine", metavar="NAME", help="a remote engine (`hearth engines add`); --model picks its model"
    )
    add_attach_flags(parser)
    parser.set_defaults(handler=run)


def sampling_from_args(args: argparse.Namespace, base: SamplingParams) -> SamplingParams:
    changes = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repeat_penalty,
        "max_new_tokens": args.max_tokens,
        "seed": args.seed,
    }
    merged = base.to_dict() | {k: v for k, v in changes.items() if v is not None}
    return SamplingParams.from_dict(merged)


class CancelOnInterrupt:
    """Ctrl+C while a reply streams stops the reply, not the program; at the prompt it quits."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.generating = False
        self._previous: Any = None

    def __enter__(self) -> CancelOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.generating:
            self.cancel.set()
        else:
            raise KeyboardInterrupt


def format_stats(stats: ReplyStats) -> str:
    """`--stats`: the window's line (app.core.stats_text) plus peak memory, the decode path's note and the
    conversation's running cost, which the window shows elsewhere."""
    return "[" + reply_stats_text(stats.to_dict(), memory=True, note=True, conversation_total=True) + "]"


def emit(events: Iterator[Event], *, as_json: bool, show_stats: bool) -> DoneEvent | None:
    done: DoneEvent | None = None
    for event in events:
        if as_json:
            if (data := event_to_json(event)) is not None:
                print(json.dumps(data, ensure_ascii=False), flush=True)
        elif isinstance(event, TokenEvent):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, StatsEvent) and show_stats:
            print(file=sys.stdout)
            print(format_stats(event.stats), file=sys.stderr, flush=True)
        if isinstance(event, DoneEvent):
            done = event
    if not as_json:
        if not show_stats:
            print()
        if done is not None and done.finish_reason == "cancelled":
            print("[stopped]", file=sys.stderr)
        elif done is not None and done.finish_reason == "length":
            print("[stopped at the length limit: raise --max-tokens for longer replies]", file=sys.stderr)
        elif done is not None and done.finish_reason == "error":
            print(f"hearth: the reply failed: {done.error}", file=sys.stderr)
        for notice in done.notices if done is not None else ():
            print(f"hearth: note: {notice}", file=sys.stderr)
    return done


def load_request(settings: Settings, args: argparse.Namespace) -> LoadRequest:
    """The settings' load options with this command's flags (the window's worker gets the same LoadRequest)."""
    return LoadRequest.from_settings(
        settings,
        ignore_fit=bool(args.ignore_fit),
        response_cache=settings.response_cache and not args.no_response_cache,
        prompt_lookup=settings.prompt_lookup and not getattr(args, "no_lookup", False),
    )


def open_session(settings: Settings, args: argparse.Namespace) -> Any:
    if getattr(args, "engine", None):  # a remote engine instead of a local model
        from app.core.engines.remote.session import open_remote_session

        return open_remote_session(
            settings,
            args,
            sampling_from_args(args, settings.sampling),
            say=lambda note: print(f"hearth: note: {note}", file=sys.stderr),
        )
    from app.core.engines.opening import open_backend
    from app.core.engines.session import ChatSession

    backend = open_backend(load_request(settings, args), progress_to_stderr)
    for notice in [*backend.info.notices, *backend.info.recovered]:
        print(f"hearth: note: {notice}", file=sys.stderr)
    return ChatSession(
        backend,
        system_prompt=args.system if args.system is not None else settings.system_prompt,
        params=sampling_from_args(args, settings.sampling),
        context_policy=args.context_policy or settings.context_policy,
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    sampling_from_args(args, settings.sampling)  # validate flags before a slow load
    if args.prompt is not None and not args.prompt.strip():
        raise HearthError("The prompt is empty.")
    documents = read_attachments(args)  # bad files fail before the slow load too
    session = open_session(settings, args)
    with CancelOnInterrupt() as interrupt:

        def turn(text: str) -> DoneEvent | None:
            if documents:  # they go with the first question, ahead of it
                text = message_with_documents(session, text, documents, args.fit)
                documents.clear()
            interrupt.cancel.clear()
            interrupt.generating = True
            try:
                return emit(session.ask(text, cancel=interrupt.cancel), as_json=args.json, show_stats=args.stats)
            finally:
                interrupt.generating = False

        if args.prompt is not None:
            done = turn(args.prompt)
            return 0 if done is not None and done.finish_reason != "error" else 1
        interactive = sys.stdin.isatty() and not args.json
        if interactive:
            name = session.backend.info.name
            hint = "Ctrl+C stops a reply; Ctrl+D or /quit exits; /reset starts over."
            print(f"Chatting with {name}. {hint}", file=sys.stderr)
        while True:
            try:
                line = input("you> " if interactive else "")
            except EOFError:
                return 0
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                return 0
            if text == "/reset":
                session.reset()
                continue
            try:
                turn(text)
            except HearthError as exc:  # e.g. the context is full: say so, keep the chat going
                if args.json:
                    print(json.dumps({"type": "error", "message": str(exc)}), flush=True)
                else:
                    print(f"hearth: {exc}", file=sys.stderr)
