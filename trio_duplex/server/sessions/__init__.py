"""The session shell: sessions in trio, around the sans-IO core.

* ``owner``: ``Sessions``, the one owner of every session (registry, runners, timers,
  drain) and the ``Observer`` hook;
* ``opening``: ``Opener``, a connection from its first message to its session (opened
  or resumed, by the core's opening rules), then its reading;
* ``placement``: ``Placement``, the points at which the shell asks cluster mode;
* ``runner``: ``SessionRunner``, one session's engine task and its attachment;
* ``connection``, ``transport``, ``websocket``, ``faults``: one connection's lifetime,
  byte-bounded outbox, pump and keepalive; what it asks of its transport
  (``MessageTransport``); the WebSocket it speaks after the upgrade; client faults
  logged once per connection, rate-limited;
* ``timers``, ``watchdog``: every deadline in one task; the thread that warns of a
  blocked event loop.
"""
