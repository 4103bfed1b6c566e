"""The multi-rank tests on an object-store logdir (sharded checkpoints, read-once restores, ranks
configured by ``storage_options``, waiting on the chief) use the shared fixtures (a real moto
server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
