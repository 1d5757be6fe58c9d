"""The accept loop when the process is out of file descriptors."""

from __future__ import annotations

import errno
import logging

import attrs
import pytest
import trio
from trio.testing import MockClock

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import MemoryListener, SimClient, Simulation

from ..helpers import echo


@attrs.define(eq=False)
class ExhaustedListener(trio.abc.Listener[trio.abc.Stream]):
    """A listener whose first ``failures`` accepts fail with EMFILE."""

    inner: MemoryListener
    failures: int
    attempts: int = 0

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_out_of_descriptors_is_one_warning_a_minute_and_no_traceback(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Was: trio.serve_listeners logged an ERROR with a traceback every 100 ms.
    inner = MemoryListener.create()
    listener = ExhaustedListener(inner, failures=1200)  # two minutes of EMFILE
    server = DuplexServer(ServerConfig(), EchoEngine)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [listener])
        sim = Simulation(server, inner, nursery)
        client: SimClient | None = None
        with trio.fail_after(300):
            client, _ = await sim.open_session()  # served once descriptors are back
            await echo(client)
        nursery.cancel_scope.cancel()
    assert listener.attempts > 1200
    warnings = [r for r in caplog.records if r.name == "trio_duplex"]
    emfile = [r for r in warnings if "EMFILE" in r.getMessage()]
    assert len(emfile) in (2, 3)  # minutes 0, 1 (and 2): not one per retry
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in emfile)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
