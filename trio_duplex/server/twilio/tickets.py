"""Keys, tickets and derived credentials of Twilio calls (sans-IO; plan §4.2).

Every key comes from the account's Auth Token, so every node with the same token has the
same ones and nothing is shared through the store::

    K   = HMAC-SHA256(auth_token, "trio-duplex/twilio/v1")
    K_t = HMAC-SHA256(K, "ticket"); K_s = ...(K, "session"); K_r = ...(K, "resume-token")

* The call's **session id**, ``"sess_" + hex(HMAC(K_s, AccountSid|CallSid))[:24]`` (the
  shape of any session id): one call, one session, whichever node answers it.
* Its **resume token**, ``base64url(HMAC(K_r, session_id))`` (256 bits, the shape of
  ``core.credentials.new_token``'s): the session's fixed credential. It never leaves the
  server: the door derives it, the session keeps its digest.
* A **ticket**, ``v1.<mode>.<exp>.<mac>``: ``mode`` ``o`` (the call's first TwiML: open)
  or ``r`` (a ``<Redirect>``'s: resume), ``exp`` its last valid second (Unix time),
  ``mac = base64url(HMAC(K_t, "v1|mode|AccountSid|CallSid|exp"))``. The TwiML endpoint
  mints it into ``<Parameter name="trio_duplex_ticket">``; Twilio hands it back in the
  stream's ``start.customParameters``, where ``verify`` checks it against ``start``'s
  AccountSid and CallSid. It binds the call and the time; the signature of the upgrade
  only says "Twilio" (plan §1.3).

Sans-IO: no clock (``now`` is passed in, Unix seconds), no I/O. No key is in a repr.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import Literal, get_args

import attrs

Mode = Literal["o", "r"]
"""A ticket's mode: ``o`` opens the call's session (or resumes it, if it is alive), ``r``
only resumes it."""

TicketReason = Literal["shape", "expired", "mac", "call", "mode"]
"""Why ``verify`` refused a ticket (a refusal metric's label, so a fixed set)."""

TICKET_REASONS: tuple[TicketReason, ...] = get_args(TicketReason)

ACCOUNT_SID = re.compile(r"AC[0-9a-f]{32}")
"""A Twilio account's SID (``fullmatch``)."""
CALL_SID = re.compile(r"CA[0-9a-f]{32}")
"""A Twilio call's SID (``fullmatch``)."""

MAX_TICKET_CHARS = 128
"""Longer is not one of ours (they are about 60 characters)."""

_ROOT_LABEL = b"trio-duplex/twilio/v1"
_TICKET = re.compile(r"v1\.([or])\.(0|[1-9][0-9]{0,11})\.([A-Za-z0-9_-]{43})")
"""``v1.<mode>.<exp>.<mac>``: ``exp`` in canonical decimal, ``mac`` 32 bytes unpadded."""

_MESSAGES: dict[TicketReason, str] = {
    "shape": "the ticket is not a ticket",
    "expired": "the ticket has expired",
    "mac": "the ticket is not valid for this call",
    "call": "the stream does not name a valid account and call",
    "mode": "a resume ticket cannot open a session",
}


@attrs.frozen
class TicketError(Exception):
    """A ticket refused, for ``reason``. ``str()`` is fixed text (never the ticket)."""

    reason: TicketReason

    def __str__(self) -> str:
        return _MESSAGES[self.reason]


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@attrs.define(eq=False, repr=False)
class TwilioKeys:
    """The three sub-keys (plan §4.2). Make them with ``derive`` (the Auth Token's) or
    ``random`` (``--twilio-insecure-no-signature`` without a token: one process only,
    since no other node can derive the same)."""

    _ticket: bytes
    _session: bytes
    _resume: bytes

    @classmethod
    def _of_root(cls, root: bytes) -> TwilioKeys:
        return cls(_mac(root, b"ticket"), _mac(root, b"session"), _mac(root, b"resume-token"))

    @classmethod
    def derive(cls, auth_token: str) -> TwilioKeys:
        """The keys of the account whose Auth Token this is (the same on every node)."""
        return cls._of_root(_mac(auth_token.encode("utf-8"), _ROOT_LABEL))

    @classmethod
    def random(cls) -> TwilioKeys:
        """Keys of this process alone (a random root)."""
        return cls._of_root(secrets.token_bytes(32))

    def session_id(self, account_sid: str, call_sid: str) -> str:
        """The call's session id, ``sess_`` and 24 hex digits."""
        message = f"{account_sid}|{call_sid}".encode("utf-8", "surrogatepass")
        return "sess_" + _mac(self._session, message).hex()[:24]

    def resume_token(self, session_id: str) -> str:
        """The fixed resume token of the call's session ``session_id`` (43 base64url
        characters, 256 bits). A secret: never logged, never sent to Twilio."""
        return _b64(_mac(self._resume, session_id.encode("utf-8", "surrogatepass")))

    def _ticket_mac(self, mode: str, account_sid: str, call_sid: str, exp: str) -> str:
        message = f"v1|{mode}|{account_sid}|{call_sid}|{exp}".encode("ascii")
        return _b64(_mac(self._ticket, message))

    def mint(self, mode: Mode, account_sid: str, call_sid: str, now: float, ttl_s: float) -> str:
        """A ticket of ``mode`` for the call, valid until ``now + ttl_s`` (its last valid
        second, rounded down). ValueError for SIDs not of Twilio's shape (the caller checks
        them first: ``front.twilio.call_of``) or a mode not ``o``/``r``."""
        if mode not in ("o", "r"):
            raise ValueError("a ticket's mode is o or r")
        if not ACCOUNT_SID.fullmatch(account_sid) or not CALL_SID.fullmatch(call_sid):
            raise ValueError("not a Twilio account SID and call SID")
        exp = str(int(now + ttl_s))
        return f"v1.{mode}.{exp}.{self._ticket_mac(mode, account_sid, call_sid, exp)}"

    def verify(
        self, ticket: object, account_sid: str, call_sid: str, now: float, *, opening: bool
    ) -> Mode:
        """The mode of ``ticket`` (what ``start.customParameters`` holds, of any type),
        if it is valid for the call ``start`` names, at ``now``; ``opening``: the door is
        about to open the session (not resume it), which only an ``o`` ticket may.
        TicketError's reasons, in the order checked: ``shape`` (not a ticket),
        ``call`` (the SIDs given are not Twilio's shape), ``mac`` (forged, tampered, or
        minted for another account or call: the ticket does not name its call, so these
        cannot be told apart), ``expired`` (``now`` past ``exp``), ``mode``. The MAC is
        compared in constant time, before the expiry is looked at (so ``expired`` is only
        ever said of a genuine ticket)."""
        if not isinstance(ticket, str) or len(ticket) > MAX_TICKET_CHARS:
            raise TicketError("shape")
        found = _TICKET.fullmatch(ticket)
        if found is None:
            raise TicketError("shape")
        if not ACCOUNT_SID.fullmatch(account_sid) or not CALL_SID.fullmatch(call_sid):
            raise TicketError("call")
        mode, exp, mac = found[1], found[2], found[3]
        expected = self._ticket_mac(mode, account_sid, call_sid, exp)
        if not hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii")):
            raise TicketError("mac")
        if now > int(exp):
            raise TicketError("expired")
        if opening and mode != "o":
            raise TicketError("mode")
        return "o" if mode == "o" else "r"

    def __repr__(self) -> str:
        return "TwilioKeys(<redacted>)"


__all__ = [
    "ACCOUNT_SID",
    "CALL_SID",
    "MAX_TICKET_CHARS",
    "TICKET_REASONS",
    "Mode",
    "TicketError",
    "TicketReason",
    "TwilioKeys",
]
