"""A recogniser worker: one Whisper model (faster-whisper on CTranslate2, int8, one thread)
in a process of its own, run by ``_pool.RecogniserPool`` as a script:
``python _whisper.py SOURCE IS_PATH SHA256`` (SOURCE a model directory when IS_PATH is
``1``, else a faster-whisper model name; SHA256 the hex digest ``SOURCE/model.bin`` must
have, checked before the model is loaded, or ``-`` for none).

Protocol: a request is a 4-byte big-endian length and that much 16 kHz mono PCM16 (a whole
turn, at most ``MAX_REQUEST_BYTES``); each gets one JSON line, ``{"text": str}`` or
``{"error": str}`` (the decode raised: the worker goes on). The first line says the model
is loaded, ``{"ready": true, ...}``, or why it cannot be, ``{"fatal": str}`` (then exit
status 2: a model that is missing or not the one expected is not retried). It exits at
the end of its stdin. It imports only the standard library, numpy, faster_whisper and
ctranslate2 (never the server), those lazily, and runs at ``os.nice(5)`` so that the
server's event loop wins the CPU over a decode.

Why not ``WhisperModel.transcribe``: it pads every decode to Whisper's 30 s window
(0.45-0.55 s of CPU whatever the turn's length). ``decode`` pads the turn with real zeros
to the smallest window of ``WINDOWS`` that holds it, encodes only that window, and bounds
the tokens by the turn's length: a window cut to the audio's own length, or an unbounded
decode, makes Whisper repeat itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any, Final

SAMPLE_RATE: Final = 16_000
BYTES_PER_SECOND: Final = SAMPLE_RATE * 2
WINDOWS: Final = (10, 20, 30)
"""Encoder windows, in seconds. Measured (tiny.en, one thread): the same 3.7 s sentence
costs 0.17 s of CPU at 10 s, 0.30 s at 20 s, 0.60 s at 30 s; turns of 2-5 s cost 0.15 s,
of 15-18 s 0.43-0.54 s, of 29.5 s (100 words) 1.0-1.2 s."""
MARGIN_S: Final = 0.3  # the window holds the turn and this much more silence
MAX_REQUEST_BYTES: Final = WINDOWS[-1] * BYTES_PER_SECOND
"""The longest turn one request carries: Whisper's own window, 30 s."""
TOKENS_PER_SECOND: Final = 8  # bounds the decode: speech is ~3 words (~4 tokens) a second
MAX_LENGTH: Final = 448  # Whisper's decoder
BEAM_SIZE: Final = 5
NO_SPEECH_PROB: Final = 0.8
"""Above this probability of Whisper's <|nospeech|> a decode is "" (no speech). Measured on
tiny.en: 0.02-0.51 on the first 40 SLURP sentences said by espeak-ng and by flite, 0.92-0.99
on silence and white noise, which it "hears" as "you" or "I don't know." with confidence
(so faster-whisper's rule, which also asks for an average log-probability below -1, kept
them)."""


class Fatal(Exception):
    """The model cannot be loaded: a first line ``{"fatal": ...}`` and exit status 2."""


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Model:
    """A loaded Whisper model, its tokenizer, and the prompt every decode starts from."""

    def __init__(self, whisper: Any, tokenizer: Any) -> None:
        self.whisper = whisper
        self.tokenizer = tokenizer
        self.prompt: list[int] = [*tokenizer.sot_sequence, tokenizer.no_timestamps]


def load(source: str, is_path: bool, sha256: str | None) -> Model:
    """The model. A path is never fetched: it must be a directory
    holding model.bin (with ``sha256``'s digest if given); a name may be fetched."""
    if is_path:
        model_bin = os.path.join(source, "model.bin")
        if not os.path.isfile(model_bin):
            raise Fatal(f"{source} is not a directory holding model.bin")
        if sha256 is not None:
            found = file_sha256(model_bin)
            if found != sha256:
                raise Fatal(f"{model_bin} has sha256 {found}, not the packaged {sha256}")
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer

    model = WhisperModel(
        source,
        device="cpu",
        compute_type="int8",
        cpu_threads=1,  # one process per core: the pool's size is the parallelism
        num_workers=1,
        local_files_only=is_path,
    )
    multilingual = bool(model.model.is_multilingual)
    tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language="en")
    return Model(model, tokenizer)


REPETITION_PENALTY: Final = 1.1
"""tiny.en now and then says a short request twice ("Review all alarms. Review all
alarms."): a light penalty on repeated tokens took the outside set's word error rate from
0.108 to 0.087 (flite) and 0.111 to 0.081 (Piper) at the same CPU, espeak-ng's unchanged
(benchmarks/speech_wer.py, docs/benchmarks-journal.md)."""


def window_seconds(seconds: float) -> int:
    """The smallest window that holds ``seconds`` of audio and ``MARGIN_S`` more."""
    for window in WINDOWS:
        if seconds + MARGIN_S <= window:
            return window
    return WINDOWS[-1]


def decode(model: Model, pcm16: bytes) -> str:
    """What ``pcm16`` (16 kHz mono PCM16) says: the text stripped, "" for no speech."""
    import numpy as np

    samples = len(pcm16) // 2
    if samples == 0:
        return ""
    seconds = samples / SAMPLE_RATE
    window = window_seconds(seconds)
    audio = np.zeros(window * SAMPLE_RATE, dtype=np.float32)  # real zeros past the turn
    heard = np.frombuffer(pcm16, dtype="<i2", count=min(samples, len(audio)))
    audio[: len(heard)] = heard.astype(np.float32) / 32768.0
    whisper, prompt = model.whisper, model.prompt
    features = whisper.feature_extractor(audio)[:, : window * 100]  # 100 frames a second
    encoded = whisper.encode(np.ascontiguousarray(features))
    result = whisper.model.generate(
        encoded,
        [prompt],
        beam_size=BEAM_SIZE,
        repetition_penalty=REPETITION_PENALTY,
        max_length=min(MAX_LENGTH, len(prompt) + int(TOKENS_PER_SECOND * seconds) + 10),
        return_no_speech_prob=True,
    )[0]
    if result.no_speech_prob > NO_SPEECH_PROB:
        return ""
    return str(model.tokenizer.decode(result.sequences_ids[0])).strip()


def _answer(stdout: Any, line: dict[str, Any]) -> None:
    stdout.write(json.dumps(line).encode() + b"\n")
    stdout.flush()


def serve_stdio(source: str, is_path: bool, sha256: str | None) -> int:
    """The worker's loop (the module docstring's protocol); returns the exit status."""
    stdin = sys.stdin.buffer
    # fd 1 carries the protocol alone: whatever a library prints goes to stderr instead.
    sys.stdout.flush()
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    started = time.process_time()
    try:
        model = load(source, is_path, sha256)
    except Fatal as exc:
        _answer(stdout, {"fatal": str(exc)})
        return 2
    except Exception as exc:  # (a name that cannot be fetched, a broken model)
        why = " ".join(str(exc).split())[:400]  # (one line: the pool logs it)
        _answer(stdout, {"fatal": f"the model {source} did not load: {why}"})
        return 2
    _answer(
        stdout, {"ready": True, "pid": os.getpid(), "load_cpu_s": time.process_time() - started}
    )
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return 0
        size = int.from_bytes(head, "big")
        if size > MAX_REQUEST_BYTES or size % 2:
            _answer(stdout, {"fatal": f"a request of {size} bytes"})
            return 2
        pcm = stdin.read(size)
        if len(pcm) < size:
            return 0
        try:
            text = decode(model, pcm)
        except Exception as exc:
            _answer(stdout, {"error": f"{type(exc).__name__}: {exc}"[:500]})
        else:
            _answer(stdout, {"text": text})


def main(argv: list[str]) -> int:
    os.nice(5)  # the server's event loop, and every session's frames, win the CPU
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the server's ^C: the pool ends us)
    source, is_path, sha256 = argv[1], argv[2] == "1", argv[3]
    try:
        return serve_stdio(source, is_path, None if sha256 == "-" else sha256)
    except BrokenPipeError:  # the server went away mid-decode: nobody to answer
        return 0


if __name__ == "__main__":  # a worker process (_pool.RecogniserPool starts it)
    sys.exit(main(sys.argv))
