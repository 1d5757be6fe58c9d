"""The ``realtime-proxy`` engine on a session that speaks OpenAI's dialect: a transparent relay.

The client and the upstream speak the same wire (OpenAI Realtime GA), so the proxy
relays the upstream's events with their own names and fields: nothing is renamed
``upstream.*`` and the server does not shape them (``Engine.raw_dialects``). What the
relay still changes, and why:

- ``event_id``: the server gives its own (``event_<server_event_seq>``), the same text
  journaled and replayed; the upstream's would repeat nothing the client can use.
- The upstream's ``session.created`` is dropped: the client heard the server's own on
  the upgrade (with the ``resume`` object), and the upstream's session object reaches it
  in the ``session.updated`` that answers the proxy's first ``session.update``.
- ``session.updated``: its ``audio.input.format`` / ``audio.output.format`` become the
  client's own (the server converts to and from the upstream's 24 kHz PCM16).
- ``error``: journaled like the rest (a client that was away hears it on resume); its
  ``error`` object's fields are handed to the dialect's writer, which spells it again.
- Our extension names (``session.closed``, ``session.going_away``... from trio-duplex's
  own server as the upstream) are renamed ``upstream.*``: the client's own would be
  mistaken for them. OpenAI's upstreams never send them.

Up, the canonical configuration becomes OpenAI's session object (the dialect flattened
``audio.input.turn_detection`` into ``turn_detection``, ...): see ``upstream_session``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..core.events import CONTROL_EVENTS, EventType

Event = dict[str, Any]

_NESTED: Final = {
    "turn_detection": ("input", "turn_detection"),
    "input_audio_transcription": ("input", "transcription"),
    "input_audio_noise_reduction": ("input", "noise_reduction"),
    "voice": ("output", "voice"),
    "speed": ("output", "speed"),
}
"""Canonical configuration keys that OpenAI's GA session nests under ``audio``."""
_NOT_SENT: Final = frozenset({"audio", "model", "type", "object", "id"})
"""``audio`` is ours (the client's wire format: the upstream keeps 24 kHz PCM16);
``model`` is the upstream URL's (``--upstream ...?model=``: a live session's model
cannot change); the others name a session, they do not configure it."""
_FORMATS: Final = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
_OPUS: Final = "audio/opus"  # our extension
_RENAMED: Final = {
    str(kind): f"upstream.{kind}"
    for kind in CONTROL_EVENTS
    if kind not in (EventType.ERROR, EventType.CREATED)
}
_CREATED: Final = str(EventType.CREATED)
_UPDATED: Final = str(EventType.UPDATED)
_ERROR: Final = str(EventType.ERROR)


def upstream_session(config: Mapping[str, Any]) -> Event:
    """The canonical configuration (or an update's fields) as OpenAI's session object."""
    session: Event = {"type": "realtime"}
    audio: dict[str, dict[str, Any]] = {}
    for key, value in config.items():
        if key in _NOT_SENT:
            continue
        nested = _NESTED.get(key)
        if nested is None:
            session[key] = value
        else:
            audio.setdefault(nested[0], {})[nested[1]] = value
    if audio:
        session["audio"] = audio
    return session


def openai_format(canonical: object) -> dict[str, Any] | None:
    """Our ``{format, rate}`` as OpenAI's format object; None for what is not one."""
    if not isinstance(canonical, Mapping):
        return None
    fmt, rate = canonical.get("format"), canonical.get("rate")
    if fmt == "pcm16":
        return {"type": "audio/pcm", "rate": rate}
    if fmt == "opus":
        return {"type": _OPUS, "rate": rate}
    kind = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    return None if kind is None else {"type": kind}


def relayed(event: Event, config: Mapping[str, Any]) -> Event | None:
    """One upstream event (not an audio delta) as the client gets it; None: dropped."""
    kind = event["type"]
    event.pop("event_id", None)
    event.pop("server_event_seq", None)
    if kind == _CREATED:
        return None
    if kind == _UPDATED:
        _client_formats(event, config)
    elif kind == _ERROR:
        return _error(event)
    elif kind in _RENAMED:
        event["type"] = _RENAMED[kind]
    return event


def _client_formats(event: Event, config: Mapping[str, Any]) -> None:
    session, audio = event.get("session"), config.get("audio")
    if not isinstance(session, dict) or not isinstance(audio, Mapping):
        return
    for direction in ("input", "output"):
        fmt = openai_format(audio.get(direction))
        if fmt is None:
            continue
        upstream_audio = session.setdefault("audio", {})
        if not isinstance(upstream_audio, dict):
            return
        side = upstream_audio.setdefault(direction, {})
        if isinstance(side, dict):
            side["format"] = fmt


def _error(event: Event) -> Event:
    """OpenAI's ``{error: {type, code, message, param, event_id, ...}}`` as the canonical
    error (its fields flat) that the dialect's writer nests again: the same fields, but
    ``error.type``, which the writer gives (``invalid_request_error``)."""
    error = event.get("error")
    fields = {k: v for k, v in error.items() if k != "type"} if isinstance(error, dict) else {}
    message = fields.get("message")
    return {
        **fields,
        "type": _ERROR,
        "code": fields.get("code"),
        "message": message if isinstance(message, str) else "",
        "param": fields.get("param"),
        "event_id": fields.get("event_id"),
    }
