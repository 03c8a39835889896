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
from app.core.fastpath.compile_notice import announcing_compile
from app.core.fastpath.openmp import prefer_short_spin

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


def setup_logging(verbose: bool) -> None:
    """Log records go to the log file (hearth.log in the log folder), and to the terminal only with --verbose: what a
    user must know reaches them as a `hearth: note:` line from the command itself, never as a raw WARNING line.
    Control characters are escaped in both (logsafe.SafeFormatter). Calling it again replaces what it set up."""
    from logging.handlers import RotatingFileHandler

    from app.core import crash
    from app.core.server.logsafe import SafeFormatter
    from app.core.storage import paths, secrets

    logging.raiseExceptions = False  # a log write that fails (a full disk) must not print a traceback of its own
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "hearth_cli", False)]:
        root.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = []
    try:
        path = paths.log_dir() / crash.LOG_FILE_NAME
        secrets.install_log_redaction()  # a Hub token must never reach the log file
        log_file = RotatingFileHandler(
            path, maxBytes=crash.LOG_MAX_BYTES, backupCount=crash.LOG_BACKUPS, encoding="utf-8", delay=True
        )
        log_file.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
        handlers.append(log_file)
    except OSError:  # no log folder (read-only, full): the records are dropped, the command still runs
        pass
    if verbose:
        terminal = logging.StreamHandler(sys.stderr)
        terminal.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
        handlers.append(terminal)
    handlers.append(logging.NullHandler())  # never logging's last resort, which prints warnings to stderr
    for handler in handlers:
        handler.hearth_cli = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def quiet_libraries(verbose: bool) -> None:
    """Keep library chatter (progress bars, deprecation notes) off the user's terminal unless asked."""
    setup_logging(verbose)
    if verbose:
        return
    import warnings

    warnings.filterwarnings("ignore")
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


def sweep_leftovers() -> None:
    """Remove what killed runs left in the cache (storage.staging), saying so when it was worth a line."""
    from app.core.storage import paths, staging
    from app.core.storage.space import format_size

    removed = staging.sweep_at_start()
    if removed:
        freed = sum(leftover.size_bytes for leftover in removed)
        cache = paths.cache_dir()
        where = "the cache" if all(leftover.path.is_relative_to(cache) for leftover in removed) else "Hearth's folders"
        print(f"hearth: note: removed {len(removed)} leftover(s) of interrupted runs from {where} "
              f"({format_size(freed)}).", file=sys.stderr)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    prefer_short_spin()  # before anything imports torch (app.core.fastpath.openmp)
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
    if not (args.command == "models" and getattr(args, "cache", False)):  # that one reports the leftovers itself
        sweep_leftovers()
    try:
        # a command that plans or loads may compile the CPU kernel first (a minute, once): said, not a silent wait
        with announcing_compile(lambda message: print(f"· {message}", file=sys.stderr, flush=True)):
            return handler(args)
    except HearthError as exc:
        print(f"hearth: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
