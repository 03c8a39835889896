"""`hearth token set|clear|status`: the Hugging Face token, kept only in the OS keyring."""

from __future__ import annotations

import argparse
import getpass
import sys

from app.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("token", help="save or remove the Hugging Face token (OS keyring)")
    parser.add_argument("action", choices=("set", "clear", "status"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from app.core.storage import secrets

    if args.action == "status":
        status = secrets.token_status()
        where = {"keyring": "saved in the system keyring", "session": "kept for this run only", None: "not set"}
        print(f"Hub token: {where[status.location]}. Keyring backend: {status.backend_name}.")
        if not status.keyring_available:
            print(secrets.no_keyring_message() + " For `hearth pull`, set HF_TOKEN in its environment instead.")
        return 0
    if args.action == "clear":
        removed = secrets.clear_hub_token()
        print("Hub token removed from the keyring." if removed else "There was no Hub token to remove.")
        return 0
    if not secrets.keyring_available():
        # Fail before asking for the secret: typing it in for nothing is worse than the error.
        raise secrets.KeyringUnavailableError(
            secrets.no_keyring_message() + " For `hearth pull`, set HF_TOKEN in its environment instead."
        )
    # getpass on a terminal (nothing echoed); a pipe (`echo $T | hearth token set`) is read as is.
    token = getpass.getpass("Hugging Face token (input hidden): ") if sys.stdin.isatty() else sys.stdin.readline()
    secrets.save_hub_token(token)
    print("Hub token saved in the system keyring (service 'hearth').")
    return 0
