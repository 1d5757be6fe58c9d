"""The ``trio-duplex serve`` command: flag validation, --help, the ready line."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from trio_duplex import ServerConfig
from trio_duplex.cli import EXIT_ABANDONED, main, serve_flags, shown_default
from trio_duplex.core.limits import Limits
from trio_duplex.engines.api import load_engine_factory

from ..helpers import Serve

FLAGS = {
    "--host",
    "--port",
    "--path",
    "--realtime-path",
    "--tls-cert",
    "--tls-key",
    "--allow-origin",
    "--api-key-file",
    "--client-token-max-ttl",
    "--client-token-max-bytes",
    "--client-token-max-per-key",
    "--client-token-max-bytes-per-key",
    "--auth",
    "--engine",
    "--max-sessions",
    "--disconnect-grace",
    "--unconfirmed-grace",
    "--idle-ttl",
    "--journal-max-bytes",
    "--journal-ttl",
    "--max-event-bytes",
    "--max-config-bytes",
    "--max-input-bytes",
    "--max-output-bytes",
    "--write-timeout",
    "--handshake-timeout",
    "--max-connections",
    "--max-connections-per-ip",
    "--config-timeout",
    "--replay-timeout",
    "--drain-timeout",
    "--engine-stop-timeout",
    "--loop-lag-warning",
    "--metrics-port",
    "--demo",
    "--cluster",
    "--node-id",
    "--advertise-url",
    "--cluster-max-sessions",
    "--cluster-secret",
    "--relay-port",
    "--cluster-ca",
    "--cluster-redis-ca",
    "--workers",
    "--reuse-port",
    "--upstream",
    "--upstream-header",
    "--speech-model",
    "--speech-voice",
    "--speech-recognisers",
    "--calls",
    "--call-answer-timeout",
    "--call-setup-timeout",
    "--call-consent-timeout",
    "--call-max-setup",
    "--call-max-sdp-bytes",
    "--call-host",
    "--call-advertise",
    "--call-ice-server",
    "--call-udp-ports",
    "--call-allow-peer",
    "--twilio-path",
    "--twilio-auth-token",
    "--twilio-account-sid",
    "--twilio-public-url",
    "--twilio-insecure-no-signature",
    "--twilio-ticket-ttl",
    "--twilio-max-redirects",
    "--twilio-max-buffered",
    "--twilio-mark-interval",
    "--twilio-max-queued",
    "--log-level",
    "--log-format",
    "--config",
}


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_duplex", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


BAD_VALUES = [
    ("--port", "-1"),
    ("--port", "65536"),
    ("--port", "http"),
    ("--port", "80.5"),
    ("--max-sessions", "0"),
    ("--max-sessions", "-2"),
    ("--max-sessions", "1.5"),
    ("--max-sessions", "many"),
    ("--disconnect-grace", "abc"),
    ("--disconnect-grace", "-1"),
    ("--disconnect-grace", "nan"),
    ("--disconnect-grace", "inf"),
    ("--unconfirmed-grace", "-1"),
    ("--unconfirmed-grace", "nan"),
    ("--idle-ttl", "0"),
    ("--idle-ttl", "-5"),
    ("--journal-max-bytes", "0"),
    ("--journal-max-bytes", "1e3"),
    ("--journal-ttl", "0"),
    ("--max-event-bytes", "0"),
    ("--max-event-bytes", "lots"),
    ("--max-connections", "0"),
    ("--max-connections", "1e4"),
    ("--max-connections-per-ip", "0"),
    ("--max-connections-per-ip", "-1"),
    ("--config-timeout", "0"),
    ("--config-timeout", "-0.5"),
    ("--drain-timeout", "-1"),
    ("--engine-stop-timeout", "-1"),
    ("--engine-stop-timeout", "soon"),
    ("--loop-lag-warning", "-0.1"),
    ("--loop-lag-warning", "soon"),
    ("--metrics-port", "-1"),
    ("--metrics-port", "65536"),
    ("--log-level", "loud"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_VALUES)
def test_bad_flag_value_exits_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert "error:" in err
    assert flag in err, err  # the message names the flag ...
    assert value in err, err  # ... and the value it refused
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--engine", "nosuch:thing"),
        ("--engine", "nosuch"),
        ("--engine", "trio_duplex.engines.echo:Missing"),
        ("--engine", "os:sep"),
        ("--path", "no-slash"),
        ("--path", "/with?query=1"),
        ("--realtime-path", "no-slash"),
        ("--realtime-path", "/v1/duplex"),
    ],
)
def test_bad_engine_or_path_exits_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert value in err, err
    assert "Traceback" not in err


def test_bad_values_exit_2_from_the_real_command() -> None:
    for args in (("--port", "-1"), ("--max-sessions", "0"), ("--engine", "nosuch:thing")):
        result = run_cli("serve", *args)
        assert result.returncode == 2, result
        assert "error:" in result.stderr
        assert args[1] in result.stderr
        assert "Traceback" not in result.stderr


def test_unknown_flag_or_missing_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--no-such-flag"])
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_help_lists_exactly_the_flags() -> None:
    result = run_cli("serve", "--help")
    assert result.returncode == 0, result
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", result.stdout))
    assert shown == FLAGS | {"--help"}, sorted(shown ^ (FLAGS | {"--help"}))


def readme_serve_table() -> dict[str, str]:
    """The README's table of ``trio-duplex serve`` flags: flag -> default as written."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## `trio-duplex serve`\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()]
    table = {}
    for cells in rows:
        if len(cells) == 3 and cells[0].strip().startswith("`--"):
            table[cells[0].strip().strip("`")] = cells[1].strip()
    return table


def test_readme_lists_every_flag_with_the_default_help_shows() -> None:
    table = readme_serve_table()
    assert set(table) == FLAGS, sorted(set(table) ^ FLAGS)
    for flag, field, _ in serve_flags():
        assert table[flag] == shown_default(field), flag


def test_server_config_refusals_name_the_field_and_value() -> None:
    # The CLI's messages reuse the rule; an embedder sees the field's name.
    with pytest.raises(ValueError, match=r"^idle_ttl_s must be greater than 0, got 0$"):
        ServerConfig(idle_ttl_s=0)
    with pytest.raises(ValueError, match=r"^port must be at most 65535, got 65536$"):
        ServerConfig(port=65536)


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "trio-duplex"
    assert script.exists()
    result = subprocess.run(
        [str(script), "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert "--max-sessions" in result.stdout


@pytest.mark.integration
def test_ready_line_holds_the_url(serve: Serve) -> None:
    server = serve()
    assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/v1/duplex", server.url), server.url
    assert server.port != 0  # --port 0: the line names the port actually bound
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"


@pytest.mark.integration
def test_ready_line_holds_a_custom_path(serve: Serve) -> None:
    server = serve("--path", "/custom/endpoint", "--host", "127.0.0.1")
    assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/custom/endpoint", server.url), server.url
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.heartbeat"}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"


@pytest.mark.integration
def test_fractions_are_accepted_for_seconds(serve: Serve) -> None:
    server = serve(
        "--disconnect-grace",
        "0.5",
        "--idle-ttl",
        "2.5",
        "--journal-ttl",
        "1.25",
        "--config-timeout",
        "0.3",
        "--drain-timeout",
        "0.5",
    )
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        created = json.loads(ws.recv(timeout=5))
        assert created["limits"]["disconnect_grace_s"] == 0.5
        assert created["limits"]["idle_ttl_s"] == 2.5
    # The fractional config timeout is in force: no first message → refused in ~0.3 s.
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        started = time.monotonic()
        error = json.loads(ws.recv(timeout=5))
        assert error["code"] == "config_timeout"
        assert time.monotonic() - started < 2
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4002


@pytest.mark.integration
def test_zero_is_accepted_where_it_makes_sense(serve: Serve) -> None:
    server = serve("--disconnect-grace", "0", "--drain-timeout", "0")
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        created = json.loads(ws.recv(timeout=5))
        assert created["limits"]["disconnect_grace_s"] == 0


@pytest.mark.integration
def test_port_in_use_exits_1_with_a_message() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", "--port", str(port))
    assert result.returncode == 1, result
    assert "cannot listen" in result.stderr
    assert str(port) in result.stderr
    assert "Traceback" not in result.stderr


# -- ending with an engine that ignores its cancellation ---------------------------------

STUBBORN = "tests.server.stubborn_engine:Stubborn"
ROOT = str(Path(__file__).parents[2])


@contextmanager
def open_stubborn_session(url: str) -> Iterator[ClientConnection]:
    with connect(url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
        yield ws


@pytest.mark.integration
def test_sigterm_with_a_stuck_engine_exits_70_after_the_drain_and_the_stop_timeout(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: the drain ended the session, then the process waited for the engine for ever.
    monkeypatch.setenv("PYTHONPATH", ROOT)
    server = serve("--engine", STUBBORN, "--drain-timeout", "0.5", "--engine-stop-timeout", "1")
    with open_stubborn_session(server.url) as ws:
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert json.loads(ws.recv(timeout=5))["type"] == "session.going_away"
        closed = json.loads(ws.recv(timeout=10))
        assert (closed["type"], closed["reason"]) == ("session.closed", "server_shutdown")
        assert time.monotonic() - started >= 0.5 + 1 - 0.1
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    assert server.wait(timeout=10) == EXIT_ABANDONED == 70
    server.wait_for_line(r"ERROR .* did not return within 1\.0s of its cancellation", 5)
    server.wait_for_line(r"ERROR .* 1 abandoned engine\(s\) .* \(status 70\)", 5)


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_second_signal_exits_at_once_even_with_a_stuck_engine(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    # Was: the second signal cancelled the server, which then waited for the engine.
    monkeypatch.setenv("PYTHONPATH", ROOT)
    server = serve("--engine", STUBBORN, "--drain-timeout", "60", "--engine-stop-timeout", "60")
    with open_stubborn_session(server.url) as ws:
        server.proc.send_signal(signum)
        assert json.loads(ws.recv(timeout=5))["type"] == "session.going_away"  # draining
        server.proc.send_signal(signum)
        assert server.wait(timeout=10) == 128 + signum
    server.wait_for_line(rf"WARNING .* second signal \({signum.name}\): exiting now", 5)


# -- --engine: checked at start ---------------------------------------------------------

SHOUT = """\
from trio_duplex import Engine


class Shout(Engine):
    accepts = frozenset({"input.text.append"})

    def __init__(self, config):
        self.config = config

    async def run(self, session):
        async for event in session:
            await session.send(
                {"type": "response.output_text.delta", "text": event["text"].upper()}
            )
"""

BROKEN_ENGINES = {
    "syntax": ("def factory(:\n", "invalid syntax"),
    "raises_at_import": ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
    "imports_missing": ("import no_such_module_here\n", "No module named 'no_such_module_here'"),
    "no_attribute": ("x = 1\n", "has no 'factory'"),
    "not_callable": ("factory = 3\n", "is not callable"),
    "returns_a_number": ("def factory(config):\n    return 42\n", "returned 42"),
    "async_factory": ("async def factory(config):\n    pass\n", "a coroutine"),
    "factory_fails": (
        "def factory(config):\n    return config['model']\n",
        "failed for a session with no configuration ({}): KeyError: 'model'",
    ),
    "sync_run": (
        "class factory:\n    accepts = frozenset()\n"
        "    def __init__(self, config):\n        pass\n"
        "    def check(self, event):\n        pass\n"
        "    def run(self, session):\n        pass\n",
        "'run' is not an async function",
    ),
    "no_run": (
        "from trio_duplex import Engine\nclass factory(Engine):\n"
        "    def __init__(self, config):\n        pass\n",
        "does not implement 'run'",
    ),
    "bad_accepts": (
        "from trio_duplex import Engine\nclass factory(Engine):\n"
        "    accepts = 'input.text.append'\n"
        "    def __init__(self, config):\n        pass\n    async def run(self, session):\n"
        "        pass\n",
        "no 'accepts' collection",
    ),
}


@pytest.fixture
def engine_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A current directory for engine modules; what the test imports from it is forgotten."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.parametrize("case", sorted(BROKEN_ENGINES))
def test_every_way_an_engine_can_fail_to_load_exits_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], engine_dir: Path, case: str
) -> None:
    source, expected = BROKEN_ENGINES[case]
    (engine_dir / f"engine_{case}.py").write_text(source, encoding="utf-8")
    spec = f"engine_{case}:factory"
    with pytest.raises(SystemExit) as info:
        main(["serve", "--engine", spec, "--port", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err
    assert spec in error_lines[0] and expected in error_lines[0], err
    assert "Traceback" not in err


def test_a_factory_may_refuse_an_empty_configuration_with_bad_event(engine_dir: Path) -> None:
    # Such an engine is legitimate: clients opening with no configuration get bad_event.
    (engine_dir / "picky_engine.py").write_text(
        "from trio_duplex import BadEvent\n"
        "def factory(config):\n"
        "    raise BadEvent('model is required', param='model')\n",
        encoding="utf-8",
    )
    sys.path.insert(0, str(engine_dir))
    assert load_engine_factory("picky_engine:factory") is not None


def test_the_console_script_loads_an_engine_from_the_current_directory(tmp_path: Path) -> None:
    # As `python -m trio_duplex serve` does: the README's `--engine shout:Shout`.
    (tmp_path / "shout.py").write_text(SHOUT, encoding="utf-8")
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    script = str(Path(sys.executable).parent / "trio-duplex")
    broken = subprocess.run(
        [script, "serve", "--engine", "broken:f"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert broken.returncode == 2, broken.stderr
    assert "cannot load engine 'broken:f': invalid syntax" in broken.stderr
    assert "Traceback" not in broken.stderr
    with subprocess.Popen(
        [script, "serve", "--engine", "shout:Shout", "--port", "0"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stderr is not None
            ready = proc.stderr.readline()  # the first line: serving, or the error
            match = re.search(r"serving (ws://\S+) \(engine shout:Shout\)", ready)
            assert match, ready
            with connect(match[1], open_timeout=5, ping_interval=None) as ws:
                ws.send(json.dumps({"type": "input.text.append", "text": "hi"}))
                assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
                assert json.loads(ws.recv(timeout=5))["text"] == "HI"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


@pytest.mark.integration
def test_listening_beyond_loopback_without_authentication_warns(serve: Serve) -> None:
    exposed = serve("--host", "0.0.0.0")
    line = exposed.wait_for_line(r"WARNING .*no authentication", timeout=10)
    assert "listening on 0.0.0.0 with no authentication" in line.string
    local = serve("--host", "127.0.0.1")
    local.interrupt()
    assert local.wait(timeout=15) == 0
    assert "no authentication" not in local.log  # the whole log: the server has exited


@pytest.mark.parametrize(
    "value", ["sk-header-value-without-a-name", "X-Key sk-header-value-without-a-name"]
)
def test_a_malformed_upstream_header_is_refused_without_showing_it(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """A header with no ':' may be the credential alone: the error names the flag only."""
    with pytest.raises(SystemExit) as info:
        main(["serve", "--engine", "realtime-proxy", "--upstream-header", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--upstream-header" in err and "must be 'NAME: VALUE'" in err, err
    assert "sk-header-value" not in err, err


def test_the_config_hands_the_core_its_limits_with_the_same_defaults_and_bounds() -> None:
    assert ServerConfig().core_limits == Limits()
    names = [a.name for a in attrs.fields(Limits)]
    # Each at a value of its own, so that a field handed down as another shows.
    given: dict[str, Any] = {name: 7 + n for n, name in enumerate(names)}
    limits = ServerConfig(**given).core_limits
    assert {name: getattr(limits, name) for name in names} == given
    # Whatever ServerConfig accepts, Limits does: a valid config never fails to hand down.
    for name in names:
        for value in (-1, 0, 0.001, 1):
            setting: dict[str, Any] = {name: value}
            try:
                config = ServerConfig(**setting)
            except ValueError:
                continue
            assert getattr(config.core_limits, name) == value
    config = ServerConfig(max_config_bytes=100, max_pending_input=3)
    assert config.limits() == config.core_limits.advertised()
    assert config.first_message_bytes == config.core_limits.first_message_bytes
