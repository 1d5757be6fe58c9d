"""The shared store against a real redis-server.

A few tests wait in real time (``time.sleep`` is not used: ``trio.sleep`` under the real
clock) because what they test is Redis's own TTL clock, which trio's clock cannot drive;
their TTLs are a few hundred milliseconds.
"""

from __future__ import annotations

import os
import signal

import attrs
import coredis
import pytest
import trio

from trio_duplex.cluster.keys import Keys
from trio_duplex.cluster.store import (
    LEASE_TTL_S,
    NotRegistered,
    Store,
    StoreUnavailable,
    open_store,
)

from .conftest import SECRET, TIMEOUT_S, RedisServer

URL_A = "ws://10.0.0.1:8000"
URL_B = "ws://10.0.0.2:8000"


@attrs.define(eq=False)
class Leaser:
    """A node's lease calls as ``ClusterNode`` makes them: one at a time, each setting the
    count the node holds."""

    store: Store
    node_id: str
    held: int = 0
    lease_ttl_s: float = LEASE_TTL_S
    lock: trio.Lock = attrs.field(factory=trio.Lock)

    async def acquire(self, cap: int) -> bool:
        async with self.lock:
            granted = await self.store.acquire_lease(
                self.node_id, cap, self.held + 1, lease_ttl_s=self.lease_ttl_s
            )
            self.held += granted
            return granted

    async def release(self) -> bool:
        async with self.lock:
            if not self.held:
                return False
            self.held -= 1
            await self.store.set_leases(self.node_id, self.held, lease_ttl_s=self.lease_ttl_s)
            return True


def test_keys_are_under_the_prefix() -> None:
    keys = Keys("p:")
    assert keys.node("a") == "p:node:a"
    assert keys.leases("a") == "p:node:a:leases"
    assert keys.sessions("a") == "p:node:a:sessions"
    assert keys.session("s1") == "p:session:s1"
    assert keys.migration("s1") == "p:migration:s1"
    assert keys.nodes == "p:nodes"
    assert Keys().node("a") == "trio-duplex:node:a"


@pytest.mark.parametrize("bad", ["", "a:leases", "a b", "x" * 129])
def test_node_ids_cannot_break_key_names(bad: str) -> None:
    with pytest.raises(ValueError):
        Keys().node(bad)


async def test_every_key_is_under_the_prefix_and_expires(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("a", URL_A)
    await store.claim_session("s1", "a", ttl_s=30)
    assert await store.acquire_lease("a", cap=5, count=1)
    names = await raw.keys("*")
    assert names and all(name.startswith("trio-duplex:") for name in names)
    # The node index is the only key without a TTL: it holds ids, pruned by nodes().
    for name in names - {"trio-duplex:nodes"}:
        assert await raw.pttl(name) > 0, name


async def test_register_nodes_forget(store: Store) -> None:
    assert await store.nodes() == {}
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    assert await store.nodes() == {"a": URL_A, "b": URL_B}
    await store.forget("a")
    assert await store.nodes() == {"b": URL_B}


async def test_heartbeat_keeps_a_node_alive_past_its_ttl(store: Store) -> None:
    """Real time: Redis's TTL clock. Beats every 0.2 s for 0.8 s keep a 0.6 s TTL alive;
    a beat may come 0.4 s late (a loaded machine) before the test could fail."""
    await store.register("a", URL_A, ttl_s=0.6)
    for _ in range(4):
        await trio.sleep(0.2)
        assert await store.heartbeat("a", URL_A, ttl_s=0.6)
    assert await store.nodes() == {"a": URL_A}


async def test_a_silent_node_is_presumed_alive_until_its_leases_expire(store: Store) -> None:
    """Real time: Redis's TTL clock. Once its membership lapses its sessions' homes read
    as stalled (retryable) and its leases still count; once its leases expire too, its
    sessions are lost and its leases are back. (Each wait is only a lower bound, but for
    the stalled checks, which have 1.6 s to spare before the leases expire.)"""
    await store.register("a", URL_A, ttl_s=0.3, lease_ttl_s=2.0)
    await store.register("b", URL_B, ttl_s=30)
    await store.claim_session("s1", "a", ttl_s=30)
    a, b = Leaser(store, "a", lease_ttl_s=2.0), Leaser(store, "b")
    assert await a.acquire(cap=2)
    assert await a.acquire(cap=2)
    assert not await b.acquire(cap=2)
    await trio.sleep(0.4)
    assert await store.nodes() == {"b": URL_B}
    assert (await store.locate("s1", "b")).kind == "stalled"
    assert not await b.acquire(cap=2)  # a slow node keeps its place
    await trio.sleep(2.0)
    located = await store.locate("s1", "b")
    assert (located.kind, located.node_id) == ("lost", "a")
    assert await b.acquire(cap=2)
    assert await store.leases() == {"b": 1}


async def test_a_lapsed_node_hears_so_from_its_heartbeat(store: Store) -> None:
    await store.register("a", URL_A)
    await store.forget("a")
    assert not await store.heartbeat("a", URL_A)
    assert await store.heartbeat("a", URL_A)
    assert await store.nodes() == {"a": URL_A}


async def test_register_starts_a_node_afresh(store: Store) -> None:
    await store.register("a", URL_A)
    assert await store.acquire_lease("a", cap=1, count=1)
    await store.register("a", URL_A)
    assert await store.leases() == {"a": 0}
    assert await store.acquire_lease("a", cap=1, count=1)


async def test_claim_home_release(store: Store) -> None:
    await store.register("a", URL_A)
    assert await store.home_of("s1") is None
    await store.claim_session("s1", "a", ttl_s=30)
    assert await store.home_of("s1") == "a"
    assert not await store.release_session("s1", "b")
    assert await store.home_of("s1") == "a"
    assert await store.release_session("s1", "a")
    assert await store.home_of("s1") is None


async def test_locate_tells_where_a_session_is(store: Store) -> None:
    assert (await store.locate("s1", "b")).kind == "unknown"
    await store.register("a", URL_A)
    await store.claim_session("s1", "a", ttl_s=30)
    home = await store.locate("s1", "b")
    assert (home.kind, home.node_id, home.url) == ("home", "a", URL_A)
    await store.forget("a")
    lost = await store.locate("s1", "b")
    assert (lost.kind, lost.node_id, lost.url) == ("lost", "a", None)


async def test_a_handed_over_session_is_taken_over_by_one_node(
    store: Store, raw: coredis.Redis[str]
) -> None:
    for node, url in (("a", URL_A), ("b", URL_B), ("c", "ws://10.0.0.3:8000")):
        await store.register(node, url)
    await store.claim_session("s1", "a", ttl_s=30)
    record = bytes(range(256)) * 3  # any bytes, not only text
    await store.hand_over("s1", "a", record, ttl_s=30)
    assert await store.home_of("s1") is None  # a resume finds the record, not the home
    assert list(await raw.hkeys(store.keys.sessions("a"))) == []
    assert await raw.pttl(store.keys.migration("s1")) > 29_000
    found = await store.locate("s1", "b")
    assert (found.kind, found.record) == ("migrated", record)
    assert str(record[:8]) not in repr(found)
    # Nothing was taken: B's answer could have been lost. B holds a claim meanwhile.
    assert (await store.locate("s1", "c")).kind == "busy"
    assert (await store.locate("s1", "b")).kind == "migrated"  # B asking again
    assert not await store.adopted("s1", "c", ttl_s=30)  # C holds no claim
    assert await store.adopted("s1", "b", ttl_s=30)
    assert await store.adopted("s1", "b", ttl_s=30)  # again (a lost answer): still done
    assert not await raw.exists([store.keys.migration("s1")])
    located = await store.locate("s1", "c")
    assert (located.kind, located.node_id) == ("home", "b")
    assert list(await raw.hkeys(store.keys.sessions("b"))) == ["s1"]


async def test_findable_looks_where_a_resume_would_and_claims_nothing(
    store: Store, raw: coredis.Redis[str]
) -> None:
    assert not await store.findable("s1", "b")
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    await store.claim_session("s1", "a", ttl_s=30)
    assert await store.findable("s1", "b")
    # Asked by its home, which does not hold it: an entry its release has not dropped yet.
    assert not await store.findable("s1", "a")
    await store.forget("a")
    assert not await store.findable("s1", "b")  # its home left: no resume would find it
    await store.hand_over("s2", "a", b"record", ttl_s=30)
    assert await store.findable("s2", "b")
    assert await store.findable("s2", "b")
    assert (await store.locate("s2", "b")).kind == "migrated"  # asking claimed nothing
    # A record the cluster did not seal (whoever else writes to Redis) is no session.
    await raw.set(store.keys.migration("s3"), "forged")
    assert not await store.findable("s3", "b")


async def test_a_claim_given_back_or_lapsed_frees_the_record_for_another_node(
    store: Store,
) -> None:
    """Real time: Redis's TTL clock, for the lapsing claim (0.3 s)."""
    await store.register("b", URL_B)
    await store.register("c", URL_A)
    await store.hand_over("s1", "a", b"record", ttl_s=30)
    assert (await store.locate("s1", "b")).kind == "migrated"
    await store.unclaim_migration("s1", "c")  # not C's: changes nothing
    assert (await store.locate("s1", "c")).kind == "busy"
    await store.unclaim_migration("s1", "b")
    assert (await store.locate("s1", "c", claim_ttl_s=0.3)).kind == "migrated"
    await trio.sleep(0.4)
    assert not await store.adopted("s1", "c", ttl_s=30)  # too late: its claim lapsed
    assert (await store.locate("s1", "b")).kind == "migrated"
    assert await store.adopted("s1", "b", ttl_s=30)


async def test_a_node_not_alive_cannot_claim_or_lease(store: Store) -> None:
    with pytest.raises(NotRegistered):
        await store.claim_session("s1", "ghost", ttl_s=30)
    with pytest.raises(NotRegistered):
        await store.acquire_lease("ghost", cap=10, count=1)
    assert await store.home_of("s1") is None


async def test_heartbeat_refreshes_the_home_s_directory_entries(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("a", URL_A)
    await store.claim_session("s1", "a", ttl_s=30)
    await raw.pexpire(store.keys.session("s1"), 100)
    assert await store.heartbeat("a", URL_A)
    assert await raw.pttl(store.keys.session("s1")) > 29_000


async def test_a_session_claimed_elsewhere_leaves_its_old_home(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    await store.claim_session("s1", "a", ttl_s=30)
    await store.claim_session("s1", "b", ttl_s=5)
    assert await store.heartbeat("a", URL_A)
    assert list(await raw.hkeys(store.keys.sessions("a"))) == []
    assert not await store.release_session("s1", "a")
    assert await store.home_of("s1") == "b"
    assert await raw.pttl(store.keys.session("s1")) <= 5_000


async def test_leases_up_to_the_cap_then_back(store: Store) -> None:
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    a, b = Leaser(store, "a"), Leaser(store, "b")
    assert await a.acquire(cap=3)
    assert await b.acquire(cap=3)
    assert await a.acquire(cap=3)
    assert not await b.acquire(cap=3)
    assert await store.leases() == {"a": 2, "b": 1}
    assert await a.release()
    assert await b.acquire(cap=3)
    assert await b.release()
    assert await b.release()
    assert not await b.release()
    assert await store.leases() == {"a": 1, "b": 0}


async def test_a_heartbeat_can_set_the_lease_count(store: Store, raw: coredis.Redis[str]) -> None:
    """The node knows how many sessions it holds: a lost release, or a Redis that came
    back empty, heals at its next heartbeat."""
    await store.register("a", URL_A)
    a = Leaser(store, "a")
    for _ in range(3):
        assert await a.acquire(cap=10)
    assert await store.heartbeat("a", URL_A, leases=1)
    assert await store.leases() == {"a": 1}
    assert await raw.pttl(store.keys.leases("a")) > 0
    assert await store.heartbeat("a", URL_A)  # without a count: kept as it is
    assert await store.leases() == {"a": 1}
    await raw.flushdb()  # Redis restarted empty
    assert not await store.heartbeat("a", URL_A, leases=2)
    assert await store.leases() == {"a": 2}
    with pytest.raises(ValueError):
        await store.heartbeat("a", URL_A, leases=-1)


async def test_forget_returns_a_node_s_leases_at_once(store: Store) -> None:
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    assert await store.acquire_lease("a", cap=1, count=1)
    assert not await store.acquire_lease("b", cap=1, count=1)
    await store.forget("a")
    assert await store.acquire_lease("b", cap=1, count=1)


async def test_concurrent_acquires_never_overshoot(redis_server: RedisServer, store: Store) -> None:
    """3 nodes, each its own client, 50 concurrent acquires each, cap 40: exactly 40."""
    granted: list[str] = []

    async def node(name: str) -> None:
        async with open_store(redis_server.url, timeout_s=5) as mine:
            mine.sign_with(SECRET)
            await mine.register(name, f"ws://{name}")
            leaser = Leaser(mine, name)

            async def one() -> None:
                if await leaser.acquire(cap=40):
                    granted.append(name)

            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(one)

    async with trio.open_nursery() as nursery:
        for name in ("n0", "n1", "n2"):
            nursery.start_soon(node, name)
    assert len(granted) == 40
    leases = await store.leases()
    assert sum(leases.values()) == 40
    assert leases == {name: granted.count(name) for name in ("n0", "n1", "n2")}


async def _all_unavailable(store: Store) -> None:
    calls = [
        lambda: store.register("a", URL_A),
        lambda: store.heartbeat("a", URL_A),
        store.nodes,
        lambda: store.forget("a"),
        lambda: store.claim_session("s1", "a", ttl_s=30),
        lambda: store.home_of("s1"),
        lambda: store.release_session("s1", "a"),
        lambda: store.acquire_lease("a", cap=10, count=1),
        lambda: store.set_leases("a", 0),
        store.leases,
    ]
    failed: list[int] = []

    async def one(i: int) -> None:
        with pytest.raises(StoreUnavailable):
            await calls[i]()
        failed.append(i)

    # All at once, so that a hung Redis costs one timeout, not ten.
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(one, i)
    assert trio.current_time() - started < TIMEOUT_S + 0.25
    assert sorted(failed) == list(range(len(calls)))


async def test_redis_down_raises_within_the_timeout_and_recovers(
    redis_server: RedisServer, store: Store
) -> None:
    await store.register("a", URL_A)
    with redis_server.stopped():
        await _all_unavailable(store)
    # Without persistence the restarted Redis is empty: the node's heartbeat says so.
    assert not await store.heartbeat("a", URL_A)
    assert await store.nodes() == {"a": URL_A}


async def test_redis_hung_raises_within_the_timeout_and_answers_right_after(
    redis_server: RedisServer, store: Store
) -> None:
    """A Redis that accepts but does not answer (SIGSTOP); after SIGCONT, the answers
    to the abandoned calls must not be taken for the answers to the next ones."""
    await store.register("a", URL_A, ttl_s=60)
    await store.claim_session("s1", "a", ttl_s=60)
    assert redis_server.process is not None
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        await _all_unavailable(store)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await store.home_of("s1") == "a"
    assert await store.home_of("s2") is None
    assert await store.nodes() == {"a": URL_A}
    # The abandoned acquire (1) and set_leases (0) both ran, in whichever order Redis
    # read their connections: either is the count now; a new one is read back as such.
    assert await store.leases() in ({"a": 0}, {"a": 1})
    await store.set_leases("a", 2)
    assert await store.leases() == {"a": 2}
