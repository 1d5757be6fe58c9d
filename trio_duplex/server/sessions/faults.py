"""Client faults in the log: said, but never a flood, never at ERROR, never a traceback.

A client that breaks the protocol (bad JSON, a bad frame, an over-size message, a
request that is not an upgrade, output it does not read) is answered as
docs/protocol.md says; the operator hears of it here, at INFO: at most one line per
connection (its first fault), and at most ``rate`` lines a second over the whole
process (a token bucket of ``burst``). Lines left out are counted, and the next line
that gets through says how many. Nothing the client sent is quoted beyond the fault's
own short description, so no secret or payload reaches the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("trio_duplex")


class FaultLog:
    __slots__ = ("_burst", "_clock", "_rate", "_stamp", "_tokens", "suppressed")

    def __init__(
        self, rate: float = 10.0, burst: float = 20.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()
        self.suppressed = 0
        """Faults not logged for the rate since the last line that was."""

    def reset(self) -> None:
        """A full bucket and nothing left out (a test's fresh start)."""
        self._tokens = self._burst
        self._stamp = self._clock()
        self.suppressed = 0

    def report(self, where: object, fault: str) -> None:
        """Log ``fault`` of the client on ``where`` (a connection), if the rate allows."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens < 1:
            self.suppressed += 1
            return
        self._tokens -= 1
        if self.suppressed:
            log.info(
                "client fault on %s: %s (%d more left out for the rate)",
                where,
                fault,
                self.suppressed,
            )
            self.suppressed = 0
        else:
            log.info("client fault on %s: %s", where, fault)


FAULTS = FaultLog()
"""The process's fault log: the rate is the log's, and the log is the process's."""


__all__ = ["FAULTS", "FaultLog"]
