"""The trio server shell around the sans-IO core.

* ``server``: ``DuplexServer``: listeners, the WebSocket handshake, opening and resuming.
* ``sessions``: ``Sessions``, the owner of every session's runner, deadline and the drain.
* ``runner``: ``SessionRunner``, one session's engine task and its attachment.
* ``connection``: ``Connection``, one WebSocket's lifetime, outbox, pump and keepalive.
* ``websocket``: the server side of a WebSocket on a trio stream.
* ``timers``: one task for every deadline of the server.

Private to the package: import ``DuplexServer`` from ``trio_duplex``.
"""
