"""The server's side of cluster mode (``--cluster``): membership and cluster-wide admission.

``ClusterNode`` is this process as one node of the cluster. ``joined`` opens the shared
store (``trio_duplex.cluster``), registers the node, and keeps it alive with a heartbeat
every second (membership TTL 3 s, leases 10 s: a node that is only slow keeps its place)
until the block ends, when it forgets the node, so that its leases are free at once and
its sessions read as lost. Each heartbeat also seals its sessions' directory entries
again as their seals age, and every tenth prunes the store's node index. It is only
imported with ``--cluster``: without it the server loads neither this module nor the
Redis client.

Admission (``--cluster-max-sessions``): ``acquire`` takes a lease before the local
admission, ``release`` gives it back once the session's slot is free (in a task, bounded
by the store's timeout). A handed-over session's record holds its lease in transit
until a node adopting it takes a lease in its place (``acquire(moving=...)``, within the
cap like any other: the record's lease is not counted for it). The node's lease count
in the store is a sealed value only it writes (the store is not trusted: a count forged
lower, replayed or deleted must not let sessions in), so its lease calls run one at a
time (``_leasing``), each setting the count it now holds; each heartbeat sets it too, so
a release that was lost, or a Redis that came back empty, heals within a heartbeat.

When Redis is unreachable (``StoreUnavailable``, within the store's timeout): an open
is refused ``resource_exhausted`` (the cap is never overshot), a release is left to the
next heartbeat, a heartbeat is retried a second later; live sessions never wait on the
store. The outage is logged once at WARNING, and its end once.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from coredis.exceptions import RedisError

from ..core import cluster
from ..server.config import ServerConfig
from .connect import PASSWORD_ENV as REDIS_PASSWORD_ENV
from .store import (
    CLAIM_TTL_S,
    HEARTBEAT_INTERVAL_S,
    LEASE_TTL_S,
    NODE_TTL_S,
    ClusterRefused,
    Located,
    NotRegistered,
    Store,
    StoreUnavailable,
    open_store,
)


class ClusterUnavailable(Exception):
    """The node could not join the cluster at start: its store did not answer."""


_FAILED = (StoreUnavailable, RedisError)
"""What a store call may raise when Redis is down or answers strangely (a Redis still
loading its data answers an error, for one): neither may stop the server."""

log = logging.getLogger("trio_duplex")

PRUNE_EVERY = 10
"""Heartbeats between two prunings of the node index (``Store.prune``)."""


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
    """The sessions held here now (none while draining): claimed again when the node
    finds it had lapsed, and as their entries' seals age."""
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
    _leasing: trio.Lock = attrs.field(factory=trio.Lock)
    """One lease call at a time (heartbeats included): each sets the count held."""
    _sealed: dict[str, float] = attrs.field(factory=dict)
    """When each session's directory entry was last sealed (``claim``): sealed for twice
    the directory TTL, it is sealed again by the heartbeat once one TTL has passed."""
    _beats: int = 0
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
        """One heartbeat, setting the lease count; a lapsed node registers again, and
        directory entries sealed a directory TTL ago are sealed again."""
        try:
            async with self._leasing:
                count = self.held if self.cap is not None else self.slots_held()
                alive = await self.store.heartbeat(self.node_id, self.url, leases=count)
                failovers = self.store.failovers
                if not alive.leases_kept and count and self.cap is not None:
                    log.warning(
                        "cluster: node %s's %d leases had lapsed (no heartbeat for %gs, or "
                        "Redis lost them): other nodes may have admitted sessions in their "
                        "place, over --cluster-max-sessions until enough sessions end",
                        self.node_id,
                        count,
                        LEASE_TTL_S,
                    )
                if alive and failovers != self._failovers:
                    # A Sentinel failover: the old primary's last writes (claims of
                    # sessions opened then) may be lost. Seal them all again, below.
                    log.warning(
                        "cluster: the store's primary changed (a failover); claiming this "
                        "node's sessions again"
                    )
                    self._sealed.clear()
                if not alive:
                    log.warning(
                        "cluster: node %s was seen gone (no heartbeat for its TTL, or Redis "
                        "came back empty); registering it again",
                        self.node_id,
                    )
                    # (with its count: a count of 0 in between would let others in)
                    count = self.held if self.cap is not None else self.slots_held()
                    await self.store.register(self.node_id, self.url, leases=count)
                    await self.store.heartbeat(self.node_id, self.url, leases=count)
                    # Redis came back empty, or others saw this node gone: its sessions'
                    # directory entries are gone or no longer in its index. Claim them
                    # again, so that a resume reaching another node finds them here.
                    self._sealed.clear()
            await self._seal_again()
            self._beats += 1
            if self._beats % PRUNE_EVERY == 0:
                await self.store.prune()
        except _FAILED as exc:
            self._failed(exc)
        else:
            self._failovers = failovers
            self._answered()

    async def _seal_again(self) -> None:
        held = self.session_ids()
        due = trio.current_time() - self.directory_ttl_s
        for session_id in held:
            if self._sealed.get(session_id, -math.inf) <= due:
                try:
                    await self._claim(session_id)
                except NotRegistered:
                    return  # lapsed meanwhile: the next heartbeat registers it again
        if len(self._sealed) > len(held):  # forget the sessions that ended meanwhile
            live = set(held)
            for session_id in [s for s in self._sealed if s not in live]:
                del self._sealed[session_id]

    async def _claim(self, session_id: str) -> None:
        sealed = trio.current_time()
        await self.store.claim_session(session_id, self.node_id, self.directory_ttl_s)
        self._sealed[session_id] = sealed

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
            await self._claim(session_id)
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
        self._sealed.pop(session_id, None)
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
        self._sealed[session_id] = trio.current_time()  # (its entry is sealed by the call)
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
            raise cluster.store_unreachable_for_resume() from None
        self._answered()
        return located

    async def findable(self, session_id: str) -> bool:
        """``Store.findable``; True when the store does not answer (the resume, tried,
        answers for itself)."""
        try:
            found = await self.store.findable(session_id, self.node_id)
        except _FAILED as exc:
            self._failed(exc)
            return True
        self._answered()
        return found

    # -- admission -----------------------------------------------------------------------

    async def acquire(self, *, moving: str | None = None) -> bool:
        """Take a cluster-wide lease for a session about to be admitted: True if taken,
        False if there is no cap. ProtocolError ``resource_exhausted``: at the cap, or the
        store did not answer within its timeout (waiting for a heartbeat included).
        ``moving``: the id of a handed-over session this node is taking over, whose
        record's lease in transit this one replaces (not counted besides)."""
        cap = self.cap
        if cap is None:
            return False
        try:
            with trio.fail_after(self.store.timeout_s):
                async with self._leasing:
                    granted = await self.store.acquire_lease(
                        self.node_id, cap, self.held + 1, moving=moving
                    )
                    if granted:
                        self.held += 1
        except trio.TooSlowError:
            self._failed(StoreUnavailable(f"no lease within {self.store.timeout_s}s"))
            raise cluster.no_lease(cluster.NoLease.STORE_UNREACHABLE) from None
        except _FAILED as exc:
            self._failed(exc)
            raise cluster.no_lease(cluster.NoLease.STORE_UNREACHABLE) from None
        except NotRegistered:  # lapsed: the next heartbeat registers it again
            self._answered()
            raise cluster.no_lease(cluster.NoLease.REJOINING) from None
        self._answered()
        if not granted:
            raise cluster.cluster_full(cap)
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
            async with self._leasing:
                self.held -= 1
                await self.store.set_leases(self.node_id, self.held)
        except _FAILED as exc:
            self._failed(exc)
        else:
            self._answered()


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
    assert config.cluster_secret is not None  # (ServerConfig requires it with --cluster)
    directory_ttl_s = config.disconnect_grace_s + NODE_TTL_S
    password = os.environ.get(REDIS_PASSWORD_ENV) or None
    ca_file = config.cluster_redis_ca
    async with open_store(config.cluster, password=password, ca_file=ca_file) as store:
        store.sign_with(config.cluster_secret)
        try:
            await store.refuse_a_redis_cluster()
            await store.register(node_id, url)
            await store.load_scripts()
            # (a first read of every peer's count, remembered: before any open is admitted)
            await store.heartbeat(node_id, url, leases=0)
        except ClusterRefused as exc:
            raise ClusterUnavailable(f"{shown_url(config.cluster)}: {exc}") from None
        except _FAILED as exc:
            raise ClusterUnavailable(
                f"cannot reach the cluster store {shown_url(config.cluster)}: {exc}"
            ) from None
        node = ClusterNode(
            store,
            node_id,
            url,
            config.cluster_max_sessions,
            slots_held,
            session_ids=session_ids,
            secret=config.cluster_secret,
            directory_ttl_s=directory_ttl_s,
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
                    await store.forget(node_id, left_ttl_s=directory_ttl_s)
                except _FAILED as exc:
                    log.warning(
                        "cluster: could not forget node %s (%s); it lapses within its TTL",
                        node_id,
                        exc,
                    )
                else:
                    log.info("cluster: node %s left", node_id)
