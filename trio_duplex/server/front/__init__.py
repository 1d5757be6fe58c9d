"""The front door: what a connection meets before it carries a session.

* ``accept``: ``Door``, the one accept loop of every listener, connection limits and
  their refusals, each connection's handshakes;
* ``listen``, ``tls``: the listening sockets (SO_REUSEPORT), TLS for ``wss://``;
* ``handshake``: the HTTP upgrade, and the plain HTTP answered before it;
* ``http``, ``metrics``, ``demo``: ``/healthz``, ``/readyz``, ``/metrics`` (and the
  ``--metrics-port`` listener), the Prometheus collector, the demo page's files;
* ``calls``: the HTTP of OpenAI's WebRTC call endpoints (``/v1/realtime/calls``: an
  offer in, the answer out, hang-ups, CORS), sans-IO;
* ``auth``, ``tokens``, ``throttle``: who may open or resume a session (API keys, the
  ``--auth`` verifier, client tokens, resume tokens), the bounded client tokens, the
  per-address throttle of failed credentials.
"""
