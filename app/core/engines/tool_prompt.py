"""Tools on a model whose chat template has none (the default SmolLM2): the tools go into the system prompt with one
call format, and a grammar holds the reply to it (as LM Studio does for such models). docs/structured-output.md
shows the prompt.

The format is the Hermes/Qwen one the server already parses: <tool_call>{"name": …, "arguments": {…}}</tool_call>.
A forced call (tool_choice "required" or a named function) is the bare JSON object, as on templates with tools.
Earlier turns are rewritten to plain text the template can render: an assistant's calls as those blocks, a tool's
result as a user turn that names the tool.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.chat.events import ChatMessage
from app.core.engines.backend import ResponseFormat

TOOL_CALL_FORMAT = "tool_call"  # the ResponseFormat name of a forced call (its schema: the tools' call JSON)
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

CALL_FORMAT = '{"name": "TOOL_NAME", "arguments": {ARGUMENTS}}'
TOOLS_INTRO = "You can call these tools. Each line is a tool's name, what it does and its arguments' JSON schema:"
AUTO_RULE = (
    f"To call a tool, reply with only {TOOL_CALL_OPEN}{CALL_FORMAT}{TOOL_CALL_CLOSE}; its result comes back in the "
    "next message. If no tool is needed, answer normally."
)
FORCED_RULE = "Call {which} now: reply with only " + CALL_FORMAT + " and nothing else."


def fallback_messages(
    messages: list[ChatMessage], tools: list[dict[str, Any]], *, forced: bool, only: str | None = None
) -> list[ChatMessage]:
    """The messages with the tools described in the system prompt and earlier calls and results as plain turns."""
    lines = [TOOLS_INTRO]
    for tool in tools:
        function = tool["function"]
        if only is not None and function["name"] != only:
            continue
        parameters = json.dumps(function.get("parameters") or {"type": "object"}, ensure_ascii=False)
        description = str(function.get("description") or "").strip()
        lines.append(f"- {function['name']}: {description + ' ' if description else ''}Arguments: {parameters}")
    if forced:
        lines.append(FORCED_RULE.replace("{which}", f"the tool {only}" if only else "one of the tools"))
    else:
        lines.append(AUTO_RULE)
    tools_text = "\n".join(lines)
    out: list[ChatMessage] = []
    names: dict[str, str] = {}  # call id -> tool name, for the results that follow
    for message in messages:
        if message.role == "assistant" and message.extra.get("tool_calls"):
            blocks = []
            for call in message.extra["tool_calls"]:
                function = call.get("function") or {}
                names[str(call.get("id") or "")] = str(function.get("name") or "")
                body = {"name": function.get("name"), "arguments": function.get("arguments") or {}}
                blocks.append(f"{TOOL_CALL_OPEN}{json.dumps(body, ensure_ascii=False)}{TOOL_CALL_CLOSE}")
            out.append(ChatMessage("assistant", "\n".join(filter(None, [message.content, *blocks]))))
        elif message.role == "tool":
            name = message.extra.get("name") or names.get(str(message.extra.get("tool_call_id") or ""), "")
            label = f"The result of the tool {name}" if name else "The tool's result"
            out.append(ChatMessage("user", f"{label}:\n{message.content}"))
        else:
            out.append(ChatMessage(message.role, message.content))
    if out and out[0].role == "system":
        out[0] = ChatMessage("system", f"{out[0].content}\n\n{tools_text}" if out[0].content else tools_text)
    else:
        out.insert(0, ChatMessage("system", tools_text))
    return out


def forced_tool_name(fmt: ResponseFormat) -> str | None:
    """The tool a forced call's schema names, when it names one ({"properties": {"name": {"const": …}}})."""
    name = ((fmt.json_schema or {}).get("properties") or {}).get("name") or {}
    return name.get("const") if isinstance(name, dict) and isinstance(name.get("const"), str) else None
