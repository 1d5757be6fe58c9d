"""The trio server shell around the sans-IO core, in two wings.

* ``server``: ``DuplexServer``, which composes the wings and owns their lifetimes.
* ``config``: ``ServerConfig``, every setting of a server and the ``serve`` flags its
  fields define; it hands the core its ``Limits``. ``config_checks``: what each value
  must be.
* ``front/``: the front door: the accept loop, listeners and TLS, connection limits,
  the HTTP upgrade and the plain HTTP answered before it (client tokens, health,
  metrics, the demo page), who may open a session (auth).
* ``sessions/``: the session shell: a connection's first message, opening and resuming
  (``opening``), ``Sessions`` (the owner of every session's runner, deadline and the
  drain), the points at which it asks cluster mode (``placement``), one session's
  engine task (``runner``), one connection's lifetime (``connection``) on its WebSocket
  (``websocket``), every deadline in one task (``timers``), the blocked-loop warning
  (``watchdog``).

Cluster mode (``trio_duplex.cluster``) sits beside this package, and the worker
supervisor (``trio_duplex.workers``) beside the CLI.

Private to the package: import ``DuplexServer`` from ``trio_duplex``.
"""
