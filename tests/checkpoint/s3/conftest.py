"""The checkpoint tests on an object-store logdir (the manager, fencing, the readers, a killed or
stale writer) use the shared fixtures (a real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
