"""Prometheus text for /metrics, kept by hand (a handful of counters and two histograms need no library)."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DECODE_BUCKETS_TPS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.cancelled = 0
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.decode_rate = Histogram(DECODE_BUCKETS_TPS)

    def request_done(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def reply_done(
        self, prompt: int, cached: int, completion: int, ttft_s: float, decode_tps: float, cancelled: bool
    ) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.cached_tokens += cached
            self.completion_tokens += completion
            self.cancelled += int(cancelled)
            if completion:
                self.ttft.observe(ttft_s)
            if decode_tps > 0:
                self.decode_rate.observe(decode_tps)

    def render(self, queue_waiting: int, running: int, kv_bytes: int) -> str:
        with self._lock:
            lines = [
                "# HELP hearth_requests_total HTTP requests answered, by endpoint and status.",
                "# TYPE hearth_requests_total counter",
            ]
            for (endpoint, status), count in sorted(self.requests.items()):
                lines.append(f'hearth_requests_total{{endpoint="{endpoint}",status="{status}"}} {count}')
            for name, value, help_text in (
                ("hearth_prompt_tokens_total", self.prompt_tokens, "Prompt tokens, cached ones included."),
                ("hearth_cached_tokens_total", self.cached_tokens, "Prompt tokens whose KV cache was reused."),
                ("hearth_completion_tokens_total", self.completion_tokens, "Generated tokens."),
                ("hearth_cancelled_total", self.cancelled, "Replies cancelled because the client went away."),
            ):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
            lines += ["# HELP hearth_ttft_seconds Time to first token.", "# TYPE hearth_ttft_seconds histogram"]
            lines += self.ttft.lines("hearth_ttft_seconds")
            lines += [
                "# HELP hearth_decode_tokens_per_second Decode rate per reply.",
                "# TYPE hearth_decode_tokens_per_second histogram",
            ]
            lines += self.decode_rate.lines("hearth_decode_tokens_per_second")
        for name, value, help_text in (
            ("hearth_queue_depth", queue_waiting, "Requests waiting for the model."),
            ("hearth_requests_running", running, "Requests being generated (0 or 1)."),
            ("hearth_kv_cache_bytes", kv_bytes, "Bytes held by the KV caches (after the last request)."),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n"
