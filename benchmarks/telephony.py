"""``python -m benchmarks.telephony [--quick] [--nice -10]``: the suite's scenario 10 alone,
phone calls through the fake Twilio against WebSocket μ-law voice sessions per core
(``benchmarks/suite/_telephony.py``); the same as ``python -m benchmarks --only 10``.
"""

import sys

from benchmarks.suite.main import main

if __name__ == "__main__":
    sys.exit(main(["--only", "10", *sys.argv[1:]]))
