"""The object store goes away during a save and comes back (SPEC §16 "the server stopped and
restarted during a save", §5.2 failure policy), against the real moto server and s3fs client.

moto keeps its objects in memory, so a killed and restarted moto would come back empty: the
outage is made by `outage.OutageProxy` in front of it instead — its port refuses connections
while "stopped" and listens again on the same port when "restarted", while the objects stay
behind it. What the client sees is the server dying with a request in flight, connection
refused on every retry, then the server back."""
from __future__ import annotations

import logging
import time

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager, latest_checkpoint  # noqa: E402
from supervisor.checkpoint.ownership.lease import LeaseLostError  # noqa: E402
from supervisor.errors import CheckpointError  # noqa: E402
from tests.s3_fixtures import data_url, options  # noqa: E402
from tests.storage.s3.outage import OutageProxy  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return TrainingState.from_arguments(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))


def _bump(state: TrainingState) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        for p in state["model"].parameters():
            p.add_(0.5)
    return {k: v.clone() for k, v in state["model"].state_dict().items()}


def _manifest_put(step: int):
    return lambda method, path: method == "PUT" and f"model.ckpt-{step}/MANIFEST.json" in path


@pytest.fixture
def proxy(s3_server):
    with OutageProxy(s3_server.port) as p:
        yield p


def test_a_save_during_an_outage_fails_cleanly_and_the_next_one_after_the_restart_commits(
        proxy, s3_server, s3_root, s3_storage, caplog):
    logdir = s3_root + "/run"
    manager = CheckpointManager(logdir, storage_options=options(proxy.endpoint), max_consecutive_save_failures=3)
    manager.open()
    try:
        expected = _outage_then_restart(manager, proxy, logdir, s3_storage, caplog)
        manager.close()
    finally:
        manager.close(failed=True)  # a no-op after close()
    _reopen_cleans_up_and_resumes(s3_server, logdir, s3_storage, caplog, expected)


def _outage_then_restart(manager, proxy, logdir, s3_storage, caplog) -> dict[str, torch.Tensor]:
    state = _state()
    manager.save(1, state, wait=True)
    committed = dict(s3_storage.list_objects(f"{logdir}/model.ckpt-1"))

    proxy.stop_on(_manifest_put(2))  # the server dies as the manifest of step 2 is sent
    _bump(state)
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        manager.save(2, state)  # async: training is not blocked
        manager.wait()  # the failure is tolerated (1 of 3): a WARNING, no exception
    assert proxy.dropped and not proxy.up
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
               and "max_consecutive_save_failures=3" in r.getMessage()]
    assert len(warning) == 1 and "model.ckpt-2" in warning[0], caplog.text
    assert "committed checkpoints are intact" in warning[0] and "(1 of" in warning[0]

    # Seen from another client while the server is away from the writer: nothing lost, nothing half-visible.
    assert dict(s3_storage.list_objects(f"{logdir}/model.ckpt-1")) == committed
    assert not s3_storage.exists(f"{logdir}/model.ckpt-2/MANIFEST.json")
    assert latest_checkpoint(logdir, storage=s3_storage) == f"{logdir}/model.ckpt-1"
    assert manager.checkpoints == (f"{logdir}/model.ckpt-1",)

    proxy.restart()  # the server is back, same port
    expected = _bump(state)
    assert manager.save(3, state, wait=True) == f"{logdir}/model.ckpt-3"
    assert manager.checkpoints == (f"{logdir}/model.ckpt-1", f"{logdir}/model.ckpt-3")
    assert latest_checkpoint(logdir, storage=s3_storage) == f"{logdir}/model.ckpt-3"
    return expected


def _reopen_cleans_up_and_resumes(s3_server, logdir, s3_storage, caplog, expected) -> None:
    # The next writer removes what the failed save could not (its objects, no manifest) and resumes step 3.
    caplog.clear()
    reopened = CheckpointManager(logdir, storage_options=options(s3_server.endpoint))
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        reopened.open()
    try:
        assert not s3_storage.isdir(f"{logdir}/model.ckpt-2")
        assert any("model.ckpt-2" in r.getMessage() and "no MANIFEST.json" in r.getMessage() for r in caplog.records)
        fresh = _state()
        assert reopened.restore(fresh).global_step == 3
        for key, value in fresh["model"].state_dict().items():
            assert torch.equal(value, expected[key]), key
    finally:
        reopened.close()


def test_a_store_that_does_not_come_back_fails_the_save_naming_the_url_and_keeps_the_committed_one(
        proxy, s3_root, s3_storage):
    logdir = s3_root + "/run"
    manager = CheckpointManager(logdir, storage_options=options(proxy.endpoint), save_mode="sync")
    manager.open()
    state = _state()
    manager.save(1, state)
    proxy.stop()
    _bump(state)
    try:
        with pytest.raises(CheckpointError, match=r"model\.ckpt-2") as raised:
            manager.save(2, state)
        assert proxy.endpoint in str(raised.value) or "s3://" in str(raised.value), str(raised.value)
    finally:
        manager.close(failed=True)
    assert latest_checkpoint(logdir, storage=s3_storage) == f"{logdir}/model.ckpt-1"
    kept = f"{logdir}/model.ckpt-1"
    assert s3_storage.list_files(kept) == ["MANIFEST.json", data_url(s3_storage, kept)[len(kept) + 1:]]


def test_an_outage_over_a_lease_renewal_stops_the_writer_even_after_the_store_is_back(proxy, s3_root, s3_storage):
    """SPEC §16: a writer whose renewal fails stops before its next commit. One failed renewal
    (its bounded retries spent) is enough, even though the store is back long before the lease
    would have expired: never tolerated by ``max_consecutive_save_failures`` (every later save
    would fail too); the committed checkpoints stay."""
    logdir = s3_root + "/run"
    manager = CheckpointManager(logdir, storage_options=options(proxy.endpoint), save_mode="sync",
                                max_consecutive_save_failures=3, lease_secs=3)  # renewed every second
    manager.open()
    try:
        state = _state()
        manager.save(1, state)
        proxy.stop()
        lease, deadline = manager._lock, time.monotonic() + 60
        # Until a renewal (every second) failed, its bounded retries spent, or the lease expired unrenewed.
        while lease.lost is None and time.time() < lease.expires_at:
            assert time.monotonic() < deadline, "the lease was neither lost nor expired while the store was down"
            time.sleep(0.05)
        proxy.restart()
        _bump(state)
        with pytest.raises(LeaseLostError, match=r"lost the lease"):  # its renewal failed, or came too late
            manager.save(2, state)
    finally:
        manager.close(failed=True)
    assert latest_checkpoint(logdir, storage=s3_storage) == f"{logdir}/model.ckpt-1"
    assert not s3_storage.exists(f"{logdir}/model.ckpt-2/MANIFEST.json")
