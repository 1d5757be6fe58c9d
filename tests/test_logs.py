"""The serve command's logs (trio_duplex/logs.py): ``--log-format json`` writes one JSON
object per line, with the session's id and generation on its lines and never a resume
token; and ``trio-duplex --version``."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import re
import signal
import subprocess
import sys
from typing import Any

import pytest
from websockets.sync.client import connect

from trio_duplex.logs import JsonFormatter, Redactor, register_secret

from .helpers import Serve


def record(message: str, *args: object, **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("trio_duplex", logging.WARNING, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_holds_the_keys() -> None:
    line = JsonFormatter().format(record("session %s opened", "sess_1", session_id="sess_1"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed == {
        "timestamp": parsed["timestamp"],
        "level": "WARNING",
        "logger": "trio_duplex",
        "message": "session sess_1 opened",
        "session_id": "sess_1",
    }
    stamp = datetime.datetime.fromisoformat(parsed["timestamp"])
    assert stamp.utcoffset() == datetime.timedelta(0)  # UTC, ending in Z
    assert parsed["timestamp"].endswith("Z")


def test_a_json_line_holds_the_generation_and_leaves_out_what_is_none() -> None:
    parsed = json.loads(
        JsonFormatter().format(record("m", session_id="sess_1", generation=2, other=3))
    )
    assert (parsed["session_id"], parsed["generation"]) == ("sess_1", 2)
    assert "other" not in parsed
    parsed = json.loads(JsonFormatter().format(record("m", session_id=None, generation=None)))
    assert "session_id" not in parsed and "generation" not in parsed


def test_a_json_line_holds_a_traceback_on_one_line() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        made = record("engine failed")
        made.exc_info = sys.exc_info()
    line = JsonFormatter().format(made)
    assert "\n" not in line
    assert "RuntimeError: boom\nsecond line" in json.loads(line)["exception"]


def test_the_redactor_masks_a_third_party_record_its_traceback_and_both_formats() -> None:
    """On the handler, so a record of any logger (websockets.client here) is masked: its
    message with its arguments, and its traceback, as text and as JSON."""
    secret = "reg-" + "9f3e1c2a7b"
    register_secret(secret)
    try:
        raise ValueError(f"cannot reach redis://:{secret}@127.0.0.1:1/0")
    except ValueError:
        info = sys.exc_info()
    for formatter in (logging.Formatter("%(message)s"), JsonFormatter()):
        made = logging.LogRecord(
            "websockets.client", logging.DEBUG, __file__, 1, "> %s: %s",
            ("Authorization", f"Bearer {secret}"), info,
        )  # fmt: skip
        assert Redactor().filter(made)
        line = formatter.format(made)
        assert secret not in line and "9f3e1c2a7b" not in line, line
        assert "Authorization: ***" in line and "redis://:***@127.0.0.1:1/0" in line, line


def test_version_prints_the_package_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trio_duplex", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result
    assert result.stdout == f"trio-duplex {importlib.metadata.version('trio-duplex')}\n"


def _send(ws: Any, event: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(event))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=5))
    return answer


@pytest.mark.integration
def test_json_logs_name_the_session_and_never_hold_its_token(serve: Serve) -> None:
    server = serve("--log-format", "json", "--log-level", "DEBUG")
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        created = _send(ws, {"type": "session.update", "session": {}})
        _send(ws, {"type": "input.text.append", "text": "hi", "client_event_seq": 1})
    session_id, first_token = created["session_id"], created["resume_token"]
    server.wait_for_line(rf'"message": "session {session_id} detached', 5)
    resume = {
        "type": "session.resume",
        "session_id": session_id,
        "resume_token": first_token,
        "last_received_server_event_seq": 1,
    }
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        resumed = _send(ws, resume)
        assert resumed["type"] == "session.resumed", resumed
        assert _send(ws, {"type": "session.close"})["type"] == "session.closed"
    server.wait_for_line(rf'"message": "session {session_id} ended', 5)
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    server.stop()  # joins the reader: every line is in
    output = server.log

    assert first_token not in output and resumed["resume_token"] not in output
    lines = [json.loads(line) for line in output.splitlines()]
    assert lines, output
    for line in lines:
        assert {"timestamp", "level", "message"} <= set(line), line
    about = {}
    for line in lines:
        match = re.match(r"session (\S+?):? (\w+)", line["message"])
        if match:
            assert line.get("session_id") == match.group(1), line
            about[match.group(2)] = line
    assert set(about) >= {"opened", "detached", "resumed", "ended"}, about
    assert about["opened"]["generation"] == 1
    assert about["detached"]["generation"] == 1
    assert about["resumed"]["generation"] == 2
    assert about["ended"]["generation"] == 2
    assert any(line["message"].startswith("serving ws://") for line in lines)


async def test_the_opened_line_names_the_principal(tmp_path: Any) -> None:
    # With --api-key-file, the session's "opened" line carries the key's name (and
    # never the key).
    import trio

    from trio_duplex import DuplexServer, ServerConfig
    from trio_duplex.client import ClientOptions, connect
    from trio_duplex.engines.echo import EchoEngine

    keys = tmp_path / "keys"
    keys.write_text("acme: k-acme-123\n")
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    handler = Collect()
    logger = logging.getLogger("trio_duplex")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        config = ServerConfig(host="127.0.0.1", port=0, api_key_file=str(keys))
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(DuplexServer(config, EchoEngine).run_tcp)
                url = f"ws://127.0.0.1:{port}/v1/duplex"
                async with connect(url, options=ClientOptions(api_key="k-acme-123")):
                    pass
                nursery.cancel_scope.cancel()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    opened = [json.loads(line) for line in lines if " opened" in line]
    assert [entry.get("principal") for entry in opened] == ["acme"]
    assert not any("k-acme-123" in line for line in lines)
