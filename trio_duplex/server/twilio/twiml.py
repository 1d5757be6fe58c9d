"""The TwiML the ``/twiml`` endpoint answers, and its ``<Redirect>``'s attempts
(sans-IO; plan §2.2).

A call's first TwiML, and every ``<Redirect>``'s while the call goes on::

    <?xml version="1.0" encoding="UTF-8"?>
    <Response>
      <Pause length="1"/>                      (from the third attempt on)
      <Connect>
        <Stream url="wss://PUBLIC/v1/twilio" statusCallback="https://PUBLIC/v1/twilio/status">
          <Parameter name="trio_duplex_ticket" value="v1.o.1764760000.Q0FG..."/>
        </Stream>
      </Connect>
      <Redirect method="POST">https://PUBLIC/v1/twilio/twiml?resume=1&amp;attempt=1&amp;t=1764760000</Redirect>
    </Response>

Twilio runs the ``<Redirect>`` when we close the stream (a drain, the session's end): its
fetch says ``resume=1``, which attempt this is and when (``t``) the TwiML before it was
issued, so a stream that failed at once counts against ``--twilio-max-redirects`` and one
that lived does not (``next_attempt``). The documents come from fixed templates with every
value XML-escaped (the values are ours, but escaping is not optional).
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape, quoteattr

TICKET_PARAMETER = "trio_duplex_ticket"
"""The ``<Parameter>`` whose value is the ticket (``start.customParameters``' key)."""

SHORT_STREAM_S = 10.0
"""A stream that lived less than this (since its TwiML was issued) is a failed attempt."""

_XML_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
"""XML 1.0's ``Char``: what a document can hold at all, escaped or not."""
_DIGITS = re.compile(r"[0-9]{1,12}")

_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<Response>\n'
_TAIL = "</Response>\n"


def _checked(value: str) -> str:
    if not _XML_TEXT.fullmatch(value):
        raise ValueError("a TwiML value holds a character XML cannot")
    return value


def _attr(value: str) -> str:
    # quoteattr escapes &, <, > and the quote, and \n, \r, \t (which a parser would
    # otherwise turn into spaces).
    return quoteattr(_checked(value))


def _text(value: str) -> str:
    # \r as a reference, or a parser's line-end normalisation makes it \n.
    return escape(_checked(value), {"\r": "&#13;"})


def connect_document(
    stream_url: str, status_url: str, ticket: str, redirect_url: str, pause_s: int
) -> str:
    """The TwiML that connects the call to a bidirectional stream to ``stream_url``
    (``stream_url_of``) carrying ``ticket``, with ``status_url`` as the stream's
    ``statusCallback``, then ``<Redirect method="POST">`` to ``redirect_url``
    (``redirect_url``) once we close the stream. ``pause_s`` > 0: a ``<Pause>`` of that
    many seconds first (a retry's, from the second attempt on). ValueError for a value
    holding a character XML 1.0 cannot (a NUL, say): the values are ours, so a bug."""
    pause = f'  <Pause length="{int(pause_s)}"/>\n' if pause_s > 0 else ""
    return (
        _HEAD
        + pause
        + "  <Connect>\n"
        + f"    <Stream url={_attr(stream_url)} statusCallback={_attr(status_url)}>\n"
        + f"      <Parameter name={_attr(TICKET_PARAMETER)} value={_attr(ticket)}/>\n"
        + "    </Stream>\n"
        + "  </Connect>\n"
        + f'  <Redirect method="POST">{_text(redirect_url)}</Redirect>\n'
        + _TAIL
    )


def hangup_document() -> str:
    """The TwiML that ends the call (its session is gone, or too many failed attempts)."""
    return _HEAD + "  <Hangup/>\n" + _TAIL


def stream_url_of(public_url: str, path: str) -> str:
    """The ``<Stream url>``: ``public_url`` (``https://host[:port]``, as configured) as
    ``wss`` (``http`` gives ``ws``, for tests), then ``path`` (``--twilio-path``)."""
    scheme, sep, rest = public_url.rstrip("/").partition("://")
    twin = {"https": "wss", "http": "ws"}.get(scheme.lower(), scheme)
    return f"{twin}{sep}{rest}{path}"


def status_url_of(public_url: str, path: str) -> str:
    """The stream's ``statusCallback``: ``{public_url}{path}/status``."""
    return f"{public_url.rstrip('/')}{path}/status"


def redirect_url(public_url: str, path: str, attempt: int, issued_at: float) -> str:
    """The ``<Redirect>``'s URL: ``{public_url}{path}/twiml?resume=1&attempt=A&t=T``,
    ``path`` being ``--twilio-path`` and ``T`` ``issued_at`` (when this TwiML is issued,
    Unix seconds) rounded down. Twilio requests (and signs) it exactly so."""
    return (
        f"{public_url.rstrip('/')}{path}/twiml?resume=1&attempt={int(attempt)}&t={int(issued_at)}"
    )


def is_resume(query: dict[str, list[str]]) -> bool:
    """Is this TwiML request a ``<Redirect>``'s (``resume`` in its query), not the call's
    first?"""
    return "resume" in query


def next_attempt(query: dict[str, list[str]], now: float) -> int | None:
    """The attempt a ``<Redirect>``'s fetch (its parsed query: ``attempt``, ``t``) is:
    the previous one + 1 if its stream lived less than ``SHORT_STREAM_S`` (``now - t``,
    a ``t`` in the future included: clocks of two nodes), else 1. None if ``attempt`` or
    ``t`` is not there once, in digits, attempt ≥ 1: not our URL (Twilio signs what we
    wrote), which the caller answers with ``hangup_document``. The caller compares it
    with ``--twilio-max-redirects`` (past it: hang up) and pauses from attempt 2 on."""
    attempts, times = query.get("attempt", []), query.get("t", [])
    if len(attempts) != 1 or len(times) != 1:
        return None
    if not _DIGITS.fullmatch(attempts[0]) or not _DIGITS.fullmatch(times[0]):
        return None
    attempt, issued_at = int(attempts[0]), int(times[0])
    if attempt < 1:
        return None
    return attempt + 1 if now - issued_at < SHORT_STREAM_S else 1


__all__ = [
    "SHORT_STREAM_S",
    "TICKET_PARAMETER",
    "connect_document",
    "hangup_document",
    "is_resume",
    "next_attempt",
    "redirect_url",
    "status_url_of",
    "stream_url_of",
]
