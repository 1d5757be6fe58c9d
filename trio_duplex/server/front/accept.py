"""``Door``: the accepting front of a server, from ``accept(2)`` to a WebSocket.

One accept loop (``Door.accept``) serves every listener, by its ``Listening`` kind: the
main one and ``--relay-port``'s hand each connection, counted against
``max_connections`` (and, but for the relay port's, ``max_connections_per_ip``), to a
task of its own that runs the TLS handshake and the HTTP one (handshake.py) and then
gives the WebSocket to the session shell (``serve``); ``--metrics-port``'s answers each
connection once (http.py) and closes it. A connection over a limit is answered 503 by a
short task, at most ``max_refusing`` at once (more are closed unanswered).

trio.serve_listeners logged an ERROR with a traceback every 100 ms while the process
was out of file descriptors: here it is one warning a minute.
"""

from __future__ import annotations

import enum
import errno
import functools
import logging
import math
import os
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ...core.opening import Grant
from ...dialects import Dialect
from ...dialects.twilio import TWILIO
from ..config import ServerConfig
from ..sessions.websocket import ConnectionClosed, WebSocket
from .auth import Gate
from .calldoor import CallAccepted, CallDoor
from .handshake import Accepted, accept_websocket, refuse_unavailable
from .http import Endpoints, serve_internal
from .listen import open_listeners
from .router import RelayCheck, Router
from .tls import tls_handshake

if TYPE_CHECKING:
    from .twiliodoor import TwilioDoor

log = logging.getLogger("trio_duplex")

_AT_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""What accept(2) returns when the process or the system is out of room: retry later."""
_AT_CAPACITY_RETRY_S = 0.1
_AT_CAPACITY_QUIET_S = 60.0

_REFUSAL_READ_S = 1.0
"""At most this long (less if the handshake timeout is shorter) for the request of a
connection over a limit; then it is closed unanswered."""
_REFUSAL_QUIET_S = 60.0

Serve = Callable[[WebSocket, dict[str, list[str]], Grant, Dialect, str | None], Awaitable[None]]
"""What a connection past its handshake becomes (the session shell's ``Opener.serve``):
given its WebSocket, query, grant, dialect and (a dialect that speaks first) bearer."""


class Listening(enum.Enum):
    MAIN = "main"
    RELAY = "relay"
    """``--relay-port``: relayed resumes only, from other nodes (not counted per IP)."""
    INTERNAL = "internal"
    """``--metrics-port``: health and metrics, each connection answered once."""


@attrs.define(eq=False)
class Door:
    config: ServerConfig
    gate: Gate
    endpoints: Endpoints
    serve: Serve
    changed: Callable[[], None]
    """Called as each counted connection ends (``Sessions.changed``)."""
    max_refusing: int = 64
    relay: tuple[str, RelayCheck] | None = None
    """Cluster mode (set while joined): the relay path, and the check of its signature."""
    dialects: dict[str, Dialect] = attrs.field(factory=dict)
    """WebSocket paths other than ``--path`` (native), each with its dialect."""
    calls: CallDoor | None = None
    """``--calls``: the WebRTC calls' endpoints (calldoor.py), on the main listener."""
    twilio: TwilioDoor | None = None
    """Phone calls (``--twilio-auth-token``): Twilio's webhooks and streams
    (twiliodoor.py), on the main listener."""
    counted: int = attrs.field(default=0, init=False)
    """TCP connections counted against ``max_connections`` now."""
    refused: int = attrs.field(default=0, init=False)
    """Connections turned away over a limit so far."""
    _per_ip: dict[str, int] = attrs.field(factory=dict, init=False)
    """Open connections by peer address; an address with none has no entry."""
    _refusing: Aside = attrs.field(init=False)
    _internal: Aside = attrs.field(init=False)
    _refusal_quiet_until: float = attrs.field(default=-math.inf, init=False)

    def __attrs_post_init__(self) -> None:
        self._refusing = Aside(self.max_refusing, "refusing a connection")
        self._internal = Aside(self.max_refusing, "answering on the metrics port")

    async def accept(
        self, listener: trio.abc.Listener[Any], nursery: trio.Nursery, kind: Listening
    ) -> None:
        """Accept connections for ever; each one's task runs in ``nursery``. Each
        counted connection counts from here until its task ends (the count is taken
        here, not in the task, so a burst of accepts cannot overshoot it)."""
        quiet_until = -math.inf
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _AT_CAPACITY:
                        raise
                    now = trio.current_time()
                    if kind is not Listening.INTERNAL and now >= quiet_until:
                        quiet_until = now + _AT_CAPACITY_QUIET_S
                        log.warning(
                            "accept: %s (%s); retrying every %ss (said once a minute)",
                            errno.errorcode[exc.errno],
                            os.strerror(exc.errno),
                            _AT_CAPACITY_RETRY_S,
                        )
                    await trio.sleep(_AT_CAPACITY_RETRY_S)
                else:
                    await self._admit(stream, nursery, kind)

    async def _admit(self, stream: trio.abc.Stream, nursery: trio.Nursery, kind: Listening) -> None:
        """Start ``stream``'s task, or refuse it over a limit."""
        if kind is Listening.INTERNAL:
            answer = functools.partial(serve_internal, endpoints=self.endpoints)
            seconds = self.config.handshake_timeout_s
            await self._internal.answer(stream, nursery, seconds, answer)
            return
        config = self.config
        relay_only = kind is Listening.RELAY
        ip = None if relay_only else _peer_ip(stream)
        from_ip = 0 if ip is None else self._per_ip.get(ip, 0)
        if self.counted < config.max_connections and from_ip < config.max_connections_per_ip:
            self.counted += 1
            if ip is not None:
                self._per_ip[ip] = from_ip + 1
            nursery.start_soon(self._handle_stream, stream, ip, relay_only)
        else:
            await self._refuse(stream, ip, from_ip, nursery)

    async def _handle_stream(
        self, stream: trio.abc.Stream, ip: str | None = None, relay_only: bool = False
    ) -> None:
        """One counted connection's task; it gives its place back when it ends."""
        try:
            accepted = None
            with trio.move_on_after(self.config.handshake_timeout_s) as handshake:
                if isinstance(stream, trio.SSLStream) and not await tls_handshake(stream, ip):
                    return
                accepted = await self._handshake(stream, ip, relay_only)
            if handshake.cancelled_caught:
                self.endpoints.refused("timeout")
            if isinstance(accepted, CallAccepted):
                # The HTTP exchange is over (201 sent); the task goes on as the call's.
                assert self.calls is not None
                await _close(stream)
                await self.calls.serve(accepted)
            elif accepted is not None and accepted.dialect is TWILIO:
                assert self.twilio is not None
                await self.twilio.stream(accepted.ws)
            elif accepted is not None:
                await self.serve(
                    accepted.ws, accepted.query, accepted.grant, accepted.dialect, accepted.bearer
                )
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except* Exception as group:
            log.error("connection failed: %r", group.exceptions[0], exc_info=group)
        finally:
            try:
                await _close(stream)
            finally:
                self.counted -= 1
                if ip is not None:
                    left = self._per_ip[ip] - 1
                    if left:
                        self._per_ip[ip] = left
                    else:
                        del self._per_ip[ip]
                self.changed()

    async def _handshake(
        self, stream: trio.abc.Stream, ip: str | None, relay_only: bool
    ) -> Accepted | CallAccepted | None:
        """The HTTP handshake (handshake.py). ``relay_only``: from the ``--relay-port``
        listener, which takes relayed resumes only."""
        config, gate = self.config, self.gate
        # With --relay-port, the relay path is served there only (404 elsewhere).
        router = Router(
            None if relay_only else config.path,
            self.endpoints,
            config.allow_origin,
            authorize=None if gate.open else gate.authorize,
            posts=gate,
            relay=self.relay if relay_only or config.relay_port is None else None,
            dialects={} if relay_only else self.dialects,
            twilio=None
            if relay_only or self.twilio is None
            else (self.twilio.path, self.twilio.signed),
        )
        # Until it carries a session, a connection's messages are small: the first one
        # is a configuration or a resume, not audio.
        return await accept_websocket(
            stream,
            router,
            config.first_message_bytes,
            config.write_timeout_s,
            ip,
            max_post_bytes=config.first_message_bytes,
            calls=None if relay_only else self.calls,
            twilio=None if relay_only else self.twilio,
        )

    async def _refuse(
        self, stream: trio.abc.Stream, ip: str | None, from_ip: int, nursery: trio.Nursery
    ) -> None:
        """Turn away a connection over a limit without counting it: a task of its own
        answers 503 while fewer than ``max_refusing`` are being answered; beyond that
        it is closed at once, so a flood costs little more than its accepts."""
        self.refused += 1
        now = trio.current_time()
        if now >= self._refusal_quiet_until:
            self._refusal_quiet_until = now + _REFUSAL_QUIET_S
            config = self.config
            if self.counted >= config.max_connections:
                why = f"{self.counted} connections open (max_connections {config.max_connections})"
            else:
                why = (
                    f"{from_ip} connections open from {ip} "
                    f"(max_connections_per_ip {config.max_connections_per_ip})"
                )
            log.warning(
                "refusing new connections with 503: %s; %d refused so far (said once a minute)",
                why,
                self.refused,
            )
        seconds = min(_REFUSAL_READ_S, self.config.handshake_timeout_s)
        await self._refusing.answer(stream, nursery, seconds, refuse_unavailable)


@attrs.define(eq=False)
class Aside:
    """Short tasks that answer a connection and close it, at most ``limit`` at once;
    past that a connection is closed unanswered (a flood costs little more than its
    accepts). Each answer is bounded in time, and its failure is logged, not raised."""

    limit: int
    what: str
    running: int = 0

    async def answer(
        self,
        stream: trio.abc.Stream,
        nursery: trio.Nursery,
        seconds: float,
        answer: Callable[[trio.abc.Stream], Awaitable[None]],
    ) -> None:
        if self.running >= self.limit:
            await trio.aclose_forcefully(stream)
            return
        self.running += 1
        nursery.start_soon(self._answer, stream, seconds, answer)

    async def _answer(
        self,
        stream: trio.abc.Stream,
        seconds: float,
        answer: Callable[[trio.abc.Stream], Awaitable[None]],
    ) -> None:
        try:
            with trio.move_on_after(seconds):
                await answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:
            log.error("%s failed: %r", self.what, exc, exc_info=exc)
        finally:
            try:
                await trio.aclose_forcefully(stream)
            finally:
                self.running -= 1


async def _close(stream: trio.abc.Stream) -> None:
    """Close ``stream`` at once, as ``trio.aclose_forcefully`` does. A plain socket's is
    closed with no cancelled scope around a checkpoint: its ``aclose`` is the socket's
    ``close`` and then a checkpoint, and the task that calls this is ending."""
    if type(stream) is trio.SocketStream:
        stream.socket.close()
    else:
        await trio.aclose_forcefully(stream)


def _peer_ip(stream: trio.abc.Stream) -> str | None:
    """The peer's IP address, or None: not a socket (in-memory streams), not IP (a
    Unix socket's peer name is a string), or the peer is gone already."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        try:
            peer = stream.socket.getpeername()
        except OSError:
            return None
        if isinstance(peer, tuple):
            address: str = peer[0]
            return address
    return None


@attrs.frozen
class Listeners:
    """What ``open_listeners`` opened: each kind's listeners, and the ports to tell."""

    main: Sequence[trio.abc.Listener[Any]]
    internal: Sequence[trio.abc.Listener[Any]]
    relay: Sequence[trio.abc.Listener[Any]]
    port: int
    """The main listener's port."""
    advertised: int
    """The port other nodes reach this one on: the relay port's, if any, else ``port``."""


async def open_all(config: ServerConfig, ssl_context: ssl.SSLContext | None) -> Listeners:
    """Listen on ``config.host:config.port`` (TLS with ``ssl_context``, handshaken in
    each connection's task), on ``--metrics-port``, and in a cluster with
    ``--relay-port`` on that port for relayed resumes."""
    sockets = await open_listeners(config.port, config.host, reuse_port=config.reuse_port)
    port: int = sockets[0].socket.getsockname()[1]
    internal: list[trio.SocketListener] = []
    if config.metrics_port:
        internal = await trio.open_tcp_listeners(config.metrics_port, host=config.host)
    relaying: list[trio.SocketListener] = []
    advertised = port
    if config.cluster is not None and config.relay_port is not None:
        relaying = await trio.open_tcp_listeners(config.relay_port, host=config.host)
        advertised = relaying[0].socket.getsockname()[1]
    return Listeners(
        _tls(sockets, ssl_context), internal, _tls(relaying, ssl_context), port, advertised
    )


def _tls(
    listeners: Sequence[trio.SocketListener], ssl_context: ssl.SSLContext | None
) -> Sequence[trio.abc.Listener[Any]]:
    if ssl_context is None:
        return listeners
    return [trio.SSLListener(lsn, ssl_context, https_compatible=True) for lsn in listeners]


__all__ = ["Aside", "Door", "Listeners", "Listening", "RelayCheck", "Serve", "open_all"]
