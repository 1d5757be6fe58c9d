"""``sdp.py``: the offers a call takes and refuses, the candidates dropped from them,
and the advertised candidates added to an answer.

The offers are Chromium's and aiortc's, as they write them (offers.py).
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.server.calls.sdp import (
    MESSAGES,
    SdpRefused,
    answer_for_client,
    check_offer,
)

from .offers import AIORTC, CHROMIUM, CHROMIUM_PWD, aiortc_offer, host

MAX = 64 * 1024
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def candidates(sdp: str) -> list[str]:
    return [line for line in sdp.split("\r\n") if line.startswith("a=candidate:")]


# -- offers taken ---------------------------------------------------------------------------


@pytest.mark.parametrize("offer", [CHROMIUM, AIORTC], ids=["chromium", "aiortc"])
def test_a_browsers_and_aiortcs_offers_are_taken_unchanged(offer: str) -> None:
    assert check_offer(offer.encode(), max_bytes=MAX) == offer
    assert check_offer(offer.encode(), max_bytes=MAX, allow_peers=LOOPBACK) == offer


def test_an_offer_with_lf_endings_comes_back_with_crlf() -> None:
    lf = CHROMIUM.replace("\r\n", "\n")
    assert check_offer(lf.encode(), max_bytes=MAX) == CHROMIUM
    # Without a last line ending, too; blank lines at the end are dropped.
    assert check_offer(CHROMIUM.removesuffix("\r\n").encode(), max_bytes=MAX) == CHROMIUM
    assert check_offer((CHROMIUM + "\r\n").encode(), max_bytes=MAX) == CHROMIUM


def test_opus_is_found_whatever_its_case_payload_type_or_place() -> None:
    upper = CHROMIUM.replace("opus/48000/2", "OPUS/48000/2")
    assert check_offer(upper.encode(), max_bytes=MAX) == upper
    # Audio second, and Opus not the first format (an older data channel's form).
    old = AIORTC.replace(
        "m=application 60710 UDP/DTLS/SCTP webrtc-datachannel",
        "m=application 60710 DTLS/SCTP 5000\r\na=sctpmap:5000 webrtc-datachannel 1024",
    ).replace(
        "m=audio 60568 UDP/TLS/RTP/SAVPF 96 9 0 8", "m=audio 60568 UDP/TLS/RTP/SAVPF 9 0 8 96"
    )
    assert check_offer(old.encode(), max_bytes=MAX) == old


# -- refusals -------------------------------------------------------------------------------


def refusal(offer: bytes, max_bytes: int = MAX) -> tuple[int, str]:
    with pytest.raises(SdpRefused) as caught:
        check_offer(offer, max_bytes=max_bytes)
    return caught.value.status, caught.value.message


def test_an_offer_over_the_bound_is_413() -> None:
    size = len(CHROMIUM.encode())
    assert check_offer(CHROMIUM.encode(), max_bytes=size) == CHROMIUM
    assert refusal(CHROMIUM.encode(), size - 1) == (413, "the SDP offer is too large")


@pytest.mark.parametrize(
    "offer",
    [
        b"",
        b"\r\n",
        b"hello",
        b'{"type": "offer"}',
        CHROMIUM.replace("v=0", "v=1").encode(),
        CHROMIUM.replace("v=0\r\n", "").encode(),  # o= first
        CHROMIUM.replace("s=-", "s -").encode(),  # a line not x=...
        CHROMIUM.replace("s=-", "s=-\x00").encode(),
        CHROMIUM.replace("s=-\r\n", "s=-\r\n\r\n").encode(),  # a blank line inside
        CHROMIUM.replace("s=-\r\n", "s=-\rt=0 0\r\n").encode(),  # a bare CR
        CHROMIUM.encode().replace(b"s=-", b"s=\xff\xfe"),  # not UTF-8
        b"\xef\xbb\xbf" + CHROMIUM.encode(),  # a byte-order mark before v=0
    ],
)
def test_what_is_not_sdp_is_400(offer: bytes) -> None:
    assert refusal(offer) == (400, "not an SDP offer")


@pytest.mark.parametrize(
    "offer",
    [
        CHROMIUM.replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 G722/8000"),
        CHROMIUM.replace("opus/48000/2", "opus/24000/2"),  # not Opus at 48 kHz
        CHROMIUM.replace("111 63 9", "63 9"),  # mapped but not offered on the m= line
        CHROMIUM.replace("m=audio", "m=video"),
        CHROMIUM.replace("m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126", "m=audio 9"),
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=rtpmap:111 opus/48000/2\r\n",
    ],
)
def test_an_offer_without_opus_audio_is_400(offer: str) -> None:
    assert refusal(offer.encode()) == (400, "the offer has no Opus audio")


@pytest.mark.parametrize(
    "offer",
    [
        CHROMIUM.split("m=application")[0],  # audio only
        CHROMIUM.replace("webrtc-datachannel", "bfcp"),
        CHROMIUM.replace("m=application 9", "m=text 9"),
    ],
)
def test_an_offer_without_a_data_channel_is_400(offer: str) -> None:
    assert refusal(offer.encode()) == (400, "the offer has no data channel")


# -- candidates -----------------------------------------------------------------------------

MDNS = host("3f9e2b1a-6c4d-4e8f-9a0b-1c2d3e4f5a6b.local", 54321, "2930542637")
PUBLIC = host("203.0.113.7", 40000, "1111")
PRIVATE = host("192.168.1.23", 40001, "2222")
SCOPED = host("fe80::1%eth0", 40002, "3333")
NAME = host("peer.example.com", 40003, "4444")
TCP = "a=candidate:5555 1 tcp 1518280447 127.0.0.1 9 typ host tcptype active"
SHORT = "a=candidate:6666 1 udp 2130706431 127.0.0.1"
REFLEXIVE = (
    "a=candidate:7777 1 udp 1694498815 198.51.100.9 50000 typ srflx raddr 192.168.1.23 rport 40001"
)


def test_mdns_candidates_are_dropped_always() -> None:
    upper = host("3F9E2B1A-6C4D-4E8F-9A0B-1C2D3E4F5A6B.LOCAL", 54322, "2930542638")
    offer = aiortc_offer([MDNS, host("127.0.0.1", 60568)], [upper])
    kept = check_offer(offer.encode(), max_bytes=MAX)
    assert candidates(kept) == [host("127.0.0.1", 60568)]
    # Nothing else changes: the other lines, in order.
    assert kept == offer.replace(MDNS + "\r\n", "").replace(upper + "\r\n", "")


def test_without_allowed_peers_any_address_is_kept() -> None:
    lines = [PUBLIC, PRIVATE, SCOPED, NAME, TCP, REFLEXIVE]
    offer = aiortc_offer(lines, [])
    assert candidates(check_offer(offer.encode(), max_bytes=MAX)) == lines


def test_with_allowed_peers_only_their_addresses_are_kept() -> None:
    lines = [PUBLIC, PRIVATE, SCOPED, NAME, TCP, REFLEXIVE, host("127.0.0.1", 1), MDNS]
    offer = aiortc_offer(lines, [host("::1", 2)])
    allow = (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("192.168.0.0/16"),
        ipaddress.ip_network("fe80::/10"),
    )
    kept = candidates(check_offer(offer.encode(), max_bytes=MAX, allow_peers=allow))
    # A name is not an address allowed; ::1 is outside every network allowed.
    assert kept == [PRIVATE, SCOPED, TCP, host("127.0.0.1", 1)]
    v6 = (ipaddress.ip_network("::1/128"),)
    assert candidates(check_offer(offer.encode(), max_bytes=MAX, allow_peers=v6)) == [
        host("::1", 2)
    ]


def test_a_candidate_too_short_for_an_address_is_dropped() -> None:
    offer = aiortc_offer([SHORT, host("127.0.0.1", 60568)], [])
    assert candidates(check_offer(offer.encode(), max_bytes=MAX)) == [host("127.0.0.1", 60568)]


def test_the_offer_kept_is_one_aiortc_parses() -> None:
    sdp = pytest.importorskip("aiortc.sdp")
    offer = aiortc_offer([MDNS, PRIVATE, NAME], [host("127.0.0.1", 60710)])
    kept = check_offer(offer.encode(), max_bytes=MAX, allow_peers=LOOPBACK)
    parsed = sdp.SessionDescription.parse(kept)
    assert [m.kind for m in parsed.media] == ["audio", "application"]
    assert parsed.media[0].ice_candidates == []
    assert [c.ip for c in parsed.media[1].ice_candidates] == ["127.0.0.1"]


# -- the answer's advertised candidates -----------------------------------------------------

ANSWER_HOST = host("127.0.0.1", 35060)
ANSWER = aiortc_offer([ANSWER_HOST, REFLEXIVE], [ANSWER_HOST]).replace("actpass", "active")


def test_without_advertised_addresses_the_answer_is_unchanged() -> None:
    assert answer_for_client(ANSWER) is ANSWER


def test_each_host_candidate_gets_a_copy_per_advertised_address() -> None:
    out = answer_for_client(ANSWER, ("203.0.113.10", "2001:db8::10"))
    found = candidates(out)
    assert len(found) == 2 * 3 + 1  # per section: the host, its two copies; the srflx kept
    assert found[0] == ANSWER_HOST and found[3] == REFLEXIVE and found[4] == ANSWER_HOST
    base = ANSWER_HOST.split(" ")
    foundations = {base[0]}
    for copy, address in ((found[1], "203.0.113.10"), (found[2], "2001:db8::10")):
        fields = copy.split(" ")
        assert fields[1:3] == base[1:3]  # component, transport
        assert fields[4] == address and fields[5:] == base[5:]  # same port, typ host
        assert int(fields[3]) < int(base[3])
        foundations.add(fields[0])
    assert len(foundations) == 3
    assert found[5:7] == found[1:3]  # the same copies in the second section
    # Only candidate lines were added; CRLF endings throughout.
    assert [line for line in out.split("\r\n") if not line.startswith("a=candidate:")] == [
        line for line in ANSWER.split("\r\n") if not line.startswith("a=candidate:")
    ]
    assert "\n" not in out.replace("\r\n", "")


def test_the_advertised_answer_is_one_aiortc_parses() -> None:
    sdp = pytest.importorskip("aiortc.sdp")
    out = answer_for_client(ANSWER, ("203.0.113.10",))
    parsed = sdp.SessionDescription.parse(out)
    hosts = [(c.ip, c.port, c.type) for c in parsed.media[0].ice_candidates]
    assert hosts[:2] == [("127.0.0.1", 35060, "host"), ("203.0.113.10", 35060, "host")]
    priorities = [c.priority for c in parsed.media[0].ice_candidates]
    assert priorities[1] < priorities[0]


def test_an_advertised_address_that_is_the_hosts_own_adds_nothing() -> None:
    assert candidates(answer_for_client(ANSWER, ("127.0.0.1",))) == candidates(ANSWER)


def test_lf_endings_are_kept_in_the_answer() -> None:
    lf = ANSWER.replace("\r\n", "\n")
    out = answer_for_client(lf, ("203.0.113.10",))
    assert "\r" not in out and out.count("203.0.113.10") == 2


def test_an_advertised_address_must_be_an_ip() -> None:
    with pytest.raises(ValueError):
        answer_for_client(ANSWER, ("example.com",))


# -- fuzz -----------------------------------------------------------------------------------

SECRET = "Zk8uQ2vX7pL0aB3nR5tY9wE1"


def sdp_like() -> st.SearchStrategy[bytes]:
    """Lines of offers, shuffled, cut and mixed with noise; the ICE password is SECRET."""
    lines = [*CHROMIUM.split("\r\n"), *AIORTC.split("\r\n"), MDNS, PRIVATE, NAME, SHORT, TCP]
    lines = [line.replace(CHROMIUM_PWD, SECRET) for line in lines] + [f"a=ice-pwd:{SECRET}"]
    line = st.one_of(st.sampled_from(lines), st.text(max_size=40))
    ending = st.sampled_from(["\r\n", "\n", "\r", ""])
    text = st.lists(st.tuples(line, ending), max_size=60).map(
        lambda parts: "v=0\r\n" + "".join(a + b for a, b in parts)
    )
    return st.one_of(st.binary(max_size=400), text.map(lambda t: t.encode("utf-8", "replace")))


@given(offer=sdp_like(), peers=st.booleans())
def test_any_bytes_give_an_offer_or_a_fixed_refusal(offer: bytes, peers: bool) -> None:
    try:
        kept = check_offer(offer, max_bytes=2000, allow_peers=LOOPBACK if peers else ())
    except SdpRefused as refused:
        assert refused.message in MESSAGES and refused.status in (400, 413)
        assert SECRET not in str(refused) and SECRET not in repr(refused)
        lines = offer.decode("utf-8", "replace").splitlines()
        assert not any(len(line) > 8 and line in refused.message for line in lines)
        return
    assert isinstance(kept, str) and kept.startswith("v=0\r\n") and kept.endswith("\r\n")
    assert check_offer(kept.encode(), max_bytes=4000) == kept  # a kept offer is kept as is


@given(answer=sdp_like(), ips=st.lists(st.ip_addresses().map(str), max_size=3))
def test_any_answer_is_rewritten_without_an_exception(answer: bytes, ips: list[str]) -> None:
    text = answer.decode("utf-8", "replace")
    out = answer_for_client(text, tuple(ips))
    assert out.startswith(text.split("\n")[0])
    assert len(out.split("\n")) >= len(text.split("\n"))


def candidate_line() -> st.SearchStrategy[str]:
    address = st.one_of(
        st.ip_addresses().map(str),
        st.from_regex(r"[a-z0-9-]{1,12}\.(local|LOCAL|example)", fullmatch=True),
        st.text(alphabet="abc:.%1", min_size=1, max_size=8),
    )
    rest = st.sampled_from([" typ host", " typ srflx raddr 0.0.0.0 rport 9", "", " typ"])
    return st.builds(
        lambda a, p, r: f"a=candidate:1 1 udp 2130706431 {a} {p}{r}",
        address,
        st.integers(0, 65535),
        rest,
    )


@given(
    offer=st.sampled_from([CHROMIUM, AIORTC]),
    extra=st.lists(st.tuples(st.integers(8, 40), candidate_line()), max_size=8),
    peers=st.booleans(),
)
def test_kept_candidates_are_never_mdns_names_or_outside_the_peers(
    offer: str, extra: list[tuple[int, str]], peers: bool
) -> None:
    lines = offer.split("\r\n")
    for at, line in extra:
        lines.insert(min(at, len(lines) - 1), line)  # (before the last, empty line)
    allow = LOOPBACK if peers else ()
    kept = check_offer("\r\n".join(lines).encode(), max_bytes=MAX, allow_peers=allow)
    for line in candidates(kept):
        address = line.split()[4]
        assert not address.lower().endswith(".local")
        if peers:
            assert ipaddress.ip_address(address.partition("%")[0]) in LOOPBACK[0]
    dropped = [line for _, line in extra if line not in candidates(kept)]
    assert all(
        len(line.split()) < 8 or line.split()[4].lower().endswith(".local") or peers
        for line in dropped
    )
