"""core/limits.py: the few settings the core's rules read, refused when out of range."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from trio_duplex.core.limits import FIRST_MESSAGE_ENVELOPE, KiB, Limits

# Each field, a value it refuses and the smallest it takes.
BOUNDS = {
    "max_sessions": (0, 1),
    "disconnect_grace_s": (-0.5, 0.0),
    "unconfirmed_grace_s": (-0.5, 0.0),
    "idle_ttl_s": (0.0, 0.001),
    "journal_max_bytes": (0, 1),
    "journal_ttl_s": (0.0, 0.001),
    "max_event_bytes": (0, 1),
    "max_config_bytes": (0, 1),
    "max_pending_input": (0, 1),
    "max_input_bytes": (0, 1),
}


def test_every_field_has_its_bound_checked() -> None:
    assert sorted(BOUNDS) == sorted(a.name for a in attrs.fields(Limits))


@pytest.mark.parametrize(("name", "refused", "smallest"), [(n, *b) for n, b in BOUNDS.items()])
def test_a_value_out_of_range_is_refused_naming_its_field(
    name: str, refused: float, smallest: float
) -> None:
    bad: dict[str, Any] = {name: refused}
    with pytest.raises(ValueError, match=f"'{name}' must be"):
        Limits(**bad)
    least: dict[str, Any] = {name: smallest}
    assert getattr(Limits(**least), name) == smallest


def test_the_created_event_advertises_the_bounds_a_client_paces_by() -> None:
    limits = Limits(max_pending_input=3, max_input_bytes=5000, disconnect_grace_s=math.inf)
    assert limits.advertised() == {
        "disconnect_grace_s": math.inf,
        "idle_ttl_s": 300.0,
        "journal_max_bytes": 8 * KiB * KiB,
        "max_event_bytes": 15 * KiB * KiB,
        "max_config_bytes": 64 * KiB,
        "max_pending_input": 3,
        "max_pending_input_bytes": 5000,
    }


def test_the_first_message_is_bounded_by_the_configuration_and_the_event_bounds() -> None:
    assert Limits(max_config_bytes=100).first_message_bytes == 100 + FIRST_MESSAGE_ENVELOPE
    assert Limits(max_config_bytes=100, max_event_bytes=200).first_message_bytes == 200
