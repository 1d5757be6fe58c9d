"""Shared fixtures (their helpers are in ``tests/helpers.py``).

``raw_ws`` opens a WebSocket to a ``running_server`` simulation with a bare wsproto
client; ``raw_http`` sends raw bytes and returns the answer; ``serve`` and
``serve_module`` start ``trio-duplex serve`` subprocesses and always stop them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from wsproto.events import AcceptConnection

from trio_duplex.testing import Simulation

from .helpers import RawClient, RawHttp, RawWs, Serve, Servers, raw_handshake
from .speech_audio import speech_parts  # noqa: F401  (the fixture of the needs_speech mark)


@pytest.fixture
def raw_ws() -> RawWs:
    """``await raw_ws(sim, path)`` → a RawClient whose handshake was accepted."""

    async def connect(sim: Simulation, path: str = "/v1/duplex", **kwargs: Any) -> RawClient:
        stream, _ = await sim.listener.connect()
        client = RawClient(stream, **kwargs)
        answer = await raw_handshake(client, path)
        assert isinstance(answer, AcceptConnection), answer
        return client

    return connect


@pytest.fixture
def raw_http() -> RawHttp:
    """``await raw_http(sim, request_bytes)`` → every byte the server answers, until EOF."""

    async def exchange(sim: Simulation, request: bytes) -> bytes:
        stream, _ = await sim.listener.connect()
        await stream.send_all(request)
        answer = b""
        with trio.fail_after(30):
            while True:
                try:
                    chunk = await stream.receive_some()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not chunk:
                    break
                answer += chunk
        return answer

    return exchange


@pytest.fixture
def servers() -> Iterator[Servers]:
    """Server processes, every one stopped at the end of the test."""
    started = Servers()
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def serve(servers: Servers) -> Serve:
    """``serve(*flags)`` starts a server on a free port and returns once it is ready."""
    return servers.start


@pytest.fixture(scope="module")
def module_servers() -> Iterator[Servers]:
    """Server processes shared by the tests of one module, every one stopped at its end."""
    started = Servers()
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def serve_module(module_servers: Servers) -> Serve:
    """Like ``serve``, for a server shared by the tests of one module."""
    return module_servers.start
