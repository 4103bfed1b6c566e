"""Read-once restores (issue 31) on 4 real gloo ranks, the bytes each rank reads from the
checkpoint's files counted from outside (strace, `traced`): a replicated ``state.pt`` checkpoint
is read from storage once per job (the chief) and broadcast, bit-exactly, every rank getting its
own RNG stream back."""
from __future__ import annotations

import os

import pytest
import torch

from .harness import describe, run_job
from .traced import run_traced, strace_works

MODULE = "tests.distributed.read_once_worker"
W = 4

pytestmark = pytest.mark.skipif(not strace_works(), reason="strace -P cannot trace here (no ptrace)")


def _files(path: str) -> list[str]:
    return sorted(os.path.realpath(os.path.join(path, f)) for f in os.listdir(path))


def _checkpoint_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in _files(path))


def _expected_draw(payload: dict, rank: int) -> list[float]:
    from supervisor.rng import restore_rng_state

    restore_rng_state(payload["rng"][rank])
    return torch.rand(2).tolist()


@pytest.mark.slow
def test_a_replicated_restore_reads_the_checkpoint_once_and_every_rank_gets_it_bit_exactly(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("read_once", W, logdir, "3", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in first), describe(first)
    path = os.path.join(logdir, "model.ckpt-3")
    size = _checkpoint_bytes(path)
    assert size > 1 << 20  # the payload, not the manifest, is what is counted

    second, read = run_traced(MODULE, "read_once", W, [logdir, "4"], _files(path), str(tmp_path))
    assert all(r.returncode == 0 for r in second), describe(second)
    assert [r.result["start"] for r in second] == [3] * W
    payload = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    model.load_state_dict(payload["model"])
    from .read_once_worker import _digest

    assert {r.result["digest"] for r in second} == {_digest(model)}  # bit-exact on every rank
    for r in second:  # each rank's own RNG stream, as saved
        assert r.result["first_draw"] == _expected_draw(payload, r.rank), f"rank {r.rank}"
    # read once per job: the chief reads the checkpoint (manifest included) once, nobody else
    assert read[0] >= size, (read, size)
    assert sum(read) <= 1.05 * size, f"{sum(read) / size:.2f}x the checkpoint read: per rank {read} of {size}"
    assert read[1:] == [0] * (W - 1), read
