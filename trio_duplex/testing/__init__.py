"""A simulation kit: run a real DuplexServer in memory, with faults you control.

Everything here runs without sockets, so under pytest-trio's ``autojump_clock`` a grace
period of 30 s passes instantly and exactly. Example::

    from trio_duplex.testing import running_server

    async def test_echo(autojump_clock):
        async with running_server() as sim:
            client, created = await sim.open_session()
            await client.send({"type": "input.text.append", "text": "hi"})
            assert (await client.receive())["text"] == "hi"
        assert sim.server.slots_held == 0

The parts, from the wire up:

* ``FaultyStream`` wraps the server side of each connection: hold sends at a gate, make
  them fail, break only the write half, end or stall only the read half, or cut the
  connection between two steps.
* ``MemoryListener`` / ``Simulation.connect``: an in-memory listener and a JSON client.
* ``ScriptedEngine``: an engine whose output, end, failure and teardown the test decides.
* ``Probe``: an ``Observer`` installed by ``running_server``; records every terminal
  event the server decides and queues, and checks after every scheduler step that slots never exceed
  ``max_sessions`` and that no session has two attached connections. ``running_server``
  asserts its findings, and that no slot leaked, when the block ends without error.
* ``CancelAtStep``: cancel a scope just before the k-th step of chosen tasks, to visit
  every await point of a path in turn.

The probe watches the server through its ``Observer`` hook; the rest reads the server's
sessions and connections, so the kit is versioned with the server.
"""

from __future__ import annotations

from ..core.session import State
from .client import SimClient
from .engine import ScriptedEngine, ScriptedFactory
from .probe import Probe, TerminalQueued, probing
from .scheduler import CancelAtStep, all_tasks, settle
from .simulation import Simulation, resume_event, running_server
from .transport import FaultyStream, MemoryListener
from .transport import TransportFault as TransportFault

__all__ = [
    "CancelAtStep",
    "FaultyStream",
    "MemoryListener",
    "Probe",
    "ScriptedEngine",
    "ScriptedFactory",
    "SimClient",
    "Simulation",
    "State",
    "TerminalQueued",
    "all_tasks",
    "probing",
    "resume_event",
    "running_server",
    "settle",
]
