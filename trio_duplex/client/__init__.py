"""The trio-duplex client: one resumable session over any number of connections.

::

    async with trio_duplex.client.connect("ws://127.0.0.1:8765/v1/duplex") as session:
        await session.send({"type": "input.text.append", "text": "hello"})
        async for event in session:
            print(event)

* ``state``: ``SessionState``, the client side of the protocol with no I/O (sans-IO);
  ``errors`` and ``options``: what it raises, and its options and policies; ``urls``:
  which of several server URLs (a cluster's nodes) each connection attempt uses.
* ``dialect``: how each wire (``native`` on ``/v1/duplex``, ``openai`` on
  ``/v1/realtime``) spells what the client reads and writes itself (``connect``'s
  ``dialect``).
* ``session``: ``ClientSession`` and ``connect``, the trio shell around it;
  ``transport``: what that shell needs around its websockets connection.
* ``terminal``: ``trio-duplex connect``, an interactive terminal client.
"""

from .errors import (
    ClientError,
    EventTooLarge,
    ProtocolViolation,
    ReconnectFailed,
    ResumeRefused,
    ServerRefused,
    SessionEnded,
    SessionReplaced,
)
from .options import (
    AckPolicy,
    Attached,
    ClientOptions,
    ConnectionChange,
    Disconnected,
    HeartbeatPolicy,
    Limits,
    ReconnectPolicy,
    ResumeState,
    Retrying,
)
from .session import (
    ClientSession,
    StreamFactories,
    StreamFactory,
    connect,
)
from .state import (
    SessionState,
    Verdict,
)
from .transport import audio_bytes

__all__ = [
    "AckPolicy",
    "Attached",
    "ClientError",
    "ClientOptions",
    "ClientSession",
    "ConnectionChange",
    "Disconnected",
    "EventTooLarge",
    "HeartbeatPolicy",
    "Limits",
    "ProtocolViolation",
    "ReconnectFailed",
    "ReconnectPolicy",
    "ResumeRefused",
    "ResumeState",
    "Retrying",
    "ServerRefused",
    "SessionEnded",
    "SessionReplaced",
    "SessionState",
    "StreamFactories",
    "StreamFactory",
    "Verdict",
    "audio_bytes",
    "connect",
]
