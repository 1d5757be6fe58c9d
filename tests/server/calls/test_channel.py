"""A call's session through the real Opener and runner, over a ``CallChannel`` on a fake
media link: the test plays the media worker (and the client behind it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from trio.testing import MockClock

from trio_duplex.core.frames import (
    FrameError,
    Opcode,
    binary_frame,
    control_frame,
    messages_of,
    text_frame,
)
from trio_duplex.core.opening import OPEN
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.media.wire import Kind, unpack_audio
from trio_duplex.testing.media import FakeCall

from .helpers import MIC_20_MS, calls, settle, tone


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def assert_in_seq_order(call: FakeCall) -> None:
    """Everything sequenced the shell sent, text and audio, went out in seq order."""
    seqs: list[int] = []
    for frame in call.sent:
        if frame.kind is Kind.AUDIO:
            seqs.append(unpack_audio(frame.payload)[0])
        elif frame.kind is Kind.DC_TEXT:
            seq = json.loads(frame.payload).get("server_event_seq")
            if seq is not None:
                seqs.append(seq)
    assert seqs == sorted(set(seqs)), seqs


async def test_session_created_is_the_first_data_channel_message(
    autojump_clock: MockClock,
) -> None:
    async with calls() as c:
        channel, call = c.channel()
        assert await channel.offer(b'{"sdp": "v=0"}') == c.link.answer_sdp
        assert [frame.kind for frame in call.sent] == [Kind.OFFER]
        created = await c.serve(channel)
        assert created["type"] == "session.created"
        assert created["resume"]["session_id"] == created["session"]["id"]
        assert call.events()[0] == created  # nothing before it on the data channel
        assert not call.audio()


async def test_mic_reaches_the_engine_and_its_echo_goes_out_in_seq_order(
    autojump_clock: MockClock,
) -> None:
    async with calls() as c:
        channel, call, _ = await c.open()
        for chunk in tone(10):  # 200 ms: the inbox's bound, pushed in one go
            call.mic(chunk)
        call.dc_text({"type": "input_audio_buffer.commit"})
        call.dc_text({"type": "response.create"})
        done = await call.event_of_type("response.done")
        assert done["response"]["status"] == "completed"
        assert channel.mic_dropped == 0
        events = call.events()
        created = next(e for e in events if e["type"] == "response.created")
        seqs = call.audio_seqs()
        # Echoed as ~200 ms of 20 ms Opus packets, in seq order, all inside the response.
        assert len(seqs) >= 9, seqs
        assert seqs == sorted(set(seqs))
        assert created["server_event_seq"] < seqs[0] and seqs[-1] < done["server_event_seq"]
        # No seq is on the data channel and the track both.
        text_seqs = {e["server_event_seq"] for e in events if "server_event_seq" in e}
        assert not text_seqs & set(seqs)
        # The worker played them: started after response.created, stopped after done.
        stopped = await call.event_of_type("output_audio_buffer.stopped")
        order = types(call.events())
        assert order.index("response.created") < order.index("output_audio_buffer.started")
        assert order.index("response.done") < order.index("output_audio_buffer.stopped")
        started = next(e for e in call.events() if e["type"] == "output_audio_buffer.started")
        rid = created["response"]["id"]
        assert started["response_id"] == stopped["response_id"] == rid
        assert "server_event_seq" not in started and started["event_id"].startswith("event_rtc_")
        assert call.played_seqs == seqs
        assert_in_seq_order(call)


async def test_mic_before_the_session_is_dropped(autojump_clock: MockClock) -> None:
    async with calls() as c:
        channel, call = c.channel()
        call.dc_open()
        call.mic(tone(1)[0])
        assert channel.mic_dropped == 1
        created = await c.serve(channel)
        assert created["type"] == "session.created"


async def test_voice_engine_hears_the_mic_and_speaks_a_turn(autojump_clock: MockClock) -> None:
    engines: list[VoiceEngine] = []

    def factory(config: Any) -> VoiceEngine:
        engines.append(VoiceEngine(config))
        return engines[-1]

    async with calls(factory) as c:
        _, call, _ = await c.open()
        for chunk in tone(5):
            call.mic(chunk)
        await settle()
        (engine,) = engines
        # 100 ms at 48 kHz, resampled to the engine's 24 kHz (a few ms held back).
        assert 0 < engine.audio_bytes_received <= 5 * MIC_20_MS // 2
        call.dc_text(_say("hello there"))
        call.dc_text({"type": "response.create"})
        done = await call.event_of_type("response.done")
        assert done["response"]["status"] == "completed"
        seqs = call.audio_seqs()
        assert len(seqs) > 10 and seqs == sorted(set(seqs))
        await call.event_of_type("output_audio_buffer.stopped")
        assert call.played_seqs == seqs
        assert_in_seq_order(call)


# -- credits, congestion and the cuts ------------------------------------------------------


async def test_audio_credit_congests_the_connection_until_the_worker_plays(
    autojump_clock: MockClock,
) -> None:
    async with calls(max_pending_output=4) as c:
        c.link.play_audio = False  # the test plays them
        channel, call, _ = await c.open(max_queued_audio_s=0.1)  # 5 packets queued at most
        for _ in range(15):  # 3 s of audio, 200 ms at a time
            for chunk in tone(10):
                call.mic(chunk)
            await settle()
        assert channel.mic_dropped == 0
        call.dc_text({"type": "input_audio_buffer.commit"})
        call.dc_text({"type": "response.create"})
        await settle()
        conn = c.connection(channel)
        (session,) = c.sim.sessions()
        assert call.count(Kind.AUDIO) == 5  # the credit, exactly
        assert not channel.can_write_now()
        # The engine waits for the congested connection: it has sequenced only what
        # the pump holds and the outbox's bound, while nothing is played (short of the
        # write timeout, which would cut the call).
        held = session.journal.head
        autojump_clock.jump(c.config.write_timeout_s / 2)
        await settle()
        assert call.count(Kind.AUDIO) == 5 and session.journal.head == held
        rounds = 0
        while "response.done" not in types(call.events()):
            sent = call.count(Kind.AUDIO)
            call.played(call.audio_seqs()[-1])  # all played: credit for 5 more
            await settle()
            assert sent <= call.count(Kind.AUDIO) <= sent + 5
            rounds += 1
        seqs = call.audio_seqs()
        assert len(seqs) >= 145 and rounds >= 28
        assert session.journal.head > held + 50  # (it waited: most was sequenced after)
        assert_in_seq_order(call)
        assert not conn.congested


async def test_a_client_that_does_not_drain_its_data_channel_is_cut_not_reading(
    autojump_clock: MockClock,
) -> None:
    async with calls(max_output_bytes=4096) as c:
        c.link.drain_text = False  # the data channel takes nothing more
        channel, call, created = await c.open(dc_credit=256)
        assert not channel.can_write_now()  # session.created took the credit
        for _ in range(4):  # each junk text is answered with an error, queued
            for _ in range(10):
                call.dc_text("not json")
            await settle()
        assert channel.close_code == 4003  # NOT_READING: cut
        assert call.count(Kind.CLOSE) == 1 and call.released
        assert channel.fault_reported
        (session,) = c.sim.sessions()
        assert session.id == created["session"]["id"] and session.state.value == "detached"


async def test_a_write_waiting_past_the_write_timeout_for_credit_breaks_the_call(
    autojump_clock: MockClock,
) -> None:
    async with calls(write_timeout_s=5.0) as c:
        c.link.drain_text = False
        channel, call, _ = await c.open(dc_credit=256)
        call.dc_text({"type": "session.update", "session": {"instructions": "be brief"}})
        await settle()
        assert not channel.broken  # waiting for credit
        start = trio.current_time()
        await call.wait_sent(Kind.CLOSE)
        assert trio.current_time() - start >= 5.0
        assert channel.broken and channel.fault_reported
        assert "session.updated" not in types(call.events())
        (session,) = c.sim.sessions()
        await settle()
        assert session.state.value == "detached"


async def test_too_many_texts_unread_cut_the_call(autojump_clock: MockClock) -> None:
    async with calls() as c:
        channel, call, _ = await c.open()
        for _ in range(channel.max_texts + 1):  # (the reader cannot run in between)
            call.dc_text({"type": "session.heartbeat"})
        assert channel.peer_gone and channel.fault_reported
        await call.wait_sent(Kind.CLOSE)
        await settle()
        (session,) = c.sim.sessions()
        assert session.state.value == "detached"


async def test_a_data_channel_message_over_the_bound_cuts_the_call(
    autojump_clock: MockClock,
) -> None:
    async with calls(max_event_bytes=4096) as c:
        channel, call, _ = await c.open()
        assert channel.max_message_bytes == 4096  # the session's bound, set by the shell
        call.dc_text({"type": "session.update", "session": {"instructions": "x" * 5000}})
        assert channel.peer_gone and channel.fault_reported
        await call.wait_sent(Kind.CLOSE)


async def test_mic_past_its_bound_unread_drops_the_oldest(autojump_clock: MockClock) -> None:
    async with calls() as c:
        channel, call, _ = await c.open()
        chunks = tone(12, seed=2)
        for chunk in chunks:  # 240 ms pushed before the reader runs: 200 ms kept
            call.mic(chunk)
        assert channel.mic_dropped == 2
        assert not channel.peer_gone


# -- the peer going, and coming back ---------------------------------------------------------


async def test_a_failed_peer_connection_detaches_the_session_with_grace(
    autojump_clock: MockClock,
) -> None:
    async with calls(disconnect_grace_s=30.0) as c:
        channel, call, created = await c.open()
        call.dc_text({"type": "session.update", "session": {"instructions": "hi"}})
        await call.event_of_type("session.updated")
        call.state("disconnected")  # transient: the call goes on
        call.state("connected")
        await settle()
        assert not channel.peer_gone
        call.state("failed")
        await call.wait_sent(Kind.CLOSE)  # the shell closes its end of the call
        await settle()
        assert call.released
        (session,) = c.sim.sessions()
        assert session.id == created["session"]["id"] and session.state.value == "detached"
        autojump_clock.jump(25.0)
        await settle()
        assert session.state.value == "detached"  # still there for a resume


async def test_a_broken_media_link_detaches_its_calls(autojump_clock: MockClock) -> None:
    async with calls() as c:
        first, one, _ = await c.open()
        second, two, _ = await c.open()
        c.link.break_link()
        await settle()
        assert first.peer_gone and second.peer_gone
        assert one.count(Kind.CLOSE) == two.count(Kind.CLOSE) == 0  # (nothing to send on)
        assert one.released and two.released
        assert [s.state.value for s in c.sim.sessions()] == ["detached", "detached"]


async def test_a_resume_over_a_new_call_replays_the_events_after_n_exactly_once(
    autojump_clock: MockClock,
) -> None:
    async with calls() as c:
        _, call, created = await c.open()
        call.dc_text(_say("hello"))
        call.dc_text({"type": "response.create"})
        await call.event_of_type("response.done")
        journaled = [e for e in call.events() if "server_event_seq" in e]
        n = journaled[2]["server_event_seq"]
        call.state("failed")
        await settle()

        channel, again = c.channel()
        resume = created["resume"]
        query = {
            "resume": [resume["session_id"]],
            "last_received_server_event_seq": [str(n)],
        }
        resumed = await c.serve(channel, query, bearer=resume["resume_token"])
        assert resumed["type"] == "session.resumed", resumed
        await settle()
        replayed = [e for e in again.events() if "server_event_seq" in e]
        assert replayed == [e for e in journaled if e["server_event_seq"] > n]
        # Live again: a new turn's events follow, none of them a seq seen before.
        again.dc_text({"type": "response.create"})
        await again.event_of_type("response.done")
        seqs = [e["server_event_seq"] for e in again.events() if "server_event_seq" in e]
        assert seqs == sorted(set(seqs)) and seqs[0] == n + 1
        (session,) = c.sim.sessions()
        assert session.state.value == "attached"


async def test_a_session_closed_by_its_client_closes_the_call_and_frees_its_slot(
    autojump_clock: MockClock,
) -> None:
    async with calls() as c:
        _, call, _ = await c.open()
        call.dc_text({"type": "session.close"})
        await call.wait_sent(Kind.CLOSE)
        await settle()
        assert "session.closed" in types(call.events())
        assert call.released and not c.sim.sessions()


# -- playback: the client's clear and barge-in -------------------------------------------------


def _say(words: str) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": words}],
        },
    }


async def test_the_clients_clear_cuts_off_the_response_it_hears(
    autojump_clock: MockClock,
) -> None:
    async with calls(VoiceEngine) as c:
        channel, call, _ = await c.open()
        call.dc_text(_say("one two three four five six seven eight"))
        call.dc_text({"type": "response.create"})
        started = await call.event_of_type("output_audio_buffer.started")
        call.dc_text({"type": "output_audio_buffer.clear"})
        assert call.count(Kind.CLEAR) == 1
        cleared = await call.event_of_type("output_audio_buffer.cleared")
        assert cleared["response_id"] == started["response_id"]
        heard = call.count(Kind.AUDIO)
        done = await call.event_of_type("response.done")  # the engine spoke on
        assert done["response"]["status"] == "completed"
        assert call.count(Kind.AUDIO) == heard and channel.audio_muted > 0  # none heard
        assert "output_audio_buffer.stopped" not in types(call.events())
        # The next response is heard again.
        call.dc_text({"type": "response.create"})
        await call.event_of_type("output_audio_buffer.stopped")
        assert call.count(Kind.AUDIO) > heard
        # The clear was the transport's: taken, never refused (no engine accepts it).
        assert "error" not in types(call.events()), call.events()


async def test_a_cancelled_response_is_cleared_once(autojump_clock: MockClock) -> None:
    """The agents SDK's interrupt: response.cancel, then output_audio_buffer.clear."""
    async with calls(VoiceEngine) as c:
        c.link.play_audio = False  # nothing played: every packet is still queued
        _, call, _ = await c.open()
        call.dc_text(_say("one two three four five six"))
        call.dc_text({"type": "response.create"})
        await call.wait_sent(Kind.AUDIO, 3)
        call.dc_text({"type": "response.cancel"})
        done = await call.event_of_type("response.done")
        assert done["response"]["status"] == "cancelled"
        cleared = await call.event_of_type("output_audio_buffer.cleared")
        assert cleared["response_id"] == done["response"]["id"]
        assert call.count(Kind.CLEAR) == 1
        call.dc_text({"type": "output_audio_buffer.clear"})
        await settle()
        assert call.count(Kind.CLEAR) == 2
        assert types(call.events()).count("output_audio_buffer.cleared") == 1


# -- the handshake rule: a session whose session.created did not reach its peer -----------


class _Preparing(EchoEngine):
    """Echo, after a ``prepare`` that waits for the test."""

    ready = trio.Event()

    async def prepare(self, nursery: trio.Nursery) -> None:
        await self.ready.wait()


async def test_a_peer_gone_while_the_engine_prepares_gets_no_session(
    autojump_clock: MockClock,
) -> None:
    _Preparing.ready = trio.Event()
    async with calls(_Preparing) as c:
        channel, call = c.channel()
        call.dc_open()
        await channel.wait_open()
        c.sim.nursery.start_soon(c._serve, channel, {}, OPEN, None)
        await settle()
        assert len(c.sim.sessions()) == 1  # admitted, preparing, watched
        call.state("failed")
        await settle()
        assert not call.texts()  # session.created never written: not delivered
        assert not c.sim.sessions() and call.released
        # A call that stays gets its session once the engine is ready.
        _Preparing.ready.set()
        _, _, created = await c.open()
        assert created["type"] == "session.created"


# -- a relayed home's frames (a call's resume on another node) -------------------------------


async def test_a_relayed_home_s_frames_go_out_as_the_messages_in_them(
    autojump_clock: MockClock,
) -> None:
    """The pooled relay's front hands a call the home's WebSocket frames, as they came
    (``write_frames_now``): text in fragments among a ping reaches the data channel
    whole, output audio the track, in order."""
    async with calls() as c:
        channel, call, _ = await c.open()
        text = '{"type":"response.output_text.delta","delta":"relayed","server_event_seq":7}'
        fragmented = (
            bytes((0x01, 10)) + text[:10].encode()  # TEXT, not final
            + control_frame(Opcode.PING, b"x")
            + bytes((0x80, len(text) - 10)) + text[10:].encode()  # its final continuation
        )  # fmt: skip
        audio = bytes((2, 0, 0, 0)) + (8).to_bytes(8, "big") + b"\xfc\x01\x02"
        channel.write_frames_now(fragmented + binary_frame(audio))
        await settle()
        assert json.loads(call.texts()[-1])["delta"] == "relayed"
        assert call.audio_seqs() == [8]
        assert not channel.broken
        # Frames that are no server's (masked) break the call, not the server.
        channel.write_frames_now(bytes((0x81, 0x80 | 1)) + b"mask" + b"x")
        assert channel.broken and channel.peer_gone


def test_messages_of_refuses_what_is_not_whole_server_frames() -> None:
    assert messages_of(text_frame("a") + binary_frame(b"b")) == ["a", b"b"]
    for bad in (
        text_frame("abc")[:-1],  # cut short
        bytes((0x01, 1)) + b"a",  # a fragment never finished
        bytes((0x80, 1)) + b"a",  # a continuation of nothing
        bytes((0x81, 2)) + b"\xff\xfe",  # text that is not UTF-8
    ):
        with pytest.raises(FrameError):
            messages_of(bad)


@given(st.binary(max_size=300))
def test_messages_of_any_bytes_is_messages_or_a_frame_error(data: bytes) -> None:
    try:
        messages = messages_of(data)
    except FrameError:
        return
    assert all(isinstance(m, (str, bytes)) for m in messages)
