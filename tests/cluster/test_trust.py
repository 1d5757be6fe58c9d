"""Trust boundaries of cluster mode (docs/cluster.md), over real ``trio-duplex serve --cluster``
processes and a real redis-server: what a writer to Redis without the cluster secret
can do to the nodes, one tenant's drain, and a home that is only slow.

Real time passes where a node's membership or leases lapsing (Redis's TTL clock) or a
SIGSTOPped process is what is tested, polled against a deadline.
"""

from __future__ import annotations

import base64
import functools
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import coredis
import pytest
import trio
from trio.testing import MockClock
from websockets.exceptions import ConnectionClosed

from trio_duplex.cluster.node import ClusterNode
from trio_duplex.cluster.signed import CLOCK_ALLOWANCE_MS
from trio_duplex.cluster.store import NODE_TTL_S, Store
from trio_duplex.core.credentials import digest
from trio_duplex.core.migration import JournalRecord, Record

from ..helpers import ServerProcess, serve_command
from .conftest import SECRET, RedisServer
from .test_relay import closed_with, drop, open_session, receive, resume, send, text, ws_to
from .test_serve import LOST_BOUND_S, TIMEOUT, until
from .test_untrusted_store import redis_cluster  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration

Event = dict[str, Any]
DEEP = "tests.cluster.deep_config_engine:DeepConfigEcho"


async def first_answer(url: str, event: Event, credential: str | None = None) -> Event:
    """Send ``event`` as a connection's first message: the first event back."""
    async with ws_to(url, credential) as ws:
        await send(ws, event)
        try:
            return await receive(ws)
        except ConnectionClosed:
            return {"type": "closed"}


# -- the store is not trusted ------------------------------------------------------------


async def test_a_forged_directory_entry_does_not_send_the_resume_to_the_attacker(
    nodes: Callable[..., list[ServerProcess]], raw: coredis.Redis[str], store: Store
) -> None:
    a, b = nodes("ab", "--relay-port", "0")
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        drop(on_a)
    sid = created["session_id"]
    reached: list[str] = []

    async def attacker(stream: trio.SocketStream) -> None:
        reached.append("connected")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, attacker, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        # What the review wrote: the session's home is a node whose URL is the attacker's.
        await raw.set(store.keys.session(sid), "evil", px=60_000)
        await raw.set(store.keys.node("evil"), f"ws://127.0.0.1:{port}/v1/duplex", px=60_000)
        await raw.sadd(store.keys.nodes, ["evil"])
        answer = await first_answer(b.url, resume(created, created["resume_token"], 0))
        nursery.cancel_scope.cancel()
    assert reached == []
    assert answer["type"] == "error" and answer["code"] == "session_resume_expired", answer
    b.wait_for_line(r"ignored a directory entry at .*: it fails its check", TIMEOUT)
    assert SECRET not in b.log
    resumed = await first_answer(a.url, resume(created, created["resume_token"], 0))
    assert resumed["type"] == "session.resumed"  # still alive at home, untouched


def hand_written_record(session_id: str, token: str) -> bytes:
    """The review's record: principal bob, the attacker's token, a frame with a script."""
    return Record(
        session_id=session_id,
        config={},
        principal="bob",
        config_locked=False,
        current_digest=digest(token),
        pending_digest=None,
        generation=1,
        client_seq=0,
        consumed_seq=0,
        heard=False,
        usage={
            "events_in": 0,
            "bytes_in": 0,
            "events_out": 1,
            "bytes_out": 10,
            "resumes": 0,
            "audio_ms_in": None,
            "audio_ms_out": None,
        },
        journal=JournalRecord(1, 0, 0, ((1, '{"text":"<script>alert(1)</script>"}'),)),
        engine_state={"state": "echo/1", "unanswered": None},
    ).to_bytes()


async def test_a_hand_written_migration_record_is_never_adopted(
    nodes: Callable[..., list[ServerProcess]],
    raw: coredis.Redis[str],
    store: Store,
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("app:key-0123456789abcdef\n")
    (b,) = nodes("b", "--api-key-file", str(keys), "--cluster-max-sessions", "1")
    async with ws_to(b.url, "key-0123456789abcdef") as holder:
        await open_session(holder)  # the cluster is full
        token = "attacker-chosen-token-0123456789"
        record = base64.b64encode(hand_written_record("sess_forged", token)).decode()
        await raw.set(store.keys.migration("sess_forged"), record, px=60_000)
        forged = {"session_id": "sess_forged"}
        async with ws_to(b.url, token) as attacker:  # no API key: the token as credential
            await send(attacker, resume(forged, token, 0))
            events, _ = await closed_with(attacker)
    assert events and events[0]["type"] == "error", events
    assert events[0]["code"] == "session_resume_expired"
    assert all("<script>" not in str(e) for e in events)
    assert "taken over" not in b.log
    b.wait_for_line(r"ignored a migration record at .*: it fails its check", TIMEOUT)


async def test_a_resume_with_a_wrong_token_takes_nothing_over(
    nodes: Callable[..., list[ServerProcess]], raw: coredis.Redis[str], store: Store
) -> None:
    """The token is checked against the record before anything is restored or leased:
    a wrong one leaves the record where it is, for the session's own client."""
    a, b = nodes("ab", "--relay-port", "0")
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        await send(on_a, text(1, "before"))
        assert (await receive(on_a))["text"] == "before"
        a.proc.send_signal(signal.SIGTERM)
        events, code = await closed_with(on_a)
    assert events[-1]["type"] == "session.going_away" and code == 1001
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    sid = created["session_id"]
    wrong = await first_answer(b.url, resume(created, "not-the-token", 0))
    assert wrong["type"] == "error" and wrong["code"] == "invalid_resume_token", wrong
    assert await raw.exists([store.keys.migration(sid)]) == 1
    assert await raw.exists([store.keys.migration_claim(sid)]) == 0
    assert "taken over" not in b.log
    right = await first_answer(b.url, resume(created, created["resume_token"], 1))
    assert right["type"] == "session.resumed", right


# -- one session never stops a drain -----------------------------------------------------


async def test_one_session_whose_export_fails_does_not_stop_the_drain(
    nodes: Callable[..., list[ServerProcess]],
) -> None:
    a, b = nodes("ab", "--relay-port", "0", "--engine", DEEP)
    created: list[Event] = []
    ends: list[tuple[list[Event], int | None]] = []

    async def one(words: str, ready: trio.Event) -> None:
        async with ws_to(a.url) as ws:
            mine = await open_session(ws)
            created.append(mine)
            await send(ws, text(1, words))
            assert (await receive(ws))["text"] == words
            ready.set()
            events, code = await closed_with(ws)
            ends.append((events, code))
            if words == "deepen":
                created.remove(mine)

    async with trio.open_nursery() as nursery:
        ready = [trio.Event() for _ in range(3)]
        for words, flag in zip(("one", "deepen", "two"), ready, strict=True):
            nursery.start_soon(one, words, flag)
        with trio.fail_after(TIMEOUT):
            for flag in ready:
                await flag.wait()
        a.proc.send_signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    kinds = sorted((events[-1]["type"], events[-1].get("reason"), code) for events, code in ends)
    assert kinds == [
        ("session.closed", "server_shutdown", 1001),
        ("session.going_away", None, 1001),
        ("session.going_away", None, 1001),
    ], ends
    for mine in created:  # the two others moved
        answer = await first_answer(b.url, resume(mine, mine["resume_token"], 1))
        assert answer["type"] == "session.resumed", answer
    assert a.log.count("cannot be handed over") == 1, a.log
    assert "Traceback" not in a.log and "RecursionError" in a.log


async def test_a_hand_over_that_raises_ends_its_session_alone(
    nodes: Callable[..., list[ServerProcess]],
) -> None:
    """With no resume window (``--disconnect-grace 0``) the store refuses the record's
    TTL (ValueError, inside the hand-over): each session ends ``server_shutdown``, and the
    drain finishes, exit 0, with one line per session and no traceback."""
    (a,) = nodes("a", "--disconnect-grace", "0")
    ends: list[tuple[list[Event], int | None]] = []

    async def one(ready: trio.Event) -> None:
        async with ws_to(a.url) as ws:
            await open_session(ws)
            ready.set()
            ends.append(await closed_with(ws))

    async with trio.open_nursery() as nursery:
        ready = [trio.Event() for _ in range(2)]
        for flag in ready:
            nursery.start_soon(one, flag)
        with trio.fail_after(TIMEOUT):
            for flag in ready:
                await flag.wait()
        a.proc.send_signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    assert [(e[-1]["type"], e[-1].get("reason")) for e, _ in ends] == [
        ("session.closed", "server_shutdown")
    ] * 2, ends
    assert a.log.count("could not be handed over (ValueError") == 2, a.log
    assert "Traceback" not in a.log


# -- a slow home is not a dead home ------------------------------------------------------


async def test_a_paused_home_is_not_lost_and_the_cap_holds(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    """Real time: SIGSTOP the home for longer than its membership TTL (a GC pause, a
    partition). Meanwhile a resume through the other node is told to try again, never
    node_lost, and the other node admits nobody over the cap; after SIGCONT the session
    resumes."""
    cap = 3
    a, b = nodes("ab", "--relay-port", "0", "--cluster-max-sessions", str(cap))
    async with ws_to(a.url) as w1, ws_to(a.url) as w2, ws_to(a.url) as w3:
        for ws in (w1, w2):
            await open_session(ws)
        created = await open_session(w3)
        await send(w3, text(1, "heard"))  # (a client never heard from waits 5 s only)
        assert (await receive(w3))["text"] == "heard"
        drop(w3)
        a.proc.send_signal(signal.SIGSTOP)
        paused = trio.current_time()
        try:
            answers: list[str] = []

            async def lapsed() -> bool:
                return "a" not in await store.nodes()

            await until(lapsed, NODE_TTL_S + 2, "a's membership lapsed")
            while trio.current_time() - paused < NODE_TTL_S + 2:
                answer = await first_answer(b.url, resume(created, created["resume_token"], 0))
                answers.append(str(answer.get("code", answer["type"])))
                opened = await first_answer(b.url, {"type": "session.update", "session": {}})
                answers.append(str(opened.get("code", opened["type"])))
                await trio.sleep(0.25)  # polling a stopped process's place in Redis
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert set(answers) == {"session_home_unreachable", "resource_exhausted"}, answers

        async def resumes() -> bool:
            answer = await first_answer(b.url, resume(created, created["resume_token"], 0))
            return bool(answer["type"] == "session.resumed")

        await until(resumes, LOST_BOUND_S, "the session resumed through b")
        assert sum((await store.leases()).values()) == cap


# -- Redis Cluster --------------------------------------------------------------------


def test_serve_refuses_a_redis_cluster_with_exit_2(redis_cluster: str) -> None:  # noqa: F811
    result = subprocess.run(
        serve_command("--port", "0", "--cluster", redis_cluster, "--cluster-secret", SECRET),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a Redis Cluster" in lines[0], result.stderr


# -- the node index ---------------------------------------------------------------------


async def test_a_node_s_heartbeats_prune_the_node_index(
    store: Store, raw: coredis.Redis[str], redis_server: RedisServer
) -> None:
    for i in range(300):
        await raw.sadd(store.keys.nodes, [f"crashed-{i}"])
    await store.register("n", "ws://n")
    node = ClusterNode(store, "n", "ws://n", None, lambda: 0, secret=SECRET, directory_ttl_s=30)
    for _ in range(10):
        await node.beat()
    assert set(await raw.smembers(store.keys.nodes)) == {"n"}


async def test_a_home_seals_its_directory_entries_again_before_they_expire(
    mock_clock: MockClock, store: Store
) -> None:
    """An entry is sealed for twice its TTL; the home's heartbeat seals it again once one
    TTL has passed, so a session older than its seal is still found. Trio's clock and the
    seals' wall clock jump together (no real time passes: Redis's own TTLs are long)."""
    wall = [time.time()]
    store.wall_clock = lambda: wall[0]
    await store.register("n", "ws://n", ttl_s=600, lease_ttl_s=600)
    node = ClusterNode(
        store,
        "n",
        "ws://n",
        None,
        lambda: 0,
        session_ids=lambda: ["s1"],
        secret=SECRET,
        directory_ttl_s=30,
    )
    await node.claim("s1")
    expired_after = 2 * 30 + CLOCK_ALLOWANCE_MS / 1000
    for _ in range(3):
        mock_clock.jump(expired_after / 2 + 1)
        wall[0] += expired_after / 2 + 1
        await node.beat()
        assert await store.home_of("s1") == "n"
    wall[0] += expired_after + 1  # and without a heartbeat: no longer found
    assert await store.home_of("s1") is None
