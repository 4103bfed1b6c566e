"""The documentation site: it builds with warnings as errors, every public name has a reference
entry, the hooks guide's table lists every built-in hook, and every code block of the guides runs.

How the code blocks run: the Python blocks of one page run in order in one process (forked from
the test process's zygote, tests/zygote.py, as ``python page.py`` runs it), in an empty working
directory, as a reader pasting them one after the other would run them. A page whose blocks take
names for granted (a model, an optimizer, a step function, a server) gets them
from `_PRELUDES` below, written before its first block; `_EPILOGUES` then uses what the blocks
defined (calls the `init_fn`, runs the hook); `_SUBSTITUTIONS` shortens step budgets and points
the object-store page at the test's own S3 server. Those three tables are the whole difference
between what a reader sees and what runs. The command-line page's shell block runs in a logdir
holding the checkpoints it names. Install commands (`pip install ...`) are what `.ci/run` runs;
the moto walk-through's shell block is `tests/*/s3/`'s territory (it starts a server on a fixed port).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest

import hooks
import supervisor
import supervisor.estimator
import supervisor.sinks
import supervisor.toolkit
from tests import zygote
from tests.cli.helpers import make_logdir
from tests.s3_fixtures import *  # noqa: F401,F403  (the s3_server fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
GUIDES = ["index.md", "guides/first-hour.md", "guides/hooks.md", "guides/checkpoints.md", "guides/distributed.md",
          "guides/evaluation.md", "guides/object-stores.md", "guides/tracking.md"]

_MODEL = """
import torch
from hooks import StopAtStepHook
torch.manual_seed(0)
x = torch.randn(256, 8); y = (x.sum(1) > 0).long()
dataset = torch.utils.data.TensorDataset(x, y)
model = net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def _batches():
    while True:
        for i in range(0, 256, 32):
            yield x[i:i + 32], y[i:i + 32]
batches = _batches()
def train_step(batch):
    loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    opt.zero_grad(); loss.backward(); opt.step()
    return {"loss": loss}
"""

_PRELUDES = {
    "guides/first-hour.md": """logdir, total_steps = 'runs/loader', 30
from supervisor import Supervisor
def _batches():  # over the page's first block's x and y, once it has run
    while True:
        yield x[:64], y[:64]
batches = _batches()
""",
    "guides/hooks.md": "import supervisor\n",
    "guides/checkpoints.md": _MODEL + """
import supervisor
from supervisor import Supervisor
with Supervisor("pretrained", model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=0).managed_session() as s:
    s.run(train_step, next(batches))
import os, shutil
os.rename(supervisor.latest_checkpoint("pretrained"), "pretrained/model.ckpt-90000")
""",
    "guides/distributed.md": _MODEL + """
import os
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["FREE_PORT"])
from torch.nn.parallel import DistributedDataParallel
""",
    "guides/evaluation.md": _MODEL + """
import torch.nn.functional as F
train_input_fn = lambda: [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
eval_input_fn = lambda: [(x[:64], y[:64])]
def train_step(batch):
    loss = F.cross_entropy(net(batch[0]), batch[1])
    opt.zero_grad(); loss.backward(); opt.step()
    return {"loss": loss}
import os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "examples"))
from sidecar import make_model, eval_batches, eval_step, train as train_sidecar
train_sidecar("runs/sidecar", steps=20, save_steps=10)
""",
    "guides/object-stores.md": _MODEL + """
import boto3
boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], aws_access_key_id="testing",
             aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="my-bucket")
from supervisor import Supervisor, MonitoredTrainingSession, latest_checkpoint
from supervisor.estimator import Estimator, RunConfig
""",
}
_PRELUDES["guides/object-stores.md"] = "import os\n" + _PRELUDES["guides/object-stores.md"]
_PRELUDES["guides/tracking.md"] = _MODEL + "import os\nos.environ['MLFLOW_ALLOW_FILE_STORE'] = 'true'\n"

_EPILOGUES = {
    "index.md": "assert s.global_step == 200 and not s.preempted\n",
    "guides/first-hour.md": "assert s.global_step == 30 and loop.epoch == 40\n",
    "guides/hooks.md": """
import torch
from supervisor import MonitoredSession
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=1.0)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
with MonitoredSession(hooks=[StopAtLowLearningRate(opt, min_lr=0.1)]) as s:
    while not s.should_stop():
        s.run(sched.step)
assert s.global_step == 4, s.global_step
""",
    "guides/checkpoints.md": """
model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
with Supervisor("run", model=model2, init_fn=init_fn, save_summaries_secs=0).managed_session() as s:
    pass
assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
""",
    "guides/distributed.md": "assert s.global_step == 20\n",
    "guides/tracking.md": """
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator("runs/tracked"); acc.Reload()
logged = sorted(m.step for m in MlflowClient("file:./mlruns").get_metric_history(sink.run_id, "loss"))
assert logged == [e.step for e in acc.Scalars("loss")] and len(logged) >= 5, logged
""",
    "guides/evaluation.md": "assert metrics['global_step'] == 40, metrics\nassert evaluation.last_metrics['global_step'] == 100\n",
    "guides/object-stores.md": "assert latest_checkpoint('s3://my-bucket/runs/mnist', storage_options=opts).endswith('-100')\n",
}

_SUBSTITUTIONS = {
    "guides/distributed.md": [("last_step=10_000", "last_step=20")],
    "guides/evaluation.md": [("max_steps=10_000", "max_steps=40"), ("save_checkpoints_steps=500", "save_checkpoints_steps=20"),
                             ("2_000", "200"), ("run_every_steps=500", "run_every_steps=20")],
    "guides/object-stores.md": [('"http://127.0.0.1:5000"', 'os.environ["S3_ENDPOINT"]'), ('"key": "..."', '"key": "testing"'),
                                ('"secret": "..."', '"secret": "testing"')],
}


def blocks(page: str, language: str) -> list[str]:
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        return re.findall(rf"^```{language}\n(.*?)^```", f.read(), re.S | re.M)


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "ROOT": ROOT,
            "OMP_NUM_THREADS": "1", "NO_MKDOCS_2_WARNING": "1", **extra}


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    result = zygote.python(["-m", "mkdocs", "build", "--strict", "-q", "-d", tmp_path / "site"], cwd=ROOT, timeout=300,
                           env=_env())
    assert result.returncode == 0, result.stdout + result.stderr
    page = (tmp_path / "site" / "reference" / "sessions" / "index.html").read_text()
    assert "save_model_secs" in page  # the reference is generated from the docstrings


def _referenced() -> set[str]:
    text = ""
    for name in os.listdir(os.path.join(DOCS, "reference")):
        with open(os.path.join(DOCS, "reference", name), encoding="utf-8") as f:
            text += f.read()
    return set(re.findall(r"^::: ([\w.]+)$", text, re.M))


@pytest.mark.parametrize("module", [supervisor, hooks, supervisor.estimator, supervisor.sinks, supervisor.toolkit], ids=lambda m: m.__name__)
def test_every_public_name_has_a_reference_entry(module):
    referenced = {name.rsplit(".", 1)[1] for name in _referenced()}
    missing = [name for name in module.__all__ if name not in referenced]
    assert not missing, f"add ::: {module.__name__}.NAME to a page of docs/reference/ for {missing}"


def test_the_hooks_guide_lists_every_built_in_hook():
    with open(os.path.join(DOCS, "guides", "hooks.md"), encoding="utf-8") as f:
        table = f.read().split("## Writing a hook")[0]
    missing = [name for name in hooks.__all__ if name not in supervisor.__all__ and f"`{name}" not in table]
    assert not missing, f"docs/guides/hooks.md's table lacks {missing}"


def test_every_guide_with_python_is_run_here():
    with_python = []
    for folder, _, files in os.walk(DOCS):
        for name in files:
            page = os.path.relpath(os.path.join(folder, name), DOCS)
            if name.endswith(".md") and blocks(page, "python"):
                with_python.append(page)
    assert sorted(with_python) == sorted(GUIDES)


@pytest.mark.slow
@pytest.mark.parametrize("page", GUIDES)
def test_the_python_blocks_of_a_page_run(page, tmp_path, request):
    code = blocks(page, "python")
    assert code, page
    source = _PRELUDES.get(page, "") + "\n".join(code) + _EPILOGUES.get(page, "")
    for old, new in _SUBSTITUTIONS.get(page, []):
        assert old in source, (page, old)
        source = source.replace(old, new)
    extra = {"FREE_PORT": str(free_port())}  # noqa: F405
    if page == "guides/object-stores.md":
        extra["S3_ENDPOINT"] = request.getfixturevalue("s3_server").endpoint
    script = tmp_path / "page.py"
    script.write_text(source)
    result = zygote.python([script], cwd=tmp_path, timeout=240, env=_env(**extra))  # forked: tests/zygote.py
    assert result.returncode == 0, f"{page}:\n{result.stdout}\n{result.stderr[-4000:]}"


@pytest.mark.slow
def test_the_command_line_page_runs(tmp_path):
    (command_block,) = blocks("guides/cli.md", "bash")
    logdir = tmp_path / "runs" / "exp1"
    make_logdir(logdir, steps=(800, 1000, 1200))
    for line in command_block.splitlines():
        command = line.split("#")[0].strip()
        if command.startswith("python "):  # forked from the zygote (tests/zygote.py), as ``python`` runs it
            result = zygote.python(shlex.split(command)[1:], cwd=tmp_path, timeout=120, env=_env())
        else:
            result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                                    env=_env())
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    assert supervisor.latest_checkpoint(str(logdir)).endswith("-1000")  # the rollback took; prune kept it
