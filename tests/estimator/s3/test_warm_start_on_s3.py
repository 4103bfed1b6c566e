"""`Estimator(warm_start_from=...)` from an ``s3://`` run (TF's ``WarmStartSettings``; issue 24
item 1) against a real moto server: the new model starts from the selected weights of the other
run's latest checkpoint, read from the URL; the others keep their initial values; a resume
restores its own checkpoint and never warm-starts again."""
from __future__ import annotations

import pytest
import torch

from supervisor.estimator import WarmStartSettings
from tests.estimator.estimator_toy import endless, make_estimator
from tests.estimator.s3.helpers import options, s3_estimator

pytestmark = pytest.mark.timeout(120)


def test_warm_start_from_an_s3_run_loads_the_selected_weights(s3_server, s3_root, tmp_path):
    opts = options(s3_server.endpoint)
    pretrained = s3_estimator(s3_root + "/pretrain", opts)
    pretrained.train(endless(), max_steps=5)
    source = {k: v.clone() for k, v in pretrained.model.state_dict().items()}
    settings = WarmStartSettings(s3_root + "/pretrain", vars_to_warm_start="0.*", storage_options=opts)
    fresh = make_estimator(tmp_path / "unused", seed=1).model.state_dict()
    est = make_estimator(tmp_path / "finetune", seed=1, lr=0.0, warm_start_from=settings)
    est.train(endless(), max_steps=1)  # lr=0: the weights stay what the session started from
    weights = est.model.state_dict()
    assert torch.equal(weights["0.weight"], source["0.weight"]) and torch.equal(weights["0.bias"], source["0.bias"])
    assert torch.equal(weights["3.weight"], fresh["3.weight"])  # not selected: its own initial value
    assert not torch.equal(fresh["0.weight"], source["0.weight"])  # so the check above can fail
    again = make_estimator(tmp_path / "finetune", seed=2, lr=0.0, warm_start_from=s3_root + "/nowhere")
    again.train(endless(), max_steps=2)  # resumes: init_fn (the warm start) is not called
    assert torch.equal(again.model.state_dict()["0.weight"], source["0.weight"])


def test_warm_start_from_is_checked_up_front(tmp_path):
    with pytest.raises(TypeError, match="warm_start_from must be a checkpoint path or URL"):
        make_estimator(tmp_path, warm_start_from=3)
    with pytest.raises(TypeError, match="ckpt_to_initialize_from must be a non-empty"):
        WarmStartSettings("")
