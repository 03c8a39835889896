"""`hearth serve`: the loaded model as a local OpenAI-compatible server (127.0.0.1 unless told otherwise)."""

from __future__ import annotations

import argparse
import secrets as random_secrets
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from app.cli import Subparsers
from app.cli.common import add_model_flags, progress_to_stderr, settings_from_args
from app.core.errors import HearthError
from app.core.server.protocol import Limits
from app.core.server.security import DEFAULT_PORT, check_bind, check_cors_origins
from app.core.settings import DEFAULT_PARALLEL, MAX_PARALLEL

if TYPE_CHECKING:  # the server itself (starlette, uvicorn) is imported when `serve` runs, not for every command
    from app.core.server.api import RequestRecord
    from app.core.server.handle import ServerConfig

KEY_PREFIX = "server-key:"  # keyring username = KEY_PREFIX + the name given to --api-key-name


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the model over the OpenAI API (local only by default)",
        description="Serve the model to other programs over the OpenAI API: /v1/chat/completions, "
        "/v1/completions, /v1/models, /health, /metrics. Listens on 127.0.0.1 only unless --allow-network "
        "and an API key are given.",
    )  # fmt: skip
    add_model_flags(parser)
    net = parser.add_argument_group("network and safety")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine)")
    net.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 = any free)")
    net.add_argument(
        "--api-key-name", metavar="NAME",
        help="require 'Authorization: Bearer KEY', KEY being the one saved in the system keyring under NAME",
    )  # fmt: skip
    net.add_argument(
        "--new-key", action="store_true",
        help="make a new random key, save it in the keyring under --api-key-name and print it once",
    )  # fmt: skip
    net.add_argument(
        "--allow-network", action="store_true",
        help="allow a --host other than this machine (needs --api-key-name too)",
    )  # fmt: skip
    net.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN",
        help="let web pages at ORIGIN (e.g. http://localhost:3000) call the server; repeatable; off by default "
        "('null' only with --api-key-name: any site can send it)",
    )  # fmt: skip
    net.add_argument(
        "--trusted-proxy", action="append", default=[], metavar="ADDRESS",
        help="believe X-Forwarded-For from this reverse proxy's address; repeatable; by default no one's",
    )  # fmt: skip
    net.add_argument("--max-queue", type=int, default=16, help="requests that may wait; more get 503 (default 16)")
    net.add_argument(
        "--parallel", type=int, default=DEFAULT_PARALLEL,
        help=f"replies decoded together, each step reading the weights once for all (default {DEFAULT_PARALLEL}; "
        "1: one at a time; fewer where memory for their KV caches is short)",
    )  # fmt: skip
    net.add_argument(
        "--max-tokens", type=int, default=Limits.max_tokens, help="the most tokens one request may ask for"
    )
    net.add_argument(
        "--strict-tools", action="store_true",
        help="refuse 'tools' (400) on a model whose chat template has none, instead of offering them through "
        "Hearth's fallback prompt and a grammar-forced call",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def api_key_from_keyring(name: str, *, make_new: bool) -> str:
    from app.core.engines.remote import engines

    key_name = KEY_PREFIX + name
    if make_new:
        key = "hearth-" + random_secrets.token_urlsafe(24)
        engines.save_key(key_name, key)  # raises the keyring's own one-line error when there is none
        print(f"New API key saved in the system keyring as {name!r}. Give it to your clients (shown once):")
        print(key, flush=True)
        return key
    stored = engines.read_key(key_name)
    if not stored:
        raise HearthError(
            f"No API key named {name!r} in the system keyring; make one with `hearth serve --api-key-name {name} "
            "--new-key`."
        )
    return stored


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    if args.new_key and not args.api_key_name:
        raise HearthError("--new-key needs --api-key-name NAME (the name the key is saved under).")
    if args.max_queue < 0:
        raise HearthError("--max-queue must be 0 or more.")
    if not 1 <= args.parallel <= MAX_PARALLEL:
        raise HearthError(f"--parallel must be between 1 and {MAX_PARALLEL} (got {args.parallel}).")
    if not 0 <= args.port <= 65535:
        raise HearthError(f"--port must be between 0 and 65535 (got {args.port}).")
    if args.max_tokens < 1:
        raise HearthError("--max-tokens must be at least 1.")
    # Refuse an off-loopback address before asking the keyring or loading the model.
    check_bind(args.host, "pending" if args.api_key_name else None, args.allow_network)
    check_cors_origins(tuple(args.cors_origin), "pending" if args.api_key_name else None)
    key = api_key_from_keyring(args.api_key_name, make_new=args.new_key) if args.api_key_name else None
    from app.core.server.handle import ServerConfig

    return ServerConfig(
        host=args.host, port=args.port, api_key=key, allow_network=args.allow_network,
        cors_origins=tuple(args.cors_origin), max_queue=args.max_queue, parallel=args.parallel,
        trusted_proxies=tuple(args.trusted_proxy),
        limits=Limits(max_tokens=args.max_tokens, default_max_tokens=min(Limits.default_max_tokens, args.max_tokens),
                      tool_prompt_fallback=not args.strict_tools),
    )  # fmt: skip


def print_record(record: RequestRecord) -> None:
    line = f"{record.client} {record.method} {record.path} {record.status}"
    if record.completion_tokens or record.prompt_tokens:
        line += (
            f" · prompt {record.prompt_tokens} ({record.cached_tokens} cached) · {record.completion_tokens} generated"
            f" · TTFT {record.ttft_ms:.0f} ms · {record.decode_tokens_per_s:.1f} tok/s"
        )
    if record.error:
        line += f" · {record.error}"
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    settings = settings_from_args(args)
    from app.core.engines.backend import LoadRequest
    from app.core.engines.opening import open_backend

    # No response cache: an API client asking again wants a fresh reply (seeds are honoured).
    request = LoadRequest.from_settings(settings, ignore_fit=bool(args.ignore_fit), response_cache=False)
    # The load `hearth chat` and the window make (the torch-free runtime where it can take the model): the same
    # runtime gives the same greedy tokens and speed; grammars mask its numpy logits as they do torch's.
    from app.core.engines.lite.backend import lite_candidate

    candidate = lite_candidate(request)  # the torch-free runtime's verdict, before the load writes anything
    backend = open_backend(request, progress_to_stderr)
    for notice in [*backend.info.notices, *backend.info.recovered]:
        print(f"hearth: note: {notice}", file=sys.stderr)
    print(f"hearth: runtime: {runtime_line(backend, candidate)}", file=sys.stderr, flush=True)
    from app.core.server.handle import ServerHandle

    handle = ServerHandle(config, on_request=print_record)
    try:
        address = handle.start(backend)
        safety = "API key required" if config.api_key else "no key (this machine only)"
        cors = ", ".join(config.cors_origins) or "off"
        running = handle.queue.parallel if handle.queue is not None else 1
        parallel = f"{running} replies decoded together" if running > 1 else "one reply at a time"
        print(
            f"Serving {backend.info.name} at {address} · {safety} · CORS {cors} · {parallel} · queue "
            f"{config.max_queue}. Ctrl+C stops.",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        stopped = threading.Event()
        previous = stop_on_sigterm(stopped)
        try:
            while handle.running and not stopped.wait(0.5):
                pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return 0
    except KeyboardInterrupt:  # Ctrl+C (a shell that started us in the background makes us ignore it: SIGTERM stops)
        return 0
    finally:
        handle.stop()
        backend.close()


def runtime_line(backend: Any, candidate: object) -> str:
    """Which runtime serves and, when it is torch, why (`candidate`: lite_candidate's verdict before the load)."""
    from app.core.engines.lite.backend import LiteBackend

    if isinstance(backend, LiteBackend):
        return "torch-free, as `hearth chat` and the window run it"
    if candidate == "a remote model":
        return "the remote engine's"
    if isinstance(candidate, str):
        return f"torch ({candidate})"
    return "torch (the torch-free runtime could not open this model; the log says why)"


def stop_on_sigterm(stopped: threading.Event) -> Any:
    """SIGTERM (what service managers and `kill` send) stops the server cleanly, like Ctrl+C; returns the handler it
    replaced, or None off the main thread (where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda _signum, _frame: stopped.set())
