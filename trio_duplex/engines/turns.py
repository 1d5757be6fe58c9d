"""The turn loop the ``voice`` and ``speech`` engines share: turns queue, one response
is spoken at a time, and a cancel (barge-in) stops the one speaking.

Its rules:

- Turns are answered in the order they were queued, one response at a time: the next
  starts once the one before it has ended. A response's id, ``resp_N`` (N counting the
  responses started, from 1), is given when it starts, and starting one makes room for
  input (wakes whoever waits in ``wait_room``).
- A response already set as ``speaking`` (restored from a snapshot) is spoken first.
- A cancel naming no response, or the one speaking, stops it unless it has finished (only
  its end left to send): it is marked cancelled and its scope cancelled, at once. Any
  other cancel (nothing speaking, a stale or unknown id) is ignored.
- The reader reads no event while its engine is full; once input ends, the turns queued
  are still answered, then ``speak`` returns.

It sends nothing itself: what a response says, and how it ends, is the engine's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import attrs
import trio

from .api import EngineSession, Event


class Response(Protocol):
    """What the loop needs of an engine's response."""

    cancelled: bool  # a cancel was read: no more audio, response.cancelled ends it
    cancel_reason: str | None  # why, when not the client's response.cancel (a barge-in)

    @property
    def response_id(self) -> str: ...

    @property
    def finished(self) -> bool:
        """Only its end is left to send: a cancel no longer applies."""
        ...

    @property
    def scope(self) -> trio.CancelScope:
        """What a cancel cancels: the response's speaking runs within it."""
        ...


T = TypeVar("T")  # what a turn is (a text, a transcript)
R = TypeVar("R", bound=Response)


@attrs.define(eq=False)
class Turns(Generic[T, R]):
    """The turns waiting, the response speaking, and the loops that move them on."""

    start: Callable[[str, T], R]
    """Makes the response to a turn, given its id."""
    queued: deque[T] = attrs.Factory(deque)  # turns read and not started, in order
    speaking: R | None = None
    responses: int = 0  # responses started so far
    input_ended: bool = False
    _turn_queued: trio.lowlevel.ParkingLot = attrs.field(
        factory=trio.lowlevel.ParkingLot, init=False
    )  # where the speaker waits for a turn
    _room: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)

    def put(self, turn: T) -> None:
        self.queued.append(turn)
        self._turn_queued.unpark_all()

    def cancel(self, response_id: str | None, reason: str | None = None) -> None:
        """Stop the response speaking (``response_id``'s, or any: None). ``reason``: why,
        when it is not the client's ``response.cancel`` (``turn_detected``: a barge-in),
        said in its ``response.cancelled``."""
        # Synchronous: once this returns, the speaker sends no further audio.
        speaking = self.speaking
        if (
            speaking is not None
            and not speaking.finished
            and response_id in (None, speaking.response_id)
        ):
            speaking.cancelled = True
            speaking.cancel_reason = reason
            speaking.scope.cancel()

    def end_input(self) -> None:
        """No more turns will come: ``speak`` returns once the queued ones are answered."""
        self.input_ended = True
        self._turn_queued.unpark_all()

    def make_room(self) -> None:
        """Wake whoever waits in ``wait_room``, to look again."""
        self._room.unpark_all()

    async def wait_room(self, full: Callable[[], bool]) -> None:
        """Return once ``full()`` is false, looking again at each ``make_room``."""
        while full():
            await self._room.park()

    async def read(
        self,
        session: EngineSession,
        take: Callable[[Event], Awaitable[None]],
        full: Callable[[], bool],
    ) -> None:
        """Hand each client event to ``take`` until input ends, reading none while
        ``full()`` (so the server answers the client's next input with backpressure).
        ``take`` may send (a conversation event's answers): the next event waits for it."""
        while True:
            await self.wait_room(full)
            try:
                event = await session.receive()
            except trio.EndOfChannel:
                break
            await take(event)
        self.end_input()

    async def speak(self, respond: Callable[[R], Awaitable[None]]) -> None:
        """Answer each turn with ``respond``, in order, until input has ended and no turn
        is left."""
        while True:
            response = self.speaking  # (restored: the one the last node was speaking)
            if response is None:
                if not self.queued:
                    if self.input_ended:
                        return
                    await self._turn_queued.park()
                    continue
                self.responses += 1
                response = self.start(f"resp_{self.responses}", self.queued.popleft())
                self.speaking = response
                self.make_room()
            await respond(response)
            self.speaking = None


async def speak_unless_cancelled(response: Response, speak: Callable[[], Awaitable[None]]) -> None:
    """Run ``speak`` within the response's scope, unless a cancel was read already."""
    if not response.cancelled:
        with response.scope:
            await speak()


async def send_end(session: EngineSession, response: Response) -> None:
    """The response's one end: ``response.cancelled`` if a cancel was read (with its
    ``reason`` when it was not the client's ``response.cancel``), else done."""
    if not response.cancelled:
        await session.send({"type": "response.done", "response_id": response.response_id})
        return
    event: Event = {"type": "response.cancelled", "response_id": response.response_id}
    if response.cancel_reason is not None:
        event["reason"] = response.cancel_reason
    await session.send(event)


async def send_live(session: EngineSession, event: Event) -> None:
    """Send ``event`` unless the task's response was cancelled (then raise Cancelled)."""
    # A task woken by its deadline in the same batch as the cancel resumes normally and
    # would send one more frame: check for the cancel before every send.
    await trio.lowlevel.checkpoint_if_cancelled()
    await session.send(event)
