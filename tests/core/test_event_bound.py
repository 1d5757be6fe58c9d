"""docs/protocol.md, Transport, max_event_bytes: the bound is on a message's UTF-8 bytes
(its fragments' frame headers counted), and a message over it is close 1009, decided by
the frame reader (core/frames.py) before anything is decoded. Driven directly, as the
server's reader is after a session opens with ``max_event_bytes=100``; no trio. (That the
server sets that bound, and closes with 1009, is tests/server/test_protocol_transport.py's.)"""

from __future__ import annotations

import pytest

from trio_duplex.core.frames import FrameReader, Item, Opcode
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE

from ..helpers import echo_message
from .test_frames import frame

BOUND = 100


def text(message: str, *, fin: bool = True, opcode: int = Opcode.TEXT) -> bytes:
    return frame(opcode, message.encode(), fin=fin)


def read(data: bytes, bound: int = BOUND) -> tuple[list[Item], int | None]:
    """What one write of ``data`` gives: the messages, and the close code of a fault."""
    reader = FrameReader(bound)
    items = reader.receive(data)
    return items, None if reader.error is None else reader.error.code


def test_message_of_exactly_max_event_bytes_is_accepted() -> None:
    for message in (echo_message(BOUND), echo_message(BOUND, "é")):
        assert read(text(message)) == ([message], None)
    assert NATIVE.decode(echo_message(BOUND, "é"))["text"] == "é" * ((BOUND - 38) // 2)


def test_one_byte_over_max_event_bytes_closes_1009() -> None:
    assert read(text(echo_message(BOUND + 1))) == ([], 1009)


@pytest.mark.parametrize(
    "message",
    [
        "é" * 60,  # 60 characters, 120 bytes
        '{"type":"input.text.append","text":"' + "😀" * 30 + '"}',  # 30 characters, 158 bytes
    ],
    ids=["two-byte", "four-byte-in-an-event"],
)
def test_size_counts_utf8_bytes_not_characters(message: str) -> None:
    assert len(message) <= BOUND < len(message.encode())
    assert read(text(message)) == ([], 1009)


def test_same_characters_under_the_byte_bound_are_accepted() -> None:
    # 50 two-byte characters = 100 bytes: not JSON, so invalid_json, not a close.
    assert read(text("é" * 50)) == (["é" * 50], None)
    with pytest.raises(ProtocolError) as raised:
        NATIVE.decode("é" * 50)
    assert (raised.value.code, raised.value.close_code) == ("invalid_json", None)


def test_fragmented_message_over_the_bound_closes_1009() -> None:
    # Three fragments of 40 bytes: each fits, the message (120 bytes) does not.
    parts = ['{"type":"input.text.append","text":"aa', "a" * 40, "a" * 40]
    data = b"".join(
        text(part, fin=False, opcode=Opcode.TEXT if not i else Opcode.CONT)
        for i, part in enumerate(parts)
    )
    assert read(data + text('"}', opcode=Opcode.CONT)) == ([], 1009)


def test_fragmented_multibyte_message_over_the_byte_bound_closes_1009() -> None:
    # Two fragments of 25 two-byte characters: 50 characters, 100 bytes, plus the JSON
    # around them: over 100 bytes but far under 100 characters.
    data = (
        text('{"type":"input.text.append","text":"', fin=False)
        + text("é" * 25, fin=False, opcode=Opcode.CONT)
        + text("é" * 25, fin=False, opcode=Opcode.CONT)
        + text('"}', opcode=Opcode.CONT)
    )
    assert read(data) == ([], 1009)


def test_fragmented_message_under_the_bound_is_one_event() -> None:
    # 100 bytes of payload and four 6-byte fragment headers, which count too: 124.
    message = echo_message(100)
    data = b"".join(
        text(
            message[start : start + 30],
            fin=start + 30 >= 100,
            opcode=Opcode.TEXT if start == 0 else Opcode.CONT,
        )
        for start in range(0, 100, 30)
    )
    assert read(data, 124) == ([message], None)
    assert read(data, 123) == ([], 1009)  # one byte less, and the headers tip it over
    assert NATIVE.decode(message)["type"] == "input.text.append"


def test_two_oversize_frames_in_one_write_close_1009() -> None:
    # The first fault decides: nothing after it is read, not even to fault again.
    reader = FrameReader(BOUND)
    assert reader.receive(text("a" * 200) + text("b" * 200)) == []
    assert reader.error is not None and reader.error.code == 1009
    assert reader.receive(text("c")) == []
