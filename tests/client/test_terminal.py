"""``trio-duplex connect``: in process against the server in memory (input, Ctrl-C presses
and output passed in; virtual time), then as a subprocess driven through a pipe against
a real ``python -m trio_duplex serve`` subprocess."""

from __future__ import annotations

import errno
import io
import json
import os
import random
import re
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import attrs
import pytest
import trio
import trio.testing

from trio_duplex import ServerConfig
from trio_duplex.client import ResumeState, connect
from trio_duplex.client.terminal import Printer, build_parser, run
from trio_duplex.engines.api import EngineFactory
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.testing import Simulation, running_server

from .helpers import Net, rng_starting_at

# -- in process -------------------------------------------------------------------------


class Screen(io.StringIO):
    """A StringIO that wakes whoever waits for some text to appear on it."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def write(self, text: str) -> int:
        self.changed.set()
        self.changed = trio.Event()
        return super().write(text)

    async def wait_for(self, text: str) -> None:
        while text not in self.getvalue():
            await self.changed.wait()


@attrs.define
class Terminal:
    """What the client reads (lines, Ctrl-C presses) and writes (stdout, stderr)."""

    sim: Simulation
    lines: trio.MemorySendChannel[str]
    presses: trio.MemorySendChannel[int]
    out: Screen
    err: Screen
    net: Net
    exit_code: int | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)

    async def type(self, *lines: str) -> None:
        for line in lines:
            await self.lines.send(line + "\n")

    async def wait_for(self, text: str, stream: str = "out") -> None:
        await (self.out if stream == "out" else self.err).wait_for(text)


@asynccontextmanager
async def terminal(
    argv: Sequence[str],
    config: ServerConfig | None = None,
    engine: EngineFactory = EchoEngine,
    url: str = "ws://sim",
) -> AsyncIterator[Terminal]:
    async with running_server(config, engine) as sim:
        lines_in, lines = trio.open_memory_channel[str](100)
        presses_in, presses = trio.open_memory_channel[int](10)
        term = Terminal(sim, lines_in, presses_in, Screen(), Screen(), Net(sim))
        args = build_parser().parse_args([url, *argv])
        printer = Printer(term.out, term.err, raw_json=args.json)

        async def client() -> None:
            term.exit_code = await run(
                args,
                lines=lines,
                interrupts=presses,
                printer=printer,
                open_stream=term.net.open_stream,
                rng=random.Random(0),
            )
            term.exited.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            with trio.fail_after(120):
                yield term
                await term.exited.wait()


def out_lines(term: Terminal) -> list[str]:
    return term.out.getvalue().splitlines()


async def test_lines_in_events_out_then_end_of_input_closes(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with terminal([]) as term:
        await term.type("hello", "", "wide world ✓")
        term.lines.close()
    assert term.exit_code == 0
    lines = out_lines(term)
    assert lines[0].split() == ["1", "response.output_text.delta", "hello"]
    assert lines[1].split() == ["2", "response.output_text.delta", "wide", "world", "✓"]
    assert lines[2].split()[:2] == ["-", "session.closed"] and "client_close" in lines[2]
    err = term.err.getvalue()
    assert "* connected: session sess_" in err and "end of input: closing" in err
    assert term.sim.server.slots_held == 0


async def test_json_prints_raw_events(autojump_clock: trio.abc.Clock) -> None:
    async with terminal(["--json"]) as term:
        await term.type('/event {"type": "input.text.append", "text": "raw", "event_id": "e"}')
        await term.type('/event {"type": "no.such", "event_id": "e2"}', "/event [1]")
        term.lines.close()
    created, *events = [json.loads(line) for line in out_lines(term)]
    # The raw stream starts with the server's first answer, as it arrived.
    assert created["type"] == "session.created" and created["session_id"].startswith("sess_")
    assert {"resume_token", "attachment_generation", "limits"} <= set(created)
    assert events[0] == {"type": "response.output_text.delta", "text": "raw", "server_event_seq": 1}
    assert (events[1]["type"], events[1]["code"], events[1]["event_id"]) == (
        "error",
        "unknown_event",
        "e2",
    )
    assert events[-1]["type"] == "session.closed"
    assert "not sent: /event needs a JSON object" in term.err.getvalue()


async def test_reconnects_and_resumes_are_shown(autojump_clock: trio.abc.Clock) -> None:
    async with terminal([]) as term:
        await term.type("before")
        await term.wait_for("before")
        term.net.down = True
        await term.net.cut()
        await term.wait_for("retry 2", "err")
        term.net.down = False
        await term.type("after")
        await term.wait_for("after")
        term.lines.close()
    err = term.err.getvalue()
    assert "connection lost (connection lost); reconnecting" in err
    assert re.search(r"retry 1 in [0-9.]+s \(connection lost\)", err)
    assert re.search(r"retry 2 in [0-9.]+s \(network is down\)", err)
    assert "resumed session sess_" in err and "(generation 2, resending" in err
    assert [line.split()[-1] for line in out_lines(term)[:2]] == ["before", "after"]


async def test_ctrl_c_closes_the_session(autojump_clock: trio.abc.Clock) -> None:
    async with terminal([]) as term:
        await term.type("hi")
        await term.wait_for("hi")
        await term.presses.send(signal.SIGINT)
    assert term.exit_code == 0
    assert "closing the session (Ctrl-C again to detach)" in term.err.getvalue()
    assert "session.closed" in out_lines(term)[-1]
    assert term.sim.server.slots_held == 0


async def test_a_second_ctrl_c_detaches_and_the_session_can_be_resumed(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with terminal([]) as term:
        await term.type("kept")
        await term.wait_for("kept")
        term.net.down = True  # the close cannot get through: the user gives up waiting
        await term.net.cut()
        await term.presses.send(signal.SIGINT)
        await term.wait_for("retry", "err")
        await term.presses.send(signal.SIGINT)
        await term.exited.wait()
        assert term.exit_code == 0
        command = re.search(
            r"trio-duplex connect (\S+) --resume (\S+) --token=(\S+) --last-seq (\d+)",
            term.err.getvalue(),
        )
        assert command is not None and command.group(4) == "1"
        assert term.sim.server.slots_held == 1  # detached, inside its grace
        # And the printed command works.
        term.net.down = False
        # (--token=: a token may start with "-", which argparse takes for a flag)
        argv = ["--resume", command.group(2), f"--token={command.group(3)}", "--last-seq", "1"]
        args = build_parser().parse_args([command.group(1), *argv])
        out, err = io.StringIO(), io.StringIO()
        lines_in, lines = trio.open_memory_channel[str](10)
        _, presses = trio.open_memory_channel[int](10)
        await lines_in.send("again\n")
        lines_in.close()
        printer = Printer(out, err)
        code = await run(
            args, lines=lines, interrupts=presses, printer=printer, open_stream=term.net.open_stream
        )
        assert code == 0
        assert "resumed session" in err.getvalue()
        assert out.getvalue().splitlines()[0].split() == [
            "2",
            "response.output_text.delta",
            "again",
        ]
        assert term.sim.server.slots_held == 0


async def test_received_audio_is_saved_as_wav(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    path = tmp_path / "out.wav"
    async with terminal(["--save-audio", str(path)], engine=VoiceEngine) as term:
        await term.type("hello audio")
        term.lines.close()
    assert term.exit_code == 0
    frames = [line for line in out_lines(term) if "response.output_audio.delta" in line]
    assert frames and all("audio=<960 bytes>" in line for line in frames)
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
        assert wav.getnframes() == len(frames) * 480  # 20 ms of 24 kHz mono per frame
    assert f"saved {len(frames) * 960} bytes of audio" in term.err.getvalue()


@pytest.mark.parametrize(
    ("argv", "rate", "sample_bytes"),
    [
        (["--audio-wire", "binary", "--audio-format", "g711_ulaw"], 8000, 1),
        (["--audio-format", "g711_alaw"], 8000, 1),
        (["--audio-wire", "binary", "--audio-format", "pcm16", "--audio-rate", "16000"], 16000, 2),
        (["--audio-wire", "binary", "--audio-format", "opus"], 48000, None),
    ],
)
async def test_received_audio_in_any_format_is_saved_as_pcm16_wav(
    autojump_clock: trio.abc.Clock,
    tmp_path: Path,
    argv: list[str],
    rate: int,
    sample_bytes: int | None,
) -> None:
    path = tmp_path / "out.wav"
    async with terminal(["--save-audio", str(path), *argv], engine=VoiceEngine) as term:
        await term.type("hello audio")
        term.lines.close()
    assert term.exit_code == 0
    frames = [line for line in out_lines(term) if "response.output_audio.delta" in line]
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, rate)
        seconds = wav.getnframes() / rate
        audio = wav.readframes(wav.getnframes())
    # "hello audio": 15 + 4 + 15 frames of 20 ms, whatever the wire format
    assert abs(seconds - 34 * 0.02) <= 0.03
    assert max(abs(s) for s in struct.unpack(f"<{len(audio) // 2}h", audio)) > 3000
    if sample_bytes is not None:  # what the printer says is the wire payload's size
        assert frames and f"audio=<{20 * rate // 1000 * sample_bytes} bytes>" in frames[-2]


async def test_a_refused_resume_exits_1(autojump_clock: trio.abc.Clock) -> None:
    async with terminal(["--resume", "sess_nope", "--token", "t"]) as term:
        pass
    assert term.exit_code == 1
    assert "cannot connect to ws://sim/v1/duplex: session_resume_expired" in term.err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--session", "[1]"], "--session must be a JSON object"),
        (["--resume", "sess_x"], "--resume needs --token"),
        (["wss://y"], "the URLs must be all ws:// or all wss://, not a mix"),
        (["ws://y", "--ca", "ca.pem"], "--ca needs a wss:// URL"),
    ],
)
async def test_bad_arguments_exit_2(argv: list[str], message: str) -> None:
    err = io.StringIO()
    _, lines = trio.open_memory_channel[str](0)
    _, presses = trio.open_memory_channel[int](0)
    args = build_parser().parse_args(["ws://x", *argv])
    code = await run(args, lines=lines, interrupts=presses, printer=Printer(io.StringIO(), err))
    assert code == 2 and message in err.getvalue()


async def test_the_default_path_is_added(autojump_clock: trio.abc.Clock) -> None:
    for url in ("ws://sim", "ws://sim/"):  # the server serves /v1/duplex only
        async with terminal([], url=url) as term:
            term.lines.close()
        assert term.exit_code == 0 and "* connected: session" in term.err.getvalue()
    async with terminal([], url="ws://sim/other?x=1") as term:  # a path given is kept
        pass
    assert term.exit_code == 1
    assert term.err.getvalue() == (
        "* cannot connect to ws://sim/other?x=1: WebSocket handshake refused: HTTP 404\n"
    )


async def test_a_refused_first_connection_fails_at_once(autojump_clock: trio.abc.Clock) -> None:
    # Retrying is for resuming a session; a server that is not there is said at once.
    async with running_server() as sim:
        net = Net(sim, down=True)
        err = Screen()
        _, lines = trio.open_memory_channel[str](0)
        _, presses = trio.open_memory_channel[int](0)
        args = build_parser().parse_args(["ws://sim"])
        start = trio.current_time()
        code = await run(
            args,
            lines=lines,
            interrupts=presses,
            printer=Printer(Screen(), err),
            open_stream=net.open_stream,
        )
    assert code == 1
    assert err.getvalue() == "* cannot connect to ws://sim/v1/duplex: network is down\n"
    assert trio.current_time() - start < 0.01


async def test_several_urls_an_open_refused_at_one_lands_on_the_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def refused() -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    async with running_server() as sim:
        net = Net(sim)
        out, err = Screen(), Screen()
        lines_in, lines = trio.open_memory_channel[str](10)
        _, presses = trio.open_memory_channel[int](0)
        await lines_in.send("hello\n")
        lines_in.close()
        args = build_parser().parse_args(["ws://down", "ws://sim", "--linger", "0.1"])
        code = await run(
            args,
            lines=lines,
            interrupts=presses,
            printer=Printer(out, err),
            open_stream={"ws://down/v1/duplex": refused, "ws://sim/v1/duplex": net.open_stream},
            rng=rng_starting_at(0, 2),
        )
    assert code == 0
    assert err.getvalue().startswith(
        "* retry 1 in 0.00s (connection refused)\n* connected: session sess_"
    )
    assert out.getvalue().splitlines()[0].split() == ["1", "response.output_text.delta", "hello"]


async def test_several_urls_all_refused_are_each_tried_once(autojump_clock: trio.abc.Clock) -> None:
    async with running_server() as sim:
        net = Net(sim, down=True)
        err = Screen()
        _, lines = trio.open_memory_channel[str](0)
        _, presses = trio.open_memory_channel[int](0)
        args = build_parser().parse_args(["ws://a", "ws://b:80/x"])
        code = await run(
            args,
            lines=lines,
            interrupts=presses,
            printer=Printer(Screen(), err),
            open_stream=net.open_stream,
        )
    assert code == 1
    assert err.getvalue().endswith(
        "* cannot connect to ws://a/v1/duplex ws://b:80/x: gave up after 2 attempts in 0.0s: "
        "network is down\n"
    )
    assert len(net.streams) == 0


@pytest.mark.parametrize("where", ["missing-dir/out.wav", "."], ids=["no-dir", "a-dir"])
async def test_an_unwritable_save_audio_path_exits_2_before_connecting(
    tmp_path: Path, where: str
) -> None:
    err = Screen()
    _, lines = trio.open_memory_channel[str](0)
    _, presses = trio.open_memory_channel[int](0)
    path = str(tmp_path / where)
    args = build_parser().parse_args(["ws://unused", "--save-audio", path])
    code = await run(args, lines=lines, interrupts=presses, printer=Printer(Screen(), err))
    assert code == 2
    assert err.getvalue().startswith(f"* --save-audio: cannot write {path}: ")
    assert len(err.getvalue().splitlines()) == 1


# -- subprocesses: a real server, the client driven through a pipe ----------------------


class Server(Protocol):
    """What these tests use of the ``serve`` fixture's ServerProcess (tests/helpers.py)."""

    url: str

    def interrupt(self) -> None: ...


class Serve(Protocol):
    """The ``serve`` fixture: starts ``trio-duplex serve`` with these flags."""

    def __call__(self, *flags: str) -> Server: ...


def connect_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trio_duplex", "connect", *args]


def piped(lines: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``trio-duplex connect ARGS`` fed ``lines`` on a pipe, once it exited 0."""
    done = subprocess.run(
        connect_command(*args),
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done


def wait_for_output(proc: subprocess.Popen[bytes], pattern: str, timeout: float) -> str:
    """Read ``proc``'s stderr until ``pattern`` shows up (bounded)."""
    assert proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while pattern.encode() not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {seen!r}"
            if selector.select(left):
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, f"stderr closed before {pattern!r}: {seen!r}"
                seen += chunk
    return seen.decode()


@pytest.mark.integration
def test_driven_through_a_pipe(serve: Serve) -> None:
    server = serve("--engine", "echo")
    lines = [f"line {i}" for i in range(50)]
    done = piped(lines, server.url, "--linger", "0.3")
    out = done.stdout.splitlines()
    assert [line.split(maxsplit=2)[2] for line in out[:-1]] == lines
    assert [int(line.split()[0]) for line in out[:-1]] == list(range(1, 51))
    assert "session.closed" in out[-1] and "client_close" in out[-1]
    assert "\x1b[" not in done.stdout  # not a terminal: no colour
    assert "* connected: session sess_" in done.stderr


@pytest.mark.integration
def test_json_through_a_pipe(serve: Serve) -> None:
    server = serve("--engine", "echo")
    done = subprocess.run(
        connect_command(server.url, "--json", "--linger", "0.2"),
        input='one\n/event {"type":"input.text.append","text":"two"}\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["type"] == "session.created"
    assert [e.get("text") for e in events[1:3]] == ["one", "two"]
    assert events[-1]["type"] == "session.closed"


@pytest.mark.integration
def test_ctrl_c_closes_cleanly(serve: Serve) -> None:
    server = serve("--engine", "echo")
    proc = subprocess.Popen(
        connect_command(server.url),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_output(proc, "connected: session", timeout=20)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert b"session.closed" in out and b"client_close" in out
    assert b"closing the session (Ctrl-C again to detach)" in err


@pytest.mark.integration
@pytest.mark.parametrize("ending", ["server-ends-it", "ctrl-c"])
def test_exits_cleanly_while_stdin_is_still_open(serve: Serve, ending: str) -> None:
    # A thread blocked reading stdin must not abort the interpreter's shutdown
    # ("Fatal Python error: _enter_buffered_busy", status 134).
    server = serve("--engine", "echo", "--drain-timeout", "0")
    with subprocess.Popen(
        connect_command(server.url),
        stdin=subprocess.PIPE,  # left open, never written: the reader stays blocked
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        try:
            wait_for_output(proc, "connected: session", timeout=20)
            if ending == "ctrl-c":
                proc.send_signal(signal.SIGINT)
            else:
                server.interrupt()  # drains at once: the session ends server_shutdown
            status = proc.wait(timeout=20)
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()
        finally:
            proc.kill()
    assert b"Fatal Python error" not in err, err
    assert status == 0, err
    reason = b"client_close" if ending == "ctrl-c" else b"server_shutdown"
    assert b"session.closed" in out and reason in out


@pytest.mark.integration
def test_a_refused_port_fails_at_once_with_a_plain_message() -> None:
    with socket.socket() as bound:  # bound, not listening: connecting is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            connect_command(f"ws://127.0.0.1:{port}"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    assert (
        done.stderr == f"* cannot connect to ws://127.0.0.1:{port}/v1/duplex: connection refused\n"
    )
    assert time.monotonic() - started < 10  # one attempt, no backoff (was 10 tries, 20 s)


@pytest.mark.integration
async def test_resume_from_the_command_line(serve: Serve) -> None:
    server = serve("--engine", "echo")
    with trio.fail_after(60):
        async with connect(server.url) as session:
            await session.send({"type": "input.text.append", "text": "first"})
            async for event in session:
                if event["type"] == "response.output_text.delta":
                    break
            state: ResumeState = await session.detach()
        done = await trio.run_process(
            connect_command(
                server.url,
                "--resume",
                state.session_id,
                "--last-seq",
                str(state.last_server_event_seq),
                "--linger",
                "0.2",
            ),
            stdin=b"second\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "TRIO_DUPLEX_RESUME_TOKEN": state.resume_token},
        )
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert f"resumed session {state.session_id} (generation 2" in err
    first = done.stdout.decode().splitlines()[0].split()
    assert first == ["2", "response.output_text.delta", "second"]
    assert state.resume_token not in err  # never echoed back


@pytest.mark.integration
def test_voice_audio_saved_through_a_pipe(serve: Serve, tmp_path: Path) -> None:
    server = serve("--engine", "voice")
    path = tmp_path / "voice.wav"
    done = subprocess.run(
        connect_command(server.url, "--save-audio", str(path), "--linger", "0.5"),
        input="say two words\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    frames = done.stdout.count("response.output_audio.delta")
    assert "response.done" in done.stdout and frames > 0
    with wave.open(str(path)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() == frames * 480


@pytest.mark.integration
def test_help_through_the_main_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trio_duplex", "connect", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    for flag in ("--json", "--resume", "--token", "--save-audio", "--speaker", "--mic", "--linger"):
        assert flag in done.stdout
