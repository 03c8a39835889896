"""`hearth cache`: the prompt cache on disk (prompts' KV blocks, so a document is prefilled once): its size, and
`--clear` to remove it."""

from __future__ import annotations

import argparse

from app.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("cache", help="show or clear the prompt cache on disk")
    parser.add_argument("--clear", action="store_true", help="remove every saved prompt block")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from app.core.engines.lite.backend import clear_prompt_cache, prompt_cache_folder
    from app.core.engines.lite.prefix_store import folder_usage
    from app.core.memory.types import format_bytes

    folder = prompt_cache_folder()
    if args.clear:
        blocks, size = clear_prompt_cache()
        print(f"Removed the prompt cache: {blocks:,} blocks, {format_bytes(size)} ({folder}).")
        return 0
    blocks, size = folder_usage(folder)
    print(f"Prompt cache: {blocks:,} blocks of 256 tokens, {format_bytes(size)} in {folder}")
    print("Clear it with `hearth cache --clear`; its size limit is the prompt_cache_gib setting (0 turns it off).")
    return 0
