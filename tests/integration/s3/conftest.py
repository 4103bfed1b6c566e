"""Whole trainers on an object-store logdir whose store fails (a silent endpoint, a torchrun job
with a killed rank) use the shared fixtures (a real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
