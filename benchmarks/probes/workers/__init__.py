"""``serve --workers 2`` against ``--workers 1`` (docs/cluster.md, "Worker processes"),
both in cluster mode against a local redis-server started here. Three parts, each
honest on a machine whose cores the load generator shares:

    python -m benchmarks.workers [--quick] [--realtime] [--rounds 3]
                                 [--sessions 0,30,60,90] [--own-sessions 30,45]
                                 [--split-sessions 100,400,1000] [--split-rounds 2]
                                 [--capacity-rounds 1] [--parts cpu,own,split,capacity]
                                 [--report JSON]

About 5 minutes with the defaults (5-6 while other work takes most of this 2-core
machine; ``--quick``: about 2). As root, ``--realtime`` is the recommended run.

1. **CPU per voice session** (``cpu``). Scenario 3's load generator
   (``benchmarks.suite.clients.asyncio_ws voice``, protocol v2's binary lane: each
   session sends a 20 ms frame every 20 ms and times its echo) holds a fixed number of
   sessions (``--sessions``, each a measured window of ``--measure`` seconds; 0: the
   workers idle) against ``--workers 1`` and ``--workers 2`` in turn, ``--rounds``
   interleaved rounds (1, 2, then 2, 1, ...), nothing pinned. The figure is the workers'
   CPU (psutil, user + system, summed over the workers; the supervisor's own is shown
   apart) over the window, per session and second of wall time; the ratio 2/1 is taken
   per round (the two servers measured a minute apart at most) and shown as its median
   with min-max. CPU *time* is what the process used, whoever else ran meanwhile, so
   sharing cores moves it less than it moves latency; but an event loop's cost per event
   falls as more events share one wake-up (each worker's context switches per echo are
   recorded), and a loop that is starved of CPU, or carries more sessions, batches more.
   So: the verdict counts only rounds where both servers held p99 ≤ 20 ms (below the
   knee), and a second table compares the same load *per worker* (``--workers 2`` at 2N
   sessions against ``--workers 1`` at N), which is what decides how many sessions a
   worker per core holds.
1b. **A worker on a core of its own** (``own``). What decides how capacity scales: worker
   0 of ``--workers 2`` alone on core 0 (its affinity set once it is up), the other
   worker, the load generator and redis-server on the other core(s), against
   ``--workers 1`` alone on core 0 with the rest elsewhere, in the same interleaved
   rounds. ``--workers 2`` carries 2N sessions (``--own-sessions`` gives N) so that worker
   0 holds about N: its CPU over its own sessions (counted as in part 2) against
   ``--workers 1``'s at as many sessions, read off ``--workers 1``'s steps around N
   (piecewise linear). This is the one comparison here in which both sides have a core
   that neither the load generator nor another worker uses.
2. **The split** (``split``). How many sessions each worker took, read from each worker:
   its established TCP connections on the served port (its file descriptors' sockets
   found established in /proc/net/tcp; each connection carries one session), at every
   measured window of part 1 and in ``--split-rounds`` rounds of ``asyncio_ws idle``
   opening ``--split-sessions`` sessions on one ``--workers 2`` server. The deviation of a
   round is the largest ``|count - N/W|`` over ``N/W``; the verdict is ±10 %. The kernel
   picks a listener by a hash of the connection's addresses and ports (with a per-boot
   secret), so each connection is, in effect, a fair coin: the table shows beside each
   row how often a fair coin per connection lands within ±10 % at that N (exact
   binomial, W = 2), and the pooled share with its z score says whether the hash leans
   towards one worker.
3. **Capacity with cores** (``capacity``). Scenario 3's ramp (the largest N whose p99,
   unanswered frames counted with their age, stays ≤ 20 ms with nothing lost) with the
   load generator (and redis-server) pinned to cores of its own and each
   configuration's workers to the rest: on C cores, ``--workers W`` gets cores
   0..min(W, C - 1) - 1 and the load generator the others. On a 2-core machine both
   configurations get core 0 (one core: what two workers cost where one would do) and
   the figure for two workers on two cores is an extrapolation from the three measured
   figures (one worker's sessions per core, the CPU ratio of part 1, the split's
   deviation), printed and labelled as such. On a machine with more cores than W the
   same command measures it (one load-generator process: about 150 voice sessions are
   its own limit on one core, so watch its CPU column).

As root the servers run at ``--server-nice -10`` and the load generator at
``--client-nice -5`` (both ahead of the rest of the machine; otherwise 0 and 5), and every
part records what other processes took of the machine meanwhile (/proc/stat) and the
1-minute load average.

The modules: ``__main__`` (the command line, the rounds, the record), ``cpu`` (part 1, and
the run part 1b measures with), ``own`` (part 1b's steps and table), ``split`` (part 2),
``capacity`` (part 3), ``procs`` (the servers and the load generator's command line) and
``tables`` (what the tables share).
"""
