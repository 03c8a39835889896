"""A local OpenAI-compatible server in front of one loaded model: safe by default, one request queue.

Plain Python (no Qt): `hearth serve` and the window's Server switch both drive it through `ServerHandle`.
"""

from app.core.server.handle import RequestRecord, ServerConfig, ServerHandle
from app.core.server.queue import QueueFullError, RequestQueue, ServedModel

__all__ = ["QueueFullError", "RequestQueue", "RequestRecord", "ServedModel", "ServerConfig", "ServerHandle"]
