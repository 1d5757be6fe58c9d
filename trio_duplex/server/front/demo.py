"""The browser demo page (``trio-duplex serve --demo``): ``GET /`` and ``GET /demo/<asset>``.

A fixed table of files, read once from the package (``trio_duplex/demo``) when the server
is built, so a request is a dictionary lookup and never a filesystem path: nothing else
can be reached, and a missing file stops the server at start, not at the first visit.
``/demo/trio-duplex.js`` is the JavaScript client (``clients/js/src/trio-duplex.js``;
tests/browser/test_demo_http.py checks that the bytes served are that file's).

Every answer carries a strict Content-Security-Policy: only this server's scripts,
styles and images, no inline code, connections only to this server (``'self'``, plus
the page's own ``ws://``/``wss://`` origin, which ``'self'`` covers in CSP Level 3
browsers but not in every older one), and no framing.
"""

from __future__ import annotations

import html
import re
from importlib import resources
from typing import Final

import attrs

PAGE_PATH: Final = "/"
ASSET_PREFIX: Final = "/demo/"

_JS: Final = "text/javascript; charset=utf-8"
_ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "demo.css": "text/css; charset=utf-8",
    "demo.js": _JS,
    "audio.js": _JS,
    "mic-worklet.js": _JS,
    "playback-worklet.js": _JS,
    "trio-duplex.js": _JS,
    "favicon.svg": "image/svg+xml",
}
"""Every file the demo serves, and its content type: the whole of what can be reached."""

_PATH_MARK: Final = b"{{WS_PATH}}"
"""Where index.html gets the WebSocket endpoint's path (a ``<meta>``; no inline script)."""
_CALLS_MARK: Final = b"{{CALLS_PATH}}"
"""Where it gets the WebRTC calls' path (``--calls``), or nothing: no WebRTC mode."""

# A Host header as a browser sends it: a name or an IPv4 address, or a bracketed IPv6
# one, and maybe a port. Anything else (spaces, ';', quotes) never reaches the CSP.
_HOST: Final = re.compile(r"(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")

_CSP_FIXED: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "media-src 'self'; worker-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


def content_security_policy(host: str | None, tls: bool) -> str:
    """The page's policy; ``host`` (the request's Host header) adds its WebSocket origin."""
    connect = "connect-src 'self'"
    if host is not None and _HOST.fullmatch(host):
        connect += f" {'wss' if tls else 'ws'}://{host.lower()}"
    return f"{_CSP_FIXED}; {connect}"


@attrs.frozen
class DemoPages:
    """The demo's files, in memory, and how to answer a request for one."""

    files: dict[str, tuple[bytes, str]]
    """Path → (body, content type)."""
    tls: bool
    """The server speaks ``wss://`` (the CSP names that scheme)."""

    @classmethod
    def load(cls, ws_path: str, *, tls: bool, calls_path: str = "") -> DemoPages:
        """Read the files from the package; ``ws_path`` is the WebSocket endpoint's path,
        ``calls_path`` the WebRTC calls' (empty: the page has no WebRTC mode)."""
        package = resources.files("trio_duplex.demo")
        files: dict[str, tuple[bytes, str]] = {}
        for name, content_type in _ASSETS.items():
            body = package.joinpath(name).read_bytes()  # OSError: an incomplete install
            if name == "index.html":
                body = body.replace(_PATH_MARK, html.escape(ws_path).encode())
                body = body.replace(_CALLS_MARK, html.escape(calls_path).encode())
                files[PAGE_PATH] = (body, content_type)
            files[ASSET_PREFIX + name] = (body, content_type)
        return cls(files, tls)

    def answer(self, path: str, host: str | None) -> bytes | None:
        """The whole response to a GET of ``path``; None: not a demo path (404 is then
        the caller's); a path under /demo/ that is no asset gets 404 here."""
        found = self.files.get(path)
        if found is None:
            if not path.startswith(ASSET_PREFIX):
                return None
            return self._response("404 Not Found", b"no such asset\n", "text/plain", host)
        body, content_type = found
        return self._response("200 OK", body, content_type, host)

    def _response(self, status: str, body: bytes, content_type: str, host: str | None) -> bytes:
        head = (
            f"HTTP/1.1 {status}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            # Revalidate every time: a new server version's page shows at once.
            "Cache-Control: no-cache\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            f"Content-Security-Policy: {content_security_policy(host, self.tls)}\r\n"
            "Referrer-Policy: no-referrer\r\n"
            "Cross-Origin-Opener-Policy: same-origin\r\n"
            "Permissions-Policy: microphone=(self)\r\n"
            "Connection: close\r\n\r\n"
        )
        return head.encode() + body


__all__ = ["ASSET_PREFIX", "PAGE_PATH", "DemoPages", "content_security_policy"]
