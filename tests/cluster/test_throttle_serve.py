"""Cluster mode with keys: a credential nothing here knows may still try one resume (it
may be a token of a session on another node), and each costs a store call; an address
whose such resumes keep failing gets 429 before the upgrade (server/front/throttle.py)."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from urllib.request import urlopen

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from trio_duplex.server.front.throttle import Failures

from ..helpers import ServerProcess

# -- the table, in memory --------------------------------------------------------------------


def test_an_address_past_its_burst_is_refused_until_it_is_forgiven() -> None:
    failures = Failures(burst=3, rate=1.0)
    for _ in range(3):
        assert failures.allows("10.0.0.1", 0.0)
        failures.failed("10.0.0.1", 0.0)
    assert not failures.allows("10.0.0.1", 0.0)
    assert failures.allows("10.0.0.2", 0.0)  # another address is not
    assert failures.allows("10.0.0.1", 1.0)  # one forgiven a second


def test_ipv6_addresses_count_by_their_64_prefix() -> None:
    failures = Failures(burst=2, rate=1.0)
    failures.failed("2001:db8::1", 0.0)
    failures.failed("2001:db8::ffff:2", 0.0)
    assert not failures.allows("2001:db8::3", 0.0)
    assert failures.allows("2001:db8:0:1::1", 0.0)


def test_the_table_never_holds_more_than_its_bound() -> None:
    failures = Failures(burst=2, rate=1.0, max_addresses=100)
    for i in range(10_000):
        failures.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 0.0)
    assert len(failures) == 100
    failures.failed("10.9.9.9", 0.0)
    failures.failed("10.9.9.9", 0.0)
    assert not failures.allows("10.9.9.9", 0.0)  # the newest are the ones kept


# -- through trio-duplex serve --cluster ------------------------------------------------------


def resume_with(server: ServerProcess, credential: str) -> int:
    """The HTTP status of an upgrade presenting ``credential``, 101 once its resume has
    been tried (and refused: nothing here or in the store knows it)."""
    try:
        with connect(
            server.url,
            additional_headers={"Authorization": f"Bearer {credential}"},
            open_timeout=10,
            ping_interval=None,
        ) as ws:
            resume = {
                "type": "session.resume",
                "session_id": "sess_" + secrets.token_hex(8),
                "resume_token": credential,
            }
            ws.send(json.dumps(resume))
            error = json.loads(ws.recv(timeout=10))
            assert error["type"] == "error", error
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


async def test_failed_unknown_credentials_are_throttled_per_address(
    cluster: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # (async for the store fixture, which empties the shared Redis; the clients block)
    (tmp_path / "keys").write_text("acme: k-acme-123\n")
    throttled_through(cluster("a", "--api-key-file", str(tmp_path / "keys")))


def throttled_through(node: ServerProcess) -> None:
    start = time.monotonic()
    statuses = [resume_with(node, secrets.token_urlsafe(16)) for _ in range(80)]
    elapsed = time.monotonic() - start
    assert set(statuses) == {101, 429}, statuses
    first = statuses.index(429)
    assert 30 <= first <= 30 + 2 * elapsed + 1, (first, elapsed)  # the burst, and 2/s
    # A key is still a key: the throttle is for credentials nothing here knows.
    with connect(
        node.url, additional_headers={"Authorization": "Bearer k-acme-123"}, open_timeout=10
    ) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    assert "Traceback" not in node.log and " ERROR " not in node.log, node.log
    metrics = urlopen(node.url.replace("ws://", "http://").replace("/v1/duplex", "/metrics"))
    counted = re.search(r'refusals_total\{reason="throttled"\} (\d+)', metrics.read().decode())
    assert counted is not None and int(counted.group(1)) == statuses.count(429)


pytestmark = pytest.mark.integration
