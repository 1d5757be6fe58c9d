"""The trio-duplex client: one resumable session over any number of connections.

::

    async with trio_duplex.client.connect("ws://127.0.0.1:8765/v1/duplex") as session:
        await session.send({"type": "input.text.append", "text": "hello"})
        async for event in session:
            print(event)

``SessionState`` (in ``state.py``) is the client side of docs/protocol.md as a state machine
with no I/O, no clock and no awaits: sequence numbers both ways, the unconfirmed outbox,
deduplication, the ack and heartbeat policies. ``ClientSession`` and ``connect``, here,
are the trio shell around it: one supervisor task that connects, resumes with backoff,
and runs a reader and a single writer per connection. The shell changes the state
machine only through its methods, and keeps its own lifecycle in one ``_Status``.

Guarantees: every server event with a ``server_event_seq`` is yielded once, in order,
across reconnects; control events (no seq) are yielded once per arrival. Every event
given to ``send`` is stamped with ``client_event_seq`` and kept until the server is known
to have read it; after a resume exactly the events past the server's
``last_received_client_event_seq`` are sent again. ``send`` paces itself by the server's
input bounds and ``input.consumed`` reports (protocol v2), and resends from a refused seq
should the server refuse one for backpressure; those reports and refusals are handled
here, not delivered.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, cast

import attrs
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.trio.client import ClientConnection
from websockets.trio.client import connect as _ws_connect
from websockets.typing import Subprotocol

from ..core.events import ErrorCode, EventType
from ..core.frames import CloseCode
from ..core.wire import utf8_len
from .dialect import ClientDialect, DialectName, dialect_named
from .errors import (
    ClientError,
    ProtocolViolation,
    ReconnectFailed,
    ResumeRefused,
    ServerRefused,
    SessionEnded,
    SessionReplaced,
)
from .options import (
    ClientOptions,
    ConnectionChange,
    Disconnected,
    Limits,
    ResumeState,
    Retrying,
)
from .state import (
    SessionState,
    Verdict,
)
from .transport import TRANSIENT, WEBSOCKETS_LOG, audio_event, describe, parse_event
from .urls import UrlRing, parse_urls

log = logging.getLogger("trio_duplex.client")

Event = dict[str, Any]
StreamFactory = Callable[[], Awaitable[trio.abc.Stream]]
"""Opens the byte stream a connection runs on (tests: an in-memory stream)."""
StreamFactories = StreamFactory | Mapping[str, StreamFactory]
"""``connect``'s ``open_stream``: one factory for every URL, or one per URL."""


# -- the trio shell --------------------------------------------------------------------


@attrs.define(eq=False)
class _Loss:
    reason: str = "connection closed"
    close_code: int | None = None
    abort: bool = False
    migrating: bool = False
    """``session.going_away {migrating: true}`` came first: resume elsewhere at once."""


class _AttemptFailed(Exception):
    """One connection attempt failed in a way that another attempt might not."""

    def __init__(self, message: str, *, draining: bool = False) -> None:
        super().__init__(message)
        self.draining = draining
        """The server said it is shutting down (``server_shutting_down``, close 1001)."""


SessionStatus = Literal["connecting", "attached", "reconnecting", "closing", "ended", "failed"]


class _Status(enum.Enum):
    """The shell's lifecycle. Changed only by ``ClientSession._to``, along ``_NEXT``."""

    CONNECTING = "connecting"
    """Before the first attach (``connect`` has not returned the session yet)."""
    ATTACHED = "attached"
    RECONNECTING = "reconnecting"
    """Between connections, after the first attach."""
    CLOSING = "closing"
    """``session.close`` requested; the supervisor (re)connects until it has ended."""
    DETACHING = "detaching"
    """Dropping the connection, keeping the session; shown as ``closing``."""
    ENDED = "ended"
    """Over: the terminal event arrived, or the supervisor stopped without a failure."""
    FAILED = "failed"
    """Over: ``_failure`` says why."""

    @property
    def public(self) -> SessionStatus:
        """The value users see: each status's own, but a detach reads as closing."""
        return cast(SessionStatus, "closing" if self is _Status.DETACHING else self.value)


_NEXT: dict[_Status, frozenset[_Status]] = {
    _Status.CONNECTING: frozenset({_Status.ATTACHED, _Status.ENDED, _Status.FAILED}),
    _Status.ATTACHED: frozenset(
        {_Status.RECONNECTING, _Status.CLOSING, _Status.DETACHING, _Status.ENDED, _Status.FAILED}
    ),
    _Status.RECONNECTING: frozenset(
        {_Status.ATTACHED, _Status.CLOSING, _Status.DETACHING, _Status.ENDED, _Status.FAILED}
    ),
    _Status.CLOSING: frozenset({_Status.DETACHING, _Status.ENDED, _Status.FAILED}),
    _Status.DETACHING: frozenset({_Status.ENDED, _Status.FAILED}),
    _Status.ENDED: frozenset(),
    _Status.FAILED: frozenset(),
}
"""The allowed transitions. A session that closes or detaches stays so across reconnects
(a close is re-sent on the next connection); ENDED and FAILED are final."""

_OVER = frozenset({_Status.ENDED, _Status.FAILED})
_STOPPING = frozenset({_Status.DETACHING, *_OVER})
"""The supervisor connects no more."""
_UNUSABLE = frozenset({_Status.CLOSING, *_STOPPING})
"""``send`` and ``confirm`` raise."""


class ClientSession:
    """A session as the application sees it. Create it with ``connect``.

    ``send`` queues an event (stamped with ``client_event_seq``); iterate to receive.
    One task should iterate; any number may send. ``session_id``, ``generation``,
    ``limits`` and ``config`` reflect the latest handshake.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        state: SessionState,
        options: ClientOptions,
        *,
        on_change: Callable[[ConnectionChange], None] | None,
        open_stream: StreamFactories | None,
        rng: random.Random,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._urls = UrlRing.start(parse_urls(url), rng)
        self._ssl = ssl_context
        self._core = state
        self._options = options
        self._on_change = on_change
        self._open_stream = open_stream
        self._rng = rng
        self._events_tx, self._events_rx = trio.open_memory_channel[Event](math.inf)
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._stop = trio.Event()
        """Set on detach: cuts a backoff wait short."""
        self._done = trio.Event()
        """Set once the supervisor has stopped (the status is ENDED or FAILED by then)."""
        self._status = _Status.CONNECTING
        self._failure: ClientError | None = None
        """Set with the status FAILED, and only then."""
        self._scope = trio.CancelScope()
        """The supervisor's scope: shielded once attached, so that a cancelled block
        still gets its bounded close; ``connect`` cancels it when done."""
        self._terminal: Event | None = None
        self.duplicates_dropped = 0
        """Server events dropped because their seq had already been received."""

    def __repr__(self) -> str:
        return f"<ClientSession {self.session_id} generation={self.generation} {self.status}>"

    # -- what the application sees -----------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self._core.session_id

    @property
    def url(self) -> str:
        """The URL of the current connection (between connections: of the next attempt)."""
        return self._urls.url

    @property
    def generation(self) -> int:
        return self._core.generation

    @property
    def limits(self) -> Limits:
        return self._core.limits

    @property
    def config(self) -> dict[str, Any]:
        return self._core.config

    @property
    def dialect(self) -> ClientDialect:
        """The wire dialect the session speaks (``connect``'s ``dialect``)."""
        return self._core.dialect

    @property
    def state(self) -> SessionState:
        """The protocol state machine, read-only (it changes only through its methods,
        which are the shell's to call)."""
        return self._core

    @property
    def status(self) -> SessionStatus:
        return self._status.public

    def resume_state(self) -> ResumeState:
        """Session id, current token and last received seq, for ``connect(resume=...)``."""
        state = self._core.resume_state()
        assert state is not None, "connect hands the session out only once it is attached"
        return state

    async def send(self, event: Mapping[str, Any]) -> int:
        """Queue ``event`` for the server and return its ``client_event_seq``.

        Waits while the resend buffer is full, and (protocol v2) while the events sent
        above the server's last ``input.consumed`` report reach its advertised
        ``max_pending_input`` or ``max_pending_input_bytes``: paced so, the server never
        refuses them for backpressure (core/flow.py). Should it refuse one all the same
        (a server whose bound is smaller than it says), the client resends from the
        refused seq after a short backoff, and the refusal is not delivered. Cancelled,
        nothing was queued; returned, the event will reach the server exactly once, in
        order, unless the session fails.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        core, options = self._core, self._options
        while True:
            self._check_usable()
            if core.has_room(options.max_unconfirmed_events, options.max_unconfirmed_bytes):
                break
            core.request_confirm()  # a heartbeat barrier frees the buffer soonest
            self._wake.set()
            progress = self._progress
            await progress.wait()
        seq = core.enqueue(event)
        self._wake.set()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return seq

    async def send_audio(self, audio: bytes) -> int:
        """Send ``audio`` (in the session's negotiated input format: PCM16, G.711 or one
        Opus packet) as ``input_audio_buffer.append``: a binary message on the binary
        lane, base64 JSON otherwise. Returns its ``client_event_seq``; as ``send``."""
        return await self.send({"type": EventType.INPUT_AUDIO_APPEND, "audio": bytes(audio)})

    async def confirm(self) -> None:
        """Wait until the server has read every event sent so far (each was received, or
        answered with an ``error`` that is already in the event stream)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        target = self._core.request_confirm()
        self._wake.set()
        while self._core.confirmed_seq < target:
            self._check_usable()
            progress = self._progress
            await progress.wait()

    async def receive(self) -> Event:
        """The next server event. Raises the session's error once it has failed, or
        SessionEnded once the terminal event has been received. Cancel-safe."""
        try:
            return await self._events_rx.receive()
        except trio.EndOfChannel:
            if self._failure is not None:
                raise self._failure from None
            raise SessionEnded(self._terminal) from None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except SessionEnded:
            raise StopAsyncIteration from None

    async def aclose(self, reason: str | None = None) -> None:
        """Close the session (``session.close``) and wait until it has ended. If cancelled,
        the close goes on; leaving ``connect`` bounds it by ``close_timeout``."""
        self._request_close(reason)
        await self._done.wait()

    async def detach(self) -> ResumeState:
        """Drop the connection without closing the session; the server keeps it for
        ``disconnect_grace_s``. Returns what ``connect(resume=...)`` needs. Events already
        received stay readable here, and a later resume starts after them."""
        self._request_detach()
        await self._done.wait()
        return self.resume_state()

    # -- internals ---------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._status in _UNUSABLE:
            raise SessionEnded(self._terminal)

    def _to(self, status: _Status) -> None:
        assert status in _NEXT[self._status], f"{self._status.name} -> {status.name}"
        self._status = status

    def _attach(self) -> None:
        if self._status in (_Status.CONNECTING, _Status.RECONNECTING):
            self._to(_Status.ATTACHED)

    def _detach_connection(self) -> None:
        if self._status is _Status.ATTACHED:
            self._to(_Status.RECONNECTING)

    def _end(self, terminal: Event | None = None) -> None:
        if self._status not in _OVER:
            self._terminal = terminal
            self._to(_Status.ENDED)

    def _fail(self, failure: ClientError) -> None:
        if self._status not in _OVER:
            log.info("session %s failed: %s", self.session_id, failure)
            self._failure = failure
            self._to(_Status.FAILED)

    def _notify_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _request_close(self, reason: str | None = None) -> None:
        """Ignored once closing, detaching or over: the first way out wins."""
        if self._status in (_Status.ATTACHED, _Status.RECONNECTING):
            self._core.request_close(reason)
            self._to(_Status.CLOSING)
            self._wake.set()

    def _request_detach(self) -> None:
        """Overrides a close in progress: the connection is dropped, the session kept."""
        if self._status in (_Status.ATTACHED, _Status.RECONNECTING, _Status.CLOSING):
            self._to(_Status.DETACHING)
            self._stop.set()
            self._wake.set()

    def _change(self, change: ConnectionChange) -> None:
        if self._on_change is not None:
            try:
                self._on_change(change)
            except Exception:
                log.exception("on_change callback failed")

    async def _finish(self, *, detach: bool) -> None:
        """Leave ``connect``: close or detach, bounded by ``close_timeout``, shielded."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self._options.close_timeout
            if detach:
                self._request_detach()
            else:
                self._request_close()
            await self._done.wait()
        if not self._done.is_set():
            log.info("session %s: close timed out; cutting the connection", self.session_id)

    async def _run(
        self, *, task_status: trio.TaskStatus[ClientError | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The supervisor. Reports None once attached, or the failure that came first
        (it returns normally only after attaching)."""
        never_attached = False
        try:
            with self._scope:
                await self._supervise(task_status)
        except ClientError as exc:
            never_attached = self._status is _Status.CONNECTING
            self._fail(exc)
        finally:
            self._end()
            self._events_tx.close()
            self._done.set()
            self._notify_progress()
        if never_attached:
            task_status.started(self._failure)  # connect raises it

    async def _supervise(self, task_status: trio.TaskStatus[ClientError | None]) -> None:
        """Connect, and reconnect after each loss, until the session ends or detaches.

        Which URL each attempt uses is ``urls.py``'s policy: a failed attempt moves on
        to the next URL; a lost connection is resumed at its own URL first, except after
        ``session.going_away {migrating: true}``, when the session is resumed at once
        (no backoff for that first attempt) at the next URL that is not draining."""
        policy = self._options.reconnect
        urls = self._urls
        failures = 0
        retries = 0  # in this outage (or before the first attach): numbered from 1
        outage_start = trio.current_time()
        last_error = ""
        first = True
        at_once = False  # the next attempt skips its backoff (a migration)
        while self._status not in _STOPPING:
            if not first:
                elapsed = trio.current_time() - outage_start
                if (
                    failures >= policy.max_attempts
                    or elapsed >= policy.deadline
                    # No retries before the first attach: one try of each URL.
                    or (
                        self._status is _Status.CONNECTING
                        and not policy.retry_open
                        and failures >= len(urls.urls)
                    )
                ):
                    raise ReconnectFailed(failures, elapsed, last_error)
                retries += 1
                if at_once or (self._status is _Status.CONNECTING and not policy.retry_open):
                    delay = 0.0  # a migration; or, failing fast, the open's one round
                else:
                    delay = min(policy.delay(retries, self._rng), policy.deadline - elapsed)
                at_once = False
                self._change(Retrying(retries, delay, last_error))
                with trio.move_on_after(delay):
                    await self._stop.wait()
                if self._status is _Status.DETACHING:
                    return
            first = False
            try:
                loss = await self._connection(task_status)
            except _AttemptFailed as exc:
                failures += 1
                last_error = str(exc)
                log.info(
                    "session %s: attempt at %s failed: %s", self.session_id, urls.where, last_error
                )
                if exc.draining:
                    urls.mark_draining()
                urls.advance()
                continue
            except ResumeRefused as exc:
                if self._status is _Status.CLOSING and exc.code == ErrorCode.SESSION_RESUME_EXPIRED:
                    return  # our close won the race: the session is gone, as asked
                raise
            if self._status in _STOPPING:
                return
            failures = retries = 0
            outage_start = trio.current_time()
            last_error = loss.reason
            log.info("session %s: connection lost: %s", self.session_id, loss.reason)
            if loss.migrating:
                # The server is moving the session: resume it now, elsewhere if we can.
                at_once = True
                urls.advance()
                log.info("session %s: migrating; resuming at %s", self.session_id, urls.where)
            self._change(Disconnected(loss.reason, loss.close_code))

    async def _connection(self, task_status: trio.TaskStatus[ClientError | None]) -> _Loss:
        """One connection: open it, handshake, then pump until it is lost."""
        deadline = trio.current_time() + self._options.open_timeout
        attached = False
        loss: _Loss | None = None
        # Bounds the close once the connection is lost: websockets' reader, held by its
        # flow control (messages nobody reads any more), never sees the stream end, and
        # leaving the connection waits for it (seen: a client hung for good after a
        # heartbeat timeout, in tests/cluster/test_client_cluster.py, 1 run in ~10).
        closing = trio.CancelScope()
        try:
            with closing:
                async with self._websocket(deadline) as ws:
                    with trio.fail_at(deadline):
                        if (opening := self._core.opening_frame()) is not None:
                            await ws.send(opening)
                        reply = await self._first_answer(ws)
                    try:
                        change = self._core.on_handshake(reply, trio.current_time())
                    except ServerRefused as exc:
                        if exc.retryable:
                            draining = exc.code == ErrorCode.SERVER_SHUTTING_DOWN
                            raise _AttemptFailed(str(exc), draining=draining) from None
                        raise
                    attached = True
                    self._urls.attached()
                    first_attach = self._status is _Status.CONNECTING
                    self._attach()
                    self._notify_progress()
                    log.info(
                        "session %s: attached, generation %d%s",
                        change.session_id,
                        change.generation,
                        " (resumed)" if change.resumed else "",
                    )
                    self._change(change)
                    if first_attach:
                        self._scope.shield = True
                        task_status.started(None)
                    loss = await self._pump(ws)
                    closing.deadline = trio.current_time() + self._options.transport_close_timeout
                    if loss.abort:
                        await trio.aclose_forcefully(ws.stream)
            assert loss is not None  # (the close's bound is set only once it is)
            return loss
        except InvalidURI as exc:
            raise ServerRefused(None, f"invalid URL: {exc}") from exc
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLCertVerificationError):  # retrying will not help
                why = cause.verify_message or cause.reason
                raise ServerRefused(None, f"TLS: the server's certificate: {why}") from exc
            if attached:
                return _Loss(describe(exc))
            raise _AttemptFailed(describe(exc)) from exc
        except InvalidStatus as exc:
            status = exc.response.status_code
            if 400 <= status < 500 and status != 429:  # e.g. 404: a wrong path stays wrong
                raise ServerRefused(None, f"WebSocket handshake refused: HTTP {status}") from exc
            raise _AttemptFailed(describe(exc)) from exc
        except TRANSIENT as exc:
            if attached:  # lost while closing the transport: still just a loss
                return _Loss(describe(exc))
            draining = (
                isinstance(exc, ConnectionClosed)
                and exc.rcvd is not None
                and exc.rcvd.code == CloseCode.GOING_AWAY
            )
            raise _AttemptFailed(describe(exc), draining=draining) from exc
        finally:
            self._detach_connection()

    @asynccontextmanager
    async def _websocket(self, deadline: float) -> AsyncIterator[ClientConnection]:
        url = self._core.opening_url(self._urls.url)
        stream = None
        if self._open_stream is not None:
            if isinstance(self._open_stream, Mapping):
                open_stream = self._open_stream[self._urls.url]
            else:
                open_stream = self._open_stream
            with trio.fail_at(deadline):
                stream = await open_stream()
        # The credential (servers with --api-key-file): the resume token to resume, else
        # the API key, if any.
        credential = self._core.resume_token or self._options.api_key
        headers = None if credential is None else {"Authorization": f"Bearer {credential}"}
        async with _ws_connect(
            url,
            additional_headers=headers,
            subprotocols=cast("list[Subprotocol] | None", self._core.dialect.subprotocols),
            stream=stream,
            ssl=self._ssl,
            compression=None,
            proxy=None,
            open_timeout=max(deadline - trio.current_time(), 0.001),
            ping_interval=None,  # session.heartbeat is the keepalive
            close_timeout=self._options.transport_close_timeout,
            max_size=self._options.max_message_bytes,
            user_agent_header="trio-duplex-client",
            logger=WEBSOCKETS_LOG,
        ) as ws:
            yield ws

    async def _first_answer(self, ws: ClientConnection) -> Event:
        try:
            message = await ws.recv()
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            if code == CloseCode.RESUME_REFUSED and self._core.session_id is not None:
                raise ResumeRefused(None, "resume refused", code) from None
            raise
        event = parse_event(message) if isinstance(message, str) else None
        if event is None:
            raise ProtocolViolation("the server's first frame is not a JSON event")
        return event

    async def _pump(self, ws: ClientConnection) -> _Loss:
        loss = _Loss()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop, ws, loss, nursery.cancel_scope)
            await self._read_loop(ws, loss)
            nursery.cancel_scope.cancel()
        return loss

    async def _read_loop(self, ws: ClientConnection, loss: _Loss) -> None:
        core, deliver = self._core, self._events_tx.send_nowait
        while True:
            try:
                message = await ws.recv()
            except ConnectionClosed as exc:
                loss.reason = describe(exc)
                loss.close_code = exc.rcvd.code if exc.rcvd is not None else None
                return
            if isinstance(message, bytes):
                event = audio_event(message, core.dialect.output_audio_field)  # binary lane
                size = len(message)
            else:
                event = parse_event(message)
                size = utf8_len(message)
            if event is None:
                log.warning("session %s: ignored a frame that is not an event", core.session_id)
                continue
            had_unacked = core.ack_pending
            verdict = core.on_event(event, size, trio.current_time())
            if verdict is Verdict.DUPLICATE:
                self.duplicates_dropped += 1
                continue
            if verdict is Verdict.INTERNAL:
                self._notify_progress()
                self._wake.set()
                continue
            deliver(event)
            if event.get("type") == EventType.GOING_AWAY and event.get("migrating") is True:
                self._urls.mark_draining()  # and once it closes, resume elsewhere at once
                loss.migrating = True
            if not had_unacked and core.ack_pending:
                self._wake.set()  # the writer times the ack from the first unacked event
            if verdict is Verdict.END:
                self._end(event)
                loss.reason = f"{event.get('type')} ({event.get('reason')})"
                return
            if verdict is Verdict.REPLACED:
                generation = event.get("attachment_generation")
                self._fail(SessionReplaced(generation if type(generation) is int else None))
                return

    async def _write_loop(self, ws: ClientConnection, loss: _Loss, pump: trio.CancelScope) -> None:
        core = self._core
        try:
            while True:
                self._wake = trio.Event()
                now = trio.current_time()
                if self._status is _Status.DETACHING:
                    if core.owes_hello and (frame := core.next_frame(now)) is not None:
                        await ws.send(frame)  # the session keeps its whole grace
                    loss.reason = "detached"
                    break
                if core.heartbeat_overdue(now):
                    loss.reason = f"no heartbeat_ack within {core.heartbeat.timeout}s"
                    loss.abort = True
                    break
                frame = core.next_frame(now)
                if frame is None:
                    with trio.move_on_at(core.next_deadline()):
                        await self._wake.wait()
                    continue
                with trio.move_on_at(core.send_deadline()) as stuck:
                    await ws.send(frame)
                if stuck.cancelled_caught:  # a peer that takes nothing (half a frame out)
                    loss.reason = f"a send not taken within {core.heartbeat.timeout}s"
                    loss.abort = True
                    break
        except ConnectionClosed as exc:
            loss.reason = describe(exc)
            loss.close_code = exc.rcvd.code if exc.rcvd is not None else None
        pump.cancel()


@asynccontextmanager
async def connect(
    url: str | Sequence[str],
    session: Mapping[str, Any] | None = None,
    *,
    resume: ResumeState | None = None,
    options: ClientOptions | None = None,
    detach_on_exit: bool = False,
    on_change: Callable[[ConnectionChange], None] | None = None,
    open_stream: StreamFactories | None = None,
    rng: random.Random | None = None,
    ssl_context: ssl.SSLContext | None = None,
    dialect: DialectName | ClientDialect = "native",
) -> AsyncIterator[ClientSession]:
    """Open a session (configured with ``session``), or resume one (``resume``), and keep
    it attached until the block is left.

    ``url`` is one URL (a node's, or a load balancer's), or a non-empty sequence of them
    (all ``ws://`` or all ``wss://``: else ValueError), the nodes of one cluster. The
    first attempt goes to a random one of them, each failed attempt to the next; a lost
    connection is resumed at its own URL first. After ``session.going_away {migrating:
    true}`` (delivered as usual) the session is resumed, as soon as that connection
    closes, at the next URL that is not draining (see ``urls.py``).

    Entering returns once the session is attached; a failure to get there raises
    (ServerRefused, ResumeRefused, ReconnectFailed). Leaving closes the session with
    ``session.close``, or with ``detach_on_exit`` (or after ``detach()``) only drops the
    connection; either way within ``options.close_timeout``. Exceptions raised in the
    block come out unchanged.

    ``on_change`` is called with Attached / Disconnected / Retrying as the connection
    comes and goes. ``open_stream`` replaces the TCP connection (tests): one factory, or
    a mapping from each URL to its own. ``rng`` is the randomness of the backoff jitter
    and of the first URL's choice. ``ssl_context`` is the TLS of ``wss://`` URLs (None:
    the system's trusted certificates), e.g. ``ssl.create_default_context(cafile=...)``.

    ``dialect`` is the wire the URLs speak (``client/dialect.py``): ``native``
    (``/v1/duplex``), or ``openai`` (``/v1/realtime``: OpenAI Realtime events with our
    resume extension; ``session`` is then an OpenAI session object, sent as the
    session's first event, ``session.update``, once the server has opened it). The
    guarantees are the same in both.
    """
    urls = parse_urls(url)
    if ssl_context is not None and not all(u.startswith("wss://") for u in urls):
        raise ValueError("ssl_context needs a wss:// URL")
    if isinstance(open_stream, Mapping) and (missing := set(urls) - set(open_stream)):
        raise ValueError(f"open_stream has no stream factory for {sorted(missing)}")
    opts = options or ClientOptions()
    spelling = dialect_named(dialect)
    if resume is not None:
        if session is not None:
            raise ValueError("give either session (open) or resume, not both")
        state = SessionState.for_resume(
            resume, acks=opts.acks, heartbeat=opts.heartbeat, dialect=spelling
        )
    else:
        config = dict(session or {})
        state = SessionState(config, acks=opts.acks, heartbeat=opts.heartbeat, dialect=spelling)
    client = ClientSession(
        urls,
        state,
        opts,
        on_change=on_change,
        open_stream=open_stream,
        rng=rng or random.Random(),
        ssl_context=ssl_context,
    )
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            refused: ClientError | None = await nursery.start(client._run)
            if refused is None:
                try:
                    yield client
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    # Re-raised below, outside the nursery, so it is not wrapped in a group.
                    body_error = exc
                finally:
                    await client._finish(detach=detach_on_exit)
        finally:
            client._scope.cancel()
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
    if refused is not None:
        raise refused
