"""The binary audio lane's 12-byte header (dialects/binary.py): built, parsed, and fuzzed."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import binary


def test_the_header_is_the_documented_layout() -> None:
    message = binary.output_message(0x0102030405060708, b"audio")
    assert message[:12] == bytes([2, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    assert binary.parse(message) == (2, 0x0102030405060708, b"audio")
    assert binary.input_message(7, b"x") == struct.pack(">BBHQ", 1, 0, 0, 7) + b"x"
    assert binary.parse_input(binary.input_message(0, b"")) == (0, b"")


@given(st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_messages_round_trip(seq: int, payload: bytes) -> None:
    assert binary.parse(binary.output_message(seq, payload)) == (2, seq, payload)
    assert binary.parse_input(binary.input_message(seq, payload)) == (seq, payload)


@given(st.binary(max_size=40))
def test_any_bytes_parse_or_are_a_bad_event(data: bytes) -> None:
    try:
        kind, seq, payload = binary.parse(data)
    except ProtocolError as exc:
        assert exc.code == "bad_event" and exc.close_code is None
        return
    assert kind in (1, 2) and data[1:4] == b"\0\0\0"
    assert binary.HEADER_SIZE + len(payload) == len(data) and 0 <= seq < 2**64


@pytest.mark.parametrize(
    "data",
    [
        b"\x01" * 11,
        bytes([0]) + bytes(11),
        bytes([1, 1]) + bytes(10),
        bytes([1, 0, 0, 1]) + bytes(8),
    ],
)
def test_malformed_headers_are_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        binary.parse(data)


def test_a_client_may_not_send_output_audio() -> None:
    with pytest.raises(ProtocolError, match="kind 1"):
        binary.parse_input(binary.output_message(1, b""))


@given(st.binary(max_size=40))
def test_a_client_message_parses_as_the_full_parse_says_or_is_a_bad_event(data: bytes) -> None:
    # parse_input's quick path (a kind-1 header) answers as parse itself would.
    try:
        kind, seq, payload = binary.parse(data)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            binary.parse_input(data)
        return
    if kind != binary.INPUT_AUDIO:
        with pytest.raises(ProtocolError, match="kind 1"):
            binary.parse_input(data)
    else:
        assert binary.parse_input(data) == (seq, payload)


@pytest.mark.parametrize("size", range(4, 12))
def test_a_short_client_message_with_an_input_header_start_is_refused(size: int) -> None:
    with pytest.raises(ProtocolError, match="12-byte header"):
        binary.parse_input(bytes([1, 0, 0, 0]) + bytes(size - 4))
