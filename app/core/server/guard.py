"""The guard in front of the server's routes (ASGI middleware): the Host header (DNS rebinding), a browser's Origin
(CORS), the API key and the body size, each refusal a JSON error that names what to do; nothing reaches a route
without passing it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.server.logsafe import echo, printable
from app.core.server.protocol import ApiError, Limits
from app.core.server.security import allowed_host_names, host_name, key_matches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """What the guard enforces."""

    bound_host: str = "127.0.0.1"
    api_key: str | None = field(default=None, repr=False)
    cors_origins: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)


def error_response(error: ApiError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers={**error.headers, **(extra_headers or {})})


class Guard:
    """ASGI middleware: Host header, browser Origin (CORS), API key, body size. Runs before any route."""

    def __init__(self, app: ASGIApp, policy: Policy, on_refused: Callable[[Scope, int, str], None]) -> None:
        self.app = app
        self.policy = policy
        self.hosts = allowed_host_names(policy.bound_host)
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        cors: dict[str, str] = {}
        refusal = self._refusal(scope, headers, origin)
        if origin is not None and origin in self.policy.cors_origins:
            cors = {"access-control-allow-origin": origin, "vary": "Origin"}
        if refusal is None and scope["method"] == "OPTIONS" and cors:
            preflight = Response(status_code=204, headers={
                **cors, "access-control-allow-methods": "GET, POST, OPTIONS",
                "access-control-allow-headers": "authorization, content-type", "access-control-max-age": "600",
            })  # fmt: skip
            await preflight(scope, receive, send)
            return
        if refusal is None and scope["method"] != "OPTIONS" and not self._authorized(scope["path"], headers):
            refusal = ApiError(
                401, "Missing or wrong API key: send 'Authorization: Bearer KEY' (the key the server was started "
                "with, kept in its system keyring).", code="invalid_api_key",
            )  # fmt: skip
        if refusal is None:
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.policy.limits.max_body_bytes:
                refusal = too_large(self.policy.limits.max_body_bytes)
        if refusal is not None:
            self.on_refused(scope, refusal.status, refusal.message)
            await error_response(refusal, cors)(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message["headers"] = [*message.get("headers", []), *((k.encode(), v.encode()) for k, v in cors.items())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_cors)
        except Exception as exc:  # answered already (ServerApp._internal_error): one escaped line, not uvicorn's dump
            log.error("server: %s %s failed: %s", scope["method"], printable(scope["path"]), printable(repr(exc)))

    def _refusal(self, scope: Scope, headers: dict[str, str], origin: str | None) -> ApiError | None:
        host = headers.get("host", "")
        if host_name(host) not in self.hosts:
            return ApiError(
                403, f"Host {echo(host, 80)} is not this server; requests must name it by its own address "
                "(a protection against DNS rebinding).", code="host_not_allowed",
            )  # fmt: skip
        if origin is not None and origin not in self.policy.cors_origins:
            return ApiError(403, _origin_refusal(origin), code="origin_not_allowed")
        return None

    def _authorized(self, path: str, headers: dict[str, str]) -> bool:
        if self.policy.api_key is None or path == "/health":
            return True
        return key_matches(headers.get("authorization"), self.policy.api_key)


def _origin_refusal(origin: str) -> str:
    if origin == "null":  # a sandboxed frame, a file:// page, a redirect: any site can send it, so never advise it
        return (
            "Requests from web pages with no origin ('null': a sandboxed frame or a local file) are refused; any site "
            "can send that origin. Call the server from a program, or from a page served at an address you allow."
        )
    if is_plain_origin(origin):
        return f"Requests from web pages at {echo(origin, 80)} are refused; start the server with --cors-origin " + (
            f"{origin} to allow that page."
        )
    return f"Requests from web pages at {echo(origin, 80)} are refused."


def is_plain_origin(origin: str) -> bool:
    """scheme://host[:port], nothing else (what a browser sends and what --cors-origin takes)."""
    scheme, sep, rest = origin.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or len(origin) > 200:
        return False
    return host_name(rest) is not None and all(c.isalnum() or c in ".-:[]" for c in rest)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this server's limit of {limit // 1024} KiB.",
                    code="request_too_large")  # fmt: skip
