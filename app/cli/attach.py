"""`hearth chat --attach FILE`: documents read before the model loads (bad files fail fast), then placed
ahead of the first question. When they do not fit, `--fit` says what to do; the default drops nothing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from app.core.documents import (
    DEFAULT_MAX_BYTES,
    ExtractedDocument,
    apply_fit,
    compose_user_message,
    extract_document,
    plan_fit,
    remaining_context,
    remote_send_notice,
    source_label,
)
from app.core.errors import HearthError

FIT_FLAG_CHOICES = ("error", "trim", "relevant")
REFIT_ATTEMPTS = 3


def add_attach_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("documents")
    group.add_argument(
        "--attach",
        action="append",
        metavar="FILE",
        default=[],
        help="put a document (text, Markdown, code, CSV/TSV, JSON, HTML, PDF, DOCX) ahead of the first "
        "question; repeat for several files",
    )
    group.add_argument(
        "--fit",
        choices=FIT_FLAG_CHOICES,
        default="error",
        help="when the documents do not fit the context: error (default; nothing is dropped), trim (keep the "
        "start of each document) or relevant (keep the passages most relevant to the question, BM25)",
    )
    group.add_argument(
        "--attach-limit",
        type=float,
        metavar="MB",
        default=DEFAULT_MAX_BYTES / 2**20,
        help=f"largest file to attach (default {DEFAULT_MAX_BYTES // 2**20} MB)",
    )


def read_attachments(args: argparse.Namespace) -> list[ExtractedDocument]:
    """Extract every --attach file now, before the slow model load; the first bad file stops the run."""
    paths: Sequence[str] = getattr(args, "attach", None) or []
    if args.attach_limit <= 0:
        raise HearthError(f"--attach-limit must be a positive number of MB (got {args.attach_limit:g}).")
    max_bytes = int(args.attach_limit * 2**20)
    documents = [extract_document(path, max_bytes=max_bytes) for path in paths]
    for document in documents:
        pages = f", {document.pages} pages" if document.pages else ""
        print(f"· attached {source_label(document)} ({document.type_label}{pages})", file=sys.stderr, flush=True)
    return documents


def say_where_documents_go(session: Any, documents: Sequence[ExtractedDocument]) -> None:
    """A remote engine gets the documents' text: name every file (and where each link led) before it is sent."""
    info = session.backend.info
    if info.device != "remote":
        return
    config = getattr(session.backend, "engine", None)  # a remote backend's EngineConfig
    name, url = getattr(config, "name", info.name), getattr(config, "base_url", "")
    destination = f"engine {name}" + (f" ({url})" if url else "")
    print(f"hearth: note: {remote_send_notice(documents, destination)}", file=sys.stderr, flush=True)


def message_with_documents(session: Any, question: str, documents: Sequence[ExtractedDocument], fit: str) -> str:
    """The first user message: documents first (so follow-up questions reuse their KV cache), fitted to what
    is left of the context window the way --fit says, with a note on stderr for anything dropped.

    A local model counts with its tokenizer and chat template; a remote engine's tokens are estimated (about 4
    characters a token), and an engine whose context window Hearth does not know gets the documents whole."""
    from app.core.chat.chat_format import format_prompt
    from app.core.chat.events import ChatMessage

    if not documents:
        return question
    say_where_documents_go(session, documents)
    system = [ChatMessage("system", session.system_prompt)] if session.system_prompt else []
    before = [*system, *session.messages]  # what goes ahead of the new message
    engine = getattr(session.backend, "engine", None)  # the local Engine (a remote backend's is its config)
    if not hasattr(engine, "tokenizer"):
        engine = None  # no tokenizer here: estimate
    window: int = engine.context_window if engine is not None else session.backend.info.context_window
    count_tokens = engine.count_tokens if engine is not None else session.backend.count_tokens
    if not window:
        message = compose_user_message(question, documents)
        print(
            f"hearth: note: the engine's context window is unknown here, so the documents go whole "
            f"(about {count_tokens(message):,} tokens); the server refuses a prompt it cannot fit.",
            file=sys.stderr,
            flush=True,
        )
        return message

    def prompt_tokens(user_text: str) -> int:
        messages = [*before, ChatMessage("user", user_text)]
        if engine is not None:
            return len(format_prompt(engine.tokenizer, messages).ids)
        return sum(count_tokens(m.content) + 4 for m in messages)  # + the template's few tokens per message

    reply_reserve = min(session.params.max_new_tokens, window // 4)
    remaining = remaining_context(window, prompt_tokens(""), reply_reserve)
    decision = plan_fit(documents, question, count_tokens=count_tokens, remaining_tokens=remaining)
    if decision.fits:
        return compose_user_message(question, documents)
    if fit == "error":
        raise decision.error(window)
    available = decision.available_for_documents
    for _ in range(REFIT_ATTEMPTS):
        result = apply_fit(documents, question, fit, count_tokens=count_tokens, available_tokens=available)
        message = compose_user_message(question, result.documents)
        excess = prompt_tokens(message) + reply_reserve - window
        if excess <= 0:
            for note in result.notes:
                print(f"hearth: note: {note}", file=sys.stderr, flush=True)
            return message
        available -= excess + 8  # the joins tokenized differently than the parts: take the excess off
    raise decision.error(window)
