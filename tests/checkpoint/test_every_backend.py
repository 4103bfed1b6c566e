"""What a checkpoint logdir guarantees on every storage backend (SPEC §5, §15, §16), run through the
one ``backend`` fixture of tests/s3_fixtures.py (a local directory, a bucket of the real moto
server over HTTP, fsspec's in-process ``memory://``): the manager is given the resolved
`Location` (the fixture's storage), and every change a test makes to the logdir goes through that
storage, so the same lines damage a file, an object or a memory entry.

Until issue 32 these were tested on a local directory only (tests/checkpoint/test_corruption.py,
test_retention.py); the object store had its own variants of a few (tests/checkpoint/s3/) and
``memory://`` one session (tests/storage/test_memory_backend.py). A behaviour that must hold on
every backend belongs here; what only one backend does stays beside it. The variants of a kind of
damage or of a broken index stay with the local tests (the checks are the same code on every
backend); here one of each kind runs, to keep the suite's time (about 1 s a test on moto)."""
from __future__ import annotations

import logging
import re

import pytest
import torch

from supervisor.checkpoint import CheckpointManager, verify_checkpoint
from supervisor.checkpoint.layout.index import latest_checkpoint
from supervisor.checkpoint.storage.location import Location
from supervisor.errors import CheckpointCorruptError
from tests.checkpoint.conftest import small_state, train_step
from tests.s3_fixtures import backend, data_url, lifetime_thread_prefixes, s3_server, s3_storage  # noqa: F401

pytestmark = pytest.mark.timeout(120)
H = 3600.0


@pytest.fixture
def logdir(backend) -> Location:
    storage, root = backend
    return Location(storage.join(root, "run"), storage)


def _save(logdir: Location, clock, steps, **kwargs) -> dict[int, dict[str, torch.Tensor]]:
    """Saves ``steps`` in one manager's life, a training step before each; the weights saved."""
    state, weights = small_state(), {}
    with CheckpointManager(logdir, clock=clock, **kwargs) as manager:
        for step in steps:
            clock.advance(kwargs.get("keep_checkpoint_every_n_hours", 0) * H or 1.0)
            train_step(state, step)
            weights[step] = {k: v.clone() for k, v in state["model"].state_dict().items()}
            manager.save(step, state, wait=True)
    return weights


def _restore(logdir: Location, clock, **kwargs):
    state = small_state(seed=99)
    with CheckpointManager(logdir, clock=clock, **kwargs) as manager:
        return manager.restore(state), state


def _steps(logdir: Location) -> list[int]:
    names = logdir.storage.listdir(logdir.path)
    return sorted(int(n.rsplit("-", 1)[1]) for n in names if re.fullmatch(r"model\.ckpt-\d+", n))


def _indexed(logdir: Location) -> list[int]:
    """The steps of the index's ``all_model_checkpoint_paths``, read as bytes through the storage."""
    text = logdir.storage.read_bytes(logdir.join("checkpoint")).decode()
    return [int(s) for s in re.findall(r'all_model_checkpoint_paths: ".*?-(\d+)"', text)]


def _rewrite(storage, url: str, change) -> None:
    storage.write_atomic(url, change(storage.read_bytes(url)))


def _flip(data: bytes) -> bytes:
    return data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:]


DAMAGE = [
    ("flipped byte", lambda s, c: _rewrite(s, data_url(s, c), _flip), "checksum"),
    ("missing manifest", lambda s, c: s.remove(s.join(c, "MANIFEST.json")), "MANIFEST.json is missing"),
]
#: On an object store a prefix without its manifest is no checkpoint at all: the writer opening the
#: logdir removes what it holds (with a WARNING), and the restore then finds it gone.
OBJECT_STORE_REASON = {"MANIFEST.json is missing": "does not exist"}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_new_manager_restores_the_newest_save_bit_exact(logdir, clock):
    weights = _save(logdir, clock, (1, 2))
    assert latest_checkpoint(logdir.path, storage=logdir.storage) == logdir.join("model.ckpt-2")
    assert _indexed(logdir) == [1, 2]
    restored, state = _restore(logdir, clock)
    assert (restored.global_step, restored.path) == (2, logdir.join("model.ckpt-2"))
    for key, value in weights[2].items():
        assert torch.equal(state["model"].state_dict()[key], value), key
    verify_checkpoint(logdir.join("model.ckpt-2"), storage=logdir.storage)


@pytest.mark.parametrize("what, damage, reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(logdir, clock, caplog, what, damage, reason):
    weights = _save(logdir, clock, (1, 2))
    damage(logdir.storage, logdir.join("model.ckpt-2"))
    with caplog.at_level(logging.WARNING):
        restored, state = _restore(logdir, clock)
    assert (restored.global_step, restored.path) == (1, logdir.join("model.ckpt-1"))
    for key, value in weights[1].items():
        assert torch.equal(state["model"].state_dict()[key], value), key
    if logdir.is_object_store:
        reason = OBJECT_STORE_REASON.get(reason, reason)
    assert any("model.ckpt-2" in w and reason in w and "trying the next older one" in w
               for w in _warnings(caplog)), _warnings(caplog)


def test_when_nothing_verifies_the_error_names_each_checkpoint_and_nothing_is_restored(logdir, clock):
    _save(logdir, clock, (1, 2))
    for step in (1, 2):
        _rewrite(logdir.storage, data_url(logdir.storage, logdir.join(f"model.ckpt-{step}")), _flip)
    state = small_state(seed=5)
    before = state["model"][0].weight.clone()
    with CheckpointManager(logdir, clock=clock) as manager:
        with pytest.raises(CheckpointCorruptError, match=r"(?s)model\.ckpt-2.*checksum.*model\.ckpt-1"):
            manager.restore(state)
    assert torch.equal(state["model"][0].weight, before)  # never half-restored from a bad one


@pytest.mark.parametrize("index", [None, b'model_checkpoint_path: "model.ckpt-9"\n'],
                         ids=["missing", "names a missing checkpoint"])
def test_a_missing_or_wrong_index_restores_the_highest_committed_step(logdir, clock, caplog, index):
    _save(logdir, clock, (1, 2))
    if index is None:
        logdir.storage.remove(logdir.join("checkpoint"))
    else:
        logdir.storage.write_atomic(logdir.join("checkpoint"), index)
    with caplog.at_level(logging.WARNING):
        restored, _ = _restore(logdir, clock)
    assert restored.global_step == 2
    assert _warnings(caplog), "the index was passed over without a WARNING"


def test_retention_keeps_max_to_keep_and_its_history_survives_a_restart(logdir, clock):
    _save(logdir, clock, (1, 2, 3), max_to_keep=2)
    assert _steps(logdir) == _indexed(logdir) == [2, 3]
    _save(logdir, clock, (4,), max_to_keep=2)
    assert _steps(logdir) == _indexed(logdir) == [3, 4]


def test_keep_every_n_hours_survives_a_restart(logdir, clock):
    _save(logdir, clock, (1, 2), max_to_keep=1, keep_checkpoint_every_n_hours=1.0)
    assert _steps(logdir) == [1, 2]  # 1 preserved for good
    _save(logdir, clock, (3,), max_to_keep=1, keep_checkpoint_every_n_hours=1.0)
    assert _steps(logdir) == [1, 2, 3]  # 2 was an hour after the preserved 1: a restart forgot nothing
