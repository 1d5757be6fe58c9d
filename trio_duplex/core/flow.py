"""Input flow control (protocol v2): when the server reports how far a session's input
was consumed, and why a client that paces by those reports is never refused and never
waits forever. Pure numbers; the engine's inbox (``engines/api.py``) does the counting
and the runner sends the reports.

The bounds, as ``session.created.limits`` advertises them: ``N`` = ``max_pending_input``
events and ``B`` = ``max_pending_input_bytes``, sizes being the messages' lengths as the
server reads them (``len`` of the text or of the binary message).

The server:

* takes an event into the engine's inbox while the inbox holds fewer than ``N`` events
  and fewer than ``B`` bytes (so it may go past ``B`` by one message); an event is
  refused with ``input_backpressure`` otherwise. The inbox counts the bytes of events of
  ``T`` bytes or more only (``counted_from``); smaller ones are bounded by their number;
* "consumes" an event when the engine takes it from the inbox, or when it refuses it for
  good (a non-retryable error); ``consumed_client_event_seq`` is then the highest
  ``client_event_seq`` up to which every event was consumed;
* sends ``input.consumed`` once the events consumed since the last report reach
  ``E`` = ``max(1, N // 2)``, or their counted bytes reach ``Y`` = ``max(1, B // 2)``
  (``report_steps``).

The client (``trio_duplex.client``): "pending" is what it sent above the last reported
seq; it sends an event only while pending holds fewer than ``N`` events and fewer than
``B`` bytes, counted as the server counts them.

Never refused: what the inbox holds when an event arrives was sent before it and not
consumed, so it is part of what the client counted as pending when it sent the event:
fewer than ``N`` events, fewer than ``B`` bytes.

Never stuck: between two reports fewer than ``E`` events were consumed, with fewer than
``Y`` counted bytes, plus fewer than ``E`` uncounted events of fewer than ``T`` bytes
each. As ``T <= B // N`` (or every event is counted), that is fewer than
``B/2 + (N/2)(B/N) = B`` bytes and fewer than ``N`` events. A client that waits has
``N`` events or ``B`` bytes pending, so at least one of them is not consumed yet: it is
on its way or in the inbox, and as the engine takes input, consumption grows until a
report is due, which lowers pending. Once the engine has taken everything, what is left
unreported is below both bounds: the client can send. (An engine that stops reading its
input stops its client, as it should.)

Two details keep the reports' seq exact. An event refused for good while others wait is
behind them in seq order, so it counts as consumed once they are taken (when the engine
next finds its inbox empty). And a report names the seq of the event just taken, or,
with nothing left waiting, the highest received; an event without ``client_event_seq``
cannot be named, so while others wait the report is put off to the next numbered one (a
client that numbers none of its events gets no reports at all).
"""

from __future__ import annotations

import math

COUNTED = 4096
"""The usual ``T``: the inbox counts the bytes of events this large or larger."""


def report_steps(max_events: int, max_bytes: float) -> tuple[int, float]:
    """``E`` and ``Y``: consumption since the last report that makes one due."""
    byte_step = math.inf if max_bytes == math.inf else max(1, int(max_bytes) // 2)
    return max(1, max_events // 2), byte_step


def counted_from(max_events: int, max_bytes: float) -> int:
    """``T``: events of this size or more have their bytes counted by the inbox; it is
    at most ``B // N``, which keeps the reports' bound (module docstring)."""
    if max_bytes >= COUNTED * max_events:
        return COUNTED
    return max(1, int(max_bytes) // max_events)
