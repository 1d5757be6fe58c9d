"""A call's SDP on its way in and out (sans-IO; docs/plans/webrtc.md §1.4, §2.4).

In: ``check_offer`` refuses, before a media worker is asked, an offer the worker could
not answer as a call needs (no Opus audio, no data channel), or that is not SDP at all,
and drops the remote candidates aioice must not be given: mDNS names (``*.local``:
resolving one multicasts to 224.0.0.251) and, with ``--call-allow-peer``, addresses
outside the allowed networks. Peer-reflexive discovery covers both: a browser's
candidate-less offer (``createOffer().sdp``, what the agents SDK posts) connects through
the checks its peer sends. The worker strips the same candidates again
(``_worker.strip_candidates``), a second line behind this one.

Out: ``answer_for_client`` adds, with ``--call-advertise IP`` (1:1 NAT: EC2, a docker
host network), a copy of each host candidate of the worker's answer with that address:
aioice can neither advertise an address it does not hold nor be given one.

Every refusal's message is fixed text: an offer holds its ICE password
(``a=ice-pwd``), and a line quoted back would carry it into a log.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable

import attrs

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NOT_SDP = "not an SDP offer"
NO_OPUS = "the offer has no Opus audio"
NO_DATA_CHANNEL = "the offer has no data channel"
TOO_LARGE = "the SDP offer is too large"
MESSAGES = frozenset({NOT_SDP, NO_OPUS, NO_DATA_CHANNEL, TOO_LARGE})
"""Every message an ``SdpRefused`` may carry."""

_LINE = re.compile(r"[a-zA-Z]=[^\x00-\x08\x0a-\x1f\x7f]*")
"""An SDP line (RFC 8866 §5: ``<type>=<value>``), no control character but tab in it."""
_RTPMAP = re.compile(r"a=rtpmap:([0-9]{1,3}) ([^/ ]+)/([0-9]+)(?:/[0-9]+)?\s*")
"""``a=rtpmap:<payload type> <encoding>/<clock rate>[/<channels>]``."""


@attrs.frozen
class SdpRefused(Exception):
    """An offer refused: 400 (not one a call can answer) or 413 (too large), with a
    fixed message (never a line of the offer)."""

    status: int
    message: str


def check_offer(offer: bytes, *, max_bytes: int, allow_peers: tuple[Network, ...] = ()) -> str:
    """The offer (UTF-8, CRLF line endings; LF-only input is taken) without the
    candidates aioice must not use: mDNS names, and addresses outside ``allow_peers``
    when it is given. A candidate line too short to hold an address is dropped too
    (aiortc would refuse the offer for it; prflx covers its peer).

    SdpRefused: 413 over ``max_bytes``; 400 for bytes that are not an SDP offer (not
    UTF-8, a first line other than ``v=0``, a line not ``x=...``), an offer with no
    ``m=audio`` section offering ``opus/48000``, or none with a ``webrtc-datachannel``
    ``m=application`` section."""
    if len(offer) > max_bytes:
        raise SdpRefused(413, TOO_LARGE)
    try:
        text = offer.decode("utf-8")
    except UnicodeDecodeError:
        raise SdpRefused(400, NOT_SDP) from None
    lines = text.split("\n")
    while lines and lines[-1] in ("", "\r"):  # the last line's ending
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not lines or lines[0] != "v=0" or not all(_LINE.fullmatch(line) for line in lines):
        raise SdpRefused(400, NOT_SDP)
    sections = _sections(lines)
    if not any(_has_opus(section) for section in sections):
        raise SdpRefused(400, NO_OPUS)
    if not any(_has_data_channel(section) for section in sections):
        raise SdpRefused(400, NO_DATA_CHANNEL)
    kept = [line for line in lines if not _dropped(line, allow_peers)]
    return "\r\n".join(kept) + "\r\n"


def _sections(lines: list[str]) -> list[list[str]]:
    """The media sections, each from its ``m=`` line to the next (the session part,
    before the first, is left out)."""
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return sections


def _has_opus(section: list[str]) -> bool:
    """An ``m=audio`` section whose formats include one mapped to ``opus/48000``."""
    fields = section[0][2:].split(" ")
    if fields[0] != "audio" or len(fields) < 4:
        return False
    formats = set(fields[3:])
    for line in section[1:]:
        match = _RTPMAP.fullmatch(line)
        if (
            match is not None
            and match[1] in formats
            and match[2].lower() == "opus"
            and match[3] == "48000"
        ):
            return True
    return False


def _has_data_channel(section: list[str]) -> bool:
    """An ``m=application`` section of SCTP data channels: ``UDP/DTLS/SCTP
    webrtc-datachannel`` (RFC 8841), or the older ``DTLS/SCTP 5000`` with
    ``a=sctpmap:5000 webrtc-datachannel ...``."""
    fields = section[0][2:].split(" ")
    if fields[0] != "application":
        return False
    if "webrtc-datachannel" in fields[3:]:
        return True
    return any(
        line.startswith("a=sctpmap:") and "webrtc-datachannel" in line.split(" ")[1:2]
        for line in section[1:]
    )


def _dropped(line: str, allow_peers: tuple[Network, ...]) -> bool:
    """Is this a candidate line aioice must not see?"""
    if not line.startswith("a=candidate:"):
        return False
    fields = line.split()
    if len(fields) < 8:  # foundation component transport priority address port typ type
        return True
    address = fields[4]
    if address.lower().endswith(".local"):
        return True
    return bool(allow_peers) and not _allowed(address, allow_peers)


def _allowed(address: str, allow_peers: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # (a scoped IPv6: its scope)
    except ValueError:  # a name: aioice would resolve it
        return False
    return any(ip in network for network in allow_peers)


def answer_for_client(answer: str, advertise: tuple[str, ...] = ()) -> str:
    """The worker's answer as the client gets it: after each host candidate, a copy
    per advertised IP (same component, transport and port; its own foundation, as
    aioice makes one, from the type, transport and address; a lower priority: its local
    preference one less per IP, so the real address is tried first). Line endings are
    kept; without ``advertise`` the answer is returned as it is.

    ValueError: an advertised address that is not an IP (the configuration's fault)."""
    if not advertise:
        return answer
    for ip in advertise:
        ipaddress.ip_address(ip)
    out: list[str] = []
    for piece in answer.split("\n"):
        out.append(piece)
        line = piece.removesuffix("\r")
        ending = piece[len(line) :]
        fields = line.split(" ")
        if not line.startswith("a=candidate:") or len(fields) < 8 or fields[6:8] != ["typ", "host"]:
            continue
        if not (fields[3].isascii() and fields[3].isdigit()):
            continue
        priority = int(fields[3])
        for rank, ip in enumerate(advertise, 1):
            if ip == fields[4]:
                continue
            foundation = hashlib.md5(
                f"advertised|{fields[2].lower()}|{ip}".encode(), usedforsecurity=False
            ).hexdigest()
            copy = [
                "a=candidate:" + foundation,
                fields[1],
                fields[2],
                str(max(0, priority - 256 * rank)),
                ip,
                *fields[5:],
            ]
            out.append(" ".join(copy) + ending)
    return "\n".join(out)


__all__ = ["MESSAGES", "SdpRefused", "answer_for_client", "check_offer"]
