"""Markdown to the HTML subset Qt's rich text understands, with pygments-highlighted code blocks.

Each code block gets a `copy:N` link; the view maps N back to the block's source text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from app.ui.theme import Palette

MONO = "'JetBrains Mono', 'Cascadia Code', 'DejaVu Sans Mono', 'Menlo', 'Consolas', monospace"


@dataclass(frozen=True)
class Rendered:
    html: str
    code_blocks: tuple[str, ...]


def _lexer(language: str, code: str) -> Any:
    try:
        return get_lexer_by_name(language) if language else guess_lexer(code) if len(code) > 40 else TextLexer()
    except ClassNotFound:
        return TextLexer()


class MarkdownRenderer:
    def __init__(self, palette: Palette) -> None:
        self.palette = palette
        self._formatter = HtmlFormatter(nowrap=True, noclasses=True, style=palette.pygments_style)
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])
        # markdown-it binds render rules as methods of its renderer: they get (renderer, tokens, idx, options, env).
        self._md.add_render_rule("fence", lambda *a: self._fence(*a))
        self._md.add_render_rule("code_block", lambda *a: self._fence(*a))
        self._md.add_render_rule("code_inline", lambda *a: self._code_inline(*a))

    def render(self, text: str) -> Rendered:
        env: dict[str, Any] = {"code_blocks": []}
        body = self._md.render(text, env)
        return Rendered(body, tuple(env["code_blocks"]))

    def _fence(self, renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        p = self.palette
        token = tokens[idx]
        code = token.content.rstrip("\n")
        language = (token.info or "").strip().split(" ")[0]
        blocks: list[str] = env.setdefault("code_blocks", [])
        blocks.append(code)
        body = highlight(code, _lexer(language, code), self._formatter).rstrip("\n")
        label = html.escape(language or "code")
        return (
            f'<table width="100%" cellspacing="0" cellpadding="10" '
            f'style="background-color:{p.code_bg}; border: 1px solid {p.code_border}; margin: 6px 0;">'
            f'<tr><td><table width="100%" cellspacing="0" cellpadding="0"><tr>'
            f'<td style="color:{p.muted}; font-size: 8.5pt;">{label}</td>'
            f'<td align="right" style="font-size: 8.5pt;"><a href="copy:{len(blocks) - 1}" '
            f'style="color:{p.muted}; text-decoration: none;">Copy</a></td></tr></table>'
            # pre-wrap: a long line wraps inside the box (the chat scrolls only vertically, so it would be cut)
            f'<pre style="font-family: {MONO}; font-size: 9.5pt; margin-top: 6px; white-space: pre-wrap;">{body}</pre>'
            "</td></tr></table>\n"
        )

    def _code_inline(self, renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        p = self.palette
        return (
            f'<code style="font-family: {MONO}; background-color:{p.code_bg};">'
            f"{html.escape(tokens[idx].content)}</code>"
        )
