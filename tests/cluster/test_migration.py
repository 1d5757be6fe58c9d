"""Sessions that survive a deploy (issue 13): SIGTERM a node while voice sessions stream,
and every session goes on, on another node, with no event lost, duplicated or reordered
in either direction.

Real ``trio-duplex serve --engine voice`` processes on 127.0.0.1, a real redis-server,
and the ``websockets`` package as the client, which resends its unacknowledged input
after the resume as any client of the protocol does.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection

from trio_duplex.cluster import Store
from trio_duplex.engines.voice import FRAME_BYTES, frame_count

from ..helpers import ServerProcess
from .test_relay import receive, resume, send, text, ws_to
from .test_serve import TIMEOUT

pytestmark = pytest.mark.integration

Event = dict[str, Any]

TEXTS = ("alpha beta gamma", "one two", "quick brown fox")


@attrs.define(eq=False)
class Talker:
    """One voice session's client: what it sent (to resend), what it heard (in order)."""

    created: Event
    sent: list[Event] = attrs.field(factory=list)
    heard: list[Event] = attrs.field(factory=list)
    going_away: Event | None = None

    @property
    def last_seq(self) -> int:
        return max(
            (e["server_event_seq"] for e in self.heard if "server_event_seq" in e), default=0
        )

    async def say(self, ws: ClientConnection, words: str) -> None:
        event = text(len(self.sent) + 1, words)
        self.sent.append(event)
        await send(ws, event)

    async def listen(self, ws: ClientConnection, until: Callable[[Event], bool]) -> None:
        while True:
            event = await receive(ws)
            if event["type"] == "session.going_away":
                self.going_away = event
            else:
                self.heard.append(event)
            if until(event):
                return

    def responses_done(self) -> int:
        return sum(e["type"] in ("response.done", "response.cancelled") for e in self.heard)


async def stream_until_cut(node: ServerProcess, talker: list[Talker], started: trio.Event) -> None:
    async with ws_to(node.url) as ws:
        await send(ws, {"type": "session.update", "session": {}})
        me = Talker(await receive(ws))
        talker.append(me)
        for words in TEXTS:
            await me.say(ws, words)
        # Some audio flows before the deploy begins.
        await me.listen(ws, lambda e: e["type"] == "response.output_audio.delta")
        started.set()
        with pytest.raises(ConnectionClosed) as closed:
            await me.listen(ws, lambda e: False)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


async def resume_and_finish(node: ServerProcess, me: Talker) -> Event:
    created = me.created
    async with ws_to(node.url) as ws:
        await send(ws, resume(created, created["resume_token"], me.last_seq))
        resumed = await receive(ws)
        assert resumed["type"] == "session.resumed", resumed
        for event in me.sent[resumed["last_received_client_event_seq"] :]:
            await send(ws, event)  # what the old node never took: sent again
        await me.listen(ws, lambda e: me.responses_done() == len(TEXTS))
        await send(ws, {"type": "session.close"})
        return resumed


def assert_exactly_once_in_order(me: Talker) -> None:
    seqs = [e["server_event_seq"] for e in me.heard]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # none lost, none twice, in order
    created = [e for e in me.heard if e["type"] == "response.created"]
    assert [e["response_id"] for e in created] == ["resp_1", "resp_2", "resp_3"]
    for number, words in enumerate(TEXTS, 1):
        rid = f"resp_{number}"
        mine = [e for e in me.heard if e.get("response_id") == rid]
        deltas = [e for e in mine if e["type"] == "response.output_audio.delta"]
        assert len(deltas) == frame_count(words), (rid, len(deltas))
        assert all(len(base64.b64decode(e["audio"])) == FRAME_BYTES for e in deltas)
        spoken = "".join(e["text"] for e in mine if e["type"] == "response.output_text.delta")
        assert spoken == words
        assert [e["type"] for e in mine][-1] == "response.done"


async def test_sigterm_moves_streaming_voice_sessions_to_other_nodes(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    a, b, c = nodes("abc", "--relay-port", "0", "--engine", "voice")
    talkers: list[Talker] = []
    count = 6
    async with trio.open_nursery() as nursery:
        started = [trio.Event() for _ in range(count)]
        for flag in started:
            nursery.start_soon(stream_until_cut, a, talkers, flag)
        with trio.fail_after(TIMEOUT):
            for flag in started:
                await flag.wait()
        a.proc.send_signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    for me in talkers:
        assert me.going_away is not None and me.going_away["migrating"] is True
    resumed: list[Event] = []

    async def go_on(node: ServerProcess, me: Talker) -> None:
        resumed.append(await resume_and_finish(node, me))

    async with trio.open_nursery() as nursery:
        for i, me in enumerate(talkers):
            nursery.start_soon(go_on, (b, c)[i % 2], me)
    for me in talkers:
        assert_exactly_once_in_order(me)
    assert all(r["attachment_generation"] == 2 for r in resumed)
    assert "handed over to the cluster" in a.log
    assert set(await store.nodes()) == {"b", "c"}  # A left the cluster once drained
