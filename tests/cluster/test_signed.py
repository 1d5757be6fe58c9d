"""Sealed store values (``cluster/signed.py``): no Redis, no clock but the one passed."""

from __future__ import annotations

import logging

import pytest

from trio_duplex.cluster.signed import CLOCK_ALLOWANCE_MS, Complaints, Sealer, payload_of

SECRET = "test-cluster-secret-0123456789"
KEY = "trio-duplex:session:sess_1"
NOW = 1_800_000_000_000


def test_a_sealed_value_opens_at_its_key_until_it_expires() -> None:
    sealer = Sealer.of(SECRET)
    sealed = sealer.seal(KEY, "node-a", NOW + 5_000)
    assert sealer.open(KEY, sealed, NOW) == "node-a"
    assert sealer.open(KEY, sealed, NOW + 5_000 + CLOCK_ALLOWANCE_MS) == "node-a"
    assert sealer.open(KEY, sealed, NOW + 5_001 + CLOCK_ALLOWANCE_MS) is None
    assert payload_of(sealed) == "node-a"


def test_a_value_moved_to_another_key_does_not_open() -> None:
    sealer = Sealer.of(SECRET)
    sealed = sealer.seal(KEY, "node-a", NOW + 5_000)
    assert sealer.open("trio-duplex:session:sess_2", sealed, NOW) is None


def test_another_secret_does_not_open_it() -> None:
    sealed = Sealer.of("another-secret-0123456789").seal(KEY, "node-a", NOW + 5_000)
    assert Sealer.of(SECRET).open(KEY, sealed, NOW) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.replace("node-a", "node-b"),  # the payload
        lambda s: s.replace(f".{NOW + 5_000}.", f".{NOW + 9_000_000}."),  # the expiry
        lambda s: s[:-1],
        lambda s: s + "x",
        lambda s: "v2" + s[2:],
        lambda s: s.split(".", 3)[3],  # the payload alone: what an old node wrote
        lambda s: "",
    ],
)
def test_a_changed_byte_does_not_open(change: object) -> None:
    sealer = Sealer.of(SECRET)
    sealed = sealer.seal(KEY, "node-a", NOW + 5_000)
    assert callable(change)
    assert sealer.open(KEY, change(sealed), NOW) is None


def test_anything_but_a_string_does_not_open() -> None:
    sealer = Sealer.of(SECRET)
    for value in (None, b"v1.1.00.x", 7, ["v1"]):
        assert sealer.open(KEY, value, NOW) is None


def test_payloads_may_hold_dots_and_any_text() -> None:
    sealer = Sealer.of(SECRET)
    for payload in ("ws://10.0.0.1:8000/v1/duplex", "a.b.c", "", "ünï\ncode"):
        assert sealer.open(KEY, sealer.seal(KEY, payload, NOW + 1), NOW) == payload


def test_the_key_is_not_the_secret_and_is_never_shown() -> None:
    sealer = Sealer.of(SECRET)
    sealed = sealer.seal(KEY, "x", NOW)
    assert SECRET not in repr(sealer) and SECRET not in sealed
    assert repr(sealer) == "Sealer(<key>)"
    with pytest.raises(ValueError):
        Sealer.of("")
    with pytest.raises(ValueError):
        sealer.seal(KEY, "x", -1)


def test_a_private_value_is_encrypted_and_sealed() -> None:
    sealer = Sealer.of(SECRET)
    journal = b'tdmig:{"text": "what the user said"}'
    sealed = sealer.seal_private(KEY, journal, NOW + 5_000)
    assert b"what the user said" not in sealed.encode() and "user" not in sealed
    assert sealer.open_private(KEY, sealed, NOW) == journal
    assert sealer.seal_private(KEY, journal, NOW + 5_000) != sealed  # a fresh nonce each
    assert sealer.open_private("trio-duplex:migration:other", sealed, NOW) is None
    assert Sealer.of("another-secret-0123456789").open_private(KEY, sealed, NOW) is None
    # Sealed right, but not encrypted with the key (or not base64): refused too.
    assert sealer.open_private(KEY, sealer.seal(KEY, "dG9vIHNob3J0", NOW + 5), NOW) is None
    assert sealer.open_private(KEY, sealer.seal(KEY, "not base64!", NOW + 5), NOW) is None


def test_values_that_fail_are_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    complaints = Complaints()
    with caplog.at_level(logging.WARNING, logger="trio_duplex"):
        for _ in range(3):
            complaints("a directory entry", KEY)
    assert complaints.count == 3
    assert len(caplog.records) == 1 and KEY in caplog.records[0].getMessage()
    caplog.clear()
    complaints._quiet_until = 0.0  # the interval over: the next says how many went unsaid
    with caplog.at_level(logging.WARNING, logger="trio_duplex"):
        complaints("a lease count", KEY)
    assert "and 2 more since" in caplog.records[0].getMessage()
