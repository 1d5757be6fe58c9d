"""One client event's path from the socket to the engine crosses each layer once.

The real server runs in memory (``trio_duplex.testing``); a profiler records every call
the connection's reader task makes between reading one message off its WebSocket and
asking for the next one (the whole of that event's way to the engine's inbox). Each
call whose caller and callee are in different rooms of the package is a crossing:

* a call into a room *above* the caller's is a climb back up: there must be none;
* a call into a room below enters it: each room may be entered once.

The rooms are those of tests/test_layout.py, in the order data flows through them:
socket (the session shell) -> decode (the dialect) -> the session core -> the session's
audio codec (the core decodes input audio it takes, and only that) -> the engine. The
engine is the path's end: the core may ask it to ``check`` an event and whether its queue
has room, and the shell puts the event in its inbox, so it alone may be entered more
than once. The self-tests at the end show that the measure finds a climb and a
second entry when there is one.
"""

from __future__ import annotations

import dis
import inspect
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import trio

from trio_duplex import ServerConfig
from trio_duplex.core.events import EventType
from trio_duplex.testing import running_server

# In the order data flows down; a module belongs to the first room its name starts with.
ROOMS: Sequence[tuple[str, str]] = (
    ("server", "trio_duplex.server.server"),
    ("cluster", "trio_duplex.cluster"),
    ("front", "trio_duplex.server.front"),
    ("sessions", "trio_duplex.server.sessions"),
    ("dialects", "trio_duplex.dialects"),
    ("core", "trio_duplex.core"),
    ("audio", "trio_duplex.audio"),
    ("engines", "trio_duplex.engines"),
)
RANK = {name: rank for rank, (name, _) in enumerate(ROOMS)}
END = "engines"


def room_of(module: str) -> str | None:
    for name, prefix in ROOMS:
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None  # not ours (trio, the stdlib), or the package root, _pace, testing


@dataclass
class Path:
    """The crossings of one event's way: (caller room, callee room, callee name)."""

    crossings: list[tuple[str, str, str]] = field(default_factory=list)

    def climbs(self) -> list[tuple[str, str, str]]:
        return [c for c in self.crossings if RANK[c[1]] < RANK[c[0]]]

    def entries(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for caller, callee, name in self.crossings:
            if RANK[callee] > RANK[caller]:
                found.setdefault(callee, []).append(f"{caller} -> {name}")
        return found

    def entered_twice(self) -> dict[str, list[str]]:
        """Rooms before the path's end entered more than once."""
        return {
            room: calls for room, calls in self.entries().items() if len(calls) > 1 and room != END
        }


_SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_FIRST_RESUME: dict[CodeType, int] = {}


def resumed(frame: FrameType) -> bool:
    """A coroutine's or generator's frame going on after an ``await``/``yield``: the
    profiler reports it as a call, but nothing was called."""
    code = frame.f_code
    if not code.co_flags & _SUSPENDABLE:
        return False
    start = _FIRST_RESUME.get(code)
    if start is None:
        start = next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")
        _FIRST_RESUME[code] = start
    return frame.f_lasti > start


def _room_of_frame(frame: FrameType) -> str | None:
    return room_of(frame.f_globals.get("__name__", ""))


def record(path: Path, caller: FrameType | None, callee: FrameType) -> None:
    """Note a call from ``caller`` to ``callee`` if it crosses from one room to another.

    A frame outside our rooms (trio, the stdlib) is looked through: the crossing is from
    the nearest frame of ours below it on the stack."""
    to = _room_of_frame(callee)
    if to is None:
        return
    while caller is not None and _room_of_frame(caller) is None:
        caller = caller.f_back
    if caller is None:
        return
    came_from = _room_of_frame(caller)
    assert came_from is not None
    if came_from != to:
        name = f"{callee.f_globals['__name__']}.{callee.f_code.co_qualname}"
        path.crossings.append((came_from, to, name))


@contextmanager
def reader_paths() -> Iterator[list[Path]]:
    """Record, in the task that reads a connection, each message's way from the moment
    ``WebSocket.get_message`` returns it until that task asks for the next one."""
    paths: list[Path] = []
    current: dict[Any, Path] = {}  # reader task -> the path being recorded

    def profile(frame: FrameType, what: str, returned: object) -> None:
        if what not in ("call", "return"):
            return
        code = frame.f_code
        is_get = (
            code.co_name == "get_message"
            and frame.f_globals.get("__name__") == "trio_duplex.server.sessions.websocket"
        )
        try:
            task = trio.lowlevel.current_task()
        except RuntimeError:
            return
        if is_get:
            if what == "call":
                done = current.pop(task, None)
                if done is not None:
                    paths.append(done)
            elif returned is not None:  # a message (not a raise: the connection ended)
                current[task] = Path()
            return
        if what == "call" and task in current and not resumed(frame):
            record(current[task], frame.f_back, frame)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield paths
    finally:
        sys.setprofile(old)


async def _one_event_path(event: dict[str, Any], config: dict[str, Any] | None = None) -> Path:
    async with running_server(ServerConfig(loop_lag_warning_s=0)) as sim:
        client, _ = await sim.open_session(config)
        await client.send({"type": EventType.HEARTBEAT})  # the path is warm
        await client.receive()
        with reader_paths() as paths:
            await client.send(event)
            answer = await client.receive()
        assert answer["type"] != EventType.ERROR, answer
        await client.aclose()
    (path,) = [p for p in paths if p.crossings]  # the one message read in the window
    return path


async def test_a_text_event_crosses_each_layer_once() -> None:
    path = await _one_event_path(
        {"type": "input.text.append", "text": "hello", "client_event_seq": 1}
    )
    assert path.entries().get("engines"), path.crossings  # it reached the engine's inbox
    assert not path.climbs(), path.climbs()
    assert not path.entered_twice(), path.entered_twice()


async def test_an_audio_event_crosses_each_layer_once() -> None:
    pcm = bytes(960)  # 20 ms of 24 kHz PCM16 silence: the format is what counts
    event = {
        "type": "input_audio_buffer.append",
        "audio": __import__("base64").b64encode(pcm).decode(),
        "client_event_seq": 1,
    }
    path = await _one_event_path(event, {"audio": {"input": {"format": "pcm16"}}})
    assert path.entries().get("audio"), path.crossings  # decoded by the session's codec
    assert path.entries().get("engines"), path.crossings
    assert not path.climbs(), path.climbs()
    assert not path.entered_twice(), path.entered_twice()


# -- self-tests: the measure can fail ------------------------------------------------------


def test_the_measure_finds_a_climb_and_a_second_entry() -> None:
    path = Path(
        [
            ("sessions", "core", "a"),
            ("core", "sessions", "back_up"),
            ("sessions", "core", "again"),
        ]
    )
    assert path.climbs() == [("core", "sessions", "back_up")]
    assert path.entered_twice() == {"core": ["sessions -> a", "sessions -> again"]}
    assert Path([("sessions", "dialects", "d"), ("dialects", "core", "c")]).entered_twice() == {}
    at_the_end = Path([("core", "engines", "check"), ("sessions", "engines", "put")])
    assert at_the_end.entered_twice() == {} and not at_the_end.climbs()
    assert Path([("engines", "core", "up")]).climbs() == [("engines", "core", "up")]
    assert room_of("trio_duplex.server.sessions.runner") == "sessions"
    assert room_of("trio_duplex.server.server") == "server"
    assert room_of("trio.lowlevel") is None
