"""Shared fixtures (their helpers are in ``tests/helpers.py``).

``raw_ws`` opens a WebSocket to a ``running_server`` simulation with a bare wsproto
client; ``raw_http`` sends raw bytes and returns the answer; ``serve`` and
``serve_module`` start ``trio-duplex serve`` subprocesses and always stop them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto.events import AcceptConnection

from trio_duplex.testing import Simulation

from .helpers import RawClient, RawHttp, RawWs, Serve, Servers, raw_handshake
from .speech_audio import speech_parts  # noqa: F401  (the fixture of the needs_speech mark)

# -- the suite on two workers (pytest-xdist: ``-n 2 --dist loadgroup`` in pyproject) ------

ONE_AT_A_TIME = "one-at-a-time"
ONE_AT_A_TIME_FILES = (
    "tests/browser/",
    "tests/openai_sdk/",
    "tests/test_benchmarks_smoke.py",
    "tests/client/test_mic.py",
    "tests/engines/test_speech.py",
    "tests/engines/test_speech_conversation.py",
    "tests/engines/test_response_metadata.py",
    "tests/server/test_speech_serve.py",
    "tests/cluster/test_speech_migration.py",
    "tests/twilio/test_calls.py",
)
"""The tests that keep time with a wall clock under real load: real speech through the
real recogniser (every ``media`` test, every one that needs the speech parts), Chromium,
the OpenAI SDKs in their venvs, the benchmarks' smoke runs. ``--dist loadgroup`` sends
them all to one worker as one unit, one after another as in a serial run, while the
other worker runs the rest. By file (a folder ends in ``/``), not by mark: pytest-xdist
3.8's ``xdist_group`` mark groups nothing on pytest 9.2 (it renames a test's node id,
which pytest 9.2 no longer reads back: pytest-xdist issue 1386), so ``ONE_AT_A_TIME``
is a scheduler's rule (``pytest_xdist_make_scheduler`` below); the check in
``pytest_collection_modifyitems`` keeps every marked test in a listed file."""


def in_one_at_a_time(nodeid: str) -> bool:
    file = nodeid.partition("::")[0]
    return any(
        file.startswith(entry) if entry.endswith("/") else file == entry
        for entry in ONE_AT_A_TIME_FILES
    )


def _keeps_wall_time(item: pytest.Item) -> bool:
    needs_speech = "speech_parts" in getattr(item, "fixturenames", ())
    return needs_speech or item.get_closest_marker("media") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``media`` test (or one needing the speech parts) outside ``ONE_AT_A_TIME_FILES``
    would run beside the other worker's tests: refused, serial run or not."""
    root = Path(config.rootpath)
    stray = sorted(
        {
            item.path.relative_to(root).as_posix()
            for item in items
            if _keeps_wall_time(item) and not in_one_at_a_time(item.nodeid)
        }
    )
    if stray:
        raise pytest.UsageError(
            "media/speech tests outside tests/conftest.py's ONE_AT_A_TIME_FILES "
            f"(add their files there): {', '.join(stray)}"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with ``ONE_AT_A_TIME`` as a group (any ``xdist_group`` mark
    still counts, once pytest-xdist reads it again); every other test on its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneAtATime(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if in_one_at_a_time(nodeid):
                return ONE_AT_A_TIME
            scope: str = super()._split_scope(nodeid)
            return scope

    return OneAtATime(config, log)


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
