"""WebRTC media (issue 28, being built: docs/plans/webrtc.md). Only the framing between a
server and its media worker is here so far (``wire``); nothing serves a call yet."""
