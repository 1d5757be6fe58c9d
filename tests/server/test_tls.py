"""``trio-duplex serve --tls-cert/--tls-key``: wss:// with certificates made by trustme,
reached by websockets, by ``trio_duplex.client.connect`` and by ``trio-duplex connect``;
a client's TLS failure is a client fault, the handshake is bounded, the limits hold."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives import serialization
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from trio_duplex.cli import main
from trio_duplex.client import ServerRefused, connect
from trio_duplex.client.options import ClientOptions, ReconnectPolicy

from ..helpers import Certs, Serve, ServerProcess, issue_certs

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return issue_certs(tmp_path_factory.mktemp("tls"))


def tls_flags(certs: Certs, *more: str) -> tuple[str, ...]:
    return ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key), *more)


def trusting(certs: Certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


@pytest.fixture(scope="module")
def tls_server(serve_module: Serve, certs: Certs) -> ServerProcess:
    return serve_module(*tls_flags(certs, "--handshake-timeout", "2"))


def open_session(url: str, context: ssl.SSLContext) -> Any:
    return ws_connect(url, ssl=context, open_timeout=TIMEOUT, ping_interval=None)


# -- serving -----------------------------------------------------------------------------


@pytest.mark.integration
def test_ready_line_says_wss_and_websockets_connects(
    tls_server: ServerProcess, certs: Certs
) -> None:
    assert re.fullmatch(r"wss://127\.0\.0\.1:\d+/v1/duplex", tls_server.url), tls_server.url
    with open_session(tls_server.url, trusting(certs)) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "session.created"
        ws.send(json.dumps({"type": "input.text.append", "text": "über TLS"}))
        assert json.loads(ws.recv(timeout=TIMEOUT))["text"] == "über TLS"


@pytest.mark.integration
async def test_the_client_connects_with_an_ssl_context(
    tls_server: ServerProcess, certs: Certs
) -> None:
    with trio.fail_after(TIMEOUT):
        async with connect(tls_server.url, {}, ssl_context=trusting(certs)) as session:
            await session.send({"type": "input.text.append", "text": "hi"})
            assert (await session.receive())["text"] == "hi"


@pytest.mark.integration
async def test_the_client_gives_up_at_once_on_an_untrusted_certificate(
    tls_server: ServerProcess,
) -> None:
    # Retrying cannot make the certificate trusted: refused, not retried for 30 s.
    options = ClientOptions(reconnect=ReconnectPolicy(deadline=60, max_attempts=10))
    with trio.fail_after(TIMEOUT), pytest.raises(ServerRefused, match="certificate"):
        async with connect(
            tls_server.url, {}, options=options, ssl_context=ssl.create_default_context()
        ):
            raise AssertionError("not reached")


def test_an_ssl_context_needs_a_wss_url() -> None:
    async def attempt() -> None:
        async with connect("ws://127.0.0.1:1/", ssl_context=ssl.create_default_context()):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="wss://"):
        trio.run(attempt)


@pytest.mark.integration
def test_trio_duplex_connect_with_ca(tls_server: ServerProcess, certs: Certs) -> None:
    command = [sys.executable, "-m", "trio_duplex", "connect"]
    done = subprocess.run(
        [*command, "--ca", str(certs.ca), "--linger", "0.2", tls_server.url],
        input="hello tls\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "hello tls" in done.stdout
    assert "session.closed" in done.stdout
    # A missing CA file, or --ca with ws://, is a usage error.
    for url, ca in ((tls_server.url, certs.ca.with_name("missing.pem")), ("ws://h:1", certs.ca)):
        bad = subprocess.run(
            [*command, "--ca", str(ca), url], input="", capture_output=True, text=True, timeout=60
        )
        assert bad.returncode == 2, bad.stderr
        assert "--ca" in bad.stderr and "Traceback" not in bad.stderr


# -- a client's TLS failures -------------------------------------------------------------


def read_to_end(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


@pytest.mark.integration
def test_plain_http_on_the_tls_port_is_a_client_fault(tls_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"GET /v1/duplex HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = read_to_end(sock)
        except ConnectionResetError:
            answer = b""
    assert b"HTTP/1.1" not in answer  # a TLS alert at most
    tls_server.wait_for_line(r"INFO trio_duplex: client fault .*TLS handshake failed", TIMEOUT)
    assert "Traceback" not in tls_server.log
    assert "ERROR" not in tls_server.log


@pytest.mark.integration
def test_a_client_that_distrusts_the_certificate_is_a_client_fault(
    tls_server: ServerProcess,
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        with open_session(tls_server.url, ssl.create_default_context()):
            raise AssertionError("not reached")
    tls_server.wait_for_line(r"client fault on a connection from 127\.0\.0\.1: TLS", TIMEOUT)
    assert "Traceback" not in tls_server.log


@pytest.mark.integration
def test_a_silent_tls_client_is_cut_after_the_handshake_timeout(
    tls_server: ServerProcess,
) -> None:
    # --handshake-timeout 2: a TCP connection that never starts TLS is closed then.
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=TIMEOUT) as sock:
        assert read_to_end(sock) == b""


@pytest.mark.integration
def test_the_per_ip_limit_holds_over_tls(serve: Serve, certs: Certs) -> None:
    server = serve(*tls_flags(certs, "--max-connections-per-ip", "1"))
    with open_session(server.url, trusting(certs)) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "session.created"
        with pytest.raises(InvalidStatus) as refused:
            with open_session(server.url, trusting(certs)):
                raise AssertionError("not reached")
        assert refused.value.response.status_code == 503


# -- the flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "missing"), [("--tls-cert", "--tls-key"), ("--tls-key", "--tls-cert")]
)
def test_one_tls_flag_alone_exits_2(
    capsys: pytest.CaptureFixture[str], certs: Certs, given: str, missing: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", given, str(certs.cert)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {given} needs {missing}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("which", "why"),
    [
        ("cert", "No such file"),
        ("key", "No such file"),
        ("swapped", "not a PEM certificate chain and its matching private key"),
        ("encrypted", "the key is encrypted"),
    ],
)
def test_unusable_tls_files_exit_2(
    capsys: pytest.CaptureFixture[str], certs: Certs, tmp_path: Path, which: str, why: str
) -> None:
    cert, key = str(certs.cert), str(certs.key)
    if which == "cert":
        cert = str(tmp_path / "no-such-cert.pem")
    elif which == "key":
        key = str(tmp_path / "no-such-key.pem")
    elif which == "swapped":
        cert, key = key, cert
    else:
        plain = serialization.load_pem_private_key(certs.key.read_bytes(), None)
        key = str(tmp_path / "encrypted.pem")
        Path(key).write_bytes(
            plain.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
    with pytest.raises(SystemExit) as info:
        main(["serve", "--tls-cert", cert, "--tls-key", key])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: cannot use --tls-cert" in err, err
    assert why in err, err
    assert "Traceback" not in err
    assert "PRIVATE KEY" not in err and "BEGIN" not in err  # nothing read from the files
