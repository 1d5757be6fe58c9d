"""The simulation kit's implementation, one concern per module.

Import it from ``trio_duplex.testing``, which re-exports the public names; these modules
are private and may move.

* ``transport``: ``FaultyStream`` and ``MemoryListener``, the in-memory wire with faults.
* ``client``: ``SimClient``, a JSON WebSocket client of the simulated server.
* ``engine``: ``ScriptedEngine`` and ``ScriptedFactory``, an engine the test drives.
* ``probe``: ``Probe`` and ``probing``, the spies that record terminal events and check
  invariants after every scheduler step.
* ``scheduler``: ``settle``, ``all_tasks`` and ``CancelAtStep``, for stepping trio's
  scheduler.
* ``simulation``: ``Simulation`` and ``running_server``, which put the parts together.
"""
