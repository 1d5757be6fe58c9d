"""``Probe``: what a simulated server decided and queued at the end of its sessions.

``probing`` adds a ``Probe`` to the server as an ``Observer`` (the server tells it of
every terminal decision, every terminal frame queued and every attachment), and a trio
instrument that checks the server's invariants after every scheduler step.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from ..core.events import TERMINAL_EVENTS
from ..core.session import Session, Terminal
from ..engines.api import Event
from ..server.server import DuplexServer
from ..server.sessions.connection import Connection
from ..server.sessions.owner import Observer


@attrs.frozen
class TerminalQueued:
    """A terminal frame queued for a connection, and the accounting at that moment."""

    session_id: str
    event: Event
    slots_held: int
    session_registered: bool
    """Whether the session still held its slot when its terminal event was queued."""
    time: float


@attrs.define(eq=False)
class Probe(Observer):
    """What a server decided and sent at the end of its sessions, and invariant checks.

    ``decided[id]`` lists the terminal events ``Session.begin_close`` returned for that
    session (the core promises one); ``queued`` lists every terminal frame handed to a
    connection. ``violations`` collects invariant breaks seen after any scheduler step.
    """

    server: DuplexServer
    decided: dict[str, list[Terminal]] = attrs.field(factory=lambda: defaultdict(list))
    decided_at: dict[str, float] = attrs.field(factory=dict)
    """When each session's (first) terminal event was decided."""
    queued: list[TerminalQueued] = attrs.field(factory=list)
    attached_to: dict[str, list[Connection]] = attrs.field(factory=lambda: defaultdict(list))
    """Every connection each session was attached to, in order."""
    violations: list[str] = attrs.field(factory=list)
    max_slots_seen: int = 0

    def terminals(self, session_id: str) -> list[Terminal]:
        return self.decided.get(session_id, [])

    def reasons(self, session_id: str) -> list[str]:
        return [terminal.reason for terminal in self.terminals(session_id)]

    def queued_for(self, session_id: str) -> list[TerminalQueued]:
        return [item for item in self.queued if item.session_id == session_id]

    def check(self) -> None:
        """The invariants that must hold between any two scheduler steps."""
        registry = self.server.sessions.registry
        held = registry.slots_held
        self.max_slots_seen = max(self.max_slots_seen, held)
        if held > self.server.config.max_sessions:
            self._violate(f"{held} slots held, max_sessions {self.server.config.max_sessions}")
        if held != len(registry.sessions):
            self._violate(f"{held} slots held by {len(registry.sessions)} sessions")
        live = self.server.connections
        for session_id, conns in self.attached_to.items():
            session = registry.sessions.get(session_id)
            if session is None:
                continue
            current = [c for c in conns if c in live and session.is_current(c.generation)]
            if len(current) > 1:
                self._violate(f"session {session_id} has {len(current)} attached connections")

    def assert_clean(self) -> None:
        assert not self.violations, self.violations
        for session_id, terminals in self.decided.items():
            assert len(terminals) == 1, (session_id, terminals)
        for item in self.queued:
            assert not item.session_registered, f"terminal queued before the slot was freed: {item}"

    def _violate(self, text: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(f"t={trio.current_time():.6f}: {text}")

    # -- Observer --------------------------------------------------------------------

    def terminal_decided(self, session: Session, terminal: Terminal) -> None:
        if session.id in self.server.sessions.registry.sessions:
            self.decided[session.id].append(terminal)
            self.decided_at.setdefault(session.id, trio.current_time())

    def terminal_queued(self, conn: Connection, frames: list[str | bytes]) -> None:
        if conn not in self.server.connections:
            return
        registry = self.server.sessions.registry
        for frame in frames:
            if isinstance(frame, bytes) or not any(
                f'"{kind}"' in frame for kind in TERMINAL_EVENTS
            ):
                continue  # the cheap test first
            event = json.loads(frame)
            if event.get("type") in TERMINAL_EVENTS:
                session_id = str(event.get("session_id"))
                self.queued.append(
                    TerminalQueued(
                        session_id,
                        event,
                        registry.slots_held,
                        session_id in registry.sessions,
                        trio.current_time(),
                    )
                )

    def attached(self, session: Session, conn: Connection) -> None:
        self.attached_to[session.id].append(conn)


class _ProbeInstrument(trio.abc.Instrument):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.probe.check()


@contextmanager
def probing(server: DuplexServer) -> Iterator[Probe]:
    """Observe ``server`` while the block runs (inside ``trio.run``)."""
    probe = Probe(server)
    server.add_observer(probe)
    instrument = _ProbeInstrument(probe)
    trio.lowlevel.add_instrument(instrument)
    try:
        yield probe
    finally:
        trio.lowlevel.remove_instrument(instrument)
        server.remove_observer(probe)
