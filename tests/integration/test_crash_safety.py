"""Crash safety with real processes killed by SIGKILL (SPEC §5.1, §5.4, §15).

The trainer (crash_trainer.py) runs a deterministic CPU model under
`MonitoredTrainingSession` with async checkpoints, a stateful data iterator and RNG drawn
inside every step. It dies by SIGKILL at a chosen point — inside a step or in any phase of a
save, from capture to retention — or when the parent kills it after a random delay. After
every death the tests check what the commit protocol promises:

- every committed checkpoint directory verifies, and the index names one that verifies;
- the restart restores exactly that checkpoint (never an older one than a commit an earlier
  life reported), and its ``open`` removed every ``*.tmp-*`` / ``*.deleting-*`` leftover;
- the run that finally completes ends with the same weights, optimizer state, data position
  and generator states as a run never interrupted — bit for bit.

Runtime: a life costs ~2.7 s of imports, so the next life is spawned while the current one
trains (see crash_harness.py); the whole file takes about a minute on 2 cores.
"""
from __future__ import annotations

import os
import random

import pytest

from .crash_harness import (
    KILLED,
    DiskState,
    Life,
    assert_same_final_state,
    check_resumed,
    inspect_logdir,
)

SAVE_STEPS = 5          # the trainer's default --save-steps; max_to_keep is 2
STEPS_POINTS = 40       # length of the run in the per-kill-point tests
STEPS_SERIES = 400      # length of the run in the random series (> KILLS * BACKSTOP)
KILLS = 20
BACKSTOP = 18           # every life of the series dies by its 18th step at the latest
SERIES_SLEEP = ("--step-sleep-secs", "0.003")  # room for the parent's timed kills
SEED = int(os.environ.get("CRASH_SEED", "1515"))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Final states of uninterrupted runs, by length (both lives warm up together)."""
    root = tmp_path_factory.mktemp("reference")
    lengths = {STEPS_POINTS: (), STEPS_SERIES: SERIES_SLEEP}
    lives = {n: Life(str(root / f"run{n}"), str(root / f"final{n}.pt"), str(root / f"life{n}.log"),
                     steps=n, extra=extra) for n, extra in lengths.items()}
    try:
        for n, life in lives.items():
            result = life.run()
            assert result.returncode == 0 and result.finished_step == n, result.output
            assert "initialised from scratch" in result.output
    finally:
        for life in lives.values():
            life.close()
    return {n: str(root / f"final{n}.pt") for n in lengths}


# ---------------------------------------------------------------- what each kill leaves behind
def _temp_dirs(disk: DiskState, step: int) -> list[str]:
    return [disk.path(n) for n in disk.transient if n.startswith(f"model.ckpt-{step}.tmp-")]


def nothing_of_step_10(disk: DiskState) -> None:
    assert not any(n.startswith("model.ckpt-10") for n in disk.names), disk.names


def torn_state_file(disk: DiskState) -> None:
    (tmp,) = _temp_dirs(disk, 10)
    assert os.listdir(tmp) == ["state.pt"]
    whole = os.path.getsize(os.path.join(disk.committed[5], "state.pt"))
    assert 0 < os.path.getsize(os.path.join(tmp, "state.pt")) < whole  # half written


def unsealed_temp(disk: DiskState) -> None:
    (tmp,) = _temp_dirs(disk, 10)
    assert os.listdir(tmp) == ["state.pt"]  # written, never sealed


def sealed_temp(disk: DiskState) -> None:
    (tmp,) = _temp_dirs(disk, 10)
    assert sorted(os.listdir(tmp)) == ["MANIFEST.json", "state.pt"]  # sealed, never renamed


def committed_not_published(disk: DiskState) -> None:
    assert 10 in disk.committed  # renamed into place (and it verifies) ...
    listed = [os.path.basename(p) for p in disk.index.all_model_checkpoint_paths]
    assert "model.ckpt-10" not in listed, listed  # ... but the index never named it


def index_update_torn(disk: DiskState) -> None:
    assert any(n.startswith("checkpoint.tmp-") for n in disk.names), disk.names  # never replaced
    committed_not_published(disk)


def moved_aside_still_listed(disk: DiskState) -> None:
    assert any(n.startswith("model.ckpt-0.deleting-") for n in disk.transient), disk.names
    listed = [os.path.basename(p) for p in disk.index.all_model_checkpoint_paths]
    assert "model.ckpt-0" in listed and 0 not in disk.committed, listed


def half_deleted(disk: DiskState) -> None:
    (aside,) = [n for n in disk.transient if n.startswith("model.ckpt-0.deleting-")]
    assert len(os.listdir(disk.path(aside))) == 1, "expected one of its two files deleted"


# Saves happen at steps 0, 5, 10, ...; the n-th save of a life waits for the previous one,
# so a kill in the 3rd save (step 10) must restore step 5 exactly. Retention (max_to_keep=2)
# first deletes at the 3rd save, after the index already names step 10.
KILL_POINTS = [
    pytest.param("step:23", {15, 20}, None, id="mid-step"),
    pytest.param("capture:3", {5}, nothing_of_step_10, id="during-capture"),
    pytest.param("write:3", {5}, torn_state_file, id="during-write"),
    pytest.param("seal:3", {5}, unsealed_temp, id="before-manifest"),
    pytest.param("rename:3", {5}, sealed_temp, id="between-write-and-rename"),
    pytest.param("publish:3", {5}, committed_not_published, id="between-rename-and-index"),
    pytest.param("index:3", {5}, index_update_torn, id="during-index-update"),
    pytest.param("retain:1", {10}, moved_aside_still_listed, id="retention-moved-aside"),
    pytest.param("delete:1", {10}, half_deleted, id="retention-mid-delete"),
]


@pytest.mark.slow
@pytest.mark.parametrize("seam, restore_steps, leftover", KILL_POINTS)
def test_kill_at_point_then_restart_resumes_from_verified_checkpoint(tmp_path, references, seam,
                                                                     restore_steps, leftover):
    """SIGKILL at one named point; the restart resumes from the newest verified checkpoint,
    cleans the leftovers at open, and finishes with the uninterrupted run's exact state."""
    logdir, out = str(tmp_path / "run"), str(tmp_path / "final.pt")
    first = Life(logdir, out, str(tmp_path / "life0.log"), steps=STEPS_POINTS, seam=seam)
    second = Life(logdir, out, str(tmp_path / "life1.log"), steps=STEPS_POINTS)  # warms up meanwhile
    try:
        killed = first.run()
        assert killed.returncode == KILLED and killed.killed_at == seam.split(":")[0], killed.output
        disk = inspect_logdir(logdir)  # every committed checkpoint verifies, the index names one
        assert disk.expected is not None and disk.expected[0] in restore_steps, (disk.expected, killed.output)
        if leftover is not None:
            leftover(disk)

        resumed = second.run()
        assert resumed.returncode == 0 and resumed.finished_step == STEPS_POINTS, resumed.output
        check_resumed(resumed, disk, max(killed.committed, default=None))
        if disk.transient:  # the WARNING: a leftover the index still names is put back, others removed
            assert ("left behind by an interrupted checkpoint" in resumed.output
                    or "left behind when a crash interrupted its replacement or deletion" in resumed.output)
        if seam.startswith("retain"):  # still listed, complete: recovered rather than deleted
            assert "recovered model.ckpt-0 from model.ckpt-0.deleting-" in resumed.output
    finally:
        first.close()
        second.close()
    after = inspect_logdir(logdir)
    assert after.transient == ()
    assert sorted(after.committed) == [STEPS_POINTS - SAVE_STEPS, STEPS_POINTS]  # nothing orphaned
    assert_same_final_state(out, references[STEPS_POINTS])


# ---------------------------------------------------------------- many random kills in a row
_SEAM_POINTS = ("step", "capture", "write", "seal", "rename", "publish", "index", "retain", "delete")


def random_kill(rng: random.Random) -> tuple[str, float | None]:
    """(seam, parent's kill delay): a random kill point, or a kill by the parent after a random
    delay. Every life also carries the step backstop, so none outlives BACKSTOP steps and the
    series cannot reach its last step before KILLS kills."""
    kind = rng.choice(_SEAM_POINTS + ("timer",) * 4)
    if kind == "timer":
        return f"step:{BACKSTOP}", rng.uniform(0.0, 0.12)
    if kind == "step":
        return f"step:{rng.randint(1, BACKSTOP)}", None
    return f"{kind}:{rng.randint(1, 3)},step:{BACKSTOP}", None


@pytest.mark.slow
def test_random_kills_in_a_row_then_final_state_is_bit_identical(tmp_path, references):
    """KILLS lives die at random points (seams or a parent SIGKILL after a random delay); each
    restart resumes from the checkpoint the previous death left as newest and verified; the
    last life finishes with exactly the uninterrupted run's state."""
    rng = random.Random(SEED)
    plan = [random_kill(rng) for _ in range(KILLS)] + [(None, None)]
    assert KILLS * BACKSTOP < STEPS_SERIES
    logdir, out = str(tmp_path / "run"), str(tmp_path / "final.pt")

    def spawn(i: int) -> Life:
        return Life(logdir, out, str(tmp_path / f"life{i}.log"), steps=STEPS_SERIES, seam=plan[i][0],
                    extra=SERIES_SLEEP)

    lives: list[Life] = []
    newest, history = None, []
    try:
        for i, (seam, delay) in enumerate(plan):
            while len(lives) < len(plan) and len(lives) <= i + 2:  # two lives warming up ahead
                lives.append(spawn(len(lives)))
            life = lives[i]
            before = inspect_logdir(logdir)
            result = life.run(kill_after_secs=delay)
            life.close()
            history.append(f"life {i}: seam={seam} delay={delay} killed_at={result.killed_at} "
                           f"restored={result.restored_step} committed={list(result.committed)}")
            context = f"seed {SEED}\n" + "\n".join(history) + "\n" + result.output
            if i < KILLS:
                assert result.returncode == KILLED, context
            else:
                assert result.returncode == 0 and result.finished_step == STEPS_SERIES, context
            if result.started:
                check_resumed(result, before, newest)
            newest = max([s for s in (newest,) if s is not None] + list(result.committed), default=None)
    finally:
        for life in lives:
            life.close()
    print("\n".join(history))  # shown with -s, or by pytest when a later assertion fails
    resumed = sum(1 for h in history[1:] if "restored=None" not in h)
    assert resumed >= KILLS // 2, "most restarts should get as far as restoring:\n" + "\n".join(history)
    assert inspect_logdir(logdir).transient == ()
    assert_same_final_state(out, references[STEPS_SERIES])


# ---------------------------------------------------------------- the oracle can fail
@pytest.mark.slow
@pytest.mark.parametrize("perturb", ["rng", "data"])
def test_bit_identity_check_catches_a_resume_without_rng_or_data_position(tmp_path, references, perturb):
    """Negative control: a restart that lost the generators' state or the data position ends
    with different weights, so the bit-for-bit comparison above is not vacuous."""
    logdir, out = str(tmp_path / "run"), str(tmp_path / "final.pt")
    first = Life(logdir, out, str(tmp_path / "life0.log"), steps=STEPS_POINTS, seam="step:13")
    second = Life(logdir, out, str(tmp_path / "life1.log"), steps=STEPS_POINTS, extra=("--perturb", perturb))
    try:
        assert first.run().returncode == KILLED
        resumed = second.run()
        assert resumed.returncode == 0 and resumed.restored_step in (5, 10), resumed.output
    finally:
        first.close()
        second.close()
    with pytest.raises(AssertionError, match="model"):
        assert_same_final_state(out, references[STEPS_POINTS])


# ---------------------------------------------------------------- re-saving the indexed step
@pytest.mark.slow
def test_kill_while_resaving_the_indexed_step_still_resumes_from_it(tmp_path, references):
    """A crash in any phase of any save must leave a restorable checkpoint of the newest
    committed step (SPEC §5.1), including a re-save of the step just restored."""
    logdir, out = str(tmp_path / "run"), str(tmp_path / "final.pt")
    keep_one = ("--max-to-keep", "1")
    first = Life(logdir, out, str(tmp_path / "life0.log"), steps=10, extra=keep_one)
    second = Life(logdir, out, str(tmp_path / "life1.log"), steps=STEPS_POINTS, seam="replace:1",
                  extra=keep_one + ("--save-at-start",))
    third = Life(logdir, out, str(tmp_path / "life2.log"), steps=STEPS_POINTS, extra=keep_one)
    try:
        assert first.run().finished_step == 10
        killed = second.run()
        assert killed.restored_step == 10 and killed.killed_at == "replace", killed.output
        resumed = third.run()
    finally:
        for life in (first, second, third):
            life.close()
    assert resumed.returncode == 0 and resumed.restored_step == 10, resumed.output
    assert_same_final_state(out, references[STEPS_POINTS])
