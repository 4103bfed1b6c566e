"""A checkpoint writer on an ``s3://`` logdir that SIGKILLs itself in the middle of a multipart
upload (tests/checkpoint/s3/test_kill_mid_upload.py): step 1 is committed, then during the save of
step 2 the process dies right after its ``--parts``-th part upload came back. The library runs
unmodified; the storage object the manager holds is wrapped, in this process only, to count.

    python tests/checkpoint/s3/upload_killer.py ENDPOINT s3://bucket/logdir --parts 3
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

PART_SIZE = 5 << 20  # S3's (and moto's) smallest part but the last


def model() -> torch.nn.Module:
    """64 MiB of float32 weights, the same in the test that checks the resume."""
    torch.manual_seed(0)
    return torch.nn.Linear(4096, 4096, bias=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("logdir")
    parser.add_argument("--parts", type=int, required=True)
    args = parser.parse_args()
    net = model()
    state = TrainingState.from_arguments(model=net)
    manager = CheckpointManager(args.logdir, save_mode="sync",
                                storage_options={**options(args.endpoint), "part_size": PART_SIZE})
    manager.open()
    manager.save(1, state)
    print("committed 1", flush=True)
    real_call, lock, done = manager.storage.call, threading.Lock(), [0]

    def dying_call(method: str, path: str, **kwargs):
        result = real_call(method, path, **kwargs)
        if method == "upload_part":
            with lock:
                done[0] += 1
                if done[0] >= args.parts:
                    print(f"killing after part {done[0]} of {path}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
        return result

    manager.storage.call = dying_call  # type: ignore[method-assign]
    with torch.no_grad():
        net.weight.add_(1.0)
    manager.save(2, state)
    print("committed 2 (should not happen)", flush=True)


if __name__ == "__main__":
    main()
