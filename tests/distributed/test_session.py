"""Distributed sessions through the front doors, on real gloo groups: the chief chooses the
checkpoint and every rank restores exactly it; DDP state saved under unwrapped keys."""
from __future__ import annotations

import os
import re

import pytest
import torch

from .harness import describe, run_job
from .worker import CHIEF_AFTER_GIVING_UP

RESTORED = re.compile(r"restored step=(\d+) from (\S+)")


def _restored(output: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in RESTORED.finditer(output)]


@pytest.mark.slow
def test_every_rank_restores_the_checkpoint_the_chief_chose(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("ddp_session", 2, logdir, "4", timeout=120)
    assert all(r.returncode == 0 for r in first), describe(first)
    assert [r.result["end"] for r in first] == [4, 4]
    assert first[0].result["digest"] == first[1].result["digest"]  # DDP kept them in sync
    # Only the chief wrote; the model's keys are the unwrapped module's.
    payload = torch.load(os.path.join(logdir, "model.ckpt-4", "state.pt"), weights_only=True)
    assert set(payload["model"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    # save_checkpoint_steps=3: every rank runs the schedule, so the save lands at step 3 itself
    # (not one step late through the agreement)
    from supervisor.checkpoint import get_checkpoint_state
    steps = sorted(int(p.rsplit("-", 1)[1]) for p in get_checkpoint_state(logdir).all_model_checkpoint_paths)
    assert steps == [0, 3, 4], describe(first)
    second = run_job("ddp_session", 2, logdir, "6", timeout=120)
    assert all(r.returncode == 0 for r in second), describe(second)
    chosen = [_restored(r.output) for r in second]
    assert chosen[0] == chosen[1] == [(4, os.path.join(logdir, "model.ckpt-4"))], describe(second)
    assert [r.result["start"] for r in second] == [4, 4]
    assert [r.result["end"] for r in second] == [6, 6]
    # Restored at last_step already: no rank runs a step (StopAtStepHook's every-rank stop at creation)
    third = run_job("ddp_session", 2, logdir, "6", timeout=120)
    assert all(r.returncode == 0 for r in third), describe(third)
    assert [(r.result["start"], r.result["end"]) for r in third] == [(6, 6), (6, 6)], describe(third)


@pytest.mark.slow
def test_a_worker_gives_up_waiting_for_the_chief_with_a_timeout_naming_it(tmp_path):
    results = run_job("ddp_session", 2, str(tmp_path / "run"), "2", CHIEF_AFTER_GIVING_UP, "2", timeout=60)
    worker = results[1]
    assert worker.returncode not in (0, None), describe(results)
    assert "TimeoutError" in worker.output and "chief's restore decision" in worker.output
    assert "max_wait_secs=2" in worker.output and "supervisor/restore/" in worker.output


def _final_checkpoint(logdir: str) -> tuple[str, dict]:
    from supervisor.checkpoint import latest_checkpoint, verify_checkpoint

    path = latest_checkpoint(logdir)
    verify_checkpoint(path)
    return path, torch.load(os.path.join(path, "state.pt"), weights_only=True)


@pytest.mark.slow
def test_a_stop_on_one_rank_ends_every_rank_at_the_same_step_with_its_checkpoint(tmp_path):
    results = run_job("ddp_faults", 2, str(tmp_path), timeout=150)
    assert all(r.returncode == 0 for r in results), describe(results)
    for fault in ("stop", "sigterm", "nan"):
        chief, other = results[0].result[fault], results[1].result[fault]
        # requested during step 5 on rank 1 only -> agreed at boundary 5, applied at boundary 6
        assert (chief["end"], other["end"]) == (6, 6), (fault, describe(results))
        assert chief["digest"] == other["digest"]
        assert "rank 1" in chief["stop_reason"], (fault, chief)
        path, payload = _final_checkpoint(str(tmp_path / fault))
        assert path == str(tmp_path / fault / "model.ckpt-6") and payload["global_step"] == 6
        assert sorted(payload["rng"]) == [0, 1]  # every rank's RNG gathered at that boundary


@pytest.mark.slow
def test_time_based_saves_never_split_ranks(tmp_path):
    from supervisor.checkpoint import verify_checkpoint

    logdir = str(tmp_path / "run")
    results = run_job("ddp_session", 2, logdir, "40", "0", "60", "none", "1", "0", "0.25", timeout=150)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert [r.result["end"] for r in results] == [40, 40]
    names = [n for n in os.listdir(logdir) if n.startswith("model.ckpt-") and n != "model.ckpt-0"]
    assert len(names) >= 2, names  # time-based saves happened (max_to_keep=5 keeps the newest)
    for name in names:
        verify_checkpoint(os.path.join(logdir, name))
        payload = torch.load(os.path.join(logdir, name, "state.pt"), weights_only=True)
        # every rank was at this same boundary: all RNG states were gathered for the capture
        assert sorted(payload["rng"]) == [0, 1], name


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise", "kill", "hang"])
def test_a_failed_rank_ends_the_job_in_bounded_time_naming_it(tmp_path, fault):
    from supervisor.checkpoint import verify_checkpoint

    logdir = str(tmp_path / "run")
    results = run_job("ddp_session", 2, logdir, "200", "0", "60", fault, "1", "5", timeout=90,
                      after_rank0_secs=5)
    chief = results[0]
    assert chief.returncode not in (0, None), describe(results)  # it stopped, with an error
    expected = {"raise": "boom on rank 1", "kill": "did not respond", "hang": "rank 1 hung"}[fault]
    assert "rank 1" in chief.output and expected in chief.output, describe(results)
    # stop_grace_secs=8: the chief ends within it (plus start-up and the watchdog's poll)
    assert chief.elapsed < 60, describe(results)
    for name in os.listdir(logdir):
        if name.startswith("model.ckpt-") and ".tmp-" not in name:
            verify_checkpoint(os.path.join(logdir, name))


@pytest.mark.slow
def test_supervisor_front_door_on_ddp_stops_every_rank_together_and_only_the_chief_writes(tmp_path):
    from supervisor.checkpoint import verify_checkpoint

    logdir = str(tmp_path / "run")
    results = run_job("supervisor_session", 2, logdir, timeout=150)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert [r.result["end"] for r in results] == [13, 13], describe(results)
    assert results[0].result["digest"] == results[1].result["digest"]
    path, payload = _final_checkpoint(logdir)
    assert path.endswith("model.ckpt-13") and sorted(payload["rng"]) == [0, 1]
    for name in os.listdir(logdir):
        if name.startswith("model.ckpt-"):
            verify_checkpoint(os.path.join(logdir, name))
    events = [n for n in os.listdir(logdir) if n.startswith("events.out.tfevents")]
    assert len(events) == 1, events  # the chief's; non-chief ranks write no events


@pytest.mark.slow
def test_a_sigterm_to_one_rank_preempts_every_rank_and_marks_nothing_finished(tmp_path):
    """Issue 21.5: a SIGTERM on rank 1 only is a preemption of the whole job: every rank's
    session says preempted (so every rank exits 143 by the README's pattern), the chief writes
    no finished mark (evaluators keep waiting for the resumed run), and the final checkpoint is
    that of the agreed step."""
    from supervisor.checkpoint.layout.finished import FINISHED_FILE

    logdir = str(tmp_path / "run")
    results = run_job("ddp_preempted", 2, logdir, timeout=150)
    assert [r.returncode for r in results] == [143, 143], describe(results)
    assert [r.result["preempted"] for r in results] == [True, True], describe(results)
    assert [r.result["end"] for r in results] == [6, 6], describe(results)
    assert not os.path.exists(os.path.join(logdir, FINISHED_FILE)), describe(results)
    assert "SIGTERM" in results[1].result["stop_reason"]
    assert "rank 1" in results[0].result["stop_reason"], results[0].result
    path, payload = _final_checkpoint(logdir)
    assert path == os.path.join(logdir, "model.ckpt-6") and payload["global_step"] == 6


@pytest.mark.slow
def test_only_the_chief_runs_init_fn_and_every_rank_starts_from_its_state(tmp_path):
    """Issue 22.11, SPEC §4: non-chief ranks do not initialise. An init_fn drawing from a
    per-rank RNG runs on the chief alone; the others receive its state (model and non-tensor
    entries alike) before the first step, so the ranks never split."""
    results = run_job("init_fn_ranks", 2, str(tmp_path / "run"), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    chief, other = results[0].result, results[1].result
    assert (chief["calls"], other["calls"]) == ([0], []), describe(results)
    assert chief["start"] == other["start"], describe(results)
    assert chief["end"] == other["end"] and chief["counter"] == other["counter"]


@pytest.mark.slow
def test_an_init_fn_failing_on_the_chief_fails_every_rank_with_its_error(tmp_path):
    results = run_job("init_fn_ranks", 2, str(tmp_path / "run"), "yes", timeout=120, agent_store=True)
    assert [r.returncode for r in results] == [1, 1], describe(results)
    assert "cannot read the warm-start file on rank 0" in results[0].output
    # the other rank does not wait max_wait_secs, nor run init_fn: it quotes the chief's error
    assert "cannot read the warm-start file on rank 0" in results[1].output, describe(results)
    assert "on rank 1" not in results[1].output and results[1].elapsed < 50, describe(results)


def _raised(output: str) -> str:
    """The last exception line of a traceback in ``output`` (what the rank raised)."""
    lines = [line for line in output.splitlines() if re.match(r"^[\w.]+(Error|Exception|Interrupt): ", line)]
    return lines[-1] if lines else ""


@pytest.mark.slow
def test_a_transport_timeout_before_the_watchdog_still_names_the_hung_rank(tmp_path):
    """Issue 22.10, SPEC §12: rank 1 hangs in its step; the training group's gloo timeout (3 s)
    fires before the watchdog (stop_grace_secs=8). Rank 0's error is gloo's "Application timeout
    caused pair closure"/"Timed out", which names no rank: what rank 0 raises must name rank 1
    (chained to gloo's error)."""
    results = run_job("ddp_session", 2, str(tmp_path / "run"), "200", "0", "60", "hang", "1", "5",
                      timeout=90, after_rank0_secs=3, extra_env={"SUPERVISOR_TEST_PG_TIMEOUT": "3"})
    chief = results[0]
    assert chief.returncode not in (0, None), describe(results)
    raised = _raised(chief.output)
    assert raised.startswith("supervisor.distributed.failure.RankFailureError: ") and "rank 1" in raised, \
        describe(results)
    assert "hung" in raised or "did not respond" in raised, raised
