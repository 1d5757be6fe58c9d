"""The suite, ``python -m benchmarks``: eight scenarios, trio-duplex against bare
baselines (trio-websocket, ``websockets``, Socket.IO) and its OpenAI dialect against its
native one, interleaved, reported as ratios.

``main`` is the command; ``_plan`` its budgets, ``_scenarios`` scenarios 1-7,
``_dialects`` scenario 8, ``_suite``
the servers and load generators they start, ``_procs`` process control and machine
readings, ``_stats`` percentiles, ratios and the table, ``_workload`` the frames every
client sends, ``report`` the table and plot from a results file. ``clients/`` are the
load generators, ``servers/`` the bare baselines, ``peer/`` the Socket.IO server and
client (Node).
"""
