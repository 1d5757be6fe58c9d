"""A fake Twilio for the tests: a phone call placed through our TwiML endpoint and played
over a Media Streams WebSocket, as Twilio's public reference describes them.

Written from the reference below, never from this server's code: the module imports
nothing from ``trio_duplex`` (tests/test_layout.py holds it to that), so that a mistake in
our reading of Twilio made on the server's side is not made again here and then agreed
with. It runs on asyncio (``websockets``' asyncio client, ``httpx2``), in a thread of a
trio test::

    from trio_duplex.testing.twilio_provider import FakeTwilio, run_scenario

    async def scenario(base_url: str) -> list[str]:
        async with FakeTwilio(base_url, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.send_audio(wav_to_ulaw_8k(path))
            await call.wait_for(lambda c: c.marks_echoed, timeout=30)
            await call.stop()
            return [m.name for m in call.marks_echoed]

    names = await trio.to_thread.run_sync(run_scenario, scenario, base_url)

What it does, in order (docs/plans/telephony.md §7.3):

* ``place_call`` POSTs the voice webhook's form (``AccountSid``, ``CallSid``, ``From``,
  ``To``, ``CallStatus=ringing``, ``Direction=inbound``, ``ApiVersion=2010-04-01``) signed
  with ``X-Twilio-Signature`` (``sign``, HMAC-SHA1 of the URL and the sorted parameters);
* parses the TwiML (``parse_twiml``: ``<Connect><Stream url>`` with its ``<Parameter>``
  nouns, ``<Redirect>``, ``<Pause>``, ``<Hangup/>``; anything else is a ``TwiMLError``, so
  that a verb the fake cannot run fails a test instead of being skipped);
* opens the ``<Stream>`` URL with ``X-Twilio-Signature`` over that URL, sends
  ``connected`` then ``start`` (a new ``MZ…`` streamSid, ``customParameters`` from the
  ``<Parameter>`` nouns), and every later message with ``sequenceNumber`` (a string from
  ``"1"``) and ``streamSid``;
* sends the caller's audio as ``media`` (160 bytes of μ-law every 20 ms, ``chunk`` from
  ``"1"``, ``timestamp`` in ms since the stream began, track ``inbound``), ``dtmf``
  (track ``inbound_track``) and ``stop``;
* plays what the server sends on a playout clock: ``media`` payloads are appended to a
  buffer drained at 8000 bytes a second; a ``mark`` is echoed when the audio received
  before it has played; ``clear`` empties the buffer and echoes the marks still pending
  (Twilio's page: clear "empties all buffered audio and causes any mark messages to be
  sent back"; ``echo_cleared_marks=False`` drops them instead, the other reading);
* when the server closes the WebSocket, runs the TwiML's next verb: a ``<Redirect>`` is
  fetched (signed, ``CallStatus=in-progress``) and its ``<Stream>`` opened with a new
  streamSid, on the same ``FakeCall``; a ``<Hangup/>`` or the end of the document ends
  the call.

A WebSocket that *drops* (closed without a close frame) ends the call unless
``follow_redirect_on_drop=True``: Twilio documents only that a close by the server runs
the next verb ("the only way Twilio executes TwiML instructions after <Connect><Stream> is
if your server closes the WebSocket connection" [S2]); what it does on a drop is
UNCONFIRMED (telephony.md §1.2), so the default is the documented behaviour and a test of
the drop path asks for the other one explicitly.

Time: every timestamp and every wait for media (the 20 ms clock of ``send_audio``, the
playout, ``<Pause>``) is on a ``Clock``: ``MonotonicClock`` by default, ``ManualClock``
in the tests of the playout, which advance it by hand. The waits for the server
(``wait_for``, the HTTP requests, the WebSocket's open and close) are bounded in real
time, whatever the clock.

What was read (through the search index's copies, 2026-12-03):

* [S1] Twilio, "Media Streams - WebSocket Messages",
  https://www.twilio.com/docs/voice/media-streams/websocket-messages (read in full in a
  2024 copy of the page, github:robert-at-pretension-io/rust_web_scraper
  ``output/twilio-media-streams-websocket-messages-documentation.md``): ``connected``
  (``protocol`` "Call", ``version`` "1.0.0", no sequenceNumber in the example), ``start``
  (``sequenceNumber`` "1", ``start.{streamSid, accountSid, callSid, tracks,
  customParameters, mediaFormat{encoding "audio/x-mulaw", sampleRate 8000, channels 1}}``
  and a top-level ``streamSid``), ``media`` (``media.{track, chunk, timestamp,
  payload}``, strings), ``stop`` (``stop.{accountSid, callSid}``), ``dtmf``
  (``dtmf.{track "inbound_track", digit}``), ``mark`` (``mark.name``); to Twilio
  ``media``, ``mark`` and ``clear``, and the sentence on ``clear`` quoted above.
* [S2] Twilio, "TwiML Voice: <Stream>", https://www.twilio.com/docs/voice/twiml/stream
  (``<Connect><Stream>`` is bidirectional; the next verb runs only after the server
  closes the WebSocket; ``url`` relative or absolute, ``wss``).
* Twilio, "TwiML Voice: <Redirect>", https://www.twilio.com/docs/voice/twiml/redirect
  (``method`` GET or POST, POST the default; the noun is an absolute or relative URL;
  verbs after it are unreachable).
* Twilio, "TwiML Voice: Twilio's Request",
  https://www.twilio.com/docs/api/twiml/twilio_request, and a recorded webhook
  (gist jonahglover/5887ef900cc6890abda1): ``CallSid``, ``AccountSid``, ``From``, ``To``,
  ``CallStatus`` (``ringing``), ``Direction`` (``inbound``), ``ApiVersion``
  (``2010-04-01``).
* Twilio, "Secure webhooks", https://www.twilio.com/docs/usage/webhooks/webhooks-security,
  and twilio-python's ``twilio/request_validator.py`` (9.13.0): the full URL, then each
  parameter's name and value, sorted by name (and a repeated name's values sorted),
  HMAC-SHA1 keyed with the Auth Token, base64.
* carrierx FlexML ``<Parameter>`` (https://docs.carrierx.com/flexml/flexml-api/flexml-syntax/parameter),
  a Twilio-compatible page: ``<Parameter name value/>`` inside ``<Stream>`` reaches the
  server as ``start.customParameters``.
* G.711 μ-law: ITU-T G.711 (1988) Table 2a; the encoder is the usual reading of it (bias
  0x84, clip 32635, bits inverted), the decoder its inverse.

UNCONFIRMED, and what the fake does: which spelling of the stream's URL Twilio signs on the
upgrade (it signs the URL as the TwiML wrote it, ``sign_stream_url_as="https"`` signs its
``https`` twin); whether Twilio negotiates permessage-deflate or pings (the fake does
neither); what happens to audio still buffered when a stream closes (discarded); what
Twilio does when a stream's upgrade is refused (the fake runs the next verb, as on a close).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import io
import json
import secrets
import sys
import time
import wave
import xml.etree.ElementTree as ET
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import httpx2
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

RATE: Final = 8000
"""Twilio's media rate: μ-law, 8 kHz, mono, a byte a sample."""
CHUNK: Final = 160
"""Bytes of μ-law in one inbound ``media`` message: 20 ms."""
CHUNK_S: Final = CHUNK / RATE
SILENCE: Final = 0xFF
"""μ-law's code for +0."""
WAIT_S: Final = 10.0
"""The default bound on a wait for the server (a request, an open, an event)."""
DTMF_DIGITS: Final = frozenset("0123456789*#")

T = TypeVar("T")
Message = dict[str, Any]


class FakeTwilioError(Exception):
    """The fake could not do what a test asked (the server answered what Twilio would
    not accept, or the call is not in a state to do it)."""


class TwiMLError(FakeTwilioError):
    """A TwiML document the fake cannot run: not XML, not a ``<Response>``, or a verb it
    does not know."""


# -- signatures --------------------------------------------------------------------------


def sign(
    auth_token: str, url: str, params: Mapping[str, str] | Iterable[tuple[str, str]] = ()
) -> str:
    """``X-Twilio-Signature`` for a request to ``url`` with the POST parameters ``params``
    (none for a GET or a WebSocket upgrade): base64 of HMAC-SHA1, keyed with the Auth
    Token, over the URL followed by each parameter's name and value, sorted by name and,
    for a repeated name, by value."""
    pairs = list(params.items()) if isinstance(params, Mapping) else list(params)
    # twilio-python's validator signs each distinct (name, value) once.
    signed = url + "".join(name + value for name, value in sorted(set(pairs)))
    mac = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


# -- G.711 μ-law -------------------------------------------------------------------------

_BIAS: Final = 0x84
_CLIP: Final = 32635


def _encode_sample(sample: int) -> int:
    sign_bit = 0x80 if sample < 0 else 0
    magnitude = min(-sample if sample < 0 else sample, _CLIP) + _BIAS
    exponent = max(0, magnitude.bit_length() - 8)  # the segment: 0..7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return ~(sign_bit | (exponent << 4) | mantissa) & 0xFF


def _decode_code(code: int) -> int:
    code = ~code & 0xFF
    exponent = (code >> 4) & 0x07
    magnitude = (((code & 0x0F) << 3) + _BIAS) << exponent
    return -(magnitude - _BIAS) if code & 0x80 else magnitude - _BIAS


_ENCODE: Final = bytes(_encode_sample(s - 65536 if s >= 32768 else s) for s in range(65536))
"""μ-law code of each 16-bit sample, indexed by the sample as unsigned."""
_DECODE: Final = array("h", (_decode_code(c) for c in range(256)))


def _samples(pcm16: bytes) -> array[int]:
    if len(pcm16) % 2:
        raise ValueError("PCM16 must be an even number of bytes")
    samples = array("h")
    samples.frombytes(pcm16)
    if sys.byteorder == "big":
        samples.byteswap()
    return samples


def mulaw_encode(pcm16: bytes) -> bytes:
    """Little-endian signed 16-bit PCM to G.711 μ-law, a byte a sample."""
    table = _ENCODE
    return bytes(table[s & 0xFFFF] for s in _samples(pcm16))


def mulaw_decode(ulaw: bytes) -> bytes:
    """G.711 μ-law to little-endian signed 16-bit PCM."""
    out = array("h", (_DECODE[c] for c in ulaw))
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def _lowpass_decimate(samples: np.ndarray[Any, np.dtype[np.float64]], factor: int) -> bytes:
    """Every ``factor``-th sample after a windowed-sinc low-pass at 0.45 of the new rate
    (3.4 kHz at 8 kHz: the telephone band), as PCM16."""
    taps = 32 * factor + 1
    n = np.arange(taps) - (taps - 1) / 2
    cutoff = 0.9 / (2 * factor)  # of the input rate
    kernel = 2 * cutoff * np.sinc(2 * cutoff * n) * np.blackman(taps)
    kernel /= kernel.sum()
    delay = (taps - 1) // 2
    filtered = np.convolve(samples, kernel)[delay : delay + len(samples) : factor]
    return bytes(np.clip(np.round(filtered), -32768, 32767).astype("<i2").tobytes())


def wav_to_ulaw_8k(wav_file: str | Path | bytes) -> bytes:
    """A mono PCM16 WAV (a path or its bytes) at 8 kHz or a multiple of it (16, 24, 32,
    48 kHz) as 8 kHz μ-law: what a phone sends. Any other WAV is a ``ValueError``."""
    source = io.BytesIO(wav_file) if isinstance(wav_file, bytes) else str(wav_file)
    with wave.open(source, "rb") as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise ValueError("only mono 16-bit PCM WAV files are read")
        rate = wav.getframerate()
        pcm = wav.readframes(wav.getnframes())
    if rate % RATE:
        raise ValueError(f"a WAV at {rate} Hz: only multiples of {RATE} Hz are resampled")
    if rate != RATE:
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        pcm = _lowpass_decimate(samples, rate // RATE)
    return mulaw_encode(pcm)


# -- TwiML -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """``<Connect><Stream url>``, with its ``<Parameter>`` nouns (in document order)."""

    url: str
    parameters: dict[str, str]
    attributes: dict[str, str]


@dataclass(frozen=True)
class Redirect:
    url: str
    method: Literal["GET", "POST"] = "POST"


@dataclass(frozen=True)
class Pause:
    length: float = 1.0


@dataclass(frozen=True)
class Hangup:
    pass


Verb = Stream | Redirect | Pause | Hangup


def parse_twiml(document: str | bytes) -> list[Verb]:
    """The verbs of a TwiML ``<Response>``, in order; ``TwiMLError`` for anything else
    (or a ``<Connect>`` holding anything but one ``<Stream>``)."""
    try:
        root = ET.fromstring(document)
    except ET.ParseError as e:
        raise TwiMLError("not an XML document") from e
    if root.tag != "Response":
        raise TwiMLError("the document is not a <Response>")
    verbs: list[Verb] = []
    for element in root:
        if element.tag == "Connect":
            nouns = list(element)
            if len(nouns) != 1 or nouns[0].tag != "Stream":
                raise TwiMLError("<Connect> holds something other than one <Stream>")
            verbs.append(_stream(nouns[0]))
        elif element.tag == "Redirect":
            method = element.get("method", "POST").upper()
            url = (element.text or "").strip()
            if method not in ("GET", "POST") or not url:
                raise TwiMLError("a <Redirect> without a URL or with another method")
            verbs.append(Redirect(url, "GET" if method == "GET" else "POST"))
        elif element.tag == "Pause":
            try:
                length = float(element.get("length", "1"))
            except ValueError as e:
                raise TwiMLError("a <Pause> length that is not a number") from e
            if not 0 <= length <= 600:
                raise TwiMLError("a <Pause> length out of range")
            verbs.append(Pause(length))
        elif element.tag == "Hangup":
            verbs.append(Hangup())
        else:
            raise TwiMLError(f"a verb the fake does not run: <{element.tag[:40]}>")
    return verbs


def _stream(element: ET.Element) -> Stream:
    url = element.get("url")
    if not url:
        raise TwiMLError("a <Stream> without a url")
    parameters: dict[str, str] = {}
    for noun in element:
        name, value = noun.get("name"), noun.get("value")
        if noun.tag != "Parameter" or name is None or value is None:
            raise TwiMLError("a <Stream> noun that is not a <Parameter name value>")
        parameters[name] = value
    return Stream(url, parameters, dict(element.attrib))


def _ws_url(url: str, base: str) -> str:
    """A ``<Stream>`` URL resolved against the TwiML's URL, with a WebSocket scheme."""
    parts = urlsplit(urljoin(base, url))
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise TwiMLError("a <Stream> url that is not a WebSocket URL")
    return urlunsplit(parts._replace(scheme=scheme))


def _https_twin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme={"wss": "https", "ws": "http"}[parts.scheme]))


# -- clocks ------------------------------------------------------------------------------


class Clock(Protocol):
    """The media's time: what ``send_audio`` paces by and the playout drains by."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    """Real time: ``time.monotonic``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


class ManualClock:
    """Time that moves only when the test says so (``advance``): the playout's tests
    decide what has played, instead of measuring wall time."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._parked = asyncio.Condition()

    def now(self) -> float:
        return self._now

    @property
    def sleeping(self) -> int:
        """How many tasks wait for the clock to move."""
        return len(self._sleepers)

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (deadline, woken)
        self._sleepers.append(entry)
        try:
            async with self._parked:
                self._parked.notify_all()
            await woken
        finally:
            with contextlib.suppress(ValueError):
                self._sleepers.remove(entry)

    async def wait_sleeping(self, count: int = 1, timeout: float = WAIT_S) -> None:  # noqa: ASYNC109
        """Until ``count`` tasks wait for the clock: a test knows that nothing more happens
        before it moves the clock (a sender parked on its next 20 ms, say)."""
        async with asyncio.timeout(timeout), self._parked:
            await self._parked.wait_for(lambda: len(self._sleepers) >= count)

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and wake every sleeper whose deadline has come."""
        if seconds < 0:
            raise ValueError("time does not go back")
        self._now += seconds
        for deadline, woken in list(self._sleepers):
            if deadline <= self._now and not woken.done():
                woken.set_result(None)


# -- records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """A message from the server, when it came (on the call's clock) and on which stream
    (an index into ``FakeCall.streams``)."""

    at: float
    stream: int
    message: Message


@dataclass(frozen=True)
class Played:
    """``data`` (μ-law) played from ``at`` on, ``len(data) / 8000`` seconds of it."""

    at: float
    stream: int
    data: bytes


@dataclass(frozen=True)
class Echo:
    """A mark echoed (or, with ``echo_cleared_marks=False``, dropped by a clear)."""

    at: float
    stream: int
    name: str
    cleared: bool
    """True when a ``clear`` released it rather than its audio having played."""


@dataclass
class StreamRecord:
    """One ``<Stream>`` of the call: its WebSocket's life."""

    url: str
    stream_sid: str
    parameters: dict[str, str]
    opened_at: float | None = None
    closed_at: float | None = None
    ended_by: Literal["server_close", "drop", "stop", "refused", "hangup"] | None = None
    close_code: int | None = None
    close_reason: str = ""
    refused_status: int | None = None
    discarded: int = 0
    """Bytes of the server's audio still buffered when the stream ended (not played)."""


@dataclass(frozen=True)
class Fetch:
    """A TwiML request: where, how, and what it answered."""

    at: float
    url: str
    method: str
    params: dict[str, str]
    status: int
    body: str


# -- the call ----------------------------------------------------------------------------


@dataclass
class _Audio:
    data: bytes


@dataclass
class _Mark:
    name: str


class FakeCall:
    """One call: its streams in turn, what the caller sends, what it hears and when.

    Made by ``FakeTwilio.place_call``. The records (``received``, ``sent``, ``played``,
    ``marks_echoed``, ``clears``, ``streams``, ``fetches``) grow as the call goes on and
    are read at any time; ``wait_for`` waits for a condition on them."""

    def __init__(self, twilio: FakeTwilio, call_sid: str, form: dict[str, str]) -> None:
        self.twilio = twilio
        self.call_sid = call_sid
        self.account_sid = twilio.account_sid
        self.form = form
        self.clock = twilio.clock
        self.state: Literal["ringing", "in-progress", "completed", "failed"] = "ringing"
        self.failure: str | None = None
        self.streams: list[StreamRecord] = []
        self.fetches: list[Fetch] = []
        self.received: list[Received] = []
        self.sent: list[Received] = []
        self.played: list[Played] = []
        self.marks_echoed: list[Echo] = []
        self.marks_dropped: list[Echo] = []
        self.clears: list[float] = []
        self.gaps: list[tuple[float, float]] = []
        """(from, to) of each stretch the playout ran dry between two of the server's
        audio, on one stream: what a caller hears as a gap."""
        self.lost: int = 0
        """Bytes of the caller's audio sent while no stream was open (between streams)."""
        self._ws: ClientConnection | None = None
        self._stream_ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._changed = asyncio.Condition()
        self._send_lock = asyncio.Lock()
        self._seq = 0
        self._chunk = 0
        self._media_ms = 0
        self._stream_started_at = 0.0
        self._next_media_at: float | None = None
        # The playout: what the server sent and Twilio has not played yet.
        self._buffer: deque[_Audio | _Mark] = deque()
        self._anchor: float | None = None  # when the audio now playing started
        self._anchored: int = 0  # bytes played since the anchor
        self._dry_since: float | None = None
        self._echoes: deque[Echo] = deque()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._stop_requested = False

    # -- what the caller does --

    @property
    def stream_sid(self) -> str | None:
        """The current stream's sid (None before the first)."""
        return self.streams[-1].stream_sid if self.streams else None

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def send_audio(self, ulaw: bytes, *, realtime: bool = True) -> None:
        """``ulaw`` as ``media`` messages of 160 bytes (the last padded with silence), one
        every 20 ms of the call's clock (or all at once with ``realtime=False``). Audio
        sent while no stream is open is lost, as a caller's words in a redirect's gap."""
        for at in range(0, len(ulaw), CHUNK):
            chunk = ulaw[at : at + CHUNK].ljust(CHUNK, bytes([SILENCE]))
            if realtime:
                now = self.clock.now()
                due = self._next_media_at
                if due is None or due < now - CHUNK_S:
                    due = now  # a new run of audio (a gap before it)
                await self.clock.sleep_until(due)
                self._next_media_at = due + CHUNK_S
            if self.ended:
                raise FakeTwilioError("the call has ended")
            await self._send_media(chunk)

    async def send_silence(self, seconds: float) -> None:
        await self.send_audio(bytes([SILENCE]) * round(seconds * RATE))

    async def dtmf(self, digit: str) -> None:
        """A key pressed: ``dtmf`` on the inbound track."""
        if digit not in DTMF_DIGITS:
            raise ValueError("a DTMF digit is one of 0-9, * and #")
        await self._send_event("dtmf", {"dtmf": {"track": "inbound_track", "digit": digit}})

    async def stop(self, timeout: float = WAIT_S) -> None:  # noqa: ASYNC109 (a test's bound)
        """The caller hangs up: ``stop``, then the WebSocket is closed and the call is
        over (no verb after the stream runs)."""
        if self.ended:
            return
        self._stop_requested = True
        body = {"stop": {"accountSid": self.account_sid, "callSid": self.call_sid}}
        with contextlib.suppress(ConnectionClosed, FakeTwilioError):
            await self._send_event("stop", body)
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout):
                    await ws.close()
        await self.wait_ended(timeout)

    async def wait_for(
        self,
        predicate: Callable[[FakeCall], object],
        timeout: float = WAIT_S,  # noqa: ASYNC109 (a test's bound, in real time)
    ) -> None:
        """Until ``predicate(self)`` is true (checked on every change of the records);
        ``TimeoutError`` after ``timeout`` seconds of real time."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: bool(predicate(self)))

    async def wait_ended(self, timeout: float = WAIT_S) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            await self._ended.wait()

    async def flush_playout(self) -> None:
        """Bring the playout up to the clock's now (play what is due, echo the marks
        behind it) and send the echoes: a test of the playout calls it after
        ``ManualClock.advance`` so that what it reads next is exact."""
        self._advance(self.clock.now())
        await self._flush_echoes()
        await self._notify()

    def audio_heard(self, stream: int | None = None) -> bytes:
        """Everything played (of one stream, or all), in order."""
        return b"".join(p.data for p in self.played if stream is None or p.stream == stream)

    def received_events(self, event: str) -> list[Received]:
        return [r for r in self.received if r.message.get("event") == event]

    @property
    def buffered(self) -> int:
        """Bytes of the server's audio waiting to be played."""
        return sum(len(item.data) for item in self._buffer if isinstance(item, _Audio))

    # -- sending --

    async def _send_media(self, chunk: bytes) -> None:
        if self._ws is None:
            self.lost += len(chunk)
            return
        now = self.clock.now()
        self._chunk += 1
        timestamp = max(self._media_ms, round((now - self._stream_started_at) * 1000))
        self._media_ms = timestamp + 20
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str(timestamp),
            "payload": base64.b64encode(chunk).decode("ascii"),
        }
        try:
            await self._send_event("media", {"media": media})
        except (ConnectionClosed, FakeTwilioError):
            self.lost += len(chunk)

    async def _send_event(self, event: str, body: Message) -> None:
        async with self._send_lock:
            ws = self._ws
            if ws is None:
                raise FakeTwilioError("no stream is open")
            self._seq += 1
            message: Message = {
                "event": event,
                "sequenceNumber": str(self._seq),
                **body,
                "streamSid": self.streams[-1].stream_sid,
            }
            await ws.send(json.dumps(message))
            self.sent.append(Received(self.clock.now(), len(self.streams) - 1, message))
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the playout --

    def _advance(self, now: float) -> None:
        """Play the buffer up to ``now``: audio at 8000 bytes a second from its anchor,
        and each mark once all the audio before it has played."""
        stream = len(self.streams) - 1
        while self._buffer:
            head = self._buffer[0]
            if isinstance(head, _Mark):
                self._buffer.popleft()
                self._echo(head.name, cleared=False)
                continue
            if self._anchor is None:
                return  # (anchored when audio arrives)
            due = int((now - self._anchor) * RATE + 1e-6) - self._anchored
            if due <= 0:
                return
            take = min(due, len(head.data))
            at = self._anchor + self._anchored / RATE
            self.played.append(Played(at, stream, head.data[:take]))
            self._anchored += take
            if take == len(head.data):
                self._buffer.popleft()
            else:
                head.data = head.data[take:]
                return
        if self._anchor is not None and not self._buffer:
            self._dry_since = self._anchor + self._anchored / RATE
            self._anchor = None

    def _echo(self, name: str, *, cleared: bool) -> None:
        record = Echo(self.clock.now(), len(self.streams) - 1, name, cleared)
        if cleared and not self.twilio.echo_cleared_marks:
            self.marks_dropped.append(record)
        else:
            self._echoes.append(record)

    async def _flush_echoes(self) -> None:
        """Send the marks due, in order (``marks_echoed`` holds those sent)."""
        while self._echoes:
            echo = self._echoes.popleft()
            with contextlib.suppress(ConnectionClosed, FakeTwilioError):
                await self._send_event("mark", {"mark": {"name": echo.name}})
                self.marks_echoed.append(echo)

    def _queue_audio(self, data: bytes, now: float) -> None:
        self._advance(now)
        if self._anchor is None:  # nothing playing (the buffer is empty): it starts now
            if self._dry_since is not None and now > self._dry_since:
                self.gaps.append((self._dry_since, now))
            self._dry_since = None
            self._anchor, self._anchored = now, 0
        self._buffer.append(_Audio(data))

    def _clear(self, now: float) -> None:
        self._advance(now)
        self.clears.append(now)
        for item in self._buffer:
            if isinstance(item, _Mark):
                self._echo(item.name, cleared=True)
        self._buffer.clear()
        self._anchor, self._dry_since = None, None

    async def _playout(self) -> None:
        while True:
            self._wake.clear()
            self._advance(self.clock.now())
            await self._flush_echoes()
            await self._notify()
            deadline = self._next_deadline()
            waker = asyncio.ensure_future(self._wake.wait())
            waits: set[asyncio.Future[Any]] = {waker}
            if deadline is not None:
                waits.add(asyncio.ensure_future(self.clock.sleep_until(deadline)))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def _next_deadline(self) -> float | None:
        """When the audio at the head of the buffer will have played."""
        if not self._buffer or self._anchor is None:
            return None
        head = self._buffer[0]
        assert isinstance(head, _Audio)  # (marks at the head were echoed by _advance)
        return self._anchor + (self._anchored + len(head.data)) / RATE

    # -- a stream's life --

    async def _run_stream(self, verb: Stream, base_url: str) -> Literal["next", "end"]:
        """Open ``verb``'s WebSocket, play it until it ends; whether the TwiML goes on."""
        url = _ws_url(verb.url, base_url)
        record = StreamRecord(url, "MZ" + secrets.token_hex(16), verb.parameters)
        signed_url = url if self.twilio.sign_stream_url_as == "wss" else _https_twin(url)
        headers = {"X-Twilio-Signature": sign(self.twilio.auth_token, signed_url)}
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                user_agent_header=None,
                compression=None,
                proxy=None,
                open_timeout=self.twilio.timeout,
                close_timeout=self.twilio.timeout,
                ping_interval=None,
                max_size=None,
            )
        except InvalidStatus as e:
            record.refused_status = e.response.status_code
            record.ended_by = "refused"
            self.streams.append(record)
            self._stream_ready.set()
            await self._notify()
            return "next"
        self.streams.append(record)
        index = len(self.streams) - 1
        record.opened_at = self._stream_started_at = self.clock.now()
        self._seq, self._chunk, self._media_ms = 0, 0, 0
        self._buffer.clear()
        self._anchor = self._dry_since = None
        self._ws = ws
        self.state = "in-progress"
        playout = asyncio.create_task(self._playout())
        try:
            connected = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
            async with self._send_lock:
                await ws.send(json.dumps(connected))
                self.sent.append(Received(self.clock.now(), index, connected))
            start = {
                "streamSid": record.stream_sid,
                "accountSid": self.account_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound", "outbound"],
                "customParameters": dict(verb.parameters),
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1},
            }
            await self._send_event("start", {"start": start})
            self._stream_ready.set()
            async for raw in ws:
                self._receive(raw, index)
                self._wake.set()
                await self._flush_echoes()
                await self._notify()
            record.ended_by = "stop" if self._stop_requested else "server_close"
        except ConnectionClosed as e:
            if self._stop_requested:
                record.ended_by = "stop"
            else:
                record.ended_by = "server_close" if e.rcvd is not None else "drop"
        except asyncio.CancelledError:
            record.ended_by = "hangup"  # (the fake is shutting down)
            raise
        finally:
            playout.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await playout
            self._ws = None
            rcvd = ws.protocol.close_rcvd
            record.close_code = rcvd.code if rcvd is not None else None
            record.close_reason = rcvd.reason if rcvd is not None else ""
            record.closed_at = self.clock.now()
            self._advance(record.closed_at)  # (what played until the close; no echo now)
            record.discarded = self.buffered
            self._buffer.clear()
            self._echoes.clear()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.twilio.timeout):
                    await ws.close()
            self._anchor = self._dry_since = None
            self._stream_ready.set()
            await self._notify()
        if record.ended_by == "stop":
            return "end"
        if record.ended_by == "drop" and not self.twilio.follow_redirect_on_drop:
            return "end"
        return "next"

    def _receive(self, raw: str | bytes, stream: int) -> None:
        now = self.clock.now()
        if isinstance(raw, bytes):
            self.received.append(Received(now, stream, {"binary": raw}))
            return  # (Twilio takes only JSON text: error 31924)
        try:
            message = json.loads(raw)
        except ValueError:
            message = {"unparsed": raw}
        if not isinstance(message, dict):
            message = {"unparsed": raw}
        self.received.append(Received(now, stream, message))
        event = message.get("event")
        if event == "media":
            payload = (message.get("media") or {}).get("payload")
            if isinstance(payload, str):
                with contextlib.suppress(ValueError):
                    self._queue_audio(base64.b64decode(payload, validate=True), now)
        elif event == "mark":
            name = (message.get("mark") or {}).get("name")
            if isinstance(name, str):
                self._advance(now)
                self._buffer.append(_Mark(name))
                self._advance(now)  # (nothing buffered before it: echoed at once)
        elif event == "clear":
            self._clear(now)

    # -- the TwiML --

    async def _run(self, verbs: list[Verb], base_url: str) -> None:
        try:
            while verbs and not self._stop_requested:
                verb = verbs.pop(0)
                if isinstance(verb, Stream):
                    if await self._run_stream(verb, base_url) == "end":
                        break
                elif isinstance(verb, Pause):
                    await self.clock.sleep_until(self.clock.now() + verb.length)
                elif isinstance(verb, Hangup):
                    break
                else:
                    base_url, verbs = await self.twilio._fetch(
                        self, verb.url, verb.method, base_url
                    )
            self.state = "completed"
        except Exception as e:
            self.state, self.failure = "failed", f"{type(e).__name__}: {e}"
        finally:
            self._stream_ready.set()
            self._ended.set()
            await self._notify()
            with contextlib.suppress(Exception):
                await self.twilio._status_callback(self)

    async def _close(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner


class FakeTwilio:
    """Twilio's side of calls to the server at ``base_url`` (``http://127.0.0.1:P``, no
    trailing slash): an async context manager; its calls are ended when it exits.

    ``echo_cleared_marks``: whether a ``clear`` echoes the marks it dropped (Twilio's
    page says it does). ``follow_redirect_on_drop``: whether a WebSocket closed without a
    close frame runs the next verb (UNCONFIRMED; off: only a server's close does).
    ``sign_stream_url_as``: the URL the upgrade's signature is computed over (the stream
    URL as written, or its ``https`` twin). ``status_callback``: a URL the fake POSTs
    ``CallStatus=completed`` to when a call ends, as a number's *Call status changes*
    webhook does."""

    def __init__(
        self,
        base_url: str,
        auth_token: str,
        account_sid: str,
        *,
        clock: Clock | None = None,
        echo_cleared_marks: bool = True,
        follow_redirect_on_drop: bool = False,
        sign_stream_url_as: Literal["wss", "https"] = "wss",
        status_callback: str | None = None,
        timeout: float = WAIT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.auth_token = auth_token
        self.account_sid = account_sid
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.echo_cleared_marks = echo_cleared_marks
        self.follow_redirect_on_drop = follow_redirect_on_drop
        self.sign_stream_url_as = sign_stream_url_as
        self.status_callback = status_callback
        self.timeout = timeout
        self.calls: list[FakeCall] = []
        self._http = httpx2.AsyncClient(trust_env=False, timeout=timeout)

    def __repr__(self) -> str:  # (never the auth token)
        return f"FakeTwilio({self.base_url!r}, account_sid={self.account_sid!r})"

    async def __aenter__(self) -> FakeTwilio:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for call in self.calls:
            await call._close()
        await self._http.aclose()

    async def place_call(
        self,
        twiml_path: str = "/v1/twilio/twiml",
        *,
        call_sid: str | None = None,
        from_: str = "+15005550006",
        to: str = "+15005550001",
        extra_params: Mapping[str, str] | None = None,
    ) -> FakeCall:
        """A call comes in: the voice webhook is POSTed to ``base_url + twiml_path`` and
        its TwiML run until the first stream has started (or the call has ended: read
        ``state``, ``streams`` and ``fetches``). A webhook answered with anything but 200
        and TwiML is a ``FakeTwilioError``."""
        call_sid = call_sid or "CA" + secrets.token_hex(16)
        form = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call_sid,
            "CallStatus": "ringing",
            "Direction": "inbound",
            "From": from_,
            "To": to,
            **(extra_params or {}),
        }
        call = FakeCall(self, call_sid, form)
        self.calls.append(call)
        base_url, verbs = await self._fetch(call, twiml_path, "POST", self.base_url + "/")
        call._runner = asyncio.create_task(call._run(verbs, base_url))
        async with asyncio.timeout(self.timeout):
            await call._stream_ready.wait()
        return call

    async def _fetch(
        self, call: FakeCall, url: str, method: str, base: str
    ) -> tuple[str, list[Verb]]:
        """The TwiML at ``url`` (relative to ``base``, the document that named it), signed:
        where it was, and its verbs."""
        url = urljoin(base, url)
        params = dict(call.form)
        if call.fetches:
            params["CallStatus"] = "in-progress"
        if method == "GET":
            url += ("&" if urlsplit(url).query else "?") + urlencode(params)
            headers = {"X-Twilio-Signature": sign(self.auth_token, url)}
            response = await self._http.get(url, headers=headers)
        else:
            headers = {"X-Twilio-Signature": sign(self.auth_token, url, params)}
            response = await self._http.post(url, data=params, headers=headers)
        body = response.text
        call.fetches.append(
            Fetch(call.clock.now(), url, method, params, response.status_code, body)
        )
        if response.status_code != 200:
            raise FakeTwilioError(f"the TwiML request answered {response.status_code}")
        return url, parse_twiml(body)

    async def _status_callback(self, call: FakeCall) -> None:
        if self.status_callback is None:
            return
        url = urljoin(self.base_url + "/", self.status_callback)
        params = {**call.form, "CallStatus": "completed"}
        headers = {"X-Twilio-Signature": sign(self.auth_token, url, params)}
        response = await self._http.post(url, data=params, headers=headers)
        call.fetches.append(
            Fetch(call.clock.now(), url, "POST", params, response.status_code, response.text)
        )


def run_scenario(scenario: Callable[..., Awaitable[T]], *args: object, timeout: float = 120.0) -> T:
    """Run ``scenario(*args)`` on a fresh asyncio loop, bounded by ``timeout``: from a trio
    test, ``await trio.to_thread.run_sync(run_scenario, scenario, base_url)``. (The
    thread cannot be cancelled from trio; the bound is what ends a stuck scenario.)"""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await scenario(*args)

    return asyncio.run(bounded())
