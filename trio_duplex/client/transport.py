"""What the client needs around the ``websockets`` connection it runs on: which errors
are worth another attempt, how a loss is described, how a server frame is parsed, and
a logger adapter that keeps a benign websockets race out of the user's terminal."""

from __future__ import annotations

import binascii
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

import trio
from websockets.exceptions import ConnectionClosed, WebSocketException

from ..core.events import EventType
from ..core.wire import ProtocolError
from ..dialects import binary
from .dialect import audio_payload

Event = dict[str, Any]


class WebsocketsLog(logging.LoggerAdapter[logging.Logger]):
    """websockets 17.4's trio connection logs "unexpected internal error" (EOFError) when a
    failed send closes the stream while its reader is mid-batch: a benign race on a
    connection that is ending anyway (what it carried is replayed by the resume).
    Demoted to DEBUG so a terminal does not show a traceback for an ordinary cut.

    At DEBUG websockets logs every request header: the ``Authorization`` one (an API
    key, a resume token) is redacted."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg == "unexpected internal error" and isinstance(sys.exc_info()[1], EOFError):
            level, msg, args, kwargs = logging.DEBUG, "connection ended mid-batch", (), {}
        elif msg == "> %s: %s" and args and str(args[0]).lower() == "authorization":
            args = (args[0], "<redacted>")
        super().log(level, msg, *args, **kwargs)


WEBSOCKETS_LOG = WebsocketsLog(logging.getLogger("websockets.client"), {})

TRANSIENT = (
    OSError,  # refused, reset, unreachable
    TimeoutError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    WebSocketException,  # a cut handshake (InvalidMessage), a close (ConnectionClosed), ...
)
"""What one connection attempt may fail with and another may not. Attempts are bounded
by ReconnectPolicy, so a permanent problem misread as transient still ends."""


def parse_event(message: str) -> Event | None:
    try:
        event = json.loads(message)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    return event


def audio_event(message: bytes, field: str = "audio") -> Event | None:
    """A binary message from the server (protocol v2's audio lane) as the event it
    stands for: ``response.output_audio.delta`` with its ``server_event_seq`` and the raw
    payload as ``field`` (``bytes``; the dialect's name for it). None if it is not a
    well-formed kind-2 message."""
    try:
        kind, seq, payload = binary.parse(message)
    except ProtocolError:
        return None
    if kind != binary.OUTPUT_AUDIO:
        return None
    return {"type": EventType.OUTPUT_AUDIO_DELTA, "server_event_seq": seq, field: payload}


def audio_bytes(event: Mapping[str, Any]) -> bytes | None:
    """The audio of an ``input_audio_buffer.append`` or ``response.output_audio.delta``
    event as bytes, whichever lane it came on (raw on the binary lane, base64 in JSON)
    and whichever dialect spelt it; None if it has none or it is not valid base64."""
    audio = audio_payload(event)
    if isinstance(audio, bytes):
        return audio
    if not isinstance(audio, str):
        return None
    try:
        return binascii.a2b_base64(audio, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        if exc.rcvd is not None:
            reason = f" {exc.rcvd.reason}" if exc.rcvd.reason else ""
            return f"closed by the server: {exc.rcvd.code}{reason}"
        return "connection lost"
    if isinstance(exc, TimeoutError | trio.TooSlowError):
        return "timed out"
    if isinstance(exc, OSError):
        return _describe_os_error(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _describe_os_error(exc: OSError) -> str:
    """``connection refused``, not ``OSError: all attempts to connect to ... failed``:
    trio's open_tcp_stream raises that one from a group of each address's error."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror})"
    causes = exc.__cause__
    if isinstance(causes, BaseExceptionGroup):
        leaves = [e for e in _leaves(causes) if isinstance(e, OSError)]
        if leaves:
            exc = next((e for e in leaves if isinstance(e, ConnectionRefusedError)), leaves[0])
    if exc.errno:  # the plain text: trio's strerror also names the address tried
        text = os.strerror(exc.errno)
        return text[:1].lower() + text[1:]
    return str(exc) or type(exc).__name__


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found
