"""The Estimator-on-object-store tests (the sidecar evaluator included) use the shared fixtures (a
real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
