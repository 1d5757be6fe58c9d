"""Engines written with asyncio, for test_asyncio_engine.py and for
``trio-duplex serve --engine tests.engines.asyncio_engines:AsyncioEcho``.

``AsyncioEcho`` is the echo engine written the asyncio way: a reader that puts what it
takes on an ``asyncio.Queue`` and an answerer task (an ``asyncio.TaskGroup``) that takes
it from there, yields with ``asyncio.sleep(0)`` and sends the answer. ``Stages`` waits at
the await its first event names, and records where its cancellation found it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from trio_duplex.engines.aio import AsyncioEngine
from trio_duplex.engines.api import EngineSession, Event
from trio_duplex.engines.echo import EchoEngine

_FIELD = {"input.text.append": "text", "input_audio_buffer.append": "audio"}
_REPLY = {
    "input.text.append": "response.output_text.delta",
    "input_audio_buffer.append": "response.output_audio.delta",
}


class AsyncioEcho(AsyncioEngine):
    """``EchoEngine``'s native behaviour (and its ``check`` and 24 kHz audio), in asyncio."""

    accepts = frozenset({"input.text.append", "input_audio_buffer.append"})
    audio_rate: int | None = 24_000

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.unanswered: list[Event] = []  # taken, their answers not yet sequenced

    def check(self, event: Event) -> None:
        EchoEngine().check(event)  # (a text event's check reads only the event)

    async def run(self, session: EngineSession) -> None:
        queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=4)
        for event in self.unanswered:  # restored: answer what the last node could not
            queue.put_nowait(event)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._answer(session, queue))
            async for event in session:
                self.unanswered.append(event)
                await queue.put(event)

    async def _answer(self, session: EngineSession, queue: asyncio.Queue[Event]) -> None:
        while True:
            event = await queue.get()
            await asyncio.sleep(0)
            field = _FIELD[event["type"]]
            await session.send({"type": _REPLY[event["type"]], field: event[field]})
            self.unanswered.pop(0)

    def snapshot(self) -> dict[str, Any]:
        return {"state": "asyncio-echo/1", "unanswered": [e["text"] for e in self.unanswered]}

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") != "asyncio-echo/1":
            raise ValueError("not an asyncio echo snapshot")
        self.unanswered = [{"type": "input.text.append", "text": t} for t in state["unanswered"]]


class AsyncioBatchEcho(AsyncioEcho):
    """``AsyncioEcho`` by batches: ``receive_batch`` and one ``send_many`` per batch."""

    async def run(self, session: EngineSession) -> None:
        if self.unanswered:  # restored: answer what the last node could not
            await self._answer_all(session)
        while True:
            try:
                batch = await session.receive_batch()
            except trio.EndOfChannel:
                return
            self.unanswered.extend(batch)
            await self._answer_all(session)

    async def _answer_all(self, session: EngineSession) -> None:
        replies = []
        for event in self.unanswered:
            field = _FIELD[event["type"]]
            replies.append({"type": _REPLY[event["type"]], field: event[field]})
        await session.send_many(replies)
        self.unanswered.clear()


STAGES = ("receive", "send", "sleep", "thread", "executor", "to_thread")
"""Where ``Stages`` can be when its session ends: its first ``receive``; a ``send`` held
by backpressure; ``asyncio.sleep``; an asyncio Future of a thread pool's call; the
loop's default executor (``loop.run_in_executor(None, f)``, and ``asyncio.to_thread``,
which uses it)."""


@attrs.define(eq=False)
class Stages(AsyncioEngine):
    """Takes one event, whose text names what to do: wait at one of ``STAGES`` (or
    ``receive``: take another), raise (``raise-cancelled``, ``raise-value``), or
    ``ignore`` its cancellation until ``wake`` is set."""

    accepts = frozenset({"input.text.append"})
    config: Mapping[str, Any] = attrs.field(factory=dict)
    at: str = "start"
    cancelled_at: str | None = None
    swallowed: int = 0
    sent: int = 0
    release: threading.Event = attrs.field(factory=threading.Event)
    pool: concurrent.futures.ThreadPoolExecutor = attrs.field(
        factory=lambda: concurrent.futures.ThreadPoolExecutor(1)
    )
    wake: asyncio.Event = attrs.field(factory=asyncio.Event)

    async def run(self, session: EngineSession) -> None:
        try:
            self.at = "receive"
            text = (await session.receive())["text"]
            self.at = text
            if text == "receive":
                await session.receive()
            elif text == "send":
                while self.sent < 1000:  # (bounded: a cancel that is lost ends the test)
                    await session.send({"type": "response.output_text.delta", "text": "x" * 8000})
                    self.sent += 1
                    self.at = "after-send"  # a cancel due when a send returned lands here
                    await asyncio.sleep(0)
                    self.at = "send"
            elif text == "sleep":
                await asyncio.sleep(3600)
            elif text == "thread":
                await asyncio.wrap_future(self.pool.submit(self.release.wait))
            elif text == "executor":
                await asyncio.get_running_loop().run_in_executor(None, self.release.wait)
            elif text == "to_thread":
                await asyncio.to_thread(self.release.wait)
            elif text == "raise-cancelled":
                raise asyncio.CancelledError
            elif text == "raise-value":
                raise ValueError("a bug in the engine")
            elif text == "ignore":
                await self._ignore_cancellation()
        except asyncio.CancelledError:
            if self.at != "raise-cancelled":
                self.cancelled_at = self.at
            raise

    def snapshot(self) -> dict[str, Any]:
        return {"sent": self.sent}

    def restore(self, state: bytes | dict[str, Any]) -> None:
        raise ValueError("Stages does not go on elsewhere")

    async def _ignore_cancellation(self) -> None:
        while not self.wake.is_set():
            try:
                await self.wake.wait()
            except asyncio.CancelledError:
                self.swallowed += 1


@attrs.define(eq=False)
class Taker(AsyncioEngine):
    """Takes every event and records it, with no await of its own between two receives:
    where a cancel lands in its ``receive`` decides what it took."""

    accepts = frozenset({"input.text.append"})
    config: Mapping[str, Any] = attrs.field(factory=dict)
    taken: list[str] = attrs.field(factory=list)

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            self.taken.append(event["text"])


@attrs.define(eq=False)
class Busy(AsyncioEngine):
    """Sends 8000-character events until the connection holds it up (its ``send``
    waits), while a second task ticks once a second of the loop's clock; ``timeout``
    makes its first ``receive`` give up after that many seconds (``asyncio.wait_for``)."""

    accepts = frozenset({"input.text.append"})
    config: Mapping[str, Any] = attrs.field(factory=dict)
    timeout: float | None = None
    timed_out: bool = False
    ticks: int = 0
    sent: int = 0

    async def run(self, session: EngineSession) -> None:
        if self.timeout is not None:
            try:
                await asyncio.wait_for(session.receive(), self.timeout)
            except TimeoutError:
                self.timed_out = True
        text = (await session.receive())["text"]
        if text == "echo":  # answer each event from here on
            await session.send({"type": "response.output_text.delta", "text": text})
            async for event in session:
                await session.send({"type": "response.output_text.delta", "text": event["text"]})
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._tick())
            while self.sent < 1000:  # (bounded)
                await session.send({"type": "response.output_text.delta", "text": "x" * 8000})
                self.sent += 1

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1)
            self.ticks += 1
