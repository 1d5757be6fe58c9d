"""``TwilioDoor``: phone calls through Twilio Media Streams (docs/telephony.md).

On with ``--twilio-auth-token`` (or, in development, ``--twilio-insecure-no-signature``),
on the main listener, under ``--twilio-path`` (``/v1/twilio``):

* ``POST {path}/twiml``, the number's voice webhook: signed (``X-Twilio-Signature`` over
  ``--twilio-public-url`` + the path and query it requested + the form), it answers TwiML
  that connects the call to a bidirectional stream to ``wss://PUBLIC{path}`` with a
  per-call ticket (``<Parameter name="trio_duplex_ticket">``, ``server/twilio/tickets.py``)
  and, after the ``<Connect>``, a ``<Redirect>`` back here with ``?resume=1``. Twilio runs
  that redirect once we close the stream (a drain); its answer is the same TwiML with a
  resume ticket, or ``<Hangup/>`` when the call's session is gone or too many reconnects
  failed in a row (``--twilio-max-redirects``).
* ``POST {path}/status``: the stream's and the call's status callbacks, signed; counted,
  and a call Twilio says is over ends its session at once if it is here and detached.
* ``GET {path}``, the stream: the upgrade is signed (the router checks it: ``signed``);
  then this door reads ``connected`` and ``start`` within ``--handshake-timeout``, checks
  the media format and the ticket against ``start``'s account and call, derives the
  call's session id and fixed resume token from them, and serves the session with the
  unchanged session shell (``Opener.serve``) over a ``TwilioChannel`` in the ``twilio``
  dialect: it opens the call's session, or resumes it (a redirect's ticket, or the
  session alive here). A refused stream is closed (1003: a media format we do not take;
  1008: a ticket) before any session exists.

Every refusal is fixed text; the auth token, tickets and the derived token are never
logged. A call's caller number (``From``) is never read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import SplitResult

import attrs
import trio
from websockets.http11 import Request

from ...core.credentials import digest
from ...core.events import Reason
from ...core.opening import Assigned, Grant
from ...core.session import State
from ...dialects import Dialect
from ...dialects.twilio import TWILIO
from ...dialects.twilio.messages import (
    MAX_MESSAGE_BYTES,
    Connected,
    Start,
    TwilioMessageError,
    parse,
)
from ..config import ServerConfig
from ..sessions.faults import FAULTS
from ..sessions.owner import Sessions
from ..sessions.transport import MessageTransport
from ..sessions.websocket import RECEIVE_SIZE, ConnectionClosed, WebSocket
from ..twilio.channel import TwilioChannel
from ..twilio.marks import MarkBook
from ..twilio.tickets import TicketError, TwilioKeys
from ..twilio.twiml import (
    TICKET_PARAMETER,
    connect_document,
    hangup_document,
    is_resume,
    next_attempt,
    redirect_url,
    status_url_of,
    stream_url_of,
)
from .client_secrets import Refusal
from .twilio import (
    WebhookHead,
    call_of,
    candidates,
    empty_response,
    is_twilio_head,
    parse_form,
    parse_head,
    presented_signature,
    refusal_response,
    signature_valid,
    status_of,
    twiml_response,
)

log = logging.getLogger("trio_duplex")

ServeCall = Callable[
    [MessageTransport, dict[str, list[str]], Grant, Dialect, str | None], Awaitable[None]
]
"""The session shell's ``Opener.serve``."""

_FORBIDDEN = Refusal(403, b"the request is not signed by this Twilio account\n")
_WEBSOCKET_FORMAT = 1003
_WEBSOCKET_POLICY = 1008


@attrs.define(eq=False)
class TwilioStats:
    """What ``/metrics`` shows of phone calls (front/metrics.py)."""

    calls: dict[str, int] = attrs.field(
        factory=lambda: dict.fromkeys(("opened", "resumed", "refused"), 0)
    )
    refusals: dict[str, int] = attrs.field(
        factory=lambda: dict.fromkeys(("signature", "ticket", "format", "account", "body"), 0)
    )
    redirects: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(("resume", "hangup"), 0))
    stream_events: dict[str, int] = attrs.field(factory=dict)
    marks: dict[str, int] = attrs.field(
        factory=lambda: dict.fromkeys(("sent", "echoed", "stale", "cleared"), 0)
    )
    clears: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(("cancel", "fence"), 0))
    dropped: dict[str, int] = attrs.field(
        factory=lambda: dict.fromkeys(("track", "unknown_event", "bad_message"), 0)
    )
    audio_bytes: dict[str, int] = attrs.field(factory=lambda: {"in": 0, "out": 0})

    def ended(self, channel: TwilioChannel) -> None:
        """Add what one stream counted."""
        book = self.marks
        mark_book = channel.book
        book["sent"] += mark_book.marks_sent
        book["echoed"] += mark_book.marks_echoed
        book["stale"] += mark_book.marks_stale
        book["cleared"] += mark_book.marks_cleared
        self.clears["cancel"] += mark_book.clears_cancel
        self.clears["fence"] += mark_book.clears_fence
        for what, count in channel.dropped.items():
            self.dropped[what] += count
        self.audio_bytes["in"] += channel.audio_bytes_in
        self.audio_bytes["out"] += mark_book.audio_bytes_out


@attrs.define(eq=False)
class TwilioDoor:
    config: ServerConfig
    sessions: Sessions
    serve_session: ServeCall
    close_timeout_s: float
    refused: Callable[[str], None]
    """Counts a refusal by reason (``Endpoints.refused``)."""
    findable: Callable[[str], Awaitable[bool]]
    """Is a session this node does not hold held by another, or handed over
    (``Placement.findable``: in a single process, never)?"""
    clustered: bool = False
    """Cluster mode: a call's session this node does not hold may live on another."""
    keys: TwilioKeys = attrs.field(init=False)
    stats: TwilioStats = attrs.field(factory=TwilioStats, init=False)

    def __attrs_post_init__(self) -> None:
        token = self.config.twilio_auth_token
        self.keys = TwilioKeys.random() if token is None else TwilioKeys.derive(token)

    @property
    def path(self) -> str:
        return self.config.twilio_path

    def is_head(self, head: bytes) -> bool:
        """A POST of the TwiML or status webhook (``answer``'s)."""
        return is_twilio_head(head, self.path)

    # -- the webhooks, within the handshake's deadline ----------------------------------

    def _public_url(self, head: WebhookHead | Request) -> str:
        public = self.config.twilio_public_url
        if public is not None:
            return public
        host = head.headers.get("Host", "localhost")  # (development: unsigned anyway)
        return f"http://{host}"

    def _signed(
        self, url_candidates: list[str], signature: str | None, params: list[tuple[str, str]]
    ) -> bool:
        token = self.config.twilio_auth_token
        if token is None:  # --twilio-insecure-no-signature
            return True
        return signature_valid(token, signature, url_candidates, params)

    async def answer(
        self, stream: trio.abc.Stream, head: bytes, early: bytes, peer: str | None
    ) -> None:
        """Answer one POST of the webhooks."""
        where = f"a Twilio webhook from {peer}" if peer else "a Twilio webhook"
        parsed = parse_head(head, self.path)
        if isinstance(parsed, Refusal):
            await self._refuse(stream, parsed, where, "body")
            return
        body = await _read_body(stream, early, parsed.length)
        if body is None:
            return
        params = parse_form(body)
        if isinstance(params, Refusal):
            await self._refuse(stream, params, where, "body")
            return
        public = self._public_url(parsed)
        urls = candidates(public, parsed.path, parsed.raw_query, websocket=False)
        if not self._signed(urls, parsed.signature, params):
            await self._refuse(stream, _FORBIDDEN, where, "signature")
            return
        account = self.config.twilio_account_sid
        if parsed.endpoint == "status":
            status = status_of(params, account)
            if isinstance(status, Refusal):
                await self._refuse(stream, status, where, "account")
                return
            self._status(
                status.call.account_sid, status.call.call_sid, status.stream_event, status.ended
            )
            await stream.send_all(empty_response())
            return
        call = call_of(params, account)
        if isinstance(call, Refusal):
            await self._refuse(stream, call, where, "account")
            return
        document = await self._twiml(public, parsed, call.account_sid, call.call_sid)
        await stream.send_all(twiml_response(document))

    async def _twiml(self, public: str, head: WebhookHead, account: str, call: str) -> str:
        """The TwiML of a call's first webhook, or of its ``<Redirect>``."""
        now = time.time()
        config = self.config
        attempt = 1
        mode: str = "o"
        if is_resume(head.query):
            found = next_attempt(head.query, now)
            session_id = self.keys.session_id(account, call)
            gone = self.sessions.runner(session_id) is None and not await self.findable(session_id)
            if found is None or found > config.twilio_max_redirects or gone:
                self.stats.redirects["hangup"] += 1
                log.info("call %s: its session is gone; hanging up", call)
                return hangup_document()
            self.stats.redirects["resume"] += 1
            attempt, mode = found, "r"
        ticket = self.keys.mint(mode, account, call, now, config.twilio_ticket_ttl_s)  # type: ignore[arg-type]
        return connect_document(
            stream_url_of(public, self.path),
            status_url_of(public, self.path),
            ticket,
            redirect_url(public, self.path, attempt, now),
            # The first reconnect at once (a drain's close looks like a short stream's:
            # the redirect cannot tell them apart), the later ones a second apart.
            1 if attempt > 2 else 0,
        )

    def _status(self, account: str, call: str, stream_event: str | None, ended: bool) -> None:
        if stream_event is not None:
            events = self.stats.stream_events
            events[stream_event] = events.get(stream_event, 0) + 1
        if not ended:
            return
        runner = self.sessions.runner(self.keys.session_id(account, call))
        if runner is not None and runner.session.state is State.DETACHED:  # nobody will resume it
            log.info("call %s completed: its detached session ends", call)
            runner.end(Reason.CLIENT_CLOSE)

    async def _refuse(
        self, stream: trio.abc.Stream, refusal: Refusal, where: str, reason: str
    ) -> None:
        FAULTS.report(where, f"{refusal.status} to a Twilio webhook ({reason})")
        self.refused(f"twilio_{reason}")
        self.stats.refusals[reason] += 1
        await stream.send_all(refusal_response(refusal))

    # -- the stream ---------------------------------------------------------------------

    def signed(self, request: Request, url: SplitResult) -> bool:
        """Is this upgrade of ``{path}`` signed by the account (the router asks)?"""
        if self.config.twilio_auth_token is None:
            return True
        signature = presented_signature(request.headers)
        if signature is None or isinstance(signature, Refusal):
            ok = False
        else:
            public = self._public_url(request)
            urls = candidates(public, url.path, url.query or None, websocket=True)
            ok = self._signed(urls, signature, [])
        if not ok:
            self.stats.refusals["signature"] += 1
        return ok

    async def stream(self, ws: WebSocket) -> None:
        """A stream's life past its 101: its ``start`` read and checked, then its
        session served over a ``TwilioChannel`` until it ends or the stream does."""
        ws.max_message_bytes = MAX_MESSAGE_BYTES
        start: Start | None = None
        with trio.move_on_after(self.config.handshake_timeout_s):
            start = await self._start(ws)
        if start is None:
            await self._close(
                ws, _WEBSOCKET_POLICY, "format", "no valid connected and start in time"
            )
            return
        if (start.encoding, start.sample_rate, start.channels) != ("audio/x-mulaw", 8000, 1) or (
            start.tracks and "inbound" not in start.tracks
        ):
            await self._close(
                ws, _WEBSOCKET_FORMAT, "format", "only audio/x-mulaw at 8000 Hz, mono"
            )
            return
        account, call = start.account_sid, start.call_sid
        if self.config.twilio_account_sid not in (None, account):
            await self._close(ws, _WEBSOCKET_POLICY, "account", "not this server's Twilio account")
            return
        try:
            mode = self.keys.verify(
                start.custom_parameters.get(TICKET_PARAMETER),
                account,
                call,
                time.time(),
                opening=False,
            )
        except TicketError as exc:
            await self._close(ws, _WEBSOCKET_POLICY, "ticket", str(exc))
            return
        session_id = self.keys.session_id(account, call)
        token = self.keys.resume_token(session_id)
        here = self.sessions.runner(session_id) is not None
        query: dict[str, list[str]]
        if mode == "r" or here:
            query = {"resume": [session_id]}
            grant = (
                Grant(None, elsewhere=digest(token))
                if self.clustered and not here
                else Grant(None, resume_of=session_id)
            )
            self.stats.calls["resumed"] += 1
        else:
            query = {"open": [session_id]}
            grant = Grant(f"twilio:{account}", assigned=Assigned(session_id, token))
            self.stats.calls["opened"] += 1
        config = self.config
        book = MarkBook(
            start.stream_sid,
            max_buffered_s=config.twilio_max_buffered_s,
            mark_interval_s=config.twilio_mark_interval_s,
            max_queued_s=config.twilio_max_queued_s,
        )
        channel = TwilioChannel(
            ws,
            start,
            book,
            write_timeout=config.write_timeout_s,
            close_timeout=self.close_timeout_s,
        )
        log.info(
            "call %s: stream %s %s session %s",
            call,
            start.stream_sid,
            "resumes" if "resume" in query else "opens",
            session_id,
            extra={"session_id": session_id},
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(channel.run)
                try:
                    await self.serve_session(channel, query, grant, TWILIO, token)
                except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()
        finally:
            self.stats.ended(channel)
            self._usage(call, session_id, channel)

    def _usage(self, call: str, session_id: str, channel: TwilioChannel) -> None:
        """One line per stream: its audio each way (μ-law at 8 kHz: 8000 bytes a second)."""
        seconds_in = channel.audio_bytes_in / 8000
        seconds_out = channel.book.audio_bytes_out / 8000
        log.info(
            "call %s: stream %s ended (session %s%s): audio in %.1f s, out %.1f s",
            call,
            channel.start.stream_sid,
            session_id,
            ", hung up" if channel.stopped else "",
            seconds_in,
            seconds_out,
            extra={"session_id": session_id},
        )

    async def _start(self, ws: WebSocket) -> Start | None:
        """``connected`` then ``start``; None if Twilio sent something else."""
        try:
            first = parse(await ws.get_message())
            if type(first) is Connected:
                first = parse(await ws.get_message())
        except TwilioMessageError as exc:
            ws.report_fault(f"twilio: {exc.reason}")
            return None
        return first if type(first) is Start else None

    async def _close(self, ws: WebSocket, code: int, reason: str, text: str) -> None:
        ws.report_fault(f"twilio stream refused: {text}")
        self.refused(f"twilio_{reason}")
        self.stats.refusals[reason] += 1
        self.stats.calls["refused"] += 1
        with trio.move_on_after(self.close_timeout_s):
            await ws.aclose(code, text)


async def _read_body(stream: trio.abc.Stream, early: bytes, length: int) -> bytes | None:
    """The request's body (``length`` bytes, bounded by ``parse_head``); None: the
    client went first."""
    body = early
    while len(body) < length:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        body += data
    return body[:length]


__all__ = ["TwilioDoor", "TwilioStats"]
