"""One process of the regroup job (issue 32): ``python -m tests.distributed.regroup_worker ROLE
LOGDIR_A LOGDIR_B PORT_A PORT_B``. A ``veteran`` trains in group A (with a ``helper``), leaves
it, then trains in group B with a ``newcomer`` that never saw group A: their histories differ
(the veteran created one more session and agreement), and they must still meet on the same
store keys in group B. Prints ``RESULT <json>`` of its group-B session."""
from __future__ import annotations

import logging
import os
import sys

from supervisor import distributed
from tests.distributed.worker import _ddp_session, emit


def _train_in_group(rank: int, port: str, logdir: str) -> dict:
    os.environ.update(MASTER_PORT=port, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    distributed.init_process_group("gloo", timeout_secs=60)
    try:
        return _ddp_session(logdir, "3", max_wait="20")
    finally:
        distributed.destroy_process_group(timeout_secs=30)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    role, logdir_a, logdir_b, port_a, port_b = sys.argv[1:]
    if role in ("veteran", "helper"):
        _train_in_group(0 if role == "veteran" else 1, port_a, logdir_a)
    if role in ("veteran", "newcomer"):
        emit(_train_in_group(0 if role == "veteran" else 1, port_b, logdir_b))


if __name__ == "__main__":
    main()
