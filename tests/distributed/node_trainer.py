"""examples/ddp_torchrun.py on one "node" of a two-agent torchrun job: the first time it runs on
group rank 1 it kills its own agent and itself after step ``S`` (``SUPERVISOR_TEST_NODE_KILL=S``;
``SUPERVISOR_TEST_NODE_MARK``: a file recording that the node died once), as a node lost with its
agent; the replacement node's agent then starts with restart count 0."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.ddp_torchrun import main  # noqa: E402
from supervisor import Hook  # noqa: E402


class NodeLoss(Hook):
    def __init__(self, step: int, mark: str) -> None:
        self.step, self.mark = step, mark

    def after_run(self, run_context, run_values) -> None:
        if run_context.session.global_step == self.step:
            with open(self.mark, "w") as f:
                f.write("lost")
            print(f"node of group rank 1 lost after step {self.step}", flush=True)
            os.kill(os.getppid(), signal.SIGKILL)  # its agent
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    hooks = []
    mark = os.environ["SUPERVISOR_TEST_NODE_MARK"]
    if os.environ.get("GROUP_RANK") == "1" and not os.path.exists(mark):
        hooks.append(NodeLoss(int(os.environ["SUPERVISOR_TEST_NODE_KILL"]), mark))
    main(sys.argv[1:], extra_hooks=hooks)
