"""tpurun.runners.cadence: the Controller's decisions after each host loop, as plain values.

No TensorFlow and no clock: a Cadence from a config, and what `after_loop` says for the
loops of a run (the Controller that acts on it: test_controller.py).
"""

from __future__ import annotations

import pytest

from tpurun.errors import RunError
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.epochs import EpochCount
from tpurun.runners.cadence import AfterLoop, Cadence, crossed, loop_cadence


def make_run(**flags) -> RunConfig:
    """Iris's config with flags; no time cadence unless asked for (the default is 600 s)."""
    flags.setdefault("save_checkpoints_secs", 0)
    flags.setdefault("save_checkpoints_steps", 0)
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    return RunConfig("train", "iris", config, model_dir="/nowhere")


def decisions(cadence: Cadence, start: int = 0, time_due_at=(), stop_at=None) -> list:
    """(step, what after_loop says) for every loop from `start` to the last step."""
    seen, step = [], start
    while step < cadence.last_step:
        num_steps = cadence.loop_length(step)
        step += num_steps
        seen.append(
            (step, cadence.after_loop(step, num_steps, step in time_due_at, step == stop_at))
        )
        if seen[-1][1].stop:
            break
    return seen


@pytest.mark.parametrize(
    "step, num_steps, every, expected",
    [
        (100, 100, 100, True),
        (150, 100, 100, True),
        (1150, 100, 500, False),
        (1550, 100, 500, True),
        (83, 10, 10, True),
        (90, 5, 10, True),
        (85, 5, 10, False),
        (100, 100, 0, False),
    ],
)
def test_a_cadence_fires_in_the_loop_that_passes_a_multiple(step, num_steps, every, expected):
    assert crossed(step, num_steps, every) is expected


@pytest.mark.parametrize(
    "configured, iterations, expected",
    [(25, 10, 30), (30, 10, 30), (0, 10, 0), (1, 100, 100)],
)
def test_loop_cadence_rounds_a_config_cadence_up_to_whole_loops(configured, iterations, expected):
    run = make_run(iterations=iterations, save_checkpoints_steps=configured)
    assert loop_cadence(run, "save_checkpoints_steps") == expected


def test_of_a_run_resolves_its_cadences_in_whole_loops():
    run = make_run(train_steps=1000, iterations=30, save_checkpoints_steps=100, eval_every=200)
    assert Cadence.of(run, evaluating=True) == Cadence(
        last_step=1000, iterations=30, save_every=120, eval_every=210
    )
    # Without an evaluator, --eval_every neither evaluates nor saves.
    assert Cadence.of(run, evaluating=False).eval_every == 0


def test_saves_at_its_steps_and_the_last_waiting_only_for_the_last():
    cadence = Cadence(last_step=500, iterations=100, save_every=200)
    saved = [(step, then.wait_for_save) for step, then in decisions(cadence) if then.save]
    assert saved == [(200, False), (400, False), (500, True)]


def test_the_last_loop_is_shorter_and_a_resumed_run_saves_where_it_passes_a_multiple():
    cadence = Cadence(last_step=1000, iterations=100, save_every=500)
    assert cadence.loop_length(950) == 50
    steps = [step for step, then in decisions(cadence, start=1050 - 1000) if then.save]
    assert steps == [550, 1000]  # from 50: loops end at 150, ..., 550 passes 500


def test_an_eval_is_due_at_its_cadence_and_the_last_step_and_is_waited_for():
    cadence = Cadence(last_step=300, iterations=50, eval_every=100)
    due = [(step, then) for step, then in decisions(cadence) if then.eval_due]
    assert [step for step, _ in due] == [100, 200, 300]
    assert all(then.save and then.wait_for_save for _, then in due)


def test_a_time_save_is_due_after_its_seconds_and_only_when_set():
    assert Cadence(last_step=10, iterations=1, save_secs=600).time_save_due(600.0)
    assert not Cadence(last_step=10, iterations=1, save_secs=600).time_save_due(599.9)
    assert not Cadence(last_step=10, iterations=1).time_save_due(10**9)
    cadence = Cadence(last_step=500, iterations=100, save_secs=600)
    saved = [step for step, then in decisions(cadence, time_due_at={300}) if then.save]
    assert saved == [300, 500]


def test_a_sigterm_saves_waits_and_stops_unless_the_loop_was_the_last():
    cadence = Cadence(last_step=500, iterations=100)
    *_, (step, then) = decisions(cadence, stop_at=300)
    assert step == 300
    assert then == AfterLoop(save=True, wait_for_save=True, eval_due=False, stop=True)
    *_, (step, then) = decisions(cadence, stop_at=500)
    assert step == 500 and not then.stop, "a SIGTERM in the last loop just finishes"


def test_eval_every_epoch_ends_loops_where_epochs_end_and_evaluates_each():
    epochs = EpochCount(examples=120, per_step=25, total=3)  # an epoch ends at steps 5, 10, 15
    cadence = Cadence(last_step=15, iterations=4, epochs=epochs)
    seen = decisions(cadence)
    assert [step for step, _ in seen] == [4, 5, 9, 10, 14, 15]
    assert [step for step, then in seen if then.eval_due] == [5, 10, 15]


def test_eval_every_epoch_without_counted_examples_is_refused():
    run = make_run(eval_every="epoch")
    with pytest.raises(RunError, match="training examples were not counted"):
        Cadence.of(run, evaluating=True)
