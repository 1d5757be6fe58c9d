"""A WebRTC call resumed on another node (docs/webrtc.md): two ``serve --calls`` nodes of a
cluster on a real redis-server. The call opens on A; its peer connection closes mid-reply;
the resume's POST, with a new peer connection, reaches B, whose door lets the resume token
through (its session is elsewhere) and relays the call to A over the pooled relay: the
data channel on B delivers ``session.resumed``, the events after N once and in order
(the home's frames turned back into messages on the call), and a new turn works across
the relay.

aiortc runs under asyncio in a thread of the test (the cluster's fixtures are trio's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import trio

from ..calls.client import CALL_ID, CallClient, close_all
from ..helpers import ServerProcess
from ..media.rtc import loopback_for_the_test

pytestmark = pytest.mark.integration

CALL_FLAGS = ("--calls", "--call-allow-peer", "127.0.0.0/8", "--engine", "voice")
WORDS = [f"word{n}" for n in range(16)]


def base(node: ServerProcess) -> str:
    return f"http://127.0.0.1:{node.port}"


async def resumed_elsewhere(
    a: ServerProcess, b: ServerProcess
) -> tuple[list[int], list[int], list[str]]:
    """Open on ``a``, lose the pc mid-reply, resume on ``b``; the seqs each pc read, and
    the words of the whole transcript (up to N on the first, the rest on the second)."""
    try:
        async with asyncio.timeout(60):
            first = CallClient()
            response = await first.post(base(a))
            assert response.status_code == 201, (response.status_code, response.text)
            await first.wait_open()
            created = await first.event("session.created")
            resume = created["resume"]
            first.say(" ".join(WORDS))
            await first.event("response.output_audio_transcript.delta")
            await first.close()  # mid-reply
            seen = first.seqs()
            n = seen[-1]
            assert "response.done" not in first.types, "the reply ended before the close"
            second = CallClient()
            query = {"resume": resume["session_id"], "last_received_server_event_seq": n}
            response = await second.post(base(b), resume["resume_token"], query)
            assert response.status_code == 201, (response.status_code, response.text)
            assert CALL_ID.fullmatch(second.call_id)
            await second.wait_open()
            resumed = await second.event("session.resumed")
            assert second.events[0] is resumed, second.types
            done = await second.event("response.done", within=30)
            assert done["response"]["status"] == "completed", done
            # A new turn across the relay: its reply on B's data channel.
            start = len(second.events)
            second.say("over the relay")
            again = await second.event("response.done", start, within=30)
            assert again["response"]["status"] == "completed", again
            words = [
                word
                for call, up_to in ((first, n), (second, again["server_event_seq"]))
                for e in call.events
                if e["type"] == "response.output_audio_transcript.delta"
                and e["server_event_seq"] <= up_to
                for word in e["delta"].split()
            ]
            await second.close()
            return seen, second.seqs(), words
    finally:
        await close_all()


async def test_a_call_resumes_on_another_node_through_the_relay(
    nodes: Callable[..., list[ServerProcess]], monkeypatch: pytest.MonkeyPatch
) -> None:
    loopback_for_the_test(monkeypatch)
    a, b = nodes(["a", "b"], *CALL_FLAGS)
    before, after, words = await trio.to_thread.run_sync(asyncio.run, resumed_elsewhere(a, b))
    assert after and after[0] > before[-1], (before[-5:], after[:5])
    assert after == sorted(set(after)) and not set(after) & set(before)  # once, in order
    assert words == [*WORDS, "over", "the", "relay"], words
    assert "relaying its resume to its home node a" in b.log
    for node in (a, b):
        assert "Traceback" not in node.log and " ERROR " not in node.log, node.log
