"""Settings from the environment and a TOML file (trio_duplex/settings.py): flag >
environment > file > default, for any flag of the parser, and refusals that name their
source. In process on a parser of its own, then through ``trio-duplex serve`` itself."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.sync.client import connect

from trio_duplex import cli
from trio_duplex.cli import main
from trio_duplex.settings import Layers

from .helpers import Serve


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def parser_and_layers() -> tuple[argparse.ArgumentParser, Layers]:
    """A parser with a flag of each kind another engineer might add."""
    p = argparse.ArgumentParser(prog="t", exit_on_error=True)
    p.add_argument("--max-things", type=_positive, default=4)
    p.add_argument("--name", default="n")
    p.add_argument("--level", type=str.lower, choices=["low", "high"], default="low")
    p.add_argument("--allow-origin", action="append", default=[])  # repeatable
    p.add_argument("--trust-proxy", action="store_true")
    p.add_argument("--config")
    return p, Layers.take(p)


def resolve(
    argv: list[str], environ: dict[str, str] | None = None, toml: str | None = None, *, tmp: Path
) -> argparse.Namespace:
    p, layers = parser_and_layers()
    if toml is not None:
        (tmp / "c.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp / "c.toml")]
    args = p.parse_args(argv)
    layers.fill(args, environ or {})
    return args


def test_defaults_when_no_source_gives_a_value(tmp_path: Path) -> None:
    args = resolve([], tmp=tmp_path)
    assert (args.max_things, args.name, args.level) == (4, "n", "low")
    assert (args.allow_origin, args.trust_proxy, args.config) == ([], False, None)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    toml = 'max_things = 5\nname = "file"\nlevel = "HIGH"\n'
    env = {"TRIO_DUPLEX_NAME": "env", "TRIO_DUPLEX_MAX_THINGS": "6"}
    args = resolve(["--max-things", "7"], env, toml, tmp=tmp_path)
    assert (args.max_things, args.name, args.level) == (7, "env", "high")
    # A flag given at its default value still wins (given, not compared with the default).
    args = resolve(["--max-things", "4"], env, toml, tmp=tmp_path)
    assert args.max_things == 4


def test_the_file_can_be_named_by_the_environment(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("max_things = 9\n")
    p, layers = parser_and_layers()
    args = p.parse_args([])
    layers.fill(args, {"TRIO_DUPLEX_CONFIG": str(tmp_path / "c.toml")})
    assert args.max_things == 9


def test_a_repeatable_flag_takes_an_array_or_a_comma_separated_value(tmp_path: Path) -> None:
    toml = 'allow_origin = ["https://a.example", "https://b.example"]\n'
    args = resolve([], toml=toml, tmp=tmp_path)
    assert args.allow_origin == ["https://a.example", "https://b.example"]
    env = {"TRIO_DUPLEX_ALLOW_ORIGIN": "https://c.example, https://d.example"}
    args = resolve([], env, toml, tmp=tmp_path)
    assert args.allow_origin == ["https://c.example", "https://d.example"]
    # Flags replace the other sources' list; they do not add to it.
    args = resolve(["--allow-origin", "https://e.example"], env, toml, tmp=tmp_path)
    assert args.allow_origin == ["https://e.example"]


def test_a_switch_takes_a_boolean(tmp_path: Path) -> None:
    assert resolve([], toml="trust_proxy = true\n", tmp=tmp_path).trust_proxy is True
    assert resolve([], {"TRIO_DUPLEX_TRUST_PROXY": "yes"}, tmp=tmp_path).trust_proxy is True
    env = {"TRIO_DUPLEX_TRUST_PROXY": "0"}
    assert resolve([], env, "trust_proxy = true\n", tmp=tmp_path).trust_proxy is False


@pytest.mark.parametrize(
    ("env", "toml", "expected"),
    [
        ({"TRIO_DUPLEX_MAX_THINGS": "0"}, None, "environment variable TRIO_DUPLEX_MAX_THINGS: '0'"),
        ({"TRIO_DUPLEX_MAX_THINGS": "x"}, None, "TRIO_DUPLEX_MAX_THINGS: invalid value 'x'"),
        ({"TRIO_DUPLEX_LEVEL": "mid"}, None, "TRIO_DUPLEX_LEVEL: 'mid' is not one of low, high"),
        ({"TRIO_DUPLEX_TRUST_PROXY": "maybe"}, None, "TRIO_DUPLEX_TRUST_PROXY: 'maybe'"),
        ({}, "max_things = 0\n", "c.toml: max_things: '0' must be at least 1"),
        ({}, "max_things = true\n", "c.toml: max_things: expected a string or a number"),
        ({}, "name = [1, 2]\n", "c.toml: name: expected a string or a number"),
        ({}, "trust_proxy = 1\n", "c.toml: trust_proxy: expected true or false"),
        ({}, "max-things = 3\n", "unknown key 'max-things' (did you mean max_things?)"),
        ({}, "[serve]\nmax_things = 3\n", "c.toml: unknown key 'serve'"),
        ({}, "max_things = \n", "c.toml: not valid TOML"),
    ],
)
def test_a_refused_value_exits_2_naming_its_source(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    toml: str | None,
    expected: str,
) -> None:
    with pytest.raises(SystemExit) as info:
        resolve([], env, toml, tmp=tmp_path)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "t: error: " in err
    assert expected in err, err


def test_a_flag_on_the_command_line_hides_a_bad_value_elsewhere(tmp_path: Path) -> None:
    args = resolve(["--max-things", "2"], {"TRIO_DUPLEX_MAX_THINGS": "x"}, tmp=tmp_path)
    assert args.max_things == 2


def test_a_missing_file_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    p, layers = parser_and_layers()
    args = p.parse_args(["--config", "/nonexistent/c.toml"])
    with pytest.raises(SystemExit) as info:
        layers.fill(args, {})
    assert info.value.code == 2
    assert "config file /nonexistent/c.toml: cannot read it" in capsys.readouterr().err


# -- through the serve command -------------------------------------------------------------


def serve_args(monkeypatch: pytest.MonkeyPatch, *argv: str) -> argparse.Namespace:
    """What ``trio-duplex serve`` would run with, without running it."""
    seen: list[argparse.Namespace] = []

    def fake_serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    assert main(["serve", *argv]) == 0
    return seen[0]


@pytest.mark.parametrize("level", ["INFO", "info", "Info", "wArNiNg"])
def test_log_level_in_any_case(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    assert serve_args(monkeypatch, "--log-level", level).log_level == level.lower()
    monkeypatch.setenv("TRIO_DUPLEX_LOG_LEVEL", level)
    assert serve_args(monkeypatch).log_level == level.lower()


def test_serve_defaults_are_the_flags_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    args = serve_args(monkeypatch)
    assert (args.engine, args.log_level, args.log_format, args.config) == (
        "echo",
        "info",
        "text",
        None,
    )
    assert (args.port, args.max_sessions, args.disconnect_grace_s) == (8765, 64, 30.0)


def run_serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_duplex", "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("env", "toml", "expected"),
    [
        (
            {"TRIO_DUPLEX_MAX_SESSIONS": "0"},
            None,
            "error: environment variable TRIO_DUPLEX_MAX_SESSIONS: '0' must be at least 1",
        ),
        (
            {"TRIO_DUPLEX_LOG_FORMAT": "xml"},
            None,
            "error: environment variable TRIO_DUPLEX_LOG_FORMAT: 'xml' is not one of text, json",
        ),
        ({}, "idle_ttl = -1\n", "serve.toml: idle_ttl: '-1' must be greater than 0"),
        ({}, "port = 80.5\n", "serve.toml: port: '80.5' is not an integer"),
        ({}, "max_sesions = 8\n", "serve.toml: unknown key 'max_sesions'"),
    ],
)
def test_serve_refuses_a_bad_value_from_the_environment_or_file_with_exit_2(
    tmp_path: Path, env: dict[str, str], toml: str | None, expected: str
) -> None:
    args: tuple[str, ...] = ()
    if toml is not None:
        (tmp_path / "serve.toml").write_text(toml)
        args = ("--config", str(tmp_path / "serve.toml"))
    result = run_serve(*args, env=env)
    assert result.returncode == 2, result
    assert "usage: trio-duplex serve" in result.stderr
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_serve_takes_flag_then_environment_then_file_then_default(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        "disconnect_grace = 1.5\n"  # the file only
        "idle_ttl = 100\n"  # beaten by the environment
        "journal_max_bytes = 1000\n"  # beaten by the environment, then by the flag
    )
    monkeypatch.setenv("TRIO_DUPLEX_CONFIG", str(config))
    monkeypatch.setenv("TRIO_DUPLEX_IDLE_TTL", "200")
    monkeypatch.setenv("TRIO_DUPLEX_JOURNAL_MAX_BYTES", "2000")
    server = serve("--journal-max-bytes", "3000")
    with connect(server.url, open_timeout=5, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        limits = json.loads(ws.recv(timeout=5))["limits"]
    assert limits["disconnect_grace_s"] == 1.5
    assert limits["idle_ttl_s"] == 200
    assert limits["journal_max_bytes"] == 3000
    assert limits["max_config_bytes"] == 64 * 1024  # the default


# -- the documents' examples ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
DEPLOYING = ROOT / "docs" / "deploying.md"


def blocks(path: Path, language: str) -> list[str]:
    found = re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    assert found, f"no {language} block in {path}"
    return found


@pytest.mark.parametrize("doc", [ROOT / "README.md", DEPLOYING], ids=lambda p: p.name)
def test_the_toml_examples_are_accepted(
    doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for text in blocks(doc, "toml"):
        (tmp_path / "serve.toml").write_text(text)
        args = serve_args(monkeypatch, "--config", str(tmp_path / "serve.toml"))
        assert args.log_format == "json"


def test_the_deploying_guide_commands_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "serve.toml").write_text(blocks(DEPLOYING, "toml")[0])
    unit = blocks(DEPLOYING, "ini")[0]
    for name, value in re.findall(r"^Environment=(\w+)=(\S*)$", unit, re.M):
        monkeypatch.setenv(name, value)
    commands = [
        line.split("trio-duplex serve", 1)[1]
        for block in blocks(DEPLOYING, "ini")
        for line in block.splitlines()
        if "trio-duplex serve" in line
    ]
    assert commands
    for command in commands:
        argv = shlex.split(
            command.replace("/etc/trio-duplex/serve.toml", str(tmp_path / "serve.toml"))
        )
        assert serve_args(monkeypatch, *argv).max_connections_per_ip == 2000


def test_the_deploying_guide_shows_the_errors_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DEPLOYING.read_text(encoding="utf-8")
    monkeypatch.setenv("TRIO_DUPLEX_MAX_SESSIONS", "0")
    with pytest.raises(SystemExit):
        serve_args(monkeypatch)
    assert capsys.readouterr().err.splitlines()[-1] in text
    monkeypatch.delenv("TRIO_DUPLEX_MAX_SESSIONS")
    (tmp_path / "serve.toml").write_text("idle_ttl = -1\n")
    with pytest.raises(SystemExit):
        serve_args(monkeypatch, "--config", str(tmp_path / "serve.toml"))
    shown = capsys.readouterr().err.splitlines()[-1]
    assert shown.replace(str(tmp_path), "/etc/trio-duplex") in text
