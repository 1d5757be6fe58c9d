"""The conversation's ids and the shape check of a client's item (core/conversation.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from trio_duplex.core.conversation import (
    MAX_ID,
    assistant_item,
    assistant_item_id,
    check_item,
    check_item_id,
    new_item_id,
)
from trio_duplex.core.wire import ProtocolError


def test_assistant_items() -> None:
    assert assistant_item("r", None, audio=True, status="in_progress") == {
        "id": "item_r",
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    spoken = assistant_item("r", "hi", audio=True)
    assert spoken["content"] == [{"type": "output_audio", "transcript": "hi"}]
    assert spoken["status"] == "completed"
    written = assistant_item("r", "hi", audio=False, status="incomplete")
    assert written["content"] == [{"type": "output_text", "text": "hi"}]
    check_item(spoken)
    check_item(written)


def test_ids() -> None:
    assert assistant_item_id("resp_7") == "item_resp_7"
    ids = {new_item_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"item_[0-9a-f]{24}", i) for i in ids)
    assert check_item_id("x" * MAX_ID, "item_id") == "x" * MAX_ID


GOOD: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},  # type: message
    {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_audio", "transcript": ""}],
    },
    {"type": "message", "role": "system", "content": [], "status": "completed", "id": "item_1"},
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "id": "item_f"},
    {"type": "function_call_output", "call_id": "c", "output": "1", "object": "realtime.item"},
    {"type": "mcp_approval_response", "approval_request_id": "a", "approve": True},
]


@pytest.mark.parametrize("item", GOOD, ids=lambda i: f"{i.get('type')}-{i.get('role')}")
def test_well_shaped_items_pass(item: dict[str, Any]) -> None:
    check_item(item)


BAD: list[tuple[Any, str]] = [
    ("hi", "item"),
    ({"type": "message", "role": "user"}, "item"),
    ({"type": "message", "role": "user", "content": "hi"}, "item"),
    ({"type": "message", "role": 1, "content": []}, "item.role"),
    ({"type": "message", "role": "user", "content": [], "name": "x"}, "item.name"),
    ({"type": "message", "role": "user", "content": [], "status": ["done"]}, "item.status"),
    ({"type": "message", "role": "user", "content": [], "object": "item"}, "item.object"),
    ({"type": "message", "role": "user", "content": [], "id": 5}, "item.id"),
    ({"type": "message", "role": "user", "content": [], "id": "x" * (MAX_ID + 1)}, "item.id"),
    ({"type": "message", "role": "user", "content": ["hi"]}, "item.content[0]"),
    (
        {"type": "message", "role": "user", "content": [{"type": "input_text"}]},
        "item.content[0].text",
    ),
    (
        {"type": "message", "role": "system", "content": [{"type": "input_audio", "audio": ""}]},
        "item.content[0]",
    ),
    (
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "", "x": 1}],
        },
        "item.content[0].x",
    ),
    ({"type": "message", "role": "user", "content": [{}] * 65}, "item"),
    ({"type": "function_call", "name": "f"}, "item.arguments"),
    ({"type": "function_call", "name": 1, "arguments": ""}, "item.name"),
    ({"type": "function_call_output", "call_id": "c", "output": "", "extra": 1}, "item.extra"),
    (
        {"type": "mcp_approval_response", "approval_request_id": "a", "approve": "yes"},
        "item.approve",
    ),
    ({"type": "item_reference", "id": "x"}, "item.type"),
]


@pytest.mark.parametrize(("item", "param"), BAD, ids=lambda v: str(v)[:50])
def test_ill_shaped_items_are_refused_naming_the_field(item: Any, param: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        check_item(item)
    assert (refused.value.code, refused.value.param) == ("bad_event", param)


def test_the_param_prefix_is_the_callers() -> None:
    with pytest.raises(ProtocolError) as refused:
        check_item({"type": "message", "role": "x", "content": []}, "response.input[2]")
    assert refused.value.param == "response.input[2].role"
