"""Client tokens are bounded per tenant and in bytes (docs/deploying.md, "Tenancy bounds"),
their requests' JSON goes through the wire's decoder, and removing a key (SIGHUP)
revokes its tokens and ends its sessions ("Revoking a key")."""

from __future__ import annotations

import json
import signal
import socket
import tracemalloc
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from trio_duplex import ServerConfig
from trio_duplex.cli import main
from trio_duplex.core.limits import MiB
from trio_duplex.dialects.jsonwire import encode
from trio_duplex.server.front.tokens import (
    TOKEN_OVERHEAD,
    ClientToken,
    ClientTokens,
    Refused,
    TokenLimits,
    digest,
)

from ..helpers import Serve, ServerProcess

KEYS = "acme: k-acme-123\nglobex: k-globex-456\n"

EMPTIES: dict[str, list[dict[str, Any]]] = {"items": [{}] * 21_000}
"""The review's configuration: ~63 KB of ``{}`` items, 1.45 MiB each as parsed objects."""


# -- the store, in memory ------------------------------------------------------------------


def limits(total: int = 10_000, count: int = 100, each: int = 5_000) -> TokenLimits:
    return TokenLimits(total, count, each)


def token(principal: str, config: bytes | None = None, ttl: float = 60.0) -> ClientToken:
    return ClientToken(principal, ttl, config, digest(f"key-of-{principal}"))


def test_a_token_starts_with_ek_and_is_taken_once() -> None:
    # The OpenAI agents SDK takes a key in a browser only if it starts with "ek_".
    tokens = ClientTokens(limits())
    issued = [tokens.issue(token("acme"), 0.0) for _ in range(2)]
    assert all(isinstance(plain, str) and plain.startswith("ek_") for plain in issued)
    first = issued[0]
    assert isinstance(first, str) and len(set(issued)) == 2
    assert len(first) == 3 + 43  # 32 random bytes in URL-safe base64 after the prefix
    assert tokens.take(first, 1.0) is not None
    assert tokens.take(first, 1.0) is None  # spent
    assert tokens.take(first.removeprefix("ek_"), 1.0) is None  # the prefix is part of it


def test_a_principal_at_its_count_is_refused_and_another_is_not() -> None:
    tokens = ClientTokens(limits(count=3))
    assert all(isinstance(tokens.issue(token("acme"), 0.0), str) for _ in range(3))
    assert tokens.issue(token("acme"), 0.0) is Refused.PRINCIPAL_FULL
    assert isinstance(tokens.issue(token("globex"), 0.0), str)
    assert tokens.held_by("acme") == (3, 3 * TOKEN_OVERHEAD)


def test_a_principal_at_its_bytes_is_refused_and_another_is_not() -> None:
    tokens = ClientTokens(limits(each=2 * (1_000 + TOKEN_OVERHEAD) + 100))
    config = b"x" * 1_000
    assert isinstance(tokens.issue(token("acme", config), 0.0), str)
    assert isinstance(tokens.issue(token("acme", config), 0.0), str)
    assert tokens.issue(token("acme", config), 0.0) is Refused.PRINCIPAL_FULL
    assert isinstance(tokens.issue(token("globex", config), 0.0), str)
    assert tokens.held_bytes == 3 * (1_000 + TOKEN_OVERHEAD)


def test_the_store_is_bounded_in_bytes_whoever_asks() -> None:
    tokens = ClientTokens(limits(total=4 * (1_000 + TOKEN_OVERHEAD)))
    config = b"x" * 1_000
    for name in ("a", "b", "c", "d"):
        assert isinstance(tokens.issue(token(name, config), 0.0), str)
    assert tokens.issue(token("e", config), 0.0) is Refused.STORE_FULL
    assert tokens.held_bytes <= tokens.limits.max_bytes


def test_expired_spent_and_revoked_tokens_stop_counting() -> None:
    tokens = ClientTokens(limits(count=2))
    first = tokens.issue(token("acme", b"{}", ttl=10.0), 0.0)
    assert isinstance(first, str)
    assert isinstance(tokens.issue(token("acme", b"{}", ttl=100.0), 0.0), str)
    assert tokens.issue(token("acme"), 0.0) is Refused.PRINCIPAL_FULL
    assert isinstance(tokens.issue(token("acme"), 11.0), str)  # the first one expired
    assert tokens.take(first, 11.0) is None
    assert len(tokens) == 2 and tokens.held_by("acme")[0] == 2
    tokens.revoke(lambda key: key != digest("key-of-acme"))
    assert len(tokens) == 0 and tokens.held_bytes == 0 and tokens.held_by("acme") == (0, 0)


def test_spent_tokens_leave_no_deadlines_behind() -> None:
    tokens = ClientTokens(limits(count=5))
    for _ in range(10_000):
        plain = tokens.issue(token("acme", ttl=600.0), 0.0)
        assert isinstance(plain, str) and tokens.take(plain, 0.0) is not None
    assert len(tokens._deadlines) <= 64 + 2 * len(tokens)


NAMES = [f"p{i}" for i in range(7)]  # a key ring's names, shared by their tokens


def test_what_a_token_costs_is_at_most_what_it_is_counted() -> None:
    tokens = ClientTokens(limits(total=1 << 40, count=1 << 30, each=1 << 38))
    configs = [None, b"{}", encode(EMPTIES).encode()]
    for config in configs:
        # Each measured over many tokens, with its configuration made anew as the
        # endpoint makes it (encoded from the request), so that its bytes count too.
        n = 2_000 if config is None or len(config) < 100 else 100
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            copy = None if config is None else bytes(bytearray(config))
            tokens.issue(ClientToken(NAMES[i % 7], 60.0, copy, digest("k")), 0.0)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        counted = n * (TOKEN_OVERHEAD + (0 if config is None else len(config)))
        assert used <= counted, (config and len(config), used / n)


def test_the_review_configuration_is_counted_as_its_compact_json() -> None:
    text = encode(EMPTIES).encode()
    assert 55_000 < len(text) < 64 * 1024  # about the review's 63 KB
    tokens = ClientTokens(limits(total=MiB, count=1000, each=MiB // 2))
    issued = 0
    while isinstance(tokens.issue(token("acme", text), 0.0), str):
        issued += 1
    assert issued == (MiB // 2) // (len(text) + TOKEN_OVERHEAD)  # 8, not 300 at 1.45 MiB
    assert isinstance(tokens.issue(token("globex", text), 0.0), str)


# -- the flags ------------------------------------------------------------------------------


def test_a_share_above_half_the_store_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            ["serve", "--client-token-max-bytes", "1000", "--client-token-max-bytes-per-key", "501"]
        )
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--client-token-max-bytes-per-key must be at most half of --client-token-max-bytes" in err
    )
    ServerConfig(client_token_max_bytes=1000, client_token_max_bytes_per_key=500)


# -- through trio-duplex serve ---------------------------------------------------------------


def http(server: ServerProcess, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` to the server, read the answer to its end."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def post(body: bytes, key: str | None = "k-acme-123", *extra: str) -> bytes:
    auth = "" if key is None else f"Authorization: Bearer {key}\r\n"
    more = "".join(f"{line}\r\n" for line in extra)
    return (
        f"POST /v1/client_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{more}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def no_errors(server: ServerProcess) -> None:
    assert "Traceback" not in server.log and " ERROR " not in server.log, server.log


@pytest.mark.integration
def test_one_key_at_its_byte_share_is_refused_while_another_gets_tokens(
    serve: Serve, tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    share = 8 * (len(encode(EMPTIES)) + TOKEN_OVERHEAD)
    server = serve(
        *("--api-key-file", str(tmp_path / "keys")),
        *("--client-token-max-bytes-per-key", str(share)),
        *("--client-token-max-bytes", str(4 * share)),
    )
    body = encode({"session": EMPTIES}).encode()
    statuses = [http(server, post(body))[0] for _ in range(10)]
    assert statuses == [200] * 8 + [429] * 2
    status, headers, answer = http(server, post(body))
    assert status == 429 and headers["retry-after"] == "1"
    assert json.loads(answer) == {"error": "this key has too many client tokens outstanding"}
    assert [http(server, post(body, "k-globex-456"))[0] for _ in range(8)] == [200] * 8
    server.wait_for_line(r"client token refused to acme: it holds 8 tokens", timeout=10)
    no_errors(server)


@pytest.mark.integration
def test_one_key_at_its_count_is_refused_while_another_gets_tokens(
    serve: Serve, tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    server = serve("--api-key-file", str(tmp_path / "keys"), "--client-token-max-per-key", "5")
    assert [http(server, post(b"{}"))[0] for _ in range(25)] == [200] * 5 + [429] * 20
    assert http(server, post(b"", "k-globex-456"))[0] == 200
    # Refusals retried at once do not flood the log: one line per 10 s.
    assert server.log.count("client token refused to acme") == 1, server.log


@pytest.fixture(scope="module")
def keyed(serve_module: Serve, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """A server with KEYS, shared by the module's tests that change nothing in it."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEYS)
    return serve_module("--api-key-file", str(keys))


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.integration
@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"session": {"x": ' + deep(600) + "}}", "arrays and objects may nest at most 32 deep"),
        ('{"session": {"x": ' + deep(31) + "}}", "arrays and objects may nest at most 32 deep"),
        ('{"session": {"x": NaN}}', "the body is not JSON"),
        ('{"ttl_s": Infinity}', "the body is not JSON"),
        ('{"session": {"x": 1e999}}', "the body is not JSON"),
        ('{"session": {"x": "\\ud800"}}', "strings must not hold lone UTF-16 surrogates"),
        ('{"session": {"\\udfff": 1}}', "strings must not hold lone UTF-16 surrogates"),
        ("[1]", "the body must be a JSON object"),
        ("{not json", "the body is not JSON"),
    ],
)
def test_a_token_body_goes_through_the_wire_decoder(
    keyed: ServerProcess, body: str, says: str
) -> None:
    server = keyed
    status, headers, answer = http(server, post(body.encode()))
    assert (status, headers["content-type"]) == (400, "application/json")
    assert json.loads(answer) == {"error": says}
    no_errors(server)


@pytest.mark.integration
def test_a_body_that_is_not_utf_8_or_too_large_is_refused(keyed: ServerProcess) -> None:
    server = keyed
    status, _, answer = http(server, post(b'{"session": {"x": "\xed\xa0\x80"}}'))
    assert (status, json.loads(answer)) == (400, {"error": "the body is not UTF-8"})
    # The body's bound is a first message's: --max-config-bytes and 4 KiB.
    status, _, answer = http(server, post(b" " * (64 * 1024 + 4096 + 1)))
    assert (status, json.loads(answer)) == (413, {"error": "the body exceeds 69632 bytes"})
    shallow = json.dumps({"session": {"x": json.loads(deep(30))}}).encode()
    assert http(server, post(shallow))[0] == 200  # the wire's own depth: 32, the body 1
    no_errors(server)


# -- revoking a key ---------------------------------------------------------------------------


def opened(stack: ExitStack, server: ServerProcess, **options: Any) -> Any:
    """A session opened on a new connection, closed when ``stack`` is."""
    ws = stack.enter_context(ws_connect(server.url, open_timeout=10, ping_interval=None, **options))
    ws.send(json.dumps({"type": "session.update", "session": {}}))
    created = json.loads(ws.recv(timeout=10))
    assert created["type"] == "session.created", created
    return ws


def bearer(credential: str) -> dict[str, Any]:
    return {"additional_headers": {"Authorization": f"Bearer {credential}"}}


@pytest.mark.integration
def test_removing_a_key_revokes_its_tokens_and_ends_its_sessions(
    serve: Serve, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS + "initech: k-initech-789\n")
    server = serve("--api-key-file", str(path), "--client-token-max-per-key", "2")
    with ExitStack() as stack:
        issued = {}
        for name, key in (("acme", "k-acme-123"), ("globex", "k-globex-456")):
            status, _, answer = http(server, post(b'{"ttl_s": 300}', key))
            assert status == 200
            issued[name] = json.loads(answer)["token"]
        acme = opened(stack, server, **bearer("k-acme-123"))
        globex = opened(stack, server, **bearer("k-globex-456"))
        # initech's key is rotated (same NAME, a new key): its session is kept, its old
        # key's tokens are not.
        initech_token = json.loads(http(server, post(b"{}", "k-initech-789"))[2])["token"]
        assert http(server, post(b"{}", "k-initech-789"))[0] == 200  # its share is full:
        assert http(server, post(b"{}", "k-initech-789"))[0] == 429
        initech = opened(stack, server, **bearer("k-initech-789"))
        path.write_text("globex: k-globex-456\ninitech: k-initech-new\n")
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_line(r"API keys reloaded .*: 2 keys; 3 client tokens of removed keys", 10)
        server.wait_for_line(r"WARNING .*API keys removed: acme; 1 of their sessions ended", 10)
        closed = json.loads(acme.recv(timeout=10))
        assert closed["type"] == "session.closed" and closed["reason"] == "credential_revoked"
        for spent in (issued["acme"], initech_token):
            with pytest.raises(InvalidStatus) as refused:
                opened(stack, server, **bearer(spent))
            assert refused.value.response.status_code == 401
        for ws in (globex, initech):  # untouched: they still answer
            ws.send(json.dumps({"type": "input.text.append", "text": "still"}))
            assert json.loads(ws.recv(timeout=10))["text"] == "still"
        opened(stack, server, **bearer(issued["globex"]))
        # The revoked tokens left initech's share: its new key has the whole of it.
        assert [http(server, post(b"{}", "k-initech-new"))[0] for _ in range(3)] == [200, 200, 429]
        assert http(server, post(b"{}", "k-acme-123"))[0] == 401
    assert "k-acme" not in server.log and issued["acme"] not in server.log
    no_errors(server)


@pytest.mark.integration
def test_a_client_that_expects_100_continue_gets_it_then_its_token(keyed: ServerProcess) -> None:
    body = encode({"session": {"instructions": "x" * 20_000}}).encode()
    head = post(body, "k-acme-123", "Expect: 100-continue")[: -len(body)]
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"  # (curl sends on it)
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer


@pytest.mark.integration
def test_the_whole_store_full_answers_503_to_anyone(serve: Serve, tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(KEYS + "initech: k-initech-789\n")
    share = 2 * TOKEN_OVERHEAD  # two tokens without a locked configuration
    server = serve(
        *("--api-key-file", str(tmp_path / "keys")),
        *("--client-token-max-bytes-per-key", str(share)),
        *("--client-token-max-bytes", str(2 * share)),
    )
    for key in ("k-acme-123", "k-globex-456"):
        assert [http(server, post(b"{}", key))[0] for _ in range(3)] == [200, 200, 429]
    status, headers, answer = http(server, post(b"{}", "k-initech-789"))
    assert (status, headers["retry-after"]) == (503, "1")
    assert json.loads(answer) == {"error": "too many client tokens outstanding; retry later"}
    server.wait_for_line(r"WARNING .*client token refused to initech: 2048 bytes held", 10)
