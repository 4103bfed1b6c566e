"""Where an events directory lives (`supervisor.events.locate`): local paths keep today's POSIX
code; URLs go through the storage seam; a misuse is refused early, naming the value."""
from __future__ import annotations

import pytest

from supervisor.events import EvalEventsFile, locate, read_scalars
from supervisor.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)


def test_a_local_path_and_a_file_url_are_served_by_the_local_code(tmp_path):
    assert locate(tmp_path) == (None, str(tmp_path))
    assert locate(f"file://{tmp_path}") == (None, str(tmp_path))
    with SummaryWriter(f"file://{tmp_path}/run") as writer:
        writer.add_scalar("loss", 1.0, 1)
    assert writer.logdir == f"{tmp_path}/run"
    assert read_scalars(tmp_path / "run") == {1: {"loss": 1.0}}


@pytest.mark.parametrize("make", [lambda d, o: SummaryWriter(d, storage_options=o), EvalEventsFile, read_scalars],
                         ids=["SummaryWriter", "EvalEventsFile", "read_scalars"])
def test_storage_options_for_a_local_path_are_refused_naming_it(tmp_path, make):
    with pytest.raises(ValueError, match=r"storage_options=\{'key': 'x'\} were given for the local path .* "
                                         r"they apply to object-store URLs only"):
        make(str(tmp_path), {"key": "x"})
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_url_scheme_is_refused_naming_the_url():
    with pytest.raises(ValueError, match=r"'nosuch://bucket/eval': no storage for the URL scheme 'nosuch'"):
        read_scalars("nosuch://bucket/eval")
