"""Child process of test_exports_on_s3.py: exports the latest checkpoint of the local model_dir
``argv[1]`` to the object-store base ``argv[2]`` (the client configured by ``AWS_ENDPOINT_URL``
and ``AWS_*`` in the environment) and SIGKILLs itself when the export's manifest is about to be
written: every data object is uploaded, the manifest is not."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402
from tests.estimator.estimator_toy import make_estimator  # noqa: E402


def die(*args: object, **kwargs: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    ObjectStoreStorage.commit = die  # between the last data object and the manifest
    make_estimator(sys.argv[1]).export(sys.argv[2])
    sys.exit("the export was not killed")
