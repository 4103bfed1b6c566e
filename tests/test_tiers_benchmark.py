"""benchmarks/tiers.py stays runnable and prints every figure (its timings are not asserted here:
they belong to ``benchmarks/``, not to a test on a shared machine); its proxy limits the link."""
from __future__ import annotations

import re
import time

import fsspec
import pytest

from benchmarks._s3_server import S3Server
from benchmarks._loopback_proxy import ThrottleProxy
from benchmarks.tiers import ROOT
from tests import zygote

ROWS = ("tiered (local + persist)", "persistent-only (s3)", "DCP async_save (s3)", "plain local restore")
SPREAD = r"-?\d+(\.\d+)? \(-?\d+(\.\d+)?--?\d+(\.\d+)?\)"  # an overhead can be negative (noise)


@pytest.fixture
def lifetime_thread_prefixes(lifetime_thread_prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """fsspec keeps its IO loop and asyncio its resolver executor for the process."""
    return lifetime_thread_prefixes + ("fsspecIO", "asyncio_")


@pytest.mark.slow
def test_throttle_proxy_limits_the_link_both_ways():
    data = b"x" * (4 << 20)  # 0.84 s each way at 5 MB/s; loopback alone takes a fraction of that
    with S3Server() as server, ThrottleProxy(server.port, 5e6) as proxy:
        server.create_bucket("bench")
        fs = fsspec.filesystem("s3", **server.storage_options(endpoint_url=proxy.endpoint, skip_instance_cache=True))
        start = time.monotonic()
        fs.pipe("bench/blob", data)
        uploaded = time.monotonic() - start
        start = time.monotonic()
        assert fs.cat("bench/blob") == data
        downloaded = time.monotonic() - start
    assert uploaded >= len(data) / 5e6 and downloaded >= len(data) / 5e6, (uploaded, downloaded)
    assert proxy.up.carried >= len(data) and proxy.down.carried >= len(data)


@pytest.mark.slow
def test_tiers_benchmark_quick(capsys):
    from benchmarks.tiers import main

    def forked(argv: list[str], env: dict[str, str], log: str) -> zygote.Forked:  # imports not paid per run
        return zygote.Forked(argv[0], argv[1:], output=log, env=env, cwd=ROOT)

    result = main(["--quick"], spawn=forked)
    out = capsys.readouterr().out
    assert out.count("calibration:") >= 2 and "Baseline step (no checkpoint)" in out
    table = out.split("configuration", 1)[1]
    for name in ROWS:
        (line,) = [row for row in table.splitlines() if row.strip().startswith(name)]
        figures = re.findall(SPREAD, line)
        assert len(figures) == 4, line  # overhead (kills), steps lost, resume, session part
    targets = [row for row in table.splitlines() if row.strip().startswith("target:")]
    assert len(targets) == 3 and all(row.endswith(("ok", "MISSES TARGET")) for row in targets), targets
    assert "resume from the persistent tier" in out
    assert result["lost_ratio"] >= 0 and result["resume_ratio"] > 0 and result["session_ratio"] > 0
