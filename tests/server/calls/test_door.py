"""The calls' door (server/front/calldoor.py) over real HTTP bytes on the server's
listener, with calls set up on a fake media link (the test plays the worker and the
client behind it): the POST's answer, the call's session, hangup, resume, the setup
slot and every refusal. MockClock: nothing waits in real time."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
from trio.testing import MockClock

from trio_duplex.engines.api import EngineFactory
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.media.wire import Kind, pack_stats
from trio_duplex.server.config import ServerConfig
from trio_duplex.testing import Simulation, running_server
from trio_duplex.testing.media import FakeCall, FakeMediaLink

from .helpers import settle

OFFER = (
    "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
    "a=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10;useinbandfec=1\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\n"
    "a=sctp-port:5000\r\na=max-message-size:262144\r\n"
)
PAGE = "http://127.0.0.1:9000"
KEY = "sk-test-calls-0123456789"


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.define(eq=False)
class Door:
    sim: Simulation
    link: FakeMediaLink

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        """One HTTP request on its own connection, read until the server closes it."""
        stream, _ = await self.sim.listener.connect()
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1:8765"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
        await stream.aclose()
        head, _, rest = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parsed = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            parsed[name.strip().lower()] = value.strip()
        return Reply(int(status_line.split(" ")[1]), parsed, rest)

    async def post(
        self, target: str = "/v1/realtime/calls", offer: str = OFFER, **headers: str
    ) -> Reply:
        sent = {"Content-Type": "application/sdp"} | {
            k.replace("_", "-"): v for k, v in headers.items()
        }
        return await self.request("POST", target, offer.encode(), sent)

    async def call(
        self, target: str = "/v1/realtime/calls", **headers: str
    ) -> tuple[Reply, FakeCall]:
        before = len(self.link.calls)
        reply = await self.post(target, **headers)
        assert reply.status == 201, (reply.status, reply.body)
        assert len(self.link.calls) == before + 1
        return reply, self.link.last

    async def opened(self, **headers: str) -> tuple[str, FakeCall, dict[str, Any]]:
        """A call answered, its data channel open: its id, fake call and first event."""
        reply, call = await self.call(**headers)
        call.dc_open()
        first = await call.next_event()
        return reply.headers["location"].rsplit("/", 1)[1], call, first


@asynccontextmanager
async def door(
    engine: EngineFactory = EchoEngine, tmp_path: Path | None = None, **config: Any
) -> AsyncIterator[Door]:
    if tmp_path is not None:
        keys = tmp_path / "keys"
        keys.write_text(f"alice:{KEY}\n")
        config["api_key_file"] = str(keys)
    async with running_server(ServerConfig(**config), engine, fail_after_s=3600) as sim:
        link = FakeMediaLink()
        await sim.nursery.start(link.run)
        sim.server.serve_calls(link)
        yield Door(sim, link)


def say(words: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": words}]}
    return {"type": "conversation.item.create", "item": item}


async def test_an_offer_is_answered_201_with_the_answer_and_the_call_s_location(
    autojump_clock: MockClock,
) -> None:
    async with door(allow_origin=(PAGE,)) as d:
        reply, call = await d.call(Origin=PAGE)
        assert reply.headers["content-type"] == "application/sdp"
        assert reply.body == d.link.answer_sdp.encode()
        assert re.fullmatch(r"/v1/realtime/calls/rtc_[0-9a-f]{32}", reply.headers["location"])
        # A page on another origin may read the answer and its Location.
        assert reply.headers["access-control-allow-origin"] == PAGE
        assert "location" in reply.headers["access-control-expose-headers"].lower()
        (offer,) = call.of_kind(Kind.OFFER)
        assert json.loads(offer)["sdp"].startswith("v=0\r\n")
        # The session opens once the data channel does: session.created first.
        call.dc_open()
        created = await call.next_event()
        assert created["type"] == "session.created", created
        assert created["resume"]["session_id"] == created["session"]["id"]
        call.dc_text(say("over the data channel"))
        call.dc_text({"type": "response.create"})
        done = await call.event_of_type("response.done")
        assert "over the data channel" in json.dumps(done)


async def test_a_preflight_is_answered_for_an_allowed_origin_only(
    autojump_clock: MockClock,
) -> None:
    async with door(allow_origin=(PAGE,)) as d:
        asked = {
            "Origin": PAGE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        ok = await d.request("OPTIONS", "/v1/realtime/calls", headers=asked)
        assert ok.status == 204
        assert ok.headers["access-control-allow-origin"] == PAGE
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-private-network" not in ok.headers
        other = await d.request(
            "OPTIONS", "/v1/realtime/calls", headers=asked | {"Origin": "http://evil.test"}
        )
        assert other.status == 403 and "access-control-allow-origin" not in other.headers
        refused = await d.post(Origin="http://evil.test")
        assert refused.status == 403 and not d.link.calls  # no call was set up


async def test_a_call_needs_a_credential_and_a_client_secret_opens_one_call(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    async with door(tmp_path=tmp_path) as d:
        refused = await d.post()
        assert refused.status == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["type"] == "invalid_request_error"
        minted = await d.request(
            "POST",
            "/v1/realtime/client_secrets",
            json.dumps({"session": {"type": "realtime"}}).encode(),
            {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        assert minted.status == 200, minted.body
        secret = minted.json()["value"]
        _, _, created = await d.opened(Authorization=f"Bearer {secret}")
        assert created["type"] == "session.created"
        # The secret locks the session's configuration, but not the call's audio: that
        # is its media track's (PCM16 at 48 kHz in on the binary lane, Opus out).
        (session,) = d.sim.sessions()
        assert session.config["audio"]["wire"] == "binary"
        assert session.config["audio"]["output"] == {"format": "opus", "rate": 48000}
        again = await d.post(Authorization=f"Bearer {secret}")  # spent
        assert again.status == 401
        assert not d.link.calls[len(d.link.calls)].released  # the first call is live


async def test_hangup_ends_the_session_and_frees_its_slot(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    async with door(tmp_path=tmp_path) as d:
        call_id, call, _ = await d.opened(Authorization=f"Bearer {KEY}")
        target = f"/v1/realtime/calls/{call_id}"
        stranger = await d.request("DELETE", target, headers={"Authorization": "Bearer nope"})
        assert stranger.status == 401 and d.sim.sessions()
        unknown = await d.request(
            "DELETE",
            "/v1/realtime/calls/rtc_" + "0" * 32,
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert unknown.status == 404
        ok = await d.request("POST", target + "/hangup", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status == 200 and ok.body == b""
        await call.wait_sent(Kind.CLOSE)
        await settle()
        assert "session.closed" in [e["type"] for e in call.events()]
        assert call.released and not d.sim.sessions()
        gone = await d.request("DELETE", target, headers={"Authorization": f"Bearer {KEY}"})
        assert gone.status == 404


async def test_a_call_resumes_on_a_new_offer_with_its_resume_token(
    autojump_clock: MockClock,
) -> None:
    async with door() as d:
        _, call, created = await d.opened()
        call.dc_text(say("before the loss"))
        call.dc_text({"type": "response.create"})
        await call.event_of_type("response.done")
        seqs = [e["server_event_seq"] for e in call.events() if "server_event_seq" in e]
        n = seqs[1]
        call.state("closed")  # the peer connection is gone: the session detaches
        await settle()
        assert call.released and d.sim.sessions()
        resume = created["resume"]
        target = (
            f"/v1/realtime/calls?model=x&resume={resume['session_id']}"
            f"&last_received_server_event_seq={n}"
        )
        # Even on an open server, a resume's token no live session holds is refused
        # before any media is set up.
        calls = len(d.link.calls)
        wrong = await d.post(target, Authorization="Bearer not-its-token")
        assert wrong.status == 401 and len(d.link.calls) == calls
        _, again = await d.call(target, Authorization=f"Bearer {resume['resume_token']}")
        again.dc_open()
        resumed = await again.next_event()
        assert resumed["type"] == "session.resumed", resumed
        await settle()
        replayed = [e["server_event_seq"] for e in again.events() if "server_event_seq" in e]
        assert replayed == [s for s in seqs if s > n]


async def test_a_data_channel_that_never_opens_gives_its_setup_slot_back(
    autojump_clock: MockClock,
) -> None:
    async with door(call_max_setup=1, call_setup_timeout_s=10) as d:
        _, first = await d.call()
        busy = await d.post()
        assert busy.status == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "server_error"
        await first.wait_sent(Kind.CLOSE)  # the setup timeout passed: the call is dropped
        await settle()
        assert first.released and not d.sim.sessions()
        _, second = await d.call()
        second.dc_open()
        assert (await second.next_event())["type"] == "session.created"
        _, third = await d.call()  # the slot came back once the second opened
        assert not third.released


async def test_a_full_server_or_a_broken_worker_refuses_calls_before_any_is_set_up(
    autojump_clock: MockClock,
) -> None:
    async with door(max_sessions=1) as d:
        _, call, _ = await d.opened()
        full = await d.post()
        assert full.status == 503 and len(d.link.calls) == 1
        call.dc_text({"type": "session.close"})
        await call.wait_sent(Kind.CLOSE)
        await settle()
        d.link.break_link()
        broken = await d.post()
        assert broken.status == 503 and len(d.link.calls) == 1


async def test_bad_requests_are_refused_with_openai_s_error_shape(
    autojump_clock: MockClock,
) -> None:
    async with door(call_max_sdp_bytes=4096) as d:
        no_dc = OFFER.split("m=application")[0]
        refusals = [
            (await d.post(offer=no_dc), 400),
            (await d.post(offer="not sdp at all"), 400),
            (await d.post(offer=OFFER + "a=x:" + "y" * 5000 + "\r\n"), 413),
            (
                await d.request(
                    "POST", "/v1/realtime/calls", b"{}", {"Content-Type": "text/plain"}
                ),
                415,
            ),
            (await d.post("/v1/realtime/calls?last_received_server_event_seq=-1"), 400),
        ]
        for reply, status in refusals:
            assert reply.status == status, (reply.status, reply.body)
            error = reply.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert "y" * 50 not in error["message"]  # never the request's own text
        assert not d.link.calls  # none reached the worker


async def test_form_b_s_session_is_the_session_s_first_update(autojump_clock: MockClock) -> None:
    async with door() as d:
        boundary = "xyzzy"
        session = {"type": "realtime", "instructions": "be brief"}
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="sdp"\r\n'
            f"Content-Type: application/sdp\r\n\r\n{OFFER}\r\n"
            f'--{boundary}\r\nContent-Disposition: form-data; name="session"\r\n'
            f"Content-Type: application/json\r\n\r\n{json.dumps(session)}\r\n--{boundary}--\r\n"
        ).encode()
        reply = await d.request(
            "POST",
            "/v1/realtime/calls",
            body,
            {"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert reply.status == 201, reply.body
        call = d.link.last
        call.dc_open()
        assert (await call.next_event())["type"] == "session.created"
        updated = await call.event_of_type("session.updated")
        assert updated["session"]["instructions"] == "be brief"


async def test_a_call_counts_as_a_connection_for_its_life(autojump_clock: MockClock) -> None:
    async with door(max_connections=2) as d:
        _, call, _ = await d.opened()
        assert d.sim.server.open_connections == 1  # its HTTP connection closed, the call not
        call.state("closed")
        await settle()
        assert d.sim.server.open_connections == 0


async def test_a_benchmark_s_stats_hook_asks_the_worker_for_stats_and_is_given_each(
    autojump_clock: MockClock,
) -> None:
    """ServerConfig.call_media_stats (benchmarks/probes/call_server.py's hook; no flag
    sets it): each call's OFFER asks the worker for STATS, and each STATS it sends is
    handed to the hook as (seq, sent_ns). Without a hook the OFFER asks for none."""
    got: list[tuple[int, int]] = []
    async with door(call_media_stats=lambda seq, ns: got.append((seq, ns))) as d:
        _, call = await d.call()
        (offer,) = call.of_kind(Kind.OFFER)
        assert json.loads(offer)["stats"] is True
        call.push(Kind.STATS, pack_stats(7, 123_456_789))
        call.push(Kind.STATS, pack_stats(8, 143_456_789))
        assert got == [(7, 123_456_789), (8, 143_456_789)]
    async with door() as d:
        _, call = await d.call()
        (offer,) = call.of_kind(Kind.OFFER)
        assert "stats" not in json.loads(offer)
        call.push(Kind.STATS, pack_stats(9, 1))  # (a worker's STATS unasked: ignored)
