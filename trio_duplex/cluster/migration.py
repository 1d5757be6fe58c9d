"""Sessions that survive a deploy (docs/cluster.md): handing sessions from a draining node to
whichever node their clients resume on. Cluster mode only.

Out (``hand_over_all``, on SIGTERM): each live session whose engine can migrate
(``engines.api.can_migrate``) is frozen at a safe point (``SessionRunner.freeze``), its
record (``core.migration``: the engine's snapshot, the unacknowledged journal, the
client-seq state, the credential digests) is stored for the session's resume window
(``Store.hand_over``, which also drops the session's directory entry), its client is
told ``session.going_away {time_left_ms, migrating: true}`` and its connection closed
(1001), and the session ends here (``Reason.MIGRATED``: no terminal event, the session
lives on). Sessions whose engine cannot migrate, or whose freeze or hand-over fails,
drain as before (they end ``server_shutdown``): one session whose export fails, however
it fails, ends alone, in one log line, and the others move. Every engine is stopped at
once; at most ``AT_ONCE`` records are written concurrently. A hand-over the store does not
confirm in time is not known to have failed (a call given up on may still run): its
client is sent on all the same.

In (``adopt``, on a resume for a session this node does not hold): the record, read
from the store (sealed by a node of this cluster: ``Store.locate`` checks it) and claimed
by this node for a few seconds, is first checked against the resume's token, in constant
time: a resume without a token of the session takes nothing and restores nothing. Then
it becomes a DETACHED session here with a fresh engine restored from the snapshot; once
the store confirms (``Store.adopted``: this node is its home, the record gone, in one
step) the ordinary resume checks the token again, replays and attaches. Nothing is
ever taken from the store by a call whose answer could be lost: if this node cannot
take the session (full, draining, a broken engine) or the store does not confirm, the
claim is given back or lapses, and the client is refused retryably (another node, or
this one later, takes it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..core import cluster, events
from ..core.credentials import Credentials
from ..core.events import Reason
from ..core.frames import CloseCode
from ..core.migration import BadRecord, Record, export, restore
from ..core.session import State
from ..core.wire import ProtocolError
from ..dialects import by_name
from ..engines.api import Engine, can_migrate, prepares
from ..server.config import ServerConfig
from ..server.sessions.opening import settle_audio
from ..server.sessions.owner import Sessions
from ..server.sessions.runner import SessionRunner

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .node import ClusterNode

log = logging.getLogger("trio_duplex")

AT_ONCE = 32
"""Sessions whose records are written to the store concurrently during a drain (their
engines are all stopped at once, before)."""
_MARGIN_S = 0.5
"""Of the drain's time left, kept for telling the client and closing."""
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest record a node adopts (a journal is bounded by ``journal_max_bytes``)."""


def migratable(runner: SessionRunner) -> bool:
    """Will the drain hand this session over (rather than end it)?"""
    session = runner.session
    return can_migrate(runner.engine) and session.state in (State.ATTACHED, State.DETACHED)


async def hand_over_all(sessions: Sessions, node: ClusterNode, config: ServerConfig) -> None:
    """Hand every migratable session to the cluster (see the module's docstring)."""
    limit = trio.CapacityLimiter(AT_ONCE)
    async with trio.open_nursery() as nursery:
        for runner in sessions.runners():
            if migratable(runner):
                nursery.start_soon(_hand_over_or_end, sessions, runner, node, config, limit)


async def _hand_over_or_end(
    sessions: Sessions,
    runner: SessionRunner,
    node: ClusterNode,
    config: ServerConfig,
    limit: trio.CapacityLimiter,
) -> None:
    """``_hand_over``; whatever it raises ends this session alone (one line, no
    traceback), never the drain of the others."""
    try:
        await _hand_over(sessions, runner, node, config, limit)
    except Exception as exc:
        session = runner.session
        log.error(
            "session %s could not be handed over (%s: %s); it ends server_shutdown",
            session.id,
            type(exc).__name__,
            str(exc)[:200],
            extra={"session_id": session.id},
        )
        conn = runner.conn
        if conn is not None and conn.generation == 0:  # fenced by the freeze: unfence
            conn.generation = session.generation
        if session.terminal is None:
            runner.end(Reason.SHUTDOWN)


async def _hand_over(
    sessions: Sessions,
    runner: SessionRunner,
    node: ClusterNode,
    config: ServerConfig,
    limit: trio.CapacityLimiter,
) -> None:
    session = runner.session
    while session.resume is not None:  # a resume in progress: let it finish first
        await sessions.wait_changed()
    if session.state not in (State.ATTACHED, State.DETACHED):
        return  # it ended meanwhile
    attached = runner.conn
    if attached is not None and not session.is_current(attached.generation):
        attached = None
    # Every engine is stopped at once, not AT_ONCE at a time: on a node short of CPU
    # (why it is being replaced, often) the engines still running are what slows the
    # hand-overs down.
    frozen = await runner.freeze()  # (fences the attached connection off)
    if session.terminal is not None:
        return  # ended meanwhile (the drain's deadline, a close): nothing to move
    if frozen is None:
        runner.end(Reason.SHUTDOWN)
        return
    async with limit:
        try:
            record = export(session, frozen).to_bytes()
        except Exception as exc:  # (not JSON, too deep, an engine state that breaks...)
            # One session's failure ends that session alone: the drain goes on.
            log.error(
                "session %s cannot be handed over (%s: %s); it ends server_shutdown",
                session.id,
                type(exc).__name__,
                str(exc)[:200],
                extra={"session_id": session.id},
            )
            if attached is not None:  # not moving: it hears how the session ends
                attached.generation = session.generation
            runner.end(Reason.SHUTDOWN)
            return
        # Most of what is left of the drain (a loaded node reads answers late), at least
        # the store's own bound.
        patience = max(node.store.timeout_s, sessions.going_away_ms() / 1000 - _MARGIN_S)
        stored = await node.hand_over(session.id, record, config.disconnect_grace_s, patience)
        if not stored:
            # Perhaps stored all the same (Redis may run a call given up on): the client
            # is sent on as if it were, so that a stored record is always found. If it
            # was not, its resume elsewhere is refused session_resume_expired: the end
            # the drain would have given it, heard one step later.
            log.warning(
                "session %s: the store did not confirm its hand-over within %.1fs; its "
                "client is sent on to resume elsewhere, which fails if it was not stored",
                session.id,
                patience,
                extra={"session_id": session.id},
            )
    if attached is not None:
        going = session.frame(events.going_away(sessions.going_away_ms(), migrating=True))
        attached.finish([going], CloseCode.GOING_AWAY)
    sessions.totals.count(
        sessions.totals.resumes, "handed_over" if stored else "handed_over_unconfirmed"
    )
    runner.end(Reason.MIGRATED)
    log.info(
        "session %s handed over to the cluster (%d bytes)",
        session.id,
        len(record),
        extra={"session_id": session.id, "generation": session.generation},
    )


async def adopt(
    session_id: str,
    record_bytes: bytes,
    token: str,
    sessions: Sessions,
    node: ClusterNode,
    config: ServerConfig,
    new_engine: Callable[[Mapping[str, Any]], Engine],
) -> None:
    """Make the handed-over session of ``record_bytes`` (claimed by this node in the
    store, by ``locate``) live here, DETACHED, for the resume that found it; then tell
    the store, which makes this node its home and drops the record in one step.
    ProtocolError: it cannot be taken here (retryable: the claim is given back, or
    lapses, for another node), ``token`` is not the session's (``invalid_resume_token``:
    nothing was taken), or the record is unusable (``session_resume_expired``)."""
    try:
        record = Record.from_bytes(record_bytes, max_bytes=MAX_RECORD_BYTES)
        if record.session_id != session_id:
            raise BadRecord(f"the record of {record.session_id} is filed as {session_id}")
    except BadRecord as exc:
        log.error("a handed-over session's record is unusable: %s", exc)
        raise cluster.record_unusable() from None
    # Before anything is restored or leased: only the session's own client moves it.
    if not Credentials.from_digests(record.current_digest, record.pending_digest).check(token):
        with trio.CancelScope(shield=True):
            await node.unclaim_migration(session_id)
        raise cluster.takeover_token_invalid()
    try:
        dialect = by_name(record.dialect)
    except KeyError:
        log.error("a handed-over session's record names an unknown dialect")
        raise cluster.record_unusable() from None
    try:
        config_now = dict(record.config)
        engine = new_engine(config_now)  # ProtocolError: the engine refused (BadEvent), broke
        engine.restore(record.engine_state)
        settle_audio(engine, config_now)
        # Its record's lease in transit becomes this node's (ProtocolError at the cap:
        # only if the store says more sessions hold slots than the cap allows).
        leased = await node.acquire(moving=session_id)
        prepared = None
        try:
            if prepares(engine):
                prepared = await sessions.prepare(engine)  # ProtocolError: not ready
            session = restore(record, config.core_limits, trio.current_time(), dialect)
            state = record.shaper_state
            # ValueError (a bad state): logged below as a take-over that failed.
            shaper = (
                dialect.shaper(session.config)
                if state is None
                else dialect.restore_shaper(session.config, state)
            )
            runner = sessions.adopt(  # ProtocolError: full, ...
                session, engine, prepared, dialect=dialect, shaper=shaper
            )
            runner.restore_input(record.pending_input)
        except BaseException:
            if prepared is not None:
                prepared.release()
            if leased:
                node.release()
            raise
    except BaseException as exc:
        with trio.CancelScope(shield=True):  # for another node, now rather than later
            await node.unclaim_migration(session_id)
        if isinstance(exc, ProtocolError | trio.Cancelled):
            raise
        log.error("session %s: could not be taken over", session_id, exc_info=exc)
        raise cluster.takeover_failed() from None
    # Live here, but not this node's until the store says so: were the claim to lapse
    # unconfirmed, another node could take the record over too.
    if not await node.adopted(session_id):
        log.warning(
            "session %s: the store did not confirm its take-over; left to another node",
            session_id,
            extra={"session_id": session_id},
        )
        runner.end(Reason.MIGRATED)  # quietly: it has no connection, and lives elsewhere
        raise cluster.takeover_unconfirmed()
    sessions.totals.count(sessions.totals.resumes, "taken_over")
    log.info(
        "session %s taken over (generation %d)",
        session.id,
        session.generation,
        extra={"session_id": session.id, "generation": session.generation},
    )


__all__ = ["AT_ONCE", "adopt", "hand_over_all", "migratable"]
