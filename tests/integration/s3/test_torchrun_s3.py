"""Issue 24's acceptance, for real: a 2-rank torchrun job (gloo, loopback) whose logdir is an
``s3://`` URL on the moto server, the client configured by the ``AWS_*`` environment only (as a
user's job would be), saves; rank 1 is SIGKILLed once mid-run, torchrun restarts the group
(``--max-restarts 1``) and the job ends with weights bit-identical to an uninterrupted run; a
sidecar evaluator on the same URL evaluates each checkpoint once and exits at the end. Like TF's
``checkpoints_iterator``, the sidecar takes the newest checkpoint each time it looks: one that a
newer commit overtook while it was evaluating is skipped, never evaluated twice."""
from __future__ import annotations

import inspect
import os
import signal

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor.checkpoint import latest_checkpoint  # noqa: E402
from supervisor.checkpoint.layout.finished import read_finished  # noqa: E402
from supervisor.estimator.sidecar import SidecarEvaluator  # noqa: E402
from supervisor.events import read_scalars  # noqa: E402
from tests import forked_io, zygote  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402
from tests.distributed.test_torchrun import finish, start, torchrun  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TRAINER = "tests/distributed/elastic_trainer.py"  # examples/ddp_torchrun.py with a SIGKILL point
STEPS, SAVE_STEPS = "24", "4"


def _missing() -> str | None:
    """What this test needs of the front doors and the sidecar that is not there yet (their
    ``storage_options=`` arguments come with their s3:// support)."""
    from supervisor import MonitoredTrainingSession

    if "storage_options" not in inspect.signature(MonitoredTrainingSession).parameters:
        return "MonitoredTrainingSession on s3:// logdirs (storage_options=; helper frontdoors_s3)"
    if "storage_options" not in inspect.signature(SidecarEvaluator).parameters:
        return "SidecarEvaluator on s3:// logdirs (storage_options=; helper readers_s3)"
    return None


def test_torchrun_job_on_an_s3_logdir_survives_a_sigkilled_rank_bit_exact_with_a_sidecar(
        s3_server, s3_root, s3_storage, tmp_path):
    missing = _missing()
    if missing:
        pytest.skip(f"needs {missing}")
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint, "OMP_NUM_THREADS": "1"}
    url = s3_root + "/run"
    reference = str(tmp_path / "reference.pt")
    # The uninterrupted reference job runs (local logdir, own rendezvous) while the killed one does.
    clean_job = start(TRAINER, "--logdir", str(tmp_path / "clean"), "--steps", STEPS, "--save-steps", SAVE_STEPS,
                      "--out", reference)
    try:
        killed, sidecar_output, sidecar = _killed_job_with_a_sidecar(s3_server, url, env, tmp_path)
        clean = finish(clean_job)
    finally:
        if clean_job.poll() is None:
            os.killpg(clean_job.pid, signal.SIGKILL)
            clean_job.wait()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    resumed = str(tmp_path / "resumed.pt")
    output = killed.stdout + killed.stderr
    assert killed.returncode == 0, output
    assert "killing rank 1 after step 14" in output and "attempt 1" in output, output
    assert output.count("restored step=") >= 2, output  # every rank of the restarted group resumed
    a, b = torch.load(reference, weights_only=True), torch.load(resumed, weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key

    assert latest_checkpoint(url, storage=s3_storage) == f"{url}/model.ckpt-{STEPS}"
    assert read_finished(url, s3_storage).step == int(STEPS)
    assert sidecar.returncode == 0, sidecar_output
    steps = [int(line.split()[-1]) for line in sidecar_output.splitlines() if line.startswith("evaluated step ")]
    assert steps and len(steps) == len(set(steps)) and steps == sorted(steps), sidecar_output  # each once
    assert steps[-1] == int(STEPS) and all(s % int(SAVE_STEPS) == 0 for s in steps), sidecar_output
    assert "sidecar stopped: finished" in sidecar_output, sidecar_output  # the trainer's finished mark
    assert sorted(read_scalars(url + "/eval", options(s3_server.endpoint))) == steps  # its events, on the URL


def _killed_job_with_a_sidecar(s3_server, url: str, env: dict[str, str], tmp_path):
    """The job on the URL, rank 1 SIGKILLed after step 14 (torchrun restarts the group), with a
    sidecar evaluating every checkpoint it commits; returns (the job, the sidecar's output, the sidecar)."""
    path = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    sidecar = zygote.Forked(os.path.join(HERE, "s3_sidecar.py"), [url], cwd=ROOT, output=str(tmp_path / "sidecar.out"),
                            env={**os.environ, **env, "PYTHONPATH": path})  # (torchrun's agent: fresh)
    try:
        resumed = str(tmp_path / "resumed.pt")
        killed = torchrun(TRAINER, "--logdir", url, "--steps", STEPS, "--save-steps", SAVE_STEPS, "--out", resumed,
                          restarts=1, env={**env, "SUPERVISOR_TEST_KILL": "1:14"}, timeout=400)
        sidecar_output = forked_io.communicate(sidecar, timeout=120)
    finally:
        forked_io.finish(sidecar, timeout=10)
    return killed, sidecar_output, sidecar
