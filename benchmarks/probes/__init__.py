"""The benchmarks beside the suite, each its own command (docs/benchmarks.md, "Running
them"): instructions per event, profiles, audio on the wire and its codecs, a flooding
client, the soak, cluster mode, worker processes, the realtime proxy, asyncio engines and
the speech engine. They build on the suite's process control and statistics
(``benchmarks.suite``); ``clients/`` holds their own load generators.
"""
