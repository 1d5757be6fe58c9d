"""The session shell asks cluster mode at its named points only (sessions/placement.py):
a recording ``Placement`` in place of the cluster, on a real server in memory."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex.core.events import Event
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.server.sessions.owner import Sessions
from trio_duplex.server.sessions.placement import Placement, Releasing, SingleProcess
from trio_duplex.server.sessions.runner import SessionRunner
from trio_duplex.testing import Simulation, running_server
from trio_duplex.testing.simulation import resume_event


class Recording:
    """Every call, by point; a lease is taken, nothing is elsewhere, everything migrates."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def store_up(self) -> bool | None:
        return True

    @property
    def refusing_opens(self) -> bool:
        return False

    async def lease(self) -> bool:
        self.calls.append("lease")
        return True

    def release(self) -> None:
        self.calls.append("release")

    async def claim(self, session_id: str) -> None:
        self.calls.append(f"claim {session_id}")

    async def resume_elsewhere(self, conn: Connection, event: Event, session_id: str) -> bool:
        self.calls.append(f"resume_elsewhere {session_id}")
        return False

    async def findable(self, session_id: str) -> bool:
        self.calls.append(f"findable {session_id}")
        return False

    def migrates(self) -> Callable[[SessionRunner], bool] | None:
        self.calls.append("migrates")
        return lambda runner: False

    async def hand_over(self, sessions: Sessions) -> None:
        self.calls.append("hand_over")

    def released(self, session_id: str) -> None:
        self.calls.append(f"released {session_id}")


def placed(sim: Simulation) -> Recording:
    recording = Recording()
    placement: Placement = recording
    server = sim.server
    assert isinstance(server.placement, SingleProcess)  # without --cluster
    server.placement = server.opener.placement = placement
    server.sessions.observers.append(Releasing(placement))
    return recording


async def test_each_point_is_asked_at_its_moment(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        recording = placed(sim)
        client, created = await sim.open_session()
        session_id = created["session_id"]
        assert recording.calls == ["lease", f"claim {session_id}"]
        # A session held here resumes here: the cluster is not asked.
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        again, resumed = await sim.resume(session_id, created["resume_token"])
        assert resumed["type"] == "session.resumed", resumed
        unknown = await sim.connect()
        await unknown.send(resume_event("sess_unknown", "tok"))
        refusal = await unknown.receive()
        assert refusal["code"] == "session_resume_expired", refusal
        assert recording.calls[2:] == ["resume_elsewhere sess_unknown"]
        await again.aclose()
        server = sim.server
        while server.slots_held:
            await server.wait_changed()
        assert recording.calls[3:] == [f"released {session_id}"]
        await sim.shutdown()
        assert recording.calls[4:] == ["migrates", "hand_over"]


async def test_a_lease_whose_open_is_not_admitted_is_given_back(
    autojump_clock: MockClock,
) -> None:
    """The drain begins while the lease is being taken: the admission refuses."""
    async with running_server() as sim:
        recording = placed(sim)
        registry = sim.server.sessions.registry
        lease = recording.lease

        async def lease_then_drain() -> bool:
            taken = await lease()
            registry.shutting_down = True
            return taken

        recording.lease = lease_then_drain  # type: ignore[method-assign]
        client = await sim.connect()
        await client.send({"type": "session.update", "session": {}})
        refusal = await client.receive()
        assert refusal["code"] == "server_shutting_down", refusal
        assert recording.calls == ["lease", "release"]
        registry.shutting_down = False
