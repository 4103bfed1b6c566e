"""The hook-cost benchmark stays runnable and covers every built-in hook (timings are not
asserted here: they belong to ``benchmarks/``, not to a test on a shared machine). Its hooks come
from ``hooks.__all__``: only a hook that cannot be built with no arguments needs an entry."""
from __future__ import annotations

import math

import pytest

import hooks
from benchmarks.hook_costs import NOT_MEASURED_HERE, builtin_hooks, hook_factories, measure_hook_costs
from supervisor import Hook


def test_measures_every_builtin_hook():
    rows = measure_hook_costs(n_steps=50, rounds=1)
    names = {name.split(" ")[0] for name, _ in rows}
    builtin = {name for name in hooks.__all__
               if isinstance(getattr(hooks, name), type) and issubclass(getattr(hooks, name), hooks.Hook)}
    assert builtin - {"Hook"} - set(NOT_MEASURED_HERE) <= names
    assert set(builtin_hooks()) == builtin - {"Hook"}
    assert rows[0][0] == "(no hook: baseline)" and rows[0][1] > 0
    assert all(math.isfinite(us) for _, us in rows)


class QuietHook(Hook):
    """A new hook with no required arguments."""

    def after_run(self, run_context, run_values):
        pass


class ThresholdHook(Hook):
    """A new hook that needs an argument."""

    def __init__(self, threshold):
        self.threshold = threshold


def test_a_new_hook_without_required_arguments_needs_no_edit(tmp_path):
    factories = hook_factories(str(tmp_path), {"QuietHook": QuietHook, "NanTensorHook": hooks.NanTensorHook})
    assert list(factories) == ["(no hook: baseline)", "Hook (no-op after_run)", "QuietHook", "NanTensorHook"]
    assert isinstance(factories["QuietHook"](), QuietHook)
    rows = dict(measure_hook_costs(n_steps=20, rounds=1, classes={"QuietHook": QuietHook}))
    assert math.isfinite(rows["QuietHook"])


def test_a_hook_that_needs_arguments_fails_naming_what_to_add(tmp_path):
    with pytest.raises(LookupError, match=r"ThresholdHook cannot be built with no arguments .*threshold.*add it to "
                                          r"benchmarks/hook_costs.py's HOOK_ARGUMENTS"):
        hook_factories(str(tmp_path), {"ThresholdHook": ThresholdHook})
