"""The sans-IO protocol core: no I/O, no clock, no awaits, no trio.

Bytes, events and times go in; decisions, frames and events come out. The trio shells
(``trio_duplex.server``, ``trio_duplex.client``) only move data and keep time.

* ``events``: every event type, close code and reason, and a constructor per server event.
* ``wire``: JSON to and from the wire; ``ProtocolError``.
* ``frames``: RFC 6455 framing, server side.
* ``session``: a session's life, admission (``Registry``).
* ``protocol``: what each client event means on an open session (``ClientEvents``).
* ``replay``: what a resume writes before it commits.
* ``journal``, ``credentials``: the replay journal; resume tokens.
* ``limits``: ``Limits``, the few settings the rules read (the server's ``ServerConfig``
  hands them down).

Private to the package: import public names from ``trio_duplex``.
"""
