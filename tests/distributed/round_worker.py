"""A rank whose torchrun restart count is its own (``SUPERVISOR_TEST_RESTART_COUNTS``: one per
rank, comma-separated), as on a replaced node whose agent counts from 0 while the others' are at
1: ``python -m tests.distributed.round_worker SCENARIO ...`` (worker.py's scenarios)."""
from __future__ import annotations

import os

from tests.distributed import worker


def main() -> None:
    counts = os.environ["SUPERVISOR_TEST_RESTART_COUNTS"].split(",")
    os.environ["TORCHELASTIC_RESTART_COUNT"] = counts[int(os.environ["RANK"])]
    worker.main()


if __name__ == "__main__":
    main()
