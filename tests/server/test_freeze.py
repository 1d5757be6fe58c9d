"""``SessionRunner.freeze`` (the engine stopped at a safe point for a migration) and a
whole migration between two in-memory servers through a record's bytes.

The guarantees: an engine ``send`` that returned was journaled, one that raised was
not; an event ``receive`` returned was taken, one whose ``receive`` raised was not. Each
scenario is cut at many points (``cut``: scheduler rounds before the freeze, with the
connection congested or not) and checks the engine's own count against the session's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.core.events import Reason
from trio_duplex.core.migration import Frozen, Record, export, restore
from trio_duplex.core.session import State
from trio_duplex.dialects import NATIVE
from trio_duplex.engines.api import Engine, EngineSession, Event, Inbox
from trio_duplex.server.sessions.runner import SessionRunner
from trio_duplex.testing import SimClient, Simulation, running_server, settle

TEXT = "response.output_text.delta"


class Tally(Engine):
    """Counts what it takes and what it sends, and can move. ``{"mode": "send"}``: it
    sends ``out1``, ``out2``, ... up to ``limit`` unprompted; else it answers each
    ``input.text.append`` numbered n with ``re<n>``. Its snapshot is its counts: a
    restored Tally first answers what it took and had not answered."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.mode = config.get("mode", "answer")
        self.limit = int(config.get("limit", 300))
        self.taken: list[int] = []
        """The ``client_event_seq`` of every event ``receive`` returned."""
        self.answered = 0
        self.sent = 0
        """Sends that returned."""

    async def run(self, session: EngineSession) -> None:
        if self.mode == "send":
            while self.sent < self.limit:
                await session.send({"type": TEXT, "text": f"out{self.sent + 1}"})
                self.sent += 1
            await trio.sleep_forever()
        if self.mode == "batch":  # send_many, 50 at a time: all of a batch or none
            while self.sent < self.limit:
                first = self.sent + 1
                await session.send_many(
                    [{"type": TEXT, "text": f"out{n}"} for n in range(first, first + 50)]
                )
                self.sent += 50
            await trio.sleep_forever()
        while True:
            while self.answered < len(self.taken):  # (restored: answer what it owes first)
                await session.send({"type": TEXT, "text": f"re{self.taken[self.answered]}"})
                self.answered += 1
                self.sent += 1
            event = await session.receive()
            self.taken.append(event["client_event_seq"])

    def snapshot(self) -> dict[str, Any]:
        return {"taken": self.taken, "answered": self.answered, "sent": self.sent}

    def restore(self, state: bytes | dict[str, Any]) -> None:
        assert isinstance(state, dict)
        self.taken = list(state["taken"])
        self.answered = state["answered"]
        self.sent = state["sent"]


def config(**overrides: Any) -> ServerConfig:
    settings: dict[str, Any] = {"max_pending_output": 4, "journal_max_bytes": 1 << 20}
    settings.update(overrides)
    return ServerConfig(**settings)


def texts(frames: list[Event]) -> list[str]:
    return [frame["text"] for frame in frames if frame.get("type") == TEXT]


def journal_texts(sim: Simulation, session_id: str) -> list[str]:
    session = sim.session(session_id)
    assert session is not None
    return [orjson.loads(entry.frame)["text"] for entry in session.journal]


def numbered(seq: int) -> Event:
    return {"type": "input.text.append", "text": str(seq), "client_event_seq": seq}


async def cut_after(rounds: int) -> None:
    for _ in range(rounds):
        await trio.lowlevel.cancel_shielded_checkpoint()


async def frozen(runner: SessionRunner) -> Frozen:
    result = await runner.freeze()
    assert result is not None
    return result


# -- an engine's send ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["send", "batch"])
@pytest.mark.parametrize("passes", [None, 0, 3])
@pytest.mark.parametrize("cut", [0, 1, 2, 3, 5, 8, 13, 21, 34, 55])
async def test_every_send_that_returned_is_journaled_and_no_other(
    autojump_clock: MockClock, cut: int, passes: int | None, mode: str
) -> None:
    """``passes``: None, the client reads everything; else the connection is held after
    that many writes, and the engine soon waits in ``send`` for it to drain. (A high
    water above the engine's ``Pace``: the pump takes a batch and is held, then the
    outbox fills up again, so the engine waits there with its last event sequenced.)"""
    async with running_server(config(max_pending_output=20), Tally, fail_after_s=60) as sim:
        client, created = await sim.open_session({"mode": mode})
        if passes is not None:
            client.transport.hold(after=passes)
        session_id = created["session_id"]
        runner = sim.runner(session_id)
        engine = runner.engine
        assert isinstance(engine, Tally)
        await cut_after(cut)
        state = (await frozen(runner)).engine_state
        session = runner.session
        assert isinstance(state, dict)
        assert state["sent"] == engine.sent == session.journal.head
        assert journal_texts(sim, session_id) == [f"out{n}" for n in range(1, engine.sent + 1)]
        # Frozen, the session lives on unchanged until its owner ends it.
        await settle()
        assert session.state is State.ATTACHED and sim.runner(session_id) is runner
        assert session.journal.head == engine.sent
        client.transport.release()
        runner.end(Reason.MIGRATED)
        received = await client.receive_until_closed()
        # Fenced off from the freeze on: what it did not get yet comes in the replay.
        got = texts(received)
        assert got == [f"out{n}" for n in range(1, len(got) + 1)]
        assert len(got) <= engine.sent
        assert client.close_code == 1001
        assert sim.session(session_id) is None  # its slot is free
        assert not any(frame["type"] == "session.closed" for frame in received)


class _Stubborn(Engine):
    """An engine without snapshot (the default: None)."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        del config

    async def run(self, session: EngineSession) -> None:
        await trio.sleep_forever()


async def test_a_freeze_can_be_refused_and_then_the_session_ends_as_before(
    autojump_clock: MockClock,
) -> None:
    async with running_server(config(), _Stubborn, fail_after_s=60) as sim:
        client, created = await sim.open_session()
        runner = sim.runner(created["session_id"])
        assert await runner.freeze() is None  # no snapshot: it cannot migrate
        runner.end(Reason.SHUTDOWN)
        await client.receive_until_closed()
        assert client.close_code == 1001


class Speaker(Engine):
    """Sends 100 ms of silence at a time: five 20 ms Opus packets each on the wire."""

    accepts = frozenset({"input_audio_buffer.append"})
    audio_rate = 24_000

    def __init__(self, config: Mapping[str, Any]) -> None:
        del config
        self.sent = 0

    async def run(self, session: EngineSession) -> None:
        while self.sent < 300:
            await session.send({"type": "response.output_audio.delta", "audio": bytes(4800)})
            self.sent += 1
        await trio.sleep_forever()

    def snapshot(self) -> dict[str, Any]:
        return {"sent": self.sent}


OPUS = {"audio": {"wire": "binary", "output": {"format": "opus"}}}


@pytest.mark.parametrize("passes", [None, 0, 2])
@pytest.mark.parametrize("cut", [0, 1, 2, 4, 8, 16, 32])
async def test_an_audio_delta_is_sequenced_whole_or_not_at_all(
    autojump_clock: MockClock, cut: int, passes: int | None
) -> None:
    # A high water above what the engine sends between two scheduler rounds (Pace): it
    # then waits for the connection part-way through a delta's packets.
    async with running_server(config(max_pending_output=100), Speaker, fail_after_s=60) as sim:
        client, created = await sim.open_session(OPUS)
        if passes is not None:
            client.transport.hold(after=passes)
        runner = sim.runner(created["session_id"])
        engine = runner.engine
        assert isinstance(engine, Speaker)
        await cut_after(cut)
        result = await frozen(runner)
        assert result.engine_state == {"sent": engine.sent}
        journal = runner.session.journal
        assert journal.head == 5 * engine.sent
        assert all(isinstance(entry.frame, bytes) for entry in journal)
        client.transport.release()
        runner.end(Reason.MIGRATED)
        received = await client.receive_until_closed()
        seqs = [frame["server_event_seq"] for frame in received]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) <= journal.head


class _Broken(Tally):
    def snapshot(self) -> dict[str, Any]:
        raise RuntimeError("snapshot broke")


class _Slow(Tally):
    """Once cancelled, it takes 10 s to return (shielded)."""

    async def run(self, session: EngineSession) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(10)


async def test_a_failed_snapshot_is_logged_without_the_state_and_refuses(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_server(config(), _Broken, fail_after_s=60) as sim:
        client, created = await sim.open_session()
        runner = sim.runner(created["session_id"])
        assert await runner.freeze() is None
        assert created["session_id"] in caplog.text and "snapshot" in caplog.text
        runner.end(Reason.SHUTDOWN)
        assert (await client.receive_until_closed())[-1]["reason"] == "server_shutdown"


async def test_an_engine_that_does_not_stop_in_time_cannot_migrate(
    autojump_clock: MockClock,
) -> None:
    async with running_server(config(engine_stop_timeout_s=2.0), _Slow, fail_after_s=60) as sim:
        client, created = await sim.open_session()
        runner = sim.runner(created["session_id"])
        start = trio.current_time()
        assert await runner.freeze() is None
        assert trio.current_time() - start == pytest.approx(2.0)
        runner.end(Reason.SHUTDOWN)  # as before: it is abandoned, the session ends
        assert (await client.receive_until_closed())[-1]["reason"] == "server_shutdown"
        await trio.sleep(10)  # (its task returns late, after the session ended)


# -- an engine's receive ---------------------------------------------------------------


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("cut", [0, 1, 2, 3, 4, 6, 9, 14, 20, 30, 45])
async def test_the_resume_point_is_what_the_engine_took(
    autojump_clock: MockClock, cut: int, held: bool
) -> None:
    async with running_server(config(), Tally, fail_after_s=60) as sim:
        client, created = await sim.open_session()
        if held:  # its answers soon wait for the connection: receive is cut there too
            client.transport.hold(after=2)
        session_id = created["session_id"]
        runner = sim.runner(session_id)
        engine = runner.engine
        assert isinstance(engine, Tally)
        for seq in range(1, 41):
            await client.send(numbered(seq))
        await cut_after(cut)
        session = runner.session
        received_before = session.client_seq
        result = await frozen(runner)
        # Every event received is taken by the engine or carried over, in order: the
        # resume point is what the client was told the session received.
        assert result.resume_client_seq == received_before == session.client_seq
        assert engine.taken == list(range(1, len(engine.taken) + 1))
        carried = [event["client_event_seq"] for event, _ in result.pending_input]
        assert engine.taken + carried == list(range(1, received_before + 1))
        assert result.engine_state == {
            "taken": engine.taken,
            "answered": engine.answered,
            "sent": engine.sent,
        }
        assert runner.session.journal.head == engine.sent
        # Still live, but fenced off from its client: nothing more is taken, nor
        # answered (an ack would say that what came before is safe here).
        client.transport.release()
        await client.send({"type": "session.heartbeat"})
        await client.send(numbered(41))
        await settle()
        assert runner.session.state is State.ATTACHED
        assert session.client_seq == received_before
        runner.end(Reason.MIGRATED)
        received = await client.receive_until_closed()
        assert not any(frame["type"] == "session.heartbeat_ack" for frame in received)
        got = texts(received)
        assert got == [f"re{n}" for n in engine.taken[: len(got)]]


async def test_a_cancelled_get_of_a_queued_event_takes_nothing() -> None:
    inbox = Inbox(8)
    inbox.put_nowait({"type": "input.text.append", "client_event_seq": 1})
    with trio.CancelScope() as scope:
        scope.cancel()
        await inbox.get()
    assert scope.cancelled_caught
    assert [event["client_event_seq"] for event, _ in inbox.pending()] == [1]
    assert (await inbox.get())["client_event_seq"] == 1


# -- a whole migration -----------------------------------------------------------------


async def migrate(a: Simulation, b: Simulation, session_id: str) -> int:
    """What the drain of node A and the resume on node B do (cluster/migration.py),
    through bytes. Returns how many received events the engine had not taken yet."""
    runner = a.runner(session_id)
    data = export(runner.session, await frozen(runner)).to_bytes()
    runner.end(Reason.MIGRATED)
    record = Record.from_bytes(data, max_bytes=1 << 22)
    session = restore(record, b.server.config.core_limits, trio.current_time(), NATIVE)
    engine = Tally(session.config)
    engine.restore(record.engine_state)
    b.server.sessions.adopt(session, engine).restore_input(record.pending_input)
    return len(record.pending_input)


async def read_until(client: SimClient, count: int, got: list[Event]) -> None:
    while len(texts(got)) < count:
        got.append(await client.receive())


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("read", [0, 4, 10])
@pytest.mark.parametrize("cut", [0, 1, 3, 7, 15])
async def test_a_session_moves_between_servers_exactly_once_in_order(
    autojump_clock: MockClock, read: int, cut: int, held: bool
) -> None:
    """``held``: the client stops reading after ``read`` answers, so the engine soon
    waits in ``send`` and what the client sends after queues in its inbox: received
    (the client is told so), not taken, and carried over to B's engine."""
    async with (
        running_server(config(), Tally, fail_after_s=120) as a,
        running_server(config(), Tally, fail_after_s=120) as b,
    ):
        client, created = await a.open_session()
        session_id, token = created["session_id"], created["resume_token"]
        await client.send({"type": "session.heartbeat"})  # it holds its token
        got: list[Event] = []
        if held:
            client.transport.hold(after=read + 1)  # (the heartbeat's ack, then answers)
        for seq in range(1, 16):
            await client.send(numbered(seq))
        if not held:
            await read_until(client, read, got)
        await cut_after(cut)
        carried = await migrate(a, b, session_id)
        if held:
            # What this parametrization is for (after 10 answers, 15 events leave too
            # few behind the engine's wait to queue).
            assert carried > 0 or read == 10
            client.transport.release()
        got += await client.receive_until_closed()  # what A had written before it went
        assert client.close_code == 1001
        last = max((f["server_event_seq"] for f in got if "server_event_seq" in f), default=0)

        client, resumed = await b.resume(session_id, token, last)
        assert resumed["type"] == "session.resumed", resumed
        point = resumed["last_received_client_event_seq"]
        assert point <= 15
        for seq in range(1, 21):  # it resends what it sent; below the point it is dropped
            await client.send(numbered(seq))
        await read_until(client, 20, got)
        assert texts(got) == [f"re{n}" for n in range(1, 21)]
        seqs = [f["server_event_seq"] for f in got if f.get("type") == TEXT]
        assert seqs == list(range(1, 21))
        await client.send({"type": "session.close"})
        assert (await client.receive_until_closed())[-1]["reason"] == "client_close"
