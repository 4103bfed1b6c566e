"""An evaluator reads sharded (``checkpoint_format="dcp"``) checkpoints as it reads ``state.pt``
ones (SPEC §10.4, §12: "into a non-distributed model for evaluation"): every file opened first,
read once and checksummed, assembled in one process, unpickling restricted. Checkpoints written
by 2 and 3 ranks (FSDP2, DTensor) are read in tests/distributed/test_dcp.py."""
from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

from supervisor import MonitoredTrainingSession, latest_checkpoint
from supervisor.checkpoint.sharded import load_into
from supervisor.checkpoint.formats.dcp_reading import read_metadata
from supervisor.checkpoint.load.loader import read_checkpoint
from supervisor.errors import CheckpointCorruptError, CheckpointError
from supervisor.estimator.evaluation import StopReason
from supervisor.estimator.sidecar import SidecarEvaluator
from tests.estimator.sidecar_helpers import (
    float32_weight_of,
    make_model,
    weight_metrics,
    weight_of,
)
from tests.estimator.test_sidecar_reading import files_size, rewrite_manifest_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Counter:
    """A training-state entry whose state holds an instance of a class of this test module."""

    def __init__(self) -> None:
        self.value = Box(0)

    def state_dict(self) -> dict:
        return {"box": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["box"]


class Box:
    def __init__(self, n: int) -> None:
        self.n = n


def train_sharded(logdir: str, steps: int = 12, *, every: int = 4, extra: dict | None = None,
                  trusted_globals: tuple = ()) -> torch.nn.Module:
    """A one-process run with checkpoint_format="dcp"; at step N every parameter is weight_of(N)."""
    model = make_model(8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def step(n: int) -> dict:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(weight_of(n))
        return {"loss": 0.0}

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, state=extra, checkpoint_format="dcp",
                                      save_checkpoint_steps=every, save_checkpoint_secs=None, max_to_keep=None,
                                      save_summaries_steps=None, log_step_count_steps=None,
                                      init_fn=lambda s: step(0), trusted_globals=trusted_globals) as s:
            while s.global_step < steps:
                s.run(step, s.global_step + 1)
    return model


def test_the_sidecar_evaluates_a_sharded_run_and_stops_when_it_finished(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir)
    assert os.path.exists(os.path.join(latest_checkpoint(logdir), ".metadata"))  # DCP's files, no state.pt
    evaluator = SidecarEvaluator(make_model(8), [None], logdir, eval_step=weight_metrics, timeout=60)
    results = evaluator.start()
    assert evaluator.stop_reason == StopReason.FINISHED
    assert [r.step for r in results] == [12]  # the newest, then the run's finished mark
    assert results[0].metrics == {"w": float32_weight_of(12), "spread": 0.0, "global_step": 12}
    assert evaluator.stats.corrupt == 0
    assert all(torch.all(p == float32_weight_of(12)) for p in evaluator.model.parameters())


def test_a_sharded_checkpoint_reads_once_into_the_payload_load_into_gives(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=8)
    path = os.path.join(logdir, "model.ckpt-8")
    read = read_checkpoint(path)
    assert read.step == 8 and read.bytes_read == files_size(path)  # every file once, manifest included
    reference = make_model(8)
    assert load_into(path, reference) == 8
    assert read.payload["model"].keys() == reference.state_dict().keys()
    assert all(torch.equal(read.payload["model"][k], v) for k, v in reference.state_dict().items())
    # The optimizer's state as DCP keys it (by parameter name), its hyper-parameters unpickled safely.
    optimizer = read.payload["optimizer"]
    assert optimizer["param_groups"][0]["lr"] == 0.01
    assert set(optimizer["state"]) == set(reference.state_dict())


def test_estimator_evaluate_reads_a_sharded_checkpoint(tmp_path):
    from supervisor.estimator import Estimator

    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=8)
    estimator = Estimator(logdir, model=make_model(8), train_step=lambda batch: {"loss": 0.0},
                          eval_step=weight_metrics)
    assert estimator.evaluate(lambda: [None], steps=1) == {"w": float32_weight_of(8), "spread": 0.0,
                                                           "global_step": 8}


def test_a_damaged_shard_is_corrupt_and_the_sidecar_never_evaluates_it(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=4)
    shard = os.path.join(logdir, "model.ckpt-4", "__0_0.distcp")
    with open(shard, "r+b") as f:
        data = bytearray(f.read())
        data[200] ^= 0x10  # one bit, inside a tensor's bytes
        f.seek(0)
        f.write(data)
    with pytest.raises(CheckpointCorruptError, match=r"model.ckpt-4: __0_0.distcp checksum crc32:\w+ does not match"):
        read_checkpoint(shard.rsplit("/", 1)[0])
    evaluator = SidecarEvaluator(make_model(8), [None], logdir, eval_step=weight_metrics, timeout=60)
    assert evaluator.start() == []
    assert evaluator.stats.corrupt == 1 and evaluator.stop_reason == StopReason.FINISHED


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/supervisor-dcp-metadata-pwned",))


def test_metadata_that_would_run_code_is_refused_and_never_run(tmp_path):
    marker = "/tmp/supervisor-dcp-metadata-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    with pytest.raises(CheckpointError, match=r"\.metadata references (posix|os)\.system, which is not part of"):
        read_metadata(pickle.dumps(Evil()), "/x/model.ckpt-1")
    # In a real checkpoint whose manifest was made to match: refused, not "corrupt", never run.
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=4)
    path = os.path.join(logdir, "model.ckpt-4")
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(Evil(), f)
    rewrite_manifest_for(path, ".metadata")
    with pytest.raises(CheckpointError, match="references (posix|os).system") as info:
        read_checkpoint(path)
    assert not isinstance(info.value, CheckpointCorruptError)
    # The variable listing (TF's list_variables) reads .metadata through the same allowlist.
    from supervisor import list_variables

    with pytest.raises(CheckpointError, match="references (posix|os).system"):
        list_variables(path)
    assert not os.path.exists(marker)
    with pytest.raises(CheckpointCorruptError, match="holds a list, not DCP metadata"):
        read_metadata(pickle.dumps([1, 2]), path)


def test_a_non_tensor_entry_needs_its_class_trusted_as_in_state_pt(tmp_path):
    logdir = str(tmp_path / "run")
    counter = Counter()
    counter.value = Box(7)
    # The writer must trust Box too: a front door refuses to save what would not load (issue 22.19).
    train_sharded(logdir, steps=4, extra={"counter": counter}, trusted_globals=(Box,))
    path = os.path.join(logdir, "model.ckpt-4")
    with pytest.raises(CheckpointError, match=r"Box.*trusted_globals") as info:
        read_checkpoint(path)
    assert not isinstance(info.value, CheckpointCorruptError)
    read = read_checkpoint(path, trusted_globals=[Box])
    assert read.payload["counter"]["box"].n == 7


def test_map_location_must_be_a_device_for_a_sharded_checkpoint(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=4)
    path = os.path.join(logdir, "model.ckpt-4")
    assert read_checkpoint(path, map_location=torch.device("cpu")).payload["model"]["0.bias"].device.type == "cpu"
    with pytest.raises(TypeError, match=r"map_location must be a device .* got \{'cuda:0': 'cpu'\}"):
        read_checkpoint(path, map_location={"cuda:0": "cpu"})
