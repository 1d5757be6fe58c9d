"""A harness to migrate engines: run one on a script of inputs, stop it at a cut point as
a migration would, snapshot it, restore it on a fresh engine and go on (test_migration.py).

``Client`` is one session as its client and journal see it, across nodes: the outputs
sequenced so far, the inputs sent and not yet taken by any engine (a new node gets them
again), and a script of inputs, each sent once the output count has reached its mark and
every task is idle (so that when it lands does not depend on the scheduler).

``Node`` is an EngineSession double with the runner's guarantees: ``send`` passes a
checkpoint before it records the event (a cancel there raises, and the event is not
sequenced) and returns right after; ``receive`` passes a checkpoint before it takes an
input. A ``Cut`` stops the engine's run, as a migration stop would, at a send (before or
just after the event is recorded), at a receive, or at a time. The state then goes
through JSON (or stays bytes), into a fresh engine that runs on with the same client.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio
import trio.testing

from trio_duplex.engines.api import Engine, EngineSession, Event, Inbox

FRAME = 0.02
END = 60.0  # every script is over long before this, in session time
HOLD = 0.004  # how long a send held by backpressure waits
Script = Sequence[tuple[int, Event]]
"""Inputs, each with its mark: sent once that many outputs are sequenced and every task
is idle; or, for a mark -n, while the send of output n is held by backpressure."""


def text(value: str) -> Event:
    return {"type": "input.text.append", "text": value}


def audio(pcm: bytes) -> Event:
    return {"type": "input_audio_buffer.append", "audio": pcm}


def cancel(response_id: str | None = None) -> Event:
    return {"type": "response.cancel"} | (
        {} if response_id is None else {"response_id": response_id}
    )


@attrs.frozen
class Cut:
    at: str  # "send", "receive" or "time"
    n: float  # the output's number (send), the call's number (receive), or seconds (time)
    after: bool = False  # a send cut: just after the output is recorded, not before

    def __str__(self) -> str:
        return f"{self.at}{'-after' if self.after else ''}@{self.n}"


@attrs.define(eq=False)
class Client:
    script: deque[tuple[int, Event]]
    during: dict[int, Event]  # output number: input sent while that output's send waits
    outputs: list[Event] = attrs.Factory(list)
    times: list[float] = attrs.Factory(list)
    pending: deque[Event] = attrs.Factory(deque)
    receives: int = 0  # receive calls, on every node
    progress: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    arrived: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    def record(self, event: Event) -> None:
        self.outputs.append(dict(event))
        self.times.append(trio.current_time())
        self.progress.unpark_all()

    async def feed(self) -> None:
        while self.script:
            mark, event = self.script.popleft()
            while len(self.outputs) < mark:
                await self.progress.park()
            await trio.testing.wait_all_tasks_blocked()
            self.pending.append(event)
            self.arrived.unpark_all()


async def _never(event: Event) -> None:
    raise AssertionError("Node.send records events itself")


@attrs.define(eq=False)
class Node(EngineSession):
    client: Client = attrs.field(kw_only=True)
    stop: trio.CancelScope = attrs.field(kw_only=True)
    cut: Cut | None = attrs.field(kw_only=True)

    def _cut_here(self, at: str, n: int, after: bool = False) -> None:
        # A send cut lands at its send, or at the first one past it: a batch sent whole
        # on an earlier node (a stop lets a batch finish) may have carried the output the
        # cut names, and the migration then comes at the first point still ahead.
        cut = self.cut
        if cut is None or cut.at != at or cut.after != after:
            return
        if n == cut.n or (at == "send" and n > cut.n):
            self.stop.cancel()

    async def send(self, event: Event) -> None:
        client = self.client
        n = len(client.outputs) + 1
        if n in client.during:  # backpressure, during which the client sends an input
            client.pending.append(client.during.pop(n))
            client.arrived.unpark_all()
            await trio.sleep(HOLD)
        self._cut_here("send", n)
        await trio.lowlevel.checkpoint()
        self.client.record(event)
        self._cut_here("send", n, after=True)

    async def send_many(self, events: Sequence[Event]) -> None:
        # As the runner's: a cut at any of the batch's sends lands before the first (a
        # migration stop lets a batch finish), a cut just after one lets the rest follow;
        # backpressure holds it between two of them without letting the stop in.
        client = self.client
        first = len(client.outputs) + 1
        for n in range(first, first + len(events)):
            self._cut_here("send", n)
        await trio.lowlevel.checkpoint()
        for n, event in enumerate(events, first):
            if n in client.during and n > first:
                client.pending.append(client.during.pop(n))
                client.arrived.unpark_all()
                with trio.CancelScope(shield=True):
                    await trio.sleep(HOLD)
            client.record(event)
            self._cut_here("send", n, after=True)

    async def receive_batch(
        self, limit: int = 16, *, updates: bool = False, answer: bool = True
    ) -> list[Event]:
        client = self.client
        client.receives += 1
        self._cut_here("receive", client.receives)
        if client.pending:
            await trio.lowlevel.checkpoint()
        while not client.pending:
            await client.arrived.park()
        batch = [client.pending.popleft()]
        while client.pending and len(batch) < limit:
            batch.append(client.pending.popleft())
        return batch

    async def receive(self, *, updates: bool = False, answer: bool = True) -> Event:
        client = self.client
        client.receives += 1
        self._cut_here("receive", client.receives)
        if client.pending:
            await trio.lowlevel.checkpoint()
        while not client.pending:
            await client.arrived.park()
        return client.pending.popleft()


@attrs.define
class Trace:
    outputs: list[Event]
    times: list[float]  # of each output, from the start
    states: list[Any]  # each node's snapshot, as the next one got it
    engine: Engine  # the last node's


async def drive(
    make: Callable[[], Engine],
    script: Script,
    cuts: Sequence[Cut] = (),
    *,
    pause: float = 0.0,
    queued: Sequence[Event] = (),
) -> Trace:
    """Run ``script`` on a node, migrating at each cut (after ``pause`` seconds) to the next.
    ``queued``: inputs already waiting when it starts (a batch)."""
    client = Client(
        deque((mark, event) for mark, event in script if mark >= 0),
        {-mark: event for mark, event in script if mark < 0},
    )
    client.pending.extend(dict(event) for event in queued)
    engine = make()
    states: list[Any] = []
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.feed)
        for cut in [*cuts, None]:
            with trio.CancelScope() as stop:
                stop.deadline = t0 + (cut.n if cut is not None and cut.at == "time" else END)
                node = Node("sess_mig", {}, Inbox(1), _never, client=client, stop=stop, cut=cut)
                await engine.run(node)
            assert stop.cancelled_caught, f"{cut}: run returned by itself"
            if cut is None:
                break
            assert trio.current_time() < t0 + END, f"{cut} never came"
            state = engine.snapshot()
            assert state is not None
            # As the store keeps it: the bytes, or the dict as JSON.
            state = bytes(state) if isinstance(state, bytes) else json.loads(json.dumps(state))
            states.append(state)
            await trio.sleep(pause)
            engine = make()
            engine.restore(state)
        nursery.cancel_scope.cancel()
    return Trace(client.outputs, [t - t0 for t in client.times], states, engine)


def sweep(script: Script, outputs: int, frames: int) -> list[Cut]:
    """Every cut point of a run of ``outputs`` outputs and ``frames`` 20 ms frames: before
    and after each send, at each receive, and half way through each frame's sleep.

    But not just after an output that a scripted cancel waits for: the restored speaker
    sends its next frame at once, where the run never cut waits 20 ms, during which the
    cancel comes. Which frame a barge-in stops at is timing, not exactly-once.
    """
    racy = {mark for mark, event in script if event["type"] == "response.cancel"}
    cuts = [Cut("send", k, after) for k in range(1, outputs + 1) for after in (False, True)]
    cuts += [Cut("receive", k) for k in range(1, len(script) + 2)]
    cuts += [Cut("time", round((k + 0.5) * FRAME, 3)) for k in range(frames + 1)]
    return [cut for cut in cuts if not (cut.after and cut.n in racy)]
