"""``DuplexServer``: composes the wings and owns their lifetimes.

The front door (front/accept.py: the accept loop, connection limits, the handshakes)
hands each WebSocket to the session shell's opener (sessions/opening.py: the first
message, opening and resuming, the reading), which runs sessions in ``Sessions``
(sessions/owner.py). Cluster mode (``--cluster``) is composed here only, at the shell's
named points (``Placement``: sessions/placement.py); without it nothing of
``trio_duplex.cluster`` is loaded.

Task tree, each lifetime an ``async with`` of ``run``::

    DuplexServer.run
    ├── with --cluster: the node (ClusterPlacement; its heartbeat task)
    ├── the watchdog thread, beside the loop (watchdog.py)
    ├── Sessions.running: a trio system task
    │   └── the runners' nursery
    │       ├── Timers.run (every session's deadlines, every connection's next ping)
    │       └── SessionRunner.run (one per session: runs its engine)
    └── connections nursery
        ├── Sessions.watch (raises if the sessions task breaks)
        ├── Door.accept, one per listener (each listener's lifetime)
        ├── one task per TCP connection: the handshake, then ``Opener.serve``, whose
        │   ``Connection.open`` body is the reader and whose nursery holds the pump and
        │   a ping waiting for its pong (connection.py)
        └── one task per connection over a limit, at most ``max_refusing`` at once:
            its request read within a short bound, then 503

The runners live outside ``run``'s own tasks so that an engine that ignores cancellation
cannot keep ``run`` from returning: its session is ended without it after
``engine_stop_timeout_s``, and ``abandoned_engines`` counts the tasks left behind.

Nothing that one connection does can raise out of its own task: every error ends that
connection (1011) and is logged, and the session it held follows docs/protocol.md.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..core.events import Reason
from ..dialects import Dialect, by_name
from ..engines.api import EngineFactory
from .config import ServerConfig
from .front import metrics
from .front.accept import Door, Listening, open_all
from .front.auth import Gate, KeyRing, Verifier
from .front.demo import DemoPages
from .front.http import Endpoints
from .front.tls import server_ssl_context
from .sessions.connection import Connection
from .sessions.opening import Opener
from .sessions.owner import Observer, Sessions
from .sessions.placement import Placement, Releasing, SingleProcess
from .sessions.watchdog import watching_the_loop

if TYPE_CHECKING:
    from ..media.link import MediaLink
    from .calls.registry import Calls, Media
    from .front.twiliodoor import TwilioDoor

log = logging.getLogger("trio_duplex")


def dialects_of(config: ServerConfig) -> dict[str, Dialect]:
    """The WebSocket paths beside ``--path`` (native), each with its dialect:
    ``--realtime-path`` (unless empty) speaks OpenAI Realtime."""
    return {config.realtime_path: by_name("openai")} if config.realtime_path else {}


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
    endpoints: Endpoints = attrs.field(init=False)
    """Health, readiness and metrics (http.py), on the main listener or the metrics one."""
    door: Door = attrs.field(init=False)
    """The accepting front: listeners, connection limits, handshakes (front/accept.py)."""
    opener: Opener = attrs.field(init=False)
    """What a connection past its handshake becomes (sessions/opening.py)."""
    placement: Placement = attrs.field(factory=SingleProcess, init=False)
    """Where sessions live: this process, or (``--cluster``, while ``run`` runs) the
    cluster (``ClusterPlacement``)."""
    media: MediaLink | None = attrs.field(default=None, init=False)
    """``--calls``: the media worker's link (media/link.py), run by ``run``."""
    calls: Calls | None = attrs.field(default=None, init=False)
    twilio: TwilioDoor | None = attrs.field(default=None, init=False)
    """Phone calls' door (``--twilio-auth-token``), for its metrics."""
    """The calls served now (``serve_calls``)."""
    _shutdown: trio.Event = attrs.field(factory=trio.Event, init=False)
    _relay_ssl: ssl.SSLContext | None = attrs.field(default=None, init=False, repr=False)
    """What the relay's client trusts when it dials a ``wss://`` node (``--cluster-ca``)."""

    def __attrs_post_init__(self) -> None:
        config = self.config
        self.sessions = Sessions(config, self.close_timeout_s)
        registry = self.sessions.registry

        def holder_of(token: str) -> str | None:
            session = registry.holder_of(token)
            return None if session is None else session.id

        self.gate = Gate.of(config, holder_of, self.keys, self.verifier)  # ValueError
        # In a cluster, a credential unknown here may be a session's token on another node.
        self.gate.elsewhere = config.cluster is not None
        if config.cluster is not None:
            from ..cluster.placement import checked_tls

            self._relay_ssl = checked_tls(config)  # TLSError, ValueError
        cert, key = config.tls_cert, config.tls_key
        if self.ssl_context is None and cert is not None and key is not None:
            self.ssl_context = server_ssl_context(cert, key)
        self.endpoints = Endpoints(
            self._readiness,
            lambda: (metrics.exposition(self), metrics.CONTENT_TYPE),
            self.sessions.totals.refusals,
            on_main=not config.metrics_port,
            demo=(
                DemoPages.load(
                    config.path,
                    tls=self.ssl_context is not None,
                    calls_path="/v1/realtime/calls" if config.calls else "",
                )
                if config.demo
                else None
            ),
        )
        self.opener = Opener(
            config,
            self.sessions,
            self.engine_factory,
            self.close_timeout_s,
            self.gate.resume_failed,
        )
        self.door = Door(
            config,
            self.gate,
            self.endpoints,
            self.opener.serve,
            self.sessions.changed,
            self.max_refusing,
            dialects=dialects_of(config),
        )
        # There the upgrade's ?resume= resumes, its bearer the session's resume token.
        self.gate.resuming_paths = frozenset(
            path for path, dialect in self.door.dialects.items() if dialect.speaks_first
        )
        if config.calls:
            self._open_calls()
        if config.twilio:
            self._open_twilio()

    def _open_twilio(self) -> None:
        """Phone calls: Twilio's webhooks and streams on the main listener
        (twiliodoor.py)."""
        from .front.twiliodoor import TwilioDoor

        if self.config.twilio_auth_token is None:
            log.warning(
                "--twilio-insecure-no-signature: phone calls are taken unsigned "
                "(development only: anyone who can reach this server can place one)"
            )
        self.twilio = self.door.twilio = TwilioDoor(
            self.config,
            self.sessions,
            self.opener.serve,
            self.close_timeout_s,
            self.endpoints.refused,
            lambda session_id: self.placement.findable(session_id),
            clustered=self.config.cluster is not None,
        )

    def _open_calls(self) -> None:
        """``--calls``: the calls' door on the main listener, and the media link the
        calls are set up on (its worker started by ``run``). ValueError: what the calls
        need is not installed."""
        import importlib.util

        from ..audio import opus_available
        from ..media.link import MediaLink
        from .calls.media_config import media_config

        if importlib.util.find_spec("aiortc") is None:
            raise ValueError("--calls needs aiortc: pip install 'trio-duplex[webrtc]'")
        if not opus_available():
            raise ValueError("--calls needs libopus (apt-get install libopus0), the webrtc extra")
        self.media = MediaLink(media_config(self.config, self.close_timeout_s))
        self.serve_calls(self.media)

    def serve_calls(self, media: Media) -> None:
        """Serve the calls' endpoints (calldoor.py) with calls set up on ``media``
        (``--calls`` passes its ``MediaLink``; the tests a link in memory)."""
        from .calls.registry import Calls
        from .front.calldoor import CallDoor
        from .front.calls import CALLS_PATH

        config = self.config
        calls = Calls(config.call_max_setup)
        self.sessions.observers.append(calls)
        self.calls = calls
        self.door.calls = CallDoor(
            config,
            self.gate,
            self.sessions,
            media,
            calls,
            self.opener.serve,
            self.close_timeout_s,
            self.endpoints.refused,
        )
        self.gate.resuming_paths |= {CALLS_PATH}

    def _readiness(self) -> tuple[bool, dict[str, object]]:
        held, most = self.sessions.slots_held, self.config.max_sessions
        status = "draining" if self.shutting_down else "full" if held >= most else "ready"
        placement = self.placement
        if status == "ready" and placement.refusing_opens:
            status = "cluster_store_unreachable"  # every open is refused meanwhile
        state: dict[str, object] = {"status": status, "slots_held": held, "slots_max": most}
        if placement.store_up is not None:
            state["cluster_store_up"] = placement.store_up
        return status == "ready", state

    @property
    def cluster_store_up(self) -> bool | None:
        """Did the cluster store answer its last call? None: not in a cluster."""
        return self.placement.store_up

    @property
    def scheme(self) -> str:
        """``wss`` when ``run_tcp`` serves TLS, else ``ws``."""
        return "ws" if self.ssl_context is None else "wss"

    @property
    def connections(self) -> set[Connection]:
        """The connections past their handshake (see ``open_connections`` for all)."""
        return self.opener.connections

    # -- running -----------------------------------------------------------------------

    async def run_tcp(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on ``config.host:config.port`` (and, in a cluster with ``relay_port``,
        on that port for relayed resumes); reports the bound port when ready."""
        listening = await open_all(self.config, self.ssl_context)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(
                    self.run,
                    listening.main,
                    internal=listening.internal,
                    relaying=listening.relay,
                    advertised_port=listening.advertised,
                )
            )
            task_status.started(listening.port)

    async def run(
        self,
        listeners: Sequence[trio.abc.Listener[Any]],
        *,
        internal: Sequence[trio.abc.Listener[Any]] = (),
        relaying: Sequence[trio.abc.Listener[Any]] = (),
        advertised_port: int | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``begin_shutdown`` has drained every session.

        Returns once every session has ended (its engine returned, or was abandoned
        ``engine_stop_timeout_s`` after its cancellation) and every connection is closed.
        Cancelled, it still ends every session (``server_shutdown``) and waits for each
        engine the same way before it lets the cancellation through. An abandoned
        engine's task is left running (``abandoned_engines``): trio.run cannot return
        until it does, so a process that must exit should exit (``os._exit``) rather
        than return. In a cluster (``config.cluster``), this node is advertised on
        ``advertised_port`` (``run_tcp`` passes it)."""
        if self.config.cluster is not None and advertised_port is None:
            raise ValueError("cluster mode (config.cluster) needs run_tcp, which joins it")
        sessions, door = self.sessions, self.door
        async with self._placed(advertised_port):
            with watching_the_loop(self.config.loop_lag_warning_s):
                async with sessions.running(), trio.open_nursery() as conns:
                    conns.start_soon(sessions.watch)
                    if self.media is not None:
                        from .calls.media_config import worker_log_level

                        level = worker_log_level()  # (the CLI sets up logging after init)
                        self.media.config = attrs.evolve(self.media.config, log_level=level)
                        await conns.start(self.media.run)
                        if self.media.broken:
                            log.warning(
                                "calls: %s; calls are refused (503) until it runs",
                                self.media.broken,
                            )
                    for kind, group in (
                        (Listening.MAIN, listeners),
                        (Listening.INTERNAL, internal),
                        (Listening.RELAY, relaying),
                    ):
                        for listener in group:
                            conns.start_soon(door.accept, listener, conns, kind)
                    _warm(self.engine_factory)
                    task_status.started()
                    await self._shutdown.wait()
                    if sessions.handing_over is not None:  # (begin_shutdown asked)
                        conns.start_soon(self.placement.hand_over, sessions)
                    await sessions.drain()
                    with trio.move_on_after(self.close_timeout_s):
                        while sessions.slots_held or self.connections:
                            await sessions.wait_changed()
                    conns.cancel_scope.cancel()

    @asynccontextmanager
    async def _placed(self, port: int | None) -> AsyncIterator[None]:
        """With ``--cluster``: this server is a node of the cluster for the block
        (``cluster.node.ClusterUnavailable``: its store did not answer at start)."""
        if self.config.cluster is None or port is None:
            yield
            return
        from ..cluster.placement import RELAY_PATH, joined

        async with joined(
            self.config, self.sessions, self.opener.new_engine, self._relay_ssl, self.scheme, port
        ) as placement:
            releasing = Releasing(placement)
            self.placement = self.opener.placement = placement
            self.door.relay = (RELAY_PATH, placement.relay_grant)
            # Pooled peer connections (cluster/pool/) are taken aside at the door.
            self.door.serve = placement.serving(self.opener.serve)
            self.sessions.observers.append(releasing)
            try:
                yield
            finally:
                self.sessions.observers.remove(releasing)
                self.placement = self.opener.placement = SingleProcess()
                self.door.relay = None
                self.door.serve = self.opener.serve

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
            self.sessions.handing_over = self.placement.migrates()
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
        return self.door.counted

    @property
    def connections_refused(self) -> int:
        """Connections turned away over a limit since the server started."""
        return self.door.refused

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


__all__ = ["DuplexServer", "Observer"]


def _warm(factory: EngineFactory) -> None:
    """An engine factory's optional ``warm()``, called once when the server starts
    serving, inside its ``trio.run``: an engine that loads models (``speech``: its pool of
    recognisers, its voice's processes) starts them then, not at its first session, so a
    server's first turn does not wait for them. It must not block (it may spawn system
    tasks); what it raises stops the server, as a broken factory should."""
    warm = getattr(factory, "warm", None)
    if callable(warm):
        warm()
