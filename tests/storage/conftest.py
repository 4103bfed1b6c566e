"""The storage tests use the shared object-store fixtures (a real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
from tests.s3_fixtures import FaultProxy, MotoServer, make_bucket, options  # noqa: F401 - imported by tests
