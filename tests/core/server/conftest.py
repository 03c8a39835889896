"""A real uvicorn server on 127.0.0.1 (a free port, in a thread) and the official openai client against it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.core.server import RequestRecord, ServerConfig, ServerHandle


class Served:
    def __init__(self, handle: ServerHandle, records: list[RequestRecord]) -> None:
        self.handle = handle
        self.records = records

    @property
    def base_url(self) -> str:
        return self.handle.address

    @property
    def root(self) -> str:
        return self.handle.address.removesuffix("/v1")

    def client(self, api_key: str = "anything") -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    handles: list[ServerHandle] = []

    def start(backend: Any, **config: Any) -> Served:
        records: list[RequestRecord] = []
        handle = ServerHandle(ServerConfig(port=0, **config), on_request=records.append)
        handle.start(backend)
        handles.append(handle)
        return Served(handle, records)

    yield start
    for handle in handles:
        handle.stop()
