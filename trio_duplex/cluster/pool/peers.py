"""The front's pool of peer connections (``Pool``), by home node: dialled on first
need with a signed upgrade the home must prove it can answer, kept while in use."""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import ssl
import time
from urllib.parse import urlsplit

import attrs
import trio

from ...server.sessions.websocket import RECEIVE_SIZE
from ..relay import (
    HEADER,
    PROOF_HEADER,
    RELAY_PATH,
    RelayKeys,
    sign_pool,
)
from .framing import (
    MAX_CHANNELS,
)
from .link import Link

MAX_LINKS_PER_HOME = 4
"""Peer connections a front keeps to one home node."""

PER_RESUME_S = 60.0
"""How long a home that answered the pooled upgrade as a release before the pool does
(``OldHome``) is relayed to per resume (relay.py) before the pool is tried again (it may
have been upgraded meanwhile: a rolling deploy)."""
MAX_PER_RESUME_HOMES = 1024
"""Homes remembered as taking per-resume relays only (the oldest forgotten first)."""
_MAX_HEAD_BYTES = 16384

_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# -- the front's pool ---------------------------------------------------------------


class Refused(Exception):
    """The home refused the peer connection (or could not be reached): say why."""

    def __init__(self, message: str, level: int = logging.WARNING) -> None:
        super().__init__(message)
        self.level = level


class OldHome(Refused):
    """The home refused the pooled upgrade as every release before the pool does: a 403
    that carries no proof header (its relay endpoint knows only the per-resume ``v2``
    request, so a ``p1`` one is "not signed for this node"). It takes per-resume relays
    (relay.py), which prove the secret on their own: the front falls back to them. (A
    node that does not share the secret answers the same 403, and refuses the per-resume
    relay as well; a 101 without the right proof is never this: ``Refused``.)"""


@attrs.define(eq=False)
class Pool:
    """A front's peer connections, by home node: dialled on first need, at most
    ``MAX_LINKS_PER_HOME`` each, kept while in use (closed once idle)."""

    node_id: str
    keys: RelayKeys = attrs.field(repr=False)
    connect_timeout_s: float
    write_timeout_s: float
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    nursery: trio.Nursery | None = None
    """Where the links run (the placement's, for as long as the node is joined)."""
    links: dict[tuple[str, str], list[Link]] = attrs.field(factory=dict)
    _dialling: dict[tuple[str, str], trio.Lock] = attrs.field(factory=dict)
    dialled: int = 0
    """Peer connections opened so far (tests, metrics)."""
    _per_resume: dict[tuple[str, str], float] = attrs.field(factory=dict)
    """Homes that answered as a release before the pool (``OldHome``): until when
    (``trio.current_time``) they are relayed to per resume, at most
    ``MAX_PER_RESUME_HOMES``."""

    def per_resume(self, home: str, url: str) -> bool:
        """Is ``home`` at ``url`` remembered as taking per-resume relays only?"""
        key = (home, url)
        until = self._per_resume.get(key)
        if until is None:
            return False
        if trio.current_time() < until:
            return True
        del self._per_resume[key]
        return False

    def remember_per_resume(self, home: str, url: str) -> None:
        """Relay to ``home`` at ``url`` per resume for ``PER_RESUME_S`` (it answered
        as a release before the pool)."""
        key = (home, url)
        remembered = self._per_resume
        remembered.pop(key, None)
        now = trio.current_time()
        if len(remembered) >= MAX_PER_RESUME_HOMES:
            for old in [old for old, until in remembered.items() if until <= now]:
                del remembered[old]
            while len(remembered) >= MAX_PER_RESUME_HOMES:
                del remembered[next(iter(remembered))]  # (the oldest: insertion order)
        remembered[key] = now + PER_RESUME_S

    def _usable(self, key: tuple[str, str]) -> Link | None:
        best: Link | None = None
        for link in self.links.get(key, ()):
            if not link.closing and len(link.channels) < MAX_CHANNELS:
                if best is None or len(link.channels) < len(best.channels):
                    best = link
        return best

    async def link_to(self, home: str, url: str) -> Link:
        """A peer connection to ``home`` at ``url`` that can take a channel. Refused: it
        could not be had (unreachable, refused, did not prove it holds the secret, or
        ``MAX_LINKS_PER_HOME`` full ones); OldHome: it takes per-resume relays only
        (it just said so, or did within ``PER_RESUME_S``)."""
        key = (home, url)
        link = self._usable(key)
        if link is not None:
            return link
        if self.per_resume(home, url):
            raise OldHome("takes per-resume relays only (remembered)", logging.DEBUG)
        lock = self._dialling.setdefault(key, trio.Lock())
        async with lock:
            link = self._usable(key)
            if link is not None:
                return link
            if self.per_resume(home, url):  # (learnt while this task waited)
                raise OldHome("takes per-resume relays only (remembered)", logging.DEBUG)
            live = [link for link in self.links.get(key, ()) if not link.closing]
            if len(live) >= MAX_LINKS_PER_HOME:
                raise Refused(f"{MAX_LINKS_PER_HOME} peer connections to it are full")
            try:
                link = await self._dial(home, url)
            except OldHome:
                self.remember_per_resume(home, url)
                raise
            self.links.setdefault(key, []).append(link)
            self.dialled += 1
            return link

    async def _dial(self, home: str, url: str) -> Link:
        if self.nursery is None:
            raise Refused("the node is leaving the cluster")
        parts = urlsplit(url)
        tls = parts.scheme == "wss"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        signed = sign_pool(self.keys, self.node_id, home, time.time())
        key = base64.b64encode(secrets.token_bytes(16)).decode("ascii")
        request = (
            f"GET {RELAY_PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"{HEADER}: {signed.header}\r\nUser-Agent: trio-duplex-relay\r\n\r\n"
        ).encode("ascii")
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(host, port)
                if tls:
                    context = self.ssl_context or ssl.create_default_context()
                    stream = trio.SSLStream(stream, context, server_hostname=host)
                    await stream.do_handshake()
                await stream.send_all(request)
                status, headers, early = await _read_response(stream)
            if status == 403 and PROOF_HEADER.lower() not in headers:
                raise OldHome(
                    "refused the pooled upgrade (403) as a release before the pool does: "
                    f"relaying to it per resume for {PER_RESUME_S:.0f}s",
                    logging.INFO,
                )
            if status == 403:
                raise Refused(
                    "refused (403): do the nodes share --cluster-secret, and agree on the "
                    "time within 60s?",
                    logging.ERROR,
                )
            if status != 101:
                raise Refused(f"refused: HTTP {status}")
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            proofs = headers.get(PROOF_HEADER.lower(), [])
            if len(proofs) != 1 or not signed.proven(proofs[0]):
                raise Refused(
                    "refused: it did not prove it holds --cluster-secret; nothing was sent "
                    "to it (a forged directory entry, or a node of another cluster)",
                    logging.ERROR,
                )
            if headers.get("sec-websocket-accept") != [accept]:
                raise Refused("refused: not a WebSocket upgrade")
        except BaseException as exc:
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)
            if isinstance(exc, Refused):
                raise
            if isinstance(exc, (OSError, trio.TooSlowError, trio.BrokenResourceError)):
                why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
                raise Refused(f"failed: {why}") from None
            raise
        link = Link(stream, home, self.write_timeout_s, front=True)
        self.nursery.start_soon(self._run, link, (home, url), early)
        return link

    async def _run(self, link: Link, key: tuple[str, str], early: bytes) -> None:
        try:
            await link.run(early)
        finally:
            links = self.links.get(key)
            if links is not None and link in links:
                links.remove(link)
                if not links:
                    del self.links[key]

    def close(self) -> None:
        for links in self.links.values():
            for link in links:
                link.cut()


async def _read_response(stream: trio.abc.Stream) -> tuple[int, dict[str, list[str]], bytes]:
    """The status and headers (names in lower case) of an HTTP response head, bounded,
    and the bytes that came after it. Refused: not one."""
    received = bytearray()
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > _MAX_HEAD_BYTES:
            raise Refused("refused: an answer head too large")
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise Refused("failed: the connection closed during the upgrade")
        received += data
    head = bytes(received[:end]).decode("latin-1")
    lines = head.split("\r\n")
    status_line = lines[0].split(" ", 2)
    if (
        len(status_line) < 2
        or not status_line[0].startswith("HTTP/1.")
        or not (status_line[1].isascii() and status_line[1].isdigit() and len(status_line[1]) == 3)
    ):
        raise Refused("refused: not an HTTP answer")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise Refused("refused: a malformed answer header")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(status_line[1]), headers, bytes(received[end + 4 :])
