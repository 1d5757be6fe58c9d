"""``trio_duplex.PROTOCOL_VERSION`` is the version docs/protocol.md states."""

from __future__ import annotations

import re
from pathlib import Path

import trio_duplex

PROTOCOL_MD = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def test_protocol_version_is_the_one_docs_protocol_md_states() -> None:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    title = re.match(r"# trio-duplex wire protocol, version (\d+)\n", text)
    assert title is not None, "docs/protocol.md's title no longer states its version"
    assert trio_duplex.PROTOCOL_VERSION == int(title.group(1))


def test_no_later_version_is_mentioned_in_docs_protocol_md() -> None:
    # "Changed in v2", "a v1 client": a version the document names is never one past it.
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    named = {int(n) for n in re.findall(r"\bv(\d+)\b", text)}
    assert named, "docs/protocol.md names no version (vN) at all"
    assert max(named) == trio_duplex.PROTOCOL_VERSION
