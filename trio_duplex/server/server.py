"""The trio server shell: listeners, the WebSocket handshake, opening and resuming.

Task tree::

    DuplexServer.run (and, beside the loop, the watchdog thread: watchdog.py)
    └── connections nursery
        ├── Sessions.watch (raises if the sessions task breaks)
        ├── DuplexServer._accept, one per listener: counts connections against
        │   max_connections and max_connections_per_ip
        ├── one task per TCP connection: the handshake, then ``Connection.open``,
        │   whose body is the reader and whose nursery holds the pump and a ping
        │   waiting for its pong (connection.py)
        └── one task per connection over a limit, at most ``max_refusing`` at once:
            its request read within a short bound, then 503

    a trio system task, started by ``run`` (``Sessions.open``; sessions/owner.py)
    └── the runners' nursery
        ├── Timers.run (every session's deadlines, every connection's next ping)
        └── SessionRunner.run (one per session: runs its engine)

The runners live outside ``run`` so that an engine that ignores cancellation cannot keep
``run`` from returning: its session is ended without it after ``engine_stop_timeout_s``,
and ``abandoned_engines`` counts the tasks left behind.

Nothing that one connection does can raise out of its own task: every error ends that
connection (1011) and is logged, and the session it held follows docs/protocol.md.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio
from websockets.http11 import Request

from ..cluster.relay import (
    PROOF_HEADER,
    RELAY_PATH,
    RelayKeys,
    ReplayCache,
    client_ssl_context,
    relay,
    relayable,
    sign,
    verify_request,
)
from ..core.config import ServerConfig
from ..core.events import ErrorCode, Event, EventType, Reason
from ..core.frames import CloseCode
from ..core.replay import Replay
from ..core.session import Session, State
from ..core.wire import ConfigBudget, ProtocolError, is_seq
from ..dialects.jsonwire import encode
from ..engines.api import Engine, EngineFactory, prepares
from .front import metrics
from .front.auth import OPEN, Gate, Grant, KeyRing, Verifier
from .front.demo import DemoPages
from .front.handshake import accept_websocket, refuse_unavailable
from .front.http import Endpoints, serve_internal
from .front.listen import open_listeners
from .front.tls import server_ssl_context, tls_handshake
from .sessions.connection import Connection, decode_large
from .sessions.owner import Observer, Sessions
from .sessions.runner import (
    CheckFailed,
    SessionRunner,
    check_input,
    engine_broke,
    only_trio_cancellation,
    settle_audio,
)
from .sessions.watchdog import watching_the_loop
from .sessions.websocket import ConnectionClosed, WebSocket

if TYPE_CHECKING:  # only imported with --cluster: it loads the Redis client
    from ..cluster.node import ClusterNode

log = logging.getLogger("trio_duplex")

_AT_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""What accept(2) returns when the process or the system is out of room: retry later."""
_AT_CAPACITY_RETRY_S = 0.1
_AT_CAPACITY_QUIET_S = 60.0

_REFUSAL_READ_S = 1.0
"""At most this long (less if the handshake timeout is shorter) for the request of a
connection over a limit; then it is closed unanswered."""
_REFUSAL_QUIET_S = 60.0

_NOT_FAULTS = frozenset(
    {
        ErrorCode.RESOURCE_EXHAUSTED,
        ErrorCode.SERVER_SHUTTING_DOWN,
        ErrorCode.SESSION_RESUME_CONFLICT,
    }
)
"""Refusals that are the server's state, not the client's fault: not reported."""

_CONFIG_TIMEOUT = ProtocolError(
    ErrorCode.CONFIG_TIMEOUT, "no first message in time", close_code=CloseCode.CONFIG_TIMEOUT
)


@attrs.define(eq=False)
class DuplexServer:
    config: ServerConfig
    engine_factory: EngineFactory
    close_timeout_s: float = 2.0
    """How long a closing connection may take to send its last frames and close."""
    max_refusing: int = 64
    """Connections over a limit answered (503) at once; more are closed unanswered."""
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, kw_only=True)
    """TLS for ``run_tcp`` (wss://); None: built from ``config.tls_cert`` and
    ``tls_key`` when they are set (TLSError if they cannot be used), else plain ws://."""
    keys: KeyRing | None = attrs.field(default=None, kw_only=True)
    """API keys for ``gate``, if not read from ``--api-key-file``."""
    verifier: Verifier | None = attrs.field(default=None, kw_only=True)
    """A verifier for ``gate``, if not loaded from ``--auth``."""
    gate: Gate = attrs.field(init=False)
    """Who may open sessions (auth.py): keys, a verifier, client tokens, resume tokens."""
    sessions: Sessions = attrs.field(init=False)
    connections: set[Connection] = attrs.field(factory=set, init=False)
    """The connections past their handshake (see ``open_connections`` for all)."""
    _shutdown: trio.Event = attrs.field(factory=trio.Event, init=False)
    _counted: int = attrs.field(default=0, init=False)
    _per_ip: dict[str, int] = attrs.field(factory=dict, init=False)
    """Open connections by peer address; an address with none has no entry."""
    _refusing: Aside = attrs.field(init=False)
    """Connections over a limit being answered 503."""
    _refused: int = attrs.field(default=0, init=False)
    _refusal_quiet_until: float = attrs.field(default=-math.inf, init=False)
    endpoints: Endpoints = attrs.field(init=False)
    """Health, readiness and metrics (http.py), on the main listener or the metrics one."""
    _internal: Aside = attrs.field(init=False)
    """Connections of the ``--metrics-port`` listener being answered."""
    node: ClusterNode | None = attrs.field(default=None, init=False)
    """This server as a cluster node (``--cluster``), while ``run_tcp`` runs."""
    _relay_keys: RelayKeys | None = attrs.field(default=None, init=False, repr=False)
    """Derived from ``--cluster-secret`` (relay.py), while ``node`` is set."""
    _relay_nonces: ReplayCache = attrs.field(factory=ReplayCache, init=False, repr=False)
    _relay_ssl: ssl.SSLContext | None = attrs.field(default=None, init=False, repr=False)
    """What the relay's client trusts when it dials a ``wss://`` node (``--cluster-ca``)."""

    def __attrs_post_init__(self) -> None:
        self._refusing = Aside(self.max_refusing, "refusing a connection")
        self._internal = Aside(self.max_refusing, "answering on the metrics port")
        self.sessions = Sessions(self.config, self.close_timeout_s)
        registry = self.sessions.registry

        def holder_of(token: str) -> str | None:
            session = registry.holder_of(token)
            return None if session is None else session.id

        self.gate = Gate.of(self.config, holder_of, self.keys, self.verifier)  # ValueError
        # In a cluster, a credential unknown here may be a session's token on another node.
        self.gate.elsewhere = self.config.cluster is not None
        if self.config.cluster is not None:
            self._relay_ssl = client_ssl_context(self.config.cluster_ca)  # TLSError
            if self.config.cluster_redis_ca is not None:
                from ..cluster.connect import tls_context

                tls_context(self.config.cluster_redis_ca)  # ValueError: cannot be used
        cert, key = self.config.tls_cert, self.config.tls_key
        if self.ssl_context is None and cert is not None and key is not None:
            self.ssl_context = server_ssl_context(cert, key)
        self.endpoints = Endpoints(
            self._readiness,
            lambda: (metrics.exposition(self), metrics.CONTENT_TYPE),
            self.sessions.totals.refusals,
            on_main=not self.config.metrics_port,
            demo=(
                DemoPages.load(self.config.path, tls=self.ssl_context is not None)
                if self.config.demo
                else None
            ),
        )

    def _readiness(self) -> tuple[bool, dict[str, object]]:
        held, most = self.sessions.slots_held, self.config.max_sessions
        status = "draining" if self.shutting_down else "full" if held >= most else "ready"
        node = self.node
        if status == "ready" and node is not None and node.cap is not None and not node.store_up:
            status = "cluster_store_unreachable"  # every open is refused meanwhile
        state: dict[str, object] = {"status": status, "slots_held": held, "slots_max": most}
        if node is not None:
            state["cluster_store_up"] = node.store_up
        return status == "ready", state

    @property
    def cluster_store_up(self) -> bool | None:
        """Did the cluster store answer its last call? None: not in a cluster."""
        return None if self.node is None else self.node.store_up

    @property
    def scheme(self) -> str:
        """``wss`` when ``run_tcp`` serves TLS, else ``ws``."""
        return "ws" if self.ssl_context is None else "wss"

    # -- running -----------------------------------------------------------------------

    async def run_tcp(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on ``config.host:config.port`` (and, in a cluster with ``relay_port``,
        on that port for relayed resumes); reports the bound port when ready."""
        listeners = await open_listeners(
            self.config.port, self.config.host, reuse_port=self.config.reuse_port
        )
        port: int = listeners[0].socket.getsockname()[1]
        serving: Sequence[trio.abc.Listener[Any]] = listeners
        if self.ssl_context is not None:
            # The TLS handshake happens in each connection's task (_handle_stream).
            serving = [
                trio.SSLListener(lsn, self.ssl_context, https_compatible=True) for lsn in listeners
            ]
        internal: list[trio.SocketListener] = []
        if self.config.metrics_port:
            internal = await trio.open_tcp_listeners(
                self.config.metrics_port, host=self.config.host
            )
        relaying: Sequence[trio.abc.Listener[Any]] = ()
        advertised = port
        if self.config.cluster is not None and self.config.relay_port is not None:
            relay_listeners = await trio.open_tcp_listeners(
                self.config.relay_port, host=self.config.host
            )
            advertised = relay_listeners[0].socket.getsockname()[1]
            relaying = relay_listeners
            if self.ssl_context is not None:
                relaying = [
                    trio.SSLListener(lsn, self.ssl_context, https_compatible=True)
                    for lsn in relay_listeners
                ]
        async with self._cluster(advertised), trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(self.run, serving, internal=internal, relaying=relaying)
            )
            task_status.started(port)

    @asynccontextmanager
    async def _cluster(self, port: int) -> AsyncIterator[None]:
        """With ``--cluster``: this server is a node of the cluster for the block
        (``cluster.ClusterUnavailable``: its store did not answer at start)."""
        if self.config.cluster is None:
            yield
            return
        from ..cluster.node import advertise_url, joined

        url = advertise_url(self.config, self.scheme, port)
        sessions = self.sessions
        async with joined(
            self.config,
            url,
            lambda: sessions.slots_held,
            # (None while draining: a handed-over session's entry must stay dropped.)
            lambda: [] if sessions.shutting_down else [r.session.id for r in sessions.runners()],
        ) as node:
            returns = _ReturnLeases(node)
            self.node = node
            self._relay_keys = RelayKeys.derive(node.secret)
            self.sessions.observers.append(returns)
            try:
                yield
            finally:
                self.sessions.observers.remove(returns)
                self.node = None
                self._relay_keys = None

    async def run(
        self,
        listeners: Sequence[trio.abc.Listener[Any]],
        *,
        internal: Sequence[trio.abc.Listener[Any]] = (),
        relaying: Sequence[trio.abc.Listener[Any]] = (),
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``begin_shutdown`` has drained every session.

        Returns once every session has ended (its engine returned, or was abandoned
        ``engine_stop_timeout_s`` after its cancellation) and every connection is closed.
        Cancelled, it still ends every session (``server_shutdown``) and waits for each
        engine the same way before it lets the cancellation through. An abandoned
        engine's task is left running (``abandoned_engines``): trio.run cannot return
        until it does, so a process that must exit should exit (``os._exit``) rather
        than return."""
        if self.config.cluster is not None and self.node is None:
            raise ValueError("cluster mode (config.cluster) needs run_tcp, which joins it")
        with watching_the_loop(self.config.loop_lag_warning_s):
            sessions = self.sessions
            try:
                await sessions.open()
                async with trio.open_nursery() as conns:
                    conns.start_soon(sessions.watch)
                    for listener in listeners:
                        conns.start_soon(self._accept, listener, conns)
                    for listener in internal:
                        conns.start_soon(self._accept_internal, listener, conns)
                    for listener in relaying:
                        conns.start_soon(self._accept, listener, conns, True)
                    task_status.started()
                    await self._shutdown.wait()
                    if self.node is not None and self.sessions.handing_over is not None:
                        from ..cluster.migration import hand_over_all

                        conns.start_soon(hand_over_all, sessions, self.node, self.config)
                    await sessions.drain()
                    with trio.move_on_after(self.close_timeout_s):
                        while sessions.slots_held or self.connections:
                            await sessions.wait_changed()
                    conns.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):  # bounded by engine_stop_timeout_s
                    await sessions.stop()

    def reload_keys(self) -> bool:
        """SIGHUP: read ``--api-key-file`` again (auth.py). The client tokens of every
        key no longer in it are revoked, and the live sessions of every NAME no longer
        in it end now (``credential_revoked``); a NAME kept with a new key (a rotation)
        keeps its sessions. False: no file, or a bad one (the old keys stay)."""
        gone = self.gate.reload_keys()
        if gone is None:
            return False
        ended = [r for r in self.sessions.runners() if r.session.principal in gone]
        for runner in ended:
            runner.end(Reason.REVOKED)
        if gone:
            log.warning(
                "API keys removed: %s; %d of their sessions ended (credential_revoked)",
                ", ".join(sorted(gone)),
                len(ended),
            )
        return True

    def begin_shutdown(self) -> None:
        """Refuse new opens and resumes, warn attached clients, and start the drain; in a
        cluster, hand the sessions that can migrate to other nodes (migration.py)."""
        if not self.sessions.shutting_down:
            if self.node is not None and self.node.store_up:
                # (With the store known down, nothing could be handed over: drain as is.)
                from ..cluster.migration import migratable

                self.sessions.handing_over = migratable
            self.sessions.begin_shutdown()
            self._shutdown.set()

    @property
    def shutting_down(self) -> bool:
        return self.sessions.shutting_down

    @property
    def slots_held(self) -> int:
        return self.sessions.slots_held

    @property
    def open_connections(self) -> int:
        """TCP connections counted against ``max_connections`` now: every accepted one,
        in its handshake or past it, until its task ends. Refused ones are not counted."""
        return self._counted

    @property
    def connections_refused(self) -> int:
        """Connections turned away over a limit since the server started."""
        return self._refused

    @property
    def abandoned_engines(self) -> int:
        """Engines that ignored their cancellation, were abandoned, and still run."""
        return len(self.sessions.abandoned)

    def add_observer(self, observer: Observer) -> None:
        """Watch this server's sessions (see ``Observer``)."""
        self.sessions.observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        self.sessions.observers.remove(observer)

    async def wait_changed(self) -> None:
        """Wait until a session or connection ends (for tests); a connection's end
        includes one that never finished its handshake."""
        await self.sessions.wait_changed()

    # -- one connection ----------------------------------------------------------------

    async def _accept(
        self, listener: trio.abc.Listener[Any], nursery: trio.Nursery, relay_only: bool = False
    ) -> None:
        """Accept connections for ever; each one's task runs in ``nursery``. ``relay_only``:
        the ``--relay-port`` listener, whose connections (from other nodes, each a relayed
        session) count towards ``max_connections`` but not per IP address.

        trio.serve_listeners logged an ERROR with a traceback every 100 ms while the
        process was out of file descriptors: here it is one warning a minute.

        Each accepted connection counts towards ``max_connections`` and, if it has an IP
        address, ``max_connections_per_ip`` from here until its task ends (the count is
        taken here, not in the task, so a burst of accepts cannot overshoot it)."""
        quiet_until = -math.inf
        config = self.config
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _AT_CAPACITY:
                        raise
                    now = trio.current_time()
                    if now >= quiet_until:
                        quiet_until = now + _AT_CAPACITY_QUIET_S
                        log.warning(
                            "accept: %s (%s); retrying every %ss (said once a minute)",
                            errno.errorcode[exc.errno],
                            os.strerror(exc.errno),
                            _AT_CAPACITY_RETRY_S,
                        )
                    await trio.sleep(_AT_CAPACITY_RETRY_S)
                else:
                    ip = None if relay_only else _peer_ip(stream)
                    from_ip = 0 if ip is None else self._per_ip.get(ip, 0)
                    if (
                        self._counted < config.max_connections
                        and from_ip < config.max_connections_per_ip
                    ):
                        self._counted += 1
                        if ip is not None:
                            self._per_ip[ip] = from_ip + 1
                        nursery.start_soon(self._handle_stream, stream, ip, relay_only)
                    else:
                        await self._refuse(stream, ip, from_ip, nursery)

    async def _accept_internal(
        self, listener: trio.abc.Listener[Any], nursery: trio.Nursery
    ) -> None:
        """The ``--metrics-port`` listener: each connection answered once, then closed;
        at most ``max_refusing`` at once (more are closed unanswered)."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _AT_CAPACITY:
                        raise
                    await trio.sleep(_AT_CAPACITY_RETRY_S)  # (the main listener logs it)
                    continue
                await self._internal.answer(
                    stream,
                    nursery,
                    self.config.handshake_timeout_s,
                    functools.partial(serve_internal, endpoints=self.endpoints),
                )

    def _relay_grant(self, request: Request) -> tuple[Grant, dict[str, str]] | None:
        """A relayed resume (relay.py), if another node of this cluster signed it for this
        one, and its nonce is new: it may resume the session it names, and nothing else;
        the 101 proves this node holds the secret too."""
        node, keys = self.node, self._relay_keys
        if node is None or keys is None:
            return None
        accepted = verify_request(keys, request, node.node_id, time.time(), self._relay_nonces)
        if accepted is None:
            return None
        grant = Grant(None, resume_of=accepted.session_id, relayed=True)
        return grant, {PROOF_HEADER: accepted.proof}

    async def _handle_stream(
        self, stream: trio.abc.Stream, ip: str | None = None, relay_only: bool = False
    ) -> None:
        """One counted connection's task; it gives its place back when it ends.
        ``relay_only``: from the ``--relay-port`` listener, which takes relayed resumes
        only."""
        try:
            accepted = None
            with trio.move_on_after(self.config.handshake_timeout_s) as handshake:
                if isinstance(stream, trio.SSLStream) and not await tls_handshake(stream, ip):
                    return
                # Until it carries a session, a connection's messages are small: the
                # first one is a configuration or a resume, not audio.
                accepted = await accept_websocket(
                    stream,
                    None if relay_only else self.config.path,
                    self.config.first_message_bytes,
                    self.config.write_timeout_s,
                    ip,
                    self.endpoints,
                    origins=self.config.allow_origin,
                    authorize=None if self.gate.open else self.gate.authorize,
                    issue_token=self.gate.issue_token,
                    # With --relay-port, the relay path is served there only (404 here).
                    relay=(
                        (RELAY_PATH, self._relay_grant)
                        if self.node is not None and (relay_only or self.config.relay_port is None)
                        else None
                    ),
                    max_post_bytes=self.config.first_message_bytes,
                )
            if handshake.cancelled_caught:
                self.endpoints.refused("timeout")
            if accepted is not None:
                await self._serve(*accepted)
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except* Exception as group:
            log.error("connection failed: %r", group.exceptions[0], exc_info=group)
        finally:
            try:
                await trio.aclose_forcefully(stream)
            finally:
                self._counted -= 1
                if ip is not None:
                    left = self._per_ip[ip] - 1
                    if left:
                        self._per_ip[ip] = left
                    else:
                        del self._per_ip[ip]
                self.sessions.changed()

    async def _refuse(
        self, stream: trio.abc.Stream, ip: str | None, from_ip: int, nursery: trio.Nursery
    ) -> None:
        """Turn away a connection over a limit without counting it: a task of its own
        answers 503 while fewer than ``max_refusing`` are being answered; beyond that
        it is closed at once, so a flood costs little more than its accepts."""
        self._refused += 1
        now = trio.current_time()
        if now >= self._refusal_quiet_until:
            self._refusal_quiet_until = now + _REFUSAL_QUIET_S
            config = self.config
            if self._counted >= config.max_connections:
                why = f"{self._counted} connections open (max_connections {config.max_connections})"
            else:
                why = (
                    f"{from_ip} connections open from {ip} "
                    f"(max_connections_per_ip {config.max_connections_per_ip})"
                )
            log.warning(
                "refusing new connections with 503: %s; %d refused so far (said once a minute)",
                why,
                self._refused,
            )
        seconds = min(_REFUSAL_READ_S, self.config.handshake_timeout_s)
        await self._refusing.answer(stream, nursery, seconds, refuse_unavailable)

    async def _serve(self, ws: WebSocket, query: dict[str, list[str]], grant: Grant = OPEN) -> None:
        conn: Connection | None = None
        try:
            async with Connection.open(
                ws,
                self.config.max_pending_output,
                close_timeout=self.close_timeout_s,
                max_output_bytes=self.config.max_output_bytes,
                watchers=self.sessions.observers,
                dialect=self.sessions.dialect,
            ) as conn:
                self.connections.add(conn)
                await self._converse(conn, query, grant)
        finally:
            if conn is not None:
                self.connections.discard(conn)
            self.sessions.changed()

    async def _converse(
        self, conn: Connection, query: dict[str, list[str]], grant: Grant = OPEN
    ) -> None:
        """The whole conversation on one connection, whatever it turns out to be for."""
        runner: SessionRunner | None = None
        try:
            if query.get("autostart") == ["1"]:
                try:
                    if grant.resume_only:
                        raise _resume_only()
                    opening = {} if grant.locked is None else dict(grant.locked)
                    engine = self._new_engine(opening)
                    runner = await self._open(conn, opening, None, engine, grant=grant)
                except ProtocolError as exc:
                    code = exc.close_code or CloseCode.GOING_AWAY
                    conn.finish([conn.dialect.frame(exc.to_event())], code)
            else:
                runner = await self._first_message(conn, grant)
            if runner is not None:
                timers, config = self.sessions.timers, self.config
                conn.ws.max_message_bytes = config.max_event_bytes
                conn.start_keepalive(timers, config.ping_interval_s, config.ping_timeout_s)
                await self._read(conn, runner)
            # Closing, or a resumer owed the terminal event of a session that ended.
            await conn.send_rest()
        finally:
            if runner is not None:
                runner.connection_lost(conn)  # before the close handshake: detach now

    async def _first_message(self, conn: Connection, grant: Grant = OPEN) -> SessionRunner | None:
        """Wait for the message that decides what this connection is for."""
        deadline = trio.current_time() + self.config.config_timeout_s
        while True:
            with trio.move_on_at(deadline) as waiting:
                text = await conn.ws.get_message()
            event: Event = {}
            dialect = conn.dialect
            try:
                if waiting.cancelled_caught:
                    raise _CONFIG_TIMEOUT
                if len(text) < dialect.large:
                    event = dialect.decode(text)
                else:
                    event = await decode_large(dialect, text)
                if not grant.allows_resume(event):
                    raise _resume_only()
                if event["type"] == EventType.RESUME:
                    return await self._resume(conn, event, grant)
                return await self._open_with(conn, event, len(text), grant)
            except ProtocolError as exc:
                if grant.elsewhere is not None:  # an unknown credential that resumed nothing
                    self.gate.resume_failed(conn.ws.peer)
                totals = self.sessions.totals
                if event.get("type") == EventType.RESUME:
                    totals.count(totals.resumes, exc.code)
                elif exc.code == ErrorCode.ENGINE_ERROR:
                    totals.engine_errors += 1
                if exc.code not in _NOT_FAULTS:
                    conn.ws.report_fault(str(exc))
                error = dialect.frame(exc.to_event(event))
                if exc.close_code is not None:
                    conn.finish([error], exc.close_code)
                    return None
                # No session was opened; the config timeout keeps running. (A client
                # that does not read is cut by the write timeout.)
                await conn.ws.send_message(error)

    async def _open_with(
        self, conn: Connection, event: Event, size: int, grant: Grant = OPEN
    ) -> SessionRunner | None:
        """Open a session for a first message other than a resume, if it is valid."""
        kind = event["type"]
        locked = grant.locked
        if kind == EventType.UPDATE:
            check_input(None, event)
            config = dict(event["session"])
            if locked is not None:  # the client token's configuration, whatever is asked
                if any(key not in locked or locked[key] != config[key] for key in config):
                    raise _config_locked()
                config = dict(locked)
            ConfigBudget.of(config, self.config.max_config_bytes)  # ProtocolError: too large
            engine = self._new_engine(config)
            return await self._open(conn, config, None, engine, grant=grant)
        config = {} if locked is None else dict(locked)
        engine = self._new_engine(config)
        try:
            check_input(engine, event)
        except CheckFailed as exc:
            raise engine_broke("check of the first message", exc.__cause__ or exc) from None
        if kind == EventType.EVENT_ACK and event.get("server_event_seq") != 0:
            raise ProtocolError(
                ErrorCode.INVALID_EVENT_ACK,
                "no server event has been sent yet",
                param="server_event_seq",
            )
        return await self._open(conn, config, event, engine, size, grant=grant)

    def _new_engine(self, config: Mapping[str, Any]) -> Engine:
        """The engine of a session about to be admitted. ProtocolError: the engine refused
        the configuration (``BadEvent``), or it broke (``engine_error``, close 1011)."""
        try:
            return self.engine_factory(config)
        except (ProtocolError, trio.Cancelled):
            raise
        except BaseException as exc:  # KeyboardInterrupt, asyncio's CancelledError, ...
            if only_trio_cancellation(exc):
                raise
            raise engine_broke("factory", exc) from None

    async def _open(
        self,
        conn: Connection,
        config: dict[str, Any],
        first: Event | None,
        engine: Engine,
        first_size: int = 0,
        *,
        grant: Grant = OPEN,
    ) -> SessionRunner:
        sessions = self.sessions
        settle_audio(engine, config)  # ProtocolError: an audio format it cannot serve
        node = self.node
        leased = False
        # A draining or full node refuses below without asking the cluster.
        if node is not None and sessions.admits(self.config.max_sessions):
            leased = await node.acquire()  # ProtocolError: the cluster is full, or unreachable
        try:
            # ProtocolError: full, or draining (this node's own, single-step decision)
            session, token = sessions.admit(
                config, grant.principal, grant.locked is not None, conn.dialect
            )
        except BaseException:
            if leased and node is not None:
                node.release()
            raise
        prepared = None
        ws = conn.ws
        first_bytes, ws.max_message_bytes = ws.max_message_bytes, self.config.max_event_bytes
        # The handshake rule: resumable only once session.created is handed to the
        # transport, by a client still there. Until then the connection is read, and a
        # close frame, FIN or reset arriving before that write has completed (during
        # the prepare, the claim or the write) leaves the session undelivered. One seen
        # after it, even before this task runs on, may have come after the client read
        # session.created: that session is delivered, and detaches as on any loss. (So
        # nothing looks at the socket after the write; and a stream's send_all yields
        # once more after its last byte, shielded: the cancel can no longer land.)
        opening = trio.CancelScope()
        conn.watch_opening(opening.cancel)
        try:
            with opening:
                if prepares(engine):  # e.g. its upstream connected: else the open is refused
                    prepared = await sessions.prepare(engine)
                if node is not None and node.store_up:
                    # Found from any node before its client hears of it (a client that drops
                    # at once may resume elsewhere). With the store down it is resumable here
                    # only.
                    await node.claim(session.id)
                ws.reply_now(ws.read_now())  # what the socket holds already
                if ws.peer_gone:
                    raise _gone_while_opening()
                await ws.send_message(sessions.registry.created_frame(session, token))
            ws.stop_watching()
            if opening.cancelled_caught:  # the end came while the write was under way
                raise _gone_while_opening()
        except BaseException:
            ws.stop_watching()
            ws.max_message_bytes = first_bytes
            sessions.undelivered(session)
            if prepared is not None:
                prepared.release()
            raise
        runner = sessions.start(
            session, engine, conn, opening_event=first is not None, prepared=prepared
        )
        if ws.unsent:  # a pong reply_now could not finish
            conn.start_pump()
        if first is not None:
            runner.handle(conn, first, first_size)
        return runner

    async def _resume(
        self, conn: Connection, event: Event, grant: Grant = OPEN
    ) -> SessionRunner | None:
        session_id = event.get("session_id")
        token = event.get("resume_token")
        last = event.get("last_received_server_event_seq", 0)
        if not isinstance(session_id, str) or not isinstance(token, str) or not is_seq(last):
            raise ProtocolError.resume_refused(
                ErrorCode.INVALID_SESSION_RESUME,
                "session.resume needs session_id, resume_token (strings) and an optional "
                "non-negative integer last_received_server_event_seq",
            )
        node = self.node
        if (
            node is not None
            and not grant.relayed  # (a relayed resume is never relayed on)
            and not self.shutting_down
            and self.sessions.runner(session_id) is None
            and relayable(session_id)
        ):
            if await self._resume_elsewhere(conn, event, session_id, node):
                return None
        runner = self.sessions.for_resume(session_id)
        session = runner.session
        now = trio.current_time()
        runner.apply(session.poll(now))  # a due expiry wins before the resume is looked at
        attempt = session.begin_resume(token, last, now)
        self.sessions.reschedule(runner)
        replay = Replay(attempt)
        totals = self.sessions.totals
        try:
            # The core decides what to write; this only writes it, within a bound: a
            # resumer that does not read would otherwise hold the session (its timers
            # frozen, other resumes refused as a conflict) for ever.
            with trio.fail_after(self.config.replay_timeout_s):
                while frames := replay.next_frames(trio.current_time()):
                    await conn.ws.send_many(frames)
            # Caught up with the journal and no await since: switch the attachment now.
            commit = session.commit_resume(attempt, trio.current_time())
        except BaseException as exc:
            runner.apply(session.abort_resume(attempt, trio.current_time()))
            self.sessions.reschedule(runner)
            self.sessions.detached(runner)  # detached again: during a drain it ends now
            totals.count(totals.resumes, "aborted")
            if isinstance(exc, trio.TooSlowError):  # the write was cut: no close frame
                log.info(
                    "session %s: resume aborted, replay not written within %ss",
                    session.id,
                    self.config.replay_timeout_s,
                    extra={"session_id": session.id, "generation": attempt.generation},
                )
                return None
            raise
        finally:
            totals.replayed_events += replay.replayed
        self.sessions.reschedule(runner)
        if commit is None:
            terminal = session.terminal
            if terminal is not None and terminal.generation is None:
                # It ended while detached: nobody else heard how. The resumer, which has
                # session.resumed already, gets the terminal event in place of live
                # events, once the slot is free (now, or when the teardown finishes).
                if session.state is State.CLOSED:
                    conn.finish([session.frame(terminal.event)], terminal.close_code)
                else:
                    runner.resumer = conn
                totals.count(totals.resumes, "ended")
                return None
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_EXPIRED,
                "the session ended during the resume",
            )
        runner.attach(conn, commit)
        totals.count(totals.resumes, "ok")
        log.info(
            "session %s resumed (generation %d)",
            session.id,
            commit.generation,
            extra={"session_id": session.id, "generation": commit.generation},
        )
        return runner

    async def _resume_elsewhere(
        self, conn: Connection, event: Event, session_id: str, node: ClusterNode
    ) -> bool:
        """Cluster mode: a resume of a session this node does not hold. True: relayed to
        its home (and over); False: not found elsewhere, the local path answers.
        ProtocolError: its home is gone (``node_lost``), or unreachable (retryable)."""
        located = await node.locate(session_id)  # ProtocolError: the store is unreachable
        totals = self.sessions.totals
        if located.kind == "migrated" and located.record is not None:
            from ..cluster.migration import adopt

            token = event.get("resume_token")  # (a string: _resume checked)
            await adopt(
                session_id,
                located.record,
                str(token),
                self.sessions,
                node,
                self.config,
                self._new_engine,
            )
            return False  # it is here now: the ordinary resume follows
        if located.kind == "busy":
            raise ProtocolError.home_unreachable("the session is being taken over by another node")
        if located.kind == "stalled":  # slow or cut off, not gone: the client tries again
            totals.count(totals.resumes, ErrorCode.SESSION_HOME_UNREACHABLE)
            raise ProtocolError.home_unreachable(
                f"the session's node ({located.node_id}) is not answering the cluster"
            )
        if located.kind == "lost":
            totals.count(totals.resumes, "node_lost")
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_EXPIRED,
                "the session's node is gone, and the session with it",
            ).with_extra(reason="node_lost")
        if located.kind != "home" or located.node_id == node.node_id or located.url is None:
            return False
        config = self.config
        conn.ws.max_message_bytes = config.max_event_bytes  # the session's own bound
        conn.start_keepalive(self.sessions.timers, config.ping_interval_s, config.ping_timeout_s)
        assert located.node_id is not None and self._relay_keys is not None
        signed = sign(self._relay_keys, node.node_id, located.node_id, session_id, time.time())
        log.info(
            "session %s: relaying its resume to its home node %s",
            session_id,
            located.node_id,
            extra={"session_id": session_id},
        )
        relayed = await relay(
            conn,
            encode(event),
            home=located.node_id,
            url=located.url,
            signed=signed,
            connect_timeout_s=config.handshake_timeout_s,
            write_timeout_s=config.write_timeout_s,
            ssl_context=self._relay_ssl,
        )
        if not relayed:
            totals.count(totals.resumes, ErrorCode.SESSION_HOME_UNREACHABLE)
            raise ProtocolError.home_unreachable(
                f"the session's node ({located.node_id}) could not be reached from this one"
            )
        totals.count(totals.resumes, "relayed")
        return True

    async def _read(self, conn: Connection, runner: SessionRunner) -> None:
        dialect = conn.dialect
        get, handle, decode, large = (
            conn.ws.get_message,
            runner.handle,
            dialect.decode,
            dialect.large,
        )
        while conn.close_code is None:
            text = await get()
            if isinstance(text, bytes):  # a binary lane (the native dialect's audio)
                runner.handle_binary(conn, text)
                continue
            try:
                # A large message is decoded in slices, letting other sessions run.
                event = decode(text) if len(text) < large else await decode_large(dialect, text)
            except ProtocolError as exc:
                conn.ws.report_fault(str(exc))
                conn.push(dialect.frame(exc.to_event()))
                continue
            handle(conn, event, len(text))
        # Closing: keep reading so pings and the peer's close are seen while the pump
        # sends the last frames.
        while True:
            await get()


class _ReturnLeases(Observer):
    """Gives a session's cluster lease and directory entry back once its slot is free."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    def released(self, session: Session) -> None:
        self.node.release()
        self.node.unclaim(session.id)


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


def _gone_while_opening() -> ConnectionClosed:
    return ConnectionClosed(CloseCode.ABNORMAL, "the client left before session.created")


def _config_locked() -> ProtocolError:
    return ProtocolError(
        ErrorCode.CONFIG_LOCKED,
        "the client token that opened this session locked its configuration",
        param="session",
        close_code=CloseCode.POLICY_VIOLATION,
    )


def _resume_only() -> ProtocolError:
    """An upgrade whose credential is a resume token did something but resume its session."""
    return ProtocolError(
        ErrorCode.UNAUTHORIZED,
        "this credential only resumes its own session",
        close_code=CloseCode.POLICY_VIOLATION,
    )


__all__ = ["DuplexServer", "Observer"]
