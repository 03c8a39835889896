"""Turn messages into prompt token ids through the tokenizer's chat template, with a clear fallback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.chat.events import ChatMessage

FALLBACK_NOTICE = "This model has no chat template; Hearth uses a plain 'User:/Assistant:' layout."


@dataclass(frozen=True)
class FormattedPrompt:
    ids: list[int]
    text: str
    used_fallback: bool


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """For templates that reject a system role (Gemma): prepend it to the first user turn."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    for message in rest:
        if message["role"] == "user":
            message["content"] = f"{system}\n\n{message['content']}"
            break
    return rest


def supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders tool definitions (templates that do read a `tools` variable)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def render_text(
    tokenizer: Any, messages: list[ChatMessage], assistant_prefix: str = "", tools: list[dict[str, Any]] | None = None
) -> tuple[str, bool]:
    dicts = [m.as_template_dict() for m in messages]
    if has_chat_template(tokenizer):
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            text = tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:  # jinja2 TemplateError: "System role not supported" and the like
            if "system" not in str(exc).lower():
                raise
            text = tokenizer.apply_chat_template(
                _fold_system(dicts), tokenize=False, add_generation_prompt=True, **extra
            )
        return str(text) + assistant_prefix, False
    parts = []
    for message in dicts:
        label = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}[message["role"]]
        parts.append(f"{label}: {message['content']}")
    parts.append("Assistant:" + (" " + assistant_prefix if assistant_prefix else ""))
    return "\n\n".join(parts), True


def format_prompt(
    tokenizer: Any, messages: list[ChatMessage], assistant_prefix: str = "", tools: list[dict[str, Any]] | None = None
) -> FormattedPrompt:
    text, fallback = render_text(tokenizer, messages, assistant_prefix, tools)
    # The template already holds any BOS it wants; adding special tokens again would double it.
    ids = tokenizer(text, add_special_tokens=fallback)["input_ids"]
    return FormattedPrompt(ids=list(ids), text=text, used_fallback=fallback)
