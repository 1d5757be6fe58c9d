"""``CallDoor``: OpenAI's WebRTC call endpoints on the main listener (``--calls``).

``POST /v1/realtime/calls`` takes an SDP offer (calls.py parses the request, sdp.py the
offer), authorizes it as an upgrade is authorized (an API key, a client secret spent
now, or with ``?resume=`` a session's resume token), hands the offer to the media worker
(a ``CallChannel`` on the server's ``MediaLink``) and answers ``201`` with the worker's
SDP answer and ``Location: /v1/realtime/calls/{call_id}``. The HTTP connection is then
closed, and the connection's task goes on as the call's: it waits for the client's data
channel to open (``--call-setup-timeout``) and serves the session over the channel with
the session shell (``Opener.serve``, dialect ``openai-call``), as a WebSocket's task
does. The call counts as a connection (``max_connections`` and per IP) for its life.

``DELETE /v1/realtime/calls/{id}`` and ``POST .../{id}/hangup`` end the call's session
(``session.closed``; its slot is freed), authorized by the API key of the session's
principal or its current resume token. ``OPTIONS`` on either answers CORS preflights for
the origins ``--allow-origin`` allows, and every answer to such an origin carries
``Access-Control-Allow-Origin`` and ``Access-Control-Expose-Headers: Location``.

Refused before any slot or worker is used: a bad request (400, 413, 415), an origin not
allowed (403), no credential (401), a throttled address (429), a server full, draining,
with ``--call-max-setup`` calls in setup, or without a running media worker (503).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable

import attrs
import trio
from websockets.http11 import Request

from ...core.events import Reason
from ...core.opening import Grant
from ...dialects import Dialect
from ...dialects.openai.call import OPENAI_CALL
from ...media.wire import OFFER_REFUSED
from ..calls.channel import CallChannel, CallFailed
from ..calls.registry import Calls, Media
from ..calls.sdp import SdpRefused, answer_for_client, check_offer
from ..config import ServerConfig
from ..sessions.faults import FAULTS
from ..sessions.owner import Sessions
from ..sessions.transport import MessageTransport
from ..sessions.websocket import RECEIVE_SIZE, ConnectionClosed
from .auth import Gate
from .calls import (
    CallRequest,
    Hangup,
    Head,
    Preflight,
    classify,
    cors_headers,
    created_response,
    hangup_response,
    new_call_id,
    openai_refusal,
    parse_call,
    parse_head,
    preflight_response,
    refusal_response,
)
from .client_secrets import Refusal
from .http import origin_allowed
from .keys import KeyRing
from .throttle import Throttled

log = logging.getLogger("trio_duplex")

ServeCall = Callable[
    [MessageTransport, dict[str, list[str]], Grant, Dialect, str | None], Awaitable[None]
]
"""The session shell's ``Opener.serve``."""

MAX_SESSION_BYTES_SLACK = 4096
"""A form-B body's bytes beyond its offer and session parts (boundaries, part heads)."""


_FULL = openai_refusal(503, "the server is at capacity; retry later")
_DRAINING = openai_refusal(503, "the server is shutting down; retry on another")
_SETUP_FULL = openai_refusal(503, "too many calls are being set up; retry later")
_NO_MEDIA = openai_refusal(503, "the server's media worker is not running")
_NO_ANSWER = openai_refusal(503, "the media worker did not answer the offer in time")
_FAILED = openai_refusal(503, "the call could not be set up")
_UNANSWERABLE = openai_refusal(400, "the offer cannot be answered (it needs Opus audio)")
_UNAUTHORIZED = openai_refusal(401, "a valid API key, client secret or resume token is required")
_ORIGIN = openai_refusal(403, "origin not allowed")
_THROTTLED = openai_refusal(429, "too many failed resumes from this address; retry later")
_NO_CALL = openai_refusal(404, "no such call")


@attrs.define(eq=False)
class CallAccepted:
    """A call answered 201: its channel (data channel not open yet) and what the session
    shell is given once it opens."""

    channel: CallChannel
    call_id: str
    query: dict[str, list[str]]
    grant: Grant
    bearer: str | None = attrs.field(repr=False)
    session: dict[str, object] | None = None
    """Form B's ``session`` part: the session's first ``session.update``."""


@attrs.define(eq=False)
class CallDoor:
    config: ServerConfig
    gate: Gate
    sessions: Sessions
    media: Media
    calls: Calls
    serve_session: ServeCall
    close_timeout_s: float
    refused: Callable[[str], None]
    """Counts a refusal by reason (``Endpoints.refused``)."""
    _allow_peers: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = attrs.field(
        init=False
    )

    def __attrs_post_init__(self) -> None:
        # --call-allow-peer, parsed once (validated by the config already).
        self._allow_peers = tuple(
            ipaddress.ip_network(c, strict=False) for c in self.config.call_allow_peer
        )

    # -- the HTTP request, within the handshake's deadline ------------------------------

    async def answer(
        self, stream: trio.abc.Stream, head: bytes, early: bytes, peer: str | None
    ) -> CallAccepted | None:
        """Answer one request to the calls' paths; a call answered 201 (its HTTP
        response written) is returned, to be served (``serve``); None: answered."""
        where = f"a call request from {peer}" if peer else "a call request"
        parsed = parse_head(head)
        if isinstance(parsed, Refusal):
            await self._refuse(stream, parsed, [], where, "bad_request")
            return None
        origins = parsed.headers.get_all("Origin")
        allowed = origin_allowed(origins, parsed.headers.get_all("Host"), self.config.allow_origin)
        cors = cors_headers(origins[0] if origins else None, allowed)
        what = classify(parsed)
        if isinstance(what, Preflight):
            await stream.send_all(preflight_response(what, allowed))
            return None
        if isinstance(what, Refusal):
            await self._refuse(stream, what, cors, where, "bad_request")
            return None
        if not allowed:
            await self._refuse(stream, _ORIGIN, [], where, "origin")
            return None
        if isinstance(what, Hangup):
            refusal = self._hang_up(what)
            if refusal is None:
                await stream.send_all(hangup_response(cors))
            else:
                await self._refuse(stream, refusal, cors, where, "hangup")
            return None
        config = self.config
        most = config.call_max_sdp_bytes + config.max_config_bytes + MAX_SESSION_BYTES_SLACK
        if parsed.length > most:
            refusal = openai_refusal(413, f"the body exceeds {most} bytes")
            await self._refuse(stream, refusal, cors, where, "too_large")
            return None
        body = await _read_body(stream, early, parsed)
        if body is None:
            return None
        request = parse_call(
            parsed,
            body,
            max_sdp_bytes=config.call_max_sdp_bytes,
            max_session_bytes=config.max_config_bytes,
        )
        if isinstance(request, Refusal):
            await self._refuse(stream, request, cors, where, "bad_request")
            return None
        accepted = await self._call(stream, parsed, request, cors, peer, where)
        return accepted

    async def _call(
        self,
        stream: trio.abc.Stream,
        head: Head,
        request: CallRequest,
        cors: list[str],
        peer: str | None,
        where: str,
    ) -> CallAccepted | None:
        config = self.config
        found = self._authorize(head, peer)
        if isinstance(found, Throttled):
            await self._refuse(stream, _THROTTLED, cors, where, "throttled")
            return None
        if found is None:
            await self._refuse(stream, _UNAUTHORIZED, cors, where, "unauthorized")
            return None
        grant = found
        resuming = request.resume is not None
        busy = None
        if self.sessions.shutting_down:
            busy = _DRAINING
        elif not resuming and not self.sessions.admits(config.max_sessions):
            busy = _FULL
        elif self.calls.full:
            busy = _SETUP_FULL
        elif self.media.broken:
            busy = _NO_MEDIA
        if busy is None:
            try:
                offer = check_offer(
                    request.offer,
                    max_bytes=config.call_max_sdp_bytes,
                    allow_peers=self._allow_peers,
                )
            except SdpRefused as exc:
                await self._refuse(
                    stream, openai_refusal(exc.status, exc.message), cors, where, "sdp"
                )
                return None
        else:
            await self._refuse(stream, busy, cors, where, "unavailable")
            return None
        try:
            channel = CallChannel(
                self.media.open_call,
                config.first_message_bytes,
                write_timeout=config.write_timeout_s,
                close_timeout=self.close_timeout_s,
                peer=peer,
                on_stats=config.call_media_stats,
            )
        except trio.BrokenResourceError:
            await self._refuse(stream, _NO_MEDIA, cors, where, "unavailable")
            return None
        self.calls.in_setup += 1
        answered = False
        try:
            payload: dict[str, object] = {"sdp": offer, "max_event_bytes": config.max_event_bytes}
            if config.call_media_stats is not None:  # (a benchmark's: per-packet STATS)
                payload["stats"] = True
            refusal: Refusal | None = None
            answer = None
            with trio.move_on_after(config.call_answer_timeout_s):
                try:
                    answer = await channel.offer(json.dumps(payload).encode())
                except CallFailed as exc:
                    why = str(exc)
                    refusal = _UNANSWERABLE if why.startswith(OFFER_REFUSED) else _FAILED
                    log.info("%s: the media worker refused its offer (%s)", where, why[:200])
            if answer is None:
                await self._refuse(stream, refusal or _NO_ANSWER, cors, where, "unavailable")
                return None
            call_id = new_call_id()
            answer = answer_for_client(answer, config.call_advertise)
            self.calls.add(call_id, channel)
            await stream.send_all(created_response(answer, call_id, cors))
            answered = True
            return CallAccepted(
                channel, call_id, request.query, grant, request.bearer, request.session
            )
        finally:
            if not answered:
                self.calls.in_setup -= 1
                self.calls.remove(channel)
                with trio.CancelScope(shield=True):
                    await channel.aclose(1000, "not answered")

    def _authorize(self, head: Head, peer: str | None) -> Grant | Throttled | None:
        """The request's credential, checked as an upgrade's is (``Gate.authorize``: a
        client secret is spent now; with ``?resume=`` the bearer is the resume token)."""
        target = head.path
        if head.query:
            target += "?" + "&".join(f"{k}={v}" for k, vs in head.query.items() for v in vs)
        request = Request(target, head.headers)
        if self.gate.open and "resume" not in head.query:
            return Grant(None)
        return self.gate.authorize(request, peer)

    def _hang_up(self, hangup: Hangup) -> Refusal | None:
        """End the session of the call ``hangup`` names, if its bearer may."""
        session_id = self.calls.session_of(hangup.call_id)
        runner = None if session_id is None else self.sessions.runner(session_id)
        if runner is None:
            return _NO_CALL
        if not self.gate.open and not _may_end(
            self.gate.keys, self.sessions, runner.session.id, runner.session.principal, hangup
        ):
            return _UNAUTHORIZED
        runner.end(Reason.CLIENT_CLOSE)
        return None

    async def _refuse(
        self,
        stream: trio.abc.Stream,
        refusal: Refusal,
        cors: list[str],
        where: str,
        reason: str,
    ) -> None:
        FAULTS.report(where, f"{refusal.status} to a call request ({reason})")
        self.refused(f"call_{reason}")
        await stream.send_all(refusal_response(refusal, cors))

    # -- the call, once answered ----------------------------------------------------------

    async def serve(self, accepted: CallAccepted) -> None:
        """The call's life past its 201: its data channel open within the setup timeout,
        then its session served over it until the peer connection is gone, hung up or
        the session ends. Its channel is closed and released however it ends."""
        channel = accepted.channel
        in_setup = True
        try:
            opened = False
            with trio.move_on_after(self.config.call_setup_timeout_s):
                try:
                    await channel.wait_open()
                    opened = True
                except CallFailed as exc:
                    log.info("call %s failed in setup: %s", accepted.call_id, str(exc)[:200])
                    return
            self.calls.in_setup -= 1
            in_setup = False
            if not opened:
                log.info(
                    "call %s: its data channel did not open within %gs; dropped",
                    accepted.call_id,
                    self.config.call_setup_timeout_s,
                )
                return
            if accepted.session is not None:
                channel.inject(json.dumps({"type": "session.update", "session": accepted.session}))
            try:
                await self.serve_session(
                    channel, accepted.query, accepted.grant, OPENAI_CALL, accepted.bearer
                )
            except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        finally:
            if in_setup:
                self.calls.in_setup -= 1
            self.calls.remove(channel)
            with trio.CancelScope(shield=True):
                await channel.aclose(1000)


def _may_end(
    keys: KeyRing | None, sessions: Sessions, session_id: str, principal: str | None, h: Hangup
) -> bool:
    """A hangup's bearer is the API key of the session's principal, or the session's
    current resume token (compared in constant time by the registry)."""
    if h.bearer is None:
        return False
    if keys is not None and principal is not None and keys.principal(h.bearer) == principal:
        return True
    holder = sessions.registry.holder_of(h.bearer)
    return holder is not None and holder.id == session_id


async def _read_body(stream: trio.abc.Stream, early: bytes, head: Head) -> bytes | None:
    """The request's body (``head.length`` bytes, bounded by the caller); None: the
    client went first."""
    body = early
    if len(body) < head.length and head.headers.get_all("Expect") == ["100-continue"]:
        await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
    while len(body) < head.length:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        body += data
    return body[: head.length]


__all__ = ["CallAccepted", "CallDoor"]
