"""Peer replicas' loose ends (SPEC §13, §17, issue 33), on one real run of 4 gloo ranks as 2
"nodes" with ``peer_replicas=True``, node 1 then lost: ``ls --local-dir`` of node 0 lists the
``peer-*`` replicas it keeps with its own parts and says that a restart restores from the local
tiers, the lost ranks from those replicas; ``restore_step=`` of a step the logdir lacks restores it
from the local tiers, the lost ranks fetching their replicas, bit-exact, and the replicas of newer
steps lose their mark as the ranks' own newer parts do."""
from __future__ import annotations

import shutil

import pytest

from tests.cli.helpers import cli, cli_json
from tests.distributed.harness import describe
from tests.tiers.test_tier_peers import _job, _restorable
from tests.tiers.test_tier_sharded_kills import _logdir_step, _verified

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_ls_lists_the_peer_replicas_and_a_chosen_step_uses_them_when_a_ranks_own_part_is_lost(tmp_path):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    first = _job(logdir, local, 6, crash="yes")  # ends right after step 6's local commit and replicas
    assert _logdir_step(logdir) == 4
    shutil.rmtree(f"{local}/node1")  # node 1 lost: ranks 2 and 3 keep only their replicas on node 0
    common = set.intersection(*(_restorable(local, rank) for rank in range(4)))
    assert max(common) == 6, common
    listed = cli("ls", logdir, "--local-dir", f"{local}/node0")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "rank directories 0, 1 of a 4-rank job; peer replicas of ranks 2, 3" in listed.stdout, listed.stdout
    assert any(line.split()[:4] == ["6", "model.ckpt-6", "0,1", "2,3"] for line in listed.stdout.splitlines())
    assert "a restart restores step 6 from the local tiers (every rank holds a committed part that verifies; " \
           "ranks 2, 3 by their peer replicas here)" in listed.stdout, listed.stdout
    _, rows = cli_json("ls", logdir, "--local-dir", f"{local}/node0")
    replicas = {(r["rank"], r["step"]) for r in rows if r.get("replica")}
    assert {(2, 6), (3, 6)} <= replicas and all(r["rank"] in (2, 3) for r in rows if r.get("replica")), rows

    chosen = min(s for s in common if s > 4)  # the logdir lacks it: only the local tiers hold it
    resumed = _job(logdir, local, 6, env={"RESTORE_STEP": str(chosen)})
    assert [r.result["start"] for r in resumed] == [chosen] * 4, describe(resumed)
    assert f"restored the chosen step {chosen} from the local tier {local}/node0 on each of the 4 rank(s)" in \
        resumed[0].output, describe(resumed)
    assert "restore_step: 2 rank(s) without their own part restored their peer's replica" in resumed[0].output
    assert {r.result["end_digest"] for r in resumed} == {first[0].result["end_digest"]}  # bit-exact to step 6
    assert chosen in _verified(f"{local}/node1/rank-2") and chosen in _verified(f"{local}/node1/rank-3")
    if chosen < 6:  # node 0's replicas of rank 2's and 3's step 6 (the abandoned timeline) lost their mark
        assert f"the peer replicas of the newer step(s) 6 in {local}/node0/peer-2 are no longer restored" in \
            resumed[0].output, describe(resumed)
