"""Every hook checks its arguments at construction: the right type, a message naming the argument."""
from __future__ import annotations

import pytest

import hooks
from supervisor.testing import InMemorySummaryWriter

W = InMemorySummaryWriter()

CASES = [
    # StopAtStepHook
    (hooks.StopAtStepHook, {}, ValueError, "one of num_steps or last_step must be given"),
    (hooks.StopAtStepHook, {"num_steps": 1, "last_step": 2}, ValueError, "only one of num_steps or last_step"),
    (hooks.StopAtStepHook, {"num_steps": 0}, ValueError, "num_steps must be a positive integer"),
    (hooks.StopAtStepHook, {"num_steps": "3"}, TypeError, "num_steps must be a positive integer"),
    (hooks.StopAtStepHook, {"last_step": -1}, ValueError, "last_step must be a non-negative integer"),
    (hooks.StopAtStepHook, {"last_step": 2.0}, ValueError, "last_step must be a non-negative integer"),
    # StopAtSecsHook
    (hooks.StopAtSecsHook, {"stop_after_secs": 0}, ValueError, "stop_after_secs must be a positive number"),
    (hooks.StopAtSecsHook, {"stop_after_secs": None}, TypeError, "stop_after_secs"),
    # StepCounterHook
    (hooks.StepCounterHook, {"every_n_secs": 5}, ValueError, "every_n_steps=100 and every_n_secs=5; set every_n_steps=None"),
    (hooks.StepCounterHook, {"every_n_steps": None}, ValueError, "exactly one of every_n_steps and every_n_secs"),
    (hooks.StepCounterHook, {"every_n_steps": 0}, ValueError, "every_n_steps must be a positive integer"),
    (hooks.StepCounterHook, {"every_n_steps": None, "every_n_secs": -1}, ValueError, "every_n_secs must be a positive"),
    (hooks.StepCounterHook, {"summary_writer": object()}, TypeError, "summary_writer must be"),
    (hooks.StepCounterHook, {"output_dir": 3}, TypeError, "output_dir must be a directory path"),
    (hooks.StepCounterHook, {"clock": "now"}, TypeError, "clock must provide"),
    # SummarySaverHook
    (hooks.SummarySaverHook, {}, ValueError, "exactly one of save_steps and save_secs"),
    (hooks.SummarySaverHook, {"save_steps": 1, "save_secs": 1}, ValueError, "save_steps=1 and save_secs=1"),
    (hooks.SummarySaverHook, {"save_steps": -2}, ValueError, "save_steps must be a positive integer"),
    (hooks.SummarySaverHook, {"save_steps": 1, "summary_fn": 3}, TypeError, "summary_fn must be a callable"),
    (hooks.SummarySaverHook, {"save_steps": 1, "fetches": ()}, ValueError, "leaves nothing to write"),
    (hooks.SummarySaverHook, {"save_steps": 1, "fetches": 3}, TypeError, "fetches must be None"),
    (hooks.SummarySaverHook, {"save_steps": 1, "fetches": [len]}, TypeError, "list entry must be an output key"),
    (hooks.SummarySaverHook, {"save_steps": 1, "fetches": {"t": 3}}, TypeError, r"fetches\['t'\] must be"),
    (hooks.SummarySaverHook, {"save_steps": 1, "fetches": {"": "loss"}}, TypeError, "tag must be a non-empty"),
    (hooks.SummarySaverHook, {"save_steps": 1, "feed_summarize": "yes"}, TypeError, "feed_summarize must be True or False"),
    # LoggingTensorHook
    (hooks.LoggingTensorHook, {"tensors": ["loss"]}, ValueError, "at_end=True and/or exactly one of every_n_iter"),
    (hooks.LoggingTensorHook, {"tensors": ["loss"], "every_n_iter": 1, "every_n_secs": 1}, ValueError, "exactly one"),
    (hooks.LoggingTensorHook, {"tensors": ["loss"], "every_n_iter": 0}, ValueError, "every_n_iter must be a positive integer"),
    (hooks.LoggingTensorHook, {"tensors": ["loss"], "every_n_secs": 0}, ValueError, "every_n_secs must be a positive"),
    (hooks.LoggingTensorHook, {"tensors": "loss", "every_n_iter": 1}, TypeError, r"the string 'loss'; write \['loss'\]"),
    (hooks.LoggingTensorHook, {"tensors": [], "every_n_iter": 1}, ValueError, "tensors is empty"),
    (hooks.LoggingTensorHook, {"tensors": 5, "every_n_iter": 1}, TypeError, "tensors must be a list"),
    (hooks.LoggingTensorHook, {"tensors": {"a": 1}, "every_n_iter": 1}, TypeError, r"tensors\['a'\] must be"),
    (hooks.LoggingTensorHook, {"tensors": ["loss"], "at_end": 1}, TypeError, "at_end must be True or False"),
    (hooks.LoggingTensorHook, {"tensors": ["loss"], "every_n_iter": 1, "formatter": "%s"}, TypeError, "formatter must be a callable"),
    # NanTensorHook
    (hooks.NanTensorHook, {"loss_key": ""}, TypeError, "loss_key must be an output key"),
    (hooks.NanTensorHook, {"loss_key": 3}, TypeError, "loss_key must be an output key"),
    (hooks.NanTensorHook, {"fail_on_nan_loss": None}, TypeError, "fail_on_nan_loss must be True or False"),
    # GlobalStepWaiterHook, FinalOpsHook, FeedFnHook
    (hooks.GlobalStepWaiterHook, {"wait_until_step": 1.5}, ValueError, "wait_until_step must be an integer"),
    (hooks.GlobalStepWaiterHook, {"wait_until_step": "10"}, TypeError, "wait_until_step must be an integer"),
    (hooks.GlobalStepWaiterHook, {"wait_until_step": 1, "step_fn": 3}, TypeError, "step_fn must be a callable"),
    (hooks.GlobalStepWaiterHook, {"wait_until_step": 1, "poll_secs": 0}, ValueError, "poll_secs must be a positive"),
    (hooks.FinalOpsHook, {"final_fns": 3}, TypeError, "final_fns must be a zero-argument callable"),
    (hooks.FinalOpsHook, {"final_fns": {}}, ValueError, "final_fns is empty"),
    (hooks.FinalOpsHook, {"final_fns": [len, 3]}, TypeError, "final_fns must be"),
    (hooks.FeedFnHook, {"feed_fn": None}, TypeError, "feed_fn must be a callable"),
    # ProfilerHook
    (hooks.ProfilerHook, {}, ValueError, "ProfilerHook: exactly one of save_steps and save_secs"),
    (hooks.ProfilerHook, {"save_steps": 1, "output_dir": ""}, TypeError, "output_dir must be a directory path"),
    (hooks.ProfilerHook, {"save_steps": 1, "profile_memory": "no"}, TypeError, "profile_memory must be True or False"),
    # early stopping
    (hooks.stop_if_higher_hook, {"estimator_or_eval_dir": "e", "metric_name": "", "threshold": 1}, TypeError, "metric_name must be"),
    (hooks.stop_if_higher_hook, {"estimator_or_eval_dir": "e", "metric_name": "acc", "threshold": "1"}, TypeError, "threshold must be a number"),
    (hooks.stop_if_lower_hook, {"estimator_or_eval_dir": "e", "metric_name": "loss", "threshold": 1, "min_steps": -1}, ValueError, "min_steps must be a non-negative"),
    (hooks.stop_if_lower_hook, {"estimator_or_eval_dir": 3, "metric_name": "loss", "threshold": 1}, TypeError, "estimator_or_eval_dir must be"),
    (hooks.stop_if_lower_hook, {"estimator_or_eval_dir": "e", "metric_name": "loss", "threshold": 1, "eval_dir": 3}, TypeError, "eval_dir must be a directory path"),
    (hooks.stop_if_no_decrease_hook, {"estimator_or_eval_dir": "e", "metric_name": "loss", "max_steps_without_decrease": 0}, ValueError, "max_steps_without_decrease must be a positive"),
    (hooks.stop_if_no_increase_hook, {"estimator_or_eval_dir": "e", "metric_name": "acc", "max_steps_without_increase": None}, TypeError, "max_steps_without_increase must be"),
    (hooks.stop_if_higher_hook, {"estimator_or_eval_dir": "e", "metric_name": "acc", "threshold": 1, "run_every_steps": 10}, ValueError, "run_every_secs=60; set run_every_steps=None .*or run_every_secs=None"),
    (hooks.make_early_stopping_hook, {"estimator_or_eval_dir": "e", "should_stop_fn": True}, TypeError, "should_stop_fn must be a callable"),
    (hooks.make_early_stopping_hook, {"estimator_or_eval_dir": "e", "should_stop_fn": bool, "run_every_secs": 0}, ValueError, "run_every_secs must be a positive"),
    # ProgressBarHook
    (hooks.ProgressBarHook, {"total_steps": 0}, ValueError, "total_steps must be a positive integer"),
    (hooks.ProgressBarHook, {"every_n_steps": 5, "every_n_secs": 5}, ValueError, "exactly one of every_n_steps and every_n_secs"),
    (hooks.ProgressBarHook, {"fetches": [3]}, TypeError, "fetches: a list entry must be an output key"),
    (hooks.ProgressBarHook, {"use_tqdm": "auto"}, TypeError, "use_tqdm must be True, False or None"),
    (hooks.ProgressBarHook, {"tqdm_kwargs": ["file"]}, TypeError, "tqdm_kwargs must be a dict"),
    (hooks.ProgressBarHook, {"desc": 1}, TypeError, "desc must be a string"),
]


@pytest.mark.parametrize(("factory", "kwargs", "error", "words"), CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_bad_arguments_are_refused_at_construction(factory, kwargs, error, words):
    with pytest.raises(error, match=words):
        factory(**kwargs)


def test_the_message_names_the_value_too():
    with pytest.raises(ValueError, match="got 0"):
        hooks.StopAtStepHook(num_steps=0)
    with pytest.raises(ValueError, match="got -2"):
        hooks.SummarySaverHook(save_steps=-2, summary_writer=W)


def test_every_public_hook_is_exported():
    import hooks as package

    for name in package.__all__:
        assert getattr(package, name) is not None
    assert package.Hook is __import__("supervisor").Hook
