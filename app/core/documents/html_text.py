"""HTML to readable plain text with the standard library's parser: no markup, no scripts, blocks on new lines."""

from __future__ import annotations

import re
from html.parser import HTMLParser

_SKIP = {"script", "style", "noscript", "template", "svg", "head"}
_BLOCKS = {
    "p", "div", "section", "article", "header", "footer", "main", "aside", "nav", "blockquote", "pre",
    "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "tr", "br", "hr",
    "figure", "figcaption", "form", "title",
}  # fmt: skip


class _TextCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0
        self._in_pre = 0
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIP:
            self._skipping += 1
            return
        if tag == "pre":
            self._in_pre += 1
        if tag in _BLOCKS:
            self.parts.append("\n")
        if tag == "li":
            self.parts.append("- ")
        if tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIP:
            self._skipping = max(0, self._skipping - 1)
            return
        if tag == "pre":
            self._in_pre = max(0, self._in_pre - 1)
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._skipping:
            return
        self.parts.append(data if self._in_pre else re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    """Readable text of an HTML page; the <title>, if any, comes first."""
    collector = _TextCollector()
    collector.feed(html)
    collector.close()
    lines = [line.strip(" ") for line in "".join(collector.parts).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    title = collector.title.strip()
    if title and not text.startswith(title):
        text = f"{title}\n\n{text}"
    return text


def looks_like_html(text: str) -> bool:
    head = text[:2048].lstrip().lower()
    return head.startswith(("<!doctype html", "<html")) or ("<body" in head and "</" in head)
