"""``storage_options`` and ``lock``/``lease_secs`` mistakes are refused at construction (issue 34
item 9), naming the key, the value and the fix; no server is needed (none is contacted).

Before: a misspelt key (``endpoint``) failed at session start with ``AioSession.__init__() got an
unexpected keyword argument 'endpoint'``, reported against the events file; ``{"endpoint_url":
5000}`` with ``'int' object is not iterable``; ``lock="flock"`` on an ``s3://`` logdir was refused
only at session start; ``lease_secs`` on a local logdir (``lock="auto"``: a flock) was ignored.
"""
from __future__ import annotations

import os

import pytest
import torch

import hooks
from supervisor import CheckpointManager, MonitoredTrainingSession, Supervisor, latest_checkpoint
from supervisor.estimator import RunConfig
from tests.cli.helpers import cli

pytestmark = pytest.mark.timeout(120)
URL = "s3://bucket/run"


def _model():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


DOORS = {
    "Supervisor": lambda d, **kw: Supervisor(d, *_model(), **kw),
    "MonitoredTrainingSession": lambda d, **kw: MonitoredTrainingSession(d, *_model(), **kw),
    "RunConfig": lambda d, **kw: RunConfig(d, **kw),
    "CheckpointManager": lambda d, **kw: CheckpointManager(d, **kw),
}
OPTION_DOORS = {
    **DOORS,
    "CheckpointSaverHook": lambda d, **kw: hooks.CheckpointSaverHook(d, save_steps=1, **kw),
    "latest_checkpoint": lambda d, **kw: latest_checkpoint(d, **kw),
}

# (storage_options, the exception, what the message must say)
BAD_OPTIONS = [
    ({"endpoint": "http://127.0.0.1:9"}, ValueError, ["'endpoint'", "did you mean 'endpoint_url'"]),
    ({"endpoint_url": 5000}, TypeError, ["storage_options['endpoint_url']", "5000", "str"]),
    ({"client_kwargs": {"endpoint": "http://x"}}, ValueError,
     ["storage_options['client_kwargs']", "'endpoint'", "did you mean 'endpoint_url'"]),
    ({"config_kwargs": {"read_timout": 5}}, ValueError, ["'read_timout'", "did you mean 'read_timeout'"]),
    ({"region_name": "eu-west-1"}, ValueError, ["'region_name'", "client_kwargs"]),
    ({"client_kwargs": "endpoint_url=http://x"}, TypeError, ["storage_options['client_kwargs']", "dict"]),
    ({"anon": "yes"}, TypeError, ["storage_options['anon']", "'yes'"]),
    ({"part_size": "8M"}, TypeError, ["storage_options['part_size']", "'8M'"]),
    ({"max_concurency": 4}, ValueError, ["'max_concurency'", "did you mean 'max_concurrency'"]),
]


@pytest.mark.parametrize("door", sorted(OPTION_DOORS))
@pytest.mark.parametrize(("options", "error", "needles"), BAD_OPTIONS, ids=[repr(b[0]) for b in BAD_OPTIONS])
def test_a_bad_storage_option_is_refused_at_construction(door, options, error, needles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as info:
        OPTION_DOORS[door](URL, storage_options=options)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert os.listdir(tmp_path) == []


def test_the_clients_own_options_are_accepted(tmp_path):
    """s3fs's arguments, botocore's client and config arguments, the project's transfer knobs."""
    options = {
        "anon": False, "key": "k", "secret": "s", "token": None, "use_ssl": False, "requester_pays": False,
        "version_aware": False, "cache_regions": False, "default_block_size": 5 << 20, "profile": None,
        "use_listings_cache": False, "listings_expiry_time": None, "skip_instance_cache": True,
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}, "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "eu-west-1", "verify": False, "endpoint_url": "http://127.0.0.1:9"},
        "config_kwargs": {"s3": {"addressing_style": "path"}, "connect_timeout": 3, "read_timeout": 5,
                          "retries": {"mode": "standard", "total_max_attempts": 2}, "max_pool_connections": 4},
        "part_size": 5 << 20, "max_concurrency": 2, "min_range_size": 1 << 20, "multipart_checksum": None,
        "s3fs_retries": 1,
    }
    for door in OPTION_DOORS.values():
        try:
            door(URL, storage_options=options)
        except (OSError, PermissionError):  # latest_checkpoint asks the (absent) server
            pass
    assert CheckpointManager(URL, storage_options=options).directory == URL


def test_the_cli_refuses_a_misspelt_option_naming_it(tmp_path):
    result = cli("ls", URL, "--storage-options", '{"endpoint": "http://127.0.0.1:9"}')
    assert result.returncode == 2, result.stderr
    assert "'endpoint'" in result.stderr and "'endpoint_url'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("door", sorted(DOORS))
def test_flock_on_an_object_store_is_refused_at_construction(door):
    with pytest.raises(ValueError, match=r"lock='flock'.*s3://bucket/run.*object store.*lock='lease'"):
        DOORS[door](URL, lock="flock")


@pytest.mark.parametrize("door", sorted(DOORS))
def test_lease_secs_with_a_local_flock_is_refused_at_construction(door, tmp_path):
    logdir = str(tmp_path / "run")
    with pytest.raises(ValueError, match=r"lease_secs=5.*lock='auto'.*flock.*lock='lease'"):
        DOORS[door](logdir, lease_secs=5)
    assert not os.path.exists(logdir)
    made = DOORS[door](logdir, lock="lease", lease_secs=5)  # what the message asks for is accepted
    if door == "MonitoredTrainingSession":  # a session, opened by its constructor
        made.close()
