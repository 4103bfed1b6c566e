"""Read-once restores on an ``s3://`` logdir (issue 31), 2 real gloo ranks against the real moto
server: each rank talks to the store through its own loopback proxy
(`benchmarks._loopback_proxy.LoopbackProxy`), whose byte counts say what that rank read.

- replicated (``checkpoint_format="torch"``, a DDP model): the chief GETs the checkpoint once,
  rank 1 none of it (the bytes reach it over the process group); total ≈ 1.0× the checkpoint;
- sharded (``checkpoint_format="dcp"``, FSDP2): a save GETs nothing back; a restore GETs each
  shard's byte ranges only by the rank that loads them (rank 1 nothing of rank 0's shard, nor
  ``.metadata``: the chief sends it and the replicated items); every shard byte at most once but
  the replicated items inside a rank's coalesced range (small gaps are read, not split into GETs).

Both bit-exact, every rank with its own RNG stream back."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from benchmarks._loopback_proxy import LoopbackProxy  # noqa: E402
from tests.distributed.harness import describe, run_job  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

MODULE = "tests.distributed.read_once_worker"
W = 2


def _job(url: str, last_step: int, fmt: str, port: int) -> tuple[list, list[dict[str, int]]]:
    """A 2-rank job, each rank through its own proxy; per rank, the bytes GET answered per object
    key (the query and the bucket stripped)."""
    with LoopbackProxy(port) as p0, LoopbackProxy(port) as p1:
        per_rank = json.dumps([options(p0.endpoint), options(p1.endpoint)])
        ranks = run_job("read_once", W, url, str(last_step), "512", fmt, per_rank, module=MODULE, timeout=300)
        return ranks, [_gets(p) for p in (p0, p1)]


def _gets(proxy: LoopbackProxy) -> dict[str, int]:
    got: dict[str, int] = {}
    for e in proxy.exchanges:
        if e.command == "GET":
            key = e.path.split("?", 1)[0].split("/", 2)[-1]  # /<bucket>/<key>
            got[key] = got.get(key, 0) + e.received
    return got


def _under(got: dict[str, int], prefix: str, pattern: str = "") -> int:
    return sum(n for key, n in got.items() if key.startswith(prefix) and re.search(pattern, key.rsplit("/", 1)[-1]))


def _checkpoint(s3_storage, path: str) -> dict[str, int]:
    """Every object of the checkpoint ``path`` (s3://bucket/...): its key under the bucket, its size."""
    bucket_key = path[len("s3://"):]
    return {f"{bucket_key}/{name}".split("/", 1)[1]: s3_storage.fs.size(f"{path}/{name}")
            for name in s3_storage.list_files(path)}


def _ok(ranks: list) -> list[dict]:
    assert all(r.returncode == 0 for r in ranks), describe(ranks)
    return [r.result for r in ranks]


def _saved_and_resumed(url: str, fmt: str, port: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """Trains to step 3 (the checkpoint), then resumes from it; each rank's GETs while saving and
    while resuming. The resumed ranks start at 3 with the saved state, bit-exact, and each its own RNG."""
    first, saving = _job(url, 3, fmt, port)
    saved = _ok(first)
    second, got = _job(url, 4, fmt, port)
    resumed = _ok(second)
    assert [r["start"] for r in resumed] == [3] * W
    assert {r["digest"] for r in resumed} == {saved[0]["end_digest"]}  # bit-exact on every rank
    assert [r["first_draw"] for r in resumed] == [r["next_draw"] for r in saved]  # each rank's own RNG
    return saving, got


def test_a_replicated_restore_from_s3_gets_the_checkpoint_once_and_rank_1_gets_it_bit_exactly(
        s3_server, s3_storage, s3_root):
    url = s3_root + "/run"
    _, got = _saved_and_resumed(url, "ddp", s3_server.port)
    path = f"{url}/model.ckpt-3"
    objects = _checkpoint(s3_storage, path)
    size = sum(objects.values())
    assert size > 1 << 20  # the payload, not the manifest, is what is counted
    prefix = path[len("s3://"):].split("/", 1)[1] + "/"
    read = [_under(g, prefix) for g in got]
    assert read[0] >= size - objects[next(k for k in objects if k.endswith("MANIFEST.json"))], (read, objects)
    assert sum(read) <= 1.05 * size, f"{sum(read) / size:.3f}x the checkpoint GET: per rank {read} of {size}: {got}"
    assert read[1] == 0, f"rank 1 GET {read[1]} bytes of the checkpoint: {got[1]}"


def test_a_sharded_save_gets_nothing_back_and_each_rank_restores_only_its_own_ranges_from_s3(
        s3_server, s3_storage, s3_root):
    url = s3_root + "/run"
    saving, got = _saved_and_resumed(url, "fsdp2", s3_server.port)
    path = f"{url}/model.ckpt-3"
    prefix = path[len("s3://"):].split("/", 1)[1] + "/"
    assert [_under(g, prefix, r"\.distcp$") for g in saving] == [0] * W, f"shards read back while saving: {saving}"
    objects = _checkpoint(s3_storage, path)
    names = sorted(key.rsplit("/", 1)[-1] for key in objects)
    assert names == sorted([".metadata", "MANIFEST.json", "__0_0.distcp", "__1_0.distcp", "rng-0.pt", "rng-1.pt"])
    shards = sum(n for key, n in objects.items() if key.endswith(".distcp"))
    assert shards > 1 << 20
    # Every shard byte is GET once, but for the replicated items (Adam's step counters...: the chief
    # reads them and sends them) lying between a rank's own items: its ranges closer than
    # COALESCE_GAP are one GET (fewer requests, a little more data: dcp_storage.wanted_ranges).
    served = _under(got[0], prefix, r"^__1_")  # what the chief read of rank 1's shard: those items only
    assert served < 0.02 * shards, got
    total = sum(_under(g, prefix, r"\.distcp$") for g in got)
    assert total <= shards + served, f"{total / shards:.4f}x the shards GET (a byte read twice): {got}"
    everything = sum(_under(g, prefix) for g in got)
    assert everything <= 1.05 * sum(objects.values()), f"{everything / sum(objects.values()):.3f}x: {got}"
    assert _under(got[1], prefix, r"^\.metadata$") == 0, got[1]  # the chief sends it
    assert _under(got[1], prefix, r"^__0_") == 0, f"rank 1 GET bytes of rank 0's shard: {got[1]}"
    assert _under(got[1], prefix, r"^__1_") > 0, got[1]  # its own ranges, from the store
