"""trio_duplex.core.frames: the sans-IO RFC 6455 framing.

- What two independent client encoders (wsproto and websockets' sans-IO ClientProtocol)
  produce is parsed back to the same messages and control frames, in order, however the
  byte stream is cut (hypothesis), across the 125/126 and 65535/65536 length encodings.
- What the server builds (text_frame, control_frame, close_frame) is read back by both
  libraries' client side.
- Every rule a client can break gives its documented close code, returns what came
  before the fault and stops parsing; nothing is parsed after a Close.
- A large message fed in small chunks is parsed correctly and fast.
"""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets import http11
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.frames import Opcode as WsOpcode
from websockets.server import ServerProtocol
from websockets.uri import parse_uri
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from trio_duplex.core.frames import (
    Close,
    CloseCode,
    Control,
    FrameError,
    FrameReader,
    Item,
    Opcode,
    binary_frame,
    close_frame,
    control_frame,
    frames_of,
    text_frame,
)

BIG = 1 << 30  # a max_message_bytes that never gets in the way
LENGTH_BOUNDARIES = [0, 1, 125, 126, 127, 65535, 65536, 65537]

# -- helpers: hand-built client frames ----------------------------------------------------

KEY = b"\x37\xfa\x21\x3d"


def mask(data: bytes, key: bytes = KEY) -> bytes:
    """XOR with the masking key (written here, independent of the module's apply_mask)."""
    n = len(data)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


def header(
    opcode: int,
    length: int,
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    form: int | None = None,
) -> bytes:
    """A frame header up to (not including) the masking key. ``form`` forces the length
    encoding: 7, 16 or 64 bits (default: the shortest)."""
    if form is None:
        form = 7 if length < 126 else 16 if length < 65536 else 64
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    m = 0x80 if masked else 0
    if form == 7:
        return bytes((b0, m | length))
    if form == 16:
        return bytes((b0, m | 126)) + length.to_bytes(2, "big")
    return bytes((b0, m | 127)) + length.to_bytes(8, "big")


def frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    form: int | None = None,
) -> bytes:
    """A whole client frame, masked with KEY unless ``masked=False``."""
    head = header(opcode, len(payload), fin=fin, rsv=rsv, masked=masked, form=form)
    if not masked:
        return head + payload
    return head + KEY + mask(payload)


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + reason


def typed(items: Iterable[object]) -> list[tuple[str, object]]:
    """Items with their type, so that a str never equals bytes and a Control never equals
    a plain tuple by accident."""
    return [(type(item).__name__, item) for item in items]


def feed(reader: FrameReader, chunks: Iterable[bytes]) -> list[Item]:
    out: list[Item] = []
    for chunk in chunks:
        out.extend(reader.receive(chunk))
    return out


def cut(data: bytes, points: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, repeats give empty chunks)."""
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def parse(data: bytes, max_message_bytes: int = BIG) -> tuple[list[Item], FrameReader]:
    reader = FrameReader(max_message_bytes)
    return reader.receive(data), reader


# -- helpers: the two independent encoders and decoders -----------------------------------


def wsproto_client() -> WSConnection:
    client = WSConnection(ConnectionType.CLIENT)
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="example.com", target="/")))
    assert [type(e) for e in server.events()] == [Request]
    client.receive_data(server.send(AcceptConnection()))
    assert [type(e) for e in client.events()] == [AcceptConnection]
    return client


def websockets_client() -> ClientProtocol:
    client = ClientProtocol(parse_uri("ws://example.com/"), max_size=None)
    server = ServerProtocol()
    client.send_request(client.connect())
    server.receive_data(b"".join(client.data_to_send()))
    (request,) = server.events_received()
    assert isinstance(request, http11.Request)
    server.send_response(server.accept(request))
    client.receive_data(b"".join(server.data_to_send()))
    client.events_received()
    assert client.handshake_exc is None
    assert client.data_to_send() == []
    return client


def wsproto_read(data: bytes) -> list[tuple[str, object]]:
    """What a wsproto client makes of server frames: ("text", str), ("bytes", bytes),
    ("ping"/"pong", payload), ("close", (code, reason))."""
    client = wsproto_client()
    client.receive_data(data)
    out: list[tuple[str, object]] = []
    text: list[str] = []
    binary: list[bytes] = []
    events: list[Event] = list(client.events())
    for event in events:
        if isinstance(event, TextMessage):
            text.append(event.data)
            if event.message_finished:
                out.append(("text", "".join(text)))
                text.clear()
        elif isinstance(event, BytesMessage):
            binary.append(bytes(event.data))
            if event.message_finished:
                out.append(("bytes", b"".join(binary)))
                binary.clear()
        elif isinstance(event, Ping):
            out.append(("ping", bytes(event.payload)))
        elif isinstance(event, Pong):
            out.append(("pong", bytes(event.payload)))
        elif isinstance(event, CloseConnection):
            out.append(("close", (event.code, event.reason)))
        else:  # pragma: no cover - fails the test
            out.append(("unexpected", event))
    return out


def websockets_read(data: bytes) -> list[tuple[str, object]]:
    """The same, read by websockets' sans-IO client."""
    client = websockets_client()
    client.receive_data(data)
    assert client.parser_exc is None
    out: list[tuple[str, object]] = []
    for event in client.events_received():
        assert isinstance(event, Frame)
        assert event.fin
        if event.opcode is WsOpcode.TEXT:
            out.append(("text", bytes(event.data).decode()))
        elif event.opcode is WsOpcode.BINARY:
            out.append(("bytes", bytes(event.data)))
        elif event.opcode is WsOpcode.PING:
            out.append(("ping", bytes(event.data)))
        elif event.opcode is WsOpcode.PONG:
            out.append(("pong", bytes(event.data)))
        elif event.opcode is WsOpcode.CLOSE:
            assert client.close_rcvd is not None
            out.append(("close", (client.close_rcvd.code, client.close_rcvd.reason)))
        else:  # pragma: no cover - fails the test
            out.append(("unexpected", event))
    return out


READERS: dict[str, Callable[[bytes], list[tuple[str, object]]]] = {
    "wsproto": wsproto_read,
    "websockets": websockets_read,
}


# -- what a client sends: a script of messages and control frames -------------------------


@dataclass(frozen=True)
class Message:
    text: bool
    data: bytes  # UTF-8 when text
    cuts: tuple[int, ...]  # sorted offsets in data where a fragment ends (repeats allowed)
    between: tuple[tuple[Control, ...], ...]  # control frames sent after each cut

    def pieces(self, *, char_boundaries: bool) -> list[bytes]:
        cuts = self.cuts
        if char_boundaries:  # wsproto takes each text fragment as a str
            cuts = tuple(self._back_to_char_start(c) for c in cuts)
        return cut(self.data, cuts)

    def _back_to_char_start(self, offset: int) -> int:
        while 0 < offset < len(self.data) and self.data[offset] & 0xC0 == 0x80:
            offset -= 1
        return offset

    def value(self) -> str | bytes:
        return self.data.decode() if self.text else self.data


Script = list[Message | Control]


def expected(script: Script, close: Close | None) -> list[Item]:
    out: list[Item] = []
    for step in script:
        if isinstance(step, Control):
            out.append(step)
        else:
            for controls in step.between:
                out.extend(controls)
            out.append(step.value())
    if close is not None:
        out.append(close)
    return out


def encode_wsproto(script: Script, close: Close | None) -> bytes:
    client = wsproto_client()
    out = bytearray()

    def control(c: Control) -> None:
        out.extend(client.send(Ping(c.payload) if c.opcode == Opcode.PING else Pong(c.payload)))

    for step in script:
        if isinstance(step, Control):
            control(step)
            continue
        pieces = step.pieces(char_boundaries=True)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if step.text:
                out += client.send(TextMessage(data=piece.decode(), message_finished=last))
            else:
                out += client.send(BytesMessage(data=piece, message_finished=last))
            if not last:
                for c in step.between[i]:
                    control(c)
    if close is not None:
        code = None if close.code == CloseCode.NO_STATUS else close.code
        # wsproto's annotation says int, but it takes None for a close frame without a code.
        out += client.send(CloseConnection(code=code, reason=close.reason or None))  # type: ignore[arg-type]
    return bytes(out)


def encode_websockets(script: Script, close: Close | None) -> bytes:
    client = websockets_client()

    def control(c: Control) -> None:
        if c.opcode == Opcode.PING:
            client.send_ping(c.payload)
        else:
            client.send_pong(c.payload)

    for step in script:
        if isinstance(step, Control):
            control(step)
            continue
        # websockets takes raw bytes: text fragments may split a multibyte character
        pieces = step.pieces(char_boundaries=False)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if i:
                client.send_continuation(piece, fin=last)
            elif step.text:
                client.send_text(piece, fin=last)
            else:
                client.send_binary(piece, fin=last)
            if not last:
                for c in step.between[i]:
                    control(c)
    if close is not None:
        if close.code == CloseCode.NO_STATUS:
            client.send_close()
        else:
            client.send_close(close.code, close.reason)
    return b"".join(client.data_to_send())


ENCODERS: dict[str, Callable[[Script, Close | None], bytes]] = {
    "wsproto": encode_wsproto,
    "websockets": encode_websockets,
}

# -- strategies ---------------------------------------------------------------------------

controls = st.builds(
    Control,
    st.sampled_from([Opcode.PING, Opcode.PONG]),
    st.one_of(st.binary(max_size=8), st.binary(min_size=120, max_size=125)),
)

# Payload sizes around the length-encoding boundaries; the 64 KiB ones are one branch of
# four so that few examples carry them (their bytes are filler, not drawn one by one).
sizes = st.one_of(
    st.integers(0, 12),
    st.integers(120, 131),
    st.integers(0, 400),
    st.sampled_from([65534, 65535, 65536, 65537]),
)

FILLER_TEXT = "aé€😀"  # 1, 2, 3 and 4 bytes


def fill_text(head: str, size: int) -> bytes:
    """``head`` then filler (with multibyte characters) to exactly ``size`` bytes, when
    ``head`` is not already longer."""
    data = head.encode()
    room = size - len(data)
    if room <= 0:
        return data
    filler = (FILLER_TEXT * (room // 10 + 1)).encode()[:room]
    filler = filler.decode(errors="ignore").encode()
    return data + filler + b"a" * (room - len(filler))


@st.composite
def messages(draw: st.DrawFn) -> Message:
    text = draw(st.booleans())
    size = draw(sizes)
    if text:
        data = fill_text(draw(st.text(max_size=6)), size)
    else:
        head = draw(st.binary(max_size=6))
        seed = draw(st.integers(0, 255))
        room = max(0, size - len(head))
        data = head + random.Random(seed).randbytes(room)
    cuts = tuple(sorted(draw(st.lists(st.integers(0, len(data)), max_size=4))))
    between = tuple(tuple(draw(st.lists(controls, max_size=2))) for _ in cuts)
    return Message(text, data, cuts, between)


short_reasons = st.text(max_size=12).filter(lambda r: len(r.encode()) <= 123)
closes = st.one_of(
    st.none(),
    st.just(Close(CloseCode.NO_STATUS, "")),
    st.builds(Close, st.sampled_from([1000, 1001, 1003, 1011, 1014, 3000, 4999]), short_reasons),
)
scripts = st.lists(st.one_of(messages(), controls), max_size=6)


# -- 1. client frames from two independent encoders ---------------------------------------


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@settings(max_examples=120, deadline=None, database=None)
@given(script=scripts, close=closes, data=st.data())
def test_encoded_streams_parse_back_however_cut(
    encoder: str, script: Script, close: Close | None, data: st.DataObject
) -> None:
    stream = ENCODERS[encoder](script, close)
    want = typed(expected(script, close))

    reader = FrameReader(BIG)
    assert typed(reader.receive(stream)) == want
    assert reader.error is None

    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    reader = FrameReader(BIG)
    assert typed(feed(reader, cut(stream, points))) == want
    assert reader.error is None

    if len(stream) <= 2000:
        reader = FrameReader(BIG)
        assert typed(feed(reader, bytewise(stream))) == want
        assert reader.error is None


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("size", LENGTH_BOUNDARIES)
def test_length_boundaries_each_encoding(encoder: str, size: int) -> None:
    text = fill_text("", size)
    assert len(text) == size
    binary = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    # one unfragmented message each, then the same split into two fragments of which one
    # sits on the boundary, with a ping between
    script: Script = [
        Message(True, text, (), ()),
        Message(False, binary, (), ()),
        Message(False, binary + b"xyz", (size,), ((Control(Opcode.PING, b"p"),),)),
        Message(False, b"abc" + binary, (3,), ((),)),
    ]
    stream = ENCODERS[encoder](script, Close(1000, "bye"))
    reader = FrameReader(BIG)
    items = feed(reader, cut(stream, range(0, len(stream), 1000)))
    assert typed(items) == typed(
        [
            text.decode(),
            binary,
            Control(Opcode.PING, b"p"),
            binary + b"xyz",
            b"abc" + binary,
            Close(1000, "bye"),
        ]
    )
    assert reader.error is None


def test_each_length_form_is_read_even_when_not_minimal() -> None:
    items, reader = parse(
        frame(Opcode.TEXT, b"seven", form=7)
        + frame(Opcode.TEXT, b"sixteen", form=16)
        + frame(Opcode.BINARY, b"sixty-four", form=64)
    )
    assert typed(items) == typed(["seven", "sixteen", b"sixty-four"])
    assert reader.error is None


def test_empty_messages_and_control_frames() -> None:
    stream = (
        frame(Opcode.TEXT)
        + frame(Opcode.BINARY)
        + frame(Opcode.TEXT, fin=False)
        + frame(Opcode.CONT, fin=False)
        + frame(Opcode.CONT)
        + frame(Opcode.PING)
        + frame(Opcode.PONG)
        + frame(Opcode.CLOSE)
    )
    for chunks in ([stream], bytewise(stream)):
        reader = FrameReader(18)  # the fragmented one: three 6-byte headers
        assert typed(feed(reader, chunks)) == typed(
            [
                "",
                b"",
                "",
                Control(Opcode.PING, b""),
                Control(Opcode.PONG, b""),
                Close(CloseCode.NO_STATUS, ""),
            ]
        )
        assert reader.error is None


def test_binary_messages_come_back_as_bytes() -> None:
    stream = (
        frame(Opcode.BINARY, b"one")
        + frame(Opcode.BINARY, b"tw", fin=False)
        + frame(Opcode.CONT, b"o")
    )
    # held back in the reader's bytearray first, then completed
    reader = FrameReader(BIG)
    assert reader.receive(stream[:5]) == []
    items = reader.receive(stream[5:])
    assert items == [b"one", b"two"]
    assert all(type(item) is bytes for item in items)
    assert all(
        type(item.payload) is bytes
        for item in parse(frame(Opcode.PING, b"x"))[0]
        if isinstance(item, Control)
    )


def test_multibyte_characters_split_across_fragments_are_accepted() -> None:
    emoji = "😀".encode()  # 4 bytes
    stream = (
        frame(Opcode.TEXT, b"a" + emoji[:1], fin=False)
        + frame(Opcode.PING, b"1")
        + frame(Opcode.CONT, emoji[1:2], fin=False)
        + frame(Opcode.CONT, emoji[2:3], fin=False)
        + frame(Opcode.PONG, b"2")
        + frame(Opcode.CONT, emoji[3:] + "€".encode()[:2], fin=False)
        + frame(Opcode.CONT, "€".encode()[2:])
    )
    for chunks in ([stream], bytewise(stream)):
        reader = FrameReader(BIG)
        assert typed(feed(reader, chunks)) == typed(
            [Control(Opcode.PING, b"1"), Control(Opcode.PONG, b"2"), "a😀€"]
        )
        assert reader.error is None


# -- 2. what the server sends ------------------------------------------------------------


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("size", LENGTH_BOUNDARIES)
def test_text_frame_is_read_back(reader: str, size: int) -> None:
    text = fill_text("ñ", size).decode()
    built = text_frame(text)
    assert READERS[reader](built) == [("text", text)]


@pytest.mark.parametrize(
    ("size", "head"),
    [
        (0, b"\x81\x00"),
        (125, b"\x81\x7d"),
        (126, b"\x81\x7e\x00\x7e"),
        (65535, b"\x81\x7e\xff\xff"),
        (65536, b"\x81\x7f\x00\x00\x00\x00\x00\x01\x00\x00"),
    ],
)
def test_text_frame_uses_the_shortest_length_encoding(size: int, head: bytes) -> None:
    built = text_frame("x" * size)
    assert built == head + b"x" * size


@settings(max_examples=100, deadline=None, database=None)
@given(text=st.text(max_size=200))
def test_any_text_frame_is_read_back(text: str) -> None:
    built = text_frame(text)
    assert wsproto_read(built) == [("text", text)]
    assert websockets_read(built) == [("text", text)]


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("opcode", [Opcode.PING, Opcode.PONG])
@pytest.mark.parametrize("size", [0, 1, 124, 125])
def test_control_frame_is_read_back(reader: str, opcode: int, size: int) -> None:
    payload = bytes(range(size))
    built = control_frame(opcode, payload)
    assert built[:2] == bytes((0x80 | opcode, size))
    kind = "ping" if opcode == Opcode.PING else "pong"
    assert READERS[reader](built) == [(kind, payload)]


def test_control_frame_refuses_more_than_125_bytes() -> None:
    with pytest.raises(ValueError, match="125"):
        control_frame(Opcode.PING, b"x" * 126)


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize(
    ("code", "reason"),
    [(1000, ""), (1001, "going away"), (1009, "too big"), (1011, "oops ✓"), (4000, "app")],
)
def test_close_frame_is_read_back(reader: str, code: int, reason: str) -> None:
    built = close_frame(code, reason)
    assert built[0] == 0x88
    assert READERS[reader](built) == [("close", (code, reason))]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_close_frame_without_code_is_empty(reader: str) -> None:
    assert close_frame() == b"\x88\x00"
    assert close_frame(CloseCode.NO_STATUS) == b"\x88\x00"
    assert READERS[reader](close_frame()) == [("close", (CloseCode.NO_STATUS, ""))]


@pytest.mark.parametrize(
    ("reason", "kept"),
    [
        ("a" * 200, "a" * 123),
        ("é" * 100, "é" * 61),  # 122 bytes: a 62nd would make 124
        ("€" * 50, "€" * 41),  # exactly 123 bytes
        ("😀" * 40, "😀" * 30),  # 120 bytes
        ("ab" + "😀" * 40, "ab" + "😀" * 30),  # 122 bytes
        ("a" * 123, "a" * 123),
    ],
)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_close_frame_cuts_a_long_reason_at_a_character_boundary(
    reader: str, reason: str, kept: str
) -> None:
    built = close_frame(1001, reason)
    assert built[1] == 2 + len(kept.encode()) <= 125
    assert READERS[reader](built) == [("close", (1001, kept))]


@settings(max_examples=100, deadline=None, database=None)
@given(reason=st.text(max_size=130))
def test_close_frame_keeps_the_longest_prefix_that_fits(reason: str) -> None:
    built = close_frame(1000, reason)
    assert len(built) <= 2 + 125
    kept = built[4:].decode()
    assert reason.startswith(kept)
    if kept != reason:
        assert len(reason[: len(kept) + 1].encode()) > 123
    assert websockets_read(built) == [("close", (1000, kept))]


# -- 3. broken rules ---------------------------------------------------------------------

BEFORE = (
    frame(Opcode.TEXT, b"before") + frame(Opcode.PING, b"p") + frame(Opcode.BINARY, b"\x00\x01")
)
BEFORE_ITEMS: list[Item] = ["before", Control(Opcode.PING, b"p"), b"\x00\x01"]
AFTER = frame(Opcode.TEXT, b"after") + frame(Opcode.CLOSE, close_payload(1000))


def assert_fault(
    bad: bytes,
    code: int,
    *,
    before: bytes = BEFORE,
    before_items: Sequence[Item] = BEFORE_ITEMS,
    max_message_bytes: int = BIG,
) -> None:
    """``before + bad + AFTER`` gives ``before_items`` and error ``code``, fed at once, in
    random cuts and a byte at a time; nothing is parsed afterwards."""
    stream = before + bad + AFTER
    rng = random.Random(len(stream))
    ways = [
        [stream],
        [before, bad, AFTER],
        cut(stream, rng.sample(range(len(stream) + 1), k=min(8, len(stream)))),
    ]
    if len(stream) <= 5000:
        ways.append(bytewise(stream))
    for chunks in ways:
        reader = FrameReader(max_message_bytes)
        assert typed(feed(reader, chunks)) == typed(before_items)
        assert isinstance(reader.error, FrameError)
        assert reader.error.code == code
        assert isinstance(reader.error.reason, str) and reader.error.reason
        error = reader.error
        assert reader.receive(frame(Opcode.TEXT, b"later") + frame(Opcode.PING)) == []
        assert reader.error is error


@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY, Opcode.PING, Opcode.CLOSE])
def test_unmasked_frame(opcode: int) -> None:
    assert_fault(frame(opcode, b"hi", masked=False), 1002)


@pytest.mark.parametrize("rsv", range(1, 8))
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.CONT, Opcode.PING])
def test_reserved_bits(rsv: int, opcode: int) -> None:
    assert_fault(frame(opcode, b"hi", rsv=rsv), 1002)


@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 11, 12, 13, 14, 15])
def test_unknown_opcode(opcode: int) -> None:
    assert_fault(frame(opcode, b"hi"), 1002)


@pytest.mark.parametrize("opcode", [Opcode.PING, Opcode.PONG, Opcode.CLOSE])
def test_fragmented_control_frame(opcode: int) -> None:
    payload = close_payload(1000) if opcode == Opcode.CLOSE else b"x"
    assert_fault(frame(opcode, payload, fin=False), 1002)


@pytest.mark.parametrize("opcode", [Opcode.PING, Opcode.PONG, Opcode.CLOSE])
@pytest.mark.parametrize(("size", "form"), [(126, 16), (65536, 64), (5, 16), (5, 64)])
def test_control_frame_too_long(opcode: int, size: int, form: int) -> None:
    assert_fault(frame(opcode, close_payload(1000, b"r" * (size - 2)), form=form), 1002)


@pytest.mark.parametrize("length_byte", [126, 127])
def test_control_frame_too_long_is_decided_from_two_bytes(length_byte: int) -> None:
    reader = FrameReader(BIG)
    assert reader.receive(bytes((0x80 | Opcode.PING, 0x80 | length_byte))) == []
    assert reader.error is not None and reader.error.code == 1002


def test_control_frame_of_125_bytes_is_fine_and_not_counted_as_a_message() -> None:
    items, reader = parse(
        frame(Opcode.PING, b"x" * 125)
        + frame(Opcode.PONG, b"y" * 125)
        + frame(Opcode.CLOSE, close_payload(1000, b"z" * 123)),
        max_message_bytes=0,
    )
    assert typed(items) == typed(
        [Control(Opcode.PING, b"x" * 125), Control(Opcode.PONG, b"y" * 125), Close(1000, "z" * 123)]
    )
    assert reader.error is None


@pytest.mark.parametrize("fin", [True, False])
def test_continuation_with_no_message_started(fin: bool) -> None:
    assert_fault(frame(Opcode.CONT, b"more", fin=fin), 1002)
    assert_fault(frame(Opcode.CONT, b"", fin=fin), 1002, before=b"", before_items=[])


@pytest.mark.parametrize("first", [Opcode.TEXT, Opcode.BINARY])
@pytest.mark.parametrize("second", [Opcode.TEXT, Opcode.BINARY])
@pytest.mark.parametrize("fin", [True, False])
def test_new_message_during_a_fragmented_one(first: int, second: int, fin: bool) -> None:
    before = BEFORE + frame(first, b"part", fin=False) + frame(Opcode.PONG, b"q")
    assert_fault(
        frame(second, b"new", fin=fin),
        1002,
        before=before,
        before_items=[*BEFORE_ITEMS, Control(Opcode.PONG, b"q")],
    )


def test_fragments_out_of_order_are_refused_from_the_header() -> None:
    # Only the header and the masking key arrive: no payload is waited for.
    reader = FrameReader(BIG)
    assert reader.receive(header(Opcode.CONT, 100_000) + KEY) == []
    assert reader.error is not None and reader.error.code == 1002
    reader = FrameReader(BIG)
    assert (
        reader.receive(frame(Opcode.TEXT, b"part", fin=False) + header(Opcode.TEXT, 100_000)[:2])
        == []
    )
    assert reader.error is not None and reader.error.code == 1002


@pytest.mark.parametrize("length", [1 << 63, (1 << 63) + 5, (1 << 64) - 1])
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY, Opcode.CONT])
def test_64_bit_length_with_top_bit(length: int, opcode: int) -> None:
    bad = header(opcode, length, form=64)
    assert_fault(bad, 1002)
    reader = FrameReader(BIG)  # decided from the header: no key, no payload needed
    assert reader.receive(bad) == []
    assert reader.error is not None and reader.error.code == 1002


INVALID_UTF8 = [
    b"\xff",
    b"\x80",
    b"abc\xc3",  # truncated 2-byte sequence
    b"\xe2\x82",  # truncated 3-byte sequence
    b"\xc0\xaf",  # overlong
    b"\xe0\x80\xaf",  # overlong
    b"\xed\xa0\x80",  # surrogate
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xf8\x88\x80\x80\x80",
]


@pytest.mark.parametrize("payload", INVALID_UTF8)
def test_invalid_utf8_text(payload: bytes) -> None:
    assert_fault(frame(Opcode.TEXT, payload), 1007)


@pytest.mark.parametrize("payload", INVALID_UTF8)
def test_invalid_binary_is_fine(payload: bytes) -> None:
    items, reader = parse(frame(Opcode.BINARY, payload))
    assert typed(items) == typed([payload])
    assert reader.error is None


@pytest.mark.parametrize(
    "pieces",
    [
        [b"\xe2\x82", b"("],  # a 3-byte sequence broken by "("
        [b"ok", b"\xe2", b"\x82"],  # ends mid-character
        [b"\xed", b"\xa0\x80"],  # a surrogate, split
        [b"a", b"\xff", b"b"],
        [b"\xf0\x9f", b"\x98", b"\x80\x80"],  # one continuation byte too many
    ],
)
def test_invalid_utf8_split_across_fragments(pieces: list[bytes]) -> None:
    frames = [
        frame(Opcode.TEXT if i == 0 else Opcode.CONT, p, fin=i == len(pieces) - 1)
        for i, p in enumerate(pieces)
    ]
    # a ping before the last fragment comes out; the message does not
    before = BEFORE + b"".join(frames[:-1]) + frame(Opcode.PING, b"mid")
    assert_fault(
        frames[-1], 1007, before=before, before_items=[*BEFORE_ITEMS, Control(Opcode.PING, b"mid")]
    )


def test_close_with_one_byte_payload() -> None:
    assert_fault(frame(Opcode.CLOSE, b"\x03"), 1002)


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535])
def test_close_code_not_allowed_on_the_wire(code: int) -> None:
    assert_fault(frame(Opcode.CLOSE, close_payload(code)), 1002)
    assert_fault(frame(Opcode.CLOSE, close_payload(code, b"why")), 1002)


@pytest.mark.parametrize(
    "code",
    [
        1000,
        1001,
        1002,
        1003,
        1007,
        1008,
        1009,
        1010,
        1011,
        1012,
        1013,
        1014,
        3000,
        3999,
        4000,
        4999,
    ],
)
def test_close_code_allowed(code: int) -> None:
    stream = BEFORE + frame(Opcode.CLOSE, close_payload(code, "why ✓".encode()))
    for chunks in ([stream], bytewise(stream)):
        reader = FrameReader(BIG)
        assert typed(feed(reader, chunks)) == typed([*BEFORE_ITEMS, Close(code, "why ✓")])
        assert reader.error is None


def test_close_without_payload_means_no_status() -> None:
    items, reader = parse(frame(Opcode.CLOSE))
    assert typed(items) == typed([Close(CloseCode.NO_STATUS, "")])
    assert reader.error is None


@pytest.mark.parametrize("reason", [b"\xff", b"ok\xc3", b"\xed\xa0\x80"])
def test_close_reason_not_utf8(reason: bytes) -> None:
    assert_fault(frame(Opcode.CLOSE, close_payload(1000, reason)), 1007)


@pytest.mark.parametrize(
    ("limit", "form"), [(100, 7), (124, 7), (125, 16), (1000, 16), (65535, 64), (70000, 64)]
)
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_over_the_limit_decided_from_the_header(limit: int, opcode: int, form: int) -> None:
    head = header(opcode, limit + 1, form=form)
    reader = FrameReader(limit)
    # nothing decided until the header is whole...
    for byte in bytewise(head[:-1]):
        assert reader.receive(byte) == []
        assert reader.error is None
    # ...then at once, with no masking key or payload yet
    assert reader.receive(head[-1:]) == []
    assert reader.error is not None and reader.error.code == 1009
    assert reader.receive(KEY + b"x" * (limit + 1) + frame(Opcode.TEXT, b"next")) == []


@pytest.mark.parametrize("length", [2**20, 2**40, 2**63 - 1])
def test_huge_announced_length_is_refused_at_once(length: int) -> None:
    reader = FrameReader(2**20 - 1)
    assert reader.receive(frame(Opcode.PING, b"p") + header(Opcode.BINARY, length, form=64)) == [
        Control(Opcode.PING, b"p")
    ]
    assert reader.error is not None and reader.error.code == 1009


def test_single_frame_over_the_limit() -> None:
    assert_fault(frame(Opcode.TEXT, b"x" * 11), 1009, max_message_bytes=10)
    assert_fault(frame(Opcode.BINARY, b"x" * 70000), 1009, max_message_bytes=65536)


def test_fragments_over_the_limit() -> None:
    # 10 + 9 bytes (headers count) before the fragment that goes over 20
    before = BEFORE + frame(Opcode.TEXT, b"x" * 4, fin=False) + frame(Opcode.PING, b"a")
    before += frame(Opcode.CONT, b"y" * 3, fin=False) + frame(Opcode.PONG, b"b")
    before_items = [*BEFORE_ITEMS, Control(Opcode.PING, b"a"), Control(Opcode.PONG, b"b")]
    assert_fault(
        frame(Opcode.CONT, b"z" * 4, fin=True),
        1009,
        before=before,
        before_items=before_items,
        max_message_bytes=20,
    )
    assert_fault(
        frame(Opcode.CONT, b"z" * 4, fin=False),
        1009,
        before=before,
        before_items=before_items,
        max_message_bytes=20,
    )
    # the header of the fragment that goes over is enough
    reader = FrameReader(20)
    assert typed(reader.receive(before + header(Opcode.CONT, 4, fin=False))) == typed(before_items)
    assert reader.error is not None and reader.error.code == 1009


def test_message_of_exactly_the_limit_is_accepted() -> None:
    # A fragmented message counts each fragment's header (6 bytes here) with its payload.
    stream = (
        frame(Opcode.TEXT, b"x" * 22)
        + frame(Opcode.BINARY, b"y" * 4, fin=False)  # 10
        + frame(Opcode.PING, b"125 bytes of ping do not count" * 4)
        + frame(Opcode.CONT, b"y" * 6)  # 22
        # a new message starts counting from zero again
        + frame(Opcode.TEXT, b"z", fin=False)  # 7
        + frame(Opcode.CONT, b"", fin=False)  # 13
        + frame(Opcode.CONT, b"z" * 3)  # 22
        + frame(Opcode.TEXT, "€€€".encode() + b"a" * 12)
    )
    for chunks in ([stream], bytewise(stream)):
        reader = FrameReader(22)
        assert typed(feed(reader, chunks)) == typed(
            [
                "x" * 22,
                Control(Opcode.PING, b"125 bytes of ping do not count" * 4),
                b"y" * 10,
                "z" * 4,
                "€€€" + "a" * 12,
            ]
        )
        assert reader.error is None


def test_endless_empty_continuation_frames_meet_the_bound() -> None:
    # Was: each empty fragment was kept (a list entry apiece) and none counted, so a
    # client could grow the server without bound while its pings were answered.
    limit = 6000
    reader = FrameReader(limit)
    assert reader.receive(frame(Opcode.TEXT, b"a", fin=False)) == []
    empty = frame(Opcode.CONT, b"", fin=False) + frame(Opcode.PING, b"p")
    answered = 0
    for _ in range(limit):
        items = reader.receive(empty)
        if reader.error is not None:
            break
        assert items == [Control(Opcode.PING, b"p")]
        answered += 1
    assert reader.error is not None and reader.error.code == 1009
    assert answered == (limit - 7) // 6  # the 6-byte headers filled the bound


def test_a_message_in_one_byte_fragments_costs_its_size() -> None:
    # Was: 12 MiB sent as 1-byte fragments peaked at 624 MB (a bytes object and a list
    # slot per fragment). Now the fragments are joined as they arrive.
    size = 200_000
    stream = b"".join(
        [frame(Opcode.BINARY, b"\x00", fin=False)]
        + [frame(Opcode.CONT, b"\x01", fin=False)] * (size - 2)
        + [frame(Opcode.CONT, b"\x02")]
    )
    reader = FrameReader(len(stream))
    tracemalloc.start()
    try:
        items: list[Item] = []
        for at in range(0, len(stream), 65536):  # as the server reads: 64 KiB at a time
            items += reader.receive(stream[at : at + 65536])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert items == [b"\x00" + b"\x01" * (size - 2) + b"\x02"]
    assert peak < 4 * size  # was about 60 times the message


def test_limit_zero_allows_only_empty_messages() -> None:
    items, reader = parse(frame(Opcode.TEXT) + frame(Opcode.BINARY) + frame(Opcode.TEXT, b"x"), 0)
    assert typed(items) == typed(["", b""])
    assert reader.error is not None and reader.error.code == 1009


# -- 4. nothing after a Close or an error ------------------------------------------------


@pytest.mark.parametrize(
    "trailer",
    [b"", b"\x00", b"garbage that breaks every rule", frame(Opcode.TEXT, b"valid"), b"\x81\x05hi"],
)
def test_nothing_after_close(trailer: bytes) -> None:
    stream = BEFORE + frame(Opcode.CLOSE, close_payload(1000, b"done")) + trailer
    want = typed([*BEFORE_ITEMS, Close(1000, "done")])
    for chunks in ([stream], bytewise(stream)):
        reader = FrameReader(BIG)
        assert typed(feed(reader, chunks)) == want
        assert reader.error is None
        assert reader.receive(b"\xff\xff garbage") == []
        assert reader.receive(frame(Opcode.TEXT, b"valid") + frame(Opcode.CLOSE)) == []
        assert reader.error is None


def test_nothing_after_close_in_a_fragmented_message() -> None:
    stream = (
        frame(Opcode.TEXT, b"half", fin=False) + frame(Opcode.CLOSE) + frame(Opcode.CONT, b" more")
    )
    items, reader = parse(stream)
    assert typed(items) == typed([Close(CloseCode.NO_STATUS, "")])
    assert reader.error is None
    assert reader.receive(frame(Opcode.CONT, b"rest")) == []


def test_close_held_back_then_completed() -> None:
    close = frame(Opcode.CLOSE, close_payload(1001, b"later"))
    reader = FrameReader(BIG)
    assert reader.receive(frame(Opcode.PING, b"p") + close[:5]) == [Control(Opcode.PING, b"p")]
    assert reader.receive(close[5:] + b"\x00\x00garbage") == [Close(1001, "later")]
    assert reader.error is None
    assert reader.receive(frame(Opcode.TEXT, b"x")) == []


def test_nothing_after_an_error_even_valid_frames() -> None:
    reader = FrameReader(BIG)
    assert reader.receive(frame(Opcode.TEXT, b"ok") + b"\x81\x02no") == ["ok"]
    error = reader.error
    assert error is not None and error.code == 1002
    for _ in range(3):
        assert (
            reader.receive(frame(Opcode.TEXT, b"fine") + frame(Opcode.PING) + frame(Opcode.CLOSE))
            == []
        )
    assert reader.error is error


def test_frame_error_carries_code_and_reason() -> None:
    error = FrameError(1009, "too big")
    assert (error.code, error.reason) == (1009, "too big")
    assert error.args == (1009, "too big")


# -- 5. a large message in small chunks ---------------------------------------------------


def test_one_mib_message_in_4_kib_chunks() -> None:
    # (Its speed is the benchmarks' business, not a timed assertion's: see docs/benchmarks.md.)
    payload = random.Random(1).randbytes(1 << 20)
    text = ("ünïcødé 😀 " * 70000).encode()[: 1 << 20].decode(errors="ignore")
    fragmented = b"".join(
        frame(
            Opcode.BINARY if i == 0 else Opcode.CONT,
            payload[i : i + 65536],
            fin=i + 65536 >= len(payload),
        )
        + frame(Opcode.PING, b"%d" % i)
        for i in range(0, len(payload), 65536)
    )
    stream = frame(Opcode.BINARY, payload) + frame(Opcode.TEXT, text.encode()) + fragmented
    chunks = cut(stream, range(4096, len(stream), 4096))
    reader = FrameReader((1 << 20) + 16 * 14)  # and the fragments' 14-byte headers
    items = feed(reader, chunks)
    assert reader.error is None
    pings = [Control(Opcode.PING, b"%d" % i) for i in range(0, len(payload), 65536)]
    assert len(items) == 3 + len(pings)
    assert items[0] == payload
    assert items[1] == text
    assert items[2:] == [*pings[:-1], payload, pings[-1]]


def test_many_small_frames_in_odd_chunks() -> None:
    stream = b"".join(frame(Opcode.TEXT, b"m%d" % i) for i in range(5000))
    reader = FrameReader(BIG)
    items = feed(reader, cut(stream, range(0, len(stream), 4093)))
    assert items == [f"m{i}" for i in range(5000)]
    assert reader.error is None


def test_frames_of_many_messages_are_each_frame_back_to_back() -> None:
    messages: list[str | bytes] = []
    for n in (0, 1, 125, 126, 65535, 65536):
        messages += ["é" * (n // 2) + "x" * (n % 2), bytes(n)]
    assert frames_of(messages) == b"".join(
        text_frame(m) if isinstance(m, str) else binary_frame(m) for m in messages
    )
    assert frames_of([]) == b""
