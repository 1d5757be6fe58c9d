"""The store's connection to Redis: plain, TLS, or through Redis Sentinel.

``--cluster`` takes one of:

- ``redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]``: plaintext TCP;
- ``rediss://...``: the same over TLS, the server's certificate checked (host name
  included) against ``ca_file`` (``--cluster-redis-ca``) or else the system's CAs;
- ``redis+sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``: the
  Sentinels to ask where the primary of ``SERVICE`` is. Every new connection asks them,
  and checks that what it reached is a primary (``ROLE``), and the store asks again
  once a second of use (``_SentinelPool``), so within about a second of a failover its
  calls reach the new primary; ``failovers`` says how often that happened (the node
  then claims its sessions again: writes the old primary took last may be lost). The
  Sentinels themselves are spoken to without a password and without TLS.

The password is the URL's, or ``password`` (``TRIO_DUPLEX_REDIS_PASSWORD``, which ``ps``
does not show): the argument wins. Connections are made per call, so nothing here needs
Redis to be up.
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import coredis
from coredis.connection import TCPConnection, TCPLocation
from coredis.connection._sentinel import SentinelManagedConnection
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import SentinelError
from coredis.pool._sentinel import SentinelConnectionPool

CHECK_INTERVAL_S = 1.0
"""How often a Sentinel-backed store asks where the primary is (the heartbeat's pace)."""
PASSWORD_ENV = "TRIO_DUPLEX_REDIS_PASSWORD"
"""Where ``serve --cluster`` reads the store's password from (never a flag: argv shows)."""


class _ClosesBuffersOnFailure:
    """coredis 6.9's connections, closing their buffers when they cannot connect.

    ``BaseConnection.run`` only closes its six anyio memory streams once connected, so
    each refused connection leaves them to the garbage collector, which warns
    (``ResourceWarning: Unclosed <MemoryObjectSendStream>``) once per stream.
    """

    async def _connect(self) -> Any:
        try:
            return await super()._connect()  # type: ignore[misc]
        except BaseException:
            for name in (
                "_write_buffer_in",
                "_write_buffer_out",
                "_push_message_buffer_in",
                "_push_message_buffer_out",
                "_streamed_message_buffer_in",
                "_streamed_message_buffer_out",
            ):
                getattr(self, name).close()
            raise


class _TCPConnection(_ClosesBuffersOnFailure, TCPConnection):
    pass


class _SentinelConnection(_ClosesBuffersOnFailure, SentinelManagedConnection):
    pass


class _SentinelPool(SentinelConnectionPool):
    """coredis's Sentinel pool, which asks the Sentinels only when it makes a connection:
    after a ``SENTINEL FAILOVER`` its pooled connections stay on the old primary, which
    takes writes (that the failover then drops) until Sentinel reconfigures it, up to
    ten seconds later. This one also asks once per ``CHECK_INTERVAL_S`` of use, and drops
    its connections when the answer changed; ``failovers`` counts those changes. Sentinel
    errors are raised as ``ConnectionError``: the store calls them unavailable."""

    failovers: int = 0
    _checked_at: float = -math.inf

    async def get_connection(self, **kwargs: Any) -> SentinelManagedConnection:
        try:
            now = time.monotonic()
            if self.location is not None and now - self._checked_at >= CHECK_INTERVAL_S:
                self._checked_at = now
                await self.get_primary_location()  # drops every connection if it moved
            return await super().get_connection(**kwargs)
        except SentinelError as exc:  # no primary known, or a stale one reached
            raise RedisConnectionError(f"Sentinel: {exc}") from exc

    async def get_primary_location(self) -> TCPLocation:
        before = self.location
        location = await super().get_primary_location()
        if before is not None and location != before:
            self.failovers += 1
        return location

    async def _construct_connection(self) -> SentinelManagedConnection:
        location = await self.get_primary_location()  # PrimaryNotFoundError
        self._checked_at = time.monotonic()
        return _SentinelConnection(location, self.service_name, True, **self.connection_kwargs)


def failovers(client: coredis.Redis[str]) -> int:
    """How often the primary behind ``client`` changed (Sentinel only; else 0)."""
    pool = client.connection_pool
    return pool.failovers if isinstance(pool, _SentinelPool) else 0


@attrs.frozen(repr=False)
class Target:
    """A parsed ``--cluster`` URL (``parse``)."""

    scheme: str
    locations: tuple[tuple[str, int], ...]
    """The Redis (one) or the Sentinels (one or more)."""
    db: int
    username: str | None
    password: str | None
    service: str | None = None
    """The Sentinel service name (``redis+sentinel://``)."""

    def __repr__(self) -> str:
        return f"Target({self.scheme}, {self.locations}, db={self.db})"


def _host_port(text: str, default_port: int | None) -> tuple[str, int]:
    host, sep, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not sep:
        host, port = text, ""
    host = host.strip("[]")
    if not host or (not port and default_port is None) or (port and not port.isdigit()):
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    number = int(port) if port else default_port
    assert number is not None
    if not 0 < number < 65536:
        raise ValueError(f"a port must be from 1 to 65535, got {port!r}")
    return host, number


def parse(url: str) -> Target:
    """ValueError: not one of the three forms (the message shows no password)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at:
        userinfo = ""
    user, colon, secret = userinfo.partition(":")
    username = unquote(user) if user else None
    password = unquote(secret) if colon and secret else None
    path = [p for p in parts.path.split("/") if p]
    if parts.scheme in ("redis", "rediss"):
        if not hosts or "," in hosts or len(path) > 1 or (path and not path[0].isdigit()):
            raise ValueError(f"expected {parts.scheme}://HOST[:PORT][/DB], got {hosts!r}")
        location = _host_port(hosts, 6379)
        return Target(parts.scheme, (location,), int(path[0]) if path else 0, username, password)
    if parts.scheme == "redis+sentinel":
        if not hosts or not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ValueError(
                "expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB], "
                f"got {hosts!r} and {parts.path!r}"
            )
        locations = tuple(_host_port(h, 26379) for h in hosts.split(","))
        db = int(path[1]) if len(path) == 2 else 0
        return Target(parts.scheme, locations, db, username, password, service=path[0])
    raise ValueError(
        f"expected a redis://, rediss:// or redis+sentinel:// URL, got {parts.scheme!r}"
    )


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A client context checking the server's certificate and host name against
    ``ca_file`` (PEM) or the system's CAs. ValueError: the file cannot be used."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError:
        raise ValueError(f"cannot use --cluster-redis-ca {ca_file}: not PEM certificates") from None
    except OSError as exc:
        raise ValueError(f"cannot use --cluster-redis-ca {ca_file}: {exc.strerror}") from None


@asynccontextmanager
async def redis_client(
    url: str, timeout_s: float, *, password: str | None = None, ca_file: str | None = None
) -> AsyncIterator[coredis.Redis[str]]:
    """A client for ``url`` (see the module), for the block's length."""
    target = parse(url)
    if ca_file is not None and target.scheme != "rediss":
        raise ValueError("a CA file (--cluster-redis-ca) needs a rediss:// URL")
    common: dict[str, Any] = {
        "db": target.db,
        "username": target.username,
        "password": password if password is not None else target.password,
        "connect_timeout": timeout_s,
        "decode_responses": True,
    }
    if target.service is None:
        if target.scheme == "rediss":
            common["ssl_context"] = tls_context(ca_file)
        pool: coredis.ConnectionPool[_TCPConnection] = coredis.ConnectionPool(
            connection_class=_TCPConnection, location=TCPLocation(*target.locations[0]), **common
        )
        async with coredis.Redis(connection_pool=pool, decode_responses=True) as client:
            yield client
        return
    sentinel: coredis.Sentinel[str] = coredis.Sentinel(
        [TCPLocation(host, port) for host, port in target.locations],
        sentinel_kwargs={"connect_timeout": timeout_s, "decode_responses": True},
        decode_responses=True,
    )
    # Its clients of the Sentinels themselves, on connections that close their buffers.
    sentinel.sentinels = [
        coredis.Redis(
            connection_pool=coredis.ConnectionPool(
                connection_class=_TCPConnection,
                location=TCPLocation(host, port),
                connect_timeout=timeout_s,
                decode_responses=True,
            ),
            decode_responses=True,
        )
        for host, port in target.locations
    ]
    async with sentinel:
        client = sentinel.primary_for(target.service, connection_pool_class=_SentinelPool, **common)
        async with client:
            yield client


__all__ = ["PASSWORD_ENV", "Target", "failovers", "parse", "redis_client", "tls_context"]
