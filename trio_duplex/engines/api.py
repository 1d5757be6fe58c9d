"""The engine API: what produces a session's output.

An engine is an object with a set of accepted client event types, an optional
synchronous ``check`` that validates one event's fields, and ``async run(session)``.
``run`` is started once the session's ``session.created`` has been delivered, lives in a
nursery owned by the session (so it survives reconnects), and is cancelled when the
session ends. Returning ends the session with ``engine_finished``; raising ends it with
``engine_error`` (``upstream_lost`` for ``UpstreamLost``). Once cancelled it must return
within the server's ``engine_stop_timeout_s``; one that does not (it ignores
cancellation) is abandoned: its session ends without it. In cluster mode, an engine
that implements ``snapshot`` and ``restore`` lets its sessions migrate to another node
when this one drains (see ``Engine.snapshot`` for the contract); ``can_migrate`` tells
which ones do.

A complete engine::

    class Shout(Engine):
        accepts = frozenset({"input.text.append"})

        def check(self, event):
            if not isinstance(event.get("text"), str):
                raise BadEvent("text must be a string", param="text")

        async def run(self, session):
            async for event in session:
                await session.send({"type": "response.output_text.delta",
                                    "text": event["text"].upper()})
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import trio

from .._pace import EVERY, Pace
from ..audio import ENGINE_RATES, AudioConfig
from ..core import events, flow
from ..core.events import CONTROL_EVENTS, DTMF_DIGITS, ErrorCode, EventType
from ..core.events import INPUT_DTMF as INPUT_DTMF  # (an engine's API: re-exported)
from ..core.journal import Journal
from ..core.wire import ProtocolError

Event = dict[str, Any]


class BadEvent(ProtocolError):
    """Raised by ``Engine.check`` for an event whose fields are malformed."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(ErrorCode.BAD_EVENT, message, param=param)


# ``INPUT_DTMF`` (core.events): a key a phone's caller pressed, ``{"type": "input.dtmf",
# "digit": "5"}``, one of ``DTMF_DIGITS``. An engine that takes it names it in
# ``accepts``; ``echo``, ``voice`` and ``speech`` take it as a typed turn whose text is
# the digit.


def check_dtmf(event: Event) -> str:
    """``input.dtmf``'s digit; BadEvent if it is not one of ``DTMF_DIGITS``."""
    digit = event.get("digit")
    if not isinstance(digit, str) or len(digit) != 1 or digit not in DTMF_DIGITS:
        raise BadEvent("digit must be one of 0-9, *, #, A-D", param="digit")
    return digit


class ConfigLocked(ProtocolError):
    """Raised by ``Engine.check_locked``: ``config_locked``, naming the field (``param``);
    the event is refused, the connection and the session go on."""

    def __init__(self, param: str) -> None:
        message = f"the client token that opened this session locked its configuration: {param}"
        super().__init__(ErrorCode.CONFIG_LOCKED, f"{message} cannot be set", param=param)


class UpstreamLost(Exception):
    """Raised by an engine's ``run`` when the service it fronts is gone for good (the
    ``realtime-proxy`` engine's upstream WebSocket closed or failed): its session ends
    with reason ``upstream_lost``, not ``engine_error``; the message is logged at WARNING,
    without a traceback. Raise it from ``run`` itself, outside any nursery of its own,
    after ``await session.wait_attached()`` so that a detached client hears it."""


class Engine:
    """Base class for engines. Subclasses set ``accepts`` and implement ``run``; to let
    their sessions migrate between nodes (cluster mode), ``snapshot`` and ``restore``."""

    accepts: ClassVar[Collection[str]] = frozenset()
    audio_rate: int | None = None
    """The sample rate of the engine's audio (8000, 16000, 24000 or 48000): it then
    exchanges audio as ``bytes`` of mono PCM16 little-endian at that rate, never base64.
    ``input_audio_buffer.append`` events it receives carry ``audio`` as such bytes, and
    the ``response.output_audio.delta`` events it sends must too: the server converts
    between them and the session's negotiated wire format, rate and lane (protocol v2,
    ``session.audio``). None (the default): the engine knows no audio format; audio
    fields pass through as they are (v1's base64 strings) and a session may not ask for
    ``session.audio``. A class attribute, or set per instance by the factory."""
    raw_dialects: ClassVar[Collection[str]] = frozenset()
    """Dialects (their ``name``) whose own wire shapes the engine's events already have:
    on a session in one of them the server frames its events as they are, without the
    dialect's ``Shaper`` (``EngineSession.raw``). ``realtime-proxy``: ``{"openai"}``, since
    its upstream speaks OpenAI's wire. Empty (the default): every event is canonical."""
    turn_detection: ClassVar[Mapping[str, Any] | None] = None
    """The turn detection the engine does of itself, in OpenAI's shape (``{"type":
    "server_vad", ...}``), or None: it detects no turns (the client commits them). A
    session that speaks first (``/v1/realtime``) and sets none shows this as its
    ``turn_detection``, so that a client knows whether the server will end its turns."""
    audio_formats: ClassVar[Mapping[str, int]] = {}
    """For an engine without ``audio_rate``: event types (client or server) whose base64
    ``audio`` field holds audio of a known format, with its bytes per millisecond (24 kHz
    mono PCM16: 48): their durations are counted in the session's ``usage``
    (``audio_ms_in``, ``audio_ms_out``)."""

    def check(self, event: Event) -> None:
        """Validate one accepted event's fields; raise BadEvent to refuse it.

        Runs in the connection's reader, before the event is queued, so a refused event
        never reaches ``run`` and never counts as received.
        """

    def check_locked(self, event: Event) -> None:
        """On a session whose configuration a client token locked: called after ``check``
        for each accepted event. Raise ``ConfigLocked`` for one that would change the
        configuration all the same (``realtime-proxy``: a ``response.create`` override, a
        ``system`` item). The default refuses nothing: its events carry no configuration.
        """

    async def prepare(self, nursery: trio.Nursery) -> None:
        """Optional: get ready before the client hears ``session.created``.

        Called once per session, after admission (the session's slot is held) and before
        ``session.created`` is sent, then ``run``. Override it when opening a session
        needs a resource that may refuse, e.g. an upstream connection: raise a
        ``ProtocolError`` (``ProtocolError.not_ready``: retryable ``resource_exhausted``)
        and the open is refused with it, the slot freed, and no session ever existed for
        the client. Anything else it raises refuses the open as ``engine_error``.
        ``nursery`` lives until ``run`` has returned (or the open was refused): start
        there what must outlive this call (a connection's background tasks); it is
        cancelled when the session's engine is gone. The server bounds the call
        (``PREPARE_TIMEOUT_S``; then retryable ``resource_exhausted``). A session taken
        over from another node (a migration) calls it too, after ``restore``.
        """

    async def run(self, session: EngineSession) -> None:
        raise NotImplementedError

    def snapshot(self) -> bytes | dict[str, Any] | None:
        """The engine's state, for a migration to another node; None: it cannot migrate.

        An engine that can migrate overrides this and ``restore`` (``can_migrate`` says
        which engines do); an override returns its state every time it is called, never
        None. The state is ``bytes``, or a dict that ``json.dumps`` can write: str keys;
        str, int, float, bool, None, list and dict values (bytes, e.g. audio, as base64).

        Called only after ``run(session)`` was cancelled by a migration stop and has
        returned (raised ``trio.Cancelled``), so the cancel may have landed at any await
        in the engine. The runner guarantees that a ``session.send`` that returned was
        sequenced (the client will get that event) and one that raised was not; and that
        an event ``session.receive`` returned was taken, while one whose ``receive``
        raised was not (the client sends it again, to the new node). So the state must
        describe the work the engine took and has not finished, and exactly where its
        output stands: ``restore(state)`` then ``run(session)`` on another node must go
        on as if nothing happened, with no output lost and none repeated. The simplest
        way there: update the state right after each ``send`` returns and each
        ``receive`` returns, with no await in between.
        """
        return None

    def restore(self, state: bytes | dict[str, Any]) -> None:
        """Take over a ``snapshot()`` made on another node, before ``run``.

        Called on a fresh engine, made by the factory with the session's configuration
        as it stood at the migration, with the state as the store gave it back: a dict
        after a round trip through JSON (lists for tuples, base64 strings stay strings)
        or the bytes. Raise ValueError for a state of a shape it does not know (another
        engine's, an older version's): the session then cannot resume.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot restore a snapshot")


def prepares(engine: Engine) -> bool:
    """Does this engine get ready before its session opens (overrides ``prepare``)?"""
    return getattr(type(engine), "prepare", Engine.prepare) is not Engine.prepare


def writes_raw(engine: Engine, dialect: str) -> bool:
    """Does ``engine`` write a session's events in ``dialect``'s own wire shapes (its
    ``raw_dialects``)? Then the server frames them as they are, unshaped."""
    raw = getattr(engine, "raw_dialects", ())
    return isinstance(raw, Collection) and dialect in raw


def can_migrate(engine: Engine) -> bool:
    """Can this engine's sessions migrate: does its class override ``Engine.snapshot``?

    The others drain as they do without migration: their sessions stay where they are.
    """
    return getattr(type(engine), "snapshot", Engine.snapshot) is not Engine.snapshot


EngineFactory = Callable[[Mapping[str, Any]], Engine]

BUILTIN = {
    "echo": "trio_duplex.engines.echo:EchoEngine",
    "voice": "trio_duplex.engines.voice:VoiceEngine",
    "speech": "trio_duplex.engines.speech:SpeechEngine",
}
"""Built-in engines, by the name that ``--engine`` takes."""
"""Called with the session's initial configuration; returns that session's engine."""
PROXY = "realtime-proxy"
"""The built-in engine that needs the server's configuration (``--upstream``): built by
``engines.realtime_proxy.proxy_factory``, not loaded from ``BUILTIN``."""


_UPDATE = frozenset({EventType.UPDATE})  # a set: a member lookup per event costs ~100 ns
_reschedule = trio.lowlevel.reschedule
_checkpoint = trio.lowlevel.checkpoint
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_current_task = trio.lowlevel.current_task
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORTED = trio.lowlevel.Abort.SUCCEEDED


class Inbox:
    """Client events queued for an engine: bounded, with one receiver.

    What ``trio.open_memory_channel`` gives, for one consumer, at half the memory; and
    the runner can see how many events are waiting (see ``SessionRunner.emit``).

    Bounded twice: it takes an event while it holds fewer than ``bound`` events and fewer
    than ``max_bytes`` by the ``size`` each was put with (its message's length, as the
    server received it), so the bytes may go past ``max_bytes`` by one event. Only events
    of ``flow.counted_from`` bytes or more (4096 with the defaults) are counted: the
    smaller ones, at most ``bound`` of them, are bounded by their number, and cost
    nothing per event here.

    Consumption (protocol v2, ``core/flow.py``): it counts the events taken, and their
    counted bytes, and once either reaches its report step calls ``on_report(event,
    drained)`` with the event just taken and whether nothing waits after it; a true
    answer (reported) restarts the counts. Events refused for good count as taken too
    (``refused``).
    """

    __slots__ = (
        "_behind",
        "_big",
        "_bound",
        "_bytes",
        "_closed",
        "_counted",
        "_events",
        "_max_bytes",
        "_on_report",
        "_receiver",
        "_report_bytes",
        "_report_events",
        "_taken",
        "_taken_bytes",
    )

    def __init__(
        self,
        bound: int,
        max_bytes: float = math.inf,
        on_report: Callable[[Event | None, bool], bool] | None = None,
    ) -> None:
        # A deque from the first event on (an empty one is 760 bytes; an idle session's
        # engine waits on an inbox that has held nothing).
        self._events: deque[Event] | tuple[()] = ()
        self._big: dict[int, int] = {}  # id() of each counted event queued: its size
        self._bound = bound
        self._max_bytes = max_bytes
        self._counted = flow.counted_from(bound, max_bytes)
        self._bytes = 0
        self._closed = False
        self._receiver: trio.lowlevel.Task | None = None
        """The receiver, while it waits in ``get`` (woken directly: no parking lot)."""
        self._on_report = on_report
        steps = flow.report_steps(bound, max_bytes) if on_report else (math.inf, math.inf)
        self._report_events: float = steps[0]
        self._report_bytes: float = steps[1]
        self._taken = 0
        self._taken_bytes = 0
        self._behind = (0, 0)
        """Events refused for good while others waited: (count, bytes), counted as taken
        once those are (they are behind them in seq order)."""

    def __len__(self) -> int:
        return len(self._events)

    def peek(self) -> Event | None:
        """The next event, left queued (None: nothing is queued)."""
        events = self._events
        return events[0] if events else None

    @property
    def queued_bytes(self) -> int:
        """The counted events' bytes."""
        return self._bytes

    def has_room(self, size: int) -> bool:
        """Would ``put_nowait`` of an event of ``size`` bytes be taken now?"""
        del size  # (protocol v2: taken while under both bounds, whatever its size)
        return len(self._events) < self._bound and self._bytes < self._max_bytes

    def put_nowait(self, event: Event, size: int = 0) -> None:
        """Queue ``event`` of ``size`` bytes; raises trio.WouldBlock when full,
        ClosedResourceError when closed."""
        if self._closed:
            raise trio.ClosedResourceError("the session has ended")
        events = self._events
        if len(events) >= self._bound or self._bytes >= self._max_bytes:
            raise trio.WouldBlock
        if size >= self._counted:
            self._big[id(event)] = size  # (a queued event's id is not reused)
            self._bytes += size
        if isinstance(events, tuple):  # (the first event)
            events = self._events = deque()
        events.append(event)
        receiver = self._receiver
        if receiver is not None:
            self._receiver = None
            _reschedule(receiver)

    def refused(self, size: int) -> None:
        """An event was refused for good: it counts as consumed (after those queued)."""
        counted = size if size >= self._counted else 0
        if self._events:
            events, counted_bytes = self._behind
            self._behind = (events + 1, counted_bytes + counted)
            return
        self._taken += 1
        self._taken_bytes += counted
        self._check(None)

    def _check(self, event: Event | None) -> None:
        if self._taken >= self._report_events or self._taken_bytes >= self._report_bytes:
            assert self._on_report is not None  # (else the steps are infinite)
            if self._on_report(event, not self._events):
                self._taken = self._taken_bytes = 0

    def close(self) -> None:
        """No more events in; those still queued can be taken."""
        self._closed = True
        receiver = self._receiver
        if receiver is not None:
            self._receiver = None
            _reschedule(receiver)

    def clear(self) -> None:
        """Drop what is queued (its receiver is gone)."""
        self._events = ()
        self._big.clear()
        self._bytes = 0

    def get_nowait(self) -> Event:
        """The next event; trio.WouldBlock if none, trio.EndOfChannel once closed."""
        if self._events:
            event = self._events.popleft()
            self._taken += 1
            if self._big:  # (bytes are counted for these only: checked here only)
                size = self._big.pop(id(event), 0)
                self._bytes -= size
                self._taken_bytes += size
                if self._taken_bytes >= self._report_bytes:
                    self._check(event)
                    return event
            if self._taken >= self._report_events:
                self._check(event)
            return event
        if self._behind[0]:  # drained: what was refused behind it is consumed now
            (events, counted), self._behind = self._behind, (0, 0)
            self._taken += events
            self._taken_bytes += counted
            self._check(None)
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def get_batch(self, batch: list[Event], limit: int) -> None:
        """Take more queued events into ``batch`` (which holds one taken already), until
        it holds ``limit``, the queue is empty, or the next is a ``session.update``: as
        ``get_nowait`` takes each, with one report step for them all (after the last)."""
        events = self._events
        big = self._big
        taken = taken_bytes = 0
        while events and len(batch) < limit:
            event = events[0]
            if event["type"] in _UPDATE:
                break
            events.popleft()
            batch.append(event)
            taken += 1
            if big:
                size = big.pop(id(event), 0)
                self._bytes -= size
                taken_bytes += size
        if taken:
            self._taken += taken
            self._taken_bytes += taken_bytes
            if self._taken >= self._report_events or self._taken_bytes >= self._report_bytes:
                self._check(batch[-1])

    async def get(self) -> Event:
        # One checkpoint, always before the take: cancelled there (or while parked),
        # nothing was taken, so a frozen session knows what its engine has
        # (SessionRunner.freeze). Woken from park, that was the checkpoint.
        if self._events:
            await trio.lowlevel.checkpoint()
        while True:
            if self._events or self._closed or self._behind[0]:
                try:
                    return self.get_nowait()
                except trio.WouldBlock:  # (what was refused behind is counted now)
                    pass
            # Nothing to take: wait for a put (with no WouldBlock raised per wait).
            if self._receiver is not None:
                raise trio.BusyResourceError("another task waits for this input")
            self._receiver = _current_task()
            await _wait_task_rescheduled(self._abort)

    def _abort(self, raise_cancel: object) -> trio.lowlevel.Abort:
        self._receiver = None  # cancelled while waiting: nobody to wake
        return _ABORTED

    def pending(self) -> list[tuple[Event, int]]:
        """The events still queued, oldest first, each with the size it was put with
        (0 for the small ones, which are not counted): for a migration."""
        big = self._big
        return [(event, big.get(id(event), 0)) for event in self._events]

    def put_restored(self, event: Event, size: int) -> None:
        """Queue an event another node had queued (a migration): taken whatever the
        bounds, which that node's enforced (they may differ by a node's settings)."""
        if size >= self._counted:
            self._big[id(event)] = size
            self._bytes += size
        if isinstance(self._events, tuple):
            self._events = deque()
        self._events.append(event)


@attrs.define(eq=False)
class EngineSession:
    """An engine's handle on its session: read client events, send server events.

    ``send`` gives the event its ``server_event_seq``, journals it and hands it to the
    attached connection; it waits while that connection is too far behind (backpressure).
    """

    session_id: str
    config: dict[str, Any]
    _inbox: Inbox
    _emit: Callable[[Event], Awaitable[None]]
    _pace: Pace = attrs.field(factory=Pace)
    audio: AudioConfig | None = attrs.field(default=None, kw_only=True)
    """The session's negotiated audio (wire lane, client formats), for an engine with an
    ``audio_rate``; the engine itself always sees PCM16 at its own rate."""
    principal: str | None = attrs.field(default=None, kw_only=True)
    """Who opened the session: the name of its API key (``--api-key-file``), or None
    without authentication. Per-customer quotas and logging read it."""
    dialect: str = attrs.field(default="native", kw_only=True)
    """The name of the dialect the session's client speaks (``native``, ``openai``), for
    life. Engines see the same canonical events whichever it is; one that relays a wire
    of its own (``realtime-proxy``) reads it to decide how to relay."""
    raw: bool = attrs.field(default=False, kw_only=True)
    """The session's dialect is one of the engine's ``raw_dialects``: the events it sends
    are framed as they are, unshaped. It may then also send that wire's ``error`` events
    (journaled as its other events are: an upstream's error reaches a client that was
    away), and ``receive(updates=True, answer=False)`` leaves ``session.updated`` to it."""
    _attached: Callable[[], Awaitable[None]] | None = attrs.field(default=None, kw_only=True)
    _journal: Journal | None = attrs.field(default=None, kw_only=True)
    """The session's journal, which ``sent_seq`` and ``delivered_seq`` read."""
    _emit_many: Callable[[list[Event]], Awaitable[None]] | None = attrs.field(
        default=None, kw_only=True
    )
    """What sends a batch (``send_many``); None: each event through ``_emit``, in turn."""

    def sent_seq(self) -> int:
        """The ``server_event_seq`` of the newest event sequenced in the session (0:
        none): right after a ``send`` returns, that event's (its last frame's)."""
        return 0 if self._journal is None else self._journal.head

    def delivered_seq(self) -> int:
        """The highest ``server_event_seq`` the client has confirmed it received (its
        ``session.event_ack``, or a resume's ``last_received_server_event_seq``): every
        event up to it reached the client. What was sent but not yet confirmed may still
        be in the network, in a buffer, or lost with a connection (then replayed)."""
        return 0 if self._journal is None else self._journal.acked_through

    async def wait_attached(self) -> None:
        """Return once a client is attached to the session (at once if one is). An engine
        about to end its session for a reason the client must hear (``UpstreamLost``)
        waits here while the client is away: the session stays resumable, and the client
        gets its replay and then the terminal event, rather than an ended session."""
        if self._attached is None:  # (a handle made outside a server: always attached)
            await trio.lowlevel.checkpoint()
            return
        await self._attached()

    async def send(self, event: Event) -> None:
        kind = event.get("type")
        if not isinstance(kind, str) or (
            kind in CONTROL_EVENTS and not (self.raw and kind == EventType.ERROR)
        ):
            raise ValueError(f"an engine cannot send an event of type {kind!r}")
        await self._emit(event)

    async def send_many(self, events: Sequence[Event]) -> None:
        """Send ``events``, in order, as ``send`` sends each one, with one cancellation
        point before the first (the batch's): every event is checked first (ValueError:
        none is sent), and cancelled there, none was sequenced. After it the events are
        sequenced in turn, waiting only while the attached connection is congested.

        Returned, every event was sequenced. For a migration it is all or nothing: the
        stop lands before the first, or lets the batch finish. Any other cancellation
        (the session ending, an engine's own deadline) may land where a congested
        connection is waited for, or between two ``EVERY``-event chunks of a longer
        batch, with the events before it sequenced: ``sent_seq`` says how far."""
        batch = list(events)
        for event in batch:
            check_sendable(event, self.raw)
        if not batch:
            await trio.lowlevel.checkpoint()
        elif self._emit_many is not None:
            await self._emit_many(batch)
        else:  # (a handle made outside a server)
            for event in batch:
                await self._emit(event)

    async def receive(self, *, updates: bool = False, answer: bool = True) -> Event:
        """The next client event. ``session.update`` is applied here (the configuration
        updated) and answered (``session.updated`` sent, unless ``answer`` is false), and
        returned too only with ``updates``: an engine that forwards its configuration
        elsewhere (``realtime-proxy``) needs it, and one whose upstream answers it
        (``realtime-proxy`` on a raw session) passes ``answer=False``."""
        while True:
            inbox = self._inbox
            if inbox:  # queued: taken in a burst, at a Pace (cancelled, it takes none)
                if self._pace.due():
                    await _checkpoint()
                else:
                    await _checkpoint_if_cancelled()
                event = inbox.get_nowait()
            else:  # parking is the checkpoint
                self._pace.reset()
                event = await inbox.get()
            if event["type"] not in _UPDATE:
                return event
            update = event["session"]
            self.config.update(update)
            if answer or not updates:
                # The fields it set, not the whole configuration: an update's cost is its own.
                await self.send(events.updated(self.session_id, update))
            if updates:
                return event

    async def receive_batch(
        self, limit: int = EVERY, *, updates: bool = False, answer: bool = True
    ) -> list[Event]:
        """The client events queued now, oldest first, up to ``limit``: at least one (it
        waits for the first). One cancellation point for the batch, before it takes
        anything: cancelled (it raised), it took no event; returned, it took exactly the
        events it returns, and the next call starts with the one after them. A
        scheduler round comes first when the session's ``Pace`` is due one, so that a
        batch does not starve other sessions.

        ``session.update`` is applied and answered as ``receive`` does; a batch ends
        before one (it starts the next batch). With ``updates`` it is returned too, as a
        batch of its own. ``trio.EndOfChannel`` once the session's input has ended."""
        if limit < 1:
            raise ValueError(f"a batch holds at least one event, not {limit}")
        inbox = self._inbox
        pace = self._pace
        while True:
            if inbox:  # queued: one cancellation point (cancelled, it takes none)
                await pace.step_many(min(len(inbox), limit))
                event = inbox.get_nowait()
                waited = False
            else:  # parking is the checkpoint
                pace.reset()
                event = await inbox.get()
                waited = True
            if event["type"] in _UPDATE:
                update = event["session"]
                self.config.update(update)
                if answer or not updates:
                    await self.send(events.updated(self.session_id, update))
                if updates:
                    return [event]
                continue
            batch = [event]
            if inbox:
                inbox.get_batch(batch, limit)
            if waited:
                pace.count(len(batch))
            return batch

    def __aiter__(self) -> EngineSession:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


def check_sendable(event: Event, raw: bool) -> None:
    """ValueError unless an engine may send ``event`` (``send`` tests the same inline)."""
    kind = event.get("type")
    if not isinstance(kind, str) or (
        kind in CONTROL_EVENTS and not (raw and kind == EventType.ERROR)
    ):
        raise ValueError(f"an engine cannot send an event of type {kind!r}")


def run_engine(engine: Engine, session: EngineSession) -> Awaitable[None]:
    """What runs ``engine`` for ``session``, to be awaited: a trio engine's ``run``; an
    asyncio engine's (``engines/aio.py``) through its ``run_in_trio``, on an asyncio
    loop of its own. (Not a coroutine of its own: an idle session's stack would hold its
    frame for as long as the engine runs.)"""
    bridged = getattr(engine, "run_in_trio", None)
    run: Callable[[EngineSession], Awaitable[None]] = engine.run if bridged is None else bridged
    return run(session)


def engine_audio_rate(engine: Engine) -> int | None:
    """The engine's ``audio_rate`` (None: it knows no audio format)."""
    rate = getattr(engine, "audio_rate", None)
    return rate if isinstance(rate, int) else None


def load_engine_factory(spec: str) -> EngineFactory:
    """Resolve ``echo``, ``voice`` or ``package.module:factory`` to a factory, and check it.

    Raises ValueError, with a message fit for a terminal, however loading fails: the
    module cannot be imported (ImportError, SyntaxError, anything its import raises),
    the attribute is missing or not callable, or the factory does not build an engine.
    The factory is called once with ``{}``, the configuration of a session opened with
    none; it may refuse that with ``BadEvent`` (clients then get ``bad_event``), and
    what it returns is then not checked. Anything else it raises is refused here, since
    every client opening with no configuration would get ``engine_error``.
    """
    if spec in BUILTIN:
        spec = BUILTIN[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"engine {spec!r} is not a built-in name nor 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken module can raise anything at import
        raise ValueError(f"cannot load engine {spec!r}: {_describe(exc)}") from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"cannot load engine {spec!r}: {module_name} has no {attr!r}") from None
    if not callable(factory):
        raise ValueError(f"engine {spec!r} is not callable")
    try:
        engine = factory({})
    except ProtocolError:
        return factory  # type: ignore[no-any-return]  # refused {} as the protocol allows
    except Exception as exc:
        raise ValueError(
            f"engine {spec!r}: its factory failed for a session with no configuration ({{}}): "
            f"{_describe(exc)}"
        ) from exc
    problem = engine_problem(engine)
    if problem is not None:
        raise ValueError(f"engine {spec!r}: its factory returned {_short_repr(engine)}, {problem}")
    return factory  # type: ignore[no-any-return]


def engine_problem(engine: object) -> str | None:
    """Why ``engine`` is not an engine (None: it is one): an ``accepts`` collection of
    event types, a callable ``check``, an ``async def run``, and ``restore`` if it has
    ``snapshot``."""
    if inspect.iscoroutine(engine):
        engine.close()  # an async factory: its coroutine will never be awaited
        return "a coroutine (the factory must be a plain function or a class)"
    accepts = getattr(engine, "accepts", None)
    if (
        not isinstance(accepts, Collection)
        or isinstance(accepts, str | bytes)
        or not all(isinstance(kind, str) for kind in accepts)
    ):
        return "which has no 'accepts' collection of event types: not an Engine"
    if not callable(getattr(engine, "check", None)):
        return "which has no 'check' method: not an Engine"
    rate = getattr(engine, "audio_rate", None)
    if rate is not None and rate not in ENGINE_RATES:
        return f"whose audio_rate {rate!r} is not one of {', '.join(map(str, ENGINE_RATES))}"
    run = getattr(type(engine), "run", None)
    if run is Engine.run:
        return "which does not implement 'run'"
    bridge_problem = getattr(engine, "bridge_problem", None)  # an asyncio engine (aio.py)
    if callable(bridge_problem) and (problem := bridge_problem()) is not None:
        return str(problem)
    if not inspect.iscoroutinefunction(getattr(engine, "run", None)):
        return "whose 'run' is not an async function: not an Engine"
    snapshot = getattr(type(engine), "snapshot", Engine.snapshot)
    restore = getattr(type(engine), "restore", Engine.restore)
    if snapshot is not Engine.snapshot and restore is Engine.restore:
        return "which implements 'snapshot' but not 'restore': its sessions could not migrate"
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ImportError | SyntaxError):
        return str(exc) or type(exc).__name__  # already says what it is
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
