"""Resume credentials (``core/credentials.py``): 256-bit tokens, digests only, rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import attrs
import pytest

from trio_duplex.core.credentials import Credentials, new_token
from trio_duplex.core.limits import Limits
from trio_duplex.core.session import Registry
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE


def stored_values(credentials: Credentials) -> list[Any]:
    """What it holds of its tokens (every field but the fixed flag, a bool)."""
    values = [getattr(credentials, a.name) for a in attrs.fields(Credentials)]
    return [value for value in values if type(value) is not bool]


def test_tokens_carry_256_random_bits() -> None:
    token = new_token()
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert len(raw) == 32
    assert len({new_token() for _ in range(1000)}) == 1000


def test_only_digests_are_stored() -> None:
    credentials, token = Credentials.issue()
    values = stored_values(credentials)
    assert hashlib.sha256(token.encode()).digest() in values
    for value in values:
        assert value != token and value != token.encode()
        assert not (isinstance(value, str | bytes) and token in str(value))
    new = credentials.rotate(token)
    values = stored_values(credentials)
    for plain in (token, new):
        assert plain not in values and plain.encode() not in values
    assert {hashlib.sha256(t.encode()).digest() for t in (token, new)} == set(values)


def test_repr_hides_everything() -> None:
    credentials, token = Credentials.issue()
    pending = credentials.rotate(token)
    text = repr(credentials) + str(credentials)
    assert text == "Credentials(<redacted>)" * 2
    for secret in (token, pending):
        digest = hashlib.sha256(secret.encode()).digest()
        assert secret not in text and digest.hex() not in text and repr(digest) not in text


def test_session_and_attempt_reprs_hold_no_token() -> None:
    registry = Registry(Limits(), spelling=NATIVE)
    session, token = registry.admit({})
    session.handshake_delivered(0.0)
    attempt = session.begin_resume(token, 0, 0.0)
    for text in (repr(session), repr(attempt), repr(registry)):
        assert token not in text and attempt.new_token not in text


@pytest.mark.parametrize("token", [None, 1, b"bytes", ["list"], ""])
def test_a_non_string_or_empty_token_is_never_valid(token: object) -> None:
    credentials, _ = Credentials.issue()
    assert credentials.check(token) is False


def test_comparisons_run_in_constant_time_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", compare)  # the module core/credentials.py calls
    credentials, token = Credentials.issue()
    for presented in (token, "wrong"):
        calls.clear()
        credentials.check(presented)
        assert len(calls) == 2  # current and pending, whichever matches


def test_rotation_rule() -> None:
    credentials, a = Credentials.issue()
    assert credentials.check(a)
    # A resume presents a and is issued b: both stay valid until b is presented.
    b = credentials.rotate(a)
    assert credentials.check(a) and credentials.check(b)
    # session.resumed (with b) was lost: the client presents a again and is issued c.
    c = credentials.rotate(a)
    assert credentials.check(a) and credentials.check(c)
    assert not credentials.check(b)  # never presented, not the presented one: dead
    # The client presents c: every older token dies.
    d = credentials.rotate(c)
    assert credentials.check(c) and credentials.check(d)
    assert not credentials.check(a) and not credentials.check(b)
    # Presenting d kills c as well; no old token ever comes back.
    e = credentials.rotate(d)
    assert [credentials.check(t) for t in (a, b, c, d, e)] == [False, False, False, True, True]


def test_presenting_the_current_token_again_keeps_it_valid() -> None:
    credentials, a = Credentials.issue()
    b = credentials.rotate(a)
    b2 = credentials.rotate(b)  # b presented: a dies
    b3 = credentials.rotate(b)  # b presented again (b2's session.resumed lost)
    assert [credentials.check(t) for t in (a, b, b2, b3)] == [False, True, False, True]


def test_rotation_through_the_session_survives_a_lost_resumed() -> None:
    registry = Registry(Limits(), spelling=NATIVE)
    session, a = registry.admit({})
    session.handshake_delivered(0.0)
    session.detach(1, 0.0)
    first = session.begin_resume(a, 0, 1.0)
    session.abort_resume(first, 2.0)  # the connection died before session.resumed arrived
    second = session.begin_resume(a, 0, 3.0)  # the client still holds a
    assert session.commit_resume(second, 3.0) is not None
    # The token of the lost session.resumed was never presented: it is dead.
    with pytest.raises(ProtocolError) as error:
        session.begin_resume(first.new_token, 0, 4.0)
    assert error.value.code == "invalid_resume_token"
    # The new token works, and once presented the old one is gone.
    third = session.begin_resume(second.new_token, 0, 5.0)
    session.commit_resume(third, 5.0)
    with pytest.raises(ProtocolError) as error:
        session.begin_resume(a, 0, 6.0)
    assert error.value.code == "invalid_resume_token"


def test_confirming_the_pending_token_kills_the_presented_one() -> None:
    credentials, t0 = Credentials.issue()
    t1 = credentials.rotate(t0)
    issued = credentials.pending
    assert issued is not None and credentials.check(t0) and credentials.check(t1)
    credentials.confirm(issued)
    assert not credentials.check(t0) and credentials.check(t1)
    assert credentials.pending is None
    credentials.confirm(issued)  # again: nothing more to kill
    assert credentials.check(t1)


def test_confirming_a_superseded_token_changes_nothing() -> None:
    credentials, t0 = Credentials.issue()
    t1 = credentials.rotate(t0)
    first = credentials.pending
    assert first is not None
    t2 = credentials.rotate(t1)  # a newer resume issued t2 before t1 was confirmed
    credentials.confirm(first)
    assert credentials.check(t1) and credentials.check(t2)  # t2 not shown yet: t1 stays


def test_a_fixed_credential_never_rotates_and_holds_only_its_digest() -> None:
    token = new_token()
    credentials = Credentials.fixed(token)
    assert credentials.is_fixed
    assert credentials.check(token) and not credentials.check(new_token())
    assert credentials.rotate(token) == token  # the same token, again and again
    assert credentials.rotate(token) == token
    assert credentials.pending is None
    credentials.confirm(hashlib.sha256(token.encode()).digest())  # nothing to confirm
    assert credentials.check(token)
    assert stored_values(credentials) == [hashlib.sha256(token.encode()).digest(), None]
    assert token not in repr(credentials)
    current, pending = credentials.digests()
    moved = Credentials.from_digests(current, pending, fixed=True)
    assert moved.is_fixed and moved.rotate(token) == token
    with pytest.raises(ValueError, match="pending"):
        Credentials.from_digests(current, current, fixed=True)
