"""WebRTC media (issue 28, being built: docs/plans/webrtc.md): the framing between a
server and its media worker (``wire``), the contract between a call's shell and the link
(``port``), the trio side that runs the worker and multiplexes calls over it (``link``), and
the worker itself (``_worker.py``, aiortc under asyncio: a process of its own, never
imported). Nothing serves a call yet: the call shell and the front door are other parts."""
