"""A checkpoint format installed as a package (issue 32): declared in the entry-point group
``torch_supervisor.checkpoint_formats`` of a distribution on ``sys.path``, it is found by any
process — the CLI lists, verifies and inspects a checkpoint of it — without a line in this
repository; without the package the same checkpoint is refused, naming the files it lacks."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from supervisor import CheckpointManager, TrainingState
from supervisor.checkpoint.layout import format_registry
from supervisor.checkpoint.layout.format_registry import ENTRY_POINT_GROUP, format_named, format_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The whole third-party format: one module (weights as JSON lists; the step; nothing else).
_PLUGIN = """
    import json

    import torch

    from supervisor.checkpoint.layout.format_registry import CheckpointFormat, LazyVariable

    MARKER = "weights.json"


    def _write(payload, write_file):
        data = {"step": payload["global_step"], "model": {k: v.tolist() for k, v in payload["model"].items()}}
        write_file(MARKER, lambda writer: writer.write(json.dumps(data).encode()))


    def _read(path, manifest, copies, unpickling):
        copy = copies.pop(MARKER)
        with copy.open(path + "/" + MARKER) as f:
            data = json.loads(f.read())
        return {"global_step": data["step"], "model": {k: torch.tensor(v) for k, v in data["model"].items()}}, False


    class _Entry(LazyVariable):
        def __init__(self, values):
            self.values = values
            self.shape, self.dtype = tuple(torch.tensor(values).shape), torch.float32

        def load(self, path, storage=None):
            return torch.tensor(self.values)


    def _variables(path, storage=None):
        from supervisor.checkpoint.storage import storage_for

        store = storage or storage_for(path)
        data = json.loads(store.read_bytes(store.join(path, MARKER)))
        return {"model/" + k: _Entry(v) for k, v in data["model"].items()}


    FORMAT = CheckpointFormat(name="jsonweights", marker=MARKER, description="a JSON weights checkpoint",
                              read=_read, write=_write, torch_file=False, variables=_variables)
"""


def _install(site, entry_points: str) -> None:
    """A distribution ``json-weights`` in ``site`` (a directory on ``sys.path``), as pip installs one."""
    dist = site / "json_weights-1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "json_weights.py").write_text(textwrap.dedent(_PLUGIN))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: json-weights\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}")


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry as a new process has it: built-in formats only, the group not read yet."""
    format_registry.formats()  # the built-in ones, into the registry kept after the test
    monkeypatch.setattr(format_registry, "_FORMATS", dict(format_registry._FORMATS))
    monkeypatch.setattr(format_registry, "_DISCOVERED", False)
    yield
    sys.modules.pop("json_weights", None)


def test_the_group_is_read_at_the_first_unknown_name_and_a_broken_entry_is_named(tmp_path, monkeypatch,
                                                                                  fresh_registry, caplog):
    _install(tmp_path, "broken = no_such_module_xyz:FORMAT\njsonweights = json_weights:FORMAT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert format_of(["MANIFEST.json", "state.pt"]).name == "torch"  # known: the group is not read
    assert "jsonweights" not in format_registry._FORMATS
    with caplog.at_level(logging.WARNING, logger=format_registry.__name__):
        assert format_named("jsonweights").marker == "weights.json"
    assert "broken = no_such_module_xyz:FORMAT" in caplog.text and "ModuleNotFoundError" in caplog.text
    assert format_of(["MANIFEST.json", "weights.json"]).name == "jsonweights"


def _write_run(logdir) -> torch.nn.Module:
    model = torch.nn.Linear(3, 2)
    manager = CheckpointManager(str(logdir), checkpoint_format="jsonweights", save_mode="sync", save_rng=False)
    manager.open()
    try:
        manager.save(7, TrainingState.from_arguments(model=model))
    finally:
        manager.close()
    return model


def _cli(*args, site=None):
    paths = [str(site)] if site is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "supervisor", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)  # three CLI processes, each importing torch
def test_the_cli_in_another_process_reads_a_checkpoint_of_an_installed_format(tmp_path, monkeypatch, fresh_registry):
    site = tmp_path / "site"
    _install(site, "jsonweights = json_weights:FORMAT\n")
    monkeypatch.syspath_prepend(str(site))
    _write_run(tmp_path / "run")  # this process found it through the group too
    assert sorted(os.listdir(tmp_path / "run" / "model.ckpt-7")) == ["MANIFEST.json", "weights.json"]

    done = _cli("ls", tmp_path / "run", "--json", site=site)
    assert done.returncode == 0, done.stderr
    assert [(r["step"], r["verified"]) for r in json.loads(done.stdout)] == [(7, True)]
    done = _cli("inspect", tmp_path / "run", "--json", site=site)
    assert done.returncode == 0, done.stderr
    shapes = {v["name"]: v["shape"] for v in json.loads(done.stdout)["variables"]}
    assert shapes == {"global_step": [], "model/weight": [2, 3], "model/bias": [2]}, shapes

    done = _cli("verify", tmp_path / "run" / "model.ckpt-7")  # without the package: refused, naming the files
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "lists neither state.pt nor .metadata" in said, said
    assert "but weights.json" in said and ENTRY_POINT_GROUP in said, said
