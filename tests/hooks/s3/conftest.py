"""The hooks on an object-store checkpoint_dir use the shared fixtures (a real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
