"""The checkpoint format registry: one place decides a checkpoint's format from what its manifest
lists, and a new format is one module plus its registration (here: a JSON weights file)."""
from __future__ import annotations

import json
import os
import zlib

import pytest
import torch

from supervisor import load_checkpoint, verify_checkpoint
from supervisor.checkpoint.layout import format_registry as formats
from supervisor.checkpoint.layout.format import FileRecord, Manifest
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, format_in, format_named, format_of, register_format
from supervisor.checkpoint.load.loader import load_verified, read_checkpoint
from supervisor.errors import CheckpointCorruptError, CheckpointError

from tests import zygote

pytestmark = pytest.mark.timeout(60)


def test_the_format_is_decided_by_the_file_the_manifest_lists():
    assert format_of(["MANIFEST.json", "state.pt"]).name == "torch"
    assert format_of([".metadata", "__0_0.distcp"]).name == "dcp"
    assert format_of(["state.pt", ".metadata"]).name == "torch"  # both: torch, as always
    assert format_of(["notes.txt"]) is None
    assert [f.name for f in formats.formats()][:2] == ["torch", "dcp"]
    with pytest.raises(ValueError, match="checkpoint_format='npz' is not a checkpoint format.*'torch', 'dcp'"):
        format_named("npz")
    with pytest.raises(ValueError, match="marks the format 'torch' already"):
        register_format(CheckpointFormat(name="other", marker="state.pt", description="x", read=lambda *a: ({}, False)))


def _read_json(path, manifest, copies, unpickling):
    copy = copies.pop("weights.json")
    data = json.loads(bytes(copy.data))
    return {"model": {k: torch.tensor(v) for k, v in data.items()}, "global_step": manifest.step}, False


@pytest.fixture
def json_format(monkeypatch):
    formats.formats()  # the built-in ones first, into the registry kept after the test
    monkeypatch.setattr(formats, "_FORMATS", dict(formats._FORMATS))
    register_format(CheckpointFormat(name="json", marker="weights.json", description="a JSON weights file",
                                     read=_read_json, single_file=False, restore_hint="read it with read_checkpoint"))


def _json_checkpoint(directory, step=3) -> str:
    path = os.path.join(directory, f"model.ckpt-{step}")
    os.makedirs(path)
    data = json.dumps({"weight": [1.0, 2.0]}).encode()
    with open(os.path.join(path, "weights.json"), "wb") as f:
        f.write(data)
    manifest = Manifest(step=step, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                        files={"weights.json": FileRecord(len(data), f"crc32:{zlib.crc32(data):08x}")})
    with open(os.path.join(path, "MANIFEST.json"), "w") as f:
        f.write(manifest.to_json())
    return path


def test_a_new_format_is_one_registration_and_the_load_path_reads_it(json_format, tmp_path):
    path = _json_checkpoint(str(tmp_path))
    assert format_in(path).name == "json"
    assert verify_checkpoint(path).step == 3
    read = read_checkpoint(path)
    torch.testing.assert_close(read.payload["model"]["weight"], torch.tensor([1.0, 2.0]))
    assert load_checkpoint(path)["global_step"] == 3
    with pytest.raises(CheckpointError, match="is a JSON weights file \\(checkpoint_format='json'\\); read it with"):
        load_verified(path)


def test_without_its_registration_the_checkpoint_is_refused_naming_the_known_files(tmp_path):
    path = _json_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointCorruptError, match="lists neither state.pt nor .metadata"):
        read_checkpoint(path)


_FIRST_QUESTIONS_AT_ONCE = """
import sys, threading
from supervisor.checkpoint.layout import format_registry as registry
assert not registry._LOADED, "the built-in formats were loaded already: this process cannot race their loading"
barrier, seen = threading.Barrier(8), []
def ask():
    barrier.wait(timeout=30)
    seen.append(len(registry.formats()))
threads = [threading.Thread(target=ask) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=60)
print(sorted(seen))
"""


@pytest.mark.timeout(180)  # the zygote's start (torch imported once) on a loaded machine
def test_threads_asking_their_first_question_at_once_all_see_every_builtin_format():
    """The built-ins are imported on the first question; a second thread asking meanwhile waits for
    them (it saw none, and called a healthy checkpoint's manifest one that "lists no state.pt")."""
    done = zygote.python(["-c", _FIRST_QUESTIONS_AT_ONCE], timeout=60)  # a process that never asked
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == str([len(formats.BUILTIN_FORMATS)] * 8), done.stdout + done.stderr
