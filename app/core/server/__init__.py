"""A local OpenAI-compatible server in front of one loaded model: safe by default, one request queue.

Plain Python (no Qt): `hearth serve` and the window's Server switch both drive it through `ServerHandle`. The names
below load on first use (PEP 562): importing a light part of the package (its protocol, its log escaping) does not
import the server itself (starlette and uvicorn: ~0.15 s on every `hearth` command).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.server.handle import RequestRecord, ServerConfig, ServerHandle
    from app.core.server.queue import QueueFullError, RequestQueue, ServedModel

_HOMES = {
    "QueueFullError": "app.core.server.queue",
    "RequestQueue": "app.core.server.queue",
    "RequestRecord": "app.core.server.handle",
    "ServedModel": "app.core.server.queue",
    "ServerConfig": "app.core.server.handle",
    "ServerHandle": "app.core.server.handle",
}

__all__ = ["QueueFullError", "RequestQueue", "RequestRecord", "ServedModel", "ServerConfig", "ServerHandle"]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
