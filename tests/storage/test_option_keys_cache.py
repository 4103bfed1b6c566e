"""The ``storage_options`` keys of the s3:// client are cached on disk per installed client
(`supervisor.checkpoint.storage.s3.config.option_keys`), so checking options at construction
imports no client (issue 33: s3fs/aiobotocore/botocore cost ~0.4 s before a tiered resume's first
step). The cache must hold exactly what the client's signatures say, a damaged one is computed
again, and with it a bad key is still refused at construction with the same message."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.checkpoint.storage.s3 import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config.option_keys.cache_clear()
    yield tmp_path / "torch-supervisor"
    config.option_keys.cache_clear()


def test_the_cached_keys_are_the_clients_own_and_a_damaged_cache_is_rewritten(cache_home):
    keys = config.option_keys()
    [name] = os.listdir(cache_home)
    stored = json.loads((cache_home / name).read_text())
    assert {k: set(v) for k, v in stored.items()} == config._client_keys()
    assert "endpoint_url" in keys[""] and "region_name" in keys["client_kwargs"] and "read_timeout" in keys["config_kwargs"]
    (cache_home / name).write_text('{"": ["endpoint_url"')  # torn
    config.option_keys.cache_clear()
    assert config.option_keys() == keys
    assert {k: set(v) for k, v in json.loads((cache_home / name).read_text()).items()} == config._client_keys()


def test_an_unwritable_cache_only_costs_the_import(tmp_path, monkeypatch):
    (tmp_path / "torch-supervisor").write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config.option_keys.cache_clear()
    try:
        assert "endpoint_url" in config.option_keys()[""]
    finally:
        config.option_keys.cache_clear()


CHECK = """
import sys
from supervisor import CheckpointManager
try:
    CheckpointManager("s3://bucket/run", storage_options={"endpoint": "http://127.0.0.1:9"})
except ValueError as e:
    print("ValueError:", e)
print("imported:", sorted(m for m in ("s3fs", "aiobotocore", "botocore") if m in sys.modules))
"""


def test_with_the_cache_a_bad_key_is_refused_at_construction_without_importing_the_client(cache_home):
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(cache_home.parent)}
    cold = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=240)
    warm = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=240)
    for out in (cold, warm):
        assert "ValueError: storage_options has the key 'endpoint'" in out.stdout, out.stdout + out.stderr
        assert "did you mean 'endpoint_url'" in out.stdout
    assert "imported: ['aiobotocore', 'botocore', 's3fs']" in cold.stdout  # the first one reads the client
    assert "imported: []" in warm.stdout, warm.stdout


FSSPEC_CHECK = """
import sys
from supervisor.checkpoint.storage import storage_for
storage = storage_for("s3://bucket/run", {"endpoint_url": "http://127.0.0.1:9"})
print("part_size:", storage.part_size, "fsspec imported:", "fsspec" in sys.modules)
"""


def test_fsspec_is_imported_at_construction_only_when_it_holds_s3_configuration(cache_home, tmp_path):
    """fsspec's FSSPEC_S3 configuration still applies (it may set the transfer knobs); without
    any (no FSSPEC_* variable, no configuration folder) the storage is made without fsspec."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSSPEC")}
    env.update(PYTHONPATH=ROOT, XDG_CACHE_HOME=str(cache_home.parent), FSSPEC_CONFIG_DIR=str(tmp_path / "none"))
    plain = [subprocess.run([sys.executable, "-c", FSSPEC_CHECK], env=env, capture_output=True, text=True,
                            timeout=240) for _ in range(2)][-1]  # the first one may fill the key cache
    configured = subprocess.run([sys.executable, "-c", FSSPEC_CHECK], env={**env, "FSSPEC_S3": '{"part_size": 6291456}'},
                                capture_output=True, text=True, timeout=240)
    assert f"part_size: {8 << 20} fsspec imported: False" in plain.stdout, plain.stdout + plain.stderr
    assert "part_size: 6291456 fsspec imported: True" in configured.stdout, configured.stdout + configured.stderr
