"""examples/ddp_torchrun.py with a kill point: in torchrun's first attempt only, rank ``R`` is
SIGKILLed after step ``S`` (``SUPERVISOR_TEST_KILL=R:S``), so torchrun restarts every rank; or
sent SIGTERM (``SUPERVISOR_TEST_SIGTERM=R:S``, a preemption)."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.ddp_torchrun import main  # noqa: E402
from supervisor import Hook  # noqa: E402


class KillHook(Hook):
    def __init__(self, rank: int, step: int, signum: int = signal.SIGKILL) -> None:
        self.rank, self.step, self.signum = rank, step, signum

    def after_run(self, run_context, run_values) -> None:
        if run_context.session.global_step == self.step and int(os.environ["RANK"]) == self.rank:
            name = "killing" if self.signum == signal.SIGKILL else "sending SIGTERM to"
            print(f"{name} rank {self.rank} after step {self.step}", flush=True)
            os.kill(os.getpid(), self.signum)


if __name__ == "__main__":
    kill = os.environ.get("SUPERVISOR_TEST_KILL")
    hooks = []
    if kill and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        rank, step = kill.split(":")
        hooks.append(KillHook(int(rank), int(step)))
    term = os.environ.get("SUPERVISOR_TEST_SIGTERM")
    if term:
        rank, step = term.split(":")
        hooks.append(KillHook(int(rank), int(step), signal.SIGTERM))
    main(sys.argv[1:], extra_hooks=hooks)
