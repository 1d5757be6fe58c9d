"""``trio-duplex serve --demo`` over plain HTTP: what the page and its assets are served
with (content types, Content-Security-Policy, nosniff), what is not served (404s, no path
outside the table, nothing without ``--demo``), and that the JavaScript client served is
clients/js/src/trio-duplex.js byte for byte. Real ``serve`` subprocesses; requests written
on raw sockets, so that no client library normalises the paths."""

from __future__ import annotations

import re
import socket
import subprocess
import tomllib
from fnmatch import fnmatch
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trio_duplex.server.front.demo import _ASSETS, content_security_policy

from ..helpers import Serve, ServerProcess, serve_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "js" / "src" / "trio-duplex.js"
JS = "text/javascript; charset=utf-8"
SERVED = {
    "/": "text/html; charset=utf-8",
    "/demo/index.html": "text/html; charset=utf-8",
    "/demo/demo.css": "text/css; charset=utf-8",
    "/demo/demo.js": JS,
    "/demo/audio.js": JS,
    "/demo/mic-worklet.js": JS,
    "/demo/playback-worklet.js": JS,
    "/demo/trio-duplex.js": JS,
    "/demo/favicon.svg": "image/svg+xml",
}


def request(port: int, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (a whole request head) and read the answer to the end: its status,
    its headers (lower-case names) and its body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ")[1]), headers, body


def get(
    port: int, path: str, host: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    host = f"127.0.0.1:{port}" if host is None else host
    return request(port, f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")


def policy(headers: dict[str, str]) -> dict[str, list[str]]:
    """The Content-Security-Policy header as directive → sources."""
    directives = {}
    for part in headers["content-security-policy"].split(";"):
        name, *sources = part.split()
        directives[name] = sources
    return directives


@pytest.fixture(scope="module")
def demo(serve_module: Serve) -> ServerProcess:
    return serve_module("--engine", "voice", "--demo")


@pytest.mark.parametrize("path", sorted(SERVED))
def test_each_asset_is_served_with_its_type_and_a_strict_policy(
    demo: ServerProcess, path: str
) -> None:
    status, headers, body = get(demo.port, path)
    assert status == 200
    assert headers["content-type"] == SERVED[path]
    assert int(headers["content-length"]) == len(body) > 0
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-cache"
    csp = policy(headers)
    for directive in ("default-src", "script-src", "style-src"):
        assert csp[directive] == ["'self'"], directive  # no 'unsafe-inline', no hosts
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["object-src"] == ["'none'"]
    # 'self' plus the page's own WebSocket origin, which 'self' misses in some browsers.
    assert csp["connect-src"] == ["'self'", f"ws://127.0.0.1:{demo.port}"]


def test_the_page_has_no_inline_code_and_loads_nothing_from_elsewhere(
    demo: ServerProcess,
) -> None:
    _, _, body = get(demo.port, "/")
    page = Page()
    page.feed(body.decode())
    assert page.scripts == ["/demo/demo.js"]
    assert page.inline == [], "inline script or style: the CSP would refuse it"
    assert page.urls and all(url.startswith("/demo/") for url in page.urls), page.urls
    # The WebSocket endpoint's path reaches the page in a <meta> (no inline script).
    assert page.meta["trio-duplex-path"] == "/v1/duplex"
    assert page.meta["trio-duplex-calls"] == ""  # no --calls: no WebRTC mode
    for name in ("demo.js", "audio.js"):
        _, _, code = get(demo.port, "/demo/" + name)
        imports = re.findall(r'(?:from|addModule\()\s*"([^"]+)"', code.decode())
        assert imports and all(url in SERVED for url in imports), imports


class Page(HTMLParser):
    """What a page loads, and any inline code in it."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.urls: list[str] = []
        self.inline: list[str] = []
        self.meta: dict[str, str] = {}
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self._in = tag
        for name, value in attrs:
            if name.startswith("on") or name == "style":
                self.inline.append(f"{tag} {name}={value}")
            if name in ("src", "href") and value is not None:
                self.urls.append(value)
        if tag == "script" and found.get("src"):
            self.scripts.append(found["src"] or "")
        if tag == "style":
            self.inline.append("<style>")
        if tag == "meta" and found.get("name"):
            self.meta[found["name"] or ""] = found.get("content") or ""

    def handle_data(self, data: str) -> None:
        if self._in == "script" and data.strip():
            self.inline.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def test_the_client_served_is_the_js_client_byte_for_byte(demo: ServerProcess) -> None:
    _, _, body = get(demo.port, "/demo/trio-duplex.js")
    assert body == CLIENT.read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/demo/nope.js",
        "/demo/",
        "/demo/__init__.py",  # in the folder, not in the table
        "/demo/../pyproject.toml",
        "/demo/%2e%2e/server/demo.py",
        "/demo/..%2f__init__.py",
        "/demo//demo.js",
        "/demo/demo.js/",
        "/demo/DEMO.JS",
        "/demo/demo.js%00",
    ],
)
def test_what_is_not_in_the_table_is_404(demo: ServerProcess, path: str) -> None:
    status, headers, body = get(demo.port, path)
    assert status == 404
    assert body == b"no such asset\n"
    assert headers["x-content-type-options"] == "nosniff"


def test_other_paths_are_answered_as_without_the_demo(demo: ServerProcess) -> None:
    assert get(demo.port, "/healthz")[0] == 200
    assert get(demo.port, "/index.html")[0] == 400  # not an upgrade, as for any path


def test_head_answers_a_gets_headers_without_its_body(demo: ServerProcess) -> None:
    got = get(demo.port, "/demo/demo.css")
    status, headers, body = get(demo.port, "/demo/demo.css", method="HEAD")
    assert (status, headers, body) == (200, got[1], b"")
    assert int(headers["content-length"]) == len(got[2])
    status, _, body = get(demo.port, "/demo/missing.css", method="HEAD")
    assert (status, body) == (404, b"")


@pytest.mark.parametrize(
    "host", ["evil.example; script-src *", "a b", "'self'", "x:y:z", "[::1", "", "é"]
)
def test_a_strange_host_header_never_reaches_the_policy(demo: ServerProcess, host: str) -> None:
    status, headers, _ = get(demo.port, "/", host=host)
    assert status == 200
    assert policy(headers)["connect-src"] == ["'self'"]
    assert policy(headers)["script-src"] == ["'self'"]


def test_the_policy_names_the_pages_websocket_origin() -> None:
    assert content_security_policy("Example.com:8443", tls=True).endswith(
        "connect-src 'self' wss://example.com:8443"
    )
    assert content_security_policy("[::1]:8765", tls=False).endswith(
        "connect-src 'self' ws://[::1]:8765"
    )
    assert content_security_policy(None, tls=False).endswith("connect-src 'self'")


def test_the_log_says_where_the_page_is(demo: ServerProcess) -> None:
    found = demo.wait_for_line(r"demo page at (http://\S+)", timeout=10)
    assert found.group(1) == f"http://127.0.0.1:{demo.port}/"


def test_without_demo_nothing_is_served(serve: Serve) -> None:
    server = serve("--engine", "voice")
    for path in ("/", "/demo/demo.js", "/demo/trio-duplex.js"):
        status, headers, _ = get(server.port, path)
        assert status == 400, path  # as any path that is not the endpoint's, unchanged
        assert "content-security-policy" not in headers
    assert get(server.port, "/demo/demo.js", method="HEAD")[0] == 400


def test_demo_refuses_an_endpoint_path_it_would_hide() -> None:
    for path in ("/", "/demo/x"):
        done = subprocess.run(
            serve_command("--demo", "--path", path, "--port", "0"),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2
        assert "--path is taken by --demo" in done.stderr


def test_every_asset_is_package_data_and_the_client_is_a_link_to_clients_js() -> None:
    # A wheel (pip install .) carries the files package-data names: every asset must
    # match a pattern, and the client must be the link that a build copies the file of.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["trio_duplex.demo"]
    for name in _ASSETS:
        assert any(fnmatch(name, pattern) for pattern in patterns), name
    link = ROOT / "trio_duplex" / "demo" / "trio-duplex.js"
    assert link.is_symlink() and link.resolve() == CLIENT.resolve()
