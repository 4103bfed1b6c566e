"""Fixtures of the hook tests: a fake clock, an in-memory writer, a clean writer cache."""
from __future__ import annotations

import pytest

from supervisor.summary import SummaryWriterCache
from supervisor.testing import FakeClock, InMemorySummaryWriter


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def writer() -> InMemorySummaryWriter:
    return InMemorySummaryWriter()


@pytest.fixture(autouse=True)
def _close_cached_writers():
    """Cached writers own a thread each: close them so no test leaks one."""
    yield
    SummaryWriterCache.clear()
