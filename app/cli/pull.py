"""`hearth pull REPO [--file F]`: download a model from the Hugging Face Hub, with a progress bar on stderr."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TextIO

from app.cli import Subparsers
from app.core.models.hub_repo import DownloadProgress, format_bytes, format_duration


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("pull", help="download a model from the Hugging Face Hub (resumes)")
    parser.add_argument("repo", metavar="REPO", help="repo id (org/name) or a huggingface.co URL")
    parser.add_argument("--file", "-f", metavar="F", help="which GGUF file to fetch from a GGUF repo")
    parser.set_defaults(handler=run)


class ProgressBar:
    """One line, redrawn in place on a terminal; a line per file otherwise (logs stay readable)."""

    def __init__(self, stream: TextIO, width: int = 28) -> None:
        self.stream = stream
        self.width = width
        self.tty = stream.isatty()
        self._last_file = ""

    def __call__(self, event: DownloadProgress) -> None:
        filled = int(event.fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        speed = f"{format_bytes(event.bytes_per_s)}/s" if event.bytes_per_s else "–"
        line = (
            f"[{bar}] {event.fraction:>4.0%} {format_bytes(event.done_bytes)}/{format_bytes(event.total_bytes)} "
            f"{speed} ETA {format_duration(event.eta_s)}  {event.file} ({event.file_index}/{event.file_count})"
        )
        if event.stage == "verifying":
            line += " checking…"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            if event.stage == "done":
                self.stream.write("\n")
        elif event.file != self._last_file or event.stage == "done":
            self.stream.write(line + "\n")
        self._last_file = event.file
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from app.cli.common import saved_settings
    from app.core.memory.verdict import model_verdict
    from app.core.models.hub import HubClient
    from app.core.models.hub_repo import DownloadCancelled

    client = HubClient.default()
    plan = client.prepare(args.repo, file=args.file)
    settings = saved_settings()
    verdict = model_verdict(plan.config, quantization=settings.quantization, device=settings.device)
    licence = f", licence {plan.license}" if plan.license else ""
    resumed = f", {format_bytes(plan.present_bytes)} already here" if plan.present_bytes else ""
    print(
        f"{plan.label}: {len(plan.files)} files, {format_bytes(plan.total_bytes)}{resumed}{licence}. "
        f"Memory ({settings.quantization}, {settings.device}): {verdict.label}"
        + (f", needs {format_bytes(verdict.total_bytes)}" if verdict.total_bytes else ""),
        file=sys.stderr,
    )
    cancel = threading.Event()
    try:
        folder = client.download(plan, progress=ProgressBar(sys.stderr), cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        print(f"\nPaused. Run `hearth pull {args.repo}` again to resume.", file=sys.stderr)
        return 130
    except DownloadCancelled:
        print(f"\nPaused. Run `hearth pull {args.repo}` again to resume.", file=sys.stderr)
        return 130
    print(f"Downloaded to {folder}", file=sys.stderr)
    print(f"Chat with it: hearth chat --model {plan.repo_id}", file=sys.stderr)
    return 0
