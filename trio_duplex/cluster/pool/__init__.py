"""The pooled relay (docs/cluster.md, "The relay"): long-lived, mutually authenticated
peer connections between nodes, each carrying many relayed client connections.

A front node relays a resume of a session held elsewhere over a *peer connection* to
the session's home: at most ``MAX_LINKS_PER_HOME`` per home node, dialled on first
need, kept while they carry channels and closed once idle for ``IDLE_S``. Each carries
up to ``MAX_CHANNELS`` *channels*, one per relayed client connection.

Authentication. A peer connection is an HTTP upgrade to the home's relay endpoint,
signed once as a relayed resume is (relay.py: ``X-Trio-Duplex-Relay: p1 FROM TO TIME
NONCE MAC``, its own label in the MAC, the nonce never taken twice), and the home's 101
proves it holds the secret (``X-Trio-Duplex-Relay-Proof``) before the front sends
anything. After the 101 both sides speak the framing below on the stream (TCP or TLS),
never WebSocket frames. Each channel names the one session it may resume: the home
serves it with the grant of a relayed resume of that session (``Grant(resume_of=...,
relayed=True)``), whose token it checks as for any resume.

Mixed releases (a rolling deploy). A home of a release before the pool refuses the
pooled upgrade with a 403 that carries no proof header (its endpoint knows only the
per-resume ``v2`` request): the front then relays to it per resume (relay.py's
``relay``, which proves the secret on its own), and remembers so for ``PER_RESUME_S``
(at most ``MAX_PER_RESUME_HOMES`` homes) before it tries the pool again. Nothing else
makes it fall back: a 101 without the right proof is a node without the secret, and
nothing is sent to it.

Framing. Every frame is a 9-byte head, ``kind`` (1 byte), ``channel`` (4), ``length``
(4), all big-endian, then ``length`` bytes:

- ``OPEN`` (front to home): ``SESSION DIALECT`` in ASCII; channel ids only increase;
- ``DATA``: bytes of the channel's WebSocket stream, as a client and a server connected
  directly would exchange them after the upgrade (client frames, masked, towards the
  home; the home's frames towards the front), so that the home runs its ordinary
  connection code on the channel (``HomeChannel``, a ``trio.abc.HalfCloseableStream``);
- ``CREDIT``: 4 bytes, more of the channel's window given back;
- ``EOF``: nothing more from the sender on the channel; ``RESET``: the channel is
  abandoned (a broken connection);
- ``PING``, ``PONG`` (channel 0): 8 bytes, the peer connection's keepalive.

Bounds. Each direction of a channel has a window of ``WINDOW`` bytes: the sender sends
no more than the receiver has given credit for, and the receiver gives credit back as
its consumer takes bytes (the home's connection reads them; the front's client is
written to without congestion), so a slow client holds only its own channel's window,
never the peer connection. A peer that sends past a window, or a frame longer than
``MAX_FRAME``, breaks the rules: the peer connection is cut. Bytes queued for one peer
connection are bounded (``OUT_LIMIT``, plus one frame): a sender waits for room; the
writer sends everything queued in one write per wake-up, each write within the write
timeout. A message from the home to a client is at most ``MAX_RELAYED_MESSAGE_BYTES``.

Per event, the front does little: what one read of its client brings goes to the home
as one DATA frame (``WebSocket.get_messages``), and the home's frames go to the client
as they came, checked but never decoded (``ServerFrames.scan``: a malformed frame cuts
the relay, a close ends it), everything one read of the peer connection brought for a
client in one write (``Connection.push_frames``, after ``Link.defer``).

Failure. A peer connection that breaks (the peer died, a write not taken within the
write timeout, nothing heard for ``PEER_TIMEOUT_S`` while pinging every
``PING_INTERVAL_S``, a rule broken) breaks every channel on it: on the front, each
client connection ends 1001 as when a home dies (or, if the home had said nothing yet,
the client is told ``session_home_unreachable``); on the home, each channel's stream
raises ``BrokenResourceError`` and the session detaches as on any lost connection.

Modules: ``framing`` (the frame kinds, heads and bounds, sans-IO), ``ws_frames`` (the
WebSocket frames a channel carries, sans-IO), ``link`` (one peer connection, either
side: writer, reader, keepalive), ``channel`` (a channel's credit and end, either
side), ``front`` (a channel feeding a client connection, and ``relay``), ``home`` (the
home's side: ``Home``, and ``HomeChannel``, a stream the connection code runs on),
``peers`` (the front's ``Pool`` of peer connections, and their signed upgrade).
"""

from __future__ import annotations

from .channel import Channel
from .framing import MAX_CHANNELS, MAX_FRAME, OUT_LIMIT, SLACK, WINDOW, Broken, Kind
from .front import FrontChannel, relay
from .home import Home, HomeChannel, PoolGrant, Serve, pool_grant
from .link import IDLE_S, PEER_TIMEOUT_S, PING_INTERVAL_S, Link
from .peers import MAX_LINKS_PER_HOME, MAX_PER_RESUME_HOMES, PER_RESUME_S, OldHome, Pool, Refused
from .ws_frames import BadFrame, ServerFrames, client_frame, message_frame

__all__ = [
    "IDLE_S",
    "MAX_CHANNELS",
    "MAX_FRAME",
    "MAX_LINKS_PER_HOME",
    "MAX_PER_RESUME_HOMES",
    "OUT_LIMIT",
    "PEER_TIMEOUT_S",
    "PER_RESUME_S",
    "PING_INTERVAL_S",
    "SLACK",
    "WINDOW",
    "BadFrame",
    "Broken",
    "Channel",
    "FrontChannel",
    "Home",
    "HomeChannel",
    "Kind",
    "Link",
    "OldHome",
    "Pool",
    "PoolGrant",
    "Refused",
    "Serve",
    "ServerFrames",
    "client_frame",
    "message_frame",
    "pool_grant",
    "relay",
]
