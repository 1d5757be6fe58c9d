"""Resume on any node (docs/cluster.md): a resume that reaches a node other than the session's
home is relayed there; one whose home is gone is refused ``node_lost``.

Real ``trio-duplex serve`` processes on 127.0.0.1, a real redis-server, and clients we
did not write: ``websockets`` and curl. Real time passes only where a killed node's
membership lapsing (Redis's TTL clock) is what is tested, polled against a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import ClientConnection, connect

from trio_duplex.cluster.relay import HEADER, RELAY_PATH, RelayKeys, ReplayCache, sign, verify
from trio_duplex.cluster.store import HEARTBEAT_INTERVAL_S, LEASE_TTL_S, Store

from ..helpers import ServerProcess
from .conftest import SECRET, RedisServer
from .test_serve import LOST_BOUND_S, MEMBERSHIP_BOUND_S, TIMEOUT, until

pytestmark = pytest.mark.integration

Event = dict[str, Any]


@asynccontextmanager
async def ws_to(url: str, credential: str | None = None) -> AsyncIterator[ClientConnection]:
    headers = None if credential is None else {"Authorization": f"Bearer {credential}"}
    async with connect(
        url,
        additional_headers=headers,
        proxy=None,
        compression=None,
        open_timeout=TIMEOUT,
        close_timeout=TIMEOUT,
    ) as ws:
        yield ws


async def receive(ws: ClientConnection) -> Event:
    with trio.fail_after(TIMEOUT):
        message = await ws.recv()
    assert isinstance(message, str), message
    event: Event = json.loads(message)
    return event


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def closed_with(ws: ClientConnection) -> tuple[list[Event], int | None]:
    """Every event until the server closes, and its close code."""
    seen: list[Event] = []
    try:
        while True:
            seen.append(await receive(ws))
    except ConnectionClosed as exc:
        return seen, None if exc.rcvd is None else exc.rcvd.code


async def open_session(ws: ClientConnection) -> Event:
    """Open a session on ``ws`` (an empty configuration): its ``session.created``."""
    await send(ws, {"type": "session.update", "session": {}})
    created = await receive(ws)
    assert created["type"] == "session.created", created
    return created


def drop(ws: ClientConnection) -> None:
    """Cut the TCP connection without a close frame (a phone losing its network)."""
    ws.stream.socket.close()  # type: ignore[attr-defined]


def text(seq: int, words: str) -> Event:
    return {"type": "input.text.append", "client_event_seq": seq, "text": words}


def resume(created: Event, token: str, last: int) -> Event:
    return {
        "type": "session.resume",
        "session_id": created["session_id"],
        "resume_token": token,
        "last_received_server_event_seq": last,
    }


@pytest.fixture
def three(nodes: Callable[..., list[ServerProcess]]) -> list[ServerProcess]:
    return nodes("abc", "--relay-port", "0")


async def test_resume_on_another_node_is_relayed_with_replay_and_resend(
    three: list[ServerProcess], store: Store
) -> None:
    a, b, _ = three
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        await send(on_a, text(1, "one"))
        assert (await receive(on_a))["server_event_seq"] == 1
        await send(on_a, text(2, "two"))
        assert (await receive(on_a))["server_event_seq"] == 2  # read, but never acked
        drop(on_a)
    home = await store.locate(created["session_id"], "observer")
    assert (home.kind, home.node_id) == ("home", "a")
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(created, created["resume_token"], 1))
        resumed = await receive(on_b)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["attachment_generation"] == 2
        assert resumed["last_received_client_event_seq"] == 2
        replayed = await receive(on_b)
        assert (replayed["server_event_seq"], replayed["text"]) == (2, "two")
        await send(on_b, text(2, "two"))  # a resend of what was received: dropped
        await send(on_b, text(3, "three"))
        live = await receive(on_b)
        assert (live["server_event_seq"], live["text"]) == (3, "three")
        await send(on_b, {"type": "session.close"})
        events, code = await closed_with(on_b)
        assert [e["type"] for e in events] == ["session.closed"] and code == 1000


async def test_takeover_across_nodes(three: list[ServerProcess]) -> None:
    a, b, c = three
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        drop(on_a)
    async with ws_to(b.url) as first:
        await send(first, resume(created, created["resume_token"], 0))
        resumed = await receive(first)
        assert resumed["type"] == "session.resumed"
        async with ws_to(c.url) as second:
            # The token the first resume was issued, as a client whose first connection
            # hung would: the home (A) fences the first one off.
            await send(second, resume(created, resumed["resume_token"], 0))
            assert (await receive(second))["type"] == "session.resumed"
            events, code = await closed_with(first)
            assert [e["type"] for e in events] == ["session.replaced"] and code == 4000
            await send(second, text(1, "still here"))
            assert (await receive(second))["text"] == "still here"


async def test_a_lost_home_is_refused_node_lost_within_the_bound(
    three: list[ServerProcess], store: Store
) -> None:
    a, b, _ = three
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
    a.proc.kill()
    a.proc.wait(TIMEOUT)
    killed = trio.current_time()
    answers: list[tuple[Event, int | None]] = []
    while True:  # until the home's membership lapses: retryable, then node_lost
        async with ws_to(b.url) as on_b:
            await send(on_b, resume(created, created["resume_token"], 0))
            events, code = await closed_with(on_b)
        answers.append((events[0], code))
        if events[0]["code"] != "session_home_unreachable":
            break
        assert events[0]["retryable"] is True and code == 1013
        assert trio.current_time() - killed < LOST_BOUND_S + 2, answers
        await trio.sleep(0.25)  # polling another process's clock: Redis's TTL
    error, code = answers[-1]
    assert error["code"] == "session_resume_expired" and error["reason"] == "node_lost"
    assert error["retryable"] is False and code == 4001
    # Not before its leases lapsed: until then it may be only slow (a pause, a partition).
    assert LEASE_TTL_S - HEARTBEAT_INTERVAL_S <= trio.current_time() - killed < LOST_BOUND_S + 2


async def test_the_relay_endpoint_refuses_whoever_cannot_sign(three: list[ServerProcess]) -> None:
    a, _, _ = three
    relay_port = a.wait_for_line(r"registered \(advertised as ws://[^:]+:(\d+)", TIMEOUT)
    url = f"http://127.0.0.1:{relay_port.group(1)}{RELAY_PATH}"
    upgrade = ["-H", "Connection: Upgrade", "-H", "Upgrade: websocket"]
    upgrade += [
        "-H",
        "Sec-WebSocket-Version: 13",
        "-H",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ]
    keys = RelayKeys.derive(SECRET)
    forged = sign(RelayKeys.derive("not-the-cluster-secret-0000"), "b", "a", "sess_0", 0).header
    stale = sign(keys, "b", "a", "sess_0", time.time() - 3600).header
    elsewhere = sign(keys, "b", "c", "sess_0", time.time()).header  # signed for another node
    for extra in ([], ["-H", f"{HEADER}: {forged}"], ["-H", f"{HEADER}: {stale}"],
                  ["-H", f"{HEADER}: {elsewhere}"], ["-H", f"{HEADER}: v2 b a"]):  # fmt: skip
        answer = await trio.run_process(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *upgrade, *extra, url],
            capture_stdout=True,
            capture_stderr=True,
        )
        assert answer.stdout == b"403", (extra, answer.stdout, answer.stderr)
    assert SECRET not in a.log


async def test_a_relayed_connection_resumes_only_the_session_it_was_signed_for(
    three: list[ServerProcess],
) -> None:
    a, _, _ = three
    relay_port = a.wait_for_line(r"registered \(advertised as ws://[^:]+:(\d+)", TIMEOUT)
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
    signed = sign(RelayKeys.derive(SECRET), "b", "a", "sess_other", time.time()).header
    relay = f"ws://127.0.0.1:{relay_port.group(1)}{RELAY_PATH}"
    async with connect(
        relay, additional_headers={HEADER: signed}, proxy=None, open_timeout=TIMEOUT
    ) as ws:
        await send(ws, resume(created, created["resume_token"], 0))
        events, code = await closed_with(ws)
    assert events[0]["code"] == "unauthorized" and code == 1008
    with pytest.raises(InvalidStatus):  # and not on the main path either
        async with connect(relay.replace(RELAY_PATH, "/v1/duplex"), proxy=None):
            pass


def test_signatures_name_sender_receiver_session_and_time() -> None:
    now = time.time()
    keys = RelayKeys.derive(SECRET)
    value = sign(keys, "b", "a", "sess_1", now).header

    def check(k: RelayKeys, values: list[str], receiver: str, at: float) -> str | None:
        accepted = verify(k, values, receiver, at, ReplayCache())  # a fresh cache each
        return None if accepted is None else accepted.session_id

    assert check(keys, [value], "a", now + 30) == "sess_1"
    assert check(keys, [value], "c", now) is None  # another receiver
    assert check(keys, [value], "a", now + 61) is None  # too old
    assert check(keys, [value], "a", now - 61) is None  # from the future
    assert check(RelayKeys.derive("another-secret-of-16+"), [value], "a", now) is None
    assert check(keys, [value.replace("sess_1", "sess_2")], "a", now) is None
    assert check(keys, [], "a", now) is None
    assert check(keys, [value, value], "a", now) is None  # the header twice
    assert check(keys, ["v2 b a sess_1 notanumber 00"], "a", now) is None
    assert SECRET not in value


async def test_with_api_keys_a_resume_token_resumes_through_any_node(
    nodes: Callable[..., list[ServerProcess]], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("app:key-0123456789abcdef\n")
    a, b = nodes("ab", "--relay-port", "0", "--api-key-file", str(keys))
    async with ws_to(a.url, "key-0123456789abcdef") as on_a:
        created = await open_session(on_a)
        drop(on_a)
    token = created["resume_token"]
    async with ws_to(b.url, token) as on_b:  # B knows nothing of this token: A does
        await send(on_b, resume(created, token, 0))
        assert (await receive(on_b))["type"] == "session.resumed"
    async with ws_to(b.url, "not-a-token") as stranger:  # let through to resume, no more
        await send(stranger, {"type": "session.update", "session": {}})
        events, code = await closed_with(stranger)
        assert events[0]["code"] == "unauthorized" and code == 1008
    async with ws_to(b.url, "not-a-token") as guesser:  # a token not its own credential
        await send(guesser, resume(created, token, 0))
        events, code = await closed_with(guesser)
        assert events[0]["code"] == "unauthorized" and code == 1008


async def test_after_redis_comes_back_empty_a_session_is_found_from_any_node_again(
    nodes: Callable[..., list[ServerProcess]], redis_server: RedisServer, store: Store
) -> None:
    a, b = nodes("ab", "--relay-port", "0")
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        with redis_server.stopped():  # no persistence: it comes back empty
            pass
        session_id = created["session_id"]

        async def found() -> bool:
            return (await store.locate(session_id, "observer")).kind == "home"

        # A's next heartbeat finds it lapsed, registers again and claims its sessions.
        await until(found, MEMBERSHIP_BOUND_S, "the session claimed again by its home")
        drop(on_a)
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(created, created["resume_token"], 0))
        assert (await receive(on_b))["type"] == "session.resumed"


async def test_the_relay_s_signature_stays_out_of_a_debug_log(
    nodes: Callable[..., list[ServerProcess]],
) -> None:
    a, b = nodes("ab", "--relay-port", "0", "--log-level", "debug")
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
        drop(on_a)
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(created, created["resume_token"], 0))
        assert (await receive(on_b))["type"] == "session.resumed"
    # The pooled peer connection's signed request (pool/) is never logged, nor its proof.
    assert f"{HEADER}: p1" not in b.log and f"{HEADER}: v2" not in b.log
    assert SECRET not in b.log and SECRET not in a.log
    assert "relaying its resume to its home node a" in b.log


async def test_many_relayed_sessions_share_one_peer_connection(
    three: list[ServerProcess],
) -> None:
    """Every resume B relays to A goes over the one pooled peer connection (pool/),
    each session's messages its own, both ways."""
    a, b, _ = three
    relay_port = int(a.wait_for_line(r"registered \(advertised as ws://[^:]+:(\d+)", TIMEOUT)[1])
    sessions = []
    for _ in range(12):
        async with ws_to(a.url) as on_a:
            sessions.append(await open_session(on_a))
            drop(on_a)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(ws_to(b.url)) for _ in sessions]
        for ws, created in zip(clients, sessions, strict=True):
            await send(ws, resume(created, created["resume_token"], 0))
        for ws in clients:
            assert (await receive(ws))["type"] == "session.resumed"
        for n, ws in enumerate(clients):
            await send(ws, text(1, f"session {n}"))
        for n, ws in enumerate(clients):
            echo = await receive(ws)
            assert echo["text"] == f"session {n}" and echo["server_event_seq"] == 1, echo
        to_a = [
            c
            for c in psutil.Process(b.proc.pid).net_connections("tcp")
            if c.raddr and c.raddr.port == relay_port and c.status == psutil.CONN_ESTABLISHED
        ]
        assert len(to_a) == 1, to_a


async def test_a_relayed_client_s_fragments_pings_and_bad_text_reach_the_home_as_sent(
    three: list[ServerProcess],
) -> None:
    """B passes the client's frames on to A as they came (pool/front.py): a message in
    fragments arrives whole, pings are answered, and text that is not UTF-8, which B
    does not check, is refused by A with 1007, which reaches the client; the session
    detaches, and neither it nor another relayed session is harmed."""
    a, b, _ = three
    sessions = []
    for _ in range(2):
        async with ws_to(a.url) as on_a:
            sessions.append(await open_session(on_a))
            drop(on_a)
    created, other = sessions
    async with ws_to(b.url) as on_b, ws_to(b.url) as bystander:
        await send(bystander, resume(other, other["resume_token"], 0))
        assert (await receive(bystander))["type"] == "session.resumed"
        await send(on_b, resume(created, created["resume_token"], 0))
        resumed = await receive(on_b)
        assert resumed["type"] == "session.resumed", resumed
        # Past the resume's read: a message in fragments, around pings.
        with trio.fail_after(TIMEOUT):
            await (await on_b.ping(b"before")).wait()
        whole = json.dumps(text(1, "in three fragments"))
        await on_b.send([whole[:7], whole[7:20], whole[20:]])
        with trio.fail_after(TIMEOUT):
            await (await on_b.ping(b"after")).wait()
        echo = await receive(on_b)
        assert (echo["server_event_seq"], echo["text"]) == (1, "in three fragments"), echo
        await on_b.send(b'{"type": "\xff"}', text=True)  # text that is not UTF-8
        events, code = await closed_with(on_b)
        assert events == [] and code == 1007
        # The other session relayed over the same peer connection goes on.
        await send(bystander, text(1, "still here"))
        assert (await receive(bystander))["text"] == "still here"
    # The session detached (not broken): it resumes, its input counted once.
    async with ws_to(a.url) as on_a:
        await send(on_a, resume(created, resumed["resume_token"], 0))
        again = await receive(on_a)
        assert again["type"] == "session.resumed", again
        assert again["last_received_client_event_seq"] == 1
        replayed = await receive(on_a)
        assert (replayed["server_event_seq"], replayed["text"]) == (1, "in three fragments")
    assert "client fault" in a.log and "1007" in a.log  # the home's WebSocket found it
    assert "client fault" not in b.log  # the front did not decode it
