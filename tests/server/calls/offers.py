"""Offers and answers as their clients write them, for the tests of sdp.py and of the
call endpoints' HTTP: Chromium's ``createOffer().sdp`` (what the agents SDK posts: no
candidate, Opus as payload type 111, BUNDLE, a data channel; written after its shape, not
captured: its ids and keys are made up) and aiortc 1.16's local description (Opus as 96,
its host candidates, end-of-candidates), printed by a real ``RTCPeerConnection`` and
pasted here."""

from __future__ import annotations

FINGERPRINT = (
    "a=fingerprint:sha-256 7B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35:"
    "DC:B8:5F:64:1A:24:C2:43:F0:A1:58:D0:A1:2C:19:08"
)
CHROMIUM_PWD = "9s1Hk0YJkL9t7nOhWOYb7uVz"
CHROMIUM = "\r\n".join(
    [
        "v=0",
        "o=- 4611731400430051336 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "a=group:BUNDLE 0 1",
        "a=extmap-allow-mixed",
        "a=msid-semantic: WMS 5f3b1c2e-8d7a-4b6f-9e0d-1a2b3c4d5e6f",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
        "c=IN IP4 0.0.0.0",
        "a=rtcp:9 IN IP4 0.0.0.0",
        "a=ice-ufrag:Zf0E",
        f"a=ice-pwd:{CHROMIUM_PWD}",
        "a=ice-options:trickle",
        FINGERPRINT,
        "a=setup:actpass",
        "a=mid:0",
        "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
        "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
        "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
        "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
        "a=sendrecv",
        "a=msid:5f3b1c2e-8d7a-4b6f-9e0d-1a2b3c4d5e6f 0a9b8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d",
        "a=rtcp-mux",
        "a=rtcp-rsize",
        "a=rtpmap:111 opus/48000/2",
        "a=rtcp-fb:111 transport-cc",
        "a=fmtp:111 minptime=10;useinbandfec=1",
        "a=rtpmap:63 red/48000/2",
        "a=fmtp:63 111/111",
        "a=rtpmap:9 G722/8000",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:13 CN/8000",
        "a=rtpmap:110 telephone-event/48000",
        "a=rtpmap:126 telephone-event/8000",
        "a=ssrc:2813642745 cname:q1Jm0eXkR2vB5sTz",
        "a=ssrc:2813642745 msid:5f3b1c2e-8d7a-4b6f-9e0d-1a2b3c4d5e6f "
        "0a9b8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "c=IN IP4 0.0.0.0",
        "a=ice-ufrag:Zf0E",
        f"a=ice-pwd:{CHROMIUM_PWD}",
        "a=ice-options:trickle",
        FINGERPRINT,
        "a=setup:actpass",
        "a=mid:1",
        "a=sctp-port:5000",
        "a=max-message-size:262144",
        "",
    ]
)

AIORTC_FINGERPRINT = (
    "a=fingerprint:sha-256 4D:03:63:47:47:FD:68:AA:D4:D7:47:AC:2D:A0:A5:F7:"
    "EF:6D:11:B3:AE:D4:CA:61:BB:FA:1B:F8:AE:26:88:57"
)


def aiortc_offer(audio: list[str], application: list[str]) -> str:
    """aiortc 1.16's offer, with these candidate lines in its two sections."""
    return "\r\n".join(
        [
            "v=0",
            "o=- 4005287282 4005287282 IN IP4 0.0.0.0",
            "s=-",
            "t=0 0",
            "a=group:BUNDLE 0 1",
            "a=msid-semantic:WMS *",
            "m=audio 60568 UDP/TLS/RTP/SAVPF 96 9 0 8",
            "c=IN IP4 127.0.0.1",
            "a=sendrecv",
            "a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid",
            "a=extmap:2 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
            "a=mid:0",
            "a=msid:6a1caa86-2898-46af-a758-87a01ecdf721 85f0d160-6891-41a5-8e92-878d2bb48c6b",
            "a=rtcp:9 IN IP4 0.0.0.0",
            "a=rtcp-mux",
            "a=ssrc:269944274 cname:835f553d-30ee-49a2-bc12-548bea8a4e3b",
            "a=rtpmap:96 opus/48000/2",
            "a=rtpmap:9 G722/8000",
            "a=rtpmap:0 PCMU/8000",
            "a=rtpmap:8 PCMA/8000",
            *audio,
            "a=end-of-candidates",
            "a=ice-ufrag:ENZd",
            "a=ice-pwd:p63Mk2MPfCpH1i5GzT6eHu",
            AIORTC_FINGERPRINT,
            "a=setup:actpass",
            "m=application 60710 UDP/DTLS/SCTP webrtc-datachannel",
            "c=IN IP4 127.0.0.1",
            "a=mid:1",
            "a=sctp-port:5000",
            "a=max-message-size:262144",
            *application,
            "a=end-of-candidates",
            "a=ice-ufrag:ENZd",
            "a=ice-pwd:p63Mk2MPfCpH1i5GzT6eHu",
            AIORTC_FINGERPRINT,
            "a=setup:actpass",
            "",
        ]
    )


def host(address: str, port: int, foundation: str = "16572de626da4e5384a0ce2d0d93678a") -> str:
    return f"a=candidate:{foundation} 1 udp 2130706431 {address} {port} typ host"


AIORTC = aiortc_offer([host("127.0.0.1", 60568)], [host("127.0.0.1", 60710)])
