"""A fault-injecting TCP proxy for tests: 127.0.0.1:<port> forwards to a target and cuts
connections at random points.

Faults are drawn from a seeded RNG and bounded in count and time: a new connection is
doomed (with ``cut_probability``) while fewer than ``max_cuts`` have been cut and less
than ``fault_window`` seconds have passed since the proxy started; a doomed connection
dies after a random byte budget (possibly mid-frame, possibly inside the HTTP handshake)
or a random lifetime, whichever comes first. After that every connection is clean, so a
client that keeps reconnecting always gets through. A cut is a FIN or, at random, a RST
(SO_LINGER 0), on both sides at once, as a lost network looks to each end.
"""

from __future__ import annotations

import random
import socket
import struct

import attrs
import trio


@attrs.frozen
class FaultPlan:
    seed: int
    max_cuts: int = 10
    """Faults over the proxy's whole life; after that every connection is clean."""
    fault_window: float = 10.0
    """Seconds after the start in which new connections may be doomed."""
    cut_probability: float = 1.0
    """Chance that a new connection is doomed (while cuts remain)."""
    max_bytes: int = 6000
    """A doomed connection dies once this many bytes (at most, drawn at random) have
    been forwarded, counting both directions; a WebSocket handshake is ~300 bytes."""
    max_lifetime: float = 0.5
    """...or after a random time up to this (seconds), whichever comes first."""


@attrs.frozen
class Cut:
    connection: int
    after_bytes: int
    after_seconds: float
    rst: bool


@attrs.define(eq=False)
class _Doom:
    budget: int
    cut: trio.CancelScope


@attrs.define(eq=False)
class FaultyProxy:
    target_port: int
    plan: FaultPlan
    target_host: str = "127.0.0.1"
    connections: int = 0
    cuts: list[Cut] = attrs.field(factory=list)
    _rng: random.Random = attrs.field(init=False)
    _faults_until: float = attrs.field(init=False, default=0.0)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.plan.seed)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on a free port of 127.0.0.1; reports that port when ready."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port: int = listeners[0].socket.getsockname()[1]
        self._faults_until = trio.current_time() + self.plan.fault_window
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(port)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        # Each stream is closed by its own ``async with``: aclose() closes the socket before
        # its checkpoint, so a cancelled close of one still leaves the other to be closed.
        # (Two aclose_forcefully calls in one finally would not: under an outer cancel the
        # first raises Cancelled and the second never runs, leaking upstream.)
        async with downstream:
            index = self.connections
            self.connections += 1
            try:
                upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
            except OSError:
                return
            async with upstream:
                await self._forward(index, downstream, upstream)

    async def _forward(
        self, index: int, downstream: trio.SocketStream, upstream: trio.SocketStream
    ) -> None:
        plan, rng = self.plan, self._rng
        doomed = (
            len(self.cuts) < plan.max_cuts
            and trio.current_time() < self._faults_until
            and rng.random() < plan.cut_probability
        )
        cut = None
        if doomed:
            budget, lifetime = rng.randrange(plan.max_bytes), rng.uniform(0, plan.max_lifetime)
            cut = Cut(index, budget, lifetime, rng.random() < 0.5)
            self.cuts.append(cut)
        try:
            with trio.CancelScope() as scope:
                if cut is not None:
                    scope.deadline = trio.current_time() + cut.after_seconds
                doom = _Doom(cut.after_bytes if cut else -1, scope)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, downstream, upstream, doom)
                    nursery.start_soon(self._pump, upstream, downstream, doom)
        finally:
            if cut is not None and cut.rst:  # both set before either closes: RST both ways
                for stream in (downstream, upstream):
                    _linger_zero(stream)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, doom: _Doom) -> None:
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    await sink.send_eof()  # a clean half-close is passed on
                    return
                if doom.budget >= 0:
                    if len(data) >= doom.budget:
                        await sink.send_all(data[: doom.budget])  # possibly half a frame
                        break
                    doom.budget -= len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        # The budget is spent or one side broke: the whole connection goes.
        doom.cut.cancel()


def _linger_zero(stream: trio.SocketStream) -> None:
    try:
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
