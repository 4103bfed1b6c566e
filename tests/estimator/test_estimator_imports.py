"""Import rules: the engine and the hooks never import `supervisor.estimator`; importing the
estimator package works in a fresh interpreter (no import cycle through `hooks`)."""
from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import supervisor, hooks, supervisor.frontdoors.training_session, supervisor.frontdoors.supervisor
loaded = sorted(m for m in sys.modules if m.startswith("supervisor.estimator"))
assert not loaded, loaded
"""


def test_engine_and_hooks_do_not_import_the_estimator():  # fresh interpreters: what an import imports is the point
    subprocess.run([sys.executable, "-c", CHECK], check=True, timeout=120)


def test_estimator_package_imports_first_in_a_fresh_interpreter():
    subprocess.run([sys.executable, "-c", "import supervisor.estimator as e; e.train_and_evaluate; e.Experiment"],
                   check=True, timeout=120)
