"""GUI responsiveness: stream 8,000 tokens at 300 tokens/s from a scripted backend into the real window, and
400 tokens from the real engine (the built-in SmolLM2 model) with its garbage collections and first send.

Prints a Markdown table:
- the longest event-loop stall while streaming (a 5 ms QTimer's lateness; target <= 30 ms),
- time per appended batch (the 40 ms flush: model update + cursor append) at the start vs the end of the reply
  (target: flat, i.e. the cost does not grow with the reply's length),
- the one-off Markdown render when the reply finishes,
- time from process start to first paint of `hearth-gui` (target < 1.5 s), and that torch was not imported by then.

Each engine runs in its own process, so the real run starts as cold as `hearth-gui` does (nothing imported or
frozen by the scripted run). The probe starts before the send click, so the click itself is measured.

Run: `QT_QPA_PLATFORM=offscreen python bench/ui.py` (the default when no display is set);
`--engine real --no-settle` measures without the freeze and renderer warm-up that follow a load (the "before").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def make_reply(tokens: int) -> str:
    words = []
    for i in range(tokens):
        words.append(f"word{i % 97}")
        if i % 14 == 13:
            words.append("\n")
    text = " ".join(words).replace(" \n ", "\n")
    return text


def streaming_run(tokens: int, rate: float, real: bool = False, settle: bool = True) -> dict[str, Any]:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import ScriptedBackend, scripted_factory
    from app.core.settings import Settings
    from app.core.storage.history import HistoryStore
    from app.ui import theme
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    assert isinstance(app, QApplication)
    theme.apply(app, "light")
    if not settle:
        from app.ui import worker

        worker.settle_after_load = lambda: None  # the "before": no freeze, renderer imported on first use
    reply = make_reply(tokens)
    backend = ScriptedBackend(replies=[reply], tokens_per_s=rate)
    # The real model may stop early at its end token; greedy decoding with a long ask keeps it going.
    settings = Settings(sampling=SamplingParams(max_new_tokens=tokens if real else tokens + 10))
    window = MainWindow(
        settings,
        store=HistoryStore(in_memory=True),  # a fresh conversation every run, even in a reused home
        backend_factory=None if real else scripted_factory(backend),
        planner=lambda request: None,
        autoload=False,
        save_settings_to_disk=False,
    )
    window.resize(1280, 800)
    window.show()
    from app.gui import freeze_startup_objects

    freeze_startup_objects()  # as hearth-gui does after building the window
    window.load_model(window.model_bar.request())
    deadline = time.monotonic() + (600 if real else 10)
    while window.model_info is None and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.001)
    if window.model_info is None:
        raise SystemExit("the model did not load")

    batch_times: list[float] = []
    original_flush = window.chat.flush

    def timed_flush() -> None:
        started = time.perf_counter()
        original_flush()
        batch_times.append(time.perf_counter() - started)

    window.chat.flush_timer.timeout.disconnect()
    window.chat.flush_timer.timeout.connect(timed_flush)

    ticks: list[float] = []
    probe = QTimer()
    probe.setInterval(5)
    probe.timeout.connect(lambda: ticks.append(time.perf_counter()))

    # Noise floor: the same probe on the idle window, so the stall is read against what the machine does anyway.
    idle_ticks: list[float] = []
    idle_probe = QTimer()
    idle_probe.setInterval(5)
    idle_probe.timeout.connect(lambda: idle_ticks.append(time.perf_counter()))
    idle_probe.start()
    idle_until = time.perf_counter() + min(5.0, tokens / rate)
    while time.perf_counter() < idle_until:
        app.processEvents()
        time.sleep(0.001)
    idle_probe.stop()
    idle_gaps = [b - a for a, b in itertools.pairwise(idle_ticks)]
    idle_stall_ms = max(0.0, (max(idle_gaps) - 0.005) * 1000) if idle_gaps else float("nan")

    finished: list[str] = []
    window.reply_finished.connect(finished.append)
    counted: list[int] = []  # appended from the worker thread (a lambda has no thread of its own)
    window.host.worker.token.connect(lambda rid, text, count: counted.append(count))

    probe.start()
    # Let the probe tick first, then send from the event loop as a click would: the send itself is measured.
    warm_until = time.perf_counter() + 0.1
    while time.perf_counter() < warm_until:
        app.processEvents()
        time.sleep(0.001)
    started = time.perf_counter()
    prompt = "Write a long story about a lighthouse keeper." if real else "Write a lot."
    send_s: list[float] = []

    def click_send() -> None:
        began = time.perf_counter()
        window.chat.send(prompt)
        send_s.append(time.perf_counter() - began)

    QTimer.singleShot(0, click_send)
    while not finished:
        app.processEvents()
        time.sleep(0.001)
    streaming_s = time.perf_counter() - started
    probe.stop()
    # The one-off Markdown render of the finished reply, timed alone (it also ran once when the reply finished).
    widget = window.chat_view.widgets()[-1]
    render_started = time.perf_counter()
    widget.set_item(widget.item)
    render_s = time.perf_counter() - render_started
    window.close()
    window.deleteLater()
    app.processEvents()

    # Stalls while streaming: gaps between probe ticks minus the 5 ms interval, up to the last flushed batch.
    last_batch_at = started + streaming_s - render_s
    gaps = sorted(((b - a, a - started) for a, b in itertools.pairwise(ticks) if b <= last_batch_at))
    stall_ms = max(0.0, (gaps[-1][0] - 0.005) * 1000) if gaps else float("nan")
    worst = ", ".join(f"{gap * 1000:.0f} ms at {at:.1f} s" for gap, at in reversed(gaps[-5:]))
    tenth = max(len(batch_times) // 10, 1)
    start_batches, end_batches = batch_times[:tenth], batch_times[-tenth - 1 : -1]
    return {
        "tokens": float(sum(counted)),
        "engine": "real" if real else "scripted",  # type: ignore[dict-item]
        "rate": rate,
        "streaming_s": streaming_s,
        "batches": float(len(batch_times)),
        "stall_ms": stall_ms,
        "idle_stall_ms": idle_stall_ms,
        "start_median_ms": statistics.median(start_batches) * 1000,
        "end_median_ms": statistics.median(end_batches) * 1000,
        "start_p95_ms": sorted(start_batches)[int(0.95 * (len(start_batches) - 1))] * 1000,
        "end_p95_ms": sorted(end_batches)[int(0.95 * (len(end_batches) - 1))] * 1000,
        "final_render_ms": render_s * 1000,
        "send_ms": send_s[0] * 1000,  # the send call alone, on the GUI thread
        "worst": worst,  # type: ignore[dict-item]
    }


def first_paint_runs(runs: int) -> list[tuple[float, float, bool]]:
    results: list[tuple[float, float, bool]] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "HEARTH_HOME": home, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "")}
            out = subprocess.run(
                [sys.executable, "-m", "app.gui", "--first-paint-report"],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout
        line = next(item for item in out.splitlines() if item.startswith("first_paint_s="))
        fields = dict(part.split("=") for part in line.split())
        results.append((float(fields["first_paint_s"]), float(fields["cpu_s"]), fields["torch_imported"] == "True"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--paint-runs", type=int, default=5)
    parser.add_argument("--engine", choices=("both", "scripted", "real"), default="both")
    parser.add_argument("--real-tokens", type=int, default=400, help="tokens the real engine streams")
    parser.add_argument("--no-settle", action="store_true", help="skip the gc freeze + renderer import after load")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one engine's result, for main
    args = parser.parse_args()

    if args.json:
        real = args.engine == "real"
        with tempfile.TemporaryDirectory() as home:
            os.environ.setdefault("HEARTH_HOME", home)  # a real run may reuse a home with the converted model
            result = streaming_run(args.real_tokens if real else args.tokens, args.rate, real, not args.no_settle)
        print("RESULT " + json.dumps(result), flush=True)
        os._exit(0)
    runs: dict[str, dict[str, Any]] = {}
    for engine in ("scripted", "real") if args.engine == "both" else (args.engine,):
        command = [sys.executable, __file__, "--json", "--engine", engine, "--tokens", str(args.tokens)]
        command += ["--rate", str(args.rate), "--real-tokens", str(args.real_tokens)]
        command += ["--no-settle"] if args.no_settle else []
        out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200, check=True).stdout
        runs[engine] = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    result = runs.get("scripted") or runs["real"]
    paints = first_paint_runs(args.paint_runs)
    paint_times = sorted(t for t, _, _ in paints)
    paint_cpu = sorted(c for _, c, _ in paints)
    torch_before_paint = any(flag for _, _, flag in paints)

    print(f"# bench/ui.py — {time.strftime('%Y-%m-%d')}, {os.cpu_count()}-core CPU, offscreen")
    print()
    print(
        f"Streaming {int(result['tokens']):,} tokens at {result['rate']:.0f} tok/s "
        f"({result['streaming_s']:.1f} s, {int(result['batches'])} batches):"
    )
    print()
    print("| measure | result | target |")
    print("|---|---|---|")
    print(f"| longest event-loop stall while streaming | {result['stall_ms']:.1f} ms | ≤ 30 ms |")
    print(f"| longest stall of the idle window, same probe (noise floor) | {result['idle_stall_ms']:.1f} ms | — |")
    print(
        f"| time per appended batch, first 10% of the reply (median / p95) | "
        f"{result['start_median_ms']:.2f} / {result['start_p95_ms']:.2f} ms | flat |"
    )
    print(
        f"| time per appended batch, last 10% of the reply (median / p95) | "
        f"{result['end_median_ms']:.2f} / {result['end_p95_ms']:.2f} ms | flat |"
    )
    print(f"| Markdown render of the finished reply (once) | {result['final_render_ms']:.0f} ms | — |")
    print(
        f"| process start to first paint (median of {len(paint_times)}, min–max) | "
        f"{statistics.median(paint_times):.2f} s ({paint_times[0]:.2f}–{paint_times[-1]:.2f}) | < 1.5 s |"
    )
    print(
        f"| CPU time of the process until first paint (median) | {statistics.median(paint_cpu):.2f} s | "
        "(less sensitive to machine load) |"
    )
    print(f"| torch imported before first paint | {'yes' if torch_before_paint else 'no'} | no |")
    print()
    print(f"Five longest gaps between 5 ms probe ticks: {result['worst']}.")
    if "real" in runs:
        real_run = runs["real"]
        settled = "no freeze after load" if args.no_settle else "gc freeze + renderer import after load"
        print()
        print(
            f"Real engine ({settled}): {int(real_run['tokens'])} tokens in {real_run['streaming_s']:.1f} s, "
            f"probe from the send click: longest stall {real_run['stall_ms']:.1f} ms (target ≤ 30 ms); "
            f"five longest gaps: {real_run['worst']}."
        )
    print(f"Load average during the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())}.")
    sys.stdout.flush()
    # Skip interpreter finalization: PySide6 can crash while garbage-collecting Qt objects at exit after
    # cross-thread signal traffic; the numbers are already printed.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
