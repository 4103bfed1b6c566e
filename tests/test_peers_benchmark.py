"""benchmarks/peers.py stays runnable and prints every figure (the figures are not asserted: they
belong to ``benchmarks/``, not to a test on a shared machine)."""
from __future__ import annotations

import re

import pytest

from benchmarks.peers import ROOT
from tests import zygote

SPREAD = r"\d+(\.\d+)? \(\d+(\.\d+)?-\d+(\.\d+)?\)"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_peers_benchmark_quick(capsys):
    from benchmarks.peers import main

    def forked(argv: list[str], env: dict[str, str], log: str) -> zygote.Forked:  # imports not paid per rank
        return zygote.Forked(argv[0], argv[1:], output=log, env=env, cwd=ROOT)

    result = main(["--quick", "--timeout", "240"], spawn=forked)
    out = capsys.readouterr().out
    for row in ("part per rank sent to its partner", "peer copy: the exchange", "peer copy: commit -> every replica",
                "logdir copy (local dir)", "(to commit), replicas on", "(to commit), replicas off", "steps lost without replicas",
                "steps lost with replicas", "ms per training step"):
        (line,) = [line for line in out.splitlines() if row in line]
        assert re.search(SPREAD, line), line
    assert result["sent_mib"] > 0 and result["peer_ms"] > 0 and result["logdir_ms"] > 0
    assert result["lost_with"] <= result["lost_without"]
