"""A 2-rank gloo job (real process groups on loopback) on an ``s3://`` logdir whose ONLY
configuration of the S3 client is ``storage_options=`` (no ``AWS_*``, no ``~/.aws``, no
``FSSPEC_S3_*`` in the ranks' environment): it saves, and a resumed run restores the chief's
checkpoint on both ranks — rank 1 reading it with those options too — and ends bit-identical to
an uninterrupted run (SPEC §12, §16; issue 24 item 1)."""
from __future__ import annotations

import json
import os
import re

import pytest

from supervisor.checkpoint import latest_checkpoint
from tests.distributed.harness import describe, run_job
from tests.s3_fixtures import options

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # two ranks' start-up: ~10-20 s

#: What else could configure the client: scrubbed from the ranks' environment, and the
#: configuration files pointed at nothing (no instance metadata either: no host to ask).
NO_CLIENT_CONFIG = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "AWS_EC2_METADATA_DISABLED": "true"}


def _scrub_client_environment(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "FSSPEC_S3")):
            monkeypatch.delenv(name)


def test_both_ranks_save_and_resume_bit_exact_with_storage_options_only(s3_server, s3_root, s3_storage,
                                                                        monkeypatch):
    url = s3_root + "/run"
    _scrub_client_environment(monkeypatch)
    results = run_job("s3_resume", 2, url, json.dumps(options(s3_server.endpoint)), timeout=180,
                      module="tests.distributed.s3.rank_worker", extra_env=NO_CLIENT_CONFIG)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        first, reference, resumed = r.result["first"], r.result["reference"], r.result["resumed"]
        assert (first["start"], first["end"]) == (0, 6), describe(results)
        assert (resumed["start"], resumed["end"]) == (6, 12), describe(results)
        # every rank restored the chief's checkpoint on the URL (rank 1 through storage_options)
        assert re.findall(r"restored step=(\d+) from (\S+)", r.output) == [("6", f"{url}/model.ckpt-6")], r.output
        assert resumed["digest"] == reference["digest"], describe(results)  # weights and optimizer
        assert resumed["rng"] == reference["rng"], describe(results)  # this rank's own RNG stream
    assert results[0].result["resumed"]["digest"] == results[1].result["resumed"]["digest"]
    assert latest_checkpoint(url, storage=s3_storage) == f"{url}/model.ckpt-12"
