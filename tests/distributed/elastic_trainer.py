"""examples/ddp_torchrun.py with a kill point: in torchrun's first attempt only, rank ``R`` is
SIGKILLed after step ``S`` (``SUPERVISOR_TEST_KILL=R:S``), so torchrun restarts every rank."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.ddp_torchrun import main  # noqa: E402
from supervisor import Hook  # noqa: E402


class KillHook(Hook):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def after_run(self, run_context, run_values) -> None:
        if run_context.session.global_step == self.step and int(os.environ["RANK"]) == self.rank:
            print(f"killing rank {self.rank} after step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    kill = os.environ.get("SUPERVISOR_TEST_KILL")
    hooks = []
    if kill and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        rank, step = kill.split(":")
        hooks.append(KillHook(int(rank), int(step)))
    main(sys.argv[1:], extra_hooks=hooks)
