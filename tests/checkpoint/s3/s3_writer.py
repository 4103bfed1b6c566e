"""A checkpoint writer on an ``s3://`` logdir that SIGKILLs itself at a chosen point of a save
(tests/checkpoint/s3/test_manager_s3.py). The library runs unmodified; the storage object the manager holds
is wrapped, in this process only, to decide *when* it dies.

    python tests/checkpoint/s3/s3_writer.py ENDPOINT s3://bucket/logdir --die-before-manifest-of 2
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("logdir")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--die-before-manifest-of", type=int, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    state = TrainingState.from_arguments(model=model)
    manager = CheckpointManager(args.logdir, storage_options=options(args.endpoint), save_mode="sync")
    fatal = f"model.ckpt-{args.die_before_manifest_of}/MANIFEST.json"
    create_exclusive = manager.storage.create_exclusive

    def dying_create(path: str, data: bytes):
        if path.endswith(fatal):
            print(f"killing before {path}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return create_exclusive(path, data)

    manager.storage.create_exclusive = dying_create  # type: ignore[method-assign]
    manager.open()
    for step in range(1, args.steps + 1):
        with torch.no_grad():
            model.weight.add_(1.0)
        manager.save(step, state)
        print(f"committed {step}", flush=True)
    manager.close()


if __name__ == "__main__":
    main()
