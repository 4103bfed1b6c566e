"""Exports to an object-store URL are not supported yet (issue 24 item 6, left for later): the
export is refused before anything is written, with a clear error, instead of creating a local
directory named ``s3:`` in the working directory."""
from __future__ import annotations

import os

import pytest

from supervisor.estimator.export_writer import write_export

pytestmark = pytest.mark.timeout(60)


def test_export_to_a_url_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"export_dir_base 's3://bucket/run/export'.*object-store URL"):
        write_export(object(), "s3://bucket/run/export", "/nowhere/model.ckpt-1", None)
    assert os.listdir(tmp_path) == []
