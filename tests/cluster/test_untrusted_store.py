"""The store is not trusted (docs/cluster.md): what someone who can write to Redis, but does not
hold the cluster secret, can do to a node through the store. A real redis-server; the
tampering goes behind the store's back through a plain client."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import coredis
import pytest
import trio

from trio_duplex.cluster.signed import Sealer, payload_of
from trio_duplex.cluster.store import ClusterRefused, Store, open_store

from .conftest import SECRET, TIMEOUT_S, RedisServer, _answers_ping, _free_port
from .test_store import URL_A, URL_B, Leaser

EVIL = "ws://attacker.example:9000"
OTHER = Sealer.of("not-the-cluster-secret-0123")
FAR = 4_000_000_000_000  # an expiry far in the future (ms)


async def test_a_forged_directory_entry_is_ignored(store: Store, raw: coredis.Redis[str]) -> None:
    """The review's attack: session -> a node of the attacker's, whose URL is theirs."""
    await store.register("a", URL_A)
    await store.claim_session("s1", "a", ttl_s=30)
    before = store.complaints.count
    for forged in ("evil", OTHER.seal(store.keys.session("s1"), "evil", FAR)):
        await raw.set(store.keys.session("s1"), forged)
        await raw.set(store.keys.node("evil"), OTHER.seal(store.keys.node("evil"), EVIL, FAR))
        await raw.sadd(store.keys.nodes, ["evil"])
        assert (await store.locate("s1", "b")).kind == "unknown"
        assert await store.home_of("s1") is None
    assert "evil" not in await store.nodes()
    assert store.complaints.count > before


async def test_a_real_entry_pointed_at_a_forged_url_is_not_relayed_to(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("a", URL_A)
    await store.claim_session("s1", "a", ttl_s=30)
    await raw.set(store.keys.node("a"), OTHER.seal(store.keys.node("a"), EVIL, FAR), px=3000)
    located = await store.locate("s1", "b")
    assert (located.kind, located.node_id, located.url) == ("stalled", "a", None)
    assert await store.nodes() == {}


async def test_a_value_moved_to_another_key_is_ignored(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("a", URL_A)
    await store.register("evil", EVIL)
    await store.claim_session("mine", "evil", ttl_s=30)
    # The attacker's own session's entry (sealed by a real node) copied onto the victim's.
    copied = await raw.get(store.keys.session("mine"))
    assert copied is not None
    await raw.set(store.keys.session("victim"), copied)
    assert (await store.locate("victim", "a")).kind == "unknown"
    url = await raw.get(store.keys.node("evil"))
    assert url is not None
    await raw.set(store.keys.node("a"), url, px=3000)  # a's URL replaced by evil's
    assert await store.nodes() == {"evil": EVIL}


async def test_an_expired_seal_is_ignored(store: Store) -> None:
    await store.register("a", URL_A)
    store.wall_clock = lambda: 1_000_000.0  # 1970: sealed long ago, replayed now
    await store.claim_session("s1", "a", ttl_s=30)
    store.wall_clock = time.time
    assert (await store.locate("s1", "b")).kind == "unknown"


async def test_a_hand_written_migration_record_is_not_taken(
    store: Store, raw: coredis.Redis[str]
) -> None:
    await store.register("b", URL_B)
    key = store.keys.migration("s1")
    record = base64.b64encode(b"tdmig:{}").decode()
    for forged in (record, OTHER.seal(key, record, FAR)):
        await raw.set(key, forged)
        assert (await store.locate("s1", "b")).kind == "unknown"
        assert not await raw.exists([store.keys.migration_claim("s1")])  # claim given back
    journal = b'tdmig:{"text": "what the user said"}'
    await store.hand_over("s1", "a", journal, ttl_s=30)  # a node's own: taken
    stored = await raw.get(key)
    assert stored is not None and b"user" not in base64.b64decode(payload_of(stored))
    found = await store.locate("s1", "b")
    assert (found.kind, found.record) == ("migrated", journal)


async def test_a_forged_lease_count_never_lets_a_session_in(
    store: Store, raw: coredis.Redis[str]
) -> None:
    """Deflating: b holds the cap; the attacker writes b's count as 0 (unsealed, sealed
    with another secret, or garbage). a is refused every time, and a's own count stays
    what a holds."""
    await store.register("a", URL_A)
    await store.register("b", URL_B)
    a, b = Leaser(store, "a"), Leaser(store, "b")
    assert await b.acquire(cap=2)
    assert await b.acquire(cap=2)
    leases = store.keys.leases("b")
    for forged in ("0", OTHER.seal(leases, "0", FAR), "v1.1.zz.0", "v1.99.x"):
        await raw.set(leases, forged, px=10_000)
        assert not await a.acquire(cap=2)
        assert (await store.leases()).get("a") == 0
    await raw.delete([leases])  # b is still a member: its count was taken away
    assert not await a.acquire(cap=2)
    assert (await store.leases()).get("a") == 0
    # Inflating only refuses: a count over the cap.
    await raw.set(leases, Sealer.of(SECRET).seal(leases, "999", FAR), px=10_000)
    assert not await a.acquire(cap=2)


async def test_stale_node_ids_are_pruned_once_their_leases_lapse(
    store: Store, raw: coredis.Redis[str]
) -> None:
    """Real time: Redis's TTL clock. 2,000 crashed nodes' ids, one live node, one that
    lapsed but whose leases still live (pruning it would stop its leases counting)."""
    for i in range(2000):
        await raw.sadd(store.keys.nodes, [f"dead-{i}"])
    await store.register("live", URL_A)
    await store.register("slow", URL_B, ttl_s=0.1, lease_ttl_s=30)
    await trio.sleep(0.2)
    first = await store.prune(sample=1000)  # each call is bounded: a random 1,000
    assert 998 <= first <= 1000
    assert first + await store.prune(sample=5000) == 2000
    assert set(await raw.smembers(store.keys.nodes)) == {"live", "slow"}
    assert await store.leases() == {"live": 0, "slow": 0}
    # An acquire prunes as it counts, too (a cluster's first open after a crash loop).
    await raw.sadd(store.keys.nodes, ["dead-x"])
    assert await store.acquire_lease("live", cap=5, count=1)
    assert set(await raw.smembers(store.keys.nodes)) == {"live", "slow"}


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[str]:
    """A redis-server in cluster mode (one node, no slots assigned: enough to be seen)."""
    executable = shutil.which("redis-server")
    assert executable is not None
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(executable, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
            # Its bus on a free port of its own (the default, port + 10000, may not be).
            *("--cluster-enabled", "yes", "--cluster-port", str(_free_port())),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while not _answers_ping(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)  # polling another process's start
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


async def test_a_redis_cluster_is_refused(redis_cluster: str, redis_server: RedisServer) -> None:
    async with open_store(redis_cluster, timeout_s=TIMEOUT_S) as store:
        with pytest.raises(ClusterRefused, match="cluster_enabled:1"):
            await store.refuse_a_redis_cluster()
    async with open_store(redis_server.url, timeout_s=TIMEOUT_S) as store:
        await store.refuse_a_redis_cluster()  # standalone: fine


async def test_a_heartbeat_says_whether_the_node_s_leases_outlived_its_silence(
    store: Store,
) -> None:
    """Real time: Redis's TTL clock (0.1 s membership, 1.5 s leases). Each wait is a
    lower bound, but for the first beat's, which has 1.35 s to spare."""
    await store.register("a", URL_A, ttl_s=0.1, lease_ttl_s=1.5)
    await trio.sleep(0.15)
    beat = await store.heartbeat("a", URL_A, ttl_s=0.1, leases=1, lease_ttl_s=1.5)
    assert (bool(beat), beat.leases_kept) == (False, True)  # lapsed, but kept its place
    await trio.sleep(1.7)
    beat = await store.heartbeat("a", URL_A, ttl_s=0.1, leases=1, lease_ttl_s=1.5)
    assert (bool(beat), beat.leases_kept) == (False, False)
    assert await store.heartbeat("a", URL_A)
