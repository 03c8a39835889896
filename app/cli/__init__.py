"""The `hearth` command line: one parser, one subcommand per module in COMMANDS.

User errors (HearthError) print one clear line and exit 2; no tracebacks for them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol, TypeAlias, cast

from app import __version__
from app.core.errors import HearthError

# Each module defines `register(subparsers)`, which adds its parser and sets `handler=run`.
COMMANDS: tuple[str, ...] = (
    "app.cli.cache",
    "app.cli.chat",
    "app.cli.engines",
    "app.cli.models",
    "app.cli.plan",
    "app.cli.pull",
    "app.cli.rm",
    "app.cli.serve",
    "app.cli.token",
)

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class HearthArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's own errors: one line, our exit code."""
        self.exit(EXIT_USER_ERROR, f"hearth: error: {message}\n")


# A string: argparse._SubParsersAction is generic only to type checkers, not at run time on Python 3.11.
Subparsers: TypeAlias = "argparse._SubParsersAction[HearthArgumentParser]"


class CommandModule(Protocol):
    def register(self, subparsers: Subparsers) -> None: ...


def build_parser() -> argparse.ArgumentParser:
    parser = HearthArgumentParser(
        prog="hearth", description="Run large language models on your own machine, with numbers you can trust."
    )
    parser.add_argument("--version", action="version", version=f"hearth {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and library warnings")
    parser.add_argument(
        "--self-test", action="store_true", help="check this install offline: load the default model, answer, exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=HearthArgumentParser)
    for name in COMMANDS:
        cast(CommandModule, importlib.import_module(name)).register(subparsers)
    return parser


def quiet_libraries(verbose: bool) -> None:
    """Keep library chatter (progress bars, deprecation notes) off the user's terminal unless asked."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if verbose:
        return
    import warnings

    warnings.filterwarnings("ignore")
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if args.self_test:
        from app.cli import selftest

        handler = selftest.run
    if handler is None:
        # No subcommand: the interactive chat, until the window is the default (`hearth-gui`).
        args = parser.parse_args(["chat", *(argv or sys.argv[1:])])
        handler = args.handler
    try:
        return handler(args)
    except HearthError as exc:
        print(f"hearth: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
