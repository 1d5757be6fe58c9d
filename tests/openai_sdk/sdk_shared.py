"""What the SDK scripts (``sdk_python.py``, ``sdk_livekit.py``, ``sdk_pipecat.py``)
share: the audio they send, the deadline of each wait, and the command line that runs
their scenarios and prints what each saw. Standard library only: each script runs in an
SDK's venv, without the project's dependencies (``python -m tests.openai_sdk.sdk_NAME``
from the repository's root).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import struct
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

TIMEOUT = 20.0
"""Each wait for the server's next event, in seconds."""
RATE = 24_000
LONG_TEXT = " ".join(f"word{n}" for n in range(40))  # seconds of speech, for a cancel


def pcm16(ms: int, hz: float = 440.0) -> bytes:
    """``ms`` of a sine at 24 kHz, PCM16 little-endian: a recognisable audio turn."""
    count = RATE * ms // 1000
    return b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * hz * n / RATE))) for n in range(count)
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def run_scenarios(
    names: list[str], scenario: Callable[[str], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Each named scenario's record, or ``{"crash": traceback}``: one crash ends no other."""
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = await scenario(name)
        except Exception:
            results[name] = {"crash": traceback.format_exc()}
    return results


def cli(
    doc: str | None,
    scenarios: Mapping[str, object],
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    *,
    url: str = "http://H:P/v1",
    speech: bool = True,
) -> None:
    """Parse the script's arguments (``speech``: ``--speech-url``, ``--speech-audio`` read
    into ``args.speech_pcm``, ``--speech-sentences``' files, in name order, into the list
    ``args.sentences_pcm``), ``run`` them and print its result as one JSON object."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--base-url", required=True, help=f"the echo server, {url}")
    parser.add_argument("--voice-url", required=True, help=f"the voice server, {url}")
    if speech:
        parser.add_argument("--speech-url", help=f"the speech server, {url}")
        parser.add_argument("--speech-audio", help="a spoken sentence, 24 kHz PCM16")
        parser.add_argument("--speech-sentences", help="sentences, a file each, in a folder")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(scenarios)} (all)")
    args = parser.parse_args()
    if unknown := set(args.scenarios) - set(scenarios):
        parser.error(f"no scenario {sorted(unknown)}")
    if not args.scenarios:
        args.scenarios = list(scenarios)
    if speech:
        args.speech_pcm = Path(args.speech_audio).read_bytes() if args.speech_audio else b""
        folder = args.speech_sentences
        files = sorted(Path(folder).iterdir()) if folder else []
        args.sentences_pcm = [file.read_bytes() for file in files]
    json.dump(asyncio.run(run(args)), sys.stdout, default=str)
