"""``ClusterPlacement``: cluster mode at the session shell's named points (``Placement``,
server/sessions/placement.py), and the relay's check at the front door's.

The server composes it with ``--cluster`` only (``joined``), so without it neither this
module nor the Redis client is loaded. Each point delegates: admission leases and the
session directory to the node (node.py), a resume of a session held elsewhere to the
relay (relay.py) or to the take-over of a handed-over one (migration.py), the drain's
hand-over to migration.py.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from websockets.http11 import Request

from ..core import cluster
from ..core.events import ErrorCode, Event
from ..core.opening import Grant
from ..dialects import Dialect
from ..dialects.jsonwire import encode
from ..engines.api import Engine
from ..server.config import ServerConfig
from ..server.sessions.connection import Connection
from ..server.sessions.owner import Sessions
from ..server.sessions.runner import SessionRunner
from ..server.sessions.websocket import WebSocket
from .connect import tls_context
from .migration import adopt, hand_over_all, migratable
from .node import ClusterNode, advertise_url
from .node import joined as node_joined
from .pool import Home, Pool, PoolGrant, Serve, pool_grant
from .pool import relay as pooled_relay
from .relay import (
    HEADER,
    PROOF_HEADER,
    RELAY_PATH,
    RelayKeys,
    ReplayCache,
    client_ssl_context,
    relayable,
    verify_pool,
    verify_request,
)

log = logging.getLogger("trio_duplex")


@attrs.define(eq=False)
class ClusterPlacement:
    """This server as a node of the cluster, at the points the shell asks (``Placement``)."""

    node: ClusterNode
    config: ServerConfig
    sessions: Sessions
    new_engine: Callable[[Mapping[str, Any]], Engine]
    relay_ssl: ssl.SSLContext | None = attrs.field(repr=False)
    """What the relay's client trusts when it dials a ``wss://`` node (``--cluster-ca``)."""
    _keys: RelayKeys = attrs.field(init=False, repr=False)
    """Derived from ``--cluster-secret`` (relay.py)."""
    _nonces: ReplayCache = attrs.field(factory=ReplayCache, init=False, repr=False)
    pool: Pool = attrs.field(init=False)
    """This node's peer connections to the homes it relays to (pool/)."""
    home: Home | None = attrs.field(default=None, init=False)
    """The peer connections other nodes relay over to this one: set by ``serving``."""

    def __attrs_post_init__(self) -> None:
        self._keys = RelayKeys.derive(self.node.secret)
        config = self.config
        self.pool = Pool(
            self.node.node_id,
            self._keys,
            config.handshake_timeout_s,
            config.write_timeout_s,
            self.relay_ssl,
        )

    def serving(self, serve: Serve) -> Serve:
        """The front door's ``serve`` for as long as this node is joined: a pooled peer
        connection (``relay_grant`` let it upgrade) is taken aside and served here, each
        of its channels given to ``serve`` (the session code's) as a relayed connection;
        every other connection goes to ``serve`` as before. Until this is called, the
        relay endpoint refuses pooled peer connections (403)."""
        home = self.home = Home(serve, self.config.first_message_bytes, self.config.write_timeout_s)

        async def door_serve(
            ws: WebSocket,
            query: dict[str, list[str]],
            grant: Grant,
            dialect: Dialect,
            bearer: str | None,
        ) -> None:
            if isinstance(grant, PoolGrant):
                await home.accept(ws.stream, grant.peer)
            else:
                await serve(ws, query, grant, dialect, bearer)

        return door_serve

    @property
    def store_up(self) -> bool | None:
        return self.node.store_up

    @property
    def refusing_opens(self) -> bool:
        return self.node.cap is not None and not self.node.store_up

    async def lease(self) -> bool:
        return await self.node.acquire()  # ProtocolError: the cluster is full, or unreachable

    def release(self) -> None:
        self.node.release()

    async def claim(self, session_id: str) -> None:
        if self.node.store_up:  # with the store down it is resumable here only
            await self.node.claim(session_id)

    def released(self, session_id: str) -> None:
        self.node.release()
        self.node.unclaim(session_id)

    def migrates(self) -> Callable[[SessionRunner], bool] | None:
        # (With the store known down, nothing could be handed over: drain as is.)
        return migratable if self.node.store_up else None

    async def hand_over(self, sessions: Sessions) -> None:
        if sessions.handing_over is not None:
            await hand_over_all(sessions, self.node, self.config)

    def relay_grant(self, request: Request) -> tuple[Grant, dict[str, str]] | None:
        """A relayed resume (relay.py), if another node of this cluster signed it for this
        one, and its nonce is new: it may resume the session it names, and nothing else;
        the 101 proves this node holds the secret too."""
        node, now = self.node, time.time()
        values = request.headers.get_all(HEADER)
        if values and values[0].startswith("p1 ") and self.home is not None:
            pooled = verify_pool(self._keys, values, node.node_id, now, self._nonces)
            if pooled is None:
                return None
            return pool_grant(pooled.sender), {PROOF_HEADER: pooled.proof}
        accepted = verify_request(self._keys, request, node.node_id, now, self._nonces)
        if accepted is None:
            return None
        grant = Grant(None, resume_of=accepted.session_id, relayed=True)
        return grant, {PROOF_HEADER: accepted.proof}

    async def findable(self, session_id: str) -> bool:
        return await self.node.findable(session_id)

    async def resume_elsewhere(self, conn: Connection, event: Event, session_id: str) -> bool:
        """A resume of a session this node does not hold. True: relayed to its home (and
        over); False: not found elsewhere, the local path answers. ProtocolError: its
        home is gone (``node_lost``), or unreachable (retryable)."""
        if not relayable(session_id):
            return False
        node = self.node
        located = await node.locate(session_id)  # ProtocolError: the store is unreachable
        totals = self.sessions.totals
        if located.kind == "migrated" and located.record is not None:
            token = event.get("resume_token")  # (a string: the core checked)
            await adopt(
                session_id,
                located.record,
                str(token),
                self.sessions,
                node,
                self.config,
                self.new_engine,
            )
            return False  # it is here now: the ordinary resume follows
        if located.kind == "busy":
            raise cluster.elsewhere(cluster.Located.BUSY)
        if located.kind == "stalled":  # slow or cut off, not gone: the client tries again
            totals.count(totals.resumes, ErrorCode.SESSION_HOME_UNREACHABLE)
            raise cluster.elsewhere(cluster.Located.STALLED, located.node_id)
        if located.kind == "lost":
            totals.count(totals.resumes, "node_lost")
            raise cluster.elsewhere(cluster.Located.LOST)
        home, url = located.node_id, located.url
        if located.kind != "home" or home is None or home == node.node_id or url is None:
            return False
        return await self._relay(conn, event, session_id, home, url)

    async def _relay(
        self, conn: Connection, event: Event, session_id: str, home: str, url: str
    ) -> bool:
        config, totals = self.config, self.sessions.totals
        conn.ws.max_message_bytes = config.max_event_bytes  # the session's own bound
        conn.start_keepalive(self.sessions.timers, config.ping_interval_s, config.ping_timeout_s)
        log.info(
            "session %s: relaying its resume to its home node %s",
            session_id,
            home,
            extra={"session_id": session_id},
        )
        relayed = await pooled_relay(
            self.pool,
            conn,
            encode(event),
            home=home,
            url=url,
            session_id=session_id,
            dialect=conn.dialect.name,
        )
        if not relayed:
            totals.count(totals.resumes, ErrorCode.SESSION_HOME_UNREACHABLE)
            raise cluster.unreachable_home(home)
        totals.count(totals.resumes, "relayed")
        return True


@asynccontextmanager
async def joined(
    config: ServerConfig,
    sessions: Sessions,
    new_engine: Callable[[Mapping[str, Any]], Engine],
    relay_ssl: ssl.SSLContext | None,
    scheme: str,
    port: int,
) -> AsyncIterator[ClusterPlacement]:
    """This server is a node of the cluster for the block (``node.ClusterUnavailable``:
    its store did not answer at start), advertised on ``port``."""
    url = advertise_url(config, scheme, port)
    async with node_joined(
        config,
        url,
        lambda: sessions.slots_held,
        # (None while draining: a handed-over session's entry must stay dropped.)
        lambda: [] if sessions.shutting_down else [r.session.id for r in sessions.runners()],
    ) as node:
        placement = ClusterPlacement(node, config, sessions, new_engine, relay_ssl)
        async with trio.open_nursery() as nursery:  # the pool's peer connections
            placement.pool.nursery = nursery
            try:
                yield placement
            finally:
                placement.pool.nursery = None
                nursery.cancel_scope.cancel()


def checked_tls(config: ServerConfig) -> ssl.SSLContext:
    """The relay's client TLS (``--cluster-ca``), and the store's CA checked usable, at
    construction (TLSError, ValueError) rather than at the first resume."""
    relay_ssl = client_ssl_context(config.cluster_ca)  # TLSError
    if config.cluster_redis_ca is not None:
        tls_context(config.cluster_redis_ca)  # ValueError: cannot be used
    return relay_ssl


__all__ = ["RELAY_PATH", "ClusterPlacement", "checked_tls", "joined"]
