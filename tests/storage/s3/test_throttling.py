"""Throttling and 5xx answers during a save and a restore (SPEC §16 "throttling errors"), injected
by the loopback `tests.s3_fixtures.FaultProxy` in front of the real moto server: each request is
retried by botocore with backoff (``standard`` mode), a bounded number of times (the tests'
client: 3 attempts; the product's default is 5, object_store.py), and a store that never heals
fails the save / the restore within that bound with an error naming the checkpoint's URL."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager, latest_checkpoint  # noqa: E402
from supervisor.errors import CheckpointError  # noqa: E402
from tests.s3_fixtures import TEST_CONFIG, FaultProxy, data_url, options  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ATTEMPTS = TEST_CONFIG["retries"]["total_max_attempts"]


def _state(seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return TrainingState.from_arguments(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.port) as p:
        yield p


@pytest.fixture
def manager(proxy, s3_root):
    made = CheckpointManager(s3_root + "/run", storage_options=options(proxy.endpoint), save_mode="sync")
    made.open()
    yield made
    made.close(failed=True)


def _throttle_next(proxy: FaultProxy, count: int) -> int:
    with proxy.lock:
        proxy.fail_first = proxy.requests + count
        return proxy.failed


def test_throttled_requests_of_a_save_and_a_restore_are_retried_and_both_succeed(proxy, manager, s3_storage):
    state = _state()
    manager.save(1, state)
    with torch.no_grad():
        state["model"][0].weight.add_(1.0)
    failed = _throttle_next(proxy, ATTEMPTS - 1)  # every attempt but the last of the next request: 503 SlowDown
    assert manager.save(2, state) == f"{manager.directory}/model.ckpt-2"
    assert proxy.failed - failed == ATTEMPTS - 1
    assert latest_checkpoint(manager.directory, storage=s3_storage) == f"{manager.directory}/model.ckpt-2"

    fresh = _state(seed=1)
    failed = _throttle_next(proxy, ATTEMPTS - 1)
    assert manager.restore(fresh).global_step == 2
    assert proxy.failed - failed == ATTEMPTS - 1
    for key, value in state["model"].state_dict().items():
        assert torch.equal(fresh["model"].state_dict()[key], value), key


def test_a_store_that_keeps_throttling_fails_the_save_within_the_bound_naming_the_url(proxy, manager, s3_storage):
    state = _state()
    manager.save(1, state)
    before, started = proxy.requests, time.monotonic()
    proxy.fail_all = True
    with pytest.raises(CheckpointError) as raised:
        manager.save(2, state)
    sent = proxy.requests - before
    message = str(raised.value)
    assert f"{manager.directory}/model.ckpt-2" in message and "503" in message, message
    # The failing request is sent ATTEMPTS times (a cleanup after it, if any, as many).
    assert sent in (ATTEMPTS, 2 * ATTEMPTS), sent
    assert time.monotonic() - started < 60
    proxy.fail_all = False
    assert latest_checkpoint(manager.directory, storage=s3_storage) == f"{manager.directory}/model.ckpt-1"
    kept = f"{manager.directory}/model.ckpt-1"
    assert s3_storage.list_files(kept) == ["MANIFEST.json", data_url(s3_storage, kept)[len(kept) + 1:]]


def test_a_store_that_keeps_throttling_fails_the_restore_within_the_bound_naming_the_url(proxy, manager):
    manager.save(1, _state())
    before = proxy.requests
    proxy.fail_all = True
    with pytest.raises(OSError) as raised:  # the storage's error, as a local EIO would be: never a fresh start
        manager.restore(_state(seed=1))
    sent = proxy.requests - before
    message = str(raised.value)
    assert manager.directory in message and "503" in message, message
    assert sent == ATTEMPTS, sent
    proxy.fail_all = False
