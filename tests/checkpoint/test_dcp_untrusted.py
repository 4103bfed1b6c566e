"""A sharded (``checkpoint_format="dcp"``) checkpoint cannot run code in the process that reads it
(SPEC §5.4, issue 21 item 1), through every entry point that reads one.

Two places in a DCP checkpoint are pickles: ``.metadata`` (DCP's own reader unpickles it
unrestricted) and the non-tensor entries inside the shard files (DCP's default planner loads them
with ``torch.load(weights_only=False)``). Each is planted with a pickle of ``os.system`` writing a
marker file, the manifest matching (re-signed, or written by the trainer itself); every entry
point must refuse with a `CheckpointError` naming the refused global, and the marker must never
appear.
"""
from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

from supervisor import MonitoredTrainingSession, TrainingState, list_variables, load_checkpoint, load_variable
from supervisor.checkpoint.sharded import ShardedCheckpointManager, load_into, restore_sharded
from supervisor.checkpoint.load.loader import read_checkpoint
from supervisor.errors import CheckpointCorruptError, CheckpointError
from tests import zygote
from tests.estimator.sidecar_helpers import make_model, weight_metrics
from tests.estimator.test_sidecar_dcp import train_sharded
from tests.estimator.test_sidecar_reading import rewrite_manifest_for

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:.*single process"), pytest.mark.timeout(120)]

REFUSED = r"(posix|os)\.system"


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))

    def __deepcopy__(self, memo: dict) -> Evil:  # the trainer's capture copies it: not a load
        return self


class EvilEntry:
    """A state entry whose state dict holds a pickle that runs a command when unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def state_dict(self) -> dict:
        return {"payload": Evil(self.marker)}

    def load_state_dict(self, state: dict) -> None:
        pass


class Inert:
    def state_dict(self) -> dict:
        return {"payload": 0}

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.fixture(scope="module", params=["metadata", "entry"])
def planted(request, tmp_path_factory):
    """``(logdir, checkpoint path, marker, kind)``: a run whose newest checkpoint carries the pickle."""
    root = tmp_path_factory.mktemp(f"evil-{request.param}")
    marker = str(root / "pwned")
    logdir = str(root / "run")
    if request.param == "metadata":
        train_sharded(logdir, steps=4)
        path = os.path.join(logdir, "model.ckpt-4")
        with open(os.path.join(path, ".metadata"), "wb") as f:
            pickle.dump(Evil(marker), f)
        rewrite_manifest_for(path, ".metadata")
    else:
        # the front doors refuse to write an entry that would not load (issue 22.19), so the
        # planted checkpoint is written as an attacker's would be: by a bare manager, unchecked
        train_sharded(logdir, steps=3)
        manager = ShardedCheckpointManager(logdir, save_mode="sync")
        manager.open()
        try:
            model = make_model(8)
            evil = TrainingState({"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01),
                                  "extra": EvilEntry(marker)})
            path = manager.save(4, evil, wait=True)
        finally:
            manager.close()
        assert path == os.path.join(logdir, "model.ckpt-4")
    assert not os.path.exists(marker)
    return logdir, path, marker, request.param


def _state(model: torch.nn.Module | None = None) -> TrainingState:
    model = model or make_model(8)
    return TrainingState({"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01),
                          "extra": Inert()})


def _session(logdir: str, path: str) -> None:
    model = make_model(8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with MonitoredTrainingSession(logdir, model=model, optimizer=torch.optim.Adam(model.parameters()),
                                      state={"extra": Inert()}, checkpoint_format="dcp",
                                      save_checkpoint_steps=None, save_checkpoint_secs=None,
                                      save_summaries_steps=None, log_step_count_steps=None):
            pass


def _manager(logdir: str, path: str) -> None:
    manager = ShardedCheckpointManager(logdir, save_mode="sync")
    try:
        manager.restore(_state())
    finally:
        manager.close(failed=True)


def _estimator(logdir: str, path: str) -> None:
    from supervisor.estimator import Estimator

    estimator = Estimator(logdir, model=make_model(8), train_step=lambda batch: {"loss": 0.0},
                          eval_step=weight_metrics)
    estimator.evaluate(lambda: [None], steps=1, checkpoint_path=path)


def _inspect(logdir: str, path: str) -> None:
    done = zygote.run(["inspect", path], timeout=60)  # a real process, without its own torch import
    if done.returncode != 0:
        raise CheckpointError(done.stdout + done.stderr)


#: Every entry point that reads a sharded checkpoint.
ENTRY_POINTS = {
    "MonitoredTrainingSession(checkpoint_format='dcp') restore": _session,
    "ShardedCheckpointManager.restore": _manager,
    "restore_sharded": lambda logdir, path: restore_sharded(path, _state(), step=4),
    "load_into(module)": lambda logdir, path: load_into(path, make_model(8)),
    "load_into(TrainingState)": lambda logdir, path: load_into(path, _state()),
    "load_checkpoint": lambda logdir, path: load_checkpoint(path),
    "restore_partial": lambda logdir, path: __import__("supervisor").restore_partial(path, make_model(8)),
    "read_checkpoint": lambda logdir, path: read_checkpoint(path),
    "Estimator.evaluate": _estimator,
    "list_variables": lambda logdir, path: list_variables(path),
    "load_variable": lambda logdir, path: load_variable(path, "model/0.weight"),
    "python -m supervisor inspect": _inspect,
}


#: Entry points that read only tensors (and ``.metadata``): a non-tensor entry is never unpickled.
TENSORS_ONLY = ("list_variables", "load_variable", "python -m supervisor inspect", "load_into(module)")


@pytest.mark.parametrize("entry_point", list(ENTRY_POINTS))
def test_a_planted_pickle_never_runs_and_the_refusal_names_the_global(planted, entry_point):
    logdir, path, marker, kind = planted
    read = ENTRY_POINTS[entry_point]
    try:
        if kind == "entry" and entry_point in TENSORS_ONLY:
            read(logdir, path)
        else:
            with pytest.raises(CheckpointError, match=REFUSED) as info:
                read(logdir, path)
            assert not isinstance(info.value, CheckpointCorruptError)  # refused, not "damaged"
    finally:
        ran = os.path.exists(marker)
        if ran:
            os.remove(marker)  # so that the other entry points are judged on their own
    assert not ran, f"{entry_point} ran the command planted in the checkpoint"
