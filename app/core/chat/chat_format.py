"""Turn messages into prompt token ids through the tokenizer's chat template, with a clear fallback.

What people write is text, never a control token: a message, a document or a tool result that holds `<|im_start|>`
must not open a turn of its own. Only the template's own markers are tokenized as special tokens; the same string
inside a message's content is tokenized as the characters it is (see format_prompt).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.core.chat import template_safety
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
        where = f"the tokenizer files of {getattr(tokenizer, 'name_or_path', '') or 'this model'}"
        _check_once(tokenizer, where)
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            text = tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:  # jinja2 TemplateError: "System role not supported" and the like
            if type(exc).__name__ == "SecurityError":  # the sandbox held; say so once, not as a traceback
                raise template_safety.refusal(where, "default", f"the sandbox stopped it ({exc})") from None
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


_CHECKED: set[str] = set()  # templates already checked in this process (the check lexes the template once)


def _check_once(tokenizer: Any, where: str) -> None:
    key = repr(getattr(tokenizer, "chat_template", None))
    if key not in _CHECKED:
        template_safety.check_tokenizer(tokenizer, where)
        _CHECKED.add(key)


def format_prompt(
    tokenizer: Any, messages: list[ChatMessage], assistant_prefix: str = "", tools: list[dict[str, Any]] | None = None
) -> FormattedPrompt:
    specials = special_token_strings(tokenizer)
    found = [s for s in specials if _mentions(s, messages, assistant_prefix, tools)]
    if not found:  # the usual case: nothing in the messages looks like a control token
        text, fallback = render_text(tokenizer, messages, assistant_prefix, tools)
        # The template already holds any BOS it wants; adding special tokens again would double it.
        ids = tokenizer(text, add_special_tokens=fallback)["input_ids"]
        return FormattedPrompt(ids=list(ids), text=text, used_fallback=fallback)
    # Stand-ins replace those strings in the messages; the template is rendered around them; the rendered text is cut
    # at the template's own special tokens (ids of their own), and each piece between is tokenized as text with the
    # users' strings put back.
    marks = _Marks(found, [[m.content, m.extra] for m in messages] + [assistant_prefix, tools])
    hidden = [replace(m, content=marks.hide(m.content), extra=marks.hide_all(m.extra)) for m in messages]
    rendered, fallback = render_text(tokenizer, hidden, marks.hide(assistant_prefix), marks.hide_all(tools))
    text = marks.show(rendered)
    if fallback:  # the plain 'User:' layout has no markers of its own: all of it is text
        ids = tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]
        return FormattedPrompt(ids=list(ids), text=text, used_fallback=True)
    ids = []
    for piece, is_marker in _split_at(rendered, specials):
        if is_marker:
            ids.append(int(tokenizer.convert_tokens_to_ids(piece)))
        elif piece:
            ids.extend(tokenizer(marks.show(piece), add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return FormattedPrompt(ids=ids, text=text, used_fallback=False)


def special_token_strings(tokenizer: Any) -> list[str]:
    """The strings this tokenizer turns into special (control) tokens, longest first."""
    found: set[str] = set()
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False) and str(getattr(token, "content", "")):
            found.add(str(token.content))
    found.update(str(t) for t in getattr(tokenizer, "all_special_tokens", None) or () if t)
    return sorted(found, key=lambda s: (-len(s), s))


def _mentions(special: str, messages: list[ChatMessage], prefix: str, tools: Any) -> bool:
    return (
        special in prefix
        or any(special in m.content or _deep_contains(m.extra, special) for m in messages)
        or (_deep_contains(tools, special))
    )


def _deep_contains(value: Any, needle: str) -> bool:
    if isinstance(value, str):
        return needle in value
    if isinstance(value, dict):
        return any(_deep_contains(k, needle) or _deep_contains(v, needle) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_deep_contains(v, needle) for v in value)
    return False


def _split_at(text: str, specials: list[str]) -> list[tuple[str, bool]]:
    """`text` cut at each special token string: (piece, is_a_special_token) in order."""
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    pieces: list[tuple[str, bool]] = []
    start = 0
    for match in pattern.finditer(text):
        pieces.append((text[start : match.start()], False))
        pieces.append((match.group(), True))
        start = match.end()
    pieces.append((text[start:], False))
    return pieces


class _Marks:
    """Stand-ins for special-token strings found in user text: private-use characters that appear nowhere in the
    messages, that no template trims, and that no special token contains."""

    def __init__(self, specials: list[str], sources: list[Any]) -> None:
        strings: list[str] = []

        def collect(text: str) -> str:
            strings.append(text)
            return text

        _map_strings(sources, collect)
        seen = "".join(strings)
        base = next(chr(c) for c in range(0xF0000, 0xF0100) if chr(c) not in seen)
        self.stand_ins = {special: f"{base}{index}{base}" for index, special in enumerate(specials)}
        self.originals = {mark: special for special, mark in self.stand_ins.items()}
        self._hide = re.compile("|".join(re.escape(s) for s in specials))
        self._show = re.compile(re.escape(base) + r"\d+" + re.escape(base))

    def hide(self, text: str) -> str:
        return self._hide.sub(lambda m: self.stand_ins[m.group()], text)

    def hide_all(self, value: Any) -> Any:
        return _map_strings(value, self.hide)

    def show(self, text: str) -> str:
        return self._show.sub(lambda m: self.originals.get(m.group(), m.group()), text)


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {_map_strings(k, change): _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, change) for v in value]
    return value
