"""TLS for ``wss://``: the server's context from PEM files, and the handshake of one
connection, whose failure is the client's fault (logged by faults.py), never an error.

The TLS handshake runs first thing in a connection's task, under the same
``handshake_timeout_s`` as the HTTP upgrade that follows it.
"""

from __future__ import annotations

import ssl
from typing import Any

import trio

from ..sessions.faults import FAULTS


class TLSError(ValueError):
    """The certificate or key cannot be used (unreadable, not PEM, not a pair)."""


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with Python's defaults (TLS 1.2 or later) for ``cert``
    (a PEM chain, leaf first) and ``key`` (PEM). Raises TLSError, which names the
    files and the reason only: nothing read from them."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    files = f"--tls-cert {cert} with --tls-key {key}"

    def no_password() -> str:  # an encrypted key fails here instead of prompting
        raise TLSError(f"cannot use {files}: the key is encrypted; give an unencrypted one")

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError:  # said in OpenSSL's words ("PEM lib"): say it in ours
        why = "not a PEM certificate chain and its matching private key"
        raise TLSError(f"cannot use {files}: {why}") from None
    except OSError as exc:
        raise TLSError(f"cannot use {files}: {exc.strerror or exc}") from None
    return context


async def tls_handshake(stream: trio.SSLStream[Any], peer: str | None) -> bool:
    """Do the TLS handshake; False (reported as a client fault) if the client failed it.
    Bound it with a deadline."""
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        reason = getattr(cause, "reason", None) if isinstance(cause, ssl.SSLError) else None
        where = f"a connection from {peer}" if peer else "a connection"
        FAULTS.report(where, f"TLS handshake failed: {reason or 'connection lost'}")
        return False
    return True


__all__ = ["TLSError", "server_ssl_context", "tls_handshake"]
