"""The built-in ``realtime-proxy`` engine: resume in front of an existing realtime endpoint.

``trio-duplex serve --engine realtime-proxy --upstream wss://host/v1/realtime`` gives
each session one WebSocket to an upstream that speaks the OpenAI Realtime event
vocabulary (OpenAI's own, vLLM's ``/v1/realtime``, ...), and copies events both ways.
The client gets what the upstream lacks: resume with replay, exactly-once, takeover,
going-away, the binary audio lane and codecs. The upstream connection lives with the
session, not with the client's connection: while the client is away the upstream's
output is journaled as any engine's.

Decisions (docs/engines.md, "The realtime proxy", says the same for users):

- The upstream is connected before the client hears ``session.created`` (``prepare``),
  within ``CONNECT_TIMEOUT_S``: an upstream that refuses or cannot be reached refuses
  the open with a retryable ``resource_exhausted`` (close 1013), as a full server does;
  no session ever existed. When the upstream connection ends or breaks at any later
  point, the session ends with reason ``upstream_lost`` (``UpstreamLost``): at once if
  the client is attached, else once it resumes (after its replay), or it expires when
  its grace runs out.
- Audio: the engine's rate is 24 kHz PCM16, the upstream's format. The client's
  ``input_audio_buffer.append`` (any wire format or lane, converted by the server)
  goes up as base64 ``audio``; the upstream's ``response.output_audio.delta`` comes
  down with its base64 ``delta`` decoded into our ``audio`` field (the server encodes
  it for the client's format and lane).
- Names: the upstream's ``session.created``, ``session.updated`` and ``error`` would
  collide with our protocol's; they reach the client as ``upstream.session.created``,
  ``upstream.session.updated`` and ``upstream.error`` (so does any other event type our
  protocol reserves, e.g. ``session.closed`` from trio-duplex's own server upstream).
  Everything else goes down as it is (``server_event_seq`` is ours, given by the
  server). Up, ``client_event_seq`` is
  dropped; the opening configuration (minus our ``audio``, the client's wire format)
  and each ``session.update`` go up as ``session.update`` (``type: "realtime"`` unless
  set). The upstream's audio format is left at its default, 24 kHz PCM16 (OpenAI's).
- The upstream's ``response.output_audio.delta`` carries its audio in ``delta``
  (OpenAI) or ``audio`` (trio-duplex's own server as the upstream): either is read.
- Barge-in: the client's ``response.cancel`` goes up, followed by
  ``conversation.item.truncate {item_id, content_index, audio_end_ms}`` for the item
  whose audio was playing, ``audio_end_ms`` being the audio of that item delivered to
  the client: up to the newest of its deltas whose seq the client has confirmed
  (``EngineSession.delivered_seq``: its acks, or its resume).
- A session whose configuration a client token locked: a ``response.create`` that
  overrides it for one response (any ``response`` field but ``conversation``,
  ``metadata`` and ``input``) and a ``system`` or ``developer`` item (in
  ``conversation.item.create`` or ``response.input``) are refused ``config_locked``
  (``check_locked``), never stripped: a stripped override would answer with a response
  the developer did not ask for, and nothing would say why.
- No migration (no ``snapshot``): an upstream WebSocket cannot move to another node.
- A client on OpenAI's dialect (``/v1/realtime``) gets the upstream's events as they are,
  by their own names, unshaped (``raw_dialects``; ``proxy_wire`` says what still changes);
  there the names above are not renamed, the upstream answers ``session.update``, and no
  truncate follows a cancel (OpenAI's clients truncate to what they played themselves).
"""

from __future__ import annotations

import base64
import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import orjson
import trio
from websockets.exceptions import ConnectionClosedOK, InvalidStatus, WebSocketException
from websockets.trio.client import ClientConnection, connect

from ..core.events import CONTROL_EVENTS, EventType
from ..core.wire import ProtocolError
from ..logs import MASK, redact, register_secret
from .api import ConfigLocked, Engine, EngineFactory, EngineSession, Event, UpstreamLost
from .proxy_wire import relayed, upstream_session

log = logging.getLogger("trio_duplex")
_WS_LOG = logging.getLogger("trio_duplex.realtime_proxy.upstream")
"""The upstream connections' websockets logger: at INFO, even under ``--log-level
debug``, since at DEBUG websockets prints every request header (the key) and every
frame (the conversation) of every session."""
_WS_LOG.setLevel(logging.INFO)

API_KEY_ENV: Final = "TRIO_DUPLEX_UPSTREAM_API_KEY"
CONNECT_TIMEOUT_S: Final = 10.0
CLOSE_TIMEOUT_S: Final = 2.0  # the session has ended: its upstream's close is not awaited long
PING_INTERVAL_S: Final = 20.0
"""Keepalive: a ping every 20 s; no pong within 20 s and the upstream is lost."""
MAX_UPSTREAM_MESSAGE_BYTES: Final = 16 * 1024 * 1024
RATE: Final = 24_000
MAX_MARKS: Final = 4096
"""Unconfirmed audio deltas of the playing item remembered for a truncate (80 s of 20 ms
deltas)."""
_BYTES_PER_MS: Final = RATE * 2 // 1000
_RENAMED: Final = {str(kind): f"upstream.{kind}" for kind in (*CONTROL_EVENTS, EventType.UPDATED)}
"""Upstream event types that are our protocol's own (``session.created``, ``error``, and,
from trio-duplex's own server as the upstream, ``session.closed``...): renamed."""
_AUDIO_DELTA: Final = "response.output_audio.delta"
_APPEND: Final = "input_audio_buffer.append"
_CANCEL: Final = "response.cancel"
_UPDATE: Final = "session.update"
CLIENT_EVENTS: Final = frozenset(
    {
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
    }
)
"""The OpenAI Realtime client events the proxy forwards (``session.update`` too, which
the server answers and the engine forwards)."""
_RESPONSE_UNLOCKED: Final = frozenset({"conversation", "metadata", "input"})
"""The fields of ``response.create``'s ``response`` a locked session may set: the rest
(``instructions``, ``tools``, ``voice``, ``modalities``, ``temperature``, ``prompt``...)
override the session's configuration for that response, and so does any field OpenAI
adds later until it is listed here."""
_ROLES_UNLOCKED: Final = frozenset({"user", "assistant"})
"""The roles of the items a locked session may add: ``system`` and ``developer`` items
instruct the model as the configuration's ``instructions`` do."""


@attrs.frozen
class Upstream:
    """Where and how to connect: the URL, extra headers, and the API key (never shown,
    nor the headers' values nor the URL's password: any may be a credential)."""

    url: str = attrs.field(repr=lambda url: repr(redact(url)))
    headers: tuple[tuple[str, str], ...] = attrs.field(
        default=(), repr=lambda headers: repr(tuple((name, MASK) for name, _ in headers))
    )
    api_key: str | None = attrs.field(default=None, repr=False)

    def request_headers(self) -> list[tuple[str, str]]:
        headers = list(self.headers)
        if self.api_key:
            headers.append(("Authorization", f"Bearer {self.api_key}"))
        return headers


def parse_header(text: str) -> tuple[str, str]:
    """``NAME: VALUE`` (``--upstream-header``) as a pair; ValueError if it is not one."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or any(c.isspace() for c in name):
        raise ValueError(f"{text!r} is not 'NAME: VALUE'")
    return name, value


def proxy_factory(url: str | None, headers: Sequence[str] = ()) -> EngineFactory:
    """The factory of ``--engine realtime-proxy``; the API key comes from the environment
    (``TRIO_DUPLEX_UPSTREAM_API_KEY``) only. ValueError: no URL, or a bad header."""
    if not url:
        raise ValueError("--engine realtime-proxy needs --upstream URL (ws:// or wss://)")
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"--upstream {url!r} is not a ws:// or wss:// URL")
    upstream = Upstream(url, tuple(map(parse_header, headers)), os.environ.get(API_KEY_ENV))
    # Header values may be credentials too (a tenant key): masked in logs like the key.
    register_secret(upstream.api_key, *(value for _, value in upstream.headers))

    def factory(config: Mapping[str, Any]) -> Engine:
        return RealtimeProxyEngine(upstream, config)

    return factory


class RealtimeProxyEngine(Engine):
    """One session's proxy to its upstream (see the module's docstring)."""

    accepts = CLIENT_EVENTS
    audio_rate: int | None = RATE
    raw_dialects = frozenset({"openai"})

    def __init__(self, upstream: Upstream, config: Mapping[str, Any] | None = None) -> None:
        self.upstream = upstream
        self.config = dict(config or {})
        self._ws: ClientConnection | None = None  # connected by prepare
        self._lost: str | None = None  # why the upstream is gone
        # The item whose audio is playing, (item_id, content_index); its audio bytes
        # sent, and confirmed by the client; (seq, bytes sent through it) of each of its
        # deltas the client has not confirmed yet (the oldest forgotten past MAX_MARKS:
        # a truncate then errs early, never late).
        self._playing: tuple[str, int] | None = None
        self._sent = 0
        self._delivered = 0
        self._marks: deque[tuple[int, int]] = deque(maxlen=MAX_MARKS)

    def check_locked(self, event: Event) -> None:
        """A locked session (a client token's ``session``): refuse ``config_locked`` what
        would reach the upstream as configuration all the same, a per-response override
        or a ``system``/``developer`` item (``session.update`` the server refuses)."""
        kind = event["type"]
        if kind == "conversation.item.create":
            _check_item(event.get("item"), "item")
        elif kind == "response.create" and "response" in event:
            response = event["response"]
            if not isinstance(response, dict):
                raise ConfigLocked("response")
            for key in response:
                if key not in _RESPONSE_UNLOCKED:
                    raise ConfigLocked(f"response.{key}")
            items = response.get("input", [])
            if not isinstance(items, list):
                raise ConfigLocked("response.input")
            for i, item in enumerate(items):
                _check_item(item, f"response.input[{i}]")

    async def prepare(self, nursery: trio.Nursery) -> None:
        """Connect the upstream before the client hears ``session.created``: an upstream
        that refuses (HTTP 401, 429, 503...), cannot be reached or does not answer within
        ``CONNECT_TIMEOUT_S`` refuses the open, retryable (``resource_exhausted``)."""
        try:
            self._ws = await connect(
                self.upstream.url,
                additional_headers=self.upstream.request_headers(),
                open_timeout=CONNECT_TIMEOUT_S,
                close_timeout=CLOSE_TIMEOUT_S,
                ping_interval=PING_INTERVAL_S,
                ping_timeout=PING_INTERVAL_S,
                compression=None,
                proxy=None,
                max_size=MAX_UPSTREAM_MESSAGE_BYTES,
                user_agent_header="trio-duplex-realtime-proxy",
                logger=_WS_LOG,
            ).connect(nursery)
        except InvalidStatus as exc:
            status = exc.response.status_code
            # 401/403: our key or headers are wrong, the operator's to fix (not a client's).
            (log.error if status in (401, 403) else log.warning)(
                "the upstream refused a session: HTTP %d", status
            )
            raise ProtocolError.not_ready(
                f"the upstream refused the session (HTTP {status})"
            ) from None
        except (OSError, WebSocketException, TimeoutError) as exc:
            log.warning("the upstream cannot be reached: %s", _describe(exc))
            raise ProtocolError.not_ready("the upstream cannot be reached") from None

    async def run(self, session: EngineSession) -> None:
        ws = self._ws
        if ws is None:
            raise RuntimeError("RealtimeProxyEngine.run without prepare")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._down, ws, session, nursery.cancel_scope)
                await self._up(ws, session, nursery.cancel_scope)
                nursery.cancel_scope.cancel()  # the session is ending
        except (OSError, WebSocketException) as exc:
            if self._lost is None:
                self._lost = f"upstream connection failed: {_describe(exc)}"
        finally:
            with trio.CancelScope(shield=True):  # bounded by close_timeout
                await ws.aclose()
        if self._lost is not None:
            # A detached client must hear why: the session waits for its resume (its
            # grace still runs), which replays the journal, then ends.
            await session.wait_attached()
            raise UpstreamLost(self._lost)

    async def _up(
        self, ws: ClientConnection, session: EngineSession, lost: trio.CancelScope
    ) -> None:
        """Client events to the upstream, until the session ends (or the upstream does)."""
        raw = session.raw
        spell = upstream_session if raw else _session_fields
        try:
            await ws.send(_json({"type": _UPDATE, "session": spell(self.config)}), text=True)
            while True:
                try:  # on a raw session the upstream's own session.updated answers
                    event = await session.receive(updates=True, answer=not raw)
                except trio.EndOfChannel:
                    return
                kind = event["type"]
                if kind == _APPEND:
                    audio = event["audio"]
                    await ws.send(_json({"type": _APPEND, "audio": _b64(audio)}), text=True)
                    continue
                if kind == _UPDATE:
                    update = {"type": _UPDATE, "session": spell(event["session"])}
                    await ws.send(_json(update), text=True)
                    continue
                event.pop("client_event_seq", None)
                await ws.send(_json(event), text=True)
                if kind == _CANCEL and self._playing is not None and not raw:
                    await ws.send(_json(self._truncate(session)), text=True)
        except (OSError, WebSocketException) as exc:
            self._lose(f"upstream connection failed: {_describe(exc)}", lost)

    async def _down(
        self, ws: ClientConnection, session: EngineSession, lost: trio.CancelScope
    ) -> None:
        """Upstream events to the client, until the upstream connection ends."""
        raw = session.raw
        try:
            while True:
                try:  # (not ``async for``: its generator, left by an error, is never closed)
                    message = await ws.recv()
                except ConnectionClosedOK:
                    break
                event = orjson.loads(message)
                if type(event) is not dict or not isinstance(event.get("type"), str):
                    continue  # not an event: nothing a client could use
                kind = event["type"]
                if kind == _AUDIO_DELTA:
                    # OpenAI's field is ``delta``; trio-duplex's own server (an upstream
                    # too) says ``audio``.
                    delta = event.pop("delta", None)
                    audio = base64.b64decode(
                        event.get("audio", "") if delta is None else delta, validate=True
                    )
                    event["audio"] = audio
                    event.pop("server_event_seq", None)
                    if raw:
                        event.pop("event_id", None)
                    item = (event.get("item_id"), event.get("content_index", 0))
                    await session.send(event)
                    self._track(item, len(audio), session)
                    continue
                if raw:
                    relay = relayed(event, session.config)
                    if relay is not None:
                        await session.send(relay)
                    continue
                if kind in _RENAMED:
                    event["type"] = _RENAMED[kind]
                event.pop("server_event_seq", None)
                await session.send(event)
            code = ws.close_code
            self._lose(f"upstream closed the connection ({code})", lost)
        except (OSError, WebSocketException) as exc:
            self._lose(f"upstream connection failed: {_describe(exc)}", lost)
        except (ValueError, TypeError) as exc:  # not JSON, or a delta that is not base64
            self._lose(f"upstream sent a malformed message: {_describe(exc)}", lost)

    def _lose(self, why: str, scope: trio.CancelScope) -> None:
        if self._lost is None:
            self._lost = why
        scope.cancel()

    def _track(self, item: tuple[Any, Any], size: int, session: EngineSession) -> None:
        """An audio delta of ``item`` was sequenced (``session.sent_seq()`` is its seq)."""
        if not isinstance(item[0], str) or type(item[1]) is not int:
            return
        if item != self._playing:
            self._playing, self._sent, self._delivered = item, 0, 0
            self._marks.clear()
        self._sent += size
        self._marks.append((session.sent_seq(), self._sent))
        self._confirm(session.delivered_seq())

    def _confirm(self, delivered_seq: int) -> None:
        """The playing item's audio up to the client's confirmed seq is delivered."""
        marks = self._marks
        while marks and marks[0][0] <= delivered_seq:
            self._delivered = marks.popleft()[1]

    def _truncate(self, session: EngineSession) -> Event:
        assert self._playing is not None
        self._confirm(session.delivered_seq())
        (item_id, index), self._playing = self._playing, None
        self._marks.clear()
        return {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": index,
            "audio_end_ms": self._delivered // _BYTES_PER_MS,
        }


def _session_fields(config: Mapping[str, Any]) -> Event:
    """The native client's configuration as the upstream's ``session``: as it is, but for
    ``audio``, ours (the client's wire format, settled by the server), never sent up: the
    upstream's own audio format is left at its default, 24 kHz PCM16."""
    fields = {k: v for k, v in config.items() if k != "audio"}
    fields.setdefault("type", "realtime")
    return fields


def _check_item(item: object, where: str) -> None:
    """An item of a locked session: a message only as the user or the assistant."""
    if isinstance(item, dict) and "role" in item:
        role = item["role"]
        if not isinstance(role, str) or role not in _ROLES_UNLOCKED:
            raise ConfigLocked(f"{where}.role")


def _json(event: Event) -> bytes:
    return orjson.dumps(event)  # sent as a text message (``text=True``): UTF-8 already


def _b64(audio: bytes | str) -> str:
    return audio if isinstance(audio, str) else base64.b64encode(audio).decode("ascii")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
