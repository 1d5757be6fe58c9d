"""The server's TCP listeners, optionally with ``SO_REUSEPORT`` (``--reuse-port``).

``trio.open_tcp_listeners`` does not set ``SO_REUSEPORT``; ``open_listeners`` does the
same thing (one listener per address ``host`` resolves to, IPv6 ones IPv6-only,
``SO_REUSEADDR``, the system's largest backlog) and sets it too when asked. On Linux the
kernel then spreads new connections over every socket listening on the same address and
port (all of the same user, all with the option) by a hash of the connection's
addresses and ports: the load-balancing of ``--workers``.

``reserve_port`` is the supervisor's side (workers.py): a socket bound with
``SO_REUSEPORT`` but never listening holds the port (``--port 0``: one the kernel picked)
for the workers, and is given no connections, which the kernel hands only to listening
sockets.
"""

from __future__ import annotations

import errno
import socket
import sys

import trio

BACKLOG = 0xFFFF
"""What trio asks for (``listen`` caps it at the system's ``somaxconn``)."""


def can_reuse_port() -> bool:
    return hasattr(socket, "SO_REUSEPORT")


async def open_listeners(port: int, host: str, *, reuse_port: bool) -> list[trio.SocketListener]:
    """Listen on ``host:port``; with ``reuse_port``, sharing the port (SO_REUSEPORT)."""
    if not reuse_port:
        return await trio.open_tcp_listeners(port, host=host)
    if not can_reuse_port():
        raise OSError(errno.ENOPROTOOPT, "SO_REUSEPORT is not available on this system")
    addresses = await trio.socket.getaddrinfo(
        host, port, type=trio.socket.SOCK_STREAM, flags=trio.socket.AI_PASSIVE
    )
    listeners: list[trio.SocketListener] = []
    unsupported = False
    try:
        for family, type_, proto, _, sockaddr in addresses:
            try:
                sock = trio.socket.socket(family, type_, proto)
            except OSError as exc:
                if exc.errno == errno.EAFNOSUPPORT:
                    unsupported = True
                    continue
                raise
            try:
                _options(sock, family)
                await sock.bind(sockaddr)
                sock.listen(BACKLOG)
                listeners.append(trio.SocketListener(sock))
            except BaseException:
                sock.close()
                raise
    except BaseException:
        for listener in listeners:
            listener.socket.close()
        raise
    if unsupported and not listeners:
        raise OSError(errno.EAFNOSUPPORT, f"no socket family of {host!r} is supported here")
    return listeners


def _options(sock: trio.socket.SocketType | socket.socket, family: int) -> None:
    if sys.platform != "win32":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (the first address ``host`` resolves to) with
    SO_REUSEPORT, not listening: it keeps the port for the processes that will listen on
    it. OSError: the port is taken by a socket without SO_REUSEPORT, or another user's."""
    if not can_reuse_port():
        raise OSError(errno.ENOPROTOOPT, "SO_REUSEPORT is not available on this system")
    family, type_, proto, _, sockaddr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, type_, proto)
    try:
        _options(sock, family)
        sock.bind(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


__all__ = ["can_reuse_port", "open_listeners", "reserve_port"]
