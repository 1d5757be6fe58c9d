"""Benchmarks for trio-duplex: what the protocol costs, measured against bare baselines.

Run from the repository root::

    python -m benchmarks            # full suite, under 10 minutes on 2 cores
    python -m benchmarks --quick    # under 2 minutes

Every figure is a ratio against a baseline run in the same invocation, interleaved
(A B A B ...), reported as the median with min-max. See docs/benchmarks.md.

``suite/`` is the suite, ``probes/`` the other benchmarks; each module here is the
command that runs one of them (``python -m benchmarks.soak`` runs ``probes/soak.py``).
"""
