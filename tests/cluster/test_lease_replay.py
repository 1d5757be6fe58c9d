"""Admission against a store that replays or deletes lease counts, and a deploy at the
cap (docs/cluster.md): ``--cluster-max-sessions`` is not exceeded by a count replayed at its key,
by a member's keys deleted, or by sessions moving from a draining node.

Real time passes where a lease value expiring by Redis's clock is what is tested (TTLs
of a fraction of a second), and the deploy runs over real ``serve`` processes, polled
against a deadline.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Any

import coredis
import pytest
import trio

from trio_duplex.cluster.leases import Peers
from trio_duplex.cluster.store import Store, open_store

from ..helpers import ServerProcess
from .conftest import SECRET, TIMEOUT_S, RedisServer
from .test_relay import closed_with, open_session, receive, resume, send, text, ws_to
from .test_serve import TIMEOUT, http_get, until
from .test_store import URL_A, URL_B, Leaser
from .test_trust import first_answer

Event = dict[str, Any]


# -- what a node remembers (pure) -----------------------------------------------------------


def test_a_peer_s_older_value_is_refused_and_a_vanished_one_counts_until_it_expires() -> None:
    peers = Peers()
    assert peers.check("p", 2, version=20, expires_ms=1_000, now_ms=0)
    assert not peers.check("p", 1, version=10, expires_ms=1_000, now_ms=0)  # a replay
    assert peers.check("p", 2, version=20, expires_ms=1_000, now_ms=500)  # read again
    assert not peers.check("q", 0, version=5, expires_ms=99, now_ms=100)  # expired
    assert peers.remembered(now_ms=100, exclude="n") == [("p", 2)]
    assert peers.vanished("p", now_ms=1_000) == 2
    assert peers.vanished("p", now_ms=1_001) == 0  # expired: forgotten
    assert peers.remembered(now_ms=0, exclude="n") == []
    peers.check("p", 3, version=30, expires_ms=5_000, now_ms=0)
    assert not peers.left("p", version=29)  # an earlier process's tombstone
    assert peers.vanished("p", now_ms=0) == 3
    assert peers.left("p", version=31)
    assert peers.vanished("p", now_ms=0) == 0
    peers.check("p", 3, version=30, expires_ms=5_000, now_ms=0)
    assert peers.check("p", 1, version=7, expires_ms=9_000, now_ms=5_001)  # p's expired


# -- replayed counts --------------------------------------------------------------------------


async def test_a_replayed_older_count_counts_as_the_cap(
    store: Store, raw: coredis.Redis[str]
) -> None:
    """p holds 1 then 2 of a cap of 2; n reads p's 2 (refused). p's earlier count of 1,
    played again at its key (its seal still good), must not let n in."""
    cap = 2
    await store.register("p", URL_A)
    await store.register("n", URL_B)
    p, n = Leaser(store, "p"), Leaser(store, "n")
    key = store.keys.leases("p")
    assert await p.acquire(cap)
    older = await raw.get(key)
    assert older is not None
    assert await p.acquire(cap)
    assert not await n.acquire(cap)  # 2 + 1: n has seen p's count of 2
    await raw.set(key, older, px=10_000)
    assert not await n.acquire(cap)
    assert store.complaints.count >= 1
    await raw.set(key, older, px=10_000)
    assert (await store.leases()).get("n") == 0


async def test_a_fresh_node_refuses_a_count_older_than_a_lease_ttl(
    store: Store, raw: coredis.Redis[str], redis_server: RedisServer
) -> None:
    """A node that never saw p (just started) cannot tell a replay by its version; p's
    count sealed more than one lease TTL ago, by Redis's clock, is refused all the same
    (not kept for the 60 s allowance nodes' clocks get)."""
    cap = 2
    await store.register("p", URL_A, lease_ttl_s=0.3)
    key = store.keys.leases("p")
    p = Leaser(store, "p", lease_ttl_s=0.3)
    assert await p.acquire(cap)
    older = await raw.get(key)
    assert older is not None
    p.lease_ttl_s = 30
    assert await p.acquire(cap)
    expires_ms = int(older.split(".")[1])

    async def expired() -> bool:  # by Redis's clock
        return (await raw.time()).timestamp() * 1000 > expires_ms

    await until(expired, 2.0, "the older count's seal expired")
    await raw.set(key, older, px=10_000)
    async with open_store(redis_server.url, timeout_s=TIMEOUT_S) as fresh:
        fresh.sign_with(SECRET)
        await fresh.register("m", URL_B)
        assert not await Leaser(fresh, "m").acquire(cap)
        assert (await fresh.leases()).get("m") == 0


# -- deleted counts ---------------------------------------------------------------------------


async def test_a_deleted_member_s_leases_count_until_their_ttl(
    store: Store, raw: coredis.Redis[str]
) -> None:
    """p holds 2 of a cap of 3 (leases for 1 s); n, having read them, holds 1. p's node
    key, count and id deleted: n still counts p's 2 until their seal expires, by Redis's
    clock; then p's place is free (as if p had crashed)."""
    cap = 3
    await store.register("p", URL_A, lease_ttl_s=1.0)
    await store.register("n", URL_B)
    p, n = Leaser(store, "p", lease_ttl_s=1.0), Leaser(store, "n")
    assert await p.acquire(cap)
    assert await p.acquire(cap)
    assert await n.acquire(cap)
    deleted = trio.current_time()
    await raw.delete([store.keys.node("p"), store.keys.leases("p")])
    await raw.srem(store.keys.nodes, ["p"])
    assert not await n.acquire(cap)
    assert (await store.leases()) == {"n": 1}

    async def admitted() -> bool:
        return await n.acquire(cap)

    await until(admitted, 3.0, "p's place freed once its leases expired")
    assert trio.current_time() - deleted >= 0.5


async def test_a_node_remembers_its_peers_counts_from_its_heartbeats(
    store: Store, raw: coredis.Redis[str], redis_server: RedisServer
) -> None:
    """A node that just started and has only heartbeated (no open yet) has read p's
    count: p's keys deleted before its first open do not hide p's leases from it."""
    cap = 2
    await store.register("p", URL_A)
    p = Leaser(store, "p")
    assert await p.acquire(cap)
    assert await p.acquire(cap)
    async with open_store(redis_server.url, timeout_s=TIMEOUT_S) as fresh:
        fresh.sign_with(SECRET)
        await fresh.register("n", URL_B)
        await fresh.heartbeat("n", URL_B, leases=0)
        await raw.delete([store.keys.node("p"), store.keys.leases("p")])
        await raw.srem(store.keys.nodes, ["p"])
        assert not await Leaser(fresh, "n").acquire(cap)


async def test_a_member_that_left_frees_its_leases_at_once(store: Store) -> None:
    """Its tombstone says it left: the remembered count no longer counts."""
    cap = 2
    await store.register("p", URL_A)
    await store.register("n", URL_B)
    p, n = Leaser(store, "p"), Leaser(store, "n")
    assert await p.acquire(cap)
    assert await p.acquire(cap)
    assert not await n.acquire(cap)
    await store.forget("p")
    assert await n.acquire(cap)
    assert await n.acquire(cap)


async def test_an_earlier_process_s_tombstone_does_not_free_its_successor(
    store: Store, raw: coredis.Redis[str]
) -> None:
    """p left (its tombstone), came back with the same id and holds 2 of a cap of 2; its
    keys deleted and the old tombstone played back must not free p's place."""
    cap = 2
    await store.register("p", URL_A)
    await store.register("n", URL_B)
    await store.forget("p")
    tombstone = await raw.get(store.keys.left("p"))
    assert tombstone is not None
    await store.register("p", URL_A)
    p, n = Leaser(store, "p"), Leaser(store, "n")
    assert await p.acquire(cap)
    assert await p.acquire(cap)
    assert not await n.acquire(cap)
    await raw.delete([store.keys.node("p"), store.keys.leases("p")])
    await raw.srem(store.keys.nodes, ["p"])
    await raw.set(store.keys.left("p"), tombstone, px=10_000)
    assert not await n.acquire(cap)


async def test_a_lapsed_node_registers_again_with_its_count(store: Store) -> None:
    """A node seen gone registers again holding what it holds: never a count of 0 that
    another node could admit against in between."""
    await store.register("p", URL_A, leases=2)
    await store.register("n", URL_B)
    assert await store.leases() == {"n": 0, "p": 2}
    assert not await Leaser(store, "n").acquire(2)


# -- a deploy at the cap ----------------------------------------------------------------------


def live_sessions(node: ServerProcess) -> int:
    metrics = http_get(node.port, "/metrics")[1]
    found = re.findall(r'^trio_duplex_sessions\{state="[a-z_]+"\} ([0-9.]+)$', metrics, re.M)
    return int(sum(float(value) for value in found))


@pytest.mark.integration
async def test_a_deploy_at_the_cap_never_holds_more_than_the_cap(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    """Cap 2, both sessions on a; SIGTERM a. Their records hold their leases in transit:
    an open on b is refused until a session's record is adopted (and then too: the
    adopted one holds its slot) or expires; each resume on b is admitted at the cap."""
    cap, grace = 2, 4
    a, b = nodes(
        "ab",
        *("--relay-port", "0", "--cluster-max-sessions", str(cap)),
        *("--disconnect-grace", str(grace)),
    )
    created: list[Event] = []

    async def one(words: str, ready: trio.Event) -> None:
        async with ws_to(a.url) as ws:
            created.append(await open_session(ws))
            await send(ws, text(1, words))
            assert (await receive(ws))["text"] == words
            ready.set()
            events, code = await closed_with(ws)
            assert (events[-1]["type"], code) == ("session.going_away", 1001), events

    async def opens_on_b() -> str:
        answer = await first_answer(b.url, {"type": "session.update", "session": {}})
        return str(answer.get("code", answer["type"]))

    async with trio.open_nursery() as nursery:
        ready = [trio.Event() for _ in range(cap)]
        for words, flag in zip(("one", "two"), ready, strict=True):
            nursery.start_soon(one, words, flag)
        with trio.fail_after(TIMEOUT):
            for flag in ready:
                await flag.wait()
        assert await opens_on_b() == "resource_exhausted"
        a.proc.send_signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    # a has left (its leases gone with it): the two records hold the two slots.
    assert await store.in_transit() == cap
    assert await store.leases() == {"b": 0}
    assert await opens_on_b() == "resource_exhausted"

    first = created[0]
    # The resumed session stays attached to the end: it holds its slot whatever the
    # machine's pace (detached, its grace could lapse while the test waits below).
    async with ws_to(b.url) as ws:
        await send(ws, resume(first, first["resume_token"], 1))
        answer = await receive(ws)
        assert answer["type"] == "session.resumed", answer
        assert (await store.in_transit(), await store.leases()) == (1, {"b": 1})
        assert await opens_on_b() == "resource_exhausted"
        assert live_sessions(b) == 1

        async def expired() -> bool:
            return await store.in_transit() == 0

        await until(expired, grace + 2, "the second record expired")
        assert await opens_on_b() == "session.created"  # its slot is free
        assert await opens_on_b() == "resource_exhausted"
        assert live_sessions(b) <= cap
        assert sum((await store.leases()).values()) <= cap
