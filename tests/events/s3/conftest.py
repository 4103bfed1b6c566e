"""The events tests on an object store use the shared fixtures (a real moto server on loopback)."""
from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name


def cached_options(endpoint: str, **config: object) -> dict:
    """`tests.s3_fixtures.options` without ``skip_instance_cache``: fsspec reuses one client per
    endpoint, as it does for users (a reader such as `read_scalars` is called again and again)."""
    from tests.s3_fixtures import options

    found = options(endpoint, **config)
    found.pop("skip_instance_cache")
    return found
