"""dialects/twilio/messages.py: Twilio Media Streams' messages, parsed strictly, and the
``twilio`` dialect's allow-list and opening."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import by_name
from trio_duplex.dialects.twilio import TWILIO, TWILIO_AUDIO
from trio_duplex.dialects.twilio.messages import (
    Connected,
    Dtmf,
    Mark,
    Media,
    Other,
    Start,
    Stop,
    TwilioMessageError,
    parse,
)

STREAM = "MZ" + "1" * 32
ACCOUNT = "AC" + "a" * 32
CALL = "CA" + "b" * 32

# The reference's examples (docs/plans/telephony.md §1.2), with our ids.
CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
START: dict[str, Any] = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": ACCOUNT,
        "streamSid": STREAM,
        "callSid": CALL,
        "tracks": ["inbound", "outbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"trio_duplex_ticket": "v1.o.1.x"},
    },
    "streamSid": STREAM,
}


def media(audio: bytes, **fields: Any) -> dict[str, Any]:
    body = {"track": "inbound", "chunk": "2", "timestamp": "40"}
    body["payload"] = base64.b64encode(audio).decode()
    body |= fields
    return {"event": "media", "sequenceNumber": "3", "media": body, "streamSid": STREAM}


def text(doc: object) -> str:
    return json.dumps(doc)


def test_the_reference_s_messages_parse() -> None:
    assert parse(text(CONNECTED)) == Connected("Call", "1.0.0")
    start = parse(text(START))
    assert isinstance(start, Start)
    assert (start.stream_sid, start.account_sid, start.call_sid) == (STREAM, ACCOUNT, CALL)
    assert start.tracks == ("inbound", "outbound")
    assert start.custom_parameters == {"trio_duplex_ticket": "v1.o.1.x"}
    assert (start.encoding, start.sample_rate, start.channels) == ("audio/x-mulaw", 8000, 1)
    assert "v1.o.1.x" not in repr(start)  # (the ticket)
    heard = parse(text(media(b"\xff" * 160)), STREAM)
    assert heard == Media("inbound", 2, 40, b"\xff" * 160)
    dtmf = {"event": "dtmf", "streamSid": STREAM, "sequenceNumber": "5"}
    assert parse(text(dtmf | {"dtmf": {"track": "inbound_track", "digit": "#"}})) == Dtmf("#")
    mark = {"event": "mark", "streamSid": STREAM, "sequenceNumber": "4", "mark": {"name": "17"}}
    assert parse(text(mark)) == Mark("17")
    stop = {"event": "stop", "sequenceNumber": "6", "streamSid": STREAM}
    assert parse(text(stop | {"stop": {"accountSid": ACCOUNT, "callSid": CALL}})) == Stop()
    # Numbers as numbers are taken as well (their type is not confirmed).
    assert parse(text(media(b"", chunk=2, timestamp=40)), STREAM) == Media("inbound", 2, 40, b"")
    # An event we do not know is not a fault (Twilio may add events).
    assert parse(text({"event": "transcription", "streamSid": STREAM})) == Other()


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"{}", "text messages only"),
        ("[1]", "not a JSON object"),
        ("{", "not a JSON object"),
        (text({"event": 5}), "no string 'event'"),
        (text(media(b"x") | {"streamSid": "MZ123"}), "streamSid must be"),
        (text(media(b"x") | {"streamSid": "MZ" + "2" * 32}), "not this stream's"),
        (text(media(b"x", payload="!!!")), "not valid base64"),
        (text(media(b"x" * 8001)), "at most 8000 bytes"),
        (text(media(b"x", chunk="-1")), "media.chunk"),
        (text(media(b"x", chunk=True)), "media.chunk"),
        (text(media(b"x", timestamp="1e3")), "media.timestamp"),
        (text(media(b"x", track="IN BOUND")), "media.track"),
        (text({"event": "dtmf", "streamSid": STREAM, "dtmf": {"digit": "55"}}), "dtmf.digit"),
        (text({"event": "dtmf", "streamSid": STREAM, "dtmf": {"digit": "E"}}), "dtmf.digit"),
        (text({"event": "mark", "streamSid": STREAM, "mark": {"name": 17}}), "'name'"),
        (text({"event": "mark", "streamSid": STREAM}), "'mark' must be an object"),
        (text(START | {"sequenceNumber": "x"}), "sequenceNumber"),
    ],
)
def test_what_is_not_a_message_is_refused_with_fixed_words(
    message: str | bytes, reason: str
) -> None:
    with pytest.raises(TwilioMessageError) as info:
        parse(message, STREAM)
    assert reason in info.value.reason
    assert "!!!" not in info.value.reason and "IN BOUND" not in info.value.reason


def test_a_start_is_checked_whole() -> None:
    def broken(**fields: Any) -> str:
        return text(START | {"start": START["start"] | fields})

    for bad, reason in [
        (broken(callSid="CA1"), "callSid"),
        (broken(accountSid=None), "accountSid"),
        (broken(streamSid="MZ" + "G" * 32), "streamSid"),
        (broken(tracks="inbound"), "tracks"),
        (broken(tracks=["a"] * 5), "tracks"),
        (broken(customParameters={f"p{i}": "v" for i in range(17)}), "customParameters"),
        (broken(customParameters={"p": 1}), "custom parameter"),
        (broken(customParameters={"p": "v" * 1025}), "custom parameter"),
        (
            broken(mediaFormat={"encoding": "audio/x-mulaw", "sampleRate": "8000", "channels": 1}),
            "integers",
        ),
        (broken(mediaFormat=None), "'mediaFormat'"),
    ]:
        with pytest.raises(TwilioMessageError) as info:
            parse(bad)
        assert reason in info.value.reason
    with pytest.raises(TwilioMessageError, match="a second start"):
        parse(text(START), STREAM)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300)
@given(
    st.sampled_from([CONNECTED, START, media(b"\x7f" * 20), {"event": "dtmf"}, {"event": "mark"}]),
    st.lists(st.tuples(st.text(max_size=12), json_values), max_size=4),
    st.text(max_size=40),
)
def test_any_mutation_is_a_message_or_a_typed_refusal(
    base: dict[str, Any], changes: list[tuple[str, Any]], junk: str
) -> None:
    doc = json.loads(json.dumps(base))
    for key, value in changes:
        target = doc.get("start") or doc.get("media") or doc
        (target if key.startswith("s") else doc)[key] = value
    for message in (text(doc), text(doc)[: len(junk)], junk):
        try:
            parse(message, None if base is START else STREAM)
        except TwilioMessageError as exc:
            assert exc.reason  # fixed words: never the input's
            assert len(junk) < 8 or junk not in exc.reason


def test_the_dialect_reads_only_what_its_channel_writes() -> None:
    assert by_name("twilio") is TWILIO
    for event in (
        {"type": "input.dtmf", "digit": "5"},
        {"type": "session.event_ack", "server_event_seq": 3},
        {"type": "session.close"},
    ):
        assert TWILIO.decode(json.dumps(event)) == event
    for kind in ("session.update", "session.resume", "input.text.append", "response.create"):
        with pytest.raises(ProtocolError) as info:
            TWILIO.decode(json.dumps({"type": kind}))
        assert info.value.code == "bad_event"
    assert TWILIO.decode_binary(b"\x01" + b"\0" * 11 + b"\xff\xff")["audio"] == b"\xff\xff"
    assert (TWILIO.resumes_from_ack, TWILIO.replays_audio, TWILIO.audio_by_transport) == (
        True,
        True,
        True,
    )


def test_the_opening_is_the_door_s_synthetic_query() -> None:
    opened = TWILIO.opening({"open": ["sess_x"]}, None)
    assert opened == {"type": "session.update", "session": {"audio": dict(TWILIO_AUDIO)}}
    resumed = TWILIO.opening({"resume": ["sess_x"]}, "T")
    assert resumed["type"] == "session.resume"
    assert (resumed["session_id"], resumed["resume_token"]) == ("sess_x", "T")
    for query, bearer in (({}, None), ({"resume": ["s"]}, None), ({"open": ["a", "b"]}, None)):
        with pytest.raises(ProtocolError):
            TWILIO.opening(query, bearer)
