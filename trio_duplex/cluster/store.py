"""The cluster's shared store: membership, the session directory and admission leases,
on Redis (>= 7, or Valkey) through coredis, which runs on trio via anyio.

Key names and scripts are in ``keys.py``; this module only moves them to Redis. Every
call is bounded by the store's ``timeout_s``: a Redis that is down, unreachable or too
slow raises ``StoreUnavailable`` within it, never hangs, and the next call tries again on
a fresh connection (nothing here retries by itself: the caller knows what can wait).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import attrs
import coredis
import coredis.exceptions
import trio
from coredis.commands.script import Script

from . import keys as k
from .connect import failovers, redis_client
from .keys import DEFAULT_PREFIX, Keys, check_node_id, ttl_ms
from .leases import Peers, lease_payload, parse_lease
from .signed import CLOCK_ALLOWANCE_MS, Complaints, Sealer

T = TypeVar("T")

log = logging.getLogger("trio_duplex")

# Membership defaults: a heartbeat every second refreshing a 3 s TTL. A node that stops is
# gone at most 3 s after its last heartbeat (docs/cluster.md, "Membership"), and a live node
# survives two missed heartbeats (a Redis hiccup of up to ~2 s) without being declared dead.
NODE_TTL_S = 3.0
HEARTBEAT_INTERVAL_S = 1.0
LEASE_TTL_S = 10.0
"""How long a node's leases (and the presumption that it is alive) outlive its last
heartbeat: a node paused or cut off from the store for less than this keeps its place
under the cap, and its sessions are not declared lost (``node_lost``) before it."""
LEFT_TTL_S = 60.0
"""A tombstone's TTL unless the node gives its own (its sessions' directory TTL)."""
PRUNE_SAMPLE = 1000
"""Ids of the node index looked at by one ``prune``."""
DEFAULT_TIMEOUT_S = 1.0
CLAIM_TTL_S = 5.0
"""How long a node that took a handed-over record may take to say it has taken the
session over (``adopted``) before another node may."""


class StoreUnavailable(Exception):
    """Redis did not answer within the timeout, or could not be reached."""


class NotRegistered(Exception):
    """The node is not alive in the store (never registered, forgotten, or lapsed)."""


class ClusterRefused(Exception):
    """The store is a Redis Cluster (sharded), which the scripts cannot run on."""


@attrs.frozen(repr=False)
class Located:
    """Where a session is (``Store.locate``)."""

    kind: Literal["migrated", "home", "busy", "stalled", "lost", "unknown"]
    """``stalled``: its home is no member now but presumed alive (its leases live, it has
    not left): slow or cut off, not gone. ``lost``: it left, or lapsed past the bound."""
    node_id: str | None = None
    url: str | None = None
    record: bytes | None = None
    """The handed-over session's record (``migrated``): it holds credential digests."""

    def __repr__(self) -> str:
        return f"Located({self.kind}, node_id={self.node_id!r})"


@attrs.frozen
class Beat:
    """What a heartbeat found (``Store.heartbeat``); true if the node was a member."""

    alive: bool
    leases_kept: bool
    """Had the node's leases lived (False: it was cut off for longer than their TTL, or
    Redis lost them, so other nodes may have admitted sessions in their place)."""

    def __bool__(self) -> bool:
        return self.alive


@asynccontextmanager
async def open_store(
    url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    password: str | None = None,
    ca_file: str | None = None,
) -> AsyncIterator[Store]:
    """A store on the Redis at ``url`` (``redis://HOST:PORT/DB``, ``rediss://`` for TLS
    checked against ``ca_file``, or ``redis+sentinel://HOST:PORT,.../SERVICE/DB``: see
    connect.py), for the block's length; ``password`` wins over the URL's.

    Entering does not need Redis to be up: connections are made per call.
    """
    async with redis_client(url, timeout_s, password=password, ca_file=ca_file) as client:
        yield Store(client, Keys(prefix), timeout_s)


@attrs.define(eq=False)
class Store:
    """Typed calls over one coredis client; see ``keys.py`` for what each key holds.

    Every value a node acts on is sealed on its way in and checked on its way out
    (``signed.py``): one that fails is ignored as if it were not there, and logged
    (``complaints``). ``sign_with`` gives the store its cluster secret."""

    _client: coredis.Redis[str]
    keys: Keys
    timeout_s: float
    _scripts: dict[str, Script[str]] = attrs.field(factory=dict, init=False)
    _sealer: Sealer | None = attrs.field(default=None, init=False, repr=False)
    wall_clock: Callable[[], float] = attrs.field(default=time.time, init=False)
    """Seconds since the epoch: what seals expire by (every node's clock, within
    ``signed.CLOCK_ALLOWANCE_MS``)."""
    complaints: Complaints = attrs.field(factory=Complaints, init=False)
    peers: Peers = attrs.field(factory=Peers, init=False)
    """The newest lease count seen of each other node (``leases.py``)."""
    _redis_offset_ms: int = attrs.field(default=0, init=False)
    """Redis's clock minus this process's wall clock, as last seen (within the clock
    allowance): what lease seals expire by."""
    _version: int = attrs.field(default=0, init=False)
    _own: dict[str, int] = attrs.field(factory=dict, init=False)
    """The lease count last written per node id this store writes for (a heartbeat
    without a count seals it again: a count's seal expires with its key's TTL)."""

    def sign_with(self, secret: str) -> None:
        """Seal and check values under a key derived from ``secret`` (the cluster's)."""
        self._sealer = Sealer.of(secret)

    # -- sealing --------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.wall_clock() * 1000)

    def _saw_redis_time(self, seconds: object, micros: object) -> int:
        """Redis's clock (ms) from a script's ``TIME``; remembers its offset from ours."""
        redis_ms = int(str(seconds)) * 1000 + int(str(micros)) // 1000
        offset = redis_ms - self._now_ms()
        self._redis_offset_ms = max(-CLOCK_ALLOWANCE_MS, min(CLOCK_ALLOWANCE_MS, offset))
        return redis_ms

    @property
    def sealer(self) -> Sealer:
        if self._sealer is None:
            raise RuntimeError("the store has no cluster secret (Store.sign_with)")
        return self._sealer

    def _seal(self, key: str, payload: str, ttl_s: float) -> str:
        return self.sealer.seal(key, payload, self._now_ms() + ttl_ms(ttl_s))

    def _open(self, what: str, key: str, sealed: object) -> str | None:
        if sealed is None or sealed == "":
            return None
        payload = self.sealer.open(key, sealed, self._now_ms())
        if payload is None:
            self.complaints(what, key)
        return payload

    def _open_count(
        self, node_id: str, sealed: object, redis_ms: int, *, remember: bool = True
    ) -> int | None:
        """A peer's lease count, if it opens, has not expired by Redis's clock and (with
        ``remember``) is no older than the newest seen of that node; else None."""
        key = self.keys.leases(node_id)
        if sealed is None or sealed == "":
            return None
        opened = self.sealer.open_until(key, sealed, self._now_ms())
        lease = None if opened is None else parse_lease(opened[0])
        if opened is None or lease is None:
            self.complaints("a lease count", key)
            return None
        count, version = lease
        if not remember:
            return count if opened[1] >= redis_ms else None
        if not self.peers.check(node_id, count, version, opened[1], redis_ms):
            self.complaints("a replayed lease count (older than one seen, or expired)", key)
            return None
        return count

    def _left_at(self, node_id: str, sealed: object) -> int | None:
        """The version of ``node_id``'s tombstone (``left.VERSION``: newer than every count
        the process that left wrote), if it opens, else None."""
        payload = self._open("a tombstone", self.keys.left(node_id), sealed)
        word, _, version = (payload or "").partition(".")
        if word != "left" or not version.isascii() or not version.isdigit():
            return None
        return int(version)

    def _open_home(self, key: str, sealed: object) -> str | None:
        home = self._open("a directory entry", key, sealed)
        try:
            return None if home is None else check_node_id(home)
        except ValueError:
            self.complaints("a directory entry", key)
            return None

    # -- I/O ------------------------------------------------------------------------------

    @property
    def failovers(self) -> int:
        """How often the store's primary changed (a Sentinel failover; connect.py)."""
        return failovers(self._client)

    async def _bounded(self, call: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        seconds = self.timeout_s if timeout_s is None else timeout_s
        with trio.move_on_after(seconds):
            try:
                return await call()
            except (coredis.exceptions.ConnectionError, TimeoutError, OSError) as error:
                raise StoreUnavailable(f"Redis unreachable: {error}") from error
        raise StoreUnavailable(f"Redis did not answer within {seconds} s")

    async def _run(
        self,
        script: str,
        keys: list[str],
        args: list[str | int],
        timeout_s: float | None = None,
    ) -> Any:
        if script not in self._scripts:
            self._scripts[script] = self._client.register_script(script)
        run = self._scripts[script]
        return await self._bounded(lambda: run(keys=keys, args=args), timeout_s)

    async def load_scripts(self) -> None:
        """Load every script into Redis now: a script's first run then needs no extra
        round trip (``NOSCRIPT``, then ``SCRIPT LOAD``), so a call whose answer comes
        late (a hand-over during a drain) still runs in one request."""
        for script in k.SCRIPTS:
            await self._bounded(functools.partial(self._client.script_load, script))

    async def refuse_a_redis_cluster(self) -> None:
        """ClusterRefused if Redis runs in cluster mode: the scripts read keys they do not
        declare, which a sharded Redis does not allow (and each node's keys would be on
        other shards)."""
        try:
            info = await self._bounded(functools.partial(self._client.info, "cluster"))
        except coredis.exceptions.ResponseError:
            return  # INFO not allowed (ACLs): a cluster would refuse the scripts instead
        if str(info.get("cluster_enabled", "0")) == "1":
            raise ClusterRefused(
                "the cluster store is a Redis Cluster (cluster_enabled:1); --cluster needs a "
                "standalone Redis or Valkey (a primary, with replicas or Sentinel if wanted)"
            )

    # -- membership ---------------------------------------------------------------------

    def _lease_value(self, node_id: str, count: int, lease_ttl_s: float) -> str:
        """The sealed count, with a version above any this process wrote before, sealed
        for one lease TTL by Redis's clock (as last seen)."""
        payload = lease_payload(count, self._next_version())
        expires_ms = self._now_ms() + self._redis_offset_ms + ttl_ms(lease_ttl_s)
        return self.sealer.seal(self.keys.leases(node_id), payload, expires_ms)

    def _next_version(self) -> int:
        self._version = max(self._version + 1, int(self.wall_clock() * 1_000_000))
        return self._version

    async def _sync_clock(self) -> int:
        seconds, micros = await self._run(k.TIME, [], [])
        return self._saw_redis_time(seconds, micros)

    async def register(
        self,
        node_id: str,
        url: str,
        ttl_s: float = NODE_TTL_S,
        *,
        lease_ttl_s: float = LEASE_TTL_S,
        leases: int = 0,
    ) -> None:
        """A node starts: a member for ``ttl_s``, with no sessions and ``leases`` leases (a
        lapsed node registering again says what it holds in the same step)."""
        await self._sync_clock()
        await self._run(
            k.REGISTER,
            self.keys.node_keys(node_id),
            [
                node_id,
                self._seal(self.keys.node(node_id), url, ttl_s),
                ttl_ms(ttl_s),
                ttl_ms(lease_ttl_s),
                self._lease_value(node_id, leases, lease_ttl_s),
            ],
        )
        self._own[node_id] = leases

    async def heartbeat(
        self,
        node_id: str,
        url: str,
        ttl_s: float = NODE_TTL_S,
        *,
        leases: int | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> Beat:
        """Keep the node a member for ``ttl_s`` more, its leases and its sessions'
        directory entries for their TTLs; with ``leases``, also set its lease count to
        that (in the same script). False if the node had lapsed (others saw it gone); it
        is a member again now. Reads (and remembers) the other nodes' counts too."""
        args: list[str | int] = [
            node_id,
            self._seal(self.keys.node(node_id), url, ttl_s),
            ttl_ms(ttl_s),
            self.keys.session_prefix,
            ttl_ms(lease_ttl_s),
            self.keys.node_prefix,
            k.LEASES_SUFFIX,
        ]
        if leases is None:  # (its seal expires with the key's TTL: sealed again)
            leases = self._own.get(node_id)
        if leases is not None:
            args.append(self._lease_value(node_id, leases, lease_ttl_s))
        found = await self._run(k.HEARTBEAT, self.keys.node_keys(node_id), args)
        redis_ms = self._saw_redis_time(found[2], found[3])
        if leases is not None:
            self._own[node_id] = leases
        for i in range(4, len(found), 2):  # remembered (and checked: a replay is logged)
            try:
                self._open_count(str(found[i]), found[i + 1], redis_ms)
            except ValueError:
                continue
        return Beat(bool(found[0]), bool(found[1]))

    async def nodes(self) -> dict[str, str]:
        """Member node ids and their advertise URLs (a URL that fails its check: left
        out). Prunes the index of ids whose node and leases are both gone."""
        flat = await self._run(
            k.NODES,
            [self.keys.nodes],
            [self.keys.node_prefix, k.LEASES_SUFFIX, k.SESSIONS_SUFFIX],
        )
        found: dict[str, str] = {}
        for i in range(0, len(flat), 2):
            try:
                key = self.keys.node(str(flat[i]))
            except ValueError:
                continue
            url = self._open("a node's URL", key, flat[i + 1])
            if url is not None:
                found[str(flat[i])] = url
        return found

    async def prune(self, sample: int = PRUNE_SAMPLE) -> int:
        """Remove from the node index ids (of a random ``sample``) whose node and leases
        have both expired: every crash and restart adds an id. How many were removed."""
        removed = await self._run(
            k.PRUNE,
            [self.keys.nodes],
            [self.keys.node_prefix, k.LEASES_SUFFIX, k.SESSIONS_SUFFIX, sample],
        )
        return int(removed)

    async def forget(self, node_id: str, *, left_ttl_s: float = LEFT_TTL_S) -> None:
        """The node leaves cleanly, now: its leases go back at once, and for ``left_ttl_s``
        (its sessions' directory TTL) a tombstone says its sessions are lost."""
        key = self.keys.left(node_id)
        self._own.pop(node_id, None)
        await self._run(
            k.FORGET,
            self.keys.node_keys(node_id),
            [
                node_id,
                self._seal(key, f"left.{self._next_version()}", left_ttl_s),
                ttl_ms(left_ttl_s),
            ],
        )

    # -- session directory --------------------------------------------------------------

    def _entry(self, session_id: str, node_id: str, ttl_s: float) -> str:
        # Sealed for twice the entry's TTL: the home seals it again once half is gone
        # (``ClusterNode``), and meanwhile its heartbeat refreshes the key's own TTL.
        return self._seal(self.keys.session(session_id), check_node_id(node_id), 2 * ttl_s)

    async def claim_session(
        self, session_id: str, node_id: str, ttl_s: float, *, lease_ttl_s: float = LEASE_TTL_S
    ) -> None:
        """``node_id`` is the session's home; the entry lives ``ttl_s`` past the home's last
        heartbeat (choose it as the session's resume window), and its seal ``2 * ttl_s``
        from now: claim it again before ``ttl_s`` has passed. NotRegistered: the node is
        not a member."""
        claimed = await self._run(
            k.CLAIM,
            [self.keys.node(node_id), self.keys.sessions(node_id), self.keys.session(session_id)],
            [
                session_id,
                self._entry(session_id, node_id, ttl_s),
                ttl_ms(ttl_s),
                ttl_ms(lease_ttl_s),
            ],
        )
        if not claimed:
            raise NotRegistered(node_id)

    async def home_of(self, session_id: str) -> str | None:
        """The session's home node id (member or not: compare with ``nodes()``), or None
        (none, or an entry that fails its check)."""
        key = self.keys.session(session_id)
        sealed: str | None = await self._bounded(lambda: self._client.get(key))
        return self._open_home(key, sealed)

    async def release_session(self, session_id: str, node_id: str) -> bool:
        """Drop the entry if ``node_id`` is still its home; True if it was."""
        released = await self._run(
            k.RELEASE,
            [self.keys.sessions(node_id), self.keys.session(session_id)],
            [node_id, session_id],
        )
        return bool(released)

    async def locate(
        self, session_id: str, node_id: str, claim_ttl_s: float = CLAIM_TTL_S
    ) -> Located:
        """Where a session that ``node_id`` does not hold is: at a member home, handed over
        (its record, now claimed by ``node_id`` for ``claim_ttl_s``: take it over and say
        so with ``adopted``, or give it back with ``unclaim_migration``), being taken over
        by another node (``busy``), at a home presumed alive but no member (``stalled``),
        at a home that left or lapsed past the bound (``lost``), or nowhere. A value that
        fails its check counts as absent. Takes nothing: an answer lost to a timeout
        loses no session."""
        key = self.keys.session(session_id)
        found = await self._run(
            k.LOCATE,
            [key, self.keys.migration(session_id), self.keys.migration_claim(session_id)],
            [self.keys.node_prefix, node_id, ttl_ms(claim_ttl_s), k.LEASES_SUFFIX, k.LEFT_SUFFIX],
        )
        if not found:
            return Located("unknown")
        kind = str(found[0])
        if kind == "busy":
            return Located("busy")
        if kind == "migrated":
            mkey = self.keys.migration(session_id)
            record = self.sealer.open_private(mkey, found[1], self._now_ms())
            if record is None:
                self.complaints("a migration record", mkey)
                await self.unclaim_migration(session_id, node_id)
                return Located("unknown")
            return Located("migrated", record=record)
        home = self._open_home(key, found[1])
        if home is None:
            return Located("unknown")
        if kind == "home":
            url = self._open("a node's URL", self.keys.node(home), found[2])
            if url is not None:
                return Located("home", node_id=home, url=url)
            return Located("stalled", node_id=home)  # a member, but its URL fails
        if self._left_at(home, found[3]) is not None:
            return Located("lost", node_id=home)
        return Located("stalled" if str(found[4]) == "1" else "lost", node_id=home)

    async def findable(self, session_id: str, node_id: str) -> bool:
        """Could a resume find the session, which ``node_id`` does not hold: a
        handed-over record that opens, or a directory entry whose home is a member other
        than ``node_id`` (an entry of ``node_id``'s own is one its release has not
        dropped yet)? Reads only (``locate`` claims a record): for a phone call's
        ``<Redirect>``, which reconnects the call's stream only to a session still
        there."""
        key, mkey = self.keys.session(session_id), self.keys.migration(session_id)
        sealed = await self._bounded(lambda: self._client.mget([key, mkey]))
        home_sealed, record_sealed = sealed[0], sealed[1]
        if record_sealed is not None:
            if self.sealer.open_private(mkey, record_sealed, self._now_ms()) is not None:
                return True
            self.complaints("a migration record", mkey)
        home = self._open_home(key, home_sealed) if home_sealed is not None else None
        return home is not None and home != node_id and home in await self.nodes()

    async def adopted(self, session_id: str, node_id: str, ttl_s: float) -> bool:
        """``node_id`` has taken the handed-over session over: it is now its home (directory
        TTL ``ttl_s``) and the record is gone, in one step. False: its claim had lapsed.
        Idempotent: a call whose answer was lost may be made again."""
        done = await self._run(
            k.ADOPTED,
            [
                self.keys.session(session_id),
                self.keys.migration(session_id),
                self.keys.migration_claim(session_id),
                self.keys.node(node_id),
                self.keys.sessions(node_id),
                self.keys.migrations,
            ],
            [node_id, session_id, ttl_ms(ttl_s), self._entry(session_id, node_id, ttl_s)],
        )
        return bool(done)

    async def unclaim_migration(self, session_id: str, node_id: str) -> None:
        """``node_id`` will not take the handed-over session over after all."""
        await self._run(k.UNCLAIM_MIGRATION, [self.keys.migration_claim(session_id)], [node_id])

    async def hand_over(
        self,
        session_id: str,
        node_id: str,
        record: bytes,
        ttl_s: float,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """Store a migrating session's record for ``ttl_s``, and drop ``node_id``'s directory
        entry for it: the next resume anywhere takes the record (``locate``).
        ``timeout_s``: this call's bound, if not the store's. A ``StoreUnavailable`` does
        not say the record was not stored: a call given up on may still run."""
        key = self.keys.migration(session_id)
        sealed = self.sealer.seal_private(key, record, self._now_ms() + ttl_ms(ttl_s))
        await self._run(
            k.HAND_OVER,
            [
                self.keys.sessions(node_id),
                self.keys.session(session_id),
                key,
                self.keys.migration_claim(session_id),
                self.keys.migrations,
            ],
            [node_id, session_id, sealed, ttl_ms(ttl_s)],
            timeout_s,
        )

    # -- admission leases ---------------------------------------------------------------

    async def acquire_lease(
        self,
        node_id: str,
        cap: int,
        count: int,
        *,
        lease_ttl_s: float = LEASE_TTL_S,
        moving: str | None = None,
    ) -> bool:
        """Set ``node_id``'s lease count to ``count`` (one more than it holds) if the
        cluster's leases stay within ``cap``, atomically; False: they would not. Every
        handed-over record holds a lease in transit; ``moving``: the session id whose
        record this lease takes over (a node adopting it), not counted. The counts the
        script summed are checked after: if one fails (forged, sealed with another
        secret, expired by Redis's clock, older than one seen, or a remembered peer's
        gone without a tombstone), it counts as the cap (a remembered peer's: as its last
        count) and if that puts the total over, the node's count goes back to ``count -
        1`` and the answer is False, so a forged count can refuse sessions but never let
        one in. The caller runs one lease call at a time per node (its count is the
        truth)."""
        if count < 1:
            raise ValueError(f"an acquire sets a count of at least 1: {count}")
        remembered = self.peers.remembered(self._now_ms() + self._redis_offset_ms, node_id)
        found = await self._run(
            k.ACQUIRE,
            [
                self.keys.node(node_id),
                self.keys.leases(node_id),
                self.keys.nodes,
                self.keys.migrations,
            ],
            [
                self.keys.node_prefix,
                k.LEASES_SUFFIX,
                cap,
                self._lease_value(node_id, count, lease_ttl_s),
                count,
                ttl_ms(lease_ttl_s),
                k.SESSIONS_SUFFIX,
                self.keys.migration_prefix,
                moving or "",
                k.LEFT_SUFFIX,
                *(x for peer, held in remembered for x in (peer, held)),
            ],
        )
        granted = int(found[0])
        if granted == -1:
            raise NotRegistered(node_id)
        redis_ms = self._saw_redis_time(found[1], found[2])
        total = count + int(found[3])  # (records can only be deleted: that loses them too)
        listed = 5 + 2 * int(found[4])
        for i in range(5, listed, 2):
            peer, value = str(found[i]), found[i + 1]
            try:
                self.keys.leases(peer)
            except ValueError:
                total += cap
                continue
            if value == "":
                self.complaints("no lease count for a member node", self.keys.leases(peer))
            held = self._open_count(peer, value, redis_ms)
            total += cap if held is None else held
        for i in range(listed, len(found), 2):
            peer, left = str(found[i]), found[i + 1]
            version = self._left_at(peer, left)
            if version is None or not self.peers.left(peer, version):
                total += self.peers.vanished(peer, redis_ms)
        if granted and total > cap:
            await self.set_leases(node_id, count - 1, lease_ttl_s=lease_ttl_s)
            return False
        if granted:
            self._own[node_id] = count
        return bool(granted)

    async def set_leases(
        self, node_id: str, count: int, *, lease_ttl_s: float = LEASE_TTL_S
    ) -> None:
        """Set the node's lease count (a release: one less than it held)."""
        key = self.keys.leases(node_id)
        value = self._lease_value(node_id, count, lease_ttl_s)
        await self._bounded(lambda: self._client.set(key, value, px=ttl_ms(lease_ttl_s)))
        self._own[node_id] = count

    async def leases(self) -> dict[str, int]:
        """Leases held per node whose leases live (members and lapsed nodes presumed
        alive), checked (one that fails is left out): a snapshot for metrics and tests."""
        ids = sorted(await self._bounded(lambda: self._client.smembers(self.keys.nodes)))
        names = []
        for node_id in ids:
            try:
                names.append((node_id, self.keys.leases(node_id)))
            except ValueError:
                continue
        if not names:
            return {}
        counts = await self._bounded(lambda: self._client.mget([name for _, name in names]))
        redis_ms = await self._sync_clock()
        found: dict[str, int] = {}
        for (node_id, _), sealed in zip(names, counts, strict=True):
            held = self._open_count(node_id, sealed, redis_ms, remember=False)
            if held is not None:
                found[node_id] = held
        return found

    async def in_transit(self) -> int:
        """Handed-over records not yet adopted (each holds a lease): for tests."""
        ids = await self._bounded(lambda: self._client.smembers(self.keys.migrations))
        names = [self.keys.migration(sid) for sid in ids]
        if not names:
            return 0
        return int(await self._bounded(lambda: self._client.exists(names)))
