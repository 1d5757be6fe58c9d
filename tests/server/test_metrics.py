"""Health, readiness, metrics (README, Health and metrics) and per-session usage
(docs/protocol.md, Ending), in memory: exact counts."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.core.session import audio_ms
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.testing import ScriptedEngine, ScriptedFactory, Simulation, running_server

from ..helpers import RawHttp, echo


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


async def readyz(sim: Simulation, raw_http: RawHttp) -> tuple[int, Any]:
    status, headers, body = split(await raw_http(sim, get("/readyz")))
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def scrape(sim: Simulation, raw_http: RawHttp) -> dict[Any, float]:
    status, headers, body = split(await raw_http(sim, get("/metrics")))
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=")
    return samples(body.decode())


async def test_healthz_and_readyz_follow_slots_and_the_drain(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        status, _, body = split(await raw_http(sim, get("/healthz")))
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        assert await readyz(sim, raw_http) == (
            200,
            {"status": "ready", "slots_held": 0, "slots_max": 1},
        )
        client, _ = await sim.open_session()
        assert await readyz(sim, raw_http) == (
            503,
            {"status": "full", "slots_held": 1, "slots_max": 1},
        )
        await client.send({"type": "session.close"})
        await client.receive_until_closed()
        await sim.server.wait_changed()
        assert (await readyz(sim, raw_http))[0] == 200
        await sim.open_session()  # (the server serves on while a session drains)
        sim.server.begin_shutdown()
        assert await readyz(sim, raw_http) == (
            503,
            {"status": "draining", "slots_held": 1, "slots_max": 1},
        )
        status, _, _ = split(await raw_http(sim, get("/healthz")))
        assert status == 200


async def test_usage_in_session_closed_counts_exactly(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()  # the opening update is not counted
        sent: list[str] = []
        received: list[str] = []
        for text in ["hello", "wörld"]:
            event = {"type": "input.text.append", "text": text}
            sent.append(json.dumps(event))
            reply = await echo(client, text)
            received.append(json.dumps(reply, separators=(",", ":"), ensure_ascii=False))
        sent.append(json.dumps({"type": "session.heartbeat"}))
        await client.send({"type": "session.heartbeat"})
        assert (await client.receive())["type"] == "session.heartbeat_ack"  # not counted out
        # A resume: counted once it commits; its replay is not counted again.
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["type"] == "session.resumed"
        assert (await client2.receive())["server_event_seq"] == 2  # the replay
        close = {"type": "session.close"}
        sent.append(json.dumps(close))
        await client2.send(close)
        (closed,) = await client2.receive_until_closed()
    assert closed["type"] == "session.closed"
    assert closed["usage"] == {
        "events_in": 4,
        "events_out": 2,
        "bytes_in": sum(map(len, sent)),
        "bytes_out": sum(len(frame.encode()) for frame in received),
        "resumes": 1,
        "audio_ms_in": 0,  # the echo engine's audio is 24 kHz PCM16: known, and none
        "audio_ms_out": 0,
    }


async def test_metrics_count_sessions_events_resumes_and_refusals(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(max_sessions=3)) as sim:
        before = await scrape(sim, raw_http)
        assert before["trio_duplex_slots_max", ()] == 3
        assert before["trio_duplex_sessions_opened_total", ()] == 0
        assert before["trio_duplex_sessions", (("state", "attached"),)] == 0

        a, created = await sim.open_session()
        for n in range(3):
            await echo(a, str(n))
        b, _ = await sim.open_session()
        await echo(b)
        await b.send({"type": "session.close"})
        await b.receive_until_closed()
        await sim.server.wait_changed()
        # a resume replaying 2 events, and one refused
        a2, _ = await sim.resume(created["session_id"], created["resume_token"], 1)
        for _ in range(2):
            await a2.receive()
        bad, answer = await sim.resume(created["session_id"], "wrong", 0)
        assert answer["code"] == "invalid_resume_token"
        await bad.receive_until_closed()
        assert (await raw_http(sim, get("/nothing-here"))).startswith(b"HTTP/1.1 400")
        ws_elsewhere = b"GET /elsewhere HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
        ws_elsewhere += b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        ws_elsewhere += b"Sec-WebSocket-Version: 13\r\n\r\n"
        assert (await raw_http(sim, ws_elsewhere)).startswith(b"HTTP/1.1 404")

        found = await scrape(sim, raw_http)
        assert found["trio_duplex_sessions", (("state", "attached"),)] == 1
        assert found["trio_duplex_sessions", (("state", "detached"),)] == 0
        assert found["trio_duplex_sessions_opened_total", ()] == 2
        # in: a's 3 inputs, b's input and close; out: 3 + 1 echoes
        assert found["trio_duplex_events_total", (("direction", "in"),)] == 5
        assert found["trio_duplex_events_total", (("direction", "out"),)] == 4
        assert found["trio_duplex_replayed_events_total", ()] == 2
        assert found["trio_duplex_replay_audio_dropped_total", ()] == 0  # native replays audio
        assert found["trio_duplex_resumes_total", (("result", "ok"),)] == 1
        assert found["trio_duplex_resumes_total", (("result", "invalid_resume_token"),)] == 1
        assert found["trio_duplex_handshake_refusals_total", (("reason", "not_upgrade"),)] == 1
        assert found["trio_duplex_handshake_refusals_total", (("reason", "not_found"),)] == 1
        assert found["trio_duplex_engine_errors_total", ()] == 0
        session = sim.session(created["session_id"])
        assert session is not None
        assert found["trio_duplex_journal_bytes", ()] == session.journal.bytes > 0
        assert found["trio_duplex_connections", ()] == 2  # a2 and this scrape


async def test_one_event_in_64_is_timed_from_send_to_write(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        for n in range(63):
            await echo(client, str(n))
        found = await scrape(sim, raw_http)
        assert found["trio_duplex_send_to_write_seconds_count", ()] == 0
        await echo(client)
        found = await scrape(sim, raw_http)
        assert found["trio_duplex_send_to_write_seconds_count", ()] == 1
        assert found["trio_duplex_send_to_write_seconds_bucket", (("le", "0.0005"),)] == 1
        assert found["trio_duplex_send_to_write_seconds_sum", ()] == 0  # the clock stood still


@attrs.define
class BreakableFactory(ScriptedFactory):
    """Fails for a configuration with ``break``."""

    def __call__(self, config: Mapping[str, Any]) -> ScriptedEngine:
        if config.get("break"):
            raise ZeroDivisionError("a factory that fails")
        return super().__call__(config)


async def test_engine_errors_count_sessions_and_factories(
    autojump_clock: MockClock, raw_http: RawHttp, caplog: pytest.LogCaptureFixture
) -> None:
    factory = BreakableFactory({})
    async with running_server(engine_factory=factory) as sim:
        client, _ = await sim.open_session()
        factory.last.fail(ZeroDivisionError("run fails"))
        await client.receive_until_closed()
        broken = await sim.connect()
        answer = await broken.send_and_receive(
            {"type": "session.update", "session": {"break": True}}
        )
        assert answer["code"] == "engine_error"
        found = await scrape(sim, raw_http)
        assert found["trio_duplex_engine_errors_total", ()] == 2
        assert found["trio_duplex_sessions_opened_total", ()] == 1


async def test_a_handshake_that_times_out_is_a_refusal(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(handshake_timeout_s=3)) as sim:
        stream, _ = await sim.listener.connect()
        await stream.send_all(b"GET /v1/duplex HTTP/1.1\r\n")  # and nothing more
        await sim.server.wait_changed()
        found = await scrape(sim, raw_http)
        assert found["trio_duplex_handshake_refusals_total", (("reason", "timeout"),)] == 1
        await stream.aclose()


async def test_usage_counts_audio_milliseconds_of_an_engine_with_an_audio_rate(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=VoiceEngine) as sim:  # 24 kHz PCM16
        client, _ = await sim.open_session()
        for size in [960, 480, 2]:  # 20 ms, 10 ms, and one sample (1/24 ms)
            audio = base64.b64encode(bytes(size)).decode()
            await client.send({"type": "input_audio_buffer.append", "audio": audio})
        await client.send({"type": "input.text.append", "text": "hello world"})
        frames = 0
        while (event := await client.receive())["type"] != "response.done":
            frames += event["type"] == "response.output_audio.delta"
        await client.send({"type": "session.close"})
        (closed,) = await client.receive_until_closed()
    assert frames > 0
    assert closed["usage"]["audio_ms_in"] == 30  # 30.04, rounded
    assert closed["usage"]["audio_ms_out"] == 20 * frames


class LegacyEcho(EchoEngine):
    """An engine without ``audio_rate``: audio passes through as v1's base64."""

    audio_rate = None


class HearingLegacyEcho(LegacyEcho):
    """...told by ``audio_formats`` that its audio is 16 kHz mono PCM16."""

    audio_formats = {"input_audio_buffer.append": 32, "response.output_audio.delta": 32}


async def test_usage_counts_audio_of_a_legacy_engine_by_its_audio_formats(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=HearingLegacyEcho) as sim:
        client, _ = await sim.open_session()
        audio = base64.b64encode(bytes(640)).decode()  # 20 ms at 16 kHz
        echoed = await client.send_and_receive(
            {"type": "input_audio_buffer.append", "audio": audio}
        )
        assert echoed["audio"] == audio  # passed through as it came
        await client.send({"type": "session.close"})
        (closed,) = await client.receive_until_closed()
    assert closed["usage"]["audio_ms_in"] == 20
    assert closed["usage"]["audio_ms_out"] == 20


async def test_usage_has_no_audio_for_an_engine_that_declares_no_format(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=LegacyEcho) as sim:
        client, _ = await sim.open_session()
        audio = base64.b64encode(bytes(640)).decode()
        await client.send_and_receive({"type": "input_audio_buffer.append", "audio": audio})
        await client.send({"type": "session.close"})
        (closed,) = await client.receive_until_closed()
    assert "audio_ms_in" not in closed["usage"]
    assert "audio_ms_out" not in closed["usage"]


@pytest.mark.parametrize(
    ("audio", "ms"), [("", 0), ("AAAA", 3 / 48), ("AAA=", 2 / 48), ("AA==", 1 / 48)]
)
def test_audio_ms_from_base64_length(audio: str, ms: float) -> None:
    assert audio_ms({"audio": audio}, 48) == pytest.approx(ms)
    assert audio_ms({}, 48) == 0
