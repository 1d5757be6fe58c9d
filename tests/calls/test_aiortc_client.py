"""OpenAI's WebRTC flow against a real ``trio-duplex serve --calls`` (docs/plans/webrtc.md
§3.1, §4.4, §5.3): an aiortc client (client.py) posts its offer, talks on ``oai-events``,
sends its microphone and hears the server's Opus track, then resumes with a new peer
connection, hangs up, and meets the door's refusals.

UDP on 127.0.0.1 only: the client gathers on loopback alone, and every server answers ICE
from ``127.0.0.0/8`` alone (``--call-allow-peer``), with no STUN server. Plain functions,
each an ``asyncio.run`` under a whole-test deadline (``DEADLINE_S``); every wait is on a
condition with a timeout, never a sleep.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
from aiortc.mediastreams import MediaStreamTrack
from prometheus_client.parser import text_string_to_metric_families

from trio_duplex.engines.voice import frame_count

from ..dialects.openai.reference import validate
from ..helpers import TEXT_RESPONSE, Serve, ServerProcess, exchange
from ..media.rtc import rms
from .client import (
    CALL_ID,
    CALLS_PATH,
    HELD_BACK,
    CallClient,
    PcmTrack,
    candidates,
    client,
    close_all,
    hang_up,
    speech_pcm,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
"""Each test's whole run (its server is started before, within the fixture's 15 s)."""
KEY = "sk-calls-test-key"
CALL_FLAGS = ("--calls", "--call-allow-peer", "127.0.0.0/8", "--disconnect-grace", "30")
SAID = "what is the capital of france"


@pytest.fixture(scope="module")
def echo(serve_module: Serve) -> ServerProcess:
    return serve_module(*CALL_FLAGS, "--engine", "echo")


@pytest.fixture(scope="module")
def voice(serve_module: Serve) -> ServerProcess:
    return serve_module(*CALL_FLAGS, "--engine", "voice")


@pytest.fixture(scope="module")
def keyed(serve_module: Serve, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """An echo server that wants an API key (``--api-key-file``)."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"tester:{KEY}\n", encoding="utf-8")
    return serve_module(*CALL_FLAGS, "--engine", "echo", "--api-key-file", str(keys))


def base(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.port}"


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            async with asyncio.timeout(DEADLINE_S):
                await test()
        finally:
            await close_all()

    asyncio.run(main())


async def connected(
    server: ServerProcess, mic: MediaStreamTrack | None = None, bearer: str | None = None
) -> tuple[CallClient, dict[str, Any]]:
    """A call answered 201, its data channel open and its ``session.created`` read."""
    call = CallClient(mic)
    response = await call.post(base(server), bearer)
    assert response.status_code == 201, (response.status_code, response.text)
    await call.wait_open()
    created = await call.event("session.created")
    return call, created


async def metric(server: ServerProcess, name: str) -> float:
    async with client(base(server)) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    raise AssertionError(f"no {name} in /metrics")


EXTENSION_EVENTS = {"session.resumed", "session.closed", "session.heartbeat_ack"}
"""The resume extension's events (docs/openai.md), which the SDK has no model of."""


def assert_openai_events(call: CallClient) -> None:
    """Every event the call got is one the ``openai`` SDK reads, strictly, with no field
    it does not name but the dialect's extensions (tests/dialects/openai/reference.py)."""
    for event in call.events:
        if event["type"] not in EXTENSION_EVENTS:
            validate(json.dumps(event))


def assert_openai_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


# -- 1. the flow, on echo ------------------------------------------------------------------


def test_an_offer_is_answered_201_with_loopback_host_candidates_and_a_text_turn_echoes(
    echo: ServerProcess,
) -> None:
    async def test() -> None:
        call = CallClient()
        response = await call.post(base(echo))
        assert response.status_code == 201, (response.status_code, response.text)
        assert response.headers["content-type"].split(";")[0].strip() == "application/sdp"
        location = response.headers["location"]
        assert location.startswith(CALLS_PATH + "/")
        assert CALL_ID.fullmatch(location.removeprefix(CALLS_PATH + "/")), location
        # Only 127.0.0.1 host candidates: no srflx (no STUN was asked), no relay.
        found = candidates(response.text)
        assert found, response.text
        assert {(address, typ, kind) for address, _, typ, kind in found} == {
            ("127.0.0.1", "typ", "host")
        }
        assert "srflx" not in response.text and "relay" not in response.text
        assert re.findall(r"(?m)^m=(\w+)", response.text) == ["audio", "application"]

        await call.wait_open()
        created = await call.event("session.created")
        assert call.events[0] is created, call.types
        resume = created["resume"]
        assert {"session_id", "resume_token", "attachment_generation", "limits"} <= set(resume)
        assert resume["resume_token"] and resume["session_id"]
        assert created["session"]["type"] == "realtime"
        assert "server_event_seq" not in created

        text = "hello over webrtc, ça va?"
        call.say(text)
        done = await call.event("response.done")
        assert done["response"]["status"] == "completed", done
        start = call.types.index("response.created")
        end = call.types.index("response.done")
        assert call.types[start : end + 1] == TEXT_RESPONSE
        deltas = [e["delta"] for e in call.events if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == text
        assert (await call.event("response.output_text.done"))["text"] == text
        seqs = call.seqs()
        assert seqs == sorted(set(seqs)) and seqs[0] >= 1, seqs
        assert not call.binary
        assert_openai_events(call)
        await call.close()

    run(test)


def test_the_microphone_reaches_the_engine_and_its_echo_comes_back_on_the_track(
    echo: ServerProcess,
) -> None:
    """An audio turn on echo: espeak-ng's speech on the microphone (after
    ``session.created``: a call drops the mic until then), ``input_audio_buffer.commit``
    and ``response.create``; the echo engine answers with the committed audio, which
    comes back on the inbound track. As much speech comes back as went in: the frames
    above 300 RMS (-40 dBFS; decoded silence is under 50, test_client.py) heard, against
    those of the speech sent, within 20% (two Opus passes and a resampling smear its
    edges)."""

    async def test() -> None:
        pcm = speech_pcm(SAID)
        mic = PcmTrack(pcm, held=True)
        call, _ = await connected(echo, mic)
        mic.play()
        await asyncio.wait_for(mic.played.wait(), 10)
        call.send({"type": "input_audio_buffer.commit"})
        call.send({"type": "response.create"})
        committed = await call.event("input_audio_buffer.committed")
        done = await call.event("response.done")
        assert done["response"]["status"] == "completed", done
        assert (await call.event("response.created"))["response"]["output_modalities"] == [
            "audio"
        ], committed
        sent = sum(1 for n in range(0, len(pcm), 1920) if rms(pcm[n : n + 1920]) > 300)
        assert sent >= 50, sent  # (over a second of speech)
        await call.event("output_audio_buffer.stopped")  # (the worker sent its last packet)
        await call.all_arrived()
        heard = sum(1 for r in call.heard if r > 300)
        assert 0.8 * sent <= heard <= 1.2 * sent, (sent, heard)
        assert_openai_events(call)
        await call.close()

    run(test)


# -- 2. the server's audio on the track, on voice ------------------------------------------


def test_a_voice_reply_is_heard_on_the_inbound_track(voice: ServerProcess) -> None:
    """The voice engine speaks each word as a tone of amplitude 0.3 of full scale (RMS
    ~6950) and puts 80 ms of digital silence between words (voice.py ``_GAP_FRAMES``), so
    of a reply of N words at least 4(N-1) of the frames heard are silence by construction.
    The silence baseline is the loudest of the quietest 2(N-1) frames (half of the gaps, so
    that a gap frame the codec smeared at a tone's edge is not counted); a frame is loud
    above 10 times that, and never below 300 (-40 dBFS: test_client.py measures decoded
    Opus silence under 50). At least 1 s of loud frames (50) must be heard."""

    async def test() -> None:
        call, _ = await connected(voice, PcmTrack(speech_pcm(SAID)))
        words = "one two three four five six seven eight nine ten eleven twelve".split()  # ~4.6 s
        call.say(" ".join(words))
        done = await call.event("response.done", within=30)
        assert done["response"]["status"] == "completed", done
        # The reply's audio is on the track, all of it (but for what aiortc's jitter
        # buffer holds back).
        await call.event("output_audio_buffer.stopped")
        await call.all_arrived()
        expected = frame_count(" ".join(words))
        assert expected - HELD_BACK <= len(call.heard) <= expected, (expected, len(call.heard))
        quiet = sorted(call.heard)[: 2 * (len(words) - 1)]
        baseline = max(quiet)
        threshold = max(10 * baseline, 300.0)
        loud = [r for r in call.heard if r > threshold]
        assert baseline < 100, quiet
        assert len(loud) >= 50, (threshold, [round(r) for r in call.heard])
        # And they are the engine's tones, not noise: their median is near ~6950.
        assert 4500 < sorted(loud)[len(loud) // 2] < 9000, loud
        transcript = [
            e["delta"] for e in call.events if e["type"] == "response.output_audio_transcript.delta"
        ]
        assert "".join(transcript).split() == words, call.types
        assert_openai_events(call)
        await call.close()

    run(test)


def test_a_clear_and_a_cancel_stop_the_audio_within_two_packets(voice: ServerProcess) -> None:
    """``output_audio_buffer.clear`` mid-response → ``output_audio_buffer.cleared`` for it,
    and at most 2 more of its packets reach the client; ``response.cancel`` then ends it
    (the agents SDK's ``interrupt()`` sends the two the other way round, which races the
    cancelled ``response.done``: see the report). The barrier after it is a text-only
    turn: its ``response.done`` comes on the data channel, which shares the RTP packets'
    UDP socket (bundle), so every packet sent before it has arrived once it has."""

    async def test() -> None:
        call, _ = await connected(voice)
        call.say(" ".join(f"word{n}" for n in range(24)))  # ~ 9 s of speech
        started = await call.event("output_audio_buffer.started")
        await call.until(lambda: len(call.heard) >= 10)
        call.send({"type": "output_audio_buffer.clear"})
        cleared = await call.event("output_audio_buffer.cleared")
        at_clear = await call.packets_received()
        assert cleared["response_id"] == started["response_id"]
        call.send({"type": "response.cancel"})
        done = await call.event("response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["id"] == cleared["response_id"]
        start = len(call.events)
        call.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "barrier"}],
                },
            }
        )
        call.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        barrier = await call.event("response.done", start)
        assert barrier["response"]["status"] == "completed", barrier
        after = await call.packets_received() - at_clear
        assert at_clear >= 10 and 0 <= after <= 2, (at_clear, after)
        assert "output_audio_buffer.stopped" not in call.types[call.events.index(cleared) :]
        await call.close()

    run(test)


def test_a_clear_is_answered_cleared_and_no_error(voice: ServerProcess) -> None:
    """``output_audio_buffer.clear`` is a client event of OpenAI's WebRTC calls (the
    agents SDK's ``interrupt()`` sends it): answered ``cleared``, never ``error``."""

    async def test() -> None:
        call, _ = await connected(voice)
        call.say(" ".join(f"word{n}" for n in range(12)))
        await call.event("output_audio_buffer.started")
        call.send({"type": "output_audio_buffer.clear"})
        await call.event("output_audio_buffer.cleared")
        await call.all_arrived()
        errors = [e for e in call.events if e["type"] == "error"]
        assert not errors, errors
        await call.close()

    run(test)


# -- 3. resume with a new peer connection ---------------------------------------------------


@attrs.frozen
class Resumed:
    """A call's session resumed on a new pc mid-response: what each pc got."""

    first: CallClient
    second: CallClient
    last: int  # the last server_event_seq the first pc read: the resume's N
    token: str  # the first pc's resume token
    resumed: dict[str, Any]  # the second pc's session.resumed


async def resumed_mid_response(server: ServerProcess, words: list[str]) -> Resumed:
    """A call whose pc is closed while its response speaks ``words``, then resumed with a
    new pc and ``POST ?resume=ID&last_received_server_event_seq=N`` (the resume token as
    the bearer), its ``session.resumed`` read."""
    first, created = await connected(server)
    session_id = created["resume"]["session_id"]
    token = created["resume"]["resume_token"]
    first.say(" ".join(words))
    await first.event("response.output_audio_transcript.delta")
    await first.until(lambda: len(first.heard) >= 10)
    await first.close()  # mid-response
    seen = first.seqs()
    assert seen, first.types
    assert "response.done" not in first.types, "the response ended before the close"
    second = CallClient()
    response = await second.post(
        base(server), token, {"resume": session_id, "last_received_server_event_seq": seen[-1]}
    )
    assert response.status_code == 201, (response.status_code, response.text)
    assert CALL_ID.fullmatch(second.call_id), second.location
    await second.wait_open()
    resumed = await second.event("session.resumed")
    assert second.events[0] is resumed, second.types
    assert resumed["session_id"] == session_id
    return Resumed(first, second, seen[-1], token, resumed)


def transcript(call: CallClient, up_to: int | None = None) -> list[str]:
    return [
        e["delta"]
        for e in call.events
        if e["type"] == "response.output_audio_transcript.delta"
        and (up_to is None or e["server_event_seq"] <= up_to)
    ]


def test_a_call_resumed_with_a_new_peer_connection_gets_the_events_after_n_once(
    voice: ServerProcess,
) -> None:
    async def test() -> None:
        words = [f"word{n}" for n in range(24)]  # ~ 9 s of speech
        dropped_before = await metric(voice, "trio_duplex_replay_audio_dropped_total")
        call = await resumed_mid_response(voice, words)
        first, second, last = call.first, call.second, call.last
        assert call.resumed["resume_token"] and call.resumed["resume_token"] != call.token
        done = await second.event("response.done", within=30)
        assert done["response"]["status"] == "completed", done

        after = second.seqs()
        assert after and after[0] > last, (last, after[:5])
        assert after == sorted(set(after)), after  # strictly increasing: no duplicate
        assert not set(after) & set(first.seqs())
        # The transcript is whole: what the first pc read up to N, then the rest, once.
        heard = transcript(first, last) + transcript(second)
        assert "".join(heard).split() == words, heard
        final = (await second.event("response.output_audio_transcript.done"))["transcript"]
        assert final.split() == words
        # The audio made while detached was dropped, not replayed (docs/plans/webrtc.md
        # §4.4): the gaps in the seqs after N are the audio's. So every seq after N is
        # accounted for: a text event here, an audio frame dropped by the replay, or live
        # audio heard on the new track (but for what aiortc's jitter buffer holds back).
        dropped = await metric(voice, "trio_duplex_replay_audio_dropped_total") - dropped_before
        missing = (after[-1] - last) - len(after)
        assert dropped > 0, dropped
        live = missing - dropped
        await second.until(lambda: len(second.heard) >= live - HELD_BACK)
        assert 0 <= live - len(second.heard) <= HELD_BACK, (missing, dropped, second.heard)
        assert_openai_events(first)
        assert_openai_events(second)
        # The resumed call is the session's: hung up by its id with the new token.
        ended = await hang_up(base(voice), second.call_id, call.resumed["resume_token"])
        assert ended.status_code == 200, (ended.status_code, ended.text)
        await second.event("session.closed")
        await second.close()

    run(test)


def test_a_resumed_calls_audio_is_told_started_and_stopped(voice: ServerProcess) -> None:
    """docs/plans/webrtc.md §4.1: ``started`` when a response's first packet is played,
    ``stopped`` once it is done and its last packet played; on a resumed call too, for the
    live audio of the response resumed mid-way and for the next one."""

    async def test() -> None:
        call = await resumed_mid_response(voice, [f"word{n}" for n in range(12)])
        second = call.second
        await second.event("response.done", within=30)
        start = len(second.events)
        second.say("and again")
        done = await second.event("response.done", start, within=30)
        # Its stopped comes once its last packet is played, after its response.done.
        await second.event("output_audio_buffer.stopped", second.events.index(done), within=5)
        playout = [t for t in second.types if t.startswith("output_audio_buffer.")]
        assert playout == 2 * ["output_audio_buffer.started", "output_audio_buffer.stopped"], (
            second.types
        )
        await second.close()

    run(test)


# -- 4. hangup ------------------------------------------------------------------------------


def test_a_hangup_with_the_api_key_ends_the_session_and_its_token(keyed: ServerProcess) -> None:
    async def test() -> None:
        call, created = await connected(keyed, bearer=KEY)
        session_id = created["resume"]["session_id"]
        token = created["resume"]["resume_token"]
        unauthorized = await hang_up(base(keyed), call.call_id, None)
        assert_openai_error(unauthorized, 401)
        response = await hang_up(base(keyed), call.call_id, KEY)
        assert response.status_code == 200, (response.status_code, response.text)
        assert response.content == b""
        closed = await call.event("session.closed")
        assert closed["type"] == "session.closed"
        await call.until(lambda: "closed" in call.states)
        await call.close()
        # The session is gone: its resume token opens nothing, and its call is unknown.
        again = CallClient()
        refused = await again.post(
            base(keyed), token, {"resume": session_id, "last_received_server_event_seq": 0}
        )
        assert_openai_error(refused, 401)
        await again.close()
        assert_openai_error(await hang_up(base(keyed), call.call_id, KEY), 404)
        # (and no credential of it was logged)
        assert KEY not in keyed.log and token not in keyed.log

    run(test)


def test_a_hangup_by_post_with_the_resume_token_ends_the_session(keyed: ServerProcess) -> None:
    async def test() -> None:
        call, created = await connected(keyed, bearer=KEY)
        token = created["resume"]["resume_token"]
        response = await hang_up(base(keyed), call.call_id, token, method="POST")
        assert response.status_code == 200, (response.status_code, response.text)
        await call.event("session.closed")
        await call.close()

    run(test)


def test_a_detached_calls_session_is_hung_up_by_its_last_call_id(keyed: ServerProcess) -> None:
    """The peer connection is gone (closed by the client), the session waits detached
    for a resume: a hangup of its call id still ends it, and a resume then is refused."""

    async def test() -> None:
        call, created = await connected(keyed, bearer=KEY)
        await call.close()
        response = await hang_up(base(keyed), call.call_id, KEY)
        assert response.status_code == 200, (response.status_code, response.text)
        again = CallClient()
        refused = await again.post(
            base(keyed),
            created["resume"]["resume_token"],
            {"resume": created["resume"]["session_id"], "last_received_server_event_seq": 0},
        )
        assert_openai_error(refused, 401)
        await again.close()

    run(test)


def test_a_hangup_of_an_unknown_call_is_404(keyed: ServerProcess, echo: ServerProcess) -> None:
    async def test() -> None:
        unknown = "rtc_" + "0" * 32
        assert_openai_error(await hang_up(base(keyed), unknown, KEY), 404)
        assert_openai_error(await hang_up(base(echo), unknown, None), 404)
        assert_openai_error(await hang_up(base(echo), unknown, None, method="POST"), 404)

    run(test)


def test_the_openai_sdk_creates_a_call_with_a_session_and_hangs_it_up(
    keyed: ServerProcess,
) -> None:
    """Form B, as the ``openai`` SDK sends it: ``client.realtime.calls.create(sdp=,
    session=)`` (multipart: the offer and the session's JSON), then
    ``calls.hangup(call_id)``. The session part is the call's first ``session.update``:
    ``session.created``, then ``session.updated`` with it."""
    from openai import AsyncOpenAI
    from openai.types.realtime import RealtimeSessionCreateRequestParam

    async def test() -> None:
        call = CallClient()
        async with client(base(keyed)) as http:
            sdk = AsyncOpenAI(
                base_url=base(keyed) + "/v1", api_key=KEY, http_client=http, max_retries=0
            )
            session: RealtimeSessionCreateRequestParam = {
                "type": "realtime",
                "instructions": "be brief",
            }
            raw = await sdk.realtime.calls.with_raw_response.create(
                sdp=await call.offer(),
                session=session,
            )
            assert raw.status_code == 201
            assert raw.headers["content-type"].split(";")[0] == "application/sdp"
            call_id = raw.headers["location"].rsplit("/", 1)[-1]
            assert CALL_ID.fullmatch(call_id), raw.headers["location"]
            await call.answer(raw.content.decode())
            await call.wait_open()
            updated = await call.event("session.updated")
            assert call.types[:2] == ["session.created", "session.updated"], call.types
            assert updated["session"]["instructions"] == "be brief"
            call.say("form b")
            assert (await call.event("response.output_text.done"))["text"] == "form b"
            await sdk.realtime.calls.hangup(call_id)
            await call.event("session.closed")
        await call.close()

    run(test)


# -- 5. the GPL boundary at runtime ---------------------------------------------------------


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text(encoding="utf-8", errors="replace")


def test_after_a_call_the_server_process_has_no_libavcodec_or_libx264(echo: ServerProcess) -> None:
    """docs/plans/webrtc.md §0.1, §5.4: av (and the GPL x264 it links) is mapped into the
    media worker, never into the server. The worker's own maps are the control: the same
    search finds libavcodec there."""

    async def test() -> None:
        call, _ = await connected(echo)
        call.say("a call went through")
        await call.event("response.done")
        served = maps(echo.proc.pid)
        assert "libavcodec" not in served and "libx264" not in served
        assert "python" in served  # (the maps were read)
        workers = [
            child
            for child in psutil.Process(echo.proc.pid).children(recursive=True)
            if "libavcodec" in maps(child.pid)
        ]
        assert workers, "no child process of the server maps libavcodec: no media worker?"
        await call.close()

    run(test)


TURN_CREDENTIAL = "tUrN-cReD-5e4f"


def test_a_debug_server_s_worker_logs_at_debug_and_no_turn_credential_is_shown(
    serve: Serve,
) -> None:
    """``--log-level debug`` reaches the media worker (its level is taken when it starts,
    after the CLI has set up logging), and a TURN server's credential is in no log line
    and not on the worker's command line (it goes in the worker's environment)."""
    turn = f"turn:127.0.0.1:9,someone,{TURN_CREDENTIAL}"  # (never reached: no call here)
    server = serve(*CALL_FLAGS, "--engine", "echo", "--log-level", "debug",
                   "--call-ice-server", turn)  # fmt: skip
    (worker,) = [
        child
        for child in psutil.Process(server.proc.pid).children(recursive=True)
        if any("_worker.py" in part for part in child.cmdline())
    ]
    settings = json.loads(worker.cmdline()[-1])
    assert settings["log_level"] == "DEBUG", settings
    assert TURN_CREDENTIAL not in " ".join(worker.cmdline())
    assert TURN_CREDENTIAL not in server.log and "someone" not in repr(settings)


# -- 6. refusals on the real server ---------------------------------------------------------


def test_an_offer_without_a_data_channel_is_400(keyed: ServerProcess) -> None:
    async def test() -> None:
        call = CallClient(data_channel=False)
        response = await call.post(base(keyed), KEY)
        assert_openai_error(response, 400)
        assert call.answer_sdp == ""
        await call.close()

    run(test)


def test_a_call_without_a_credential_is_401(keyed: ServerProcess) -> None:
    async def test() -> None:
        for bearer in (None, "sk-not-a-key"):
            call = CallClient()
            assert_openai_error(await call.post(base(keyed), bearer), 401)
            await call.close()

    run(test)


def test_a_too_large_offer_is_413(keyed: ServerProcess) -> None:
    """An offer padded past ``--call-max-sdp-bytes`` (32 KiB), whole; and a head that only
    announces a body past every bound (refused before a byte of it is read)."""

    async def test() -> None:
        call = CallClient()
        offer = await call.offer()
        padded = offer + "".join(f"a=x-pad:{n:08d}{'p' * 80}\r\n" for n in range(400))
        assert len(padded.encode()) > 32 * 1024
        response = await call.post(base(keyed), KEY, sdp=padded)
        assert_openai_error(response, 413)
        await call.close()

    run(test)
    request = (
        f"POST {CALLS_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/sdp\r\nContent-Length: 100000000\r\n\r\nv=0\r\n"
    ).encode()
    answer = exchange(keyed, request)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
