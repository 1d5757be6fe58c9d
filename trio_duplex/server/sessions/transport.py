"""``MessageTransport``: what the session shell asks of a connection's transport.

The shell (``Connection``, ``Opener``, the runner, the cluster's relays) speaks to a
client through messages, text as ``str`` and binary as ``bytes``, never through the
bytes of a socket. This is every member it uses, so that something other than a
WebSocket (``server/calls/channel.py``'s ``CallChannel``: one WebRTC call) can carry a
session unchanged. ``WebSocket`` (websocket.py) is the reference: it conforms as it is,
and mypy checks that it does wherever a WebSocket is handed to the shell.

The rules every transport keeps (the WebSocket's, docs/protocol.md):

- Reading: ``get_message`` raises ``ConnectionClosed`` once the peer is gone;
  ``peer_gone`` says so without awaiting.
- Writing: ``write_now`` and its kin never await and may be called only when
  ``can_write_now()``; what they could not finish leaves ``unsent`` true until ``flush``,
  and a failure leaves ``broken`` true. ``send_message``/``send_many`` wait their turn and
  raise ``ConnectionClosed`` once nothing more can be sent. A write the peer does not
  take within the transport's write timeout breaks it: nothing waits for ever.
- While a session opens, ``start_watching``/``watch``/``stop_watching`` follow the peer in
  a task of its own and ``read_now``/``reply_now`` look without awaiting (the handshake
  rule: a session whose ``session.created`` did not reach a peer still there is not
  delivered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol


class MessageTransport(Protocol):
    """One client's connection, as the session shell uses it."""

    @property
    def peer(self) -> str | None:
        """The client's IP address, if it has one (logs, the failed-resume count)."""
        ...

    @property
    def max_message_bytes(self) -> int:
        """The largest message read from now on (the first message's bound, then the
        session's ``max_event_bytes``)."""
        ...

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None: ...

    def report_fault(self, fault: str) -> None:
        """Log a fault of the client's (its first one only, at the fault log's rate)."""
        ...

    # -- reading

    async def get_message(self) -> str | bytes:
        """The next message; ``ConnectionClosed`` once the peer is gone."""
        ...

    async def get_messages(self) -> list[str | bytes]:
        """Every message that has arrived and was not served yet (at least one)."""
        ...

    @property
    def peer_gone(self) -> bool:
        """Is the peer gone (closed, ended or broken), as seen so far?"""
        ...

    # -- while a session opens

    def start_watching(self) -> None:
        """``watch`` is about to run in a task of its own."""
        ...

    async def watch(self, gone: Callable[[], None]) -> None:
        """Follow the peer until ``stop_watching``; call ``gone`` once it is gone."""
        ...

    def stop_watching(self) -> None:
        """End ``watch``; never awaits."""
        ...

    def read_now(self) -> list[bytes]:
        """Take in what has arrived, without awaiting; the replies it calls for."""
        ...

    def reply_now(self, replies: list[bytes]) -> None:
        """Write ``read_now``'s replies without awaiting."""
        ...

    # -- writing

    async def send_message(self, message: str | bytes) -> None:
        """Send one message, after the writes that came first."""
        ...

    async def send_many(self, messages: Iterable[str | bytes]) -> None:
        """Send several messages, in order."""
        ...

    def can_write_now(self) -> bool:
        """May ``write_now`` (and its kin) be called now?"""
        ...

    def write_now(self, message: str | bytes) -> None:
        """Write one message without awaiting (only when ``can_write_now()``)."""
        ...

    def write_many_now(self, messages: list[str | bytes]) -> None:
        """``write_now`` for several messages."""
        ...

    def write_frames_now(self, frames: bytes) -> None:
        """``write_now`` for WebSocket frames a server encoded already (the pooled
        relay's front passes its home's on as they are)."""
        ...

    @property
    def unsent(self) -> bool:
        """Did a ``write_now`` leave part of its message for ``flush``?"""
        ...

    @property
    def broken(self) -> bool:
        """A write failed, was cancelled or timed out: nothing more can be sent."""
        ...

    async def flush(self) -> None:
        """Finish what ``write_now`` left; raises once ``broken``."""
        ...

    async def ping(self) -> None:
        """A keepalive: returns once the peer has shown it is there."""
        ...

    def playout_fenced(self, fenced: bool) -> None:
        """The session's runner fenced this connection off (a migration's freeze:
        nothing more it sends is taken) or, the migration given up, took it back. A
        transport that plays audio out stops (and drops) what it has not played yet
        (a telephony call's ``clear``); the others do nothing."""
        ...

    async def aclose(self, code: int, reason: str = "") -> None:
        """Close with ``code`` and wait for the peer's side of it (bound it with a
        deadline: a dead peer never answers)."""
        ...


__all__ = ["MessageTransport"]

if TYPE_CHECKING:  # the reference transport conforms (mypy checks it here)
    from .websocket import WebSocket

    _WEBSOCKET: type[MessageTransport] = WebSocket
