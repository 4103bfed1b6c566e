"""The storage conformance suite (tests/storage/conformance.py) on the three backends: a local
directory, a bucket of a real S3-compatible server (moto over HTTP, the real s3fs/botocore
client) and fsspec's in-process memory filesystem (``memory://``): the ``backend`` fixture of
tests/s3_fixtures.py, which every test of the seam on all backends uses."""
from __future__ import annotations

import pytest

from tests.storage.conformance import *  # noqa: F401,F403 - the suite's tests

pytestmark = pytest.mark.timeout(60)

