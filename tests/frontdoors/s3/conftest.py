"""The front doors on an object-store logdir (a lone worker included) use the shared fixtures (a
real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
