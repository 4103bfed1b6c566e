"""SummarySaverHook: TF's summary steps, what is written, the summarize feed, writers."""
from __future__ import annotations

import logging

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hooks import SummarySaverHook
from supervisor import MonitoredSession, SessionCreator
from supervisor.summary import SummaryWriterCache

from tests.hooks._helpers import RestoredAt, run_steps


def outputs():
    return {"loss": torch.tensor(0.25), "acc": 0.5, "count": 3, "logits": torch.ones(4), "name": "x", "done": True}


@pytest.mark.parametrize(
    ("schedule", "advance_secs", "steps"),
    [
        # ... and at the clean close, the last step (30) unless it was just written.
        ({"save_steps": 8}, 0.0, [1, 9, 17, 25, 30]),
        ({"save_steps": 1}, 0.0, list(range(1, 31))),
        ({"save_steps": 30}, 0.0, [1, 30]),
        # Each step takes 1 s; the time of a write is taken after its step, so the next one
        # is the first step that *starts* save_secs later.
        ({"save_secs": 10.0}, 1.0, [1, 12, 23, 30]),
        ({"save_secs": 2.5}, 1.0, [1, 5, 9, 13, 17, 21, 25, 29, 30]),
    ],
)
def test_writes_at_tf_steps(clock, writer, schedule, advance_secs, steps):
    hook = SummarySaverHook(**schedule, summary_writer=writer, clock=clock)
    run_steps([hook], 30, clock=clock, advance_secs=advance_secs)
    assert writer.scalar_steps("loss") == steps


def test_first_write_starts_the_session_log_at_the_post_increment_step(writer):
    run_steps([SummarySaverHook(save_steps=8, summary_writer=writer)], 10, creator=RestoredAt(100))
    assert [(log.status, log.step) for log in writer.session_logs] == [("START", 101)]
    assert writer.scalar_steps("loss") == [101, 109, 110]


def test_default_fetches_write_every_scalar_output_and_name_the_others_once(writer, caplog):
    run_steps([SummarySaverHook(save_steps=1, summary_writer=writer)], 3, step_fn=outputs)
    assert {e.tag: e.value for e in writer.scalars} == {"loss": 0.25, "acc": 0.5, "count": 3.0, "done": 1.0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # once per key, not once per step
    assert "'logits' is a Tensor of shape (4,), not a number" in warnings[0]
    assert "'name' is a str" in warnings[1] and "not written to TensorBoard" in warnings[1]


def test_a_step_returning_one_value_writes_it_as_loss(writer):
    run_steps([SummarySaverHook(save_steps=100, summary_writer=writer)], 1, step_fn=lambda: torch.tensor(1.5))
    assert [(e.tag, e.value, e.step) for e in writer.scalars] == [("loss", 1.5, 1)]


@pytest.mark.parametrize(
    ("fetches", "expected"),
    [
        (["loss"], {"loss": 0.25}),
        ("acc", {"acc": 0.5}),
        ({"train/loss": "loss", "lr": lambda: 0.1}, {"train/loss": 0.25, "lr": 0.1}),
    ],
)
def test_explicit_fetches(writer, fetches, expected):
    run_steps([SummarySaverHook(save_steps=100, summary_writer=writer, fetches=fetches)], 1, step_fn=outputs)
    assert {e.tag: e.value for e in writer.scalars} == pytest.approx(expected)


def test_an_explicit_non_scalar_fetch_is_an_error(writer):
    hook = SummarySaverHook(save_steps=100, summary_writer=writer, fetches=["logits"])
    with pytest.raises(TypeError, match=r"'logits' is a Tensor of shape \(4,\)"):
        run_steps([hook], 1, step_fn=outputs)


def test_summary_fn_adds_values_on_summary_steps_only(writer):
    calls = []

    def summary_fn(session):
        calls.append(session.global_step)
        return {"lr": 0.01}

    hook = SummarySaverHook(save_steps=5, summary_writer=writer, summary_fn=summary_fn, fetches=())
    run_steps([hook], 12)
    assert calls == [1, 6, 11, 12]  # 12: the final summary at the clean close
    assert [e.tag for e in writer.scalars] == ["lr"] * 4


def test_feeds_summarize_true_on_summary_steps_only(writer):
    seen = []

    def train_step(summarize=False):
        seen.append(summarize)
        out = {"loss": torch.tensor(0.5)}
        if summarize:
            out["grad_norm"] = torch.tensor(2.0)
        return out

    hook = SummarySaverHook(save_steps=8, summary_writer=writer, feed_summarize=True)
    run_steps([hook], 20, step_fn=train_step)
    assert [i + 1 for i, summarize in enumerate(seen) if summarize] == [1, 9, 17]
    assert writer.scalar_steps("grad_norm") == [1, 9, 17]


def test_real_event_files_through_output_dir(tmp_path):
    run_steps([SummarySaverHook(save_steps=8, output_dir=str(tmp_path))], 30)
    SummaryWriterCache.get(str(tmp_path)).flush()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5), (9, 0.5), (17, 0.5), (25, 0.5), (30, 0.5)]


def test_end_flushes_the_writer(writer):
    run_steps([SummarySaverHook(save_steps=8, summary_writer=writer)], 3)
    assert writer.flushes == 1


def test_session_writer_is_the_fallback(writer):
    run_steps([SummarySaverHook(save_steps=8)], 10, creator=SessionCreator(summary_writer=writer))
    assert writer.scalar_steps("loss") == [1, 9, 10]


def test_final_summary_only_when_the_step_advanced(writer):
    run_steps([SummarySaverHook(save_steps=8, summary_writer=writer)], 9)
    assert writer.scalar_steps("loss") == [1, 9]  # step 9 was just written: no duplicate at close


def test_final_summary_leaves_out_a_fetch_the_last_step_did_not_return(writer):
    def train_step(summarize=False):
        return {"loss": torch.tensor(1.0), **({"grad": torch.tensor(2.0)} if summarize else {})}

    hook = SummarySaverHook(save_steps=8, summary_writer=writer, fetches={"l": "loss", "g": "grad"},
                            feed_summarize=True)
    run_steps([hook], 3, step_fn=train_step)
    assert writer.scalar_steps("l") == [1, 3] and writer.scalar_steps("g") == [1]


def test_without_a_writer_it_writes_nothing_feeds_nothing_and_warns_once(caplog):
    seen = []

    def train_step(**kwargs):
        seen.append(kwargs)
        return {"loss": 1.0}

    with MonitoredSession(hooks=[SummarySaverHook(save_steps=2, feed_summarize=True)]) as session:
        for _ in range(5):
            session.run(train_step)
    assert seen == [{}] * 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SummarySaverHook writes no summaries" in warnings[0]


def test_a_non_chief_writes_nothing_even_with_the_session_writer(writer, tmp_path):
    run_steps([SummarySaverHook(save_steps=1), SummarySaverHook(save_steps=1, output_dir=str(tmp_path))], 3,
              creator=SessionCreator(summary_writer=writer, is_chief=False))
    assert writer.scalars == [] and writer.session_logs == []
    assert not list(tmp_path.iterdir())
