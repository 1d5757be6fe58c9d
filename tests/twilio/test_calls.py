"""Phone calls end to end: ``trio-duplex serve --engine speech`` with Twilio's endpoints,
called by the fake Twilio (trio_duplex/testing/twilio_provider.py, written from Twilio's
reference, not from our code) over real sockets.

The caller says the outside set's first sentences (tests/speech_audio.py, said by
espeak-ng at test time, sent as μ-law at 8 kHz in 20 ms ``media``, as a phone's are); the
reply comes back as ``media``, played on the fake's playout clock, which echoes each
``mark`` once the audio before it has played. A reply is judged by what the recogniser,
run in the test, hears in the audio the caller heard (``judge_reply``). While it waits
for a reply the caller sends silence, as a phone line does, until the reply's audio has
stopped for ``QUIET_S`` (media time: the server's audio is paced in real time).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from trio_duplex.testing.twilio_provider import (
    FakeCall,
    FakeTwilio,
    mulaw_decode,
    run_scenario,
    wav_to_ulaw_8k,
)

from ..helpers import ServerProcess, Servers, free_port
from ..speech_audio import (
    engine_hears,
    judge_reply,
    needs_speech,
    recognise,
    reply_to,
    said,
    sentences,
    spoken,
    write_wav,
)

pytestmark = [pytest.mark.integration, pytest.mark.media, needs_speech]

TOKEN = "0123456789abcdef0123456789abcdef"
"""An auth token of Twilio's shape (32 hex digits)."""
ACCOUNT = "AC" + "5" * 32
READY_S = 60.0
QUIET_S = 1.5
"""A reply is over once no audio of it has come for this long."""
REPLY_S = 40.0
"""The most a test waits for a reply (a loaded machine's recogniser and voice)."""
RATE = 8000


@pytest.fixture(scope="module")
def speech_server(speech_parts: None) -> Iterator[ServerProcess]:
    servers = Servers()
    port = free_port()
    try:
        yield servers.start(
            *("--port", str(port), "--engine", "speech"),
            *("--twilio-auth-token", TOKEN, "--twilio-account-sid", ACCOUNT),
            *("--twilio-public-url", f"http://127.0.0.1:{port}"),
            ready_timeout=READY_S,
        )
    finally:
        servers.stop_all()


def base_url(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.port}"


def metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(base_url(server) + "/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def metric(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert found, f"no {name}{labels} in the metrics"
    return float(found.group(1))


def said_as_ulaw(folder: Path, text: str) -> bytes:
    """``text`` said by espeak-ng (half a second of silence before, a second after), as a
    phone sends it: μ-law at 8 kHz."""
    return wav_to_ulaw_8k(write_wav(folder / "said.wav", spoken(text)))


async def listen(call: FakeCall, since: int) -> bytes:
    """What the caller hears from ``since`` (bytes heard before) until the reply is over,
    the caller sending silence meanwhile."""
    deadline = asyncio.get_running_loop().time() + REPLY_S
    heard = since
    quiet = 0.0
    while quiet < QUIET_S or heard == since:
        assert asyncio.get_running_loop().time() < deadline, "no (whole) reply in time"
        await call.send_silence(0.25)
        now = len(call.audio_heard())
        quiet = 0.0 if now != heard else quiet + 0.25
        heard = now
    return call.audio_heard()[since:]


def heard_words(ulaw: bytes) -> str:
    return recognise(mulaw_decode(ulaw), RATE)


def reply_expected(folder: Path, text: str) -> str:
    """The reply to ``text`` as the server hears it from a phone: its speech alone, sent
    as μ-law at 8 kHz, decoded and heard by the engine's recogniser (``engine_hears``)."""
    ulaw = wav_to_ulaw_8k(write_wav(folder / "speech.wav", said(text)))
    return reply_to(engine_hears(mulaw_decode(ulaw), RATE))


async def test_a_call_is_answered_aloud_its_marks_echoed_and_a_key_answered(
    speech_server: ServerProcess, tmp_path: Path
) -> None:
    sentence = sentences(1)[0]
    caller = said_as_ulaw(tmp_path, sentence)

    async def scenario(base: str) -> tuple[str, str, FakeCall]:
        async with FakeTwilio(base, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.send_audio(caller)
            reply = heard_words(await listen(call, 0))
            before = len(call.audio_heard())
            await call.dtmf("5")
            key = heard_words(await listen(call, before))
            await call.stop()
            await call.wait_ended()
            return reply, key, call

    reply, key, call = await trio.to_thread.run_sync(
        run_scenario, scenario, base_url(speech_server)
    )
    judge_reply(reply_expected(tmp_path, sentence), reply)
    assert re.search(r"\b(five|5)\b", key.lower()), key
    # Every mark the server sent was echoed once its audio had played, and it counted them.
    sent_marks = [r.message["mark"]["name"] for r in call.received_events("mark")]
    assert sent_marks and [echo.name for echo in call.marks_echoed] == sent_marks
    assert len(call.streams) == 1 and call.streams[0].ended_by == "stop"
    text = metrics(speech_server)
    assert metric(text, "trio_duplex_twilio_marks_total", '{kind="echoed"}') >= len(sent_marks)
    assert metric(text, "trio_duplex_twilio_audio_seconds_total", '{direction="out"}') > 1.0
    assert metric(text, "trio_duplex_twilio_audio_seconds_total", '{direction="in"}') > 3.0
    assert metric(text, "trio_duplex_dialect_sessions_opened_total", '{dialect="twilio"}') >= 1
    # The caller hung up: the session ended and its slot is free.
    speech_server.wait_for_line(r"session \S+ ended: client_close", 10)
    assert metric(metrics(speech_server), "trio_duplex_sessions", '{state="attached"}') == 0


async def test_speaking_over_a_reply_clears_it_and_the_new_turn_is_answered(
    speech_server: ServerProcess, tmp_path: Path
) -> None:
    first, second = sentences(2)
    caller_first = said_as_ulaw(tmp_path, first)
    caller_second = said_as_ulaw(tmp_path, second)

    async def scenario(base: str) -> tuple[float, float, str, FakeCall]:
        async with FakeTwilio(base, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.send_audio(caller_first)
            while not call.audio_heard():  # the reply has begun playing
                await call.send_silence(0.1)
            began = call.received_events("media")[0].at
            await call.send_audio(caller_second)  # over it
            await call.wait_for(lambda c: c.clears, timeout=REPLY_S)
            cleared = call.clears[0]
            heard_at_clear = sum(len(p.data) for p in call.played if p.at <= cleared)
            reply = heard_words(await listen(call, heard_at_clear))
            await call.stop()
            await call.wait_ended()
            return began, cleared, reply, call

    began, cleared, reply, call = await trio.to_thread.run_sync(
        run_scenario, scenario, base_url(speech_server)
    )
    assert began < cleared
    # What the caller heard after the clear is the reply to what it said over the first.
    judge_reply(reply_expected(tmp_path, second), reply)
    assert len(call.clears) == 1
