"""The benchmark harness's pure helpers: fast and deterministic, no process, no socket;
and one tiny soak (a few seconds, every kind of session) against a real server.

The benchmarks themselves run with ``python -m benchmarks``, never in the test suite.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the root off
    sys.path.insert(0, str(ROOT))

from benchmarks.probes import codecs, soak, transcode, wire_bytes  # noqa: E402
from benchmarks.suite import _plan, _stats, _workload  # noqa: E402
from trio_duplex.audio import opus_available  # noqa: E402


def test_the_codecs_benchmark_runs_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    codecs.main(["--seconds", "0.1"])
    out = capsys.readouterr().out
    for name, _ in codecs.PATHS:
        assert name in out


def test_percentile_interpolates_like_numpy_linear() -> None:
    data = [4.0, 1.0, 3.0, 2.0]
    assert _stats.percentile(data, 50) == 2.5
    assert _stats.percentile(data, 0) == 1.0
    assert _stats.percentile(data, 100) == 4.0
    assert _stats.percentile(range(1, 1001), 99.9) == pytest.approx(999.001)
    assert _stats.percentiles([1.0, 2.0, 3.0], (50, 99.9)) == {"p50": 2.0, "p999": 2.998}
    with pytest.raises(ValueError):
        _stats.percentile([], 50)
    with pytest.raises(ValueError):
        _stats.percentile([1.0], 101)


def test_summary_and_paired_ratios() -> None:
    s = _stats.Summary.of([3.0, 1.0, 2.0, math.nan])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert _stats.Summary.of([]).n == 0
    # A failed run (None) or a zero baseline drops only its own pair.
    assert _stats.paired_ratios([2.0, None, 9.0, 4.0], [1.0, 5.0, 0, 8.0]) == [2.0, 0.5]


def _row(ratio: float, ours: float = 1.0, **kw: object) -> _stats.Row:
    return _stats.Row(
        scenario="1",
        metric="events/s",
        ours=_stats.Summary.of([ours]),
        baseline_name="bare",
        baseline=_stats.Summary.of([1.0]),
        ratio=_stats.Summary.of([ratio, ratio * 0.9, ratio * 1.1]),
        **kw,  # type: ignore[arg-type]
    )


def test_targets_are_judged_on_the_right_side() -> None:
    assert _row(0.95, target="≥ 0.9x", target_ratio=0.9).met is True
    assert _row(0.85, target="≥ 0.9x", target_ratio=0.9).met is False
    kb = dict(higher_is_better=False, target="≤ 25 KB", target_abs=25.0)
    assert _row(1.0, ours=24.0, **kb).met is True
    assert _row(1.0, ours=26.0, **kb).met is False
    assert _row(1.0).met is None


def test_table_shows_median_range_ratio_and_verdict() -> None:
    row = _row(0.85, ours=6070.0, target="≥ 0.9x", target_ratio=0.9, unit="")
    table = _stats.format_table([row])
    header, rule, line = table.splitlines()
    assert header.split()[:3] == ["#", "metric", "trio-duplex"]
    assert set(rule) <= {"-", " "}
    assert "6,070" in line and "0.85\u00d7 (0.77\u20130.94)" in line and "MISS" in line
    markdown = _stats.format_markdown([row])
    assert markdown.count("\n") == 2 and markdown.startswith("| # |")
    assert json.loads(json.dumps(row.as_dict()))["met"] is False


def test_voice_ramp_stops_at_the_first_step_over_the_limit() -> None:
    steps = [(10, 2.0), (20, 5.0), (40, 25.0), (80, 3.0)]
    assert _stats.largest_passing(steps, 20.0) == 20
    assert _stats.largest_passing([(10, 30.0)], 20.0) == 0
    assert _stats.largest_passing([(10, math.nan), (20, 1.0)], 20.0) == 0


def test_ramp_steps_and_plans() -> None:
    assert _plan.geometric_steps(10, 1.25, 40) == [10, 12, 15, 19, 24, 30, 38, 40]
    assert _plan.geometric_steps(1, 1.01, 4) == [1, 2, 3, 4]
    assert _plan.QUICK.idle_count < _plan.FULL.idle_count == 10_000
    assert dict(_plan.FULL.resume_trials).keys() == {0, 100, 10_000}


def test_workload_frames_have_the_sizes_the_issue_names() -> None:
    assert len(_workload.TEXT.encode()) == 100
    assert len(_workload.AUDIO_RAW) == 640 and len(_workload.AUDIO_B64) == 856
    assert json.loads(_workload.TEXT_FRAME) == {"type": "input.text.append", "text": _workload.TEXT}
    assert json.loads(_workload.ack(7)) == {"type": "session.event_ack", "server_event_seq": 7}
    assert len(_workload.VOICE_RAW) == 960  # 20 ms of 24 kHz PCM16, the echo engine's rate
    voice = json.loads(_workload.VOICE_JSON)
    assert voice["type"] == "input_audio_buffer.append" and len(voice["audio"]) == 1280
    # The binary lane's 12-byte header: kind 1, flags 0, reserved 0, seq 0, big-endian.
    assert _workload.VOICE_BINARY == bytes([1] + [0] * 11) + _workload.VOICE_RAW
    burst = json.loads(_workload.burst_frame(3))
    assert burst["server_event_seq"] == 3 and burst["text"] == _workload.TEXT


def test_soak_splits_the_mix_and_fits_the_rss() -> None:
    mix = soak.parse_mix("voice=73,hostile=15,resume=10,abuse=2")
    assert soak.allocate(1000, mix) == {"voice": 730, "hostile": 150, "resume": 100, "abuse": 20}
    assert soak.allocate(4, mix) == {"voice": 1, "hostile": 1, "resume": 1, "abuse": 1}
    assert sum(soak.allocate(7, mix).values()) == 7
    assert soak.split({"voice": 3, "hostile": 1, "resume": 0, "abuse": 0}, 2) == [
        [2, 1, 0, 0],
        [1, 0, 0, 0],
    ]
    with pytest.raises(ValueError):
        soak.parse_mix("voice=1,readers=2")
    assert soak.least_squares([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx((2.0, 1.0))
    # 100 MiB, rising 1 MiB a minute: 60 s of warm-up left out, 4 minutes fitted.
    samples = [{"t": t, "rss": (100 + t / 60) * 2**20} for t in range(0, 301, 5)]
    flat = soak.rss_verdict(samples, 60, tolerance_pct=5, tolerance_mib=16)
    assert flat["slope_mib_per_min"] == pytest.approx(1.0)
    assert flat["fitted_rise_mib"] == pytest.approx(4.0)
    assert flat["passed"] is True and flat["tolerance_mib"] == 16
    grows = soak.rss_verdict(samples, 60, tolerance_pct=1, tolerance_mib=2)
    assert grows["passed"] is False
    assert soak.rss_verdict(samples[:2], 0, 5, 16)["passed"] is None


def test_soak_exactly_once_needs_a_resume_and_no_violation() -> None:
    ok = {"resume.ok": 3, "resume.sessions_checked": 1}
    assert soak.exactly_once(ok, [], resumers=1)["held"] is True
    assert soak.exactly_once({}, [], resumers=1)["held"] is False  # nothing was shown
    assert soak.exactly_once({}, [], resumers=0)["held"] is None
    broken = {**ok, "eo.gap": 1, "eo.violations": 1}
    assert soak.exactly_once(broken, ["resume s: seq 9 after 7 (gap)"], resumers=1)["held"] is False


@pytest.mark.integration
def test_soak_runs_a_tiny_mix_end_to_end(tmp_path: Path) -> None:
    """A few seconds of every kind against a real server, so the script cannot rot."""
    out = tmp_path / "soak.json"
    argv = [
        sys.executable, "-m", "benchmarks.soak", "--sessions", "8", "--minutes", "0.04",
        "--warmup", "0.5", "--sample-every", "0.2", "--ramp", "0.2", "--lifetime", "1,1.5",
        "--talk", "0.2,0.4", "--pause", "0.1,0.3", "--resume-pause", "0.1,0.3",
        "--drop-after", "0.1,0.3", "--tolerance-mib", "1000", "--no-pin",
        "--log-level", "warning", "--out", str(out),
    ]  # fmt: skip
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert report["settings"]["counts"] == {"voice": 5, "hostile": 1, "resume": 1, "abuse": 1}
    assert report["exactly_once"]["held"] is True, report["exactly_once"]
    assert counts["resume.ok"] >= 1 and counts["events"] > 0 and counts["hostile.opened"] >= 1
    assert counts.get("abuse.fragmented_ok", 0) >= 1
    assert not soak.problems(counts), counts
    assert len(report["samples"]) >= 10 and report["rss"]["passed"] is True
    assert "## Soak: 8 sessions" in run.stdout and "**Verdict: PASS**" in run.stdout


def test_wire_bytes_splits_frames_and_counts_whole_frames() -> None:
    # A server's unmasked 125-byte binary frame, then a client's masked 200-byte text frame.
    up = b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + bytes([0x82, 125]) + bytes(125)
    body = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 160}).encode()
    mask = b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(body))
    data = up + bytes([0x81, 0x80 | 126]) + len(body).to_bytes(2, "big") + mask + masked
    first, second = wire_bytes.split_frames(data)
    assert (first.opcode, first.size) == (2, 127)
    assert (second.opcode, second.size, second.payload) == (1, 8 + len(body), body)
    assert wire_bytes.classify(second) == "audio" and wire_bytes.audio_payload(second) == 120


def _run(module: str, *args: str, timeout: float = 90) -> str:
    argv = [sys.executable, "-m", f"benchmarks.{module}", *args]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _result(out: str) -> Any:
    """A load generator's ``@result`` object."""
    return json.loads(out.split("@result ", 1)[1])


def _one_clean_voice_step(out: str) -> None:
    """A voice ramp of one step: its 2 sessions answered, none dead, no error."""
    (step,) = _result(out)["steps"]
    assert step["sessions"] == 2 and step["samples"] > 0, step
    assert not step["errors"] and not step["dead"], step


@contextmanager
def _serving(engine: str = "echo") -> Iterator[int]:
    """`trio-duplex serve` as the suite starts it (warnings only), until its port is open:
    that port; stopped at the end."""
    from benchmarks.suite._procs import free_port, port_open
    from benchmarks.suite._suite import DEFAULT_DUPLEX_CMD, duplex_flags

    port = free_port()
    flags = duplex_flags(port)
    flags[flags.index("--log-level") + 1] = "warning"
    flags[flags.index("--engine") + 1] = engine
    server = subprocess.Popen([*DEFAULT_DUPLEX_CMD, *flags], cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if port_open(port):
                break
            assert server.poll() is None, "trio-duplex serve exited"
            time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(10)


def test_throughput_counts_every_event_either_way_for_every_server() -> None:
    """Scenario 1/7's OpenAI rows: a turns run counts its client and server events, an
    echo run two per echo; per server CPU-second between the window's marks."""
    from benchmarks.suite._scenarios import either_way, either_way_per_cpu

    marks = {"window_start": {"cpu": 1.0}, "window_end": {"cpu": 1.5}}
    turns = {"turns": 10, "client_events": 20, "server_events": 120, "server": marks}
    echo = {"events": 70, "server": marks}
    assert either_way(turns) == 140 and either_way(echo) == 140
    assert either_way_per_cpu(turns) == either_way_per_cpu(echo) == 280


def test_the_dialect_turns_drive_the_openai_dialect_of_a_real_server() -> None:
    """The OpenAI throughput of scenarios 1, 7 and 8: text turns on /v1/realtime, answered
    without an error, each with OpenAI's 12 server events."""
    from benchmarks.suite._dialects import dialect_url

    with _serving() as port:
        url = dialect_url(f"ws://127.0.0.1:{port}/v1/duplex", "openai")
        out = _run("suite.clients.dialects", "turns", "--url", url, "--dialect", "openai",
                   "--warmup", "0.2", "--duration", "0.3", "--window", "1")  # fmt: skip
    result = _result(out)
    assert result["turns"] > 0 and not result["errors"], result
    assert result["client_events"] == 2 * result["turns"]
    # (window 1: a turn is sent when the last ended, so the window holds whole turns, +-1)
    assert abs(result["server_events"] - 12 * result["turns"]) <= 12, result


def test_wire_bytes_runs_every_lane_and_format() -> None:
    out = _run("wire_bytes", "--seconds", "0.1")
    for lane in wire_bytes.LANES:
        for name, fmt in wire_bytes.FORMATS:
            if fmt.format != "opus" or opus_available():
                assert f"| {lane} | {name} |" in out


def test_the_transcode_benchmark_runs_every_path() -> None:
    """Well-formed figures, whatever the window measured: a cost per frame is a positive
    number, or None where the window counted no server CPU (psutil's 10 ms ticks)."""
    out = _run("transcode", "--rounds", "1", "--sessions", "2", "--seconds", "0.3",
               "--warmup", "0.3", "--json")  # fmt: skip
    table, _, dumped = out.partition("\n{\n")
    for name, _lane, fmt in transcode.PATHS:
        if fmt.format != "opus" or opus_available():
            assert f"| {name} |" in table
    runs = json.loads("{\n" + dumped)
    assert set(runs) >= {"pcm16 24k passthrough (binary)", "g711_ulaw 8k (binary)"}
    for (run,) in runs.values():
        assert run["frames"] > 0 and not run["errors"], run
        assert run["server_cpu_s"] >= 0
        per = run["us_per_frame"]
        assert per is None if run["server_cpu_s"] == 0 else per > 0, run


_NO_SERVER_CPU = """
from benchmarks.probes import transcode
from benchmarks.suite import _procs
real = _procs.Proc.snapshot
_procs.Proc.snapshot = lambda self: {**real(self), "cpu": 1.0}
transcode.PATHS = [p for p in transcode.PATHS if p[2].format == "pcm16"]
transcode.main(["--rounds", "1", "--sessions", "1", "--seconds", "0.1", "--warmup", "0.1"])
"""


def test_the_transcode_table_survives_a_window_with_no_server_cpu() -> None:
    """A real server and load, but every CPU reading the same (a window too short for one
    of psutil's ticks): the table says "-" rather than dividing by 0."""
    run = subprocess.run([sys.executable, "-c", _NO_SERVER_CPU], cwd=ROOT, capture_output=True,
                         text=True, timeout=90)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| pcm16")]
    assert len(rows) == 2, run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1:3] == ["-", "-"] and cells[4] == "-", row


def test_the_codecs_table_survives_a_clock_that_measures_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(time, "process_time", lambda: 1.0)  # (codecs reads time.process_time)
    codecs.main(["--seconds", "0.1"])
    lines = capsys.readouterr().out.splitlines()
    (passthrough,) = [line for line in lines if line.startswith("pcm16 24k passthrough")]
    assert passthrough.split()[-4:] == ["nan", "-", "nan", "-"]


def test_the_sdk_flood_runs_and_counts_refusals() -> None:
    out = _run("flood", "--rounds", "1", "--seconds", "0.3")
    assert "| events/s sent |" in out and "1 of 1 rounds |" in out


def test_the_voice_load_drives_both_lanes_of_a_real_server() -> None:
    """Scenario 3's load generator, one tiny step per lane against `trio-duplex serve`."""
    with _serving() as port:
        url = f"ws://127.0.0.1:{port}/v1/duplex"
        for lane in ("binary", "json"):
            out = _run("suite.clients.asyncio_ws", "voice", "--url", url, "--lane", lane,
                       "--steps", "2", "--settle", "0.2", "--measure", "0.3",
                       "--threshold-ms", "1000", "--max-time", "30")  # fmt: skip
            _one_clean_voice_step(out)


@pytest.mark.integration
def test_the_workers_benchmark_runs_its_three_parts_in_cluster_mode(tmp_path: Path) -> None:
    """benchmarks.workers: its own redis-server, `serve --workers 1` and `--workers 2`: the
    CPU per session at 0, 2 and 4 sessions, a worker on a core of its own (1, 2 and 3
    sessions against 4), the split of 4 sessions, a one-step ramp of 2 sessions each;
    every table printed, every session counted by a worker, nothing timed; and
    `--report` prints the same tables again from the record."""
    out_file = tmp_path / "workers.json"
    out = _run("workers", "--quick", "--sessions", "0,2,4", "--measure", "0.3", "--settle", "0.2",
               "--own-sessions", "2", "--split-sessions", "4", "--start", "2",
               "--max-sessions", "2",
               "--out", str(out_file), timeout=240)  # fmt: skip
    assert "### CPU per voice session" in out and "| 0 (idle) |" in out and "| 2 |" in out, out
    assert "| sessions per worker |" in out, out  # --workers 2 at 4 against 1 at 2
    assert "### A worker on a core of its own" in out and "(--workers 2 at 4)" in out, out
    assert "### Sessions per worker" in out and "Pooled (each connection once" in out, out
    # Whether 2 sessions held p99 <= 20 ms is the machine's business: not asserted.
    assert "### Capacity with cores" in out and "over --workers 1 on 1:" in out, out
    report = json.loads(out_file.read_text())
    for workers in ("1", "2"):
        ((idle, step, _),) = [run["steps"] for run in report["cpu"][workers]]
        assert idle["sessions"] == 0 and step["sessions"] == 2 and step["samples"] > 0, step
        assert not step["errors"] and not step["dead"], step
        assert len(step["worker_cpu_s"]) == int(workers) and step["cpu_ms_per_session_s"] >= 0
        ((ramp_step,),) = [run["steps"] for run in report["capacity"][workers]]
        assert ramp_step["sessions"] == 2 and not ramp_step["dead"], ramp_step
    ((_, step, step4),) = [run["steps"] for run in report["cpu"]["2"]]
    assert sum(step["sessions_by_worker"]) == 2, step  # each session on exactly one worker
    assert sum(step4["sessions_by_worker"]) == 4, step4
    (own1,) = [[s["sessions"] for s in run["steps"]] for run in report["own"]["1"]]
    assert own1 == [1, 2, 3], own1
    ((own2,),) = [run["steps"] for run in report["own"]["2"]]
    assert own2["sessions"] == 4 and sum(own2["sessions_by_worker"]) == 4, own2
    assert own2["own_core_sessions"] == own2["sessions_by_worker"][0], own2
    (sample,) = report["split"]["samples"]
    assert sample["sessions"] == 4 and sum(sample["sessions_by_worker"]) == 4, sample
    again = _run("workers", "--report", str(out_file))
    tables = "### CPU per voice session"
    assert again.split(tables, 1)[1] == out.split(tables, 1)[1], again


def test_the_workers_benchmark_judges_a_split_against_a_fair_coin() -> None:
    from benchmarks.probes.workers import capacity, own, split

    assert split.deviation([50, 50]) == 0 and split.deviation([60, 40]) == pytest.approx(0.2)
    assert split.deviation([30, 30, 60]) == pytest.approx(0.5)
    assert split.fair_within(2, 0.1) == 0.5  # 1/1 only: 2 of the 4 outcomes
    assert split.fair_within(400, 0.1) == pytest.approx(0.958, abs=0.002)
    assert capacity.cores_for(1, 2) == ([0], [1]) and capacity.cores_for(2, 2) == ([0], [1])
    assert capacity.cores_for(2, 4) == ([0, 1], [2, 3]) and capacity.cores_for(1, 1) == ([0], [0])
    # Part 1b: --workers 1 around the sessions per worker, --workers 2 at twice them.
    assert own.own_steps([30, 45], 1) == [20, 30, 45, 60]
    assert own.own_steps([30, 45], 2) == [60, 90]
    line = [(10.0, 1.0), (20.0, 3.0), (40.0, 4.0)]
    assert own.interpolate(line, 15) == 2.0 and own.interpolate(line, 30) == 3.5
    assert own.interpolate(line, 5) == 0.0 and own.interpolate(line, 60) == 5.0


def test_a_worker_on_its_own_core_is_not_judged_where_no_cpu_was_counted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # (--quick's 0.3 s windows: at one session --workers 1's CPU can read as none at all;
    # the ratio was divided by it and the run died of a ZeroDivisionError)
    from benchmarks.probes.workers import own

    def run(steps: list[dict[str, Any]]) -> dict[str, Any]:
        return {"steps": steps, "background": {"loadavg_1m": 0.5}}

    one = [{"sessions": 1, "server_cores": 0.0, "p99_ms": 0.8, "frames_per_wake": 1.0}]
    one.append({"sessions": 2, "server_cores": 0.0, "p99_ms": 0.5, "frames_per_wake": 1.0})
    two = {"sessions": 4, "own_core_sessions": 1, "own_core_cpu_ms_per_session_s": 32.5,
           "p99_ms": 0.4, "frames_per_wake": 1.0}  # fmt: skip
    assert own.report_own({1: [run(one)], 2: [run([two])]}, [1, 2]) == {}
    assert "not judged (no CPU counted for --workers 1 at as many" in capsys.readouterr().out
    one[0]["server_cores"] = 0.016  # counted: judged
    summary = own.report_own({1: [run(one)], 2: [run([two])]}, [1, 2])
    assert summary["2"]["ratio"] == [pytest.approx(32.5 / 16.0)]


@pytest.mark.integration
def test_the_cluster_benchmark_runs_its_scenarios(tmp_path: Path) -> None:
    """`benchmarks.cluster` (cluster mode) with two sessions and a fraction of a second each,
    against redis-server and real nodes (two echo, then three voice with a drain): it runs
    and reports every table, nothing timed."""
    out = tmp_path / "cluster.json"
    stdout = _run("cluster", "--sessions", "2", "--rounds", "1", "--k", "1,3", "--seconds",
                  "0.2", "--pings", "5", "--settle", "0.5", "--after", "0.3",
                  "--drain-timeout", "2", "--out", str(out))  # fmt: skip
    assert "### Resume via the home node vs relayed" in stdout
    assert "| 3 | K-th replayed event | p99 |" in stdout and "| step of a relayed resume" in stdout
    assert "| events/s (pipelined) |" in stdout and "| server CPU per event, both |" in stdout
    report = json.loads(out.read_text())
    (resume_round,) = report["resume"]["rounds"]["1"]
    for path in ("home", "relayed"):
        assert resume_round[path]["to_resumed"]["n"] == 2
    (tp_round,) = report["throughput"]["rounds"]
    assert tp_round["relayed"]["events"] > 0 and tp_round["direct"]["events"] > 0
    # Sampled (a number), but perhaps 0: a 0.2 s window may hold none of psutil's 10 ms ticks.
    assert tp_round["relayed"]["cpu_us_b"] >= 0
    assert "### Migration on drain" in stdout and "| going_away → next audio frame |" in stdout
    (drain,) = report["migrate"]
    assert drain["sessions"] == 2 and drain["violations"] == 0


def _speech_step(**changes: object) -> dict[str, object]:
    step: dict[str, object] = {
        "sessions": 2,
        "neighbour_delay": {"n": 100, "p99_ms": 12.0},
        "reply_frame_delay": {"n": 100, "p99_ms": 8.0},
        "turns": 3,
        "unanswered": 0,
        "errors": {},
        "refused": {},
        "dead": 0,
    }
    return {**step, **changes}


def test_the_speech_benchmark_judges_a_step() -> None:
    from benchmarks.probes.speech_tables import holds

    assert holds(_speech_step(), 20.0)
    assert not holds(_speech_step(neighbour_delay={"n": 100, "p99_ms": 21.0}), 20.0)
    assert not holds(_speech_step(reply_frame_delay={"n": 100, "p99_ms": 21.0}), 20.0)
    assert not holds(_speech_step(reply_frame_delay={"n": 0}), 20.0)  # no reply heard
    assert not holds(_speech_step(unanswered=1), 20.0)
    assert not holds(_speech_step(turns=0), 20.0)
    assert not holds(_speech_step(refused={"resource_exhausted": 1}), 20.0)
    assert not holds(_speech_step(errors={"input_backpressure": 1}), 20.0)
    # The baseline (the neighbour alone) is judged on the neighbour only.
    assert holds(_speech_step(sessions=0, turns=0, reply_frame_delay={"n": 0}), 20.0)


def test_the_speech_load_times_reply_frames_against_their_earliest() -> None:
    import argparse

    from benchmarks.probes.clients.speech_load import Load, Session

    load = Load(argparse.Namespace(utterance=[], seed=1))
    load.window = (0.0, math.inf)
    session = Session(load, 0, neighbour=False)
    session.speech_end, session.awaiting_audio = 9.5, True
    # Frames 0-4 of a reply: the third 10 ms late; the fifth 5 ms early, which moves the
    # grid's anchor (the first frames were late, not it early).
    for t in (10.0, 10.02, 10.05, 10.06, 10.075):
        session.reply_frame(t)
    delays = [d for _, d in load.reply_delays]
    assert delays == pytest.approx([0.0, 0.0, 0.01, 0.0, 0.0])
    ((ended, latency),) = load.turns  # end of speech → first frame, once
    assert ended == 9.5 and latency == pytest.approx(0.5)
    assert not session.awaiting_audio


def test_the_speech_load_noise_has_its_peak_and_does_not_repeat_soon() -> None:
    from benchmarks.probes.clients.speech_load import FRAME_BYTES, HEADER, noise_frames

    for peak in (4, 64):
        frames = noise_frames(50, 5, peak)
        assert len(set(frames)) == 50 and all(len(f) == len(HEADER) + FRAME_BYTES for f in frames)
        samples = [int.from_bytes(f[i : i + 2], "little", signed=True)
                   for f in frames for i in range(len(HEADER), len(f), 2)]  # fmt: skip
        assert max(map(abs, samples)) == peak


def test_the_speech_memory_slope_is_per_extra_session() -> None:
    from benchmarks.probes.speech_tables import memory_table, rss_slope

    def step(n: int, rss: float) -> dict[str, object]:
        procs = {"server": {"count": 1, "rss_mib": rss - 200, "pss_mib": rss - 220}}
        procs["recognisers"] = {"count": 1, "rss_mib": 200.0, "pss_mib": 190.0}
        return {"sessions": n, "memory": {"rss_mib": rss, "pss_mib": rss - 30, "procs": procs}}

    steps = [step(16, 400.0), step(1, 310.0), step(4, 322.0)]
    assert rss_slope(steps) == [(1, 4, 4.0, 4.0), (1, 16, 6.0, 6.0)]
    table = memory_table(steps)
    assert "| 16 | 200 (1) | 200 (1) | - | - | 400 | 370 |" in table, table
    assert rss_slope(steps[:1]) == []


@pytest.mark.integration
def test_the_speech_benchmark_runs_every_stage(tmp_path: Path) -> None:
    """benchmarks.speech: the outside set's first sentences, one speech session and the
    echo neighbour on the router engine, a noise step, a memory step, then admission at
    the default --max-sessions; nothing timed."""
    out_file = tmp_path / "speech.json"
    out = _run("speech", "--steps", "1", "--rounds", "1", "--measure", "3", "--warmup", "0.5",
               "--tail", "0.2", "--sentences", "2", "--noise-peaks", "4", "--rss-steps", "1",
               "--rss-measure", "1", "--admission-rounds", "1",
               "--json", str(out_file), timeout=240)  # fmt: skip
    assert "## Ramp" in out and "## Admission at the default --max-sessions" in out, out
    assert "## Turn ends in background noise" in out and "## Memory" in out, out
    report = json.loads(out_file.read_text())
    (step,) = report["ramp"]
    assert step["opened"] == 1 and not step["errors"] and not step["dead"], step
    assert step["neighbour_delay"]["n"] > 0, step  # the echo neighbour was answered
    (noise,) = report["noise"]
    assert noise["noise_peak"] == 4 and noise["sentences"] >= 1, noise
    (memory,) = report["memory"]
    assert memory["memory"]["procs"]["server"]["count"] == 1, memory
    assert memory["memory"]["rss_mib"] > 0, memory
    (admission,) = report["admission"]
    assert admission["sessions"] > admission["opened"] > 0, admission


def test_the_wer_benchmark_reads_the_whole_outside_set_and_pools_errors() -> None:
    from benchmarks.speech_wer import Heard, Result, sentences

    texts = sentences()
    assert len(texts) == 100 and not any(t.startswith("#") or not t for t in texts)
    assert sentences(3) == texts[:3] and texts[0] == "event reminder mona tuesday"
    heard = [Heard("turn on the light", "turn on the lights", 1, 4, 0.0),
             Heard("hello", "hello", 0, 1, 0.0)]  # fmt: skip
    result = Result("r", "v", "direct", heard)
    assert result.wer == pytest.approx(1 / 5)  # pooled, not the mean of 1/4 and 0
    assert result.cpu_ms() == (0.0, 0.0)  # a clock that measured nothing divides nothing
    assert [h.reference for h in result.worst(5)] == ["turn on the light"]


def test_the_browser_path_keeps_speech_band_audio() -> None:
    import numpy as np

    from benchmarks.speech_wer import browser_path

    t = np.arange(16_000) / 16_000
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    out = browser_path(tone)
    assert out.dtype == np.int16 and abs(len(out) - len(tone)) <= 3
    middle = out[1000:-1000].astype(np.float64)
    assert 7000 < np.sqrt(2 * np.mean(middle**2)) < 8200  # a 1 kHz tone passes, ~unchanged


def test_the_phone_path_keeps_the_telephone_band_and_drops_above_it() -> None:
    import numpy as np

    from benchmarks.speech_wer import phone_path

    t = np.arange(16_000) / 16_000

    def through(hz: float) -> float:
        tone = (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
        out = phone_path(tone)
        assert out.dtype == np.int16 and abs(len(out) - len(tone)) <= 4
        return float(np.sqrt(2 * np.mean(out[1000:-1000].astype(np.float64) ** 2)))

    assert 7500 < through(1000) < 8500  # in the band: μ-law's few per cent of error
    assert through(6000) < 400  # above 4 kHz: gone at 8 kHz


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or importlib.util.find_spec("faster_whisper") is None,
    reason="needs espeak-ng and the speech extra",
)
def test_the_wer_benchmark_hears_one_sentence_every_path(tmp_path: Path) -> None:
    """benchmarks.speech_wer on the first sentence, espeak-ng, the new recogniser only:
    a row per path, the sentence heard (something, not judged), nothing timed."""
    from benchmarks import speech_wer

    out = tmp_path / "wer.json"
    results = speech_wer.main(["--limit", "1", "--voices", "espeak-ng",
                               "--recognisers", "whisper", "--json", str(out)])  # fmt: skip
    assert [(r.voice, r.path) for r in results] == [
        ("espeak-ng (en-us, 150 wpm)", "direct"),
        ("espeak-ng (en-us, 150 wpm)", "browser"),
        ("espeak-ng (en-us, 150 wpm)", "phone"),
    ]
    for r in results:
        (heard,) = r.heard
        assert heard.words == 4 and heard.hypothesis.strip(), heard
        assert 0 <= r.wer <= 2
    report = json.loads(out.read_text())
    assert len(report["results"]) == 3 and report["results"][0]["heard"][0]["words"] == 4


def test_the_noise_step_trims_a_sentence_to_its_speech() -> None:
    import numpy as np

    from benchmarks.probes.speech_turns import trim

    tone = (8000 * np.sin(np.arange(8000) / 5)).astype(np.int16)
    padded = np.concatenate((np.zeros(3200, np.int16), tone, np.zeros(6080, np.int16)))
    out = trim(padded)
    assert len(out) == 8000 and np.array_equal(out, tone)  # 10 ms blocks, exact here
    assert len(trim(np.zeros(50, np.int16))) == 50  # shorter than a block: kept as is


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or importlib.util.find_spec("onnxruntime") is None,
    reason="needs espeak-ng and the speech extra",
)
def test_the_noise_step_times_a_turn_end_in_noise(tmp_path: Path) -> None:
    from benchmarks.probes.speech_turns import TAIL_S, noise_turn_ends, table
    from benchmarks.speech_wer import espeak

    (said,) = espeak(["turn off the lights in the kitchen"], tmp_path)
    (row,) = noise_turn_ends([said], [64])
    assert row["starts"] == 1 and row["sentences"] == 1 and row["held_open"] == 0, row
    assert 0 < row["p50_ms"] < TAIL_S * 1000, row
    assert "| 64 (-54) |" in table([row])


def test_the_calls_shares_add_up_and_a_step_holds_only_within_both_limits() -> None:
    """Scenario 9's arithmetic: each load generator's share of a step; a step from every
    share's gaps and the engine's microphone lateness in each of its windows (it holds if
    one window does); the calls per core from the CPU slope (no time is measured here)."""
    from benchmarks.suite import _calls
    from benchmarks.suite._suite import Suite
    from benchmarks.suite.clients._ramp import my_count

    for n in (0, 1, 7, 50):
        assert sum(my_count(n, i, 2) for i in range(2)) == n
        assert abs(my_count(n, 0, 2) - my_count(n, 1, 2)) <= 1

    def window(gaps: list[float]) -> dict[str, Any]:
        return {"packets": len(gaps), "gaps_ms": gaps, "lateness_ms": [1.0], "errors": {},
                "client_cpu_util": 0.5}  # fmt: skip

    def part(n: int, *windows: list[float]) -> dict[str, Any]:
        return {"sessions": n, "held": n // 2, "dead": 0, "failures": {},
                "windows": [window(gaps) for gaps in windows]}  # fmt: skip

    bad = [20.0] * 90 + [80.0] * 10
    shares = [{"steps": [part(4, bad, [20.0] * 99), part(8, bad, bad)]}] * 2
    samples = [
        {"t": float(t), "cpu": cpu, "worker_cpu": cpu / 2, "rss": 1e6, "worker_rss": 2e6}
        for t, cpu in ((10, 1.0), (12, 1.4), (14, 1.8), (20, 3.0), (22, 3.8), (24, 4.6))
    ]
    late = {"mic_t": [11.0, 13.0, 21.0, 23.0], "mic_late": [0.5, 0.001, 0.030, 0.001]}
    suite = Suite(plan=_plan.QUICK)
    first, second = _calls.merge(suite, shares, samples, late)
    # 4 calls: its first window over both limits, its second within them
    assert [w["held_slo"] for w in first["windows_tried"]] == [False, True]
    assert first["held"] == 4 and first["gap_p99_ms"] == 20.0 and first["mic_late_p99_ms"] == 1.0
    assert first["held_slo"] and first["server_cpu_util"] == pytest.approx(0.2)
    assert first["worker_cpu_util"] == pytest.approx(0.1)
    # 8 calls: neither window held (the first: both limits; the second: the gaps)
    assert second["gap_p99_ms"] == 80.0 and second["mic_late_p99_ms"] == pytest.approx(30.0)
    assert not second["held_slo"] and second["server_cpu_util"] == pytest.approx(0.4)
    assert _calls.per_core([first, second]) == pytest.approx(20.0)
    assert _calls.per_core([first]) is None
    flat = dict(second, sessions=12)  # CPU that stops growing ends the slope's steps
    assert _calls.per_core([first, second, flat]) == pytest.approx(20.0)


def test_the_calls_load_drives_websocket_voice_sessions_of_a_real_server() -> None:
    """Scenario 9's load generator, one tiny WebSocket step against `trio-duplex serve`
    on the benchmark's engine (the calls need the media worker: not here)."""
    with _serving("benchmarks.probes.call_engine:StampedVoice") as port:
        out = _run("suite.clients.calls", "ramp", "--kind", "ws",
                   "--url", f"http://127.0.0.1:{port}", "--steps", "2",
                   "--open", "5", "--settle", "0.2",
                   "--measure", "0.3", "--words", "3")  # fmt: skip
    (step,) = _result(out)["steps"]
    assert step["sessions"] == step["held"] == 2 and not step["dead"], step
    assert not step["failures"] and len(step["windows"]) == 2, step
    assert not any(window["errors"] for window in step["windows"]), step


def test_the_telephony_playout_counts_what_runs_dry_inside_a_reply_only() -> None:
    """Scenario 10's arithmetic (no time is measured): a gap spanning a key press is the
    silence between two replies; the fake's playout (no start delay) runs dry when a
    reply's first frame is short, one that starts 20 ms later does not; a window's
    replies, their audio and waits."""
    from benchmarks.suite.clients import telephony as tel

    assert tel.inside([(1.0, 1.1), (2.0, 3.5), (4.0, 4.2)], [0.5, 3.0]) == [(1.0, 1.1), (4.0, 4.2)]
    # 15 ms, then 20 ms frames that come 20 and 50 ms after the first: dry 5 ms, then 10 ms
    frames = [(0.0, 120), (0.020, 160), (0.050, 160)]
    assert tel.dry_time(frames, 0.0) == pytest.approx([0.005, 0.010])
    assert tel.dry_time(frames, 0.020) == []
    assert tel.dry_time(frames, 0.005) == pytest.approx([0.010])  # (it covered the first)
    playout = tel.Playout()
    for t, n in frames:
        playout.arrive(t, n)
    assert [x for gap in playout.gaps for x in gap] == pytest.approx([0.015, 0.020, 0.040, 0.050])

    session = tel.Session(tel.Share(tel.parse_args(["ramp", "--url", "http://x"])))
    session.triggers = [0.9, 1.0, 2.0, 3.2]  # the first before the window, the last after
    for t0 in (1.0, 2.0):
        for t, n in frames:
            session.arrivals.append(t0 + 0.022 + t)
            session.audio_bytes.append(n)
            session.playout.arrive(t0 + 0.022 + t, n)
    got = session.harvest(1.0, 3.0, 0.020)
    assert got["replies"] == 2 and got["audio_s"] == pytest.approx(880 / 8000)
    assert got["wait_ms"] == pytest.approx([22.0, 22.0])
    assert got["dry_ms"] == pytest.approx([5.0, 10.0] * 2) and got["replies_dry"] == 2
    assert got["dry_jb_ms"] == [] and got["replies_dry_jb"] == 0
    session.triggers.append(2.9)  # a reply asked and not begun
    assert session.harvest(1.0, 3.0, 0.020)["wait_ms"][-1] == -1.0


def test_a_telephony_step_holds_only_within_the_underrun_and_mic_limits() -> None:
    """Scenario 10's step: every share's windows together, the underrun as a share of the
    replies' audio, the engine's microphone lateness in the window; it holds if one
    window does."""
    from benchmarks.suite import _telephony
    from benchmarks.suite._suite import Suite

    def window(dry_jb: list[float]) -> dict[str, Any]:
        return {"audio_s": 1.0, "dry_ms": [5.0], "dry_jb_ms": dry_jb, "replies": 8,
                "replies_dry": 1, "replies_dry_jb": len(dry_jb), "wait_ms": [22.0, -1.0],
                "errors": {}, "client_cpu_util": 0.1, "client_lag_p99_ms": 2.0}  # fmt: skip

    def part(*windows: list[float]) -> dict[str, Any]:
        return {"sessions": 4, "held": 2, "dead": 0, "failures": {},
                "windows": [window(w) for w in windows]}  # fmt: skip

    # Share 0: its first window 30 ms dry of 1 s, its second 4 ms; share 1: none (of 1 s).
    shares = [{"steps": [part([30.0], [4.0])]}, {"steps": [part([], [])]}]
    samples = [
        {"t": float(t), "cpu": cpu, "rss": 1e6} for t, cpu in ((10, 1.0), (12, 1.4), (14, 1.8))
    ]
    late = {"mic_t": [11.0, 13.0], "mic_late": [0.001, 0.002]}
    suite = Suite(plan=_plan.QUICK)
    (step,) = _telephony.merge(suite, shares, samples, late)
    assert [w["held_slo"] for w in step["windows_tried"]] == [False, True]
    assert step["underrun_pct"] == pytest.approx(0.2) and step["raw_underrun_pct"] == 0.5
    assert step["replies"] == 16 and step["unanswered"] == 2 and step["wait_p99_ms"] == 22.0
    assert step["mic_late_p99_ms"] == pytest.approx(2.0) and step["held"] == 4
    assert step["server_cpu_util"] == pytest.approx(0.2)
    late["mic_late"][1] = 0.030  # the mic over its limit: no window holds
    assert not _telephony.merge(suite, shares, samples, late)[0]["held_slo"]


_CALLS_WS_TINY = """
import json, attrs
from benchmarks.suite import _calls, _plan
from benchmarks.suite._suite import Suite
plan = attrs.evolve(_plan.QUICK, calls_ws_open=1.5, calls_settle=0.5, calls_measure=1.0)
suite = Suite(plan=plan, pin=False, log_level="warning")
print("@result " + json.dumps(_calls.ramp_run(suite, "ws", (2, 4)), default=str))
"""


def test_the_calls_ramp_runs_its_load_generators_on_one_schedule() -> None:
    """Scenario 9's ramp (``_calls.ramp_run``: ``run_fleet`` and ``merge_steps``, which
    scenario 10 shares) at its smallest: 2 then 4 WebSocket voice sessions on a real
    server, every share's steps merged a step per N, the server sampled at each window's
    edges; the shape, not the figures."""
    run = subprocess.run([sys.executable, "-c", _CALLS_WS_TINY], cwd=ROOT,
                         capture_output=True, text=True, timeout=150)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    out = _result(run.stdout)
    assert [step["sessions"] for step in out["steps"]] == [2, 4], out
    for step in out["steps"]:
        assert step["held"] == step["sessions"] and not step["dead"], step
        assert step["packets"] > 0 and step["server_cpu_util"] > 0, step
        assert len(step["windows_tried"]) == 2, step


_TELEPHONY_TINY = """
import json, attrs
from benchmarks.suite import _plan, _telephony
from benchmarks.suite._suite import Suite
plan = attrs.evolve(_plan.QUICK, tel_rounds=1, tel_steps=(2,), tel_ws_steps=(2,),
                    tel_open=2.0, tel_settle=0.5, tel_measure=1.0, tel_every=0.4,
                    tel_deploy_calls=0)
suite = Suite(plan=plan, pin=False, log_level="warning")
_telephony.telephony(suite)
print("@result " + json.dumps({"rows": [r.as_dict() for r in suite.rows], "errors": suite.errors,
      "raw": suite.raw["10 telephony"]}, default=str))
"""


def test_the_telephony_benchmark_runs_calls_and_sessions_on_a_real_server() -> None:
    """Scenario 10 at its smallest: one round, 2 phone calls through the fake Twilio and 2
    μ-law WebSocket sessions, a second measured twice each; the report's shape (its
    figures are not judged: a tiny run on a shared machine says nothing of them, and
    nothing here divides by the CPU it measured)."""
    run = subprocess.run([sys.executable, "-c", _TELEPHONY_TINY], cwd=ROOT,
                         capture_output=True, text=True, timeout=150)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    out = _result(run.stdout)
    assert not out["errors"], out["errors"]
    assert [r["scenario"] for r in out["rows"]] == ["10"] * 3
    raw = out["raw"]
    assert set(raw) == {"runs", "largest", "per_core", "cpu_pct_each", "at"}
    for name in _telephony_names():
        (run_,) = raw["runs"][name]
        (step,) = run_["steps"]
        assert step["sessions"] == step["held"] == 2 and not step["dead"], step
        assert not step["failures"] and not step["errors"], step
        assert step["replies"] > 0 and step["audio_s"] > 0 and step["mic_chunks"] > 0, step
        assert len(step["windows_tried"]) == 2, step
        assert raw["per_core"][name] == [None]  # one step: no slope
        assert isinstance(step["held_slo"], bool)
    # A ramp whose top (its one step) held is named in the row's note: a floor.
    topped = [n for n in _telephony_names() if raw["largest"][n] == [2]]
    held_row = out["rows"][0]
    assert ("the ramp's top held" in held_row["note"]) == bool(topped), (held_row, topped)


_DEPLOY_TINY = """
import json, attrs
from benchmarks.suite import _plan, _telephony
from benchmarks.suite._suite import Suite
suite = Suite(plan=attrs.evolve(_plan.QUICK, tel_deploy_calls=1), pin=False, log_level="warning")
_telephony.deploy_gap(suite)
print("@result " + json.dumps({"rows": [r.as_dict() for r in suite.rows], "errors": suite.errors,
      "raw": suite.raw["10 telephony deploy"]}, default=str))
"""


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_the_deploy_gap_runs_a_call_across_a_sigterm_of_its_node() -> None:
    """Scenario 10's deploy gap at its smallest: three ``--cluster`` nodes on a real
    redis-server behind the balancer, one call homed on the node SIGTERMed mid-reply (and
    the control call elsewhere); the report's shape and the seam's order (its times are
    not judged)."""
    run = subprocess.run([sys.executable, "-c", _DEPLOY_TINY], cwd=ROOT,
                         capture_output=True, text=True, timeout=150)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    out = _result(run.stdout)
    assert not out["errors"], out["errors"]
    assert [r["metric"] for r in out["rows"]] == [
        "deploy: audio gap per call, p50", "deploy: audio gap per call, p99",
        "deploy: audio gap per call, max", "deploy: audio heard twice per call, p50",
        "deploy: calls lost",
    ]  # fmt: skip
    raw = out["raw"]
    assert raw["calls"] == 1 and raw["lost"] == 0 and not raw["failures"], raw
    assert raw["home_exit"] == 0 and raw["home_streams"] == 1, raw
    assert 0 not in {node for _, node in raw["routed_after"]}, raw  # not the drained node
    (seam,) = raw["seams"]
    # The seam's steps in their order: the close, the TwiML, the start, the first media.
    steps = [seam[k] for k in ("close_ms", "twiml_ms", "start_ms", "media_ms")]
    assert steps == sorted(steps) and steps[-1] <= seam["gap_ms"], seam
    assert seam["heard_before_ms"] >= 400 and seam["heard_after_ms"] > 0, seam
    assert raw["reference_ms"] > seam["heard_before_ms"], raw


def _telephony_names() -> tuple[str, str]:
    from benchmarks.suite import _telephony

    return _telephony.PHONE, _telephony.WS
