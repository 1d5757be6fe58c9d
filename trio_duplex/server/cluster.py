"""The server's side of cluster mode (``--cluster``): membership and cluster-wide admission.

``ClusterNode`` is this process as one node of the cluster. ``joined`` opens the shared
store (``trio_duplex.cluster``), registers the node, and keeps it alive with a heartbeat
every second (TTL 3 s) until the block ends, when it forgets the node, so that its
leases are free at once. It is only imported with ``--cluster``: without it the server
loads neither this module nor the Redis client.

Admission (``--cluster-max-sessions``): ``acquire`` takes a lease before the local
admission, ``release`` gives it back once the session's slot is free (in a task, bounded
by the store's timeout). Each heartbeat also *sets* the node's lease count to what it
holds, so a release that was lost, or a Redis that came back empty, heals within a
heartbeat. So that this count is exact, a heartbeat waits for the acquires and releases
in flight, and holds new ones back for its own round trip (``_Ops``): an acquire counted
by Redis but not yet here, or a release counted here but not yet by Redis, would
otherwise be overwritten by a count one too low, and the cap overshot.

When Redis is unreachable (``StoreUnavailable``, within the store's timeout): an open
is refused ``resource_exhausted`` (the cap is never overshot), a release is left to the
next heartbeat, a heartbeat is retried a second later; live sessions never wait on the
store. The outage is logged once at WARNING, and its end once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from coredis.exceptions import RedisError

from ..cluster import (
    CLAIM_TTL_S,
    HEARTBEAT_INTERVAL_S,
    NODE_TTL_S,
    Located,
    NotRegistered,
    Store,
    StoreUnavailable,
    open_store,
)
from ..cluster.connect import PASSWORD_ENV as REDIS_PASSWORD_ENV
from ..core.config import ServerConfig
from ..core.events import ErrorCode
from ..core.frames import CloseCode
from ..core.wire import ProtocolError


class ClusterUnavailable(Exception):
    """The node could not join the cluster at start: its store did not answer."""


_FAILED = (StoreUnavailable, RedisError)
"""What a store call may raise when Redis is down or answers strangely (a Redis still
loading its data answers an error, for one): neither may stop the server."""

log = logging.getLogger("trio_duplex")

_NO_CAP = 2**62
"""The cap a forced lease is taken under: none that a count could reach."""


def shown_url(url: str) -> str:
    """The store's URL for the log, its password (if any) hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def default_node_id() -> str:
    """Unique per process: the machine's name, the pid and a random part."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{host[:64] or 'node'}-{os.getpid()}-{secrets.token_hex(3)}"


def advertise_url(config: ServerConfig, scheme: str, port: int) -> str:
    """``--advertise-url``, or ``scheme://host:port/path`` of the listening address (the
    machine's name when it listens on every address)."""
    if config.advertise_url is not None:
        return config.advertise_url
    host = config.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{config.path}"


@attrs.define(eq=False)
class _Ops:
    """Acquires and releases run together; a heartbeat that sets the lease count runs
    alone (it waits for those in flight, and new ones wait for it)."""

    running: int = 0
    exclusive: bool = False
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while self.exclusive:
            await self._lot.park()
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._lot.unpark_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        while self.exclusive:
            await self._lot.park()
        self.exclusive = True
        try:
            while self.running:
                await self._lot.park()
            yield
        finally:
            self.exclusive = False
            self._lot.unpark_all()


@attrs.define(eq=False)
class ClusterNode:
    """This process as a node: its id, its URL, its leases, the store's health."""

    store: Store
    node_id: str
    url: str
    cap: int | None
    """``--cluster-max-sessions``; None: no cluster-wide cap, no leases taken."""
    slots_held: Callable[[], int]
    """How many sessions hold a slot here now (the count a heartbeat sets without a cap)."""
    session_ids: Callable[[], list[str]] = attrs.field(kw_only=True, default=list)
    """The sessions held here now: claimed again when the node finds it had lapsed."""
    secret: str = attrs.field(repr=False, kw_only=True)
    """``--cluster-secret``: signs the resumes this node relays, checks those it gets."""
    directory_ttl_s: float = attrs.field(kw_only=True)
    """How long a session's directory entry outlives this node's last heartbeat: its
    resume window, so that a resume after this node died hears ``node_lost``."""
    held: int = 0
    """Leases this node holds, as far as it knows (with a cap): taken, not yet given back."""
    store_up: bool = True
    """Did the store answer the last call? (``/readyz``, ``/metrics``)"""
    _down_since: float | None = None
    _failovers: int = 0
    """The store's ``failovers`` when this node last claimed its sessions."""
    _ops: _Ops = attrs.field(factory=_Ops)
    _nursery: trio.Nursery | None = None

    # -- membership ----------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        next_beat = trio.current_time() + HEARTBEAT_INTERVAL_S
        while True:
            await trio.sleep_until(next_beat)
            await self.beat()
            # A beat slower than the interval (an outage) is followed at once, not by a burst.
            next_beat = max(next_beat + HEARTBEAT_INTERVAL_S, trio.current_time())

    async def beat(self) -> None:
        """One heartbeat, setting the lease count; a lapsed node registers again."""
        try:
            async with self._ops.alone():
                count = self.held if self.cap is not None else self.slots_held()
                alive = await self.store.heartbeat(self.node_id, self.url, leases=count)
                failovers = self.store.failovers
                if alive and failovers != self._failovers:
                    # A Sentinel failover: the old primary's last writes (claims of
                    # sessions opened then) may be lost. Claim them all again.
                    log.warning(
                        "cluster: the store's primary changed (a failover); claiming this "
                        "node's sessions again"
                    )
                    for session_id in self.session_ids():
                        await self.store.claim_session(
                            session_id, self.node_id, self.directory_ttl_s
                        )
                if not alive:
                    log.warning(
                        "cluster: node %s was seen dead (no heartbeat for its TTL, or Redis "
                        "came back empty); registering it again",
                        self.node_id,
                    )
                    await self.store.register(self.node_id, self.url)
                    count = self.held if self.cap is not None else self.slots_held()
                    await self.store.heartbeat(self.node_id, self.url, leases=count)
                    # Redis came back empty, or others saw this node dead: its sessions'
                    # directory entries are gone or read "lost". Claim them again, so
                    # that a resume reaching another node finds them here.
                    for session_id in self.session_ids():
                        await self.store.claim_session(
                            session_id, self.node_id, self.directory_ttl_s
                        )
        except _FAILED as exc:
            self._failed(exc)
        else:
            self._failovers = failovers
            self._answered()

    def _failed(self, exc: Exception) -> None:
        if self.store_up:
            self.store_up = False
            self._down_since = trio.current_time()
            refused = (
                "new sessions refused"
                if self.cap is not None
                else "new sessions still admitted (no --cluster-max-sessions)"
            )
            log.warning(
                "cluster: store unreachable (%s); %s, live sessions unaffected; retrying "
                "every %gs (said once per outage)",
                str(exc) or type(exc).__name__,
                refused,
                HEARTBEAT_INTERVAL_S,
            )

    def _answered(self) -> None:
        if not self.store_up:
            self.store_up = True
            since = self._down_since
            lasted = "" if since is None else f" after {trio.current_time() - since:.1f}s"
            log.warning("cluster: store reachable again%s", lasted)

    # -- the session directory ----------------------------------------------------------

    async def claim(self, session_id: str) -> None:
        """This node is the session's home, as far as the store can be told: a store that
        does not answer (within its timeout) leaves the session resumable here only."""
        try:
            await self.store.claim_session(session_id, self.node_id, self.directory_ttl_s)
        except _FAILED as exc:
            self._failed(exc)
        except NotRegistered:  # lapsed: the next heartbeat registers it again
            self._answered()
        else:
            self._answered()

    def unclaim(self, session_id: str) -> None:
        """The session has ended here: drop its directory entry (in a task; an entry left
        behind expires with its TTL, and a resume of an ended session is refused anyway)."""
        if self._nursery is not None:
            self._nursery.start_soon(self._unclaim, session_id)

    async def _unclaim(self, session_id: str) -> None:
        try:
            await self.store.release_session(session_id, self.node_id)
        except _FAILED as exc:
            self._failed(exc)
        else:
            self._answered()

    async def hand_over(
        self, session_id: str, record: bytes, ttl_s: float, timeout_s: float
    ) -> bool:
        """Store a migrating session's record for ``ttl_s`` (``Store.hand_over``), waiting
        for the store up to ``timeout_s``. False: it did not answer, and whether the
        record was stored is not known (a call given up on may still run)."""
        try:
            await self.store.hand_over(session_id, self.node_id, record, ttl_s, timeout_s=timeout_s)
        except _FAILED as exc:
            self._failed(exc)
            return False
        self._answered()
        return True

    async def adopted(self, session_id: str) -> bool:
        """Tell the store this node has taken the handed-over session over (``Store.
        adopted``), trying again while the store does not answer, within the claim's TTL.
        False: not confirmed, and it will not be (the claim lapsed, or no answer in
        time): another node may take the session over; this one must not keep it."""
        deadline = trio.current_time() + CLAIM_TTL_S - self.store.timeout_s
        while True:
            try:
                done = await self.store.adopted(session_id, self.node_id, self.directory_ttl_s)
            except _FAILED as exc:
                self._failed(exc)
                if trio.current_time() >= deadline:
                    return False
                await trio.sleep(0.1)  # (a store that refused at once: not a hot loop)
                continue
            self._answered()
            return done

    async def unclaim_migration(self, session_id: str) -> None:
        """This node will not take the handed-over session over (best effort: the claim
        lapses by itself)."""
        try:
            await self.store.unclaim_migration(session_id, self.node_id)
        except _FAILED as exc:
            self._failed(exc)

    async def locate(self, session_id: str) -> Located:
        """Where a session this node does not hold is (``Store.locate``). ProtocolError
        ``session_home_unreachable`` (retryable): the store did not answer."""
        try:
            located = await self.store.locate(session_id, self.node_id)
        except _FAILED as exc:
            self._failed(exc)
            raise ProtocolError.home_unreachable(
                "the cluster store is unreachable, so the session cannot be found"
            ) from None
        self._answered()
        return located

    # -- admission -----------------------------------------------------------------------

    async def acquire(self, *, force: bool = False) -> bool:
        """Take a cluster-wide lease for a session about to be admitted: True if taken,
        False if there is no cap. ProtocolError ``resource_exhausted``: at the cap, or the
        store did not answer within its timeout (waiting for a heartbeat included).
        ``force``: taken even at the cap (a session moving from another node, whose
        lease that node has given back)."""
        cap = self.cap
        if cap is None:
            return False
        if force:
            cap = _NO_CAP
        try:
            with trio.fail_after(self.store.timeout_s):
                async with self._ops.shared():
                    granted = await self.store.acquire_lease(self.node_id, cap)
        except trio.TooSlowError:
            self._failed(StoreUnavailable(f"no lease within {self.store.timeout_s}s"))
            raise _refused("the cluster store is unreachable; try again later") from None
        except _FAILED as exc:
            self._failed(exc)
            raise _refused("the cluster store is unreachable; try again later") from None
        except NotRegistered:  # lapsed: the next heartbeat registers it again
            self._answered()
            raise _refused("this node is rejoining the cluster; try again shortly") from None
        self._answered()
        if not granted:
            raise _refused(f"all {cap} cluster-wide session slots are in use")
        self.held += 1
        return True

    def release(self) -> None:
        """A session that took a lease has freed its slot (or was never admitted): give the
        lease back, in a task. If it fails, the next heartbeat's count heals it."""
        if self.cap is None:
            return
        if self._nursery is None:  # leaving: forget() frees every lease at once
            self.held -= 1
            return
        self._nursery.start_soon(self._release)

    async def _release(self) -> None:
        try:
            async with self._ops.shared():
                await self.store.release_lease(self.node_id)
        except _FAILED as exc:
            self._failed(exc)
        else:
            self._answered()
        finally:
            self.held -= 1


def _refused(message: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.RESOURCE_EXHAUSTED, message, close_code=CloseCode.TRY_AGAIN_LATER
    )


@asynccontextmanager
async def joined(
    config: ServerConfig,
    url: str,
    slots_held: Callable[[], int],
    session_ids: Callable[[], list[str]] = list,
) -> AsyncIterator[ClusterNode]:
    """Register this node in the cluster for the block (ClusterUnavailable: the store did
    not answer), heartbeating; forget it at the end (best effort, bounded)."""
    assert config.cluster is not None
    # coredis says at INFO each time it retries a call (a script's first run, a refused
    # connection): chatter under an operator's INFO; an outage is ours to report, once.
    if logging.getLogger("coredis").level == logging.NOTSET:
        logging.getLogger("coredis").setLevel(logging.WARNING)
    node_id = config.node_id or default_node_id()
    password = os.environ.get(REDIS_PASSWORD_ENV) or None
    ca_file = config.cluster_redis_ca
    async with open_store(config.cluster, password=password, ca_file=ca_file) as store:
        try:
            await store.register(node_id, url)
            await store.load_scripts()
        except _FAILED as exc:
            raise ClusterUnavailable(
                f"cannot reach the cluster store {shown_url(config.cluster)}: {exc}"
            ) from None
        assert config.cluster_secret is not None  # (ServerConfig requires it with --cluster)
        node = ClusterNode(
            store,
            node_id,
            url,
            config.cluster_max_sessions,
            slots_held,
            session_ids=session_ids,
            secret=config.cluster_secret,
            directory_ttl_s=config.disconnect_grace_s + NODE_TTL_S,
        )
        log.info(
            "cluster: node %s registered (advertised as %s, store %s, cap %s)",
            node_id,
            url,
            shown_url(config.cluster),
            config.cluster_max_sessions or "none",
            extra={"node_id": node_id},
        )
        try:
            async with trio.open_nursery() as nursery:
                node._nursery = nursery
                nursery.start_soon(node._heartbeats)
                try:
                    yield node
                finally:
                    node._nursery = None
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await store.forget(node_id)
                except _FAILED as exc:
                    log.warning(
                        "cluster: could not forget node %s (%s); it lapses within its TTL",
                        node_id,
                        exc,
                    )
                else:
                    log.info("cluster: node %s left", node_id)
