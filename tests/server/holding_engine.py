"""An engine for ``trio-duplex serve --engine tests.server.holding_engine:Holding``
(test_handshake_race.py): echo, after a ``prepare`` that, when the session's
configuration names a ``hold_port``, connects to that loopback port and waits until its
peer closes, as the realtime proxy waits for its upstream. The test holds the other end:
it sees when the prepare began, and when it was cancelled (its connection closes)."""

from __future__ import annotations

import trio

from trio_duplex.engines.echo import EchoEngine


class Holding(EchoEngine):
    async def prepare(self, nursery: trio.Nursery) -> None:
        port = self.config.get("hold_port")
        if not isinstance(port, int):
            return
        async with await trio.open_tcp_stream("127.0.0.1", port) as upstream:
            while await upstream.receive_some():
                pass
