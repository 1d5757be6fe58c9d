"""Resume on any node (issue 13): a ``session.resume`` relayed to the session's home.

A resume that reaches a node which does not hold the session, while the store says a
live node does, is relayed: this node (the front) opens a WebSocket to the home's relay
endpoint (``RELAY_PATH`` on the home's advertised address), signed with the cluster's
shared secret, sends the client's ``session.resume`` there, and from then on copies every
message both ways, text and binary, until either side closes; the home's close code is
the client's. The home runs an ordinary resume, so the client sees exactly the protocol
of a direct one: ``session.resumed``, the replay, fencing, takeover, close codes.

The signature (``X-Trio-Duplex-Relay: v1 FROM TO SESSION TIME MAC``) is an HMAC-SHA256,
under the secret, of the sending and receiving node ids, the session id and the wall
clock time in seconds; the home takes it only if it names the home itself, is at most
``MAX_SKEW_S`` old (or early), and its MAC matches, compared in constant time. A relayed
connection may only resume the session it names. Anything else on the relay path gets
403. The secret is never logged nor in any ``repr``.

Bounds: the home must answer the upgrade within the handshake timeout; each message is
at most ``max_message_bytes`` either way (client to home: the session's
``max_event_bytes``); each write waits at most the write timeout; one message is in
flight each way, and the client's side is paced by its connection's outbox.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.trio.client import ClientConnection, connect

from ..core.frames import CloseCode
from .connection import Connection
from .websocket import ConnectionClosed as ClientGone

log = logging.getLogger("trio_duplex")


class _Redacting(logging.LoggerAdapter[logging.Logger]):
    """websockets logs every request header at DEBUG: not the relay's signature."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg == "> %s: %s" and args and str(args[0]).lower() == HEADER.lower():
            args = (args[0], "<redacted>")
        super().log(level, msg, *args, **kwargs)


_LOG = _Redacting(logging.getLogger("websockets.client"), {})

RELAY_PATH = "/trio-duplex/relay"
"""Where a node takes relayed resumes (on its main listener, or on ``--relay-port``)."""
HEADER = "X-Trio-Duplex-Relay"
MAX_SKEW_S = 60.0
"""How far apart two nodes' wall clocks may be for a signature to hold."""
MAX_RELAYED_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message the home may send through a relay (an engine's event)."""

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""Node ids (the store's rule) and the session ids a relay carries (ours are sess_HEX)."""

_UNSENDABLE = frozenset({1005, 1006, 1015})
"""Close codes that describe a close but may not be sent in one."""


def relayable(session_id: object) -> bool:
    """Could ``session_id`` be a session of ours (worth a look in the store)?"""
    return isinstance(session_id, str) and _ID.fullmatch(session_id) is not None


def _mac(secret: str, sender: str, receiver: str, session_id: str, when: int) -> str:
    message = f"v1\n{sender}\n{receiver}\n{session_id}\n{when}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(secret: str, sender: str, receiver: str, session_id: str, now: float) -> str:
    """The relay header's value for a resume of ``session_id`` from ``sender`` to
    ``receiver``, at wall clock time ``now``."""
    when = int(now)
    mac = _mac(secret, sender, receiver, session_id, when)
    return f"v1 {sender} {receiver} {session_id} {when} {mac}"


def verify(secret: str, value: str | None, receiver: str, now: float) -> str | None:
    """The session id a relay header lets ``receiver`` resume, or None: missing,
    malformed, for another node, too old or too early, or not signed with ``secret``."""
    if value is None:
        return None
    parts = value.split(" ")
    if len(parts) != 6 or parts[0] != "v1":
        return None
    _, sender, to, session_id, when, mac = parts
    if not (_ID.fullmatch(sender) and _ID.fullmatch(session_id) and when.isdigit()):
        return None
    # The MAC is compared whatever else is wrong, so timing tells nothing about it.
    good = hmac.compare_digest(mac, _mac(secret, sender, to, session_id, int(when)))
    if not good or to != receiver or abs(now - int(when)) > MAX_SKEW_S:
        return None
    return session_id


def relay_url(advertised: str) -> str:
    """The relay endpoint on the node advertised at ``advertised`` (its scheme, host
    and port; the path is ours)."""
    parts = urlsplit(advertised)
    return urlunsplit((parts.scheme, parts.netloc, RELAY_PATH, "", ""))


async def relay(
    conn: Connection,
    first: str,
    *,
    home: str,
    url: str,
    header: str,
    connect_timeout_s: float,
    write_timeout_s: float,
) -> bool:
    """Relay ``conn``, whose first message ``first`` is a ``session.resume``, to the home
    node ``home`` advertised at ``url``, until either side closes. Returns False (nothing
    sent to the client) if the home could not be reached or refused the upgrade: the
    caller answers ``unreachable``. Once relayed, ``conn`` is finished with the home's
    close code, or 1001 if the home's connection broke (the client resumes again)."""
    connected = False
    try:
        async with connect(
            relay_url(url),
            additional_headers={HEADER: header},
            compression=None,
            proxy=None,
            ping_interval=None,  # the home pings; websockets answers
            open_timeout=connect_timeout_s,
            close_timeout=connect_timeout_s,
            max_size=MAX_RELAYED_MESSAGE_BYTES,
            user_agent_header="trio-duplex-relay",
            logger=_LOG,
        ) as upstream:
            connected = True
            await _copy(conn, upstream, first, write_timeout_s)
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status == 403:
            log.error(
                "relay to node %s refused (403): do the nodes share --cluster-secret, and "
                "agree on the time within %ss?",
                home,
                MAX_SKEW_S,
            )
        else:
            log.warning("relay to node %s refused: HTTP %s", home, status)
        return False
    except (OSError, WebSocketException, TimeoutError) as exc:
        if connected:  # its close went wrong: the relay is over all the same
            conn.finish([], CloseCode.GOING_AWAY)
            return True
        log.warning("relay to node %s at %s failed: %s", home, url, str(exc) or type(exc).__name__)
        return False
    return True


async def _copy(conn: Connection, upstream: ClientConnection, first: str, write_s: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_down, conn, upstream, nursery.cancel_scope)
        try:
            with trio.fail_after(write_s):
                await upstream.send(first)
            while True:
                message = await conn.ws.get_message()
                with trio.fail_after(write_s):
                    await upstream.send(message)
        except ConnectionClosed:
            return  # the home closed: _down hears how, tells the client, and ends
        except (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client is gone: closing upstream detaches the session at home
        except trio.TooSlowError:
            log.warning("relay: the home did not read within %ss; relay cut", write_s)
        nursery.cancel_scope.cancel()


async def _down(conn: Connection, upstream: ClientConnection, done: trio.CancelScope) -> None:
    """Home to client, message for message, then the home's close code."""
    code: int = CloseCode.GOING_AWAY
    try:
        while True:
            message = await upstream.recv()
            conn.push(message)
            while conn.congested and conn.close_code is None:
                await conn.wait_drained()
    except ConnectionClosed as exc:
        received = exc.rcvd
        if received is not None:
            code = CloseCode.NORMAL if received.code in _UNSENDABLE else received.code
    finally:
        conn.finish([], code)
        done.cancel()


__all__ = [
    "HEADER",
    "RELAY_PATH",
    "relay",
    "relay_url",
    "relayable",
    "sign",
    "verify",
]
