"""A user's own ``hooks.py`` / ``supervisor.py`` next to the training script gets an error that
names the file and the fix (issue 10 item 5), and ``import supervisor`` never imports ``hooks``
(SPEC §1). Real subprocesses, run from the script's directory as a user would."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_script(directory, source):
    (directory / "train.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    # a fresh interpreter: what is imported at start (the user's hooks.py first) is the point
    return subprocess.run([sys.executable, "train.py"], cwd=directory, capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_users_hooks_py_is_named_when_a_front_door_needs_the_builtin_hooks(tmp_path):
    (tmp_path / "hooks.py").write_text("class MyHook:\n    pass\n")
    result = _run_script(tmp_path, "import torch\nimport hooks\nfrom supervisor import MonitoredTrainingSession\n"
                                   "MonitoredTrainingSession('ckpt', model=torch.nn.Linear(1, 1))\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and str(tmp_path / "hooks.py") in last, result.stderr
    assert "rename your hooks.py" in last and "AttributeError" not in result.stderr


def test_a_users_supervisor_py_is_named_when_hooks_is_imported(tmp_path):
    (tmp_path / "supervisor.py").write_text("print('my process supervisor')\n")
    result = _run_script(tmp_path, "import hooks\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and str(tmp_path / "supervisor.py") in last, result.stderr
    assert "rename your supervisor.py" in last and "supervisord" in last


def test_importing_supervisor_does_not_import_hooks(tmp_path):
    result = _run_script(tmp_path, "import sys\nimport supervisor\nimport supervisor.checkpoint\n"
                                   "print(sorted(m for m in sys.modules if m == 'hooks' or m.startswith('hooks.')))\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
