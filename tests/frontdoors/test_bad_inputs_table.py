"""Every mistake gets a message that names it (issue 10 item 6): a table of bad inputs across the
public constructors. Each row asserts the exception type, that the constructor itself raises
(nothing is opened or written: the logdir stays untouched), and that the message names the
argument (and, where given, the problem)."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import hooks
from supervisor import (
    CheckpointManager,
    MonitoredSession,
    MonitoredTrainingSession,
    SessionCreator,
    SingularMonitoredSession,
    Supervisor,
    TrainingState,
)


class Paths:
    """Real filesystem objects the bad inputs point at."""

    def __init__(self, root) -> None:
        self.root = root
        self.fresh = str(root / "fresh")  # a logdir that does not exist yet: must stay so
        self.file = str(root / "a_file.txt")
        open(self.file, "w").close()
        self.checkpoint = root / "run" / "model.ckpt-2"
        self.checkpoint.mkdir(parents=True)
        (self.checkpoint / "MANIFEST.json").write_text("{}")
        (self.checkpoint / "state.pt").write_bytes(b"")
        self.under_file = os.path.join(self.file, "logs")
        self.unwritable = "/proc/1/logs"  # root ignores chmod; /proc/1 refuses writes to everyone


def linear():
    return nn.Linear(2, 1)


def sgd():
    return torch.optim.SGD(linear().parameters(), lr=0.1)


class NotStateful:
    pass


def sv(p, **kw):
    kw.setdefault("logdir", p.fresh)
    return Supervisor(**kw)


def mts(p, **kw):
    kw.setdefault("checkpoint_dir", p.fresh)
    return MonitoredTrainingSession(**kw)


def sms(p, **kw):
    kw.setdefault("checkpoint_dir", p.fresh)
    return SingularMonitoredSession(**kw)


# (id, constructor call, exception type, what the message must contain)
CASES = [
    # Supervisor
    ("sv-logdir-int", lambda p: sv(p, logdir=3), TypeError, ["logdir", "3"]),
    ("sv-logdir-file", lambda p: sv(p, logdir=p.file), ValueError, ["logdir", "a_file.txt", "not a directory"]),
    ("sv-logdir-checkpoint", lambda p: sv(p, logdir=str(p.checkpoint)), ValueError,
     ["logdir", "model.ckpt-2", "is a checkpoint directory", "pass the directory that holds"]),
    ("sv-logdir-under-file", lambda p: sv(p, logdir=p.under_file), ValueError, ["logdir", "cannot be created", "is a file"]),
    ("sv-logdir-unwritable", lambda p: sv(p, logdir=p.unwritable), ValueError, ["logdir", "no write permission"]),
    ("sv-model-class", lambda p: sv(p, model=nn.Linear), TypeError, ["model", "the class", "not an instance", "Linear(...)"]),
    ("sv-optimizer-class", lambda p: sv(p, model=linear(), optimizer=torch.optim.SGD), TypeError, ["optimizer", "not an instance"]),
    ("sv-model-object", lambda p: sv(p, model=object()), TypeError, ["model", "state_dict()"]),
    ("sv-state-list", lambda p: sv(p, state=[linear()]), TypeError, ["state", "dict"]),
    ("sv-state-not-stateful", lambda p: sv(p, state={"data": [1, 2, 3]}), TypeError, ["state['data']", "load_state_dict"]),
    ("sv-state-class", lambda p: sv(p, state={"sched": NotStateful}), TypeError, ["state['sched']", "not an instance"]),
    ("sv-state-reserved", lambda p: sv(p, state={"global_step": linear()}), ValueError, ["global_step", "reserved"]),
    ("sv-state-duplicate", lambda p: sv(p, model=linear(), state={"model": linear()}), ValueError, ["model=", "state['model']"]),
    ("sv-hooks-single", lambda p: sv(p, hooks=hooks.StopAtStepHook(last_step=1)), TypeError, ["hooks", "wrap a single hook"]),
    ("sv-hooks-class", lambda p: sv(p, hooks=[hooks.StopAtStepHook]), TypeError, ["hooks[0]", "StopAtStepHook(...)"]),
    ("sv-hooks-str", lambda p: sv(p, hooks=["stop"]), TypeError, ["hooks[0]", "supervisor.Hook"]),
    ("sv-save-model-secs", lambda p: sv(p, save_model_secs=-1), ValueError, ["save_model_secs", "-1"]),
    ("sv-save-summaries-str", lambda p: sv(p, save_summaries_secs="60"), TypeError, ["save_summaries_secs", "'60'"]),
    ("sv-max-to-keep", lambda p: sv(p, max_to_keep=0), ValueError, ["max_to_keep", "0"]),
    # issue 34 item 2: keeping the best checkpoints and every N-th step
    ("sv-keep-best-no-metric", lambda p: sv(p, keep_best=2), ValueError, ["keep_best=2", "best_metric=", "'loss'"]),
    ("mts-best-metric-alone", lambda p: mts(p, best_metric="loss"), ValueError, ["best_metric='loss'", "keep_best"]),
    ("mts-keep-best-zero", lambda p: mts(p, keep_best=0, best_metric="loss"), ValueError, ["keep_best", "got 0"]),
    ("sv-best-metric-int", lambda p: sv(p, keep_best=1, best_metric=3), TypeError, ["best_metric", "got 3"]),
    ("mts-best-mode", lambda p: mts(p, keep_best=1, best_metric="acc", best_mode="highest"), ValueError,
     ["best_mode", "'highest'", "'max'"]),
    ("sv-keep-period", lambda p: sv(p, keep_period=-5), ValueError, ["keep_period", "-5"]),
    ("mts-keep-period-dcp", lambda p: mts(p, keep_period=10, checkpoint_format="dcp"), ValueError,
     ["keep_period=10", "checkpoint_format='dcp'", "leave it out"]),
    ("sv-save-mode", lambda p: sv(p, save_mode="fast"), ValueError, ["save_mode", "'fast'", "'async'"]),
    ("sv-is-chief", lambda p: sv(p, is_chief="yes"), TypeError, ["is_chief", "'yes'"]),
    ("sv-init-fn", lambda p: sv(p, init_fn=3), TypeError, ["init_fn", "callable"]),
    # issue 22.20: the wrong arity is refused here, not when the session is entered
    ("sv-init-fn-no-arg", lambda p: sv(p, init_fn=lambda: None), TypeError, ["init_fn", "one argument", "session"]),
    ("sv-init-fn-two-args", lambda p: sv(p, init_fn=lambda s, ckpt: None), TypeError, ["init_fn", "init_fn(session)"]),
    ("sv-local-init-fn-no-arg", lambda p: sv(p, local_init_fn=lambda: None), TypeError, ["local_init_fn"]),
    ("mts-ready-fn-two-args", lambda p: mts(p, ready_fn=lambda a, b: None), TypeError, ["ready_fn", "session"]),
    ("sv-summary-fn", lambda p: sv(p, summary_fn="loss"), TypeError, ["summary_fn", "callable"]),
    ("sv-basename", lambda p: sv(p, checkpoint_basename="a/b"), ValueError, ["checkpoint_basename", "'a/b'"]),
    ("sv-keep-hours", lambda p: sv(p, keep_checkpoint_every_n_hours=0), ValueError, ["keep_checkpoint_every_n_hours"]),
    ("sv-handle-signals", lambda p: sv(p, handle_signals=1), TypeError, ["handle_signals"]),
    ("sv-trusted-str", lambda p: sv(p, trusted_globals="mymodule.MyClass"), TypeError, ["trusted_globals", "objects"]),
    # MonitoredTrainingSession
    ("mts-dir-int", lambda p: mts(p, checkpoint_dir=3), TypeError, ["checkpoint_dir", "3"]),
    ("mts-dir-file", lambda p: mts(p, checkpoint_dir=p.file), ValueError, ["checkpoint_dir", "not a directory"]),
    ("mts-dir-checkpoint", lambda p: mts(p, checkpoint_dir=str(p.checkpoint)), ValueError,
     ["checkpoint_dir", "is a checkpoint directory"]),
    ("mts-dir-unwritable", lambda p: mts(p, checkpoint_dir=p.unwritable), ValueError, ["checkpoint_dir", "no write permission"]),
    ("mts-summary-dir-under-file", lambda p: mts(p, summary_dir=p.under_file), ValueError, ["summary_dir", "cannot be created"]),
    ("mts-ckpt-steps", lambda p: mts(p, save_checkpoint_steps=-5), ValueError, ["save_checkpoint_steps", "-5"]),
    ("mts-ckpt-both", lambda p: mts(p, save_checkpoint_steps=10, save_checkpoint_secs=60), ValueError,
     ["save_checkpoint_secs", "save_checkpoint_steps"]),
    ("mts-model-class", lambda p: mts(p, model=nn.Linear), TypeError, ["model", "not an instance"]),
    ("mts-recoverable-instance", lambda p: mts(p, recoverable_exceptions=[ValueError()]), TypeError,
     ["recoverable_exceptions", "exception types"]),
    ("mts-max-recoveries", lambda p: mts(p, max_recoveries=-1), ValueError, ["max_recoveries", "-1"]),
    ("mts-log-steps", lambda p: mts(p, log_step_count_steps="100"), TypeError, ["log_step_count_steps", "'100'"]),
    ("mts-trusted-names", lambda p: mts(p, trusted_globals=["mymodule.MyClass"]), TypeError, ["trusted_globals[0]"]),
    ("mts-hooks-module", lambda p: mts(p, hooks=[linear()]), TypeError, ["hooks[0]", "supervisor.Hook"]),
    ("mts-chief-hooks", lambda p: mts(p, chief_only_hooks=hooks.NanTensorHook()), TypeError, ["chief_only_hooks"]),
    # SingularMonitoredSession
    ("sms-dir-file", lambda p: sms(p, checkpoint_dir=p.file), ValueError, ["checkpoint_dir", "not a directory"]),
    ("sms-state-class", lambda p: sms(p, state={"m": nn.Linear}), TypeError, ["state['m']", "not an instance"]),
    ("sms-grace", lambda p: sms(p, stop_grace_secs=-1), ValueError, ["stop_grace_secs", "-1"]),
    ("sms-save-mode", lambda p: sms(p, save_mode=None), ValueError, ["save_mode", "None"]),
    ("sms-handle-signals", lambda p: sms(p, handle_signals="no"), TypeError, ["handle_signals", "'no'"]),
    ("mts-handle-signals", lambda p: mts(p, handle_signals=None), TypeError, ["handle_signals", "None"]),
    # MonitoredSession, SessionCreator, TrainingState, CheckpointManager
    ("ms-creator", lambda p: MonitoredSession("runs/x"), TypeError, ["session_creator", "SessionCreator"]),
    ("ms-hooks", lambda p: MonitoredSession(hooks=[3]), TypeError, ["hooks[0]"]),
    ("ms-backoff", lambda p: MonitoredSession(recovery_backoff_secs=-1), ValueError, ["recovery_backoff_secs"]),
    ("creator-state-dict", lambda p: SessionCreator({"model": linear()}), TypeError, ["state", "TrainingState"]),
    ("creator-ready-fn", lambda p: SessionCreator(ready_fn="ok"), TypeError, ["ready_fn", "callable"]),
    ("state-class", lambda p: TrainingState({"model": nn.Linear}), TypeError, ["state['model']", "not an instance"]),
    ("state-name", lambda p: TrainingState({"a/b": linear()}), ValueError, ["'a/b'", "rename"]),
    ("manager-dir", lambda p: CheckpointManager(None), TypeError, ["directory"]),
    ("manager-keep", lambda p: CheckpointManager(p.fresh, max_to_keep=-1), ValueError, ["max_to_keep", "-1"]),
    ("manager-verify", lambda p: CheckpointManager(p.fresh, verify="fast"), ValueError, ["verify", "'fast'"]),
    # hooks
    ("stop-last-step", lambda p: hooks.StopAtStepHook(last_step=-1), ValueError, ["last_step", "-1"]),
    ("stop-nothing", lambda p: hooks.StopAtStepHook(), ValueError, ["num_steps", "last_step"]),
    ("summary-steps", lambda p: hooks.SummarySaverHook(save_steps=0), ValueError, ["save_steps", "0"]),
    ("summary-fetches", lambda p: hooks.SummarySaverHook(save_steps=1, fetches=[len]), TypeError, ["fetches"]),
    ("saver-dir", lambda p: hooks.CheckpointSaverHook(None, save_steps=1), TypeError, ["checkpoint_dir", "None"]),
    ("counter-steps", lambda p: hooks.StepCounterHook(every_n_steps="5"), TypeError, ["every_n_steps", "'5'"]),
    ("logging-tensors", lambda p: hooks.LoggingTensorHook("loss", every_n_iter=1), TypeError, ["tensors", "['loss']"]),
]


def test_the_table_is_large():
    assert len(CASES) >= 40 and len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(("call", "error", "needles"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_refused_at_construction_naming_the_argument(tmp_path, call, error, needles):
    paths = Paths(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(error) as info:
        call(paths)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert sorted(os.listdir(tmp_path)) == before and not os.path.exists(paths.fresh)  # nothing written


def test_a_worker_may_read_a_logdir_it_cannot_write(tmp_path):
    # Workers only read the chief's logdir (SPEC §9): only the chief's is checked for writability.
    unwritable = Paths(tmp_path).unwritable
    Supervisor(unwritable, model=linear(), is_chief=False)
    with pytest.raises(ValueError, match="no write permission"):
        Supervisor(unwritable, model=linear(), is_chief=True)
