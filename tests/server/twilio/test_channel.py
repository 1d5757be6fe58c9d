"""A phone call's stream in memory (``running_server``, a MockClock): the ``TwilioChannel``
and the unchanged session shell on the echo engine. The caller's μ-law comes back as
``media`` followed by ``mark``s; nothing more than the lead goes out before echoes; the
echoes are the acks; a stream that drops and comes back with a redirect's ticket hears
what it had not played, exactly once; a stream that never echoes is held to the bounds
and cut, and the session detaches."""

from __future__ import annotations

import base64
import math
import struct
import time
from typing import Any

import pytest
import trio
from wsproto.events import AcceptConnection

from trio_duplex.server.config import ServerConfig
from trio_duplex.server.twilio.marks import MarkBook, sniff
from trio_duplex.testing.simulation import Simulation, running_server

from ...helpers import RawClient, RawClosed, raw_handshake

ACCOUNT = "AC" + "1" * 32
CALL = "CA" + "2" * 32
LEAD = 4000
"""--twilio-max-buffered's 0.5 s of μ-law."""
MEDIA_MAX = 800
"""The most audio one outbound ``media`` carries (0.1 s)."""


def config(**overrides: Any) -> ServerConfig:
    return ServerConfig(twilio_insecure_no_signature=True, **overrides)


def tone(seconds: float) -> bytes:
    """A 440 Hz tone as μ-law (the server's own G.711 is not used to make it)."""
    from trio_duplex.testing.twilio_provider import mulaw_encode

    count = int(8000 * seconds)
    return mulaw_encode(
        b"".join(
            struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 8000)))
            for i in range(count)
        )
    )


class Phone:
    """Twilio's side of one stream, by hand: what it sent, what it got."""

    def __init__(self, client: RawClient, stream_sid: str) -> None:
        self.client = client
        self.stream_sid = stream_sid
        self.audio = bytearray()
        self.marks: list[tuple[str, int]] = []
        """Each mark's name, and the audio received before it (bytes)."""
        self.clears = 0

    @classmethod
    async def call(cls, sim: Simulation, ticket: str, stream: int = 1) -> Phone:
        listener_stream, _ = await sim.listener.connect()
        client = RawClient(listener_stream)
        assert isinstance(await raw_handshake(client, "/v1/twilio"), AcceptConnection)
        stream_sid = "MZ" + f"{stream:032x}"
        phone = cls(client, stream_sid)
        await client.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        start = {
            "streamSid": stream_sid,
            "accountSid": ACCOUNT,
            "callSid": CALL,
            "tracks": ["inbound", "outbound"],
            "customParameters": {"trio_duplex_ticket": ticket},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        await client.send({"event": "start", "sequenceNumber": "1", "start": start})
        return phone

    async def say(self, ulaw: bytes) -> None:
        for at in range(0, len(ulaw), 160):
            payload = base64.b64encode(ulaw[at : at + 160]).decode()
            media = {"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}}
            await self.client.send(media)

    async def echo(self, name: str) -> None:
        mark = {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}
        await self.client.send(mark)

    async def take(self) -> None:
        """One message from the server (RawClosed at its close)."""
        message = await self.client.receive()
        assert message["streamSid"] == self.stream_sid
        if message["event"] == "media":
            self.audio += base64.b64decode(message["media"]["payload"])
        elif message["event"] == "mark":
            self.marks.append((message["mark"]["name"], len(self.audio)))
        else:
            assert message["event"] == "clear", message
            self.clears += 1

    async def take_until_quiet(self) -> None:
        """Everything the server sends until it has nothing more to say for a while."""
        while True:
            with trio.move_on_after(1.0) as quiet:
                await self.take()
            if quiet.cancelled_caught:
                return


def tickets(sim: Simulation) -> tuple[str, str]:
    assert sim.server.twilio is not None
    keys = sim.server.twilio.keys
    now = time.time()
    return keys.mint("o", ACCOUNT, CALL, now, 60), keys.mint("r", ACCOUNT, CALL, now, 60)


def session_id(sim: Simulation) -> str:
    assert sim.server.twilio is not None
    return sim.server.twilio.keys.session_id(ACCOUNT, CALL)


async def test_audio_goes_out_within_the_lead_and_a_resume_replays_what_was_not_played_once(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = tone(1.0)
    texts: list[str | None] = []  # the types of the text frames the session wrote
    book_text = MarkBook.text

    def text(book: MarkBook, frame: str) -> list[str]:
        texts.append(sniff(frame)[0])
        return book_text(book, frame)

    monkeypatch.setattr(MarkBook, "text", text)
    async with running_server(config(), fail_after_s=120) as sim:
        opening, resuming = tickets(sim)
        phone = await Phone.call(sim, opening)
        await phone.say(said)
        await phone.take_until_quiet()  # no echo yet: the lead holds the rest back
        assert LEAD <= len(phone.audio) <= LEAD + MEDIA_MAX
        sent_before_echo = len(phone.audio)
        # Twilio plays the first two marks' audio: their echoes let more go out, and
        # the session's journal forgets what they proved played.
        (first, _), (second, played) = phone.marks[:2]
        await phone.echo(first)
        await phone.echo(second)
        await phone.take_until_quiet()
        assert len(phone.audio) > sent_before_echo
        session = sim.session(session_id(sim))
        assert session is not None and session.journal.acked_through == int(second)
        heard_first = bytes(phone.audio)
        # The line drops (no stop, no close): the session waits, detached.
        await phone.client.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert session.state.value == "detached"
        # Twilio's <Redirect> brings a new stream with a resume ticket: it hears
        # everything after what was proven played, once, then the rest.
        again = await Phone.call(sim, resuming, stream=2)
        marked = 0  # audio before the last mark echoed
        while True:
            with trio.move_on_after(1.0) as quiet:
                await again.take()
            if quiet.cancelled_caught:
                if not again.marks:
                    break
                name, marked = again.marks.pop(0)
                await again.echo(name)
        unplayed = heard_first[played:]
        assert bytes(again.audio[: len(unplayed)]) == unplayed
        total = played + len(again.audio)
        assert len(said) - 480 <= total <= len(said)  # (the resamplers keep a few ms)
        # Every mark echoed: the frontier is the last one's; at most one mark interval
        # after it is unmarked (the echo engine ends no response: its last audio is
        # marked when the stream closes).
        assert session.journal.acked_through == int(name)
        assert len(again.audio) - marked <= MEDIA_MAX
        # It resumed from what the marks proved played: nothing is missing from there on
        # (a resume from the seq Twilio cannot present, 0, would be told of a gap).
        assert "session.resumed" in texts and "session.resync_required" not in texts
        await again.client.send({"event": "stop", "streamSid": again.stream_sid})
        try:
            while True:
                await again.take()
        except RawClosed as closed:
            assert closed.args[0] == 1000
        await trio.testing.wait_all_tasks_blocked()
        assert sim.session(session_id(sim)) is None


async def test_a_stream_that_never_echoes_is_held_to_its_bounds_then_cut(
    autojump_clock: Any,
) -> None:
    said = tone(6.0)
    overrides = {"twilio_max_queued_s": 1.0, "write_timeout_s": 5.0, "max_pending_output": 8}
    async with running_server(config(**overrides), fail_after_s=300) as sim:
        opening, _ = tickets(sim)
        phone = await Phone.call(sim, opening)
        await phone.say(said)
        try:
            while True:
                await phone.take()
        except RawClosed:
            pass
        # Never more than the lead went out; the rest waited (bounded), then the write
        # timeout cut the stream, and the session detached: nothing waited for ever.
        assert len(phone.audio) <= LEAD + MEDIA_MAX
        session = sim.session(session_id(sim))
        assert session is not None and session.state.value == "detached"
        assert session.journal.head > 0
