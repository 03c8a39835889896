"""`hearth --self-test`: prove an install works, offline, in one command.

Loads the embedded default model with the Hub switched off, greedily answers one known question, and checks the
memory accounting (weights from the device placements, KV cache bytes against the model's shape). Prints one line
per check; exits 0 when all pass, 1 naming the first failing check. Packaging tests run it in the installed bundle.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import APP_NAME, __version__
from app.core.engines.backend import ReplyRequest
from app.core.errors import HearthError

if TYPE_CHECKING:
    from app.core.engines.loader import LoadedModel

# A question the default model answers with a wide margin: its first token leads by ~2.5 logits, its answer's tokens
# by 1 or more. ("What is the capital of France?" is a near tie for it: "The" leads "La" by 0.09 in the exact forward
# of its file, less than 8-bit activations move a logit, so a kernel's last-bit change can turn it into French.)
PROMPT = "What is the capital of Japan?"
EXPECTED_WORD = "tokyo"
MAX_NEW_TOKENS = 24
EXIT_OK = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


@dataclass(frozen=True)
class SelfTestReport:
    checks: list[CheckResult]
    seconds: float
    launch_to_first_token_s: float | None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)

    @property
    def first_failure(self) -> CheckResult | None:
        return next((check for check in self.checks if not check.ok), None)


def force_offline() -> None:
    """The self-test must never reach the network: it checks what is installed, nothing else."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def seconds_since_launch() -> float | None:
    """Wall time since this process started (includes unpacking and imports of a frozen bundle)."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # psutil can be denied the process table on locked-down systems
        return None


def expected_kv_bytes(model_config: Any, tokens: int, element_size: int) -> int:
    """What the memory planner says the cache holds at `tokens`: 2 (keys and values) × KV heads × head dim × bytes
    per element for each attention layer (GQA-aware, sliding windows capped)."""
    from app.core.memory.planner import kv_layout

    return kv_layout(model_config, element_size).bytes_at(tokens)


def run_checks(loaded: LoadedModel | None = None, *, progress: Callable[[str], None] | None = None) -> SelfTestReport:
    """Run every check; a given `loaded` model skips the load (tests pass the session's default model)."""
    force_offline()
    started = time.perf_counter()
    checks: list[CheckResult] = []
    first_token_at: float | None = None

    def note(message: str) -> None:
        if progress:
            progress(message)

    try:
        from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
        from app.core.chat.sampling import SamplingParams
        from app.core.engines.engine import Engine, KVState
        from app.core.engines.loader import load_model
    except Exception as exc:  # a broken bundle: a library or one of its files was left out
        checks.append(CheckResult("libraries", False, f"cannot import the model libraries ({exc})"))
        return SelfTestReport(checks, time.perf_counter() - started, None)

    if loaded is None:
        note("loading the embedded default model (the first run converts it, ~30 s)…")
        try:
            loaded = load_model(None)
        except HearthError as exc:
            checks.append(CheckResult("model", False, str(exc)))
            return SelfTestReport(checks, time.perf_counter() - started, None)
    checks.append(CheckResult("model", True, f"{loaded.describe()}, loaded in {loaded.load_seconds:.1f} s"))

    note(f"asking: {PROMPT}")
    engine = Engine(loaded, response_cache=None)  # a real generation, never a replayed answer
    kv = KVState()
    params = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS)
    done: DoneEvent | None = None
    stats: StatsEvent | None = None
    for event in engine.generate(ReplyRequest([ChatMessage("user", PROMPT)], params, use_response_cache=False), kv=kv):
        if isinstance(event, TokenEvent) and first_token_at is None and event.text.strip():
            first_token_at = seconds_since_launch()
        elif isinstance(event, StatsEvent):
            stats = event
        elif isinstance(event, DoneEvent):
            done = event
    reply = (done.text if done else "").strip()
    if done is None or done.finish_reason == "error":
        error = done.error if done else "no reply"
        checks.append(CheckResult("answer", False, f"generation failed: {error}"))
    elif EXPECTED_WORD not in reply.lower():
        checks.append(CheckResult("answer", False, f"expected {EXPECTED_WORD!r} in the reply, got {reply!r}"))
    else:
        speed = (
            f" (TTFT {stats.stats.ttft_s * 1000:.0f} ms, decode {stats.stats.decode_tokens_per_s:.1f} tok/s)"
            if stats
            else ""
        )
        checks.append(CheckResult("answer", True, f"{reply!r}{speed}"))

    checks.append(weights_check(loaded))
    checks.append(kv_check(loaded, kv))
    snapshot = snapshot_check(loaded, kv)
    if snapshot is not None:
        checks.append(snapshot)
    return SelfTestReport(checks, time.perf_counter() - started, first_token_at)


def weights_check(loaded: LoadedModel) -> CheckResult:
    weights = sum(placement.parameter_bytes for placement in loaded.placements)
    where = ", ".join(sorted({placement.device for placement in loaded.placements})) or "nowhere"
    if weights <= 0:
        return CheckResult("weights memory", False, f"the device placements account for {weights} bytes")
    return CheckResult("weights memory", True, f"{weights / 2**20:.1f} MiB on {where}")


def kv_check(loaded: LoadedModel, kv: Any) -> CheckResult:
    from app.core.engines.engine import kv_cache_bytes

    measured = kv_cache_bytes(kv.cache)
    tokens = len(kv.ids)
    if measured <= 0 or tokens <= 0:
        return CheckResult("KV cache memory", False, f"{measured} bytes for {tokens} tokens after the reply")
    element_size = int(loaded.model.dtype.itemsize)  # the cache is kept in the compute dtype
    expected = expected_kv_bytes(loaded.model.config, tokens, element_size)
    if measured != expected:
        return CheckResult(
            "KV cache memory",
            False,
            f"{measured:,} bytes measured for {tokens} tokens but the model's shape gives {expected:,}",
        )
    return CheckResult("KV cache memory", True, f"{measured / 2**10:.1f} KiB for {tokens} tokens (matches the shape)")


def snapshot_check(loaded: LoadedModel, kv: Any) -> CheckResult | None:
    """The live accounting the window shows must agree with the tensors (None where it is not in this build)."""
    try:
        from app.core.memory.accounting import MemoryMonitor
    except ImportError:
        return None
    from app.core.engines.engine import kv_cache_bytes
    from app.core.fastpath.packed import mapped_tensor_bytes

    snapshot = MemoryMonitor(loaded, lambda: kv).snapshot()
    weights = sum(device.weights_bytes for device in snapshot.devices)
    # A q4 model's embedding stays mapped from the weight file: placed on the CPU, but resident only where read, so
    # the accounting leaves it out of the weights (the rows read show in the overhead).
    placed = sum(placement.parameter_bytes for placement in loaded.placements) - mapped_tensor_bytes(loaded.model)
    measured_kv = kv_cache_bytes(kv.cache)
    problems = []
    if snapshot.kv_bytes != measured_kv:
        problems.append(f"KV {snapshot.kv_bytes:,} bytes but the cache holds {measured_kv:,}")
    cache_tokens = int(kv.cache.get_seq_length()) if kv.cache is not None else 0
    if snapshot.kv_tokens != cache_tokens:
        problems.append(f"KV {snapshot.kv_tokens} tokens counted but the cache holds {cache_tokens}")
    if weights < placed or weights <= 0:
        problems.append(f"weights {weights:,} bytes, fewer than the {placed:,} placed on devices")
    if problems:
        return CheckResult("memory snapshot", False, "; ".join(problems))
    return CheckResult(
        "memory snapshot",
        True,
        f"weights {weights / 2**20:.1f} MiB, KV {snapshot.kv_bytes / 2**10:.1f} KiB for {snapshot.kv_tokens} tokens",
    )


def format_report(report: SelfTestReport) -> str:
    lines = [f"{APP_NAME} {__version__} self-test"]
    lines += [check.line() for check in report.checks]
    if report.launch_to_first_token_s is not None:
        lines.append(f"  first answer token {report.launch_to_first_token_s:.1f} s after launch")
    failure = report.first_failure
    if failure is None and report.passed:
        lines.append(f"self-test passed in {report.seconds:.1f} s")
    else:
        name = failure.name if failure else "nothing ran"
        lines.append(f"self-test FAILED: {name}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    del args  # the self-test takes no options: it checks the install as a user would run it
    report = run_checks(progress=lambda message: print(f"· {message}", file=sys.stderr, flush=True))
    print(format_report(report), flush=True)
    return EXIT_OK if report.passed else EXIT_FAILED
