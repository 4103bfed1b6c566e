"""Read-once restores (issue 31) on 4 real gloo ranks, the bytes each rank reads from the
checkpoint's files counted from outside (strace, `traced`): a replicated ``state.pt`` checkpoint
is read from storage once per job (the chief) and broadcast, bit-exactly, every rank getting its
own RNG stream back."""
from __future__ import annotations

import os

import pytest
import torch

from .harness import describe, run_job
from .traced import run_traced, strace_works

MODULE = "tests.distributed.read_once_worker"
W = 4

pytestmark = pytest.mark.skipif(not strace_works(), reason="strace -P cannot trace here (no ptrace)")


def _files(path: str) -> list[str]:
    return sorted(os.path.realpath(os.path.join(path, f)) for f in os.listdir(path))


def _checkpoint_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in _files(path))


def _expected_draw(payload: dict, rank: int) -> list[float]:
    from supervisor.state.rng import restore_rng_state

    restore_rng_state(payload["rng"][rank])
    return torch.rand(2).tolist()


@pytest.mark.slow
def test_a_replicated_restore_reads_the_checkpoint_once_and_every_rank_gets_it_bit_exactly(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("read_once", W, logdir, "3", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in first), describe(first)
    path = os.path.join(logdir, "model.ckpt-3")
    size = _checkpoint_bytes(path)
    assert size > 1 << 20  # the payload, not the manifest, is what is counted

    second, per_file = run_traced(MODULE, "read_once", W, [logdir, "4"], _files(path), str(tmp_path))
    read = [sum(files.values()) for files in per_file]
    assert all(r.returncode == 0 for r in second), describe(second)
    assert [r.result["start"] for r in second] == [3] * W
    payload = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    model.load_state_dict(payload["model"])
    from .read_once_worker import _digest

    assert {r.result["digest"] for r in second} == {_digest(model)}  # bit-exact on every rank
    for r in second:  # each rank's own RNG stream, as saved
        assert r.result["first_draw"] == _expected_draw(payload, r.rank), f"rank {r.rank}"
    # read once per job: the chief reads the checkpoint (manifest included) once, nobody else
    assert read[0] >= size, (read, size)
    assert sum(read) <= 1.05 * size, f"{sum(read) / size:.2f}x the checkpoint read: per rank {read} of {size}"
    assert read[1:] == [0] * (W - 1), read


def _under(per_file: dict[str, int], root: str) -> dict[str, int]:
    root = os.path.realpath(root) + os.sep
    return {p: n for p, n in per_file.items() if p.startswith(root)}


def _shard_bytes(per_file: dict[str, int], writer: int | None = None) -> int:
    """Bytes read of ``.distcp`` shards (of ``writer``'s, when given)."""
    prefix = "__" if writer is None else f"__{writer}_"
    return sum(n for p, n in per_file.items() if os.path.basename(p).startswith(prefix) and p.endswith(".distcp"))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, W])
def test_a_sharded_save_reads_nothing_back_and_each_rank_restores_only_its_ranges(tmp_path, world):
    """Each rank reads its own ranges of the shards; the replicated items (Adam's step counters,
    param groups: written once, needed by every rank) are read once, by the chief, and broadcast
    (before: every rank read them, ≈ 2.7× at W = 1,000 for this model). So every byte of every
    shard is read at most once, and a non-chief rank reads nothing of another rank's shard."""
    from supervisor.checkpoint.formats.dcp_ranges import verifiable_by_ranges
    from supervisor.checkpoint.formats.dcp_reading import read_metadata_file

    logdir = str(tmp_path / "run")
    os.makedirs(logdir)
    # The save: checksums computed while writing, no rank reads a fresh shard back.
    first, per_file = run_traced(MODULE, "read_once", world, [logdir, "3", "512", "fsdp2"], [], str(tmp_path))
    assert all(r.returncode == 0 for r in first), describe(first)
    saved = [_shard_bytes(_under(files, logdir)) for files in per_file]
    assert saved == [0] * world, f"shard bytes read back while saving, per rank: {saved}"
    path = os.path.join(logdir, "model.ckpt-3")
    names = sorted(os.listdir(path))
    assert names == sorted([".metadata", "MANIFEST.json", *(f"__{r}_0.distcp" for r in range(world)),
                            *(f"rng-{r}.pt" for r in range(world))])  # the layout is unchanged
    assert verifiable_by_ranges(read_metadata_file(path))  # every item's CRC-32 is in .metadata
    shards = sum(os.path.getsize(os.path.join(path, f"__{r}_0.distcp")) for r in range(world))
    assert shards > 1 << 20

    second, per_file = run_traced(MODULE, "read_once", world, [logdir, "4", "512", "fsdp2"], _files(path),
                                  str(tmp_path))
    assert all(r.returncode == 0 for r in second), describe(second)
    assert [r.result["start"] for r in second] == [3] * world
    assert {r.result["digest"] for r in second} == {first[0].result["end_digest"]}  # bit-exact
    assert [r.result["first_draw"] for r in second] == [r.result["next_draw"] for r in first]  # own RNG
    total = sum(_shard_bytes(files) for files in per_file)
    assert total <= shards, f"{total / shards:.4f}x the shards read (a byte read twice): {per_file}"
    everything = sum(sum(files.values()) for files in per_file)  # manifest, .metadata, RNG files too
    assert everything <= 1.05 * _checkpoint_bytes(path), f"{everything / _checkpoint_bytes(path):.2f}x: {per_file}"
    metadata = os.path.realpath(os.path.join(path, ".metadata"))
    assert [files.get(metadata, 0) for files in per_file[1:]] == [0] * (world - 1)  # the chief sends it
    for r, files in enumerate(per_file[1:], start=1):  # the others: their own ranges only
        others = _shard_bytes(files) - _shard_bytes(files, r)
        assert others == 0, f"rank {r} read {others} bytes of other ranks' shards: {files}"


def _replicated_item(path: str) -> tuple[str, int, int]:
    """(file, offset, length) of a non-tensor item of the checkpoint (one every rank loads)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from supervisor.checkpoint.formats.dcp_reading import read_metadata_file

    metadata = read_metadata_file(path)
    for index, info in sorted(metadata.storage_data.items(), key=lambda kv: kv[0].fqn):
        if isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata):
            return info.relative_path, info.offset, info.length
    raise AssertionError(f"{path} holds no non-tensor item")


@pytest.mark.slow
def test_a_damaged_replicated_item_read_by_the_chief_sends_every_rank_back_to_the_older_checkpoint(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("read_once", W, logdir, "3", "512", "fsdp2", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in first), describe(first)
    name, offset, length = _replicated_item(os.path.join(logdir, "model.ckpt-3"))
    with open(os.path.join(logdir, "model.ckpt-3", name), "r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    resumed = run_job("read_once", W, logdir, "1", "512", "fsdp2", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in resumed), describe(resumed)
    assert [r.result["start"] for r in resumed] == [0] * W, describe(resumed)  # the older one, on every rank
    assert f"{name} (one item) have checksum" in resumed[0].output, describe(resumed)
    for r in resumed:  # every rank says why it skipped the newest
        assert "skipping checkpoint" in r.output and "model.ckpt-3" in r.output, describe(resumed)


@pytest.mark.slow
def test_a_damaged_shard_found_by_one_rank_sends_every_rank_back_to_the_older_checkpoint(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("read_once", W, logdir, "3", "512", "fsdp2", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in first), describe(first)
    shard = os.path.join(logdir, "model.ckpt-3", "__2_0.distcp")  # only rank 2 reads it
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    resumed = run_job("read_once", W, logdir, "1", "512", "fsdp2", module=MODULE, timeout=180)
    assert all(r.returncode == 0 for r in resumed), describe(resumed)
    assert [r.result["start"] for r in resumed] == [0] * W, describe(resumed)  # the older one, on every rank
    assert "__2_0.distcp (one item) have checksum" in resumed[2].output, describe(resumed)
    for r in resumed:  # every rank says why it skipped the newest
        assert "skipping checkpoint" in r.output and "model.ckpt-3" in r.output, describe(resumed)


@pytest.mark.slow
def test_the_bytes_arrive_whole_in_chunks_and_a_copy_that_differs_from_the_manifest_fails_loudly():
    size, chunk = 5 * 1000 * 1000 + 17, 1 << 20  # six chunks, the last one short
    ok = run_job("shared_bytes", 3, str(size), str(chunk), module=MODULE, timeout=120)
    assert all(r.returncode == 0 for r in ok), describe(ok)
    assert [r.result for r in ok[1:]] == [{"received": size, "same": True, "step": 7, "memory_file": True}] * 2
    damaged = run_job("shared_bytes", 3, str(size), str(chunk), "yes", module=MODULE, timeout=120)
    assert damaged[0].returncode == 0, describe(damaged)
    for r in damaged[1:]:
        assert r.returncode not in (0, None), describe(damaged)
        assert "CheckpointCorruptError" in r.output and "this rank's copy differs" in r.output, describe(damaged)
        assert "/ckpt/model.ckpt-7/state.pt" in r.output


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank (2)")
def test_under_nccl_the_chunks_travel_through_the_gpus():
    size, chunk = 3 * 1000 * 1000 + 5, 1 << 20
    ok = run_job("shared_bytes", 2, str(size), str(chunk), module=MODULE, timeout=180,
                 extra_env={"SUPERVISOR_TEST_BACKEND": "nccl"})
    assert all(r.returncode == 0 for r in ok), describe(ok)
    assert ok[1].result == {"received": size, "same": True, "step": 7, "memory_file": True}


@pytest.mark.slow
def test_the_restore_benchmark_stays_runnable(capsys, tmp_path):
    from benchmarks.scale_restore import main

    rows = main(["--worlds", "2", "--kinds", "ddp", "--baseline", "", "--width", "256", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert [(r["world"], r["kind"], r["side"]) for r in rows] == [(2, "ddp", "read-once")]
    assert rows[0]["per_rank"][1] == 0 and rows[0]["ratio"] <= 1.05, rows
    assert "  2 ddp    read-once" in out and out.rstrip().endswith("ok"), out
