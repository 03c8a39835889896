"""Stop sequences on streamed text: hold back what could be the start of a stop string, cut at the first match."""

from __future__ import annotations


class StopFilter:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None
        self.after = ""  # the text that came after the match (kept for callers that parse it, e.g. tool calls)

    def feed(self, text: str) -> str:
        """The text that is safe to send now; after a match, nothing more."""
        if self.matched is not None:
            self.after += text
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        cut = -1
        for stop in self.stops:
            at = buffer.find(stop)
            if at != -1 and (cut == -1 or at < cut):
                cut, self.matched = at, stop
        if cut != -1:
            self._held = ""
            self.after = buffer[cut + len(self.matched or "") :]
            return buffer[:cut]
        keep = 0  # the longest tail of the buffer that begins some stop string
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(buffer)), keep, -1):
                if stop.startswith(buffer[-length:]):
                    keep = length
                    break
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of the reply: what was held back was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
