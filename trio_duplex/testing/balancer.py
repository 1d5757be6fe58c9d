"""A test load balancer: a trio TCP forwarder on a free loopback port that sends each new
connection to one of the nodes whose ``GET /readyz`` answers 200, round robin among them.

What docs/telephony.md asks of an operator's balancer in front of a cluster taking phone
calls (docs/plans/telephony.md §2.1): a draining node turns not-ready, so a
``<Redirect>``'s TwiML and the stream it starts land on live nodes. The nodes' readiness
is polled every ``POLL_S`` (100 ms: what a balancer's health check does, the only wait
here that is a sleep); a connection that comes while no node is ready is closed at once,
and a node that refuses a connection (a draining node may close its listener before the
next poll sees it not ready) is taken out until the poll finds it ready again, the
connection tried on the next: what a balancer's retry of the next upstream does.
Bytes are forwarded as they come, each way; when one side ends its half the other's is
ended too, and the connection is closed once both are done. Everything is bounded: the
connections at once, a node's connect and readiness answer, each read.

``routes`` records where each connection went (the node's port), for a test to read.
Two levers a test pulls, as a network or an operator would: ``avoid`` (ports that get no
new connection, ready or not) and ``cut`` (every connection to a node closed at once,
both ways, with no WebSocket close: a drop).
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio

POLL_S: Final = 0.1
"""How often each node's ``/readyz`` is asked."""
CHECK_TIMEOUT_S: Final = 0.5
"""A readiness answer slower than this counts as not ready."""
CONNECT_TIMEOUT_S: Final = 2.0
MAX_CONNECTIONS: Final = 64
RECEIVE_BYTES: Final = 65536
_READYZ: Final = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


@attrs.frozen
class Route:
    at: float
    """``time.monotonic()`` when the connection came."""
    port: int
    """The node it went to."""


@attrs.define(eq=False)
class Balancer:
    node_ports: Sequence[int]
    port: int = 0
    ready: list[int] = attrs.field(factory=list)
    """The ports whose last readiness check answered 200, in ``node_ports``' order."""
    routes: list[Route] = attrs.field(factory=list)
    avoid: set[int] = attrs.field(factory=set)
    """Ports that get no new connection whatever their readiness."""
    refused: int = 0
    """Connections closed because no node was ready (or the limit was reached)."""
    _next: int = 0
    _open: int = 0
    _polled: trio.Event = attrs.field(factory=trio.Event)
    _pairs: dict[int, tuple[int, trio.SocketStream, trio.SocketStream]] = attrs.field(factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def poll(self) -> None:
        while True:
            found: dict[int, bool] = {}
            async with trio.open_nursery() as nursery:
                for port in self.node_ports:
                    nursery.start_soon(self._check, port, found)
            self.ready = [p for p in self.node_ports if found.get(p)]
            self._polled.set()
            await trio.sleep(POLL_S)

    async def _check(self, port: int, found: dict[int, bool]) -> None:
        found[port] = False
        with trio.move_on_after(CHECK_TIMEOUT_S):
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                return
            async with stream:
                try:
                    await stream.send_all(_READYZ)
                    head = b""
                    while b"\r\n" not in head and len(head) < 1024:
                        data = await stream.receive_some(1024)
                        if not data:
                            break
                        head += data
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
            found[port] = head.startswith((b"HTTP/1.1 200 ", b"HTTP/1.0 200 "))

    def _pick(self) -> int | None:
        ready = [p for p in self.ready if p not in self.avoid]
        if not ready:
            return None
        port = ready[self._next % len(ready)]
        self._next += 1
        return port

    async def _connect(self) -> tuple[int, trio.SocketStream] | None:
        """A connection to a ready node: another one if a node refuses (a draining node
        may close its listener before the next poll sees it not ready: a load balancer
        retries the next upstream then, and takes that one out until it answers)."""
        for _ in range(len(self.node_ports)):
            port = self._pick()
            if port is None:
                return None
            try:
                with trio.move_on_after(CONNECT_TIMEOUT_S) as connecting:
                    node = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                node = None
            if node is not None and not connecting.cancelled_caught:
                return port, node
            if port in self.ready:
                self.ready.remove(port)  # out until the poll finds it ready again
        return None

    async def handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self._open >= MAX_CONNECTIONS:
                self.refused += 1
                return
            self._open += 1
            try:
                connected = await self._connect()
                if connected is None:
                    self.refused += 1
                    return
                port, node = connected
                self.routes.append(Route(time.monotonic(), port))
                key = id(client)
                self._pairs[key] = (port, client, node)
                try:
                    async with node, trio.open_nursery() as nursery:
                        nursery.start_soon(_pump, client, node)
                        nursery.start_soon(_pump, node, client)
                finally:
                    del self._pairs[key]
            except OSError:
                return
            finally:
                self._open -= 1

    async def cut(self, port: int) -> int:
        """Close every connection to ``port``, both sides, at once (no close frame of
        anyone's: the peers see their TCP connection end). How many were cut."""
        pairs = [(c, n) for p, c, n in self._pairs.values() if p == port]
        for client, node in pairs:
            await client.aclose()
            await node.aclose()
        return len(pairs)


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    """``source``'s bytes into ``sink`` until ``source`` ends; then ``sink``'s half ends
    (a reset either side ends both)."""
    try:
        while data := await source.receive_some(RECEIVE_BYTES):
            await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        # One side is gone: so is the other (both streams closed by the caller).
        await source.aclose()
        await sink.aclose()


@asynccontextmanager
async def open_balancer(node_ports: Sequence[int], sock: socket.socket) -> AsyncIterator[Balancer]:
    """A balancer on ``sock`` (bound and listening: see ``reserve``), in front of
    ``node_ports``; it has polled the nodes once when this yields."""
    found = Balancer(list(node_ports), port=sock.getsockname()[1])
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(found.poll)
        nursery.start_soon(trio.serve_listeners, found.handle, [listener])
        await found._polled.wait()
        yield found
        nursery.cancel_scope.cancel()


def reserve() -> socket.socket:
    """A listening socket on a free loopback port: the balancer's, known before the nodes
    start (they are told it as ``--twilio-public-url``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(MAX_CONNECTIONS)
    return sock
