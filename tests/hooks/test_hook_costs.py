"""The hook-cost benchmark stays runnable and covers every built-in hook (timings are not
asserted here: they belong to ``benchmarks/``, not to a test on a shared machine)."""
from __future__ import annotations

import math

import hooks
from benchmarks.hook_costs import measure_hook_costs


def test_measures_every_builtin_hook():
    rows = measure_hook_costs(n_steps=50, rounds=1)
    names = {name.split(" ")[0] for name, _ in rows}
    builtin = {name for name in hooks.__all__
               if isinstance(getattr(hooks, name), type) and issubclass(getattr(hooks, name), hooks.Hook)}
    # CheckpointSaverHook needs the checkpoint engine's manager; it is timed with it.
    assert builtin - {"Hook", "CheckpointSaverHook"} <= names
    assert rows[0][0] == "(no hook: baseline)" and rows[0][1] > 0
    assert all(math.isfinite(us) for _, us in rows)
