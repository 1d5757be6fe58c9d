"""Longer random runs over the session core than the exhaustive checker can reach.

The same ``World`` as ``interleavings.py`` (real Registry and Sessions, a model of the
shell and the clients, every invariant checked after every step), driven by a hypothesis
``RuleBasedStateMachine`` with three sessions and, beyond the exhaustive alphabet: random
time steps, a journal TTL that really expires entries, event sizes around the byte bound,
engines that finish or fail, acks of any value, client events through the protocol
machine (``client_event_seq``s next, resent or ahead, with or without room, refused by
the engine's check; heartbeats; late events from replaced connections), resumes with
older tokens or from seq 0, and output audio on the binary lane, replayed or (a call's
dialect) not.

Deterministic by default (``derandomize``). For a soak run::

    CORE_STATEFUL_EXAMPLES=5000 pytest tests/modelcheck/test_stateful.py
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from .interleavings import World

SESSIONS = 3

# How often each kind of step is picked when it is enabled (the menu repeats a kind this
# many times). A kind is enabled when the World offers that action, or for the
# parametrized kinds, the action in brackets: emit_sized (emit), ack_any and client_event
# (ack), resume_variant (resume). Resume steps are frequent so that resumes complete;
# what ends sessions is rarer so that they live long enough to be resumed. Hypothesis
# draws the ends of a range more often than the middle, hence benign kinds at both ends.
WEIGHTS = {
    "advance": 3,
    "resume": 4,
    "resume_step": 8,
    "resume_variant": 2,
    "lose": 3,
    "ack": 3,
    "ack_any": 1,
    "open": 3,
    "created": 4,
    "created_fail": 1,
    "resume_fail": 1,
    "shutdown": 1,
    "resume_cancel": 1,
    "timer": 3,
    "expire_grace": 1,
    "expire_idle": 1,
    "close": 1,
    "engine_end": 1,
    "teardown": 3,
    "client_event": 3,
    "heartbeat": 1,
    "stale_event": 1,
    "emit_sized": 3,
    "emit": 4,
    "emit_audio": 2,
}
NEEDS = {"emit_sized": "emit", "ack_any": "ack", "client_event": "ack", "resume_variant": "resume"}


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(1, SESSIONS)

    @initialize(
        max_sessions=st.integers(1, SESSIONS),
        journal_max_bytes=st.sampled_from([70, 120, 400]),
        journal_ttl_s=st.sampled_from([20.0, 90.0, 1e9]),
        replays_audio=st.booleans(),
    )
    def configure(
        self, max_sessions: int, journal_max_bytes: int, journal_ttl_s: float, replays_audio: bool
    ) -> None:
        self.world = World(
            max_sessions,
            SESSIONS,
            replays_audio=replays_audio,
            journal_max_bytes=journal_max_bytes,
            journal_ttl_s=journal_ttl_s,
        )

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        world = self.world
        actions = world.actions(big=True, engine_end=True, client=True, audio=True)
        offered = {a[0] for a in actions} | {"advance"}
        if world.registry.shutting_down:
            offered.discard("open")  # always refused now: a few tries are enough
        menu = [
            kind
            for kind, weight in WEIGHTS.items()
            if NEEDS.get(kind, kind) in offered
            for _ in range(weight)
        ]
        kind = data.draw(st.sampled_from(menu), label="kind")
        sessions = sorted({a[1] for a in actions if a[0] == NEEDS.get(kind)})
        if kind == "shutdown" and not data.draw(
            st.sampled_from([False, False, False, True]), label="really shut down"
        ):
            return  # rarer still than weight 1: it ends every session of the run
        if kind == "advance":
            world.do_advance(data.draw(st.floats(0.0, 400.0), label="dt"))
        elif kind == "emit_sized":  # pad é's, 2 bytes each: around and over the bound
            i = data.draw(st.sampled_from(sessions), label="session")
            world.do_emit(i, data.draw(st.integers(0, 60), label="pad"))
        elif kind == "ack_any":
            i = data.draw(st.sampled_from(sessions), label="session")
            seq = data.draw(st.integers(-1, 12) | st.sampled_from([True, 2.0, "1"]), label="seq")
            world.do_ack(i, seq)
        elif kind == "client_event":
            i = data.draw(st.sampled_from(sessions), label="session")
            # Mostly the next seq (the one a client sends), else a resend or one ahead.
            nxt = world.slots[i].client_seq + 1
            seq = data.draw(st.sampled_from([nxt, nxt]) | st.integers(1, 8), label="seq")
            taken = data.draw(st.booleans(), label="taken")
            bad = data.draw(st.sampled_from([False, False, False, True]), label="bad")
            world.do_client_event(i, seq, taken, bad)
        elif kind == "resume_variant":  # an older token (a lost session.resumed), or seq 0
            i = data.draw(st.sampled_from(sessions), label="session")
            issued = world.slots[i].issued
            age = data.draw(st.integers(0, 3), label="token age")
            world.do_resume(
                i,
                data.draw(st.booleans(), label="from zero"),
                issued[max(0, len(issued) - 1 - age)],
            )
        else:
            world.step(
                data.draw(st.sampled_from([a for a in actions if a[0] == kind]), label="action")
            )

    @invariant()
    def invariants_hold(self) -> None:
        self.world.check()
        self.world.probe()


CoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("CORE_STATEFUL_EXAMPLES", "150")),
    stateful_step_count=50,
    deadline=None,
    derandomize="CORE_STATEFUL_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase
