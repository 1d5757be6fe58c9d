"""front/twilio.py's ``X-Twilio-Signature``, against twilio-python's own
``RequestValidator`` (the reference, plan §1.3): the same signature for any URL and any
form, repeated names included; the URLs ``validate`` takes with and without the port are
the ones ``candidates`` lets through; every candidate is compared."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from trio_duplex.server.front.twilio import (
    candidates,
    expected_signature,
    parse_form,
    signature_valid,
)

TOKEN = "0123456789abcdef0123456789abcdef"


class MultiDict:
    """The form as a Flask ``MultiDict`` shows it (``getall``): the one shape
    ``RequestValidator.get_values`` reads repeated names from."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(name for name, _ in self.pairs))

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def getall(self, name: str) -> list[str]:
        return [value for key, value in self.pairs if key == name]


def reference(url: str, pairs: list[tuple[str, str]], token: str = TOKEN) -> str:
    signature: str = RequestValidator(token).compute_signature(url, MultiDict(pairs))
    return signature


hosts = st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9]{0,8}){0,3}", fullmatch=True)
ports = st.none() | st.integers(1, 65535)
# No ";" in a path: the reference's urlparse takes a last segment's ";..." for RFC 2396
# parameters, which its re-spelling of the URL with or without its port drops (the
# validator then disagrees with itself); our paths are our own (--twilio-path).
segments = st.from_regex(r"([A-Za-z0-9._~!$'()*+,=:@-]|%[0-9A-F]{2}){0,12}", fullmatch=True)
paths = st.lists(segments, max_size=4).map(lambda parts: "/" + "/".join(parts))
queries = st.none() | st.from_regex(
    r"([A-Za-z0-9._~!$'()*+,;=:@/?&-]|%[0-9A-F]{2}){1,30}", fullmatch=True
)
names = (
    st.sampled_from(["AccountSid", "CallSid", "From", "To", "a", "A", "", "ä", "b c"]) | st.text()
)
values = st.sampled_from(["", "x", "+15551234567", "AC", "<&>"]) | st.text()
forms = st.lists(st.tuples(names, values), max_size=12)
tokens = st.text(min_size=1, max_size=40)


def base_url(scheme: str, host: str, port: int | None) -> str:
    return f"{scheme}://{host}" + ("" if port is None else f":{port}")


@given(st.sampled_from(["http", "https"]), hosts, ports, paths, queries, forms, tokens)
def test_the_signature_is_the_references(
    scheme: str,
    host: str,
    port: int | None,
    path: str,
    query: str | None,
    pairs: list[tuple[str, str]],
    token: str,
) -> None:
    url = base_url(scheme, host, port) + path + ("" if query is None else "?" + query)
    assert expected_signature(token, url, pairs) == reference(url, pairs, token)


@given(forms)
def test_repeated_pairs_sign_as_the_reference_does(pairs: list[tuple[str, str]]) -> None:
    # Names and values repeated, in any order: the reference signs the distinct pairs,
    # sorted by name then value.
    doubled = pairs + pairs[::-1] + [(name, value + "!") for name, value in pairs]
    url = "https://voice.example.com/v1/twilio/twiml"
    assert expected_signature(TOKEN, url, doubled) == reference(url, doubled)
    if len({name for name, _ in pairs}) == len(pairs):  # a plain dict: the common case
        plain: str = RequestValidator(TOKEN).compute_signature(url, dict(pairs))
        assert expected_signature(TOKEN, url, pairs) == plain


@given(forms)
def test_a_form_encoded_and_parsed_signs_as_sent(pairs: list[tuple[str, str]]) -> None:
    # The fake provider's side: urlencode (as an HTTP client sends a form), our parse,
    # the reference's signature over what was sent.
    body = urlencode(pairs).encode()
    parsed = parse_form(body)
    assert parsed == pairs
    url = "https://voice.example.com/v1/twilio/twiml"
    header = reference(url, pairs)
    assert signature_valid(TOKEN, header, [url], parsed)


@given(forms, st.data())
def test_one_bit_changed_fails(pairs: list[tuple[str, str]], data: st.DataObject) -> None:
    url = "https://voice.example.com/v1/twilio/twiml?resume=1"
    header = reference(url, pairs)
    assert signature_valid(TOKEN, header, [url], pairs)
    raw = bytearray(base64.b64decode(header))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    assert not signature_valid(TOKEN, base64.b64encode(bytes(raw)).decode(), [url], pairs)
    # ... or one bit of the token, the URL, a value.
    flipped_token = TOKEN[:-1] + chr(ord(TOKEN[-1]) ^ 1)
    assert not signature_valid(flipped_token, header, [url], pairs)
    assert not signature_valid(TOKEN, header, [url[:-1] + "0"], pairs)
    assert not signature_valid(TOKEN, header, [url], [*pairs, ("x", "1")])


def test_no_signature_or_an_empty_one_fails() -> None:
    url = "https://voice.example.com/v1/twilio/twiml"
    assert not signature_valid(TOKEN, None, [url], [])
    assert not signature_valid(TOKEN, "", [url], [])
    assert not signature_valid(TOKEN, reference(url, []), [], [])
    assert not signature_valid(TOKEN, "é" * 28, [url], [])  # not ASCII: no TypeError


@given(
    st.sampled_from(["http", "https"]),
    hosts,
    ports,
    paths,
    queries,
    forms,
    st.sampled_from(["as configured", "with port", "without port", "other port", "other host"]),
)
def test_the_port_rule_is_the_references(
    scheme: str,
    host: str,
    port: int | None,
    path: str,
    query: str | None,
    pairs: list[tuple[str, str]],
    spelling: str,
) -> None:
    """A signature over the URL with its (default) port, or without a port, passes
    exactly when ``RequestValidator.validate`` passes it."""
    public = base_url(scheme, host, port)
    url = public + path + ("" if query is None else "?" + query)
    default = 443 if scheme == "https" else 80
    signed_as = {
        "as configured": url,
        "with port": base_url(scheme, host, port or default) + path,
        "without port": base_url(scheme, host, None) + path,
        "other port": base_url(scheme, host, (port or default) % 65535 + 1) + path,
        "other host": base_url(scheme, "x" + host, port) + path,
    }[spelling]
    if spelling != "as configured" and query is not None:
        signed_as += "?" + query
    header = reference(signed_as, pairs)
    theirs = RequestValidator(TOKEN).validate(url, MultiDict(pairs), header)
    ours = signature_valid(TOKEN, header, candidates(public, path, query, websocket=False), pairs)
    assert ours == theirs
    assert ours == (spelling in ("as configured", "with port", "without port"))


@pytest.mark.parametrize(
    ("public", "spellings"),
    [
        (
            "https://voice.example.com",
            [
                "https://voice.example.com/v1/twilio",
                "https://voice.example.com:443/v1/twilio",
                "wss://voice.example.com/v1/twilio",
                "wss://voice.example.com:443/v1/twilio",
            ],
        ),
        (
            "http://127.0.0.1:8080",
            [
                "http://127.0.0.1:8080/v1/twilio",
                "http://127.0.0.1/v1/twilio",
                "ws://127.0.0.1/v1/twilio",
                "ws://127.0.0.1:8080/v1/twilio",
            ],
        ),
        (
            "https://[::1]:8443/",
            [
                "https://[::1]:8443/v1/twilio",
                "https://[::1]/v1/twilio",
                "wss://[::1]/v1/twilio",
                "wss://[::1]:8443/v1/twilio",
            ],
        ),
    ],
)
def test_the_upgrade_takes_the_websocket_spellings(public: str, spellings: list[str]) -> None:
    found = candidates(public, "/v1/twilio", None, websocket=True)
    assert sorted(found) == sorted(spellings)
    assert found[0] == spellings[0]  # the configured spelling first
    for url in spellings:  # a GET: the URL alone is signed
        assert signature_valid(TOKEN, reference(url, []), found, [])
    for wrong in ("wss://voice.example.com:444/v1/twilio", "wss://evil.example/v1/twilio"):
        assert not signature_valid(TOKEN, reference(wrong, []), found, [])
    assert not any(
        url.startswith(("ws", "wss"))
        for url in candidates(public, "/v1/twilio", None, websocket=False)
    )


def test_the_query_is_signed_as_received() -> None:
    public = "https://voice.example.com"
    raw = "resume=1&attempt=2&t=1764760000&x=%2Fa+b"
    url = f"{public}/v1/twilio/twiml?{raw}"
    header = reference(url, [("CallSid", "CA1")])
    found = candidates(public, "/v1/twilio/twiml", raw, websocket=False)
    assert url in found
    assert signature_valid(TOKEN, header, found, [("CallSid", "CA1")])
    # A bare "?" is no query (the reference's urlparse drops it).
    assert candidates(public, "/p", "", websocket=False)[0] == f"{public}/p"
    assert candidates(public, "/p", None, websocket=False)[0] == f"{public}/p"
    decoded = candidates(
        public, "/v1/twilio/twiml", "resume=1&attempt=2&t=1764760000&x=/a b", websocket=False
    )
    assert not signature_valid(TOKEN, header, decoded, [("CallSid", "CA1")])


def test_every_candidate_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: a match on the first candidate compares the others too."""
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    found = candidates("https://voice.example.com", "/v1/twilio", None, websocket=True)
    header = reference(found[0], [])
    monkeypatch.setattr(hmac, "compare_digest", counting)  # (front/twilio.py looks it up)
    assert signature_valid(TOKEN, header, found, [])
    assert len(compared) == len(found) == 4
    assert len(set(compared)) == 4
