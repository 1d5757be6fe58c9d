"""How much of each scenario to run: the full suite (~13 min) and ``--quick`` (< 3 min)."""

from __future__ import annotations

import attrs


def geometric_steps(start: int, factor: float, stop: int) -> list[int]:
    """Rising session counts start, start*factor, ... (each at least one more), up to stop."""
    steps = [start]
    while steps[-1] < stop:
        steps.append(min(stop, max(steps[-1] + 1, round(steps[-1] * factor))))
    return steps


@attrs.frozen
class Plan:
    name: str
    # Seconds each scenario may take; rounds that would not fit are skipped.
    budget: dict[str, float]
    # 1. throughput and 7. peer throughput
    tp_rounds: int
    tp_warmup: float
    tp_duration: float
    tp_window: int = 100
    ack_every: int = 100
    # 2. latency
    lat_rounds: int = 3
    lat_samples: int = 5000
    lat_warmup: int = 300
    # 3. voice: one coarse ramp per server, then fine ramps around what it found
    voice_coarse_start: int = 10
    voice_coarse_factor: float = 1.25
    voice_fine_rounds: int = 2
    voice_fine_factor: float = 1.07
    voice_settle: float = 0.6
    voice_measure: float = 1.5
    voice_max_sessions: int = 2000
    voice_ramp_time: float = 40.0
    voice_threshold_ms: float = 20.0
    voice_ack_every: int = 50
    # 4. idle sessions and 7. peer memory
    idle_rounds: int = 2
    idle_count: int = 10_000
    idle_open_concurrency: int = 100
    idle_settle: float = 1.0
    idle_open_limit: float = 60.0  # stop opening after this long and report how many opened
    # 5. handshakes
    hs_rounds: int = 3
    hs_duration: float = 2.0
    hs_concurrency: int = 8
    # 6. resume: K -> trials (each trial runs trio-duplex and the bare baseline once)
    resume_trials: tuple[tuple[int, int], ...] = ((0, 100), (100, 100), (10_000, 6))
    resume_window: int = 64
    # 8. the OpenAI dialect against the native one (its rounds: tp_rounds; its ramps: voice_*)
    dialect_window: int = 16
    dialect_turn_frames: int = 10  # voice: a turn per 10 frames (200 ms)
    dialect_voice_measure: float = 2.0
    # 9. WebRTC calls against WebSocket voice sessions (both on the voice engine)
    calls_rounds: int = 2
    calls_steps: tuple[int, ...] = (2, 4, 6, 8, 10, 12, 14, 16, 20)
    calls_ws_steps: tuple[int, ...] = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 140)
    calls_open: float = 4.0  # seconds a step has to open its new calls
    calls_ws_open: float = 1.5
    calls_settle: float = 1.0
    calls_measure: float = 2.0
    calls_windows: int = 2  # measured windows a step; it holds if one does
    calls_gap_ms: float = 30.0  # the client's p99 gap between a call's audio packets
    calls_memory_steps: tuple[int, ...] = (0, 50, 100)  # idle calls (active: the ramp's)
    calls_memory_open: float = 30.0
    calls_latency_responses: int = 100
    # 10. phone calls (fake Twilio) against WebSocket μ-law sessions (both on the voice engine)
    tel_rounds: int = 2
    # (One ramp for both kinds, past where a quiet 2-core machine held them: 80 calls and
    # 128 sessions both held at the tops of the ramps of 2026-12-03, which then compared
    # the ramps' lengths rather than the two kinds.)
    tel_steps: tuple[int, ...] = (4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192)
    tel_ws_steps: tuple[int, ...] = (4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192)
    tel_open: float = 3.0  # seconds a step has to open its new calls
    tel_settle: float = 1.0
    tel_measure: float = 3.0
    tel_windows: int = 2  # measured windows a step; it holds if one does
    tel_every: float = 1.5  # seconds between a call's replies (a key; a session's text)
    tel_underrun: float = 0.01  # the playout may run dry inside replies this share at most
    tel_ws_frame_ms: float = 20.0  # a session's μ-law frames up (a call's channel: 40 ms appends)
    tel_jitter_ms: float = 20.0  # the SLO's playout starts a reply this long after its first byte
    tel_deploy_calls: int = 8  # calls across the deploy (homed on the node SIGTERMed)


FULL = Plan(
    name="full",
    budget={"1": 85, "2": 55, "3": 225, "4": 160, "5": 30, "6": 60, "8": 170, "9": 600, "10": 600},
    tp_rounds=3,
    tp_warmup=0.5,
    tp_duration=2.0,
)

QUICK = Plan(
    name="quick",
    budget={"1": 25, "2": 11, "3": 48, "4": 20, "5": 8, "6": 12, "8": 40, "9": 120, "10": 150},
    tp_rounds=2,
    tp_warmup=0.3,
    tp_duration=1.0,
    lat_rounds=2,
    lat_samples=2000,
    lat_warmup=200,
    voice_coarse_factor=1.3,
    voice_fine_rounds=0,
    voice_settle=0.5,
    voice_measure=1.0,
    voice_ramp_time=25.0,
    idle_rounds=2,
    idle_count=1000,
    idle_settle=0.5,
    idle_open_limit=12.0,
    hs_rounds=2,
    hs_duration=1.0,
    resume_trials=((0, 30), (100, 30), (10_000, 2)),
    dialect_voice_measure=1.5,
    calls_rounds=1,
    calls_steps=(2, 6, 10, 14),
    calls_ws_steps=(20, 40, 60, 80, 100),
    calls_open=3.0,
    calls_measure=1.5,
    calls_memory_steps=(0, 20),
    calls_memory_open=10.0,
    calls_latency_responses=20,
    tel_rounds=1,
    tel_steps=(4, 16, 32, 48),
    tel_ws_steps=(4, 16, 32, 64, 96),
    tel_measure=2.0,
    tel_every=1.0,
    tel_deploy_calls=2,
)
