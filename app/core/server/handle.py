"""ServerHandle: start and stop the server from plain Python (the `hearth serve` command, the window's switch).

    handle = ServerHandle(ServerConfig(port=0), on_request=print)
    address = handle.start(backend)   # any ChatBackend-like object; the server's worker thread calls it
    ...                                # handle.queue.submit(...) serves the window's own chats in the same queue
    handle.stop()

uvicorn runs in a thread of its own with its own event loop; start() returns once the socket listens.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from app.core.errors import HearthError
from app.core.server.api import RequestLog, RequestRecord, ServerApp
from app.core.server.guard import Policy
from app.core.server.protocol import Limits
from app.core.server.queue import RequestQueue, ServedModel
from app.core.server.security import DEFAULT_PORT, check_bind, check_cors_origins
from app.core.settings import DEFAULT_PARALLEL, MAX_PARALLEL

log = logging.getLogger(__name__)
START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0 = any free port (see ServerHandle.address)
    api_key: str | None = field(default=None, repr=False)  # from the keyring; never logged
    allow_network: bool = False
    cors_origins: tuple[str, ...] = ()
    max_queue: int = 16
    parallel: int = DEFAULT_PARALLEL  # the model's max_batch (its KV caches' memory) caps it
    # Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (the client address in the log then comes from
    # them); none by default, so no client can name itself another address.
    trusted_proxies: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)


class ServerHandle:
    def __init__(self, config: ServerConfig, on_request: RequestLog | None = None) -> None:
        check_bind(config.host, config.api_key, config.allow_network)
        check_cors_origins(config.cors_origins, config.api_key)
        self.config = config
        self.on_request = on_request
        self.queue: RequestQueue | None = None
        self.app: ServerApp | None = None
        self._server: object | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int:
        if self._port is None:
            raise HearthError("The server is not running.")
        return self._port

    @property
    def address(self) -> str:
        """The base URL clients use (OpenAI clients: base_url=address)."""
        host = self.config.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/v1"

    def start(self, backend: ServedModel) -> str:
        import uvicorn

        from app.core.server.connection import HalfCloseH11Protocol

        if self.running:
            raise HearthError("The server is already running.")
        self.queue = RequestQueue(backend, max_waiting=self.config.max_queue, parallel=self.config.parallel)
        policy = Policy(self.config.host, self.config.api_key, self.config.cors_origins, self.config.limits)
        self.app = ServerApp(self.queue, policy, model_id=backend.info.name, on_request=self.on_request)
        uv_config = uvicorn.Config(
            self.app.asgi, host=self.config.host, port=self.config.port, log_level="warning",
            access_log=False, lifespan="off", server_header=False, timeout_graceful_shutdown=2,
            http=HalfCloseH11Protocol, proxy_headers=bool(self.config.trusted_proxies),
            log_config=None,  # uvicorn's records go where the process sends its own (a file; the terminal if asked)
            forwarded_allow_ips=list(self.config.trusted_proxies) or None,
        )  # fmt: skip
        server = uvicorn.Server(uv_config)
        self._server = server
        self.queue.start()

        def serve() -> None:
            try:
                server.run()
            except BaseException as exc:  # SystemExit when the port is taken: start() says so
                log.info("the HTTP server stopped: %r", exc)

        self._thread = threading.Thread(target=serve, name="hearth-server-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.queue.stop()
                self._thread = None
                raise HearthError(
                    f"The server could not listen on {self.config.host}:{self.config.port} "
                    "(is the port in use? try --port 0 for any free port)."
                )
            time.sleep(0.01)
        sockets = [s for srv in server.servers for s in srv.sockets]
        self._port = int(sockets[0].getsockname()[1]) if sockets else self.config.port
        log.info("serving %s at %s", backend.info.name, self.address)
        return self.address

    def stop(self) -> None:
        """Cancel what is running and waiting, close the socket, end both threads."""
        if self.queue is not None:
            self.queue.stop()
        server = self._server
        if server is not None:
            server.should_exit = True  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(10.0)
        self._thread = None
        self._server = None
        self._port = None


__all__ = ["DEFAULT_PARALLEL", "MAX_PARALLEL", "RequestRecord", "ServerConfig", "ServerHandle"]
