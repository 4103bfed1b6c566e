"""``python -m supervisor``: the command line (see `supervisor.cli`)."""
from __future__ import annotations

import sys

from supervisor.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m supervisor"))
