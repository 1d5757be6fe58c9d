"""The upgrade's own parser and 101 (handshake.py: ``quick_request``, ``quick_accept``)
against websockets' ``ServerProtocol``: whatever they take, websockets parses to the
same request and answers with the same 101 (but for the clock's ``Date``); what they
do not take goes to websockets, which answers it as before. And the usual clients'
upgrades are taken."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from trio_duplex.server.front.handshake import quick_accept, quick_request

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
DATE = re.compile(rb"\r\nDate: [^\r\n]*\r\n")


def upgrade(*extra: str, key: str = KEY, target: str = "/v1/duplex") -> bytes:
    lines = [
        f"GET {target} HTTP/1.1",
        "Host: 127.0.0.1:8765",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass")


def websockets_answer(head: bytes, wanted: str | None) -> tuple[Request | None, bytes | None]:
    """What websockets makes of ``head``: its request (None: it refuses to parse it),
    and the bytes of its answer to it (its 101, or its refusal)."""

    def select(_: ServerProtocol, offered: object) -> Subprotocol | None:
        assert isinstance(offered, list)
        return Subprotocol(wanted) if wanted is not None and wanted in offered else None

    protocol = ServerProtocol(select_subprotocol=select)
    protocol.receive_data(head)
    events = protocol.events_received()
    if not events:
        return None, None
    request = events[0]
    assert isinstance(request, Request)
    protocol.send_response(protocol.accept(request))
    return request, b"".join(protocol.data_to_send())


def same_request(ours: Request, theirs: Request) -> None:
    assert (ours.method, ours.path, ours.protocol) == (theirs.method, theirs.path, theirs.protocol)
    assert list(ours.headers.raw_items()) == list(theirs.headers.raw_items())


def undated(answer: bytes) -> bytes:
    assert len(DATE.findall(answer)) == 1, answer
    return DATE.sub(b"\r\nDate: -\r\n", answer)


CLIENTS = {
    "websockets": upgrade(
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits",
        "User-Agent: Python/3.11 websockets/17.4",
    ),
    "websockets, no compression": upgrade("User-Agent: Python/3.11 websockets/17.4"),
    "browser": upgrade(
        "Pragma: no-cache",
        "Cache-Control: no-cache",
        "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)",
        "Origin: http://127.0.0.1:8765",
        "Accept-Encoding: gzip, deflate, br",
        "Accept-Language: en-GB,en;q=0.9,fr;q=0.8",
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits",
    ),
    "subprotocols": upgrade("Sec-WebSocket-Protocol: trio-duplex, trio-duplex.bearer.k-1"),
    "trio-websocket": upgrade().replace(b"Connection: Upgrade", b"Connection: keep-alive, Upgrade"),
    "a query": upgrade(target="/v1/realtime?model=gpt-realtime&autostart=1"),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wanted", [None, "trio-duplex"])
def test_the_usual_clients_upgrades_are_taken_and_answered_as_websockets_would(
    client: str, wanted: str | None
) -> None:
    head = CLIENTS[client]
    ours = quick_request(head)
    theirs, answer = websockets_answer(head, wanted)
    assert ours is not None and theirs is not None and answer is not None
    same_request(ours, theirs)
    mine = quick_accept(ours, wanted)
    assert mine is not None
    assert mine.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert undated(mine) == undated(answer)
    assert (b"Sec-WebSocket-Protocol: trio-duplex\r\n" in mine) == (
        client == "subprotocols" and wanted is not None
    )


def test_the_accept_key_is_rfc_6455s() -> None:
    # RFC 6455, section 1.3: the sample nonce and the value it must give.
    request = quick_request(upgrade())
    assert request is not None
    answer = quick_accept(request, None)
    assert answer is not None
    assert b"\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in answer


@pytest.mark.parametrize(
    "head",
    [
        upgrade("Content-Length: 0"),  # websockets takes it; we leave it to websockets
        upgrade("Transfer-Encoding: chunked"),
        upgrade().replace(b"GET ", b"POST "),
        upgrade().replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1),
        upgrade().replace(b"\r\nHost", b"\nHost"),
        upgrade("X-Odd: a\rb"),
        upgrade("Bad Name: x"),
        upgrade("X-Control: \x01"),
        upgrade(target="/caf\u00e9"),
        upgrade().replace(b"GET /v1/duplex", b"GET  /v1/duplex"),
        upgrade(*(f"X-{i}: {i}" for i in range(129))),
        upgrade("X-Long: " + "x" * 8190),
        b"GARBAGE\r\n\r\n",
        b"\r\n\r\n",
    ],
)
def test_what_the_quick_parser_does_not_take_is_left_to_websockets(head: bytes) -> None:
    assert quick_request(head) is None


@pytest.mark.parametrize(
    "extra",
    [
        ("Sec-WebSocket-Version: 8",),
        ("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 13"),
        ("Sec-WebSocket-Key: " + KEY,),  # twice
        ("Upgrade: h2c",),
        ("Origin: http://a", "Origin: http://b"),
        ("Sec-WebSocket-Protocol: a b",),
        ("Sec-WebSocket-Protocol: ",),
        ("Sec-WebSocket-Protocol: a,,b",),
    ],
)
def test_an_upgrade_not_plainly_valid_is_left_to_websockets(extra: tuple[str, ...]) -> None:
    request = quick_request(upgrade(*extra))
    assert request is not None
    assert quick_accept(request, "trio-duplex") is None


@pytest.mark.parametrize(
    "key",
    [
        "",
        "dGhlIHNhbXBsZSBub25jZQ",  # unpadded
        "dGhlIHNhbXBsZSBub25jZQ==x",
        "dGhlIHNhbXBsZSBub25j",  # 15 bytes
        base64.b64encode(bytes(range(17))).decode(),  # 17 bytes
        "dGhlIHNhbXBsZSBub25jZQ==\u00e9",
    ],
)
def test_a_key_that_is_not_16_bytes_of_base64_is_left_to_websockets(key: str) -> None:
    request = quick_request(upgrade(key=key))
    assert request is not None
    assert quick_accept(request, None) is None
    _, answer = websockets_answer(upgrade(key=key), None)
    assert answer is not None and answer.startswith(b"HTTP/1.1 400 ")


def test_without_connection_upgrade_websockets_answers_426() -> None:
    head = upgrade().replace(b"Connection: Upgrade", b"Connection: keep-alive")
    request = quick_request(head)
    assert request is not None
    assert quick_accept(request, None) is None
    _, answer = websockets_answer(head, None)
    assert answer is not None and answer.startswith(b"HTTP/1.1 426 ")


NAMES = [
    "Host",
    "Upgrade",
    "Connection",
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Protocol",
    "Sec-WebSocket-Extensions",
    "Origin",
    "Content-Length",
    "Transfer-Encoding",
    "upgrade",
    "CONNECTION",
    "X-Token",
]
VALUES = [
    "websocket",
    "WebSocket",
    "Upgrade",
    "upgrade, keep-alive",
    "keep-alive,Upgrade",
    " Upgrade ",
    KEY,
    "13",
    "8",
    "trio-duplex",
    "trio-duplex, realtime",
    "realtime,openai-insecure-api-key.k",
    "a,,b",
    ",a",
    "a b",
    "0",
    "chunked",
    "",
    "\t",
    "\u00e9",
    "http://127.0.0.1:8765",
]
raw = st.text(
    alphabet=st.characters(min_codepoint=0x00, max_codepoint=0xFF, exclude_characters="\n"),
    max_size=30,
)
printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)


def mostly(*choices: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The first strategy eight times as often as each other (a well-formed upgrade
    often enough that the quick path is exercised, a broken one often enough too)."""
    first, *others = choices
    return st.one_of(*[first] * 8, *others)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    method = draw(mostly(st.just("GET"), st.sampled_from(["POST", "get", "G\u00e9T"])))
    target = draw(mostly(st.sampled_from(["/v1/duplex", "/v1/duplex?x=1"]), printable, raw))
    version = draw(mostly(st.just("HTTP/1.1"), st.sampled_from(["HTTP/1.0", "HTTP/1.1 ", ""])))
    base = [
        ("Host", "127.0.0.1"),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", KEY),
        ("Sec-WebSocket-Version", "13"),
    ]
    names = mostly(st.sampled_from(NAMES), printable, raw)
    values = mostly(st.sampled_from(VALUES), printable, raw)
    headers = draw(st.lists(st.tuples(names, values), max_size=4))
    if draw(mostly(st.just("base"), st.just(""))):
        headers = base + headers
    order = draw(st.permutations(headers))
    separator = draw(st.sampled_from([": ", ":", " : ", ":\t"]))
    lines = [f"{method} {target} {version}", *(f"{n}{separator}{v}" for n, v in order)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass")


@st.composite
def upgrades(draw: st.DrawFn) -> bytes:
    """Upgrades of the usual shape, with their headers mixed from the lists above:
    some valid, some not, most within what ``quick_request`` takes."""
    target = draw(st.sampled_from(["/v1/duplex", "/v1/realtime?model=m", "/v1/duplex?%zz&&="]))
    base = [
        ("Host", "127.0.0.1"),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", KEY),
        ("Sec-WebSocket-Version", "13"),
    ]
    kept = draw(st.lists(st.sampled_from(base), unique=True, min_size=3))
    extra = draw(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=3))
    order = draw(st.permutations(kept + extra))
    lines = [f"GET {target} HTTP/1.1", *(f"{n}: {v}" for n, v in order)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass")


def check_against_websockets(head: bytes, wanted: str | None) -> None:
    ours = quick_request(head)
    theirs, answer = websockets_answer(head, wanted)
    if ours is None:
        return
    assert theirs is not None and answer is not None, head
    same_request(ours, theirs)
    mine = quick_accept(ours, wanted)
    if mine is not None:
        assert answer.startswith(b"HTTP/1.1 101 "), (head, answer)
        assert undated(mine) == undated(answer)


WANTED = st.sampled_from([None, "trio-duplex", "realtime"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=heads(), wanted=WANTED)
def test_whatever_the_quick_path_takes_websockets_takes_the_same_way(
    head: bytes, wanted: str | None
) -> None:
    check_against_websockets(head, wanted)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=upgrades(), wanted=WANTED)
def test_whatever_upgrade_the_quick_path_answers_websockets_answers_the_same(
    head: bytes, wanted: str | None
) -> None:
    check_against_websockets(head, wanted)
