"""Voice activity: Silero VAD v6, the model faster-whisper ships, run by onnxruntime in
this process.

One ``InferenceSession`` serves every session of the process (:func:`vad_model`, made on
first use); each session's stream (:class:`VadStream`) carries the model's recurrent state
and the audio around its window boundaries. A window is 512 samples (32 ms at 16 kHz), given
to the model with the 64 samples before it in front; a stream's windows run through the
model in order, so the probabilities do not depend on how the audio was chunked. Measured
here: 1.8 ms of CPU per second of audio fed in batches, 4.8 ms fed 20 ms at a time (~0.15
ms a window), cheap enough to run inline on the event loop as audio arrives; the process
pays ~41 MB once (onnxruntime 27, the session 9, its first runs 4), a stream ~1.5 KB.

faster-whisper is located with ``importlib.util.find_spec``, not imported: its package
imports CTranslate2, which the server process has no use for (recognition runs in the
recogniser pool's processes).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np

from ._capacity import INSTALL, SpeechUnavailable

RATE: Final = 16_000
WINDOW: Final = 512
"""Samples a probability covers (32 ms): the only size Silero v6 takes at 16 kHz."""
WINDOW_BYTES: Final = WINDOW * 2
WINDOW_MS: Final = WINDOW * 1000 / RATE
CONTEXT: Final = 64
"""Samples of the previous window the model sees in front of each window."""
MAX_BATCH: Final = 64
"""Windows per ``run`` at most (2 s of audio): batching saves the per-call overhead, and a
bound keeps one large chunk of audio from holding the event loop in a single call."""

_ASSET: Final = ("assets", "silero_vad_v6.onnx")
_STATE: Final = (1, 1, 128)

_model: SileroVad | None = None
_model_lock = threading.Lock()


def model_path() -> Path:
    """The Silero VAD model inside the installed faster-whisper package."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise SpeechUnavailable(f"voice activity detection needs faster-whisper: {INSTALL}")
    for folder in spec.submodule_search_locations:
        path = Path(folder).joinpath(*_ASSET)
        if path.is_file():
            return path
    raise SpeechUnavailable(
        f"faster-whisper is installed without its Silero VAD model ({'/'.join(_ASSET)}): "
        f"reinstall it: {INSTALL}"
    )


class SileroVad:
    """An onnxruntime session of the Silero VAD model: one thread, nothing logged."""

    def __init__(self, path: Path) -> None:
        try:
            import onnxruntime  # a faster-whisper dependency
        except ImportError as error:
            raise SpeechUnavailable(
                f"voice activity detection needs onnxruntime: {INSTALL}"
            ) from error
        options: Any = onnxruntime.SessionOptions()
        # One thread each: the session runs inline on the event loop, between frames.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 4  # fatal only: its warnings would reach our logs
        self._session: Any = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.path = path

    def run(
        self, windows: np.ndarray[Any, Any], h: np.ndarray[Any, Any], c: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Speech probabilities of ``windows`` ((n, 576) float32, in stream order), and the
        recurrent state after the last of them."""
        probs, hn, cn = self._session.run(None, {"input": windows, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), hn, cn


def vad_model() -> SileroVad:
    """This process's VAD model, loaded on first use (SpeechUnavailable if faster-whisper
    or onnxruntime is missing)."""
    global _model
    with _model_lock:
        if _model is None:
            _model = SileroVad(model_path())
        return _model


class VadStream:
    """One session's voice activity: speech probabilities of its audio, window by window.

    Holds the model's state (``h``, ``c``), the last 64 samples before the next window and
    the part of a window fed so far (under 1,024 bytes, an odd byte included).
    """

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._h = np.zeros(_STATE, dtype=np.float32)
        self._c = np.zeros(_STATE, dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._rest = b""
        self.windows = 0
        """Windows run so far: window ``i`` covers samples ``[i*512, (i+1)*512)``."""

    def feed(self, pcm16: bytes) -> list[float]:
        """The probabilities of the whole windows ``pcm16`` (16 kHz mono PCM16) completes,
        in order; the rest of it waits for the next call."""
        data = self._rest + pcm16 if self._rest else pcm16
        whole = len(data) // WINDOW_BYTES
        self._rest = bytes(data[whole * WINDOW_BYTES :])
        if not whole:
            return []
        probs: list[float] = []
        view = memoryview(data)
        for at in range(0, whole, MAX_BATCH):
            n = min(MAX_BATCH, whole - at)
            chunk = view[at * WINDOW_BYTES : (at + n) * WINDOW_BYTES]
            samples = np.frombuffer(chunk, dtype="<i2").reshape(n, WINDOW)
            # Row i: window i with the last 64 samples of window i-1 in front.
            rows = np.empty((n, CONTEXT + WINDOW), dtype=np.float32)
            np.multiply(samples, 1 / 32768, out=rows[:, CONTEXT:], casting="unsafe")
            rows[0, :CONTEXT] = self._context
            rows[1:, :CONTEXT] = rows[:-1, -CONTEXT:]
            out, self._h, self._c = self._model.run(rows, self._h, self._c)
            probs.extend(out.tolist())
            self._context = rows[-1, -CONTEXT:].copy()
        self.windows += whole
        return probs
