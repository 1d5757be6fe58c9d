"""The server's Prometheus metrics, read at scrape time.

Nothing here runs per event. The per-event paths only bump plain integers on objects
they already hold (a session's ``Usage``, ``Sessions.totals``; one engine event in
``runner.SAMPLE_EVERY`` per session is timed from send to write); a scrape walks the
live sessions and turns those counts into metric families (a prometheus-client custom
collector), so an unscraped server pays nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ...core.session import State
from ..config import ServerConfig
from ..sessions.owner import Sessions
from ..sessions.runner import SAMPLE_EVERY

if TYPE_CHECKING:
    from .twiliodoor import TwilioStats


class Served(Protocol):
    """What the metrics read of a server (``DuplexServer``)."""

    config: ServerConfig
    sessions: Sessions

    @property
    def open_connections(self) -> int: ...

    @property
    def connections_refused(self) -> int: ...

    @property
    def cluster_store_up(self) -> bool | None: ...


CONTENT_TYPE = CONTENT_TYPE_LATEST


@attrs.frozen
class _Live:
    """The live sessions' counts at a scrape (events: every session's, ended ones too)."""

    by_state: dict[str, int]
    events_in: int
    events_out: int
    journal_bytes: int
    by_dialect: dict[str, list[int]]
    """Per dialect: started sessions live now, events in, events out (ended ones too)."""

    @classmethod
    def of(cls, sessions: Sessions) -> _Live:
        by_state = dict.fromkeys([state.value for state in State if state is not State.CLOSED], 0)
        events_in, events_out = sessions.totals.ended.events_in, sessions.totals.ended.events_out
        journal_bytes = 0
        for session in list(sessions.registry.sessions.values()):
            by_state[session.state.value] += 1
            usage = session.usage
            events_in += usage.events_in
            events_out += usage.events_out
            journal_bytes += session.journal.bytes
        by_dialect = {
            name: [0, events_in, events_out]
            for name, (events_in, events_out) in sessions.totals.ended_by.items()
        }
        for runner in sessions.runners():
            counts = by_dialect.setdefault(runner.dialect.name, [0, 0, 0])
            usage = runner.session.usage
            counts[0] += 1
            counts[1] += usage.events_in
            counts[2] += usage.events_out
        return cls(by_state, events_in, events_out, journal_bytes, by_dialect)


class ServerCollector(Collector):
    """One server's metrics, all named ``trio_duplex_*`` (README, Health and metrics)."""

    def __init__(self, server: Served) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        live = _Live.of(self.server.sessions)
        yield from self._gauges(live)
        yield from self._counters(live)
        store_up = self.server.cluster_store_up
        if store_up is not None:
            yield GaugeMetricFamily(
                "trio_duplex_cluster_store_up",
                "1 if the cluster store (--cluster) answered its last call, else 0.",
                int(store_up),
            )
        twilio = getattr(self.server, "twilio", None)  # (a server with phone calls)
        if twilio is not None:
            yield from _twilio(twilio.stats)
        sampled = self.server.sessions.send_to_write
        yield _histogram(
            "trio_duplex_send_to_write_seconds",
            "Time from an engine's send to its frame's write, sampled: "
            f"one event in {SAMPLE_EVERY} per session.",
            sampled.bounds,
            sampled.counts,
            sampled.total,
        )

    def _gauges(self, live: _Live) -> Iterator[Metric]:
        server = self.server
        gauge = GaugeMetricFamily(
            "trio_duplex_sessions", "Sessions holding a slot, by state.", labels=["state"]
        )
        for state, count in live.by_state.items():
            gauge.add_metric([state], count)
        yield gauge
        yield GaugeMetricFamily(
            "trio_duplex_slots_max", "Session slots (--max-sessions).", server.config.max_sessions
        )
        yield GaugeMetricFamily(
            "trio_duplex_connections",
            "Open TCP connections counted against --max-connections.",
            server.open_connections,
        )
        yield GaugeMetricFamily(
            "trio_duplex_journal_bytes",
            "Bytes held in the replay journals of live sessions.",
            live.journal_bytes,
        )

    def _counters(self, live: _Live) -> Iterator[Metric]:
        server = self.server
        totals = server.sessions.totals
        yield CounterMetricFamily(
            "trio_duplex_sessions_opened",
            "Sessions opened (session.created delivered).",
            totals.opened,
        )
        resumes = CounterMetricFamily(
            "trio_duplex_resumes",
            "Resume attempts by result: ok, aborted, or the error code of a refusal.",
            labels=["result"],
        )
        for result, count in sorted(totals.resumes.items()):
            resumes.add_metric([result], count)
        yield resumes
        events = CounterMetricFamily(
            "trio_duplex_events",
            "Session events: in, client events handled; out, engine events sequenced.",
            labels=["direction"],
        )
        events.add_metric(["in"], live.events_in)
        events.add_metric(["out"], live.events_out)
        yield events
        # By dialect: series of their own, so that the unlabelled ones above stay as they are.
        live_by = GaugeMetricFamily(
            "trio_duplex_dialect_sessions",
            "Sessions started and not yet ended, by dialect.",
            labels=["dialect"],
        )
        opened_by = CounterMetricFamily(
            "trio_duplex_dialect_sessions_opened",
            "Sessions opened (session.created delivered), by dialect.",
            labels=["dialect"],
        )
        events_by = CounterMetricFamily(
            "trio_duplex_dialect_events",
            "Session events by dialect: in, client events handled; out, events sequenced.",
            labels=["dialect", "direction"],
        )
        for name in sorted({*live.by_dialect, *totals.opened_by}):
            running, events_in, events_out = live.by_dialect.get(name, (0, 0, 0))
            live_by.add_metric([name], running)
            opened_by.add_metric([name], totals.opened_by.get(name, 0))
            events_by.add_metric([name, "in"], events_in)
            events_by.add_metric([name, "out"], events_out)
        yield live_by
        yield opened_by
        yield events_by
        yield CounterMetricFamily(
            "trio_duplex_replayed_events",
            "Journaled events written again by resumes.",
            totals.replayed_events,
        )
        yield CounterMetricFamily(
            "trio_duplex_replay_audio_dropped",
            "Journaled audio frames resumes did not write again (calls replay no audio).",
            totals.replay_audio_dropped,
        )
        refusals = CounterMetricFamily(
            "trio_duplex_handshake_refusals",
            "HTTP upgrade requests refused, by reason.",
            labels=["reason"],
        )
        refused = dict(totals.refusals)
        if server.connections_refused:
            refused["over_limit"] = server.connections_refused
        for reason, count in sorted(refused.items()):
            refusals.add_metric([reason], count)
        yield refusals
        yield CounterMetricFamily(
            "trio_duplex_engine_errors",
            "Engines that failed: sessions ended engine_error, and failures before a session.",
            totals.engine_errors,
        )


def _twilio(stats: TwilioStats) -> Iterator[Metric]:
    """Phone calls' counters (twiliodoor.py); a stream's are added as it ends."""
    tables: list[tuple[str, str, str, dict[str, int]]] = [
        ("calls", "Twilio streams by outcome at their start.", "outcome", stats.calls),
        ("refusals", "Twilio webhooks and streams refused, by reason.", "reason", stats.refusals),
        ("redirects", "Answers to a call's <Redirect>, by result.", "result", stats.redirects),
        ("stream_events", "Stream status callbacks, by StreamEvent.", "event", stats.stream_events),
        ("marks", "Marks sent to Twilio and what came of them.", "kind", stats.marks),
        ("clears", "clear messages sent to Twilio, by why.", "why", stats.clears),
        ("dropped", "Twilio messages dropped, by what.", "what", stats.dropped),
    ]
    for name, text, label, table in tables:
        family = CounterMetricFamily(f"trio_duplex_twilio_{name}", text, labels=[label])
        for key, count in sorted(table.items()):
            family.add_metric([key], count)
        yield family
    audio = CounterMetricFamily(
        "trio_duplex_twilio_audio_seconds",
        "Seconds of call audio, by direction (in: from the caller).",
        labels=["direction"],
    )
    for direction, count in sorted(stats.audio_bytes.items()):
        audio.add_metric([direction], count / 8000)
    yield audio


def _histogram(
    name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: float
) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], buckets, total)
    return family


def exposition(server: Served) -> bytes:
    """The Prometheus text exposition of ``server``'s metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(server))
    return generate_latest(registry)
