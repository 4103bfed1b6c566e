"""The tier tests put the logdir on a local directory or on a real moto S3 server on loopback."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name
