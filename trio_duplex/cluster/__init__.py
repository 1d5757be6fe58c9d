"""Cluster mode: what nodes share through Redis, and this process as a node.

* the shared store, loaded only with ``--cluster`` (it imports the Redis client):
  ``keys`` (key names and Lua scripts, sans-IO), ``signed`` (the seals every value is
  checked by), ``leases`` (what a node remembers of its peers' lease counts), ``store``
  (membership, the session directory, admission leases, handed-over sessions),
  ``connect`` (the connection to Redis or its Sentinels);
* the node: ``node`` (registration, heartbeat, directory, cluster-wide admission),
  ``relay`` (a resume relayed to the session's home node), ``migration`` (sessions
  handed over on a drain and taken over on a resume).

This package imports nothing on its own, so that importing one of its modules loads only
what that module needs.
"""
