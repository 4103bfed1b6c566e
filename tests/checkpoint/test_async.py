"""Background saving (SPEC §5.2): every checkpoint is the consistent cut after its step."""
from __future__ import annotations

import logging
import os
import threading

import torch

from supervisor.checkpoint import load_checkpoint

from .conftest import GatedOpener, small_state, train_step


def _weights(state) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state["model"].state_dict().items()}


def test_every_async_checkpoint_equals_the_weights_after_its_step(manager_factory, tmp_path):
    """Replay check: async saves while the step function keeps changing parameters in place."""
    state = small_state(width=128)  # ~0.2 MiB of state: writes overlap the following steps
    manager = manager_factory(max_to_keep=None)
    expected = {}
    for step in range(1, 22):
        train_step(state, step)
        expected[step] = _weights(state)
        if step % 3 == 0 or step in (1, 2, 7):
            manager.save(step, state)  # async: returns after the capture
    manager.wait()

    names = sorted(n for n in os.listdir(tmp_path / "logdir") if n.startswith("model.ckpt-"))
    steps = sorted(int(n.rsplit("-", 1)[1]) for n in names)
    assert steps == [1, 2, 3, 6, 7, 9, 12, 15, 18, 21]
    for step in steps:
        saved = load_checkpoint(tmp_path / "logdir" / f"model.ckpt-{step}")
        assert saved["global_step"] == step
        for key, value in expected[step].items():
            assert torch.equal(saved["model"][key], value), f"step {step}: {key} differs"


def test_parameters_changed_during_the_write_do_not_leak_into_it(manager_factory):
    gate = GatedOpener()
    state = small_state()
    manager = manager_factory(opener=gate)
    before = _weights(state)
    path = manager.save(1, state)
    assert gate.writing.wait(10)  # the writer is provably mid-write
    with torch.no_grad():
        for p in state["model"].parameters():
            p.add_(1.0)
    gate.release.set()
    manager.wait()

    saved = load_checkpoint(path)
    for key, value in before.items():
        assert torch.equal(saved["model"][key], value)


def test_a_save_due_while_one_is_writing_waits_and_logs_the_wait(manager_factory, caplog):
    gate = GatedOpener()
    state = small_state()
    manager = manager_factory(opener=gate)
    manager.save(1, state)
    assert gate.writing.wait(10)
    assert manager.last_saved_step == 1

    second = threading.Thread(target=manager.save, args=(2, state))
    with caplog.at_level(logging.INFO, logger="supervisor.checkpoint.manager"):
        second.start()
        second.join(0.2)
        assert second.is_alive(), "the second save must wait for the first"
        gate.release.set()
        second.join(10)
        assert not second.is_alive()
        manager.wait()
    assert any("step 2 waited" in r.getMessage() for r in caplog.records)
    assert manager.last_saved_step == 2


def test_sync_mode_writes_before_save_returns(manager_factory, tmp_path):
    manager = manager_factory(save_mode="sync")
    path = manager.save(5, small_state())
    assert os.path.isfile(os.path.join(path, "MANIFEST.json"))
    assert manager._writer._threads == []  # no background thread in sync mode


def test_commit_is_logged_at_debug_with_the_checkpoint_name(manager_factory, caplog):
    """Routine machinery is DEBUG (issue 34 item 5: the quickstart printed ~35 commit and
    retention lines at INFO and 3 about training)."""
    manager = manager_factory()
    with caplog.at_level(logging.DEBUG, logger="supervisor.checkpoint.manager"):
        manager.save(9, small_state(), wait=True)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("committed model.ckpt-9 in ")]
    assert record.levelno == logging.DEBUG


def test_a_process_exiting_without_close_still_commits_the_save_in_flight(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import threading, torch
        from supervisor import TrainingState
        from supervisor.checkpoint import CheckpointManager

        class HeldFile:  # the handshake: no byte is written before the script's main thread has ended
            def __init__(self, raw): self.raw = raw
            def write(self, data):
                threading.main_thread().join(60)
                assert not threading.main_thread().is_alive(), "the script did not end in 60 s"
                return self.raw.write(data)
            def fileno(self): return self.raw.fileno()
            def close(self): self.raw.close()

        manager = CheckpointManager({str(tmp_path)!r}, opener=lambda p: HeldFile(open(p, "xb", buffering=0)))
        manager.open()
        manager.save(3, TrainingState({{"model": torch.nn.Linear(2, 2)}}))
        print("exiting", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    # a fresh interpreter: what its own exit does with a save in flight is the point
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(tmp_path / "model.ckpt-3")["global_step"] == 3


def test_retention_deletes_after_the_save_reports_done(manager_factory, tmp_path):
    """wait() returns once the new checkpoint is published; the dropped one is deleted after,
    and is gone once the manager closes."""
    manager = manager_factory(max_to_keep=1)
    manager.save(1, small_state(), wait=True)
    manager.save(2, small_state(), wait=True)
    manager.close()
    names = sorted(n for n in os.listdir(tmp_path / "logdir") if n.startswith("model.ckpt"))
    assert names == ["model.ckpt-2"]


def test_wait_does_not_wait_for_retention_to_delete(manager_factory, tmp_path, monkeypatch):
    """A save reports done once its checkpoint is published; deleting what retention dropped
    (slow filesystem work) happens after, so wait() and the next capture don't pay for it."""
    import threading

    from supervisor.checkpoint.save import publish as publish_module

    release, removing = threading.Event(), threading.Event()
    real_remove = publish_module.remove_tree

    def slow_remove(path, *args):
        removing.set()
        release.wait(30)
        real_remove(path, *args)

    monkeypatch.setattr(publish_module, "remove_tree", slow_remove)
    manager = manager_factory(max_to_keep=1)
    manager.save(1, small_state(), wait=True)
    saver = threading.Thread(target=manager.save, args=(2, small_state()), kwargs={"wait": True})
    try:
        saver.start()
        saver.join(10)
        assert not saver.is_alive(), "save(wait=True) waited for retention's delete"
        assert removing.wait(10)
        logdir = tmp_path / "logdir"
        assert any(".deleting-" in n for n in os.listdir(logdir))  # still being removed
    finally:
        release.set()
        saver.join(10)
    manager.close()
    assert sorted(n for n in os.listdir(logdir) if n.startswith("model.ckpt")) == ["model.ckpt-2"]
