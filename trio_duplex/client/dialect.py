"""How each wire dialect spells what the client reads and writes itself: the one place
in the client that knows the difference.

* ``native`` (``/v1/duplex``, docs/protocol.md): the client speaks first, with
  ``session.update`` (a new session) or ``session.resume``; ``session.created`` carries
  the session id, resume token and limits at its top level; errors are flat.
* ``openai`` (``/v1/realtime``, the OpenAI Realtime GA wire with our resume extension,
  docs/openai.md): the server speaks first. A new session's upgrade opens it and
  ``session.created`` carries a top-level ``resume`` object (``session_id``,
  ``resume_token``, ``attachment_generation``, ``limits``); the client then sends its
  configuration, if it has one, as a ``session.update`` (an ordinary client event:
  numbered, resent until read). A resume is the upgrade
  ``?resume=ID&last_received_server_event_seq=N`` with the resume token as the bearer
  credential. Errors nest their fields in ``error``; output audio is base64 ``delta``.

Everything else (acks, heartbeats, ``client_event_seq``, ``session.going_away``,
``session.resync_required``, ``input.consumed``, the binary lane) is spelt alike.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol

import attrs

from ..core import events
from ..core.events import DEFAULT_PATH, EventType
from ..dialects.jsonwire import encode

Event = dict[str, Any]
DialectName = Literal["native", "openai"]

OPENAI_PATH: Final = "/v1/realtime"
_OPENAI_FORMATS: Final = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
    "opus": "audio/opus",
}
"""Our audio formats (``trio_duplex.audio.FORMATS``) by OpenAI's ``format.type``."""
_OUR_FORMATS: Final = {v: k for k, v in _OPENAI_FORMATS.items()}
_OPENAI_RATES: Final = {"audio/pcm": 24_000, "audio/pcmu": 8_000, "audio/pcma": 8_000}


@attrs.frozen
class Handshake:
    """What ``session.created`` / ``session.resumed`` says, whichever its spelling."""

    session_id: object
    resume_token: object
    generation: object
    limits: object = None
    session: object = None


class ClientDialect(Protocol):
    @property
    def name(self) -> DialectName: ...

    @property
    def path(self) -> str:
        """The path of a URL given without one."""
        ...

    @property
    def subprotocols(self) -> tuple[str, ...] | None:
        """What the upgrade offers (None: nothing)."""
        ...

    @property
    def output_audio_field(self) -> str:
        """The field of ``response.output_audio.delta`` that holds its audio (bytes, for
        a binary-lane message)."""
        ...

    def opening_url(self, url: str, resume: tuple[str, int] | None) -> str:
        """The URL a connection dials: ``url``, or for a resume of session ``resume[0]``
        from seq ``resume[1]`` what that dialect's resume needs of it."""
        ...

    def opening_frame(self, config: Event, resume: tuple[str, str, int] | None) -> str | None:
        """The client's first frame of a connection (None: the server speaks first)."""
        ...

    def first_update(self, config: Mapping[str, Any]) -> Event | None:
        """The event queued (numbered, before anything else) to configure a new session
        after the server opened it; None: nothing (the opening frame carried it)."""
        ...

    def handshake(self, event: Mapping[str, Any]) -> Handshake: ...

    def error(self, event: Mapping[str, Any]) -> Mapping[str, Any]:
        """An ``error`` event's fields (``code``, ``message``, ``client_event_seq``,
        ``retryable``, ...) as one flat mapping."""
        ...

    def full_update(self, event: Mapping[str, Any]) -> Event | None:
        """The whole configuration ``session.updated`` states, if it states it whole."""
        ...

    def text_turn(self, text: str) -> list[Event]:
        """The client events of a typed user turn that asks for an answer."""
        ...

    def audio_request(self, wire: str | None, fmt: str | None, rate: int | None) -> Event:
        """``session.audio`` asking for this lane and format both ways (empty: none)."""
        ...

    def audio_format(self, config: Mapping[str, Any], side: str) -> tuple[str, int] | None:
        """The format (one of ``trio_duplex.audio.FORMATS``) and rate of ``side``
        (``input``/``output``) in the session's configuration as the server states it."""
        ...


def _audio_field(event: Mapping[str, Any]) -> str:
    return "delta" if "audio" not in event and "delta" in event else "audio"


def audio_payload(event: Mapping[str, Any]) -> object:
    """The audio field of an ``input_audio_buffer.append`` (``audio`` in both dialects)
    or a ``response.output_audio.delta`` (``audio`` natively, ``delta`` in OpenAI's)."""
    return event.get(_audio_field(event))


def text_of(event: Mapping[str, Any]) -> str | None:
    """The text of a text or transcript delta (``text`` natively, ``delta`` in OpenAI's)."""
    kind = str(event.get("type"))
    if not kind.endswith(("text.delta", "transcript.delta")):
        return None
    value = event.get("text", event.get("delta"))
    return value if isinstance(value, str) else None


@attrs.frozen
class Native:
    name: DialectName = "native"
    path: str = DEFAULT_PATH
    subprotocols: tuple[str, ...] | None = None
    output_audio_field: str = "audio"

    def opening_url(self, url: str, resume: tuple[str, int] | None) -> str:
        return url

    def opening_frame(self, config: Event, resume: tuple[str, str, int] | None) -> str | None:
        if resume is None:
            return encode(events.update(config))
        return encode(events.resume(*resume))

    def first_update(self, config: Mapping[str, Any]) -> Event | None:
        return None

    def handshake(self, event: Mapping[str, Any]) -> Handshake:
        return Handshake(
            event.get("session_id"),
            event.get("resume_token"),
            event.get("attachment_generation"),
            event.get("limits"),
            event.get("session"),
        )

    def error(self, event: Mapping[str, Any]) -> Mapping[str, Any]:
        return event

    def full_update(self, event: Mapping[str, Any]) -> Event | None:
        return None  # natively session.updated states the fields an update set

    def text_turn(self, text: str) -> list[Event]:
        return [{"type": "input.text.append", "text": text}]

    def audio_request(self, wire: str | None, fmt: str | None, rate: int | None) -> Event:
        request: Event = {} if wire is None else {"wire": wire}
        side: Event = {}
        if fmt is not None:
            side["format"] = fmt
        if rate is not None:
            side["rate"] = rate
        if side:
            request["input"], request["output"] = dict(side), dict(side)
        return request

    def audio_format(self, config: Mapping[str, Any], side: str) -> tuple[str, int] | None:
        audio = config.get("audio")
        granted = audio.get(side) if isinstance(audio, dict) else None
        if isinstance(granted, dict):
            kind, rate = granted.get("format"), granted.get("rate")
            if isinstance(kind, str) and type(rate) is int:
                return kind, rate
        return None


@attrs.frozen
class OpenAI:
    name: DialectName = "openai"
    path: str = OPENAI_PATH
    subprotocols: tuple[str, ...] | None = ("realtime",)
    output_audio_field: str = "delta"

    def opening_url(self, url: str, resume: tuple[str, int] | None) -> str:
        if resume is None:
            return url
        parts = urllib.parse.urlsplit(url)
        query = [
            (k, v)
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            if k not in ("resume", "last_received_server_event_seq")
        ]
        query += [("resume", resume[0]), ("last_received_server_event_seq", str(resume[1]))]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))

    def opening_frame(self, config: Event, resume: tuple[str, str, int] | None) -> str | None:
        return None  # the upgrade opens (or, with ?resume=, resumes) the session

    def first_update(self, config: Mapping[str, Any]) -> Event | None:
        if not config:
            return None
        return {"type": EventType.UPDATE, "session": {"type": "realtime", **config}}

    def handshake(self, event: Mapping[str, Any]) -> Handshake:
        if event.get("type") != EventType.CREATED:  # session.resumed: spelt natively
            return Native().handshake(event)
        resume = event.get("resume")
        found: Mapping[str, Any] = resume if isinstance(resume, dict) else {}
        return Handshake(
            found.get("session_id"),
            found.get("resume_token"),
            found.get("attachment_generation"),
            found.get("limits"),
            event.get("session"),
        )

    def error(self, event: Mapping[str, Any]) -> Mapping[str, Any]:
        nested = event.get("error")
        return nested if isinstance(nested, dict) else {}

    def full_update(self, event: Mapping[str, Any]) -> Event | None:
        session = event.get("session")
        return session if isinstance(session, dict) else None

    def text_turn(self, text: str) -> list[Event]:
        content = [{"type": "input_text", "text": text}]
        item = {"type": "message", "role": "user", "content": content}
        return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]

    def audio_request(self, wire: str | None, fmt: str | None, rate: int | None) -> Event:
        request: Event = {} if wire is None else {"wire": wire}
        if fmt is not None or rate is not None:
            found: Event = {"type": _OPENAI_FORMATS[fmt or "pcm16"]}
            if rate is not None:
                found["rate"] = rate
            request["input"], request["output"] = {"format": found}, {"format": dict(found)}
        return request

    def audio_format(self, config: Mapping[str, Any], side: str) -> tuple[str, int] | None:
        audio = config.get("audio")
        granted = audio.get(side) if isinstance(audio, dict) else None
        found = granted.get("format") if isinstance(granted, dict) else None
        if not isinstance(found, dict) or found.get("type") not in _OUR_FORMATS:
            return None
        kind = found["type"]
        rate = found.get("rate", _OPENAI_RATES.get(kind, 48_000))
        return (_OUR_FORMATS[kind], rate) if type(rate) is int else None


NATIVE: Final = Native()
OPENAI: Final = OpenAI()
DIALECTS: Final[Mapping[str, ClientDialect]] = {"native": NATIVE, "openai": OPENAI}


def dialect_named(name: str | ClientDialect) -> ClientDialect:
    """``native`` or ``openai`` (or a dialect itself); ValueError for another name."""
    if not isinstance(name, str):
        return name
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"dialect must be one of {sorted(DIALECTS)}, not {name!r}") from None
