"""TrainSpec / EvalSpec / RunConfig validation: TF's rules, each with its error type and message."""
from __future__ import annotations

import pytest

from hooks import CheckpointSaverListener, StopAtStepHook
from supervisor.estimator import BestExporter, EvalSpec, LatestExporter, RunConfig, TrainSpec, train_and_evaluate


def fn():
    return []


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(input_fn=3), TypeError, "`input_fn` must be callable, given: 3"),
    (dict(input_fn=fn, max_steps=0), ValueError, "Must specify max_steps > 0, given: 0"),
    (dict(input_fn=fn, max_steps=-5), ValueError, "Must specify max_steps > 0, given: -5"),
    (dict(input_fn=fn, max_steps="10"), TypeError, "`max_steps` must be an integer > 0 or None"),
    (dict(input_fn=fn, hooks=[object()]), TypeError, "All hooks must be `supervisor.Hook` instances"),
    (dict(input_fn=fn, hooks=StopAtStepHook(last_step=3)), TypeError, "`hooks` must be a list"),
    (dict(input_fn=fn, saving_listeners=[object()]), TypeError, "All saving_listeners must be"),
])
def test_train_spec_rules(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        TrainSpec(**kwargs)


def test_train_spec_valid():
    hook, listener = StopAtStepHook(last_step=3), CheckpointSaverListener()
    spec = TrainSpec(fn, max_steps=10, hooks=[hook], saving_listeners=[listener])
    assert (spec.max_steps, spec.hooks, spec.saving_listeners) == (10, (hook,), (listener,))
    assert TrainSpec(fn, hooks=None).hooks == ()


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(input_fn=None), TypeError, "`input_fn` must be callable, given: None"),
    (dict(input_fn=fn, steps=0), ValueError, "Must specify steps > 0, given: 0"),
    (dict(input_fn=fn, steps=2.5), TypeError, "`steps` must be an integer > 0 or None"),
    (dict(input_fn=fn, name=7), TypeError, "`name` must be string, given: 7"),
    (dict(input_fn=fn, hooks=["x"]), TypeError, "All hooks must be `supervisor.Hook` instances"),
    (dict(input_fn=fn, start_delay_secs=-1), ValueError, "Must specify start_delay_secs >= 0, given: -1"),
    (dict(input_fn=fn, throttle_secs=-0.5), ValueError, "Must specify throttle_secs >= 0, given: -0.5"),
    (dict(input_fn=fn, throttle_secs="60"), TypeError, "`throttle_secs` must be a number of seconds"),
    (dict(input_fn=fn, exporters=[object()]), TypeError, "`exporters` must be an Exporter, an iterable of Exporter"),
    (dict(input_fn=fn, exporters=5), TypeError, "`exporters` must be an Exporter, an iterable of Exporter"),
    (dict(input_fn=fn, exporters=[LatestExporter("a"), BestExporter("a")]), ValueError,
     "`exporters` must have unique names"),
])
def test_eval_spec_rules(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        EvalSpec(**kwargs)


def test_eval_spec_exporter_name_rules():
    unnamed = LatestExporter("x")
    unnamed._name = ""
    with pytest.raises(ValueError, match="An Exporter cannot have a name that is `None` or empty"):
        EvalSpec(fn, exporters=[unnamed])
    numbered = LatestExporter("x")
    numbered._name = 3
    with pytest.raises(ValueError, match="An Exporter must have a string name"):
        EvalSpec(fn, exporters=numbered)


def test_eval_spec_defaults_and_single_exporter():
    exporter = BestExporter()
    spec = EvalSpec(fn, exporters=exporter)
    assert (spec.steps, spec.name, spec.start_delay_secs, spec.throttle_secs) == (100, None, 120, 600)
    assert spec.exporters == (exporter,)
    assert EvalSpec(fn, exporters=None).exporters == ()


def test_train_and_evaluate_argument_types(tmp_path):
    from tests.estimator.estimator_toy import make_estimator

    est = make_estimator(tmp_path)
    with pytest.raises(TypeError, match="`estimator` must have type"):
        train_and_evaluate(object(), TrainSpec(fn), EvalSpec(fn))
    with pytest.raises(TypeError, match="`train_spec` must have type"):
        train_and_evaluate(est, EvalSpec(fn), EvalSpec(fn))
    with pytest.raises(TypeError, match="`eval_spec` must have type"):
        train_and_evaluate(est, TrainSpec(fn), TrainSpec(fn))
    evaluator = make_estimator(tmp_path, config=RunConfig(tmp_path, task_type="evaluator", task_id=1))
    with pytest.raises(ValueError, match="there can only be one `evaluator` task"):
        train_and_evaluate(evaluator, TrainSpec(fn), EvalSpec(fn))


# ---------------------------------------------------------------------------- RunConfig
def test_run_config_defaults():
    config = RunConfig("/tmp/x")
    assert (config.save_checkpoints_secs, config.save_checkpoints_steps, config.save_summary_steps,
            config.keep_checkpoint_max, config.keep_checkpoint_every_n_hours, config.log_step_count_steps,
            config.task_type, config.task_id) == (600, None, 100, 5, 10000, 100, None, 0)
    assert config.is_chief and config.is_local


def test_run_config_checkpoint_schedule_rules():
    assert RunConfig("/tmp/x", save_checkpoints_steps=50).save_checkpoints_secs is None
    assert RunConfig("/tmp/x", save_checkpoints_secs=30).save_checkpoints_steps is None
    both_none = RunConfig("/tmp/x", save_checkpoints_secs=None, save_checkpoints_steps=None)
    assert (both_none.save_checkpoints_secs, both_none.save_checkpoints_steps) == (None, None)
    with pytest.raises(ValueError, match="cannot be both set"):
        RunConfig("/tmp/x", save_checkpoints_secs=30, save_checkpoints_steps=50)
    replaced = RunConfig("/tmp/x").replace(save_checkpoints_steps=7)
    assert (replaced.save_checkpoints_secs, replaced.save_checkpoints_steps) == (None, 7)


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(model_dir=""), TypeError, "model_dir must be a non-empty directory path"),
    (dict(model_dir="/x", save_summary_steps=-1), ValueError, "save_summary_steps must be a non-negative"),
    (dict(model_dir="/x", keep_checkpoint_max=-1), ValueError, "keep_checkpoint_max"),
    (dict(model_dir="/x", keep_checkpoint_every_n_hours=0), ValueError, "keep_checkpoint_every_n_hours"),
    (dict(model_dir="/x", log_step_count_steps=-3), ValueError, "log_step_count_steps"),
    (dict(model_dir="/x", task_type="ps"), ValueError, "task_type must be one of 'chief', 'worker', 'evaluator'"),
    (dict(model_dir="/x", task_type="worker", task_id=-1), ValueError, "task_id must be a non-negative"),
])
def test_run_config_rules(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        RunConfig(**kwargs)


def test_task_type_from_environment(monkeypatch):
    monkeypatch.setenv("SUPERVISOR_TASK_TYPE", "evaluator")
    monkeypatch.setenv("SUPERVISOR_TASK_ID", "0")
    config = RunConfig("/tmp/x")
    assert (config.task_type, config.task_id, config.is_chief, config.is_local) == ("evaluator", 0, False, False)
    assert RunConfig("/tmp/x", task_type="chief").task_type == "chief"  # the argument wins
    monkeypatch.setenv("SUPERVISOR_TASK_ID", "two")
    with pytest.raises(ValueError, match=r"\$SUPERVISOR_TASK_ID must be a non-negative integer, got 'two'"):
        RunConfig("/tmp/x")


def test_task_type_from_torchrun_rank(monkeypatch):
    monkeypatch.delenv("SUPERVISOR_TASK_TYPE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert (RunConfig("/tmp/x").task_type, RunConfig("/tmp/x").task_id) == ("chief", 0)
    monkeypatch.setenv("RANK", "2")
    assert (RunConfig("/tmp/x").task_type, RunConfig("/tmp/x").task_id) == ("worker", 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert RunConfig("/tmp/x").task_type is None


# ---------------------------------------------------------------------------- bad input (issue 21, 22.5)
def three_arguments(best_eval_result, current_eval_result, threshold):
    return current_eval_result["loss"] < best_eval_result["loss"] - threshold


def with_default(best_eval_result, current_eval_result, threshold=0.1):
    return current_eval_result["loss"] < best_eval_result["loss"] - threshold


@pytest.mark.parametrize("build, error, fragment", [
    (lambda: BestExporter(name=".."), ValueError, "exporter name must be a single directory name under "
                                                  "model_dir/export (no '/', not '.' or '..'), got '..'"),
    (lambda: BestExporter(name="."), ValueError, "not '.' or '..'), got '.'"),
    (lambda: LatestExporter("a/b"), ValueError, "exporter name must be a single directory name"),
    (lambda: LatestExporter(3), TypeError, "exporter name must be a non-empty string"),
    (lambda: BestExporter(eval_dir=5), TypeError, "eval_dir must be the path of an eval directory (str or "
                                                  "os.PathLike) or None, got 5"),
    (lambda: BestExporter(eval_dir=""), ValueError, "eval_dir must be a non-empty str path"),
    (lambda: LatestExporter("x", exports_to_keep=2.5), ValueError,
     "`exports_to_keep`, if provided, must be a positive integer (or None to keep every export), got 2.5"),
    (lambda: LatestExporter("x", exports_to_keep="2"), TypeError, "must be a positive integer"),
    (lambda: BestExporter(compare_fn=three_arguments), ValueError,
     "has following not expected args: ['threshold']; it is called as compare_fn(best_eval_result, "
     "current_eval_result): bind the others first, e.g. functools.partial(f, threshold=0.1)"),
    (lambda: BestExporter(compare_fn=with_default), ValueError, "has following not expected args: ['threshold']"),
    (lambda: BestExporter(compare_fn=lambda best, current: True), ValueError,
     "must include best_eval_result argument"),
    (lambda: EvalSpec(fn, exporters="best"), TypeError, "`exporters` must be an Exporter, an iterable of "
                                                       "Exporter, or `None`, given: 'best'; pass instances"),
    (lambda: EvalSpec(fn, name="a/b"), ValueError, "`name` must not contain '/' (the metrics go to "
                                                   "model_dir/eval_<name>, one directory inside model_dir), "
                                                   "given: 'a/b'"),
    (lambda: EvalSpec(fn, name="../../outside"), ValueError, "`name` must not contain '/'"),
    (lambda: EvalSpec(fn, throttle_secs=float("inf")), ValueError,
     "`throttle_secs` must be a finite number of seconds, given: inf; pass a large number of seconds instead"),
    (lambda: EvalSpec(fn, start_delay_secs=float("inf")), ValueError,
     "`start_delay_secs` must be a finite number of seconds, given: inf"),
])
def test_bad_exporter_and_spec_arguments_are_refused_at_construction(build, error, fragment):
    with pytest.raises(error) as raised:
        build()
    assert fragment in str(raised.value)


def test_compare_fn_with_its_other_arguments_bound_is_accepted():
    import functools

    BestExporter(compare_fn=functools.partial(with_default, threshold=0.5))
    BestExporter(compare_fn=functools.partial(three_arguments, threshold=0.5))
    BestExporter(compare_fn=lambda best_eval_result, current_eval_result, **unused: True)


def test_estimator_evaluate_refuses_a_name_that_leaves_model_dir(tmp_path):
    from tests.estimator.estimator_toy import batches, make_estimator

    est = make_estimator(tmp_path)
    with pytest.raises(ValueError, match="`name` must not contain '/'"):
        est.evaluate(lambda: batches(), name="../../outside")
