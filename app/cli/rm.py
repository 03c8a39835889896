"""`hearth rm MODEL`: delete a downloaded or converted model (user-added paths are only forgotten)."""

from __future__ import annotations

import argparse

from app.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("rm", help="delete a downloaded model (see `hearth models`)")
    parser.add_argument("model", metavar="MODEL", help="a name, repo id or path as `hearth models` lists it")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from app.core.models.library import delete_model, find_model

    print(delete_model(find_model(args.model)))
    return 0
