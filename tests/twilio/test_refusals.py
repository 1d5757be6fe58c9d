"""Phone calls' refusals and endings against ``trio-duplex serve --engine echo`` with
Twilio's endpoints, over real sockets: unsigned or mis-signed webhooks and streams,
tickets of another call or expired, another account, a media format we do not take; a
session the server ended (the ``<Redirect>`` then hangs up); Twilio's status callback
ending a detached call's session; the echo engine's audio marked and acknowledged.

The requests are made the way Twilio makes them (``twilio_provider``'s ``sign``, the
stream's ``connected`` and ``start`` as its reference writes them), with ``websockets``
and ``httpx2`` as the clients; the fake Twilio places the whole calls."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
import time
from collections.abc import Iterator

import httpx2
import pytest
import trio
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from trio_duplex.server.twilio.tickets import TwilioKeys
from trio_duplex.testing.twilio_provider import (
    FakeCall,
    FakeTwilio,
    mulaw_encode,
    run_scenario,
    sign,
)

from ..helpers import ServerProcess, Servers, free_port
from .test_calls import ACCOUNT, TOKEN, base_url, metric, metrics

pytestmark = [pytest.mark.integration]

CALL = "CA" + "c" * 32
OTHER_CALL = "CA" + "d" * 32
STREAM = "MZ" + "e" * 32


def start_echo_server(servers: Servers, *flags: str) -> ServerProcess:
    port = free_port()
    return servers.start(
        *("--port", str(port), "--engine", "echo", *flags),
        *("--twilio-auth-token", TOKEN, "--twilio-account-sid", ACCOUNT),
        *("--twilio-public-url", f"http://127.0.0.1:{port}"),
    )


@pytest.fixture(scope="module")
def echo_server() -> Iterator[ServerProcess]:
    servers = Servers()
    try:
        yield start_echo_server(servers)
    finally:
        servers.stop_all()


def form(call: str = CALL, account: str = ACCOUNT) -> dict[str, str]:
    return {"AccountSid": account, "CallSid": call, "CallStatus": "ringing", "From": "+1"}


def post(
    server: ServerProcess, path: str, params: dict[str, str], signature: str | None
) -> httpx2.Response:
    headers = {} if signature is None else {"X-Twilio-Signature": signature}
    with httpx2.Client(trust_env=False, timeout=10) as client:
        return client.post(base_url(server) + path, data=params, headers=headers)


def test_webhooks_unsigned_or_mis_signed_or_of_another_account_are_refused(
    echo_server: ServerProcess,
) -> None:
    url = base_url(echo_server) + "/v1/twilio/twiml"
    good = sign(TOKEN, url, form())
    assert post(echo_server, "/v1/twilio/twiml", form(), good).status_code == 200
    for params, signature in [
        (form(), None),
        (form(), sign("f" * 32, url, form())),  # another account's token
        (form(), sign(TOKEN, url + "?x=1", form())),  # another URL
        (form(call=OTHER_CALL), good),  # the form changed after signing
    ]:
        answer = post(echo_server, "/v1/twilio/twiml", params, signature)
        assert answer.status_code == 403, answer.text
        assert answer.text == "the request is not signed by this Twilio account\n"
    other = form(account="AC" + "9" * 32)
    answer = post(echo_server, "/v1/twilio/twiml", other, sign(TOKEN, url, other))
    assert answer.status_code == 403
    assert (
        metric(metrics(echo_server), "trio_duplex_twilio_refusals_total", '{reason="signature"}')
        >= 4
    )


def start(ticket: object, *, encoding: str = "audio/x-mulaw", call: str = CALL) -> str:
    return json.dumps(
        {
            "event": "start",
            "sequenceNumber": "1",
            "streamSid": STREAM,
            "start": {
                "streamSid": STREAM,
                "accountSid": ACCOUNT,
                "callSid": call,
                "tracks": ["inbound", "outbound"],
                "customParameters": {} if ticket is None else {"trio_duplex_ticket": ticket},
                "mediaFormat": {"encoding": encoding, "sampleRate": 8000, "channels": 1},
            },
        }
    )


async def stream_closed_with(server: ServerProcess, first: str, signed: bool = True) -> int:
    """Open the stream as Twilio does, send ``connected`` and ``first``; the close code."""
    url = f"ws://127.0.0.1:{server.port}/v1/twilio"
    headers = {"X-Twilio-Signature": sign(TOKEN, url)} if signed else {}

    async def scenario() -> int:
        async with connect(url, additional_headers=headers, open_timeout=10) as ws:
            await ws.send(
                json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
            )
            await ws.send(first)
            try:
                async with asyncio.timeout(10):
                    while True:
                        await ws.recv()
            except ConnectionClosed as closed:
                assert closed.rcvd is not None
                return closed.rcvd.code
        raise AssertionError("not closed")

    return await trio.to_thread.run_sync(run_scenario, scenario)


async def test_streams_unsigned_or_with_a_bad_ticket_or_format_open_no_session(
    echo_server: ServerProcess,
) -> None:
    keys = TwilioKeys.derive(TOKEN)
    now = time.time()
    opened_before = metric(metrics(echo_server), "trio_duplex_sessions_opened_total")

    async def unsigned() -> None:
        url = f"ws://127.0.0.1:{echo_server.port}/v1/twilio"
        with pytest.raises(InvalidStatus) as info:
            async with connect(url, open_timeout=10):
                pass
        assert info.value.response.status_code == 403

    await trio.to_thread.run_sync(run_scenario, unsigned)
    for ticket in (
        None,  # no ticket
        "v1.o.1.AAAA",  # not one
        keys.mint("o", ACCOUNT, OTHER_CALL, now, 60),  # another call's
        keys.mint("o", ACCOUNT, CALL, now - 120, 60),  # expired
        TwilioKeys.derive("f" * 32).mint("o", ACCOUNT, CALL, now, 60),  # another account's key
    ):
        assert await stream_closed_with(echo_server, start(ticket)) == 1008, ticket
    ticket = keys.mint("o", ACCOUNT, CALL, now, 60)
    assert await stream_closed_with(echo_server, start(ticket, encoding="audio/x-alaw")) == 1003
    assert await stream_closed_with(echo_server, '{"event": "media"}') == 1008  # no start
    text = metrics(echo_server)
    assert metric(text, "trio_duplex_sessions_opened_total") == opened_before
    assert metric(text, "trio_duplex_twilio_refusals_total", '{reason="ticket"}') >= 5
    assert metric(text, "trio_duplex_twilio_refusals_total", '{reason="format"}') >= 2
    assert "v1.o." not in echo_server.log  # no ticket in the log


def tone(seconds: float) -> bytes:
    count = int(8000 * seconds)
    pcm = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 8000))) for i in range(count)
    )
    return mulaw_encode(pcm)


async def test_echoed_audio_is_marked_and_its_acks_free_the_journal(
    echo_server: ServerProcess,
) -> None:
    said = tone(1.0)

    async def scenario(base: str) -> FakeCall:
        async with FakeTwilio(base, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.send_audio(said)
            # (The resamplers between 8 and 24 kHz hold a few ms until more audio comes.)
            await call.wait_for(lambda c: len(c.audio_heard()) >= len(said) - 480, timeout=20)
            await call.wait_for(
                lambda c: not c.buffered and len(c.marks_echoed) == len(c.received_events("mark"))
            )
            journal = metric(metrics(echo_server), "trio_duplex_journal_bytes")
            await call.stop()
            await call.wait_ended()
            # Acked as played, so forgotten: all but what follows the last mark (at most one
            # --twilio-mark-interval, 800 bytes, and its frames' headers; the echo engine
            # ends no response, so its last audio is marked when the stream closes).
            assert journal <= 800 + 5 * 12, journal
            return call

    call = await trio.to_thread.run_sync(run_scenario, scenario, base_url(echo_server))
    heard = call.audio_heard()
    # The echo, through the server's codecs at the engine's 24 kHz: as long, and loud.
    assert len(said) - 480 <= len(heard) <= len(said)
    media = call.received_events("media")
    marks = call.received_events("mark")
    assert len(marks) <= len(media)
    names = [int(m.message["mark"]["name"]) for m in marks]
    assert names == sorted(names) and len(set(names)) == len(names)


async def test_a_session_the_server_ended_is_hung_up_by_its_redirect(servers: Servers) -> None:
    server = start_echo_server(servers, "--idle-ttl", "2")

    async def scenario(base: str) -> FakeCall:
        async with FakeTwilio(base, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.wait_ended(timeout=20)  # silent: the idle TTL (2 s) ends it
            return call

    call = await trio.to_thread.run_sync(run_scenario, scenario, base_url(server))
    assert call.streams[0].ended_by == "server_close" and call.streams[0].close_code == 1000
    _, redirect = call.fetches
    assert "?resume=1&attempt=1&t=" in redirect.url
    assert (
        redirect.status == 200 and "<Hangup/>" in redirect.body and "<Stream" not in redirect.body
    )
    assert len(call.streams) == 1


async def test_twilio_s_completed_status_ends_a_detached_call_s_session(
    echo_server: ServerProcess,
) -> None:
    keys = TwilioKeys.derive(TOKEN)
    call_sid = "CA" + "f" * 32
    session_id = keys.session_id(ACCOUNT, call_sid)
    url = f"ws://127.0.0.1:{echo_server.port}/v1/twilio"

    async def dropped() -> None:
        headers = {"X-Twilio-Signature": sign(TOKEN, url)}
        ticket = keys.mint("o", ACCOUNT, call_sid, time.time(), 60)
        async with connect(url, additional_headers=headers, open_timeout=10) as ws:
            await ws.send(
                json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
            )
            await ws.send(start(ticket, call=call_sid))
            silence = base64.b64encode(b"\xff" * 160).decode()
            media = {"event": "media", "streamSid": STREAM, "media": {"payload": silence}}
            for _ in range(10):  # 200 ms: through the 8-24-8 kHz resamplers, echoed
                await ws.send(json.dumps(media))
            # Its echo: the session is open (session.created written before it), so the
            # drop below detaches it (a drop before that leaves it undelivered, rightly).
            async with asyncio.timeout(10):
                while json.loads(await ws.recv())["event"] != "media":
                    pass
            ws.transport.abort()  # the line drops: no stop, no close

    await trio.to_thread.run_sync(run_scenario, dropped)
    echo_server.wait_for_line(rf"session {session_id} detached", 10)
    status = {"AccountSid": ACCOUNT, "CallSid": call_sid, "CallStatus": "completed"}
    status_url = base_url(echo_server) + "/v1/twilio/status"
    answer = post(echo_server, "/v1/twilio/status", status, sign(TOKEN, status_url, status))
    assert answer.status_code == 204
    echo_server.wait_for_line(rf"session {session_id} ended: client_close", 10)
