"""``python -m reproduce.evidence <subcommand> ...``: run one claim (see `reproduce.evidence`)."""

import sys

from reproduce.evidence.cli import main

if __name__ == "__main__":
    sys.exit(main())
