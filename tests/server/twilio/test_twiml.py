"""server/twilio/twiml.py: the documents parsed back (xml.etree) give every value as
written, whatever it holds; their shape is twilio-python's own TwiML builder's; the
``<Redirect>``'s URL and its attempts (plan §2.2 steps 3-4)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twilio.twiml.voice_response import Connect, Stream, VoiceResponse

from trio_duplex.server.twilio.twiml import (
    SHORT_STREAM_S,
    TICKET_PARAMETER,
    connect_document,
    hangup_document,
    is_resume,
    next_attempt,
    redirect_url,
    status_url_of,
    stream_url_of,
)

PUBLIC = "https://voice.example.com"
PATH = "/v1/twilio"
TICKET = "v1.o.1764760060.Q0FGRV9fX19fX19fX19fX19fX19fX19fX19fX19fX18"

xml_chars = st.characters(
    codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00\ufffe\uffff"
).filter(lambda c: c in "\t\n\r" or c >= " ")
values = st.text(xml_chars) | st.sampled_from(["<>&\"'", "a\r\nb\tc", "&amp;", "]]>", "'\""])


def parsed(document: str) -> ET.Element:
    return ET.fromstring(document.encode("utf-8"))


def shape(element: ET.Element) -> list[object]:
    return [element.tag, element.attrib, (element.text or "").strip(), [shape(e) for e in element]]


@given(values, values, values, values, st.integers(0, 3))
def test_every_value_round_trips(
    stream: str, status: str, ticket: str, redirect: str, pause: int
) -> None:
    root = parsed(connect_document(stream, status, ticket, redirect, pause))
    assert root.tag == "Response"
    tags = [child.tag for child in root]
    assert tags == (["Pause"] if pause else []) + ["Connect", "Redirect"]
    if pause:
        assert root[0].attrib == {"length": str(pause)}
    connect, redirect_element = root[-2], root[-1]
    (stream_element,) = connect
    assert stream_element.tag == "Stream"
    assert stream_element.attrib == {"url": stream, "statusCallback": status}
    (parameter,) = stream_element
    assert parameter.tag == "Parameter"
    assert parameter.attrib == {"name": TICKET_PARAMETER, "value": ticket}
    assert redirect_element.attrib == {"method": "POST"}
    assert (redirect_element.text or "") == redirect


@pytest.mark.parametrize("bad", ["\x00", "a\x01b", "\ufffe", "\x1b[0m"])
def test_a_value_xml_cannot_hold_is_a_bug(bad: str) -> None:
    with pytest.raises(ValueError, match="XML"):
        connect_document(bad, "s", "t", "r", 0)
    with pytest.raises(ValueError, match="XML"):
        connect_document("u", "s", "t", bad, 0)


def test_the_document_is_the_plans_and_twilios_builders() -> None:
    stream = stream_url_of(PUBLIC, PATH)
    status = status_url_of(PUBLIC, PATH)
    redirect = redirect_url(PUBLIC, PATH, 1, 1764760000.9)
    assert stream == "wss://voice.example.com/v1/twilio"
    assert status == "https://voice.example.com/v1/twilio/status"
    assert redirect == "https://voice.example.com/v1/twilio/twiml?resume=1&attempt=1&t=1764760000"
    document = connect_document(stream, status, TICKET, redirect, 0)
    assert document == (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Response>\n"
        "  <Connect>\n"
        f'    <Stream url="{stream}" statusCallback="{status}">\n'
        f'      <Parameter name="trio_duplex_ticket" value="{TICKET}"/>\n'
        "    </Stream>\n"
        "  </Connect>\n"
        '  <Redirect method="POST">https://voice.example.com/v1/twilio/twiml'
        "?resume=1&amp;attempt=1&amp;t=1764760000</Redirect>\n"
        "</Response>\n"
    )
    # twilio-python's VoiceResponse writes the same elements and attributes.
    response = VoiceResponse()
    connect = Connect()
    element = Stream(url=stream, status_callback=status)
    element.parameter(name=TICKET_PARAMETER, value=TICKET)
    connect.append(element)
    response.append(connect)
    response.redirect(redirect, method="POST")
    assert shape(parsed(document)) == shape(parsed(str(response)))
    paused = VoiceResponse()
    paused.pause(length=1)
    paused.append(connect)
    paused.redirect(redirect, method="POST")
    assert shape(parsed(connect_document(stream, status, TICKET, redirect, 1))) == shape(
        parsed(str(paused))
    )


def test_the_hangup_document() -> None:
    response = VoiceResponse()
    response.hangup()
    assert shape(parsed(hangup_document())) == shape(parsed(str(response)))
    assert [child.tag for child in parsed(hangup_document())] == ["Hangup"]


def test_a_plain_http_public_url_streams_over_ws() -> None:
    assert stream_url_of("http://127.0.0.1:8080", PATH) == "ws://127.0.0.1:8080/v1/twilio"
    assert stream_url_of("https://h:8443/", "/x") == "wss://h:8443/x"
    assert status_url_of("https://h/", PATH) == "https://h/v1/twilio/status"


@given(st.integers(1, 10**6), st.integers(0, 4 * 10**9), st.floats(-100, 100))
def test_attempts(attempt: int, issued_at: int, lived: float) -> None:
    url = redirect_url(PUBLIC, PATH, attempt, issued_at)
    parts = urlsplit(url)
    assert parts.path == PATH + "/twiml"
    query = parse_qs(parts.query)
    assert is_resume(query)
    expected = attempt + 1 if lived < SHORT_STREAM_S else 1
    assert next_attempt(query, issued_at + lived) == expected


def test_the_attempt_boundary() -> None:
    query = parse_qs(urlsplit(redirect_url(PUBLIC, PATH, 2, 1000)).query)
    assert next_attempt(query, 1000 + SHORT_STREAM_S - 0.001) == 3
    assert next_attempt(query, 1000 + SHORT_STREAM_S) == 1
    assert next_attempt(query, 990) == 3  # t ahead of this node's clock: no credit


@pytest.mark.parametrize(
    "query",
    [
        "resume=1",
        "resume=1&attempt=1",
        "resume=1&t=5",
        "resume=1&attempt=0&t=5",
        "resume=1&attempt=-1&t=5",
        "resume=1&attempt=1&attempt=2&t=5",
        "resume=1&attempt=x&t=5",
        "resume=1&attempt=1&t=5.5",
        "resume=1&attempt=%EF%BC%91&t=5",  # a full-width 1: not ASCII digits
        "resume=1&attempt=1&t=1234567890123",
    ],
)
def test_a_query_not_ours_has_no_attempt(query: str) -> None:
    assert next_attempt(parse_qs(query, keep_blank_values=True), 100.0) is None


def test_the_first_twiml_is_not_a_resume() -> None:
    assert not is_resume({})
    assert not is_resume(parse_qs("attempt=1&t=5"))
