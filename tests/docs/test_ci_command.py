"""CI runs exactly the README's test command (`.ci/run` says so; this keeps the two in step), and
the command's plugins come with the ``[test]`` extra it installs: ``-n 2`` needs pytest-xdist in a
fresh virtual environment, not only on a machine that happens to have it."""
from __future__ import annotations

import configparser
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme_test_command() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = [line.strip() for line in f if 'pip install -c constraints.txt -e ".[test]"' in line]
    assert len(lines) == 1, f"README.md: expected one test set-up line, found {lines}"
    return lines[0]


def test_ci_runs_the_readmes_test_command():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        commands = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert commands[-1] == _readme_test_command(), (commands[-1], _readme_test_command())


def test_the_test_extra_installs_what_the_command_uses():
    command = _readme_test_command()
    assert re.search(r"python -m pytest -q -n 2 --dist worksteal$", command), command
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    extra = config["options.extras_require"]["test"].split()
    assert any(re.fullmatch(r"pytest-xdist(>=3\.2)?", name) for name in extra), extra  # worksteal: 3.2+
