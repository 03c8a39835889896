from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.replay_server import ReplayServer


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer().running() as server:
        yield server
