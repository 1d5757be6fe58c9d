"""Sessions that survive a deploy (docs/cluster.md): SIGTERM a node while voice sessions stream,
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

from trio_duplex.cluster.store import Store
from trio_duplex.engines.voice import FRAME_BYTES, frame_count

from ..helpers import ServerProcess, Servers
from .conftest import SECRET, RedisServer, node_flags
from .test_relay import open_session, receive, resume, send, text, ws_to
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


@attrs.define(eq=False)
class AnswerHolder:
    """A TCP proxy in front of Redis that can hold Redis's answers back: the commands
    still reach Redis and run, and the node waits for answers that do not come."""

    target: int
    holding: bool = False
    _released: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    def release(self) -> None:
        self.holding = False
        self._released.set()

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client, await trio.open_tcp_stream("127.0.0.1", self.target) as redis:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, redis, False)
                await self._pump(redis, client, True)
                nursery.cancel_scope.cancel()

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, answers: bool
    ) -> None:
        try:
            while data := await source.receive_some(65536):
                if answers and self.holding:
                    await self._released.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def test_a_hand_over_the_store_ran_but_did_not_confirm_still_sends_the_client_on(
    servers: Servers, redis_server: RedisServer, store: Store
) -> None:
    """Redis runs the hand-over, but its answer comes too late for the drain: the client
    was sent on all the same, and finds its session on another node (were it ended
    here instead, a session the client was never told had ended would be adopted)."""
    async with trio.open_nursery() as nursery:
        holder = AnswerHolder(redis_server.port)
        port = await nursery.start(holder.run)
        through = f"redis://127.0.0.1:{port}/0"
        a_flags = ("--cluster", through, "--cluster-secret", SECRET, "--node-id", "a")
        b_flags = node_flags(redis_server, "b")
        # (in a thread: the proxy A starts through runs in this one)
        a, b = await trio.to_thread.run_sync(
            lambda: servers.start_many(
                (*a_flags, "--relay-port", "0", "--drain-timeout", "2"),
                (*b_flags, "--relay-port", "0"),
            )
        )
        async with ws_to(a.url) as on_a:
            created = await open_session(on_a)
            await send(on_a, text(1, "before"))
            assert (await receive(on_a))["text"] == "before"
            holder.holding = True
            a.proc.send_signal(signal.SIGTERM)
            going = await receive(on_a)  # after the hand-over's patience (~1.5 s)
            assert going["type"] == "session.going_away" and going["migrating"] is True
        await trio.to_thread.run_sync(a.wait_for_line, "did not confirm its hand-over", TIMEOUT)
        holder.release()
        async with ws_to(b.url) as on_b:
            await send(on_b, resume(created, created["resume_token"], 1))
            answer = await receive(on_b)
            assert answer["type"] == "session.resumed", answer
            await send(on_b, text(2, "after"))
            assert (await receive(on_b))["text"] == "after"
        nursery.cancel_scope.cancel()
