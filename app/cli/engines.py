"""`hearth engines add|list|rm|test`: remote engines (OpenAI-compatible servers, OpenAI, Anthropic).

The registry is engines.json in the config dir; keys go only to the OS keyring (service "hearth")."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from app.cli import Subparsers
from app.core.errors import HearthError


def register(subparsers: Subparsers) -> None:
    from app.core.engines.remote.engines import ENGINE_KINDS, PRESETS

    parser = subparsers.add_parser("engines", help="remote engines: add, list, remove, test")
    actions = parser.add_subparsers(dest="engines_action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add (or with --replace, change) a remote engine")
    add.add_argument("name", help="a short name: letters, digits, . _ -")
    add.add_argument("--preset", choices=sorted(PRESETS), help="fill kind, URL and options for a known server")
    add.add_argument("--url", help="base URL, e.g. http://gpu-box:8000/v1 (default: the preset's)")
    add.add_argument("--kind", choices=ENGINE_KINDS, help="API shape (default: the preset's, else openai-compatible)")
    add.add_argument(
        "--key", action="store_true", help="read an API key from stdin (hidden on a terminal) into the OS keyring"
    )
    add.add_argument("--model", help="default model id for `hearth chat --engine NAME`")
    add.add_argument(
        "--no-usage", action="store_true", help="do not ask for stream_options.include_usage (servers that reject it)"
    )
    cache = add.add_mutually_exclusive_group()
    cache.add_argument("--response-cache", dest="response_cache", action="store_true", default=None)
    cache.add_argument("--no-response-cache", dest="response_cache", action="store_false")
    add.add_argument("--price-as", metavar="PROVIDER", help="genai-prices provider id for cost estimates (openai, …)")
    add.add_argument("--replace", action="store_true", help="replace an engine of the same name")
    listing = actions.add_parser("list", help="list engines (keys are never shown)")
    listing.add_argument("--json", action="store_true")
    remove = actions.add_parser("rm", help="remove an engine and its key")
    remove.add_argument("name")
    test = actions.add_parser("test", help="GET /v1/models and a tiny completion")
    test.add_argument("name")
    test.add_argument("--model", help="model to try (default: the engine's, else the first listed)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return {"add": _add, "list": _list, "rm": _rm, "test": _test}[args.engines_action](args)


def _add(args: argparse.Namespace) -> int:
    from app.core.engines.remote import engines as reg
    from app.core.storage import secrets

    preset = reg.PRESETS[args.preset] if args.preset else None
    url = args.url or (preset.base_url if preset else None)
    if url is None:
        raise HearthError("Give the engine's base URL with --url (or a --preset).")
    needs_key = args.key or bool(preset and preset.needs_key)
    if needs_key and not args.key:
        raise HearthError(f"The {preset.label if preset else ''} preset needs an API key: add --key (read from stdin).")
    if args.key and not secrets.keyring_available():
        # Fail before asking for the secret: typing it in for nothing is worse than the error.
        raise secrets.KeyringUnavailableError(
            "No system keyring is available on this machine, so the API key cannot be saved "
            "(Hearth never writes keys to files)."
        )
    engine = reg.EngineConfig(
        name=args.name,
        kind=args.kind or (preset.kind if preset else "openai-compatible"),
        base_url=url.rstrip("/"),
        key_name=reg.key_name_for(args.name) if args.key else None,
        include_usage=not args.no_usage and (preset.include_usage if preset else True),
        response_cache=args.response_cache
        if args.response_cache is not None
        else bool(preset and preset.response_cache),
        default_model=args.model,
        price_provider=args.price_as or (preset.price_provider if preset else None),
    )
    found = reg.load_engines()
    if found.get(engine.name) is not None and not args.replace:
        raise HearthError(f"An engine named {engine.name!r} exists; add --replace to change it.")
    if args.key:
        key = getpass.getpass("API key (input hidden): ") if sys.stdin.isatty() else sys.stdin.readline()
        reg.save_key(engine.key_name or "", key)
    reg.add_engine(engine, replace=True)
    where = " (key in the system keyring)" if args.key else ""
    print(f"Engine {engine.name!r} added: {engine.kind} at {engine.base_url}{where}.")
    return 0


def _list(args: argparse.Namespace) -> int:
    from app.core.engines.remote import engines as reg

    found = reg.load_engines()
    rows = []
    for engine in found.engines:
        key = "none" if engine.key_name is None else ("in keyring" if reg.read_key(engine.key_name) else "missing")
        rows.append({**engine.to_dict(), "key": key})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("No engines yet; add one with `hearth engines add NAME --url URL` or `--preset openai --key`.")
    for row in rows:
        model = f" model {row['default_model']}" if row["default_model"] else ""
        print(f"{row['name']}: {row['kind']} at {row['base_url']} · key {row['key']}{model}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    from app.core.engines.remote import engines as reg

    if not reg.remove_engine(args.name):
        raise HearthError(f"There is no engine named {args.name!r}.")
    print(f"Engine {args.name!r} removed (and its key, if it had one).")
    return 0


def _test(args: argparse.Namespace) -> int:
    from app.core.engines.remote import engines as reg
    from app.core.engines.remote.backend import RemoteBackend, probe_engine

    engine = reg.get_engine(args.name)
    backend = RemoteBackend(engine, args.model or engine.default_model or "?", api_key=reg.key_for(engine))
    try:
        if not (args.model or engine.default_model) and engine.kind == "openai-compatible":
            models = backend.list_models()
            if not models:
                raise HearthError(f"Engine {engine.name!r} lists no models at GET /v1/models.")
            backend.model = models[0]
        models, reply = probe_engine(backend, progress=lambda line: print(f"· {line}", file=sys.stderr))
    finally:
        backend.close()
    shown = ", ".join(models[:10]) + (f" and {len(models) - 10} more" if len(models) > 10 else "")
    print(f"Engine {engine.name!r} works. Models: {shown}. Test reply from {backend.model}: {reply.strip()!r}")
    return 0
