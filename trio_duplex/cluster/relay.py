"""Resume on any node (docs/cluster.md): a ``session.resume`` relayed to the session's home.

A resume that reaches a node which does not hold the session, while the store says a
live node does, is relayed: this node (the front) opens a WebSocket to the home's relay
endpoint (``RELAY_PATH`` on the home's advertised address), signed with the cluster's
shared secret, sends the client's ``session.resume`` there, and from then on copies every
message both ways, text and binary, until either side closes; the home's close code is
the client's. The home runs an ordinary resume, so the client sees exactly the protocol
of a direct one: ``session.resumed``, the replay, fencing, takeover, close codes.

Mutual authentication (docs/cluster.md, "Relay authentication"). The request carries
``X-Trio-Duplex-Relay: v2 FROM TO SESSION TIME NONCE MAC``: the sending and receiving
node ids, the session id, the wall clock time in seconds, 128 fresh random bits, and an
HMAC-SHA256 of them all under a key derived from the cluster secret. The home takes it
only if it parses strictly (ASCII, bounded), its MAC matches (compared in constant time),
it names the home itself, it is at most ``MAX_SKEW_S`` old (or early), and its nonce was
not seen before (``ReplayCache``: a captured request cannot be played again); anything
else gets 403. Its 101 carries ``X-Trio-Duplex-Relay-Proof``: an HMAC, under a second
derived key, of the nonce, both node ids and the session id. The front checks that proof
(constant time) before it sends anything, so the client's resume token never reaches a
node that does not hold the secret, whatever URL the directory gave. A relayed
connection may only resume the session it names. No secret, key or MAC is ever logged
nor in any ``repr``.

Bounds: the home must answer the upgrade within the handshake timeout; each message is
at most ``max_message_bytes`` either way (client to home: the session's
``max_event_bytes``); each write waits at most the write timeout; one message is in
flight each way, and the client's side is paced by its connection's outbox.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import logging
import re
import secrets
import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.http11 import Request
from websockets.trio.client import ClientConnection, connect

from ..core.frames import CloseCode
from ..server.front.router import DIALECT_HEADER
from ..server.front.tls import TLSError
from ..server.sessions.connection import Connection
from ..server.sessions.websocket import ConnectionClosed as ClientGone

log = logging.getLogger("trio_duplex")

RELAY_PATH = "/trio-duplex/relay"
"""Where a node takes relayed resumes (on ``--relay-port`` if given, else on its main
listener: never on both)."""
HEADER = "X-Trio-Duplex-Relay"
PROOF_HEADER = "X-Trio-Duplex-Relay-Proof"
"""The home's answer in its 101: proof that it holds the cluster secret."""
_REDACTED = frozenset({HEADER.lower(), PROOF_HEADER.lower()})


class _Redacting(logging.LoggerAdapter[logging.Logger]):
    """websockets logs every header at DEBUG: not the relay's signature nor its proof."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg in ("> %s: %s", "< %s: %s") and args and str(args[0]).lower() in _REDACTED:
            args = (args[0], "<redacted>")
        super().log(level, msg, *args, **kwargs)


_LOG = _Redacting(logging.getLogger("websockets.client"), {})

MAX_SKEW_S = 60.0
"""How far apart two nodes' wall clocks may be for a signature to hold."""
MAX_RELAYED_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message the home may send through a relay (an engine's event)."""
REPLAY_CACHE_ENTRIES = 65536
"""Nonces a home remembers at most (those of the last ``2 * MAX_SKEW_S``): a relay per
node per millisecond. Only requests with a valid MAC get in, so only a cluster member
could fill it; a full cache refuses (403) rather than forget a nonce too early."""

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""Node ids (the store's rule) and the session ids a relay carries (ours are sess_HEX)."""
_V2 = re.compile(
    r"v2 ([A-Za-z0-9._-]{1,128}) ([A-Za-z0-9._-]{1,128}) ([A-Za-z0-9._-]{1,128})"
    r" ([0-9]{1,12}) ([0-9a-f]{32}) ([0-9a-f]{64})"
)
"""The request header, strictly: ASCII only (explicit ranges, no ``\\d``), every part
bounded, so nothing a peer sends can make parsing raise or take long."""
_MAX_HEADER_CHARS = 3 * 128 + 12 + 32 + 64 + 8
_PROOF = re.compile(r"[0-9a-f]{64}")
_P1 = re.compile(
    r"p1 ([A-Za-z0-9._-]{1,128}) ([A-Za-z0-9._-]{1,128})"
    r" ([0-9]{1,12}) ([0-9a-f]{32}) ([0-9a-f]{64})"
)
"""A pooled peer connection's request (pool/), as strictly: no session named, a label
of its own in the MAC (so a pool request and a resume's can never stand for each other)."""

_UNSENDABLE = frozenset({1005, 1006, 1015})
"""Close codes that describe a close but may not be sent in one."""


def relayable(session_id: object) -> bool:
    """Could ``session_id`` be a session of ours (worth a look in the store)?"""
    return isinstance(session_id, str) and _ID.fullmatch(session_id) is not None


@attrs.frozen(repr=False)
class RelayKeys:
    """The two keys derived from the cluster secret: one signs requests, one proofs.
    Derived (not the secret itself) so that neither MAC can stand in for the other."""

    request: bytes
    proof: bytes

    @classmethod
    def derive(cls, secret: str) -> RelayKeys:
        raw = secret.encode("utf-8", "surrogateescape")
        return cls(
            hmac.new(raw, b"trio-duplex relay request v2", hashlib.sha256).digest(),
            hmac.new(raw, b"trio-duplex relay proof v2", hashlib.sha256).digest(),
        )

    def __repr__(self) -> str:
        return "RelayKeys(<hidden>)"


def _request_mac(
    keys: RelayKeys, sender: str, receiver: str, session_id: str, when: str, nonce: str
) -> bytes:
    message = f"v2\nrequest\n{sender}\n{receiver}\n{session_id}\n{when}\n{nonce}".encode()
    return hmac.new(keys.request, message, hashlib.sha256).hexdigest().encode("ascii")


def proof(keys: RelayKeys, sender: str, receiver: str, session_id: str, nonce: str) -> str:
    """The home's answer to a request of ``sender`` for ``session_id`` with ``nonce``."""
    message = f"v2\nproof\n{sender}\n{receiver}\n{session_id}\n{nonce}".encode()
    return hmac.new(keys.proof, message, hashlib.sha256).hexdigest()


@attrs.frozen(repr=False)
class Signed:
    """A relay request as the front node sends it, and what the home must answer."""

    header: str
    """The ``HEADER`` value."""
    expected_proof: str
    """The ``PROOF_HEADER`` value only a holder of the secret can compute."""

    def __repr__(self) -> str:
        return "Signed(<hidden>)"

    def proven(self, answer: str | None) -> bool:
        """Does ``answer`` (the home's PROOF_HEADER, if any) prove the home holds the
        secret? Compared in constant time, as bytes."""
        if answer is None or _PROOF.fullmatch(answer) is None:
            return False
        return hmac.compare_digest(answer.encode("ascii"), self.expected_proof.encode("ascii"))


def sign(
    keys: RelayKeys,
    sender: str,
    receiver: str,
    session_id: str,
    now: float,
    nonce: str | None = None,
) -> Signed:
    """A request for a resume of ``session_id`` from ``sender`` to ``receiver`` at wall
    clock time ``now``, with a fresh nonce (``nonce``: a given one, for tests)."""
    nonce = secrets.token_hex(16) if nonce is None else nonce
    when = str(int(now))
    mac = _request_mac(keys, sender, receiver, session_id, when, nonce).decode("ascii")
    header = f"v2 {sender} {receiver} {session_id} {when} {nonce} {mac}"
    return Signed(header, proof(keys, sender, receiver, session_id, nonce))


@attrs.define(eq=False, repr=False)
class ReplayCache:
    """The nonces of the requests a home took within the skew window (bounded)."""

    limit: int = REPLAY_CACHE_ENTRIES
    _seen: set[str] = attrs.field(factory=set)
    _expiries: list[tuple[float, str]] = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, nonce: str, expires: float, now: float) -> bool:
        """Remember ``nonce`` until ``expires``; False if it was seen (a replay), or if
        the cache is full of nonces still within their window."""
        while self._expiries and self._expiries[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiries)[1])
        if nonce in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(nonce)
        heapq.heappush(self._expiries, (expires, nonce))
        return True


def _pool_mac(keys: RelayKeys, sender: str, receiver: str, when: str, nonce: str) -> bytes:
    message = f"p1\npool request\n{sender}\n{receiver}\n{when}\n{nonce}".encode()
    return hmac.new(keys.request, message, hashlib.sha256).hexdigest().encode("ascii")


def pool_proof(keys: RelayKeys, sender: str, receiver: str, nonce: str) -> str:
    """The home's answer to ``sender``'s pooled connection request with ``nonce``."""
    message = f"p1\npool proof\n{sender}\n{receiver}\n{nonce}".encode()
    return hmac.new(keys.proof, message, hashlib.sha256).hexdigest()


def sign_pool(
    keys: RelayKeys, sender: str, receiver: str, now: float, nonce: str | None = None
) -> Signed:
    """A pooled peer connection's request from ``sender`` to ``receiver`` at wall clock
    time ``now``, with a fresh nonce (``nonce``: a given one, for tests)."""
    nonce = secrets.token_hex(16) if nonce is None else nonce
    when = str(int(now))
    mac = _pool_mac(keys, sender, receiver, when, nonce).decode("ascii")
    return Signed(
        f"p1 {sender} {receiver} {when} {nonce} {mac}", pool_proof(keys, sender, receiver, nonce)
    )


@attrs.frozen
class Accepted:
    """A request the home took: the session it may resume, the 101's proof header."""

    session_id: str
    proof: str = attrs.field(repr=False)


_DUMMY_MAC = b"0" * 64


def verify(
    keys: RelayKeys,
    values: list[str],
    receiver: str,
    now: float,
    seen: ReplayCache,
) -> Accepted | None:
    """What the relay header values ``values`` (all the request had: exactly one is
    taken) let ``receiver`` resume, or None: missing, repeated, malformed, not signed
    under ``keys``, for another node, too old or too early, or a replay. Never raises."""
    value = values[0] if len(values) == 1 else ""
    match = _V2.fullmatch(value) if len(value) <= _MAX_HEADER_CHARS else None
    if match is None:
        # The MAC is computed whatever else is wrong, so timing tells little about it.
        hmac.compare_digest(_DUMMY_MAC, _request_mac(keys, "", "", "", "0", ""))
        return None
    sender, to, session_id, when, nonce, mac = match.groups()
    good = hmac.compare_digest(
        mac.encode("ascii"), _request_mac(keys, sender, to, session_id, when, nonce)
    )
    if not good or to != receiver or abs(now - int(when)) > MAX_SKEW_S:
        return None
    if not seen.add(nonce, int(when) + MAX_SKEW_S, now):
        return None
    return Accepted(session_id, proof(keys, sender, to, session_id, nonce))


def verify_request(
    keys: RelayKeys, request: Request, receiver: str, now: float, seen: ReplayCache
) -> Accepted | None:
    """``verify`` on an upgrade request's relay headers."""
    return verify(keys, request.headers.get_all(HEADER), receiver, now, seen)


@attrs.frozen
class PoolAccepted:
    """A pooled peer connection the home took: the node that dialled, the 101's proof."""

    sender: str
    proof: str = attrs.field(repr=False)


def verify_pool(
    keys: RelayKeys, values: list[str], receiver: str, now: float, seen: ReplayCache
) -> PoolAccepted | None:
    """``verify`` for a pooled peer connection's request (``sign_pool``): the same rules
    (one header, strict, MAC in constant time, for this node, within the skew, a new
    nonce), or None. Never raises."""
    value = values[0] if len(values) == 1 else ""
    match = _P1.fullmatch(value) if len(value) <= _MAX_HEADER_CHARS else None
    if match is None:
        hmac.compare_digest(_DUMMY_MAC, _pool_mac(keys, "", "", "0", ""))
        return None
    sender, to, when, nonce, mac = match.groups()
    good = hmac.compare_digest(mac.encode("ascii"), _pool_mac(keys, sender, to, when, nonce))
    if not good or to != receiver or abs(now - int(when)) > MAX_SKEW_S:
        return None
    if not seen.add(nonce, int(when) + MAX_SKEW_S, now):
        return None
    return PoolAccepted(sender, pool_proof(keys, sender, to, nonce))


def relay_url(advertised: str) -> str:
    """The relay endpoint on the node advertised at ``advertised`` (its scheme, host
    and port; the path is ours)."""
    parts = urlsplit(advertised)
    return urlunsplit((parts.scheme, parts.netloc, RELAY_PATH, "", ""))


def client_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """What the relay trusts when it dials a ``wss://`` node: ``ca_file`` (PEM, the
    cluster's private CA; ``--cluster-ca``), else the system's CAs. Host names are
    checked either way. TLSError: the file cannot be used."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError:
        raise TLSError(f"cannot use --cluster-ca {ca_file}: not PEM CA certificates") from None
    except OSError as exc:
        raise TLSError(f"cannot use --cluster-ca {ca_file}: {exc.strerror or exc}") from None


class _Unproven(Exception):
    """The node at the relay URL did not prove it holds the cluster secret."""


async def relay(
    conn: Connection,
    first: str,
    *,
    home: str,
    url: str,
    signed: Signed,
    connect_timeout_s: float,
    write_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    dialect: str = "native",
) -> bool:
    """Relay ``conn``, whose first message ``first`` is a ``session.resume`` (in native
    JSON, whatever its client speaks: ``dialect``, named to the home, which speaks it on
    the relayed connection from its first answer), to the home
    node ``home`` advertised at ``url``, until either side closes. Returns False (nothing
    sent to the client, nor to the home) if the home could not be reached, refused the
    upgrade, or did not prove it holds the cluster secret: the caller answers
    ``unreachable``. Once relayed, ``conn`` is finished with the home's close code, or
    1001 if the home's connection broke (the client resumes again). ``ssl_context``:
    what a ``wss://`` home's certificate is checked against (``client_ssl_context``)."""
    connected = False
    target = relay_url(url)
    try:
        async with connect(
            target,
            ssl=ssl_context if target.startswith("wss:") else None,
            additional_headers={HEADER: signed.header, DIALECT_HEADER: dialect},
            compression=None,
            proxy=None,
            ping_interval=None,  # the home pings; websockets answers
            open_timeout=connect_timeout_s,
            close_timeout=connect_timeout_s,
            max_size=MAX_RELAYED_MESSAGE_BYTES,
            user_agent_header="trio-duplex-relay",
            logger=_LOG,
        ) as upstream:
            response = upstream.response
            answers = [] if response is None else response.headers.get_all(PROOF_HEADER)
            if len(answers) != 1 or not signed.proven(answers[0]):
                raise _Unproven
            connected = True
            await _copy(conn, upstream, first, write_timeout_s)
    except _Unproven:
        log.error(
            "relay to node %s at %s refused: it did not prove it holds --cluster-secret; "
            "nothing was sent to it (a forged directory entry, or a node of another cluster)",
            home,
            url,
        )
        return False
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
    except (OSError, WebSocketException, TimeoutError, trio.BrokenResourceError) as exc:
        if connected:  # its close went wrong: the relay is over all the same
            conn.finish([], CloseCode.GOING_AWAY)
            return True
        # (A failed TLS handshake is a BrokenResourceError; its cause says why.)
        why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
        log.warning("relay to node %s at %s failed: %s", home, url, why)
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
    "PROOF_HEADER",
    "RELAY_PATH",
    "Accepted",
    "PoolAccepted",
    "RelayKeys",
    "ReplayCache",
    "Signed",
    "client_ssl_context",
    "pool_proof",
    "proof",
    "relay",
    "relay_url",
    "relayable",
    "sign",
    "sign_pool",
    "verify",
    "verify_pool",
    "verify_request",
]
