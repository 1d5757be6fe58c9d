"""The native dialect as a ``Dialect``: its lanes, and that binding it adds no call layer."""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.core.events import ErrorCode
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE, Dialect, binary, native
from trio_duplex.dialects.jsonwire import LARGE, encode

DIALECT: Dialect = NATIVE  # mypy: the native dialect implements the whole interface
DELTA = {"type": "response.output_audio.delta", "response_id": "r1", "audio": b"pcm"}


def test_its_methods_are_the_codec_s_functions_themselves() -> None:
    # The per-event paths bind these once: no wrapper may stand between them and the codec.
    assert DIALECT.frame is encode
    assert DIALECT.decode is native.decode
    assert DIALECT.audio_frame is native.audio_frame
    assert (DIALECT.name, DIALECT.subprotocol, DIALECT.large) == ("native", "trio-duplex", LARGE)
    assert DIALECT.binary_lane


@given(st.integers(0, 2**63 - 1), st.binary(max_size=64))
def test_output_audio_on_the_binary_lane_is_a_kind_2_message(seq: int, payload: bytes) -> None:
    frame = DIALECT.audio_frame(seq, payload, None)
    assert frame == binary.output_message(seq, payload)
    assert binary.parse(frame) == (binary.OUTPUT_AUDIO, seq, payload)


@given(st.integers(1, 2**53), st.binary(max_size=64))
def test_output_audio_in_json_is_its_delta_with_base64_audio(seq: int, payload: bytes) -> None:
    fields = dict(DELTA)
    frame = DIALECT.audio_frame(seq, payload, fields)
    audio = binascii.b2a_base64(payload, newline=False).decode("ascii")
    assert frame == encode({**DELTA, "audio": audio, "server_event_seq": seq})
    assert fields == DELTA  # the engine's event is left as it was


@given(st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_input_audio_decodes_to_the_append_it_stands_for(seq: int, payload: bytes) -> None:
    event = DIALECT.decode_binary(binary.input_message(seq, payload))
    expected: dict[str, object] = {"type": "input_audio_buffer.append", "audio": payload}
    if seq:
        expected["client_event_seq"] = seq
    assert event == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00", "a binary message starts with a 12-byte header; got 2"),
        (b"\x03" + bytes(11), "unknown binary message kind 3"),
        (b"\x01\x01" + bytes(10), "a binary message's flags and reserved bytes must be 0"),
        (b"\x02" + bytes(11), "a client sends binary messages of kind 1 (input audio) only"),
    ],
)
def test_malformed_binary_messages_are_refused_as_before(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        DIALECT.decode_binary(data)
    assert (info.value.code, info.value.message) == (ErrorCode.BAD_EVENT, message)


def test_a_binary_message_is_not_a_text_event() -> None:
    with pytest.raises(ProtocolError) as info:
        DIALECT.decode(b"{}")
    assert info.value.message == "binary frames are not accepted; send JSON text"


def test_below_large_decode_steps_yields_nothing() -> None:
    steps = DIALECT.decode_steps('{"type": "x"}')
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value == {"type": "x"}
