"""trio_duplex.testing.twilio_provider, the fake Twilio: its μ-law against G.711's values
(and audioop's, where Python still has it), its signature against twilio-python's
``RequestValidator``, its TwiML parser, and its call against a small scripted asyncio
server here (an HTTP endpoint for the TwiML, a ``websockets`` server for the stream),
with the playout on a ``ManualClock`` the test moves: what has played is decided by the
test, never measured.

Each scenario runs on its own asyncio loop (``run_scenario``), as the process tests run
the fake from trio in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import math
import re
import sys
import threading
import warnings
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from trio_duplex.testing.twilio_provider import (
    FakeTwilio,
    ManualClock,
    Pause,
    Redirect,
    Stream,
    TwiMLError,
    mulaw_decode,
    mulaw_encode,
    parse_twiml,
    run_scenario,
    sign,
    wav_to_ulaw_8k,
)
from trio_duplex.testing.twilio_provider import Hangup as HangupVerb

TOKEN = "12345678901234567890123456789012"
ACCOUNT = "AC" + "0123456789abcdef" * 2
SID = re.compile(r"MZ[0-9a-f]{32}")
WAIT = 5.0

# -- μ-law --------------------------------------------------------------------------------


def _pcm(*samples: int) -> bytes:
    return np.array(samples, dtype="<i2").tobytes()


def _codes(pcm: bytes) -> list[int]:
    return list(mulaw_encode(pcm))


def _decoded(*codes: int) -> list[int]:
    return [int(v) for v in np.frombuffer(mulaw_decode(bytes(codes)), dtype="<i2")]


def test_mulaw_encodes_g711_values() -> None:
    # +0 is 0xFF and -0 0x7F (bits inverted); the largest magnitudes clip to 0x80/0x00.
    assert _codes(_pcm(0, -1, 32767, -32768, -32767, 32635)) == [0xFF, 0x7F, 0x80, 0x00, 0x00, 0x80]
    # 1000 (16-bit) is 250 in G.711's 14-bit scale: segment 3 (223..479), step 16,
    # interval 1 (239..255): 0x31, inverted 0xCE.
    assert _codes(_pcm(1000, -1000)) == [0xCE, 0x4E]


def test_mulaw_decodes_g711_values() -> None:
    # G.711's reconstruction values in its 14-bit scale (x4 in 16-bit): the largest is
    # 8031, each segment's first is 33, 99, 231, 495, 1023, 2079, 4191 (Table 2a).
    assert _decoded(0x80, 0x00, 0xFF, 0x7F) == [8031 * 4, -8031 * 4, 0, 0]
    firsts = [0xFF & ~(segment << 4) for segment in range(1, 8)]
    assert [v // 4 for v in _decoded(*firsts)] == [33, 99, 231, 495, 1023, 2079, 4191]
    assert _decoded(0xF0) == [30 * 4]  # segment 0's last: step 2, 15 steps


def test_mulaw_round_trip_is_within_half_a_step_of_every_sample() -> None:
    every = np.arange(-32768, 32768, dtype=np.int64)
    back = np.frombuffer(mulaw_decode(mulaw_encode(every.astype("<i2").tobytes())), dtype="<i2")
    error = np.abs(back.astype(np.int64) - every)
    inside = np.abs(every) <= 32124
    # A segment's step is twice the one before; half a step is within 1/16 of the sample.
    assert np.all(error[inside] <= np.maximum(8, np.abs(every[inside]) // 16))
    assert error[~inside].max() <= 32768 - 32124  # beyond the largest value: clipped
    # decode(encode(decode(c))) is c for every code but -0 (0x7F decodes to +0's 0).
    codes = bytes(c for c in range(256) if c != 0x7F)
    assert mulaw_encode(mulaw_decode(codes)) == codes


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="audioop was removed in Python 3.13")
def test_mulaw_matches_audioop_where_python_has_it() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop
    # audioop (Sun's g711.c) first shifts the 16-bit sample to G.711's 14 bits, which
    # rounds a negative one down: the two agree on every 14-bit value and on every
    # non-negative sample, and are one code apart at a negative one's boundaries.
    fourteen = np.arange(-32768, 32768, 4, dtype="<i2").tobytes()
    assert mulaw_encode(fourteen) == audioop.lin2ulaw(fourteen, 2)
    positive = np.arange(0, 32768, dtype="<i2").tobytes()
    assert mulaw_encode(positive) == audioop.lin2ulaw(positive, 2)
    every = np.arange(-32768, 32768, dtype="<i2").tobytes()
    ours, theirs = mulaw_encode(every), audioop.lin2ulaw(every, 2)
    assert 0 < sum(x != y for x, y in zip(ours, theirs, strict=True)) < 512
    assert all(abs(x - y) <= 1 for x, y in zip(ours, theirs, strict=True))
    codes = bytes(range(256))
    assert mulaw_decode(codes) == audioop.ulaw2lin(codes, 2)


def test_mulaw_refuses_half_a_sample() -> None:
    with pytest.raises(ValueError, match="even number"):
        mulaw_encode(b"\x00\x01\x02")


def _wav(samples: np.ndarray[Any, np.dtype[Any]], rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def _tone(frequency: float, rate: int, seconds: float = 0.5) -> np.ndarray[Any, np.dtype[Any]]:
    t = np.arange(int(rate * seconds)) / rate
    return np.round(10000 * np.sin(2 * math.pi * frequency * t))


def _rms(ulaw: bytes) -> float:
    pcm = np.frombuffer(mulaw_decode(ulaw), dtype="<i2").astype(np.float64)[400:-400]
    return float(np.sqrt(np.mean(pcm**2)))


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_wav_to_ulaw_8k_keeps_the_voice_band_and_removes_what_would_alias(rate: int) -> None:
    kept = wav_to_ulaw_8k(_wav(_tone(1000, rate), rate))
    assert len(kept) == 4000  # half a second at 8 kHz
    assert 0.9 < _rms(kept) / (10000 / math.sqrt(2)) < 1.1
    if rate > 8000:  # 6 kHz is above 8 kHz's Nyquist: decimating without a filter aliases it
        assert _rms(wav_to_ulaw_8k(_wav(_tone(6000, rate), rate))) < 100


def test_wav_to_ulaw_8k_refuses_what_it_cannot_resample(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="multiples of 8000"):
        wav_to_ulaw_8k(_wav(_tone(440, 44100), 44100))
    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(b"\x00" * 64)
    with pytest.raises(ValueError, match="mono"):
        wav_to_ulaw_8k(path)


# -- the signature ------------------------------------------------------------------------

_chars = st.characters(exclude_categories=["Cs"])  # (no lone surrogates: not UTF-8)
_text = st.text(_chars, max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    token=st.text(_chars, min_size=1, max_size=40),
    url=st.builds(
        lambda host, path, query: f"https://{host}.example/{path}" + (f"?{query}" if query else ""),
        st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9/_.-]{0,30}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9=&%_]{0,30}", fullmatch=True),
    ),
    params=st.dictionaries(_text, _text, max_size=8),
)
def test_sign_is_twilio_pythons_signature(token: str, url: str, params: dict[str, str]) -> None:
    signature = sign(token, url, params)
    assert signature == RequestValidator(token).compute_signature(url, params)
    assert RequestValidator(token).validate(url, params, signature)
    assert not RequestValidator(token).validate(url + "x", params, signature)


class _MultiDict:
    """What twilio-python's validator reads repeated names from (``getall``, as Flask's)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def __iter__(self) -> Any:
        return iter([name for name, _ in self.pairs])

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def getall(self, name: str) -> list[str]:
        return [value for n, value in self.pairs if n == name]


@settings(deadline=None)
@given(pairs=st.lists(st.tuples(st.sampled_from("abc"), _text), max_size=8))
def test_sign_sorts_a_repeated_names_values_as_twilio_python(pairs: list[tuple[str, str]]) -> None:
    url = "https://example.com/v1/twilio/twiml?resume=1"
    expected = RequestValidator(TOKEN).compute_signature(url, _MultiDict(pairs))
    assert sign(TOKEN, url, pairs) == expected


def test_sign_known_vector() -> None:
    """The string signed, written out: URL then names and values sorted by name."""
    import base64 as b64
    import hashlib
    import hmac

    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {"To": "+18005551212", "From": "+14158675310", "CallSid": "CA1234567890ABCDE"}
    signed = url + "CallSidCA1234567890ABCDEFrom+14158675310To+18005551212"
    mac = hmac.new(TOKEN.encode(), signed.encode(), hashlib.sha1).digest()
    assert sign(TOKEN, url, params) == b64.b64encode(mac).decode()
    assert sign(TOKEN, url, params) != sign(TOKEN[:-1] + "3", url, params)


# -- TwiML --------------------------------------------------------------------------------

DOCUMENT = """<?xml version="1.0" encoding="UTF-8"?>
<Response>
  <Pause length="1"/>
  <Connect>
    <Stream url="wss://example.com/v1/twilio" statusCallback="https://example.com/s">
      <Parameter name="trio_duplex_ticket" value="v1.o.1764760000.Q0FG&amp;"/>
      <Parameter name="second" value=""/>
    </Stream>
  </Connect>
  <Redirect method="POST">https://example.com/v1/twilio/twiml?resume=1&amp;attempt=1</Redirect>
  <Hangup/>
</Response>"""


def test_parse_twiml_reads_the_verbs_in_order() -> None:
    assert parse_twiml(DOCUMENT) == [
        Pause(1.0),
        Stream(
            "wss://example.com/v1/twilio",
            {"trio_duplex_ticket": "v1.o.1764760000.Q0FG&", "second": ""},
            {"url": "wss://example.com/v1/twilio", "statusCallback": "https://example.com/s"},
        ),
        Redirect("https://example.com/v1/twilio/twiml?resume=1&attempt=1", "POST"),
        HangupVerb(),
    ]
    assert parse_twiml(b"<Response><Redirect method='get'>/x</Redirect></Response>") == [
        Redirect("/x", "GET")
    ]
    assert parse_twiml("<Response/>") == []


@pytest.mark.parametrize(
    "document",
    [
        "",
        "<Response>",
        "<Twiml/>",
        "<Response><Say>hello</Say></Response>",
        "<Response><Connect/></Response>",
        "<Response><Connect><Stream url='wss://a'/><Stream url='wss://b'/></Connect></Response>",
        "<Response><Connect><Stream/></Connect></Response>",
        "<Response><Connect><Stream url='wss://a'><Parameter name='x'/></Stream></Connect>"
        "</Response>",
        "<Response><Redirect/></Response>",
        "<Response><Redirect method='PUT'>/x</Redirect></Response>",
        "<Response><Pause length='soon'/></Response>",
        "<Response><Pause length='-1'/></Response>",
    ],
)
def test_parse_twiml_refuses_what_the_fake_cannot_run(document: str) -> None:
    with pytest.raises(TwiMLError):
        parse_twiml(document)


@settings(deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_parse_twiml_takes_anything_with_a_typed_error(document: str | bytes) -> None:
    try:
        parse_twiml(document)
    except TwiMLError:
        pass


# -- a scripted server --------------------------------------------------------------------


@dataclass
class Posted:
    path: str
    headers: dict[str, str]
    form: list[tuple[str, str]]


@dataclass
class Script:
    """The test's side of the call: the TwiML answered to each request, in turn, and each
    stream's WebSocket as it opens."""

    documents: list[str]
    posts: list[Posted] = field(default_factory=list)
    streams: asyncio.Queue[ServerConnection] = field(default_factory=asyncio.Queue)
    http_url: str = ""
    ws_url: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def next_stream(self) -> ServerConnection:
        async with asyncio.timeout(WAIT):
            return await self.streams.get()


async def _http(script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    path = head[0].split(" ")[1]
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    script.posts.append(Posted(path, headers, parse_qsl(body.decode(), keep_blank_values=True)))
    document = script.documents.pop(0).format(ws=script.ws_url, http=script.http_url).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nConnection: close\r\n"
        + f"Content-Length: {len(document)}\r\n\r\n".encode()
        + document
    )
    await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def scripted(*documents: str) -> AsyncIterator[Script]:
    script = Script(list(documents))

    async def stream(ws: ServerConnection) -> None:
        await script.streams.put(ws)
        await ws.wait_closed()

    http = await asyncio.start_server(lambda r, w: _http(script, r, w), "127.0.0.1", 0)

    def only_the_stream_path(ws: ServerConnection, request: Request) -> Response | None:
        return None if request.path == "/stream" else ws.respond(403, "no such stream\n")

    async with (
        http,
        serve(
            stream, "127.0.0.1", 0, compression=None, process_request=only_the_stream_path
        ) as ws_server,
    ):
        script.http_url = f"http://127.0.0.1:{http.sockets[0].getsockname()[1]}"
        script.ws_url = f"ws://127.0.0.1:{next(iter(ws_server.sockets)).getsockname()[1]}/stream"
        yield script


CONNECT = (
    "<Response><Connect><Stream url='{ws}'>"
    "<Parameter name='trio_duplex_ticket' value='t1'/></Stream></Connect>"
    "<Redirect>{http}/twiml?resume=1</Redirect></Response>"
)
HANGUP = "<Response><Hangup/></Response>"


async def _recv(ws: ServerConnection) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        message: dict[str, Any] = json.loads(await ws.recv())
    return message


async def _opened(ws: ServerConnection) -> tuple[dict[str, Any], dict[str, Any]]:
    return await _recv(ws), await _recv(ws)


def _media(sid: str, data: bytes) -> str:
    payload = base64.b64encode(data).decode()
    return json.dumps({"event": "media", "streamSid": sid, "media": {"payload": payload}})


def _mark(sid: str, name: str) -> str:
    return json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": name}})


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    run_scenario(scenario, timeout=30)


# -- the call -----------------------------------------------------------------------------


def test_a_call_posts_the_signed_webhook_and_opens_the_signed_stream() -> None:
    async def scenario() -> None:
        async with scripted(CONNECT) as script, FakeTwilio(script.http_url, TOKEN, ACCOUNT) as tw:
            placing = asyncio.create_task(tw.place_call("/twiml", from_="+15551230000"))
            ws = await script.next_stream()
            connected, start = await _opened(ws)
            call = await placing

            (post,) = script.posts
            form = dict(post.form)
            assert post.path == "/twiml"
            assert form == {
                "AccountSid": ACCOUNT,
                "ApiVersion": "2010-04-01",
                "CallSid": call.call_sid,
                "CallStatus": "ringing",
                "Direction": "inbound",
                "From": "+15551230000",
                "To": "+15005550001",
            }
            assert re.fullmatch(r"CA[0-9a-f]{32}", call.call_sid)
            url = script.http_url + "/twiml"
            validator = RequestValidator(TOKEN)
            assert validator.validate(url, form, post.headers["x-twilio-signature"])
            assert post.headers["content-type"].startswith("application/x-www-form-urlencoded")

            assert ws.request is not None
            upgrade_signature = ws.request.headers["X-Twilio-Signature"]
            assert upgrade_signature == validator.compute_signature(script.ws_url, {})
            assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
            sid = start["streamSid"]
            assert SID.fullmatch(sid) and sid == call.stream_sid
            assert start == {
                "event": "start",
                "sequenceNumber": "1",
                "streamSid": sid,
                "start": {
                    "streamSid": sid,
                    "accountSid": ACCOUNT,
                    "callSid": call.call_sid,
                    "tracks": ["inbound", "outbound"],
                    "customParameters": {"trio_duplex_ticket": "t1"},
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                },
            }
            await call.dtmf("5")
            assert await _recv(ws) == {
                "event": "dtmf",
                "sequenceNumber": "2",
                "streamSid": sid,
                "dtmf": {"track": "inbound_track", "digit": "5"},
            }
            with pytest.raises(ValueError, match="DTMF"):
                await call.dtmf("x")
            await call.stop()
            assert await _recv(ws) == {
                "event": "stop",
                "sequenceNumber": "3",
                "streamSid": sid,
                "stop": {"accountSid": ACCOUNT, "callSid": call.call_sid},
            }
            assert call.state == "completed" and call.streams[0].ended_by == "stop"
            assert len(script.posts) == 1  # the caller hung up: no <Redirect>

    run(scenario)


def test_media_goes_out_every_20ms_of_the_clock_in_160_byte_chunks() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with (
            scripted(CONNECT) as script,
            FakeTwilio(script.http_url, TOKEN, ACCOUNT, clock=clock) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            ws = await script.next_stream()
            await _opened(ws)
            call = await placing
            audio = bytes(range(200)) + bytes(range(200))  # 400 bytes: 2.5 chunks
            sending = asyncio.create_task(call.send_audio(audio))
            first = await _recv(ws)
            await clock.wait_sleeping(1)  # the sender, parked until the clock moves
            assert not sending.done()
            assert sum(1 for s in call.sent if s.message["event"] == "media") == 1
            clock.advance(0.02)
            second = await _recv(ws)
            clock.advance(0.02)
            third = await _recv(ws)
            async with asyncio.timeout(WAIT):
                await sending
            chunks = [first, second, third]
            assert [m["media"]["chunk"] for m in chunks] == ["1", "2", "3"]
            assert [m["media"]["timestamp"] for m in chunks] == ["0", "20", "40"]
            assert [m["sequenceNumber"] for m in chunks] == ["2", "3", "4"]
            assert {m["media"]["track"] for m in chunks} == {"inbound"}
            payloads = b"".join(base64.b64decode(m["media"]["payload"]) for m in chunks)
            assert payloads == audio + b"\xff" * 80  # the last chunk padded with silence
            await call.stop()

    run(scenario)


def test_a_mark_is_echoed_when_the_audio_before_it_has_played() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with (
            scripted(CONNECT) as script,
            FakeTwilio(script.http_url, TOKEN, ACCOUNT, clock=clock) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            ws = await script.next_stream()
            _, start = await _opened(ws)
            call = await placing
            sid = start["streamSid"]
            started = clock.now()
            await ws.send(_mark(sid, "nothing-before"))  # nothing buffered: echoed at once
            echo = await _recv(ws)
            assert echo == {
                "event": "mark",
                "sequenceNumber": "2",
                "streamSid": sid,
                "mark": {"name": "nothing-before"},
            }
            await ws.send(_media(sid, b"\x01" * 400))
            await ws.send(_media(sid, b"\x02" * 400))  # 100 ms in all
            await ws.send(_mark(sid, "m1"))
            await call.wait_for(lambda c: len(c.received_events("mark")) == 2, WAIT)

            clock.advance(0.099)
            await call.flush_playout()
            assert [e.name for e in call.marks_echoed] == ["nothing-before"]
            assert len(call.audio_heard()) == 792 and call.buffered == 8
            clock.advance(0.001)
            await call.flush_playout()
            assert (await _recv(ws))["mark"] == {"name": "m1"}
            assert [e.name for e in call.marks_echoed] == ["nothing-before", "m1"]
            assert call.audio_heard() == b"\x01" * 400 + b"\x02" * 400
            assert call.played[0].at == started and call.buffered == 0

            # The playout's own clock does the same without a flush: the next audio,
            # after a gap, plays from when it came.
            clock.advance(1.0)
            await ws.send(_media(sid, b"\x03" * 160))
            await ws.send(_mark(sid, "m2"))
            await call.wait_for(lambda c: len(c.received_events("mark")) == 3, WAIT)
            clock.advance(0.02)
            assert (await _recv(ws))["mark"] == {"name": "m2"}
            assert call.played[-1].at == pytest.approx(started + 1.1)
            assert call.gaps == [pytest.approx((started + 0.1, started + 1.1))]
            assert all(not e.cleared for e in call.marks_echoed)
            await call.stop()

    run(scenario)


@pytest.mark.parametrize("echo_cleared", [True, False])
def test_clear_drops_the_buffer_and_releases_its_marks(echo_cleared: bool) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with (
            scripted(CONNECT) as script,
            FakeTwilio(
                script.http_url, TOKEN, ACCOUNT, clock=clock, echo_cleared_marks=echo_cleared
            ) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            ws = await script.next_stream()
            _, start = await _opened(ws)
            call = await placing
            sid = start["streamSid"]
            await ws.send(_media(sid, b"\x01" * 8000))  # a second
            await ws.send(_mark(sid, "a"))
            await ws.send(_media(sid, b"\x02" * 800))
            await ws.send(_mark(sid, "b"))
            await call.wait_for(lambda c: len(c.received_events("mark")) == 2, WAIT)
            clock.advance(0.5)
            await ws.send(json.dumps({"event": "clear", "streamSid": sid}))
            await call.wait_for(lambda c: c.clears, WAIT)
            if echo_cleared:
                assert [(await _recv(ws))["mark"]["name"] for _ in "ab"] == ["a", "b"]
                assert [(e.name, e.cleared) for e in call.marks_echoed] == [
                    ("a", True),
                    ("b", True),
                ]
            else:
                assert [e.name for e in call.marks_dropped] == ["a", "b"]
                assert call.marks_echoed == []
            assert call.audio_heard() == b"\x01" * 4000 and call.buffered == 0
            # After the clear, new audio plays at once and its mark comes when it has.
            await ws.send(_media(sid, b"\x03" * 80))
            await ws.send(_mark(sid, "c"))
            await call.wait_for(lambda c: len(c.received_events("mark")) == 3, WAIT)
            clock.advance(0.01)
            assert (await _recv(ws))["mark"]["name"] == "c"
            assert call.audio_heard() == b"\x01" * 4000 + b"\x03" * 80
            await call.stop()

    run(scenario)


def test_a_server_close_runs_the_redirect_on_a_new_stream_of_the_same_call() -> None:
    async def scenario() -> None:
        async with (
            scripted(CONNECT, CONNECT.replace("t1", "t2"), HANGUP) as script,
            FakeTwilio(script.http_url, TOKEN, ACCOUNT) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            first = await script.next_stream()
            _, start1 = await _opened(first)
            call = await placing
            await first.close(1000)

            second = await script.next_stream()
            _, start2 = await _opened(second)
            assert start2["sequenceNumber"] == "1"
            assert start2["start"]["callSid"] == call.call_sid
            assert start2["start"]["customParameters"] == {"trio_duplex_ticket": "t2"}
            assert start2["streamSid"] != start1["streamSid"]
            redirect = script.posts[1]
            assert redirect.path == "/twiml?resume=1"
            form = dict(redirect.form)
            assert form["CallStatus"] == "in-progress" and form["CallSid"] == call.call_sid
            url = script.http_url + "/twiml?resume=1"
            assert RequestValidator(TOKEN).validate(
                url, form, redirect.headers["x-twilio-signature"]
            )

            await second.send(_mark(start2["streamSid"], "on-2"))
            await call.wait_for(lambda c: c.marks_echoed, WAIT)
            assert [r.stream for r in call.received] == [1]
            assert call.marks_echoed[0].stream == 1
            await second.close(1008, "refused")
            await call.wait_ended(WAIT)  # the third document: <Hangup/>
            assert [s.ended_by for s in call.streams] == ["server_close", "server_close"]
            assert [s.close_code for s in call.streams] == [1000, 1008]
            assert call.state == "completed" and len(script.posts) == 3

    run(scenario)


@pytest.mark.parametrize("follow", [False, True])
def test_a_dropped_stream_ends_the_call_unless_told_to_follow(follow: bool) -> None:
    async def scenario() -> None:
        async with (
            scripted(CONNECT, HANGUP) as script,
            FakeTwilio(script.http_url, TOKEN, ACCOUNT, follow_redirect_on_drop=follow) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            ws = await script.next_stream()
            await _opened(ws)
            call = await placing
            ws.transport.abort()  # no close frame
            await call.wait_ended(WAIT)
            assert call.streams[0].ended_by == "drop"
            assert len(script.posts) == (2 if follow else 1)
            assert call.state == "completed"

    run(scenario)


def test_what_the_caller_says_in_a_redirects_gap_is_lost() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        paused = CONNECT.replace("<Response>", "<Response><Pause length='1'/>")
        async with (
            scripted(CONNECT, paused, HANGUP) as script,
            FakeTwilio(script.http_url, TOKEN, ACCOUNT, clock=clock) as tw,
        ):
            placing = asyncio.create_task(tw.place_call("/twiml"))
            first = await script.next_stream()
            await _opened(first)
            call = await placing
            await first.close()
            await clock.wait_sleeping(1)  # the second document's <Pause>
            await call.send_audio(b"\x01" * 320, realtime=False)
            assert call.lost == 320 and call.streams[0].ended_by == "server_close"
            clock.advance(1)
            second = await script.next_stream()
            _, start = await _opened(second)
            assert start["streamSid"] == call.stream_sid != call.streams[0].stream_sid
            await call.send_audio(b"\x02" * 320, realtime=False)
            media = [await _recv(second), await _recv(second)]
            # The new stream counts afresh; audio sent faster than real time is still
            # stamped 20 ms a chunk apart (its presentation time).
            assert [m["media"]["chunk"] for m in media] == ["1", "2"]
            assert [m["media"]["timestamp"] for m in media] == ["0", "20"]
            assert [m["sequenceNumber"] for m in media] == ["2", "3"]
            assert base64.b64decode(media[1]["media"]["payload"]) == b"\x02" * 160
            assert call.lost == 320
            await call.stop()

    run(scenario)


def test_a_refused_upgrade_runs_the_next_verb_and_an_ended_call_takes_no_audio() -> None:
    async def scenario() -> None:
        refusing = "<Response><Connect><Stream url='{ws}/no'/></Connect>" + HANGUP[10:]
        async with scripted(refusing) as script, FakeTwilio(script.http_url, TOKEN, ACCOUNT) as tw:
            call = await tw.place_call("/twiml")
            await call.wait_ended(WAIT)
            (stream,) = call.streams
            assert stream.ended_by == "refused" and stream.refused_status == 403
            assert call.state == "completed"
            with pytest.raises(Exception, match="ended"):
                await call.send_audio(b"\xff" * 160, realtime=False)

    run(scenario)


async def test_run_scenario_runs_the_fake_from_trio_in_a_thread() -> None:
    async def scenario(n: int) -> tuple[int, int]:
        asyncio.get_running_loop()  # (an asyncio loop runs it)
        return n, threading.get_ident()

    n, thread = await trio.to_thread.run_sync(run_scenario, scenario, 2)
    assert n == 2 and thread != threading.get_ident()

    async def stuck() -> None:
        await asyncio.Event().wait()

    with pytest.raises(TimeoutError):  # the bound ends a scenario that would hang the test
        await trio.to_thread.run_sync(lambda: run_scenario(stuck, timeout=0.01))


def test_the_fakes_repr_keeps_the_auth_token_out() -> None:
    async def scenario() -> str:
        async with FakeTwilio("http://127.0.0.1:1", TOKEN, ACCOUNT) as tw:
            return repr(tw)

    shown = run_scenario(scenario)
    assert ACCOUNT in shown and TOKEN not in shown
