"""examples/warm_start.py runs in the suite: init_fn + restore_partial warm start, then a resume
that does not warm start again."""
from __future__ import annotations

import os

from tests import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_warm_start_example(tmp_path):
    result = zygote.python([os.path.join(ROOT, "examples", "warm_start.py"), "--workdir", tmp_path, "--steps", "60"],
                           timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})  # a tiny model: one intra-op thread
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "loaded 4 key(s), skipped 2, 2 missing from the checkpoint" in out
    assert "skipped head.weight: not matched by include" in out and "missing adapter.0.weight" in out
    assert "trunk.2.weight equals the pre-trained one: True" in out
    assert "fine-tune run 1: warm-started by init_fn" in out
    assert "fine-tune run 2: restored its own checkpoint at step 60" in out
    assert "init_fn calls: 1" in out
