"""``peer_replicas`` (issue 33): the arguments refused at the front door's construction, naming the
value and the fix; who keeps whose replicas; one node (no partner) is a WARNING and no replicas;
without ``peer_replicas`` the sharded front door is unchanged."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import supervisor
from supervisor.checkpoint.tiers.peers import PeerReplicatedCheckpointManager, make_sharded_manager, partners, \
    ranks_per_node
from supervisor.checkpoint.tiers.sharded import ShardedTieredCheckpointManager
from supervisor.state import TrainingState

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"peer_replicas": True}, ValueError, "without local_dir"),
    ({"peer_replicas": True, "local_dir": "{tmp}/l"}, ValueError, "needs checkpoint_format='dcp'.*got checkpoint_format='torch'"),
    ({"peer_replicas": "yes", "local_dir": "{tmp}/l", "checkpoint_format": "dcp"}, TypeError, "peer_replicas must be True or False"),
])
def test_bad_peer_replicas_are_refused_at_construction(tmp_path, kwargs, error, match):
    kwargs = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=match):
        supervisor.MonitoredTrainingSession(str(tmp_path / "logdir"), torch.nn.Linear(1, 1), save_summaries_steps=None,
                                            log_step_count_steps=None, **kwargs)


@pytest.mark.parametrize("world, environ, expected", [
    (1, {}, None),  # no process group: one node
    (4, {"LOCAL_WORLD_SIZE": "4"}, None),  # one node of 4 ranks
    (4, {"LOCAL_WORLD_SIZE": "2"}, 2),
    (8, {"LOCAL_WORLD_SIZE": "1"}, 1),
])
def test_ranks_per_node(world, environ, expected):
    assert ranks_per_node(world, environ) == expected


@pytest.mark.parametrize("world, environ, match", [
    (4, {}, "needs LOCAL_WORLD_SIZE.*got None.*torchrun"),
    (6, {"LOCAL_WORLD_SIZE": "4"}, "WORLD_SIZE=6 is not a multiple of LOCAL_WORLD_SIZE=4"),
    (4, {"LOCAL_WORLD_SIZE": "zero"}, "got 'zero'"),
])
def test_ranks_per_node_refuses_what_cannot_place_a_partner(world, environ, match):
    with pytest.raises(ValueError, match=match):
        ranks_per_node(world, environ)


def test_each_rank_keeps_the_replicas_of_the_previous_node_s_rank_of_its_slot():
    assert [partners(r, 4, 2) for r in range(4)] == [(2, 2), (3, 3), (0, 0), (1, 1)]
    assert [partners(r, 6, 2) for r in range(6)] == [(2, 4), (3, 5), (4, 0), (5, 1), (0, 2), (1, 3)]
    for world, per_node in ((6, 2), (8, 4), (9, 3)):  # every rank's replicas on another node, each kept once
        holders = [partners(r, world, per_node)[0] for r in range(world)]
        assert sorted(holders) == list(range(world))
        assert all(h // per_node != r // per_node for r, h in enumerate(holders))


def test_one_node_warns_and_keeps_no_replicas(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    manager = make_sharded_manager(str(tmp_path / "logdir"), peer_replicas=True, local_dir=str(tmp_path / "local"),
                                   persist_every_steps=2, save_mode="sync")
    assert isinstance(manager, PeerReplicatedCheckpointManager) and manager.replica_root is None
    assert "this job runs on one node" in caplog.text and "none are kept" in caplog.text
    model = torch.nn.Linear(2, 2)
    state = TrainingState({"model": model})
    manager.open()
    try:
        manager.save(0, state)
        manager.wait()
        assert manager.restore(TrainingState({"model": torch.nn.Linear(2, 2)})).global_step == 0
    finally:
        manager.close()
    assert sorted(os.listdir(tmp_path / "local")) == ["rank-0"]


def test_without_peer_replicas_the_sharded_manager_is_unchanged(tmp_path):
    manager = make_sharded_manager(str(tmp_path / "logdir"), local_dir=str(tmp_path / "local"), persist_every_steps=2)
    assert type(manager) is ShardedTieredCheckpointManager
