"""A trainer whose object store goes silent mid-training (issue 30 item 3), against the real moto
server and s3fs client: `tests.s3_fixtures.FaultProxy` black-holes every new connection (accepted,
never read, answered or closed) for longer than ``request_timeout`` while a real training process
(`silent_trainer.py`) saves every few steps in the background. Before the fix it made no
progress and logged nothing, forever (a ``PutObject`` waiting for an answer that never comes, the
lease renewal holding the lock the pre-commit check needed). Now it ends with an error naming the
operation, the URL and the bound, or trains on once the endpoint answers — within a bounded
time either way; and every checkpoint committed verifies afterwards."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint import latest_checkpoint, verify_checkpoint  # noqa: E402
from supervisor.checkpoint.layout.format import MANIFEST_FILE  # noqa: E402
from tests import forked_io, zygote  # noqa: E402
from tests.s3_fixtures import CREDENTIALS, FaultProxy  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

HERE = os.path.dirname(os.path.abspath(__file__))
#: Not smaller: moto (pure Python) on a loaded 2-core machine may take seconds to take a 5 MiB part.
BOUND = 4.0
#: The endpoint stays silent this long: several times the bound.
SILENT_SECS = 3 * BOUND
#: After the endpoint answers again, the trainer has ended or trains on within this long (it
#: needs a few bounded requests to fail a save and a lease; a loaded 2-core machine is slow).
END_SECS = 90.0
LAST_STEP = 120


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.port) as p:
        yield p


def _wait_for_commit(url: str, storage, trainer: zygote.Forked, after_step: int, err) -> str:
    """The newest committed checkpoint once one of a step > ``after_step`` is (bounded)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        latest = latest_checkpoint(url, storage=storage)
        if latest is not None and int(latest.rsplit("-", 1)[1]) > after_step:
            return latest
        assert trainer.poll() is None, f"the trainer ended before the fault: {forked_io.output(trainer)}, " \
                                       f"{err.read_text()[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint after step {after_step} committed under {url} in 180 s")


def _silence(proxy: FaultProxy, mid_upload: bool) -> None:
    """Silences the endpoint now, or (``mid_upload``) from the next multipart part 2 on (that
    request read and never answered), waiting (bounded) until it is silent."""
    if not mid_upload:
        proxy.black_hole = True
        return
    proxy.silence_on = lambda command, path: command == "PUT" and "partNumber=2" in path
    deadline = time.monotonic() + 120
    while not proxy.black_hole:
        assert time.monotonic() < deadline, "no multipart part 2 was sent in 120 s"
        time.sleep(0.01)


@pytest.mark.parametrize("lease_secs, mid_upload", [(6.0, False), (60.0, True)],
                         ids=["renewal-in-the-silence", "mid-upload"])
def test_a_silent_endpoint_mid_training_ends_the_trainer_with_the_bound_named_or_it_trains_on(
        proxy, s3_root, s3_storage, tmp_path, lease_secs, mid_upload):
    url = s3_root + "/run"
    env = {**os.environ, **CREDENTIALS}
    err = tmp_path / "stderr"
    trainer = zygote.Forked(os.path.join(HERE, "silent_trainer.py"), [proxy.endpoint, url, LAST_STEP, "--bound", BOUND,
                                                                       "--lease", lease_secs],
                            output=str(tmp_path / "stdout"), stderr=str(err), env=env)
    try:
        before = _wait_for_commit(url, s3_storage, trainer, after_step=5, err=err)
        _silence(proxy, mid_upload)
        silent_from = time.monotonic()
        time.sleep(SILENT_SECS)  # the fault's duration, not a synchronisation
        proxy.black_hole = False
        try:
            out = forked_io.communicate(trainer, timeout=END_SECS)
        except subprocess.TimeoutExpired:
            out = forked_io.finish(trainer)
            pytest.fail(f"the trainer still ran {time.monotonic() - silent_from:.0f} s after its endpoint went "
                        f"silent for {SILENT_SECS} s (bound {BOUND} s); last output: {out[-300:]!r}; held "
                        f"connections: {proxy.held}; stderr: {err.read_text()[-2000:]}")
        took = time.monotonic() - silent_from
    finally:
        forked_io.finish(trainer)
    stderr_text = err.read_text()
    ending = [line for line in stderr_text.splitlines() if line and not line.startswith((" ", "Traceback"))][-1:]
    print(f"lease {lease_secs} s: rc {trainer.returncode}, ended {took:.1f} s after the silence began, "
          f"{proxy.held} connections black-holed; last checkpoint before: {before}; {ending}")
    assert proxy.held > 0, "the silence caught no request: the test proved nothing"
    if trainer.returncode == 0:
        assert f"finished {LAST_STEP}" in out, out
    else:
        assert f"request_timeout={BOUND:g} s" in stderr_text and url in stderr_text, stderr_text[-3000:]
    _assert_every_committed_checkpoint_verifies(url, s3_storage)


def _assert_every_committed_checkpoint_verifies(url: str, storage) -> None:
    committed = [name for name in storage.listdir(url)
                 if name.startswith("model.ckpt-") and storage.exists(f"{url}/{name}/{MANIFEST_FILE}")]
    assert committed, storage.listdir(url)
    for name in committed:
        verify_checkpoint(f"{url}/{name}", storage=storage)
    latest = latest_checkpoint(url, storage=storage)
    assert latest is not None and latest.rsplit("/", 1)[1] in committed, (latest, committed)
