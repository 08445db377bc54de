"""``python -m benchmarks.first_step``: see :mod:`benchmarks.first_step` and benchmarks/README.md."""

import signal
import sys

from benchmarks.first_step.cli import main

if __name__ == "__main__":
    # Stopped from outside (`timeout`): unwind, so that the workers, which run in sessions of their
    # own, are ended too; the JSON keeps what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
