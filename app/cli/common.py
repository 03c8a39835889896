"""Flags shared by commands that load a model, turned into the one Settings object."""

from __future__ import annotations

import argparse
import sys

from app.core.errors import InvalidSettingError
from app.core.models.quant import QUANTIZATIONS, auto_summary
from app.core.settings import DEVICES, Settings, read_settings


def quant_help(default: str) -> str:
    """The --quant help, with what `auto` picks on each device (from app.core.models.quant, so it cannot go stale)."""
    return f"weights precision (default: {default}; auto = {auto_summary()})"


def add_quant_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str) -> None:
    parser.add_argument("--quant", choices=QUANTIZATIONS, help=quant_help(default))


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        "-m",
        help="folder, .gguf file or Hub repo id in the local cache (default: the embedded SmolLM2-135M-Instruct)",
    )
    add_quant_flag(group, default="the settings, auto unless changed")
    group.add_argument("--device", choices=DEVICES, help="where to run (default: auto = CUDA, then MPS, then CPU)")
    group.add_argument("--context", type=int, metavar="TOKENS", help="context window (default: the model's maximum)")
    group.add_argument(
        "--allow-pickle",
        action="store_true",
        default=None,
        help="allow pickle (.bin) weights: only for sources you trust",
    )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=None,
        help="run the model's own Python code: only for sources you trust",
    )
    group.add_argument(
        "--ignore-fit",
        action="store_true",
        help="load even when the memory planner says the model will not fit (see `hearth plan`)",
    )


def saved_settings() -> Settings:
    """The settings file for a command: unknown keys are a warning; a bad value or a damaged file is an error
    (one line, exit 2), since a command line must not run on a half-understood file."""
    found = read_settings()
    if found.unknown_keys:
        print(f"hearth: warning: {found.unknown_line()}", file=sys.stderr)
    if not found.ok:
        raise InvalidSettingError(found.error_line())
    return found.settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Saved settings, overridden by whatever flags were given."""
    settings = saved_settings()
    changes = {
        "model": args.model,
        "quantization": args.quant,
        "device": args.device,
        "context_length": args.context,
        "allow_pickle": args.allow_pickle,
        "trust_remote_code": args.trust_remote_code,
    }
    return settings.with_changes(**{k: v for k, v in changes.items() if v is not None})


def progress_to_stderr(message: str, fraction: float | None) -> None:
    del fraction  # the command line shows the stage, not a bar
    print(f"· {message}", file=sys.stderr, flush=True)
