"""Text from a client, made safe to show: in a terminal, a log file, the window's request log or an error reply.

A request's path, headers and body are the client's choice: an ESC, a BEL or a bidi override written to the server's
terminal would clear it, retitle it or reorder what the user reads. Every such character is shown as an escape, and
long values are cut, so one request can neither rewrite the screen nor fill the log.
"""

from __future__ import annotations

import json
import logging
from typing import Any

LOG_FIELD_CHARS = 200  # the most of one client-chosen field (a path, a host) a log line holds
ECHO_CHARS = 40  # the most of a client's value an error reply quotes back
LOG_LINE_CHARS = 4000  # the most of one formatted log message


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str, limit: int = LOG_FIELD_CHARS) -> str:
    """`text` with every control, format, separator or surrogate character escaped (ESC -> \\x1b, U+202E ->
    \\u202e, a line break -> \\x0a), cut to `limit` characters with the full length said."""
    cut = text[:limit]
    if not cut.isprintable():  # str.isprintable: no Cc, Cf, Cs, Co, Cn, Zl, Zp, nor a Zs other than the space
        cut = "".join(char if char.isprintable() else _escape(char) for char in cut)
    if len(text) > limit:
        cut += f"… ({len(text):,} characters)"
    return cut


def echo(value: Any, limit: int = ECHO_CHARS) -> str:
    """A client's value quoted in an error reply: a string in quotes, bounded and escaped; a small JSON value as
    JSON; anything bigger by its type and size (never serialised whole)."""
    if isinstance(value, str):
        return "'" + printable(value, limit) + "'"
    if value is None or isinstance(value, bool | int | float):
        return printable(json.dumps(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer")
    if isinstance(value, list | dict):
        kind = "an array" if isinstance(value, list) else "an object"
        return f"{kind} of {len(value)} items"
    return type(value).__name__


class SafeFormatter(logging.Formatter):
    """A log formatter that escapes control characters in each message and in each line of a traceback, so a value
    that came from a client (a path, a header, an exception's text) can't drive the terminal or forge a log line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record), LOG_LINE_CHARS)

    def formatException(self, ei: Any) -> str:
        return "\n".join(printable(line, LOG_LINE_CHARS) for line in super().formatException(ei).splitlines())
