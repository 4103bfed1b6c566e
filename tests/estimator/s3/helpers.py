"""Helpers of the Estimator-on-object-store tests."""
from __future__ import annotations

import os

from supervisor.estimator import RunConfig
from tests.estimator.estimator_toy import make_estimator
from tests.s3_fixtures import options as fixture_options


def options(endpoint):
    """The fixtures' client options with fsspec's instance cache on, as users have it: one client
    per configuration, not a new one (about 0.5 s each on a loaded CI machine) per `storage_for`."""
    return {**fixture_options(endpoint), "skip_instance_cache": False}


def s3_estimator(url, opts, *, save_steps=5, **kwargs):
    config = RunConfig(url, save_checkpoints_steps=save_steps, log_step_count_steps=0, save_summary_steps=0,
                       storage_options=opts)
    return make_estimator(url, config=config, **kwargs)


def download(storage, url, directory):
    """Every object under ``url`` copied into ``directory`` (what a synced TensorBoard logdir holds)."""
    for name in storage.list_files(url):
        target = os.path.join(directory, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(storage.read_bytes(storage.join(url, name)))
