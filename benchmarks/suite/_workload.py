"""The frames every load generator sends, built once so that all sides send the same bytes.

Imported by the load generators (separate processes), so it stays dependency-free.
"""

from __future__ import annotations

import base64
import json
import random
import resource
import struct
from typing import Any, Final

PATH: Final = "/v1/duplex"

# Scenario 1, 2, 6: a 100-byte text event.
TEXT: Final = "".join(random.Random(1).choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(100))
TEXT_FRAME: Final = json.dumps({"type": "input.text.append", "text": TEXT}, separators=(",", ":"))

# Scenario 3: 20 ms of 16 kHz 16-bit mono PCM is 640 bytes, 856 characters of base64.
AUDIO_RAW: Final = bytes(random.Random(2).getrandbits(8) for _ in range(640))
AUDIO_B64: Final = base64.b64encode(AUDIO_RAW).decode("ascii")
AUDIO_FRAME: Final = json.dumps(
    {"type": "input_audio_buffer.append", "audio": AUDIO_B64}, separators=(",", ":")
)
FRAME_PERIOD_S: Final = 0.020

# Scenario 3 since protocol v2: 20 ms of 24 kHz PCM16 (the echo engine's own rate, so the
# server passes it through), 960 bytes; 1,280 characters of base64 on the JSON lane.
VOICE_RAW: Final = bytes(random.Random(2).getrandbits(8) for _ in range(960))
VOICE_JSON: Final = json.dumps(
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(VOICE_RAW).decode("ascii")},
    separators=(",", ":"),
)
# The binary lane (protocol v2): a 12-byte big-endian header (kind, flags,
# reserved, seq), then the payload. Kind 1 is input audio (client -> server, seq: its
# client_event_seq, 0 for none), kind 2 output audio (seq: its server_event_seq).
BINARY_HEADER: Final = struct.Struct(">BBHQ")
INPUT_AUDIO_KIND: Final = 1
OUTPUT_AUDIO_KIND: Final = 2
VOICE_BINARY: Final = BINARY_HEADER.pack(INPUT_AUDIO_KIND, 0, 0, 0) + VOICE_RAW
SESSION_UPDATE_BINARY: Final = json.dumps(
    {"type": "session.update", "session": {"audio": {"wire": "binary"}}}, separators=(",", ":")
)

SESSION_UPDATE: Final = json.dumps({"type": "session.update", "session": {}}, separators=(",", ":"))
SESSION_CLOSE: Final = json.dumps({"type": "session.close"}, separators=(",", ":"))

TEXT_DELTA: Final = "response.output_text.delta"
AUDIO_DELTA: Final = "response.output_audio.delta"


def ack(seq: int) -> str:
    return f'{{"type":"session.event_ack","server_event_seq":{seq}}}'


def resume(session_id: str, token: str, last_seq: int) -> str:
    return json.dumps(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": last_seq,
        },
        separators=(",", ":"),
    )


def burst_frame(seq: int) -> str:
    """What the bare servers send for ``?burst=K``: a replayed event's shape and size."""
    return f'{{"type":"response.output_text.delta","text":"{TEXT}","server_event_seq":{seq}}}'


def raise_nofile() -> int:
    """Lift the soft open-files limit to the hard one (10,000 sockets need it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def cpu_seconds() -> float:
    """This process's user + system CPU time."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def emit(kind: str, payload: Any = None) -> None:
    """One line of the load generator's stdout protocol: ``@mark NAME`` or ``@result JSON``."""
    if kind == "mark":
        print(f"@mark {payload}", flush=True)
    elif kind == "result":
        print("@result " + json.dumps(payload, separators=(",", ":")), flush=True)
    else:
        raise ValueError(kind)
