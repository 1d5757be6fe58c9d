"""The JavaScript client (clients/js) against a cluster of three real ``trio-duplex
serve`` nodes and a real redis-server: a deploy (SIGTERM) of its session's node moves
the session (``session.going_away {migrating: true}``), and the client resumes it on
another node at once, every event once and in order (clients/js/test/cluster.test.js,
which sends the SIGTERM itself at a chosen point), over ``/v1/duplex`` and over
``/v1/realtime`` (``dialect: "openai"``)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable

import pytest
import trio

from ..helpers import JS_CLIENT, ServerProcess, node_executable, run_node_tests

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dialect", ["native", "openai"])
async def test_js_client_follows_a_migration(
    nodes: Callable[..., list[ServerProcess]], dialect: str
) -> None:
    node = node_executable()
    cluster = nodes("abc", "--relay-port", "0")
    env = {
        "TRIO_DUPLEX_CLUSTER": json.dumps([{"url": n.url, "pid": n.proc.pid} for n in cluster]),
        "TRIO_DUPLEX_DIALECT": dialect,
    }
    files = [str(JS_CLIENT / "test" / "cluster.test.js")]
    run = functools.partial(run_node_tests, node, files, env)
    passed, output = await trio.to_thread.run_sync(run)
    assert passed == 1
    # The node the JS test sent SIGTERM to (it prints its URL) drained, handing the
    # session over, and exited 0.
    home = re.search(r"deployed ws://[^/]+:(\d+)/", output)
    assert home is not None, output
    [deployed] = [n for n in cluster if n.port == int(home.group(1))]
    assert await trio.to_thread.run_sync(deployed.wait, 15) == 0
    assert "handed over to the cluster" in deployed.log
