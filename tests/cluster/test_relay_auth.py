"""The relay's mutual authentication (docs/cluster.md): a relayed resume's token reaches only a
node that proved it holds the cluster secret; a captured request cannot be replayed;
no relay header, however malformed, makes a traceback; with ``--relay-port`` the relay
path is served there only.

A fake home (a ``websockets`` server in the test, recording all it receives) stands for
the attacker a forged directory entry points at: once given to ``relay()`` directly
(so the check holds whatever the store says), once through ``trio-duplex serve``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request, Response
from websockets.trio.client import connect
from websockets.trio.server import ServerConnection, serve

from trio_duplex.cluster.pool import (
    MAX_PER_RESUME_HOMES,
    PER_RESUME_S,
    OldHome,
    Pool,
    Refused,
)
from trio_duplex.cluster.pool import relay as pooled_relay
from trio_duplex.cluster.relay import (
    HEADER,
    PROOF_HEADER,
    RELAY_PATH,
    RelayKeys,
    ReplayCache,
    Signed,
    pool_proof,
    proof,
    relay,
    sign,
    sign_pool,
    verify,
)
from trio_duplex.cluster.store import Store
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.server.sessions.websocket import WebSocket

from ..helpers import ServerProcess
from .conftest import SECRET
from .test_relay import closed_with, open_session, receive, resume, send, ws_to
from .test_serve import TIMEOUT

KEYS = RelayKeys.derive(SECRET)
ProofOf = Callable[[Request], list[str]]
"""What a fake home puts in its 101's proof header, given the request."""


def no_proof(_: Request) -> list[str]:
    return []


def proof_under(secret: str) -> ProofOf:
    """The proof a node holding ``secret`` would give (right only for the cluster's)."""

    def answer(request: Request) -> list[str]:
        _, sender, receiver, session_id, _, nonce, _ = request.headers[HEADER].split(" ")
        return [proof(RelayKeys.derive(secret), sender, receiver, session_id, nonce)]

    return answer


@attrs.define
class FakeHome:
    """A WebSocket server that records every request's headers and every message."""

    url: str
    headers: list[Headers] = attrs.field(factory=list)
    messages: list[str | bytes] = attrs.field(factory=list)

    def everything(self) -> str:
        seen = [str(h) for h in self.headers] + [str(m) for m in self.messages]
        return "\n".join(seen)


@asynccontextmanager
async def fake_home(answer: ProofOf, *, old_release: bool = False) -> AsyncIterator[FakeHome]:
    """``old_release``: it refuses a pooled peer connection's upgrade as a release before
    the pool does (403, no proof header: a ``p1`` request is not one it can check)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    home = FakeHome(f"ws://127.0.0.1:{port}/v1/duplex")

    def refuse(ws: ServerConnection, request: Request) -> Response | None:
        if old_release and request.headers.get(HEADER, "").startswith("p1 "):
            home.headers.append(request.headers)
            return ws.respond(403, "this endpoint takes resumes relayed by the nodes only\n")
        return None

    def respond(_: ServerConnection, request: Request, response: Response) -> Response:
        if response.status_code != 101:  # (refused above: recorded there)
            return response
        home.headers.append(request.headers)
        for value in answer(request):
            response.headers[PROOF_HEADER] = value
        return response

    async def handler(ws: ServerConnection) -> None:
        with trio.move_on_after(TIMEOUT):
            home.messages.append(await ws.recv())
        await ws.aclose(1000)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve(
                handler,
                listeners=listeners,
                process_request=refuse,
                process_response=respond,
                compression=None,
                task_status=task_status,
            )
        )
        async with server:
            yield home
            nursery.cancel_scope.cancel()


TOKEN = "rt_the-victims-resume-token-0123456789"
FIRST = (
    '{"type": "session.resume", "session_id": "sess_victim", '
    f'"resume_token": "{TOKEN}", "last_received_server_event_seq": 0}}'
)


async def relay_to(home: FakeHome) -> bool:
    """relay() from node "front" to "home" at the fake's URL, for a client whose other
    end nobody reads (the relay must not need it when it refuses)."""
    client_side, _ = trio.testing.memory_stream_pair()
    ws = WebSocket(client_side, 1 << 20)
    conn = Connection(ws, 1 << 20)
    signed = sign(KEYS, "front", "home", "sess_victim", time.time())
    with trio.fail_after(TIMEOUT):
        return await relay(
            conn,
            FIRST,
            home="home",
            url=home.url,
            signed=signed,
            connect_timeout_s=TIMEOUT,
            write_timeout_s=TIMEOUT,
        )


@pytest.mark.parametrize(
    "answer",
    [
        no_proof,
        proof_under("another-cluster-secret-00000"),
        lambda r: [*proof_under(SECRET)(r), *proof_under(SECRET)(r)],  # said twice
        lambda r: [proof_under(SECRET)(r)[0].upper()],  # not ours: hex, lower case
        lambda r: ["\xb2" * 64],
    ],
    ids=["none", "other-secret", "twice", "upper-case", "non-ascii"],
)
async def test_relay_sends_nothing_to_a_node_that_does_not_prove_the_secret(
    answer: ProofOf, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_home(answer) as home:
        relayed = await relay_to(home)
    assert relayed is False
    assert len(home.headers) == 1  # it was dialled (the directory pointed there)...
    assert home.messages == []  # ...and got no session.resume
    assert TOKEN not in home.everything()
    assert "did not prove it holds --cluster-secret" in caplog.text
    assert SECRET not in caplog.text


async def test_relay_sends_the_resume_to_a_node_that_proves_the_secret() -> None:
    async with fake_home(proof_under(SECRET)) as home:
        relayed = await relay_to(home)
    assert relayed is True
    assert home.messages == [FIRST]


def test_a_signed_request_is_taken_once_only() -> None:
    now = time.time()
    seen = ReplayCache()
    value = sign(KEYS, "b", "a", "sess_1", now).header
    first = verify(KEYS, [value], "a", now, seen)
    assert first is not None and first.session_id == "sess_1"
    assert verify(KEYS, [value], "a", now + 1, seen) is None  # played again
    again = sign(KEYS, "b", "a", "sess_1", now)  # a fresh nonce: fine
    assert verify(KEYS, [again.header], "a", now, seen) is not None


def test_the_proof_binds_nonce_nodes_and_session() -> None:
    signed = sign(KEYS, "b", "a", "sess_1", time.time(), nonce="0" * 32)
    assert signed.proven(proof(KEYS, "b", "a", "sess_1", "0" * 32))
    for other in (
        proof(KEYS, "b", "a", "sess_1", "1" * 32),  # another request's
        proof(KEYS, "c", "a", "sess_1", "0" * 32),
        proof(KEYS, "b", "c", "sess_1", "0" * 32),
        proof(KEYS, "b", "a", "sess_2", "0" * 32),
        proof(RelayKeys.derive("another-cluster-secret-00000"), "b", "a", "sess_1", "0" * 32),
    ):
        assert not signed.proven(other)
    assert not signed.proven(None) and not signed.proven("")
    assert SECRET not in repr(signed) and signed.header not in repr(signed)
    assert repr(KEYS) == "RelayKeys(<hidden>)"


def test_the_replay_cache_is_bounded_and_forgets_expired_nonces() -> None:
    seen = ReplayCache(limit=2)
    assert seen.add("a", expires=10, now=0) and seen.add("b", expires=20, now=0)
    assert not seen.add("c", expires=30, now=5)  # full: refused, not forgotten early
    assert seen.add("c", expires=30, now=11) and len(seen) == 2  # "a" expired
    assert not seen.add("b", expires=40, now=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=600), max_size=3))
def test_no_relay_header_makes_verify_raise(values: list[str]) -> None:
    assert verify(KEYS, values, "a", time.time(), ReplayCache()) is None


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 6),
    st.text(st.characters(codec="latin-1"), min_size=0, max_size=5000),
)
def test_no_field_of_a_signed_header_makes_verify_raise(field: int, junk: str) -> None:
    now = time.time()
    parts = sign(KEYS, "b", "a", "sess_1", now).header.split(" ")
    was, parts[field] = parts[field], junk
    accepted = verify(KEYS, [" ".join(parts)], "a", now, ReplayCache())
    assert accepted is None or junk == was


# -- through trio-duplex serve ---------------------------------------------------------


@pytest.fixture
def two(nodes: Callable[..., list[ServerProcess]]) -> list[ServerProcess]:
    return nodes("ab", "--relay-port", "0")


def relay_port(node: ServerProcess) -> int:
    return int(node.wait_for_line(r"registered \(advertised as ws://[^:]+:(\d+)", TIMEOUT)[1])


@pytest.mark.integration
async def test_a_forged_directory_entry_gets_no_resume_token(
    two: list[ServerProcess], store: Store
) -> None:
    """The store's seals (signed.py) already make a node ignore an entry written without
    the cluster secret; here the forged entries are sealed as a member would seal them
    (as if the store's check were bypassed), so that what holds is the relay's own
    check: the home it dials must prove it holds the secret before it hears anything."""
    a, b = two
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
    async with fake_home(no_proof) as evil:
        # The session's home is a node whose URL is the attacker's.
        await store.register("evil", evil.url, ttl_s=60)
        await store.claim_session(created["session_id"], "evil", 60)
        async with ws_to(b.url) as on_b:
            await send(on_b, resume(created, created["resume_token"], 0))
            events, code = await closed_with(on_b)
    assert evil.headers, "the front node did not dial the forged home"
    assert evil.messages == [] and created["resume_token"] not in evil.everything()
    assert events[0]["code"] == "session_home_unreachable" and code == 1013
    # (b logs it as it closes the connection: read its stderr up to that line)
    await trio.to_thread.run_sync(
        b.wait_for_line, "did not prove it holds --cluster-secret", TIMEOUT
    )


@pytest.mark.integration
async def test_a_captured_relay_request_is_refused_when_played_again(
    two: list[ServerProcess],
) -> None:
    a, _ = two
    async with ws_to(a.url) as on_a:
        created = await open_session(on_a)
    signed: Signed = sign(KEYS, "b", "a", created["session_id"], time.time())
    url = f"ws://127.0.0.1:{relay_port(a)}{RELAY_PATH}"
    headers = {HEADER: signed.header}
    async with connect(url, additional_headers=headers, proxy=None, open_timeout=TIMEOUT) as ws:
        assert ws.response is not None
        assert signed.proven(ws.response.headers.get(PROOF_HEADER))  # the home proved it
        await send(ws, resume(created, created["resume_token"], 0))
        assert (await receive(ws))["type"] == "session.resumed"
    with pytest.raises(InvalidStatus) as refused:  # the same request, captured and replayed
        async with connect(url, additional_headers=headers, proxy=None, open_timeout=TIMEOUT):
            pass
    assert refused.value.response.status_code == 403


def raw_upgrade(port: int, path: str, extra: bytes = b"") -> bytes:
    """An upgrade request with any bytes in its head; the status line of the answer."""
    head = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    ).encode() + extra
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(head + b"\r\n")
        return sock.recv(65536).split(b"\r\n", 1)[0]


@pytest.mark.integration
async def test_malformed_relay_headers_get_403_and_no_traceback(
    two: list[ServerProcess],
) -> None:
    a, _ = two
    port = relay_port(a)
    good = sign(KEYS, "b", "a", "sess_1", time.time()).header.encode()
    parts = good.split(b" ")
    bad = [
        b" ".join([*parts[:4], "²".encode("latin-1"), *parts[5:]]),  # passes isdigit()
        b" ".join([*parts[:4], b"9" * 5000, *parts[5:]]),  # int() refuses > 4300 digits
        b" ".join([*parts[:6], b"\xb2" * 64]),  # a non-ASCII MAC
        b" ".join([b"v1", *parts[1:4], "²".encode("latin-1"), b"\xe9" * 64]),  # the old form
        b"\xff" * 300,
    ]
    for value in bad:
        status = raw_upgrade(port, RELAY_PATH, b"%s: %s\r\n" % (HEADER.encode(), value))
        assert status == b"HTTP/1.1 403 Forbidden", (value[:80], status)
    # Two headers, each well-formed: refused too (which one would count?).
    twice = b"%s: %s\r\n" % (HEADER.encode(), good)
    assert raw_upgrade(port, RELAY_PATH, twice * 2) == b"HTTP/1.1 403 Forbidden"
    a.wait_for_line(r"client fault on .*: 403: a relay request not signed", TIMEOUT)
    assert "Traceback" not in a.log and "connection failed" not in a.log, a.log


@pytest.mark.integration
async def test_with_a_relay_port_the_main_listener_does_not_serve_the_relay_path(
    two: list[ServerProcess],
) -> None:
    a, _ = two
    assert raw_upgrade(a.port, RELAY_PATH) == b"HTTP/1.1 404 Not Found"
    assert raw_upgrade(relay_port(a), RELAY_PATH) == b"HTTP/1.1 403 Forbidden"
    # And a request the home would take on its relay port is refused on the main one.
    signed = sign(KEYS, "b", "a", "sess_1", time.time()).header.encode()
    header = b"%s: %s\r\n" % (HEADER.encode(), signed)
    assert raw_upgrade(a.port, RELAY_PATH, header) == b"HTTP/1.1 404 Not Found"


# -- the pooled relay's peer connections (pool/) ---------------------------------------


def pool_upgrade(port: int, header: str | None) -> tuple[bytes, dict[str, list[str]]]:
    """A pooled peer connection's upgrade, ``header`` as its relay header: the answer's
    status line and headers (names in lower case)."""
    extra = b"" if header is None else f"{HEADER}: {header}\r\n".encode("latin-1")
    head = (
        f"GET {RELAY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    ).encode() + extra
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(head + b"\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    status, _, rest = answer.partition(b"\r\n")
    headers: dict[str, list[str]] = {}
    for line in rest.split(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return status, headers


@pytest.mark.integration
async def test_a_pool_handshake_not_signed_for_this_node_gets_403(
    two: list[ServerProcess],
) -> None:
    a, _ = two
    port = relay_port(a)
    now = time.time()
    good = sign_pool(KEYS, "b", "a", now).header
    parts = good.split(" ")
    refused = [
        None,
        sign_pool(RelayKeys.derive("another-cluster-secret-00000"), "b", "a", now).header,
        sign_pool(KEYS, "b", "c", now).header,  # for another node
        sign_pool(KEYS, "b", "a", now - 3600).header,  # too old
        sign_pool(KEYS, "b", "a", now + 3600).header,  # from the future
        " ".join([*parts[:5], "0" * 64]),  # a MAC that is not its own
        " ".join([parts[0], "b", "a", "sess_1", *parts[3:]]),  # a session named: not p1's
        " ".join(["v2", *parts[1:]]),  # a resume's label on a pool request
        "p1 " + "\xb2" * 300,
    ]
    for header in refused:
        status, answer = pool_upgrade(port, header)
        assert status == b"HTTP/1.1 403 Forbidden", (header, status)
        assert PROOF_HEADER.lower() not in answer
    a.wait_for_line(r"client fault on .*: 403: a relay request not signed", TIMEOUT)
    assert "Traceback" not in a.log and SECRET not in a.log


@pytest.mark.integration
async def test_a_captured_pool_handshake_is_refused_when_played_again(
    two: list[ServerProcess],
) -> None:
    a, _ = two
    port = relay_port(a)
    signed = sign_pool(KEYS, "b", "a", time.time())
    status, answer = pool_upgrade(port, signed.header)
    assert status == b"HTTP/1.1 101 Switching Protocols", status
    (proved,) = answer[PROOF_HEADER.lower()]
    assert signed.proven(proved)  # the home proved it holds the secret
    # The proof is a pool's, bound to the nonce: it proves no resume's request.
    resume = sign(KEYS, "b", "a", "sess_1", time.time(), nonce=signed.header.split(" ")[4])
    assert not resume.proven(proved)
    status, answer = pool_upgrade(port, signed.header)  # captured and played again
    assert status == b"HTTP/1.1 403 Forbidden", status


def pool_proof_under(secret: str) -> ProofOf:
    def answer(request: Request) -> list[str]:
        _, sender, receiver, _, nonce, _ = request.headers[HEADER].split(" ")
        return [pool_proof(RelayKeys.derive(secret), sender, receiver, nonce)]

    return answer


@pytest.mark.parametrize(
    "answer",
    [no_proof, pool_proof_under("another-cluster-secret-00000")],
    ids=["none", "other-secret"],
)
async def test_the_pool_sends_nothing_to_a_node_that_does_not_prove_the_secret(
    answer: ProofOf, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_home(answer) as home, trio.open_nursery() as nursery:
        pool = Pool("front", KEYS, TIMEOUT, TIMEOUT, nursery=nursery)
        with pytest.raises(Refused, match="did not prove it holds --cluster-secret"):
            await pool.link_to("home", home.url)
        nursery.cancel_scope.cancel()
    assert len(home.headers) == 1 and home.messages == []
    assert not pool.links and SECRET not in caplog.text


async def test_the_pool_dials_a_node_that_proves_the_secret_once() -> None:
    async with fake_home(pool_proof_under(SECRET)) as home, trio.open_nursery() as nursery:
        pool = Pool("front", KEYS, TIMEOUT, TIMEOUT, nursery=nursery)
        first = await pool.link_to("home", home.url)
        assert await pool.link_to("home", home.url) is first  # kept, not dialled again
        assert pool.dialled == 1 and not first.broken
        nursery.cancel_scope.cancel()


# -- a home of a release before the pool (a rolling deploy) ------------------------------


async def pooled_relay_to(pool: Pool, home: FakeHome) -> bool:
    """The pooled relay() from ``pool``'s node "front" to "home" at the fake's URL."""
    client_side, _ = trio.testing.memory_stream_pair()
    conn = Connection(WebSocket(client_side, 1 << 20), 1 << 20)
    with trio.fail_after(TIMEOUT):
        return await pooled_relay(
            pool, conn, FIRST, home="home", url=home.url, session_id="sess_victim"
        )


def labels(home: FakeHome) -> list[str]:
    return [h[HEADER].split(" ")[0] for h in home.headers]


async def test_the_pooled_relay_falls_back_per_resume_to_a_home_of_an_older_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "trio_duplex")
    async with (
        fake_home(proof_under(SECRET), old_release=True) as home,
        trio.open_nursery() as nursery,
    ):
        pool = Pool("front", KEYS, TIMEOUT, TIMEOUT, nursery=nursery)
        assert await pooled_relay_to(pool, home) is True
        assert labels(home) == ["p1", "v2"]  # refused as an old release: per resume
        assert home.messages == [FIRST]  # ...to the home, which proved the secret
        assert pool.per_resume("home", home.url)
        assert await pooled_relay_to(pool, home) is True
        assert labels(home) == ["p1", "v2", "v2"]  # remembered: no pooled upgrade again
        assert home.messages == [FIRST, FIRST] and pool.dialled == 0 and not pool.links
        nursery.cancel_scope.cancel()
    assert "as a release before the pool does" in caplog.text
    assert SECRET not in caplog.text and TOKEN not in caplog.text


async def test_the_pooled_relay_to_an_old_release_still_needs_its_proof() -> None:
    async with (
        fake_home(no_proof, old_release=True) as home,
        trio.open_nursery() as nursery,
    ):
        pool = Pool("front", KEYS, TIMEOUT, TIMEOUT, nursery=nursery)
        assert await pooled_relay_to(pool, home) is False  # the v2 relay's own check
        nursery.cancel_scope.cancel()
    assert labels(home) == ["p1", "v2"] and home.messages == []


async def test_the_pooled_relay_never_falls_back_on_a_failed_proof() -> None:
    # A 101 without the pool's proof: a node without the secret, not an old release.
    async with fake_home(no_proof) as home, trio.open_nursery() as nursery:
        pool = Pool("front", KEYS, TIMEOUT, TIMEOUT, nursery=nursery)
        assert await pooled_relay_to(pool, home) is False
        assert not pool.per_resume("home", home.url)
        nursery.cancel_scope.cancel()
    assert labels(home) == ["p1"] and home.messages == []


async def test_homes_relayed_to_per_resume_are_remembered_for_a_while_and_bounded(
    mock_clock: trio.testing.MockClock,
) -> None:
    pool = Pool("front", KEYS, TIMEOUT, TIMEOUT)
    pool.remember_per_resume("old", "ws://old")
    with pytest.raises(OldHome):  # not dialled (there is no nursery to run a link)
        await pool.link_to("old", "ws://old")
    mock_clock.jump(PER_RESUME_S)
    assert not pool.per_resume("old", "ws://old")  # it may have been upgraded since
    with pytest.raises(Refused, match="leaving the cluster") as refused:
        await pool.link_to("old", "ws://old")  # tried as a pool again
    assert not isinstance(refused.value, OldHome)
    for n in range(MAX_PER_RESUME_HOMES + 1):
        pool.remember_per_resume(f"home-{n}", "ws://x")
    assert not pool.per_resume("home-0", "ws://x")  # the oldest forgotten
    assert all(pool.per_resume(f"home-{n}", "ws://x") for n in (1, MAX_PER_RESUME_HOMES))
    mock_clock.jump(PER_RESUME_S)
    pool.remember_per_resume("new", "ws://x")  # the expired ones go first
    assert pool.per_resume("new", "ws://x") and not pool.per_resume("home-1", "ws://x")
