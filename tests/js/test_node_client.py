"""The JavaScript client (clients/js) against a real ``trio-duplex serve``.

Runs its own tests, Node's test runner over ``clients/js/test/*.test.js`` (with
``--experimental-websocket``: Node 20 has no global WebSocket without it), against two
servers started here: the echo engine, and the echo engine behind ``--api-key-file``.
The Node tests check open/send/receive, close and detach, resume, the binary audio
lane, typed errors, and exactly-once through a proxy that cuts connections at random.
Then ``tsc`` checks the module's JSDoc types and its ``.d.ts`` (``.ci/run`` installs
TypeScript when it is missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import JS_CLIENT as CLIENT
from tests.helpers import Servers, node_executable, run_node_tests

API_KEY = "js-test-key-0123456789"
MAX_EVENT_BYTES = 100_000  # as clients/js/test/helpers.js expects

pytestmark = pytest.mark.integration


def test_node_client_against_serve(servers: Servers, tmp_path: Path) -> None:
    node = node_executable()
    keys = tmp_path / "keys"
    keys.write_text(f"js-tests:{API_KEY}\n")
    echo, auth = servers.start_many(
        (),
        ("--api-key-file", str(keys), "--max-event-bytes", str(MAX_EVENT_BYTES)),
    )
    env = {
        **os.environ,
        "TRIO_DUPLEX_URL": echo.url,
        "TRIO_DUPLEX_AUTH_URL": auth.url,
        "TRIO_DUPLEX_API_KEY": API_KEY,
        "TRIO_DUPLEX_PYTHON": sys.executable,
    }
    files = sorted(str(path) for path in (CLIENT / "test").glob("*.test.js"))
    assert files, "no JS test files"
    passed, _ = run_node_tests(node, files, env)
    assert passed >= 20, f"only {passed} JS tests passed"


def test_typescript_checks_the_module_and_its_types() -> None:
    tsc = shutil.which("tsc")
    if tsc is None:
        pytest.skip("tsc is not installed (.ci/run installs typescript with npm)")
    run = subprocess.run(
        [tsc, "--project", str(CLIENT / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"tsc found errors:\n{run.stdout}{run.stderr}"
