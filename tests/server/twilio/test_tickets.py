"""server/twilio/tickets.py: the keys derived from the Auth Token (plan §4.2), the
call's session id and resume token, and tickets: minted and verified, refused for each
reason, never raising anything but TicketError on any input."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.server.twilio.tickets import (
    TICKET_REASONS,
    Mode,
    TicketError,
    TwilioKeys,
)

TOKEN = "0123456789abcdef0123456789abcdef"
ACCOUNT = "AC" + "0123456789abcdef" * 2
CALL = "CA" + "fedcba9876543210" * 2
OTHER_CALL = "CA" + "0" * 32
OTHER_ACCOUNT = "AC" + "f" * 32
NOW = 1_764_760_000.25
TTL = 60.0
KEYS = TwilioKeys.derive(TOKEN)

sids = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)
accounts = sids.map(lambda h: "AC" + h)
calls = sids.map(lambda h: "CA" + h)
modes = st.sampled_from(["o", "r"])


def reason(
    ticket: object,
    account: str = ACCOUNT,
    call: str = CALL,
    now: float = NOW,
    *,
    opening: bool = False,
) -> str:
    with pytest.raises(TicketError) as caught:
        KEYS.verify(ticket, account, call, now, opening=opening)
    return caught.value.reason


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def test_the_derivation_is_the_plans() -> None:
    """§4.2's formulas, computed here from hmac alone."""
    root = _hmac(TOKEN.encode(), "trio-duplex/twilio/v1")
    session_key, resume_key, ticket_key = (
        _hmac(root, label) for label in ("session", "resume-token", "ticket")
    )
    session = "sess_" + _hmac(session_key, f"{ACCOUNT}|{CALL}").hex()[:24]
    assert KEYS.session_id(ACCOUNT, CALL) == session
    token = base64.urlsafe_b64encode(_hmac(resume_key, session)).rstrip(b"=").decode()
    assert KEYS.resume_token(session) == token
    ticket = KEYS.mint("r", ACCOUNT, CALL, NOW, TTL)
    exp = str(int(NOW + TTL))
    mac = _hmac(ticket_key, f"v1|r|{ACCOUNT}|{CALL}|{exp}")
    assert ticket == f"v1.r.{exp}." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


@given(accounts, calls)
def test_one_call_one_session_on_every_node(account: str, call: str) -> None:
    session = KEYS.session_id(account, call)
    assert re.fullmatch(r"sess_[0-9a-f]{24}", session)
    assert TwilioKeys.derive(TOKEN).session_id(account, call) == session  # another node
    assert TwilioKeys.derive(TOKEN + "x").session_id(account, call) != session
    assert KEYS.session_id(account, OTHER_CALL if call != OTHER_CALL else CALL) != session
    token = KEYS.resume_token(session)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
    assert len(base64.urlsafe_b64decode(token + "=")) == 32
    assert TwilioKeys.derive(TOKEN).resume_token(session) == token
    assert KEYS.resume_token(session + "0") != token


def test_random_keys_are_of_one_process() -> None:
    one, two = TwilioKeys.random(), TwilioKeys.random()
    assert one.session_id(ACCOUNT, CALL) != two.session_id(ACCOUNT, CALL)
    ticket = one.mint("o", ACCOUNT, CALL, NOW, TTL)
    assert one.verify(ticket, ACCOUNT, CALL, NOW, opening=True) == "o"
    with pytest.raises(TicketError) as caught:
        two.verify(ticket, ACCOUNT, CALL, NOW, opening=True)
    assert caught.value.reason == "mac"


@given(accounts, calls, modes, st.floats(0, 4e9), st.floats(1, 3600))
def test_round_trip(account: str, call: str, mode: Mode, now: float, ttl: float) -> None:
    ticket = KEYS.mint(mode, account, call, now, ttl)
    assert len(ticket) <= 70
    assert KEYS.verify(ticket, account, call, now, opening=False) == mode
    assert KEYS.verify(ticket, account, call, now + ttl - 1, opening=False) == mode
    if mode == "o":
        assert KEYS.verify(ticket, account, call, now, opening=True) == "o"


def test_the_expiry_boundary() -> None:
    ticket = KEYS.mint("o", ACCOUNT, CALL, NOW, TTL)
    exp = int(NOW + TTL)
    assert ticket.split(".")[2] == str(exp)
    assert KEYS.verify(ticket, ACCOUNT, CALL, exp, opening=True) == "o"
    assert reason(ticket, now=exp + 1e-6) == "expired"
    assert reason(ticket, now=exp + 3600) == "expired"


def test_another_call_or_account_or_mode() -> None:
    ticket = KEYS.mint("o", ACCOUNT, CALL, NOW, TTL)
    assert reason(ticket, call=OTHER_CALL) == "mac"
    assert reason(ticket, account=OTHER_ACCOUNT) == "mac"
    assert reason(ticket, account=CALL, call=ACCOUNT) == "call"
    assert reason(ticket, call="CA" + "0" * 31) == "call"
    assert reason(ticket, call=CALL.upper()) == "call"
    resume = KEYS.mint("r", ACCOUNT, CALL, NOW, TTL)
    assert KEYS.verify(resume, ACCOUNT, CALL, NOW, opening=False) == "r"
    assert reason(resume, opening=True) == "mode"
    # The mode is under the MAC: an "r" turned "o" is forged.
    assert reason("v1.o." + resume[5:], opening=True) == "mac"
    # A genuine but expired ticket says so; a forged one never gets that far.
    assert reason(resume, now=NOW + 2 * TTL, opening=True) == "expired"


@given(st.data())
def test_any_character_changed_is_refused(data: st.DataObject) -> None:
    ticket = KEYS.mint("o", ACCOUNT, CALL, NOW, TTL)
    index = data.draw(st.integers(0, len(ticket) - 1))
    replacement = data.draw(st.characters().filter(lambda c: c != ticket[index]))
    tampered = ticket[:index] + replacement + ticket[index + 1 :]
    got = reason(tampered, opening=True)
    assert got in ("shape", "mac")


@given(st.from_regex(r"v1\.[or]\.(0|[1-9][0-9]{0,11})\.[A-Za-z0-9_-]{43}", fullmatch=True))
def test_well_shaped_forgeries_fail_the_mac(ticket: str) -> None:
    assert reason(ticket, now=0) == "mac"


@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.integers(),
        st.floats(),
        st.none(),
        st.lists(st.text()),
        st.dictionaries(st.text(), st.text()),
        st.from_regex(r"v1\.[a-z]\.[0-9.-]{0,14}\.[A-Za-z0-9_=+/-]{0,50}", fullmatch=True),
        st.text().map(lambda t: "v1.o.1." + t),
    ),
    st.text(max_size=40),
    st.text(max_size=40),
    st.floats(allow_nan=False),
    st.booleans(),
)
def test_garbage_is_only_ever_a_ticket_error(
    ticket: object, account: str, call: str, now: float, opening: bool
) -> None:
    with pytest.raises(TicketError) as caught:
        KEYS.verify(ticket, account, call, now, opening=opening)
    assert caught.value.reason in TICKET_REASONS
    text = str(caught.value)
    assert text and (not isinstance(ticket, str) or len(ticket) < 8 or ticket not in text)


def test_minting_wants_twilios_sids_and_a_mode() -> None:
    with pytest.raises(ValueError, match="SID"):
        KEYS.mint("o", "AC123", CALL, NOW, TTL)
    with pytest.raises(ValueError, match="SID"):
        KEYS.mint("o", ACCOUNT, "CA|x", NOW, TTL)
    with pytest.raises(ValueError, match="mode"):
        KEYS.mint("x", ACCOUNT, CALL, NOW, TTL)  # type: ignore[arg-type]


def test_no_secret_in_a_repr() -> None:
    ticket = KEYS.mint("o", ACCOUNT, CALL, NOW, TTL)
    session = KEYS.session_id(ACCOUNT, CALL)
    shown = repr(KEYS) + str(KEYS) + repr(TicketError("mac")) + str(TicketError("mac"))
    assert shown.count("<redacted>") == 2
    root = _hmac(TOKEN.encode(), "trio-duplex/twilio/v1")
    for secret in (TOKEN, root.hex(), ticket, KEYS.resume_token(session)):
        assert secret not in shown
    for label in ("ticket", "session", "resume-token"):
        assert _hmac(root, label).hex() not in shown
        assert repr(_hmac(root, label)) not in shown
