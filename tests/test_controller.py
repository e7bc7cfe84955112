"""tpurun.runners.controller: the outer training loop, driven with a fake trainer.

The fake trainer counts steps in one tf.Variable, saved and restored by the real
checkpoint code in a tmp model_dir (tiny checkpoints: milliseconds each); fake
actions and a fake `evaluate` record every call in one list, so a test sees what
the controller did and in which order. Time is a FakeClock patched in as the
controller's `time`.
"""

from __future__ import annotations

import math
import signal
import threading

import pytest
import tensorflow as tf
from conftest import capture_info_logs
from fakes import FakeClock

from tpurun.actions.base import Action, LoopStats
from tpurun.cluster import Cluster
from tpurun.errors import Preempted, RunError
from tpurun.run_config import RunConfig, config_files, epochs, merge_flags
from tpurun.runners import controller
from tpurun.runners.controller import Controller, sigterm_notice
from tpurun.storage import checkpoints
from tpurun.storage.background import Writer

LOOP_SECONDS = 7.0  # fake seconds each host loop takes


class FakeTrainer:
    """What the Controller needs of a Trainer: a step, checkpoints, `train(n) -> LoopStats`.

    `bad_loss`/`bad_weights`: the loop ending at that step reports a non-finite loss
    or weights; `on_loop(step)` runs at the end of each loop (e.g. to send SIGTERM).
    """

    def __init__(
        self, log: list, clock: FakeClock, *, bad_loss=None, bad_weights=None, on_loop=None
    ):
        self.log = log
        self.clock = clock
        self.steps = tf.Variable(0, dtype=tf.int64)
        self.checkpoint = self.fresh_checkpoint()
        self.model = self.keras_model = None  # used only by a warm start
        self.bad_loss, self.bad_weights, self.on_loop = bad_loss, bad_weights, on_loop

    def fresh_checkpoint(self, present=None) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(steps=self.steps)

    @property
    def step(self) -> int:
        return int(self.steps.numpy())

    loop_times = None  # not a device-data loop chosen by timing

    def start_input(self, recorded=None) -> None:
        self.log.append(("start_input", self.step))

    def restored(self) -> None:
        self.log.append(("restored", self.step))

    def train(self, num_steps: int) -> LoopStats:
        self.steps.assign_add(num_steps)
        self.clock.advance(LOOP_SECONDS)
        self.log.append(("train", self.step))
        if self.on_loop:
            self.on_loop(self.step)
        return LoopStats(
            step=self.step,
            num_steps=num_steps,
            loss=math.nan if self.step == self.bad_loss else 0.5,
            seconds=1.0,
            input_seconds=0.0,
            global_batch=32,
            learning_rate=0.1,
            weights_finite=self.step != self.bad_weights,
        )


class Recorder(Action):
    """Records every hook with its values; the checkpoint `saved` names must exist."""

    def __init__(self, log: list, name: str = "action"):
        self.log, self.name = log, name

    def start(self, step, last_step):
        self.log.append((f"{self.name}.start", step, last_step))

    def before_loop(self, step, num_steps):
        self.log.append((f"{self.name}.before_loop", step, num_steps))

    def after_loop(self, stats):
        self.log.append((f"{self.name}.after_loop", stats.step))

    def saved(self, saved):
        assert tf.io.gfile.exists(saved.path + ".index"), "saved before the checkpoint exists"
        self.log.append((f"{self.name}.saved", saved.step, saved.path.rsplit("/", 1)[1]))

    def close(self):
        self.log.append((f"{self.name}.close",))


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(controller, "time", clock.as_time_module())
    return clock


def make_run(model_dir, examples=None, **flags) -> RunConfig:
    """Iris's config with flags; no time cadence unless asked for (the default is 600 s).

    `examples`: the training examples counted (as tpurun.commands.running.resolve_length does)."""
    flags.setdefault("save_checkpoints_secs", 0)
    flags.setdefault("save_checkpoints_steps", 0)
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    run = RunConfig("train", "iris", config, model_dir=str(model_dir))
    return epochs.resolve_length(run, epochs.Counted(examples, "given")) if examples else run


def train(
    model_dir,
    clock,
    *,
    evaluate=True,
    trainer_args=None,
    examples=None,
    writer=None,
    log=None,
    **flags,
) -> tuple[list, FakeTrainer]:
    """Runs a Controller to --train_steps; returns the log of what happened, and the trainer.

    With a `writer`, saves are written in the background."""
    log = [] if log is None else log
    trainer = FakeTrainer(log, clock, **(trainer_args or {}))
    cluster = Cluster(tf.distribute.get_strategy(), "1 CPU replica (default strategy)")

    def evaluated(path: str) -> None:
        assert tf.io.gfile.exists(path + ".index"), "evaluated before the checkpoint is whole"
        log.append(("evaluate", path.rsplit("/", 1)[1]))

    Controller(
        make_run(model_dir, examples, **flags),
        cluster,
        trainer,
        actions=[Recorder(log)],
        evaluate_checkpoint=evaluated if evaluate else None,
        writer=writer,
    ).train()
    return log, trainer


def saves(log: list) -> list[int]:
    return [entry[1] for entry in log if entry[0] == "action.saved"]


def evaluations(log: list) -> list[str]:
    return [entry[1] for entry in log if entry[0] == "evaluate"]


def checkpoints_in(model_dir) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in model_dir.glob("ckpt-*.index"))


# --- cadence -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps, iterations, save_every, saved",
    [
        (95, 10, 25, [30, 60, 90, 95]),  # 25 rounded up to 30; always the last step
        (95, 10, 0, [95]),  # no step cadence: the last step only
        (100, 10, 50, [50, 100]),  # on the loop boundary: no extra save at the end
        (35, 50, 10, [35]),  # one short loop
    ],
    ids=["rounded_up", "only_the_last", "on_the_boundary", "one_short_loop"],
)
def test_saves_every_n_steps_rounded_up_to_loops_and_at_the_last_step(
    tmp_path, clock, caplog, steps, iterations, save_every, saved
):
    capture_info_logs(caplog)
    log, trainer = train(
        tmp_path,
        clock,
        train_steps=steps,
        iterations=iterations,
        save_checkpoints_steps=save_every,
        keep_checkpoint_max=100,
    )
    assert saves(log) == saved
    assert checkpoints_in(tmp_path) == saved
    assert trainer.step == steps
    rounded = -(-save_every // iterations) * iterations
    notice = (
        f"save_checkpoints_steps={save_every} rounded up to {rounded}, a multiple of "
        f"--iterations={iterations}."
    )
    assert (notice in caplog.messages) is (rounded != save_every)


def test_save_checkpoints_secs_saves_after_the_loop_that_passes_it(tmp_path, clock):
    # Loops of 7 fake seconds, a save due every 20: after the 3rd loop (21 s since the
    # start), then the 6th (21 s since that save), ...; and at the last step.
    log, _ = train(
        tmp_path,
        clock,
        train_steps=100,
        iterations=10,
        save_checkpoints_secs=20,
        keep_checkpoint_max=100,
    )
    assert saves(log) == [30, 60, 90, 100]


def test_steps_and_secs_cadences_whichever_comes_first(tmp_path, clock):
    log, _ = train(
        tmp_path,
        clock,
        train_steps=100,
        iterations=10,
        save_checkpoints_steps=40,
        save_checkpoints_secs=30,  # 5 loops of 7 s
        keep_checkpoint_max=100,
    )
    # 40 (steps, at 28 s), 80 (steps, at 56 s: before the time save due 30 s after the
    # one at 40, which restarted the count), 100 (the last).
    assert saves(log) == [40, 80, 100]


def test_evaluates_after_the_save_at_eval_steps_and_the_last(tmp_path, clock, caplog):
    capture_info_logs(caplog)
    log, _ = train(tmp_path, clock, train_steps=110, iterations=25, eval_every=40)
    assert "eval_every=40 rounded up to 50, a multiple of --iterations=25." in caplog.messages
    assert evaluations(log) == ["ckpt-50", "ckpt-100", "ckpt-110"]
    assert saves(log) == [50, 100, 110]  # an eval step saves the checkpoint it evaluates
    at_50 = log.index(("action.after_loop", 50))
    assert log[at_50 : at_50 + 3] == [
        ("action.after_loop", 50),
        ("action.saved", 50, "ckpt-50"),
        ("evaluate", "ckpt-50"),
    ]


def test_eval_every_without_an_evaluator_neither_evaluates_nor_saves(tmp_path, clock):
    log, _ = train(tmp_path, clock, evaluate=False, train_steps=110, iterations=25, eval_every=40)
    assert evaluations(log) == []
    assert saves(log) == [110]


def test_eval_every_epoch_ends_host_loops_where_epochs_end_and_evaluates_each(
    tmp_path, clock, caplog
):
    """3 epochs of 120 examples at 25 per step: 15 steps, epochs ending in steps 5 (4.8
    epochs' worth of steps), 10 (9.6) and 15 (14.4); loops of 4 are cut there."""
    capture_info_logs(caplog)
    log, _ = train(
        tmp_path, clock, examples=120, train_epochs=3, batch_size=25, iterations=4,
        eval_every="epoch",
    )  # fmt: skip
    assert "Training from step 0 to 15 (epoch 0.00 to 3.12), 4 steps per loop." in caplog.messages
    loops = [entry[2] for entry in log if entry[0] == "action.before_loop"]
    assert loops == [4, 1, 4, 1, 4, 1]
    assert evaluations(log) == ["ckpt-5", "ckpt-10", "ckpt-15"]
    assert saves(log) == [5, 10, 15]


def test_a_resumed_run_saves_in_the_loops_that_pass_a_multiple(tmp_path, clock, caplog):
    """Resumed at 73, loops end at 83, 93, ...: each passes a multiple of 10."""
    capture_info_logs(caplog)
    first, _ = train(
        tmp_path, clock, train_steps=73, iterations=10, save_checkpoints_steps=10,
        keep_checkpoint_max=100,
    )  # fmt: skip
    assert saves(first) == [10, 20, 30, 40, 50, 60, 70, 73]
    assert ("restored", 0) not in first
    log, trainer = train(
        tmp_path, clock, train_steps=150, iterations=10, save_checkpoints_steps=10,
        keep_checkpoint_max=100,
    )  # fmt: skip
    assert f"Resuming from {tmp_path / 'ckpt-73'} (step 73)." in caplog.messages
    assert log[0] == ("restored", 73)
    assert ("action.start", 73, 150) in log
    assert saves(log) == [*range(83, 150, 10), 150]
    assert trainer.step == 150


def test_already_at_the_last_step_does_nothing(tmp_path, clock, caplog):
    capture_info_logs(caplog)
    train(tmp_path, clock, train_steps=20, iterations=10)
    (tmp_path / "train_config.json").unlink()
    log, _ = train(tmp_path, clock, train_steps=20, iterations=10)
    assert "Already at step 20 of --train_steps=20: nothing to train." in caplog.messages
    assert log == [("restored", 20)]  # no action started, no input
    assert not (tmp_path / "train_config.json").exists()


# --- the order of the hooks --------------------------------------------------------------


def test_hooks_come_in_order_with_their_values(tmp_path, clock):
    log: list = []
    trainer = FakeTrainer(log, clock)
    Controller(
        make_run(tmp_path, train_steps=25, iterations=10, eval_every=20),
        Cluster(tf.distribute.get_strategy(), "test"),
        trainer,
        actions=[Recorder(log, "a"), Recorder(log, "b")],
        evaluate_checkpoint=lambda path: log.append(("evaluate", path.rsplit("/", 1)[1])),
    ).train()
    assert log == [
        ("start_input", 0),  # before any action starts: bad data fails a run that wrote nothing
        ("a.start", 0, 25),
        ("b.start", 0, 25),
        ("a.before_loop", 0, 10),
        ("b.before_loop", 0, 10),
        ("train", 10),
        ("a.after_loop", 10),
        ("b.after_loop", 10),
        ("a.before_loop", 10, 10),
        ("b.before_loop", 10, 10),
        ("train", 20),
        ("a.after_loop", 20),
        ("b.after_loop", 20),
        ("a.saved", 20, "ckpt-20"),
        ("b.saved", 20, "ckpt-20"),
        ("evaluate", "ckpt-20"),
        ("a.before_loop", 20, 5),  # the last loop is short
        ("b.before_loop", 20, 5),
        ("train", 25),
        ("a.after_loop", 25),
        ("b.after_loop", 25),
        ("a.saved", 25, "ckpt-25"),
        ("b.saved", 25, "ckpt-25"),
        ("evaluate", "ckpt-25"),
        ("a.close",),
        ("b.close",),
    ]
    assert (tmp_path / "train_config.json").exists()


# --- the NaN guard -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "trainer_args, what",
    [
        ({"bad_loss": 30}, "the loss became nan"),
        ({"bad_weights": 30}, "a weight became NaN or Inf"),
    ],
    ids=["loss", "weights"],
)
def test_non_finite_loss_or_weights_stop_with_nothing_saved_after(
    tmp_path, clock, trainer_args, what
):
    with pytest.raises(RunError) as raised:
        train(
            tmp_path,
            clock,
            trainer_args=trainer_args,
            train_steps=100,
            iterations=10,
            save_checkpoints_steps=20,
            eval_every=30,
        )
    assert str(raised.value) == (
        f"{what} between steps 21 and 30; the latest checkpoint is still "
        f"{tmp_path / 'ckpt-20'}; lower config.optimizer.learning_rate or look for NaN/Inf "
        "in the data"
    )
    assert checkpoints_in(tmp_path) == [20]
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-20")


def test_non_finite_before_any_save_says_nothing_was_saved(tmp_path, clock):
    log: list = []
    trainer = FakeTrainer(log, clock, bad_loss=10)
    with pytest.raises(
        RunError, match=r"the latest checkpoint is still none \(nothing was saved\)"
    ):
        Controller(
            make_run(tmp_path, train_steps=100, iterations=10),
            Cluster(tf.distribute.get_strategy(), "test"),
            trainer,
            actions=[Recorder(log)],
        ).train()
    assert checkpoints_in(tmp_path) == []
    assert log[-2:] == [("action.after_loop", 10), ("action.close",)]  # closed all the same


# --- saves written in the background ----------------------------------------------------


def held(writer: Writer) -> threading.Event:
    """Holds the writer's thread until the returned event is set: saves stay in flight."""
    gate = threading.Event()
    writer.submit(lambda: gate.wait(60))
    return gate


def release_at(gate: threading.Event, step: int, then=None):
    """A trainer's on_loop: lets the writer go on at the end of the loop that ends at `step`."""

    def on_loop(at: int) -> None:
        if at == step:
            gate.set()
            if then is not None:
                then(at)

    return on_loop


def test_a_background_save_is_written_while_the_next_loops_train(tmp_path, clock):
    log: list = []
    with Writer() as writer:
        gate = held(writer)
        train(
            tmp_path, clock, writer=writer, log=log, trainer_args={"on_loop": release_at(gate, 30)},
            train_steps=55, iterations=10, save_checkpoints_steps=20, eval_every=40,
        )  # fmt: skip
    # ckpt-20 was being written during the loops to 30; reported once whole (Recorder
    # checks); the one to evaluate (40) and the last (55) were waited for.
    assert saves(log) == [20, 40, 55]
    assert log.index(("action.saved", 20, "ckpt-20")) > log.index(("train", 30))
    assert evaluations(log) == ["ckpt-40", "ckpt-55"]
    assert log[-2:] == [("evaluate", "ckpt-55"), ("action.close",)]
    assert checkpoints.latest(str(tmp_path)) == str(tmp_path / "ckpt-55")


def test_non_finite_loss_waits_for_the_save_in_flight_and_names_it(tmp_path, clock):
    with Writer() as writer, pytest.raises(RunError) as raised:
        gate = held(writer)
        train(
            tmp_path, clock, writer=writer,
            trainer_args={"bad_loss": 30, "on_loop": release_at(gate, 30)},
            train_steps=100, iterations=10, save_checkpoints_steps=20,
        )  # fmt: skip
    assert f"the latest checkpoint is still {tmp_path / 'ckpt-20'};" in str(raised.value)
    assert checkpoints_in(tmp_path) == [20]


def test_sigterm_waits_for_the_save_in_flight_and_its_own(tmp_path, clock):
    log: list = []
    with Writer() as writer, pytest.raises(Preempted):
        gate = held(writer)
        on_loop = release_at(gate, 30, then=sigterm_at(30))
        train(
            tmp_path, clock, writer=writer, log=log, trainer_args={"on_loop": on_loop},
            train_steps=100, iterations=10, save_checkpoints_steps=20,
        )  # fmt: skip
    assert saves(log) == [20, 30]
    assert checkpoints.latest(str(tmp_path)) == str(tmp_path / "ckpt-30")


def test_a_failed_background_save_ends_the_run_at_the_next_loop_with_its_error(
    tmp_path, clock, monkeypatch
):
    full = tf.errors.ResourceExhaustedError(None, None, "ckpt-10_temp/...; No space left on device")
    commit = checkpoints.Saver.commit

    def failing(self, snapshot):
        if snapshot.path.endswith("ckpt-10"):
            raise full
        return commit(self, snapshot)

    monkeypatch.setattr(checkpoints.Saver, "commit", failing)
    log: list = []
    with Writer() as writer, pytest.raises(RunError) as raised:
        gate = held(writer)
        train(
            tmp_path, clock, writer=writer, log=log, trainer_args={"on_loop": release_at(gate, 20)},
            train_steps=100, iterations=10, save_checkpoints_steps=10,
        )  # fmt: skip
    # The line a save the loop waited for gives (`save_failed`): the cause, the last good one.
    assert str(raised.value) == (
        f"could not save ckpt-10 in --model_dir={tmp_path}: the disk is full (No space left on "
        "device); no checkpoint was saved before it: make room on it, then rerun the same "
        "command to resume"
    )
    assert ("train", 30) not in log, "ended at the loop after the failed save"
    assert saves(log) == [] and checkpoints_in(tmp_path) == []
    assert log[-1] == ("action.close",)


# --- SIGTERM: save at the current step, then "preempted, restart me" ---------------------


def sigterm_at(step: int):
    def on_loop(at: int) -> None:
        if at == step:
            signal.raise_signal(signal.SIGTERM)  # what a TPU VM gets before preemption

    return on_loop


def test_sigterm_saves_at_the_current_step_then_raises_preempted(tmp_path, clock):
    log: list = []
    trainer = FakeTrainer(log, clock, on_loop=sigterm_at(30))
    with pytest.raises(Preempted) as raised:
        Controller(
            make_run(tmp_path, train_steps=100, iterations=10, save_checkpoints_steps=50),
            Cluster(tf.distribute.get_strategy(), "test"),
            trainer,
            actions=[Recorder(log)],
        ).train()
    assert raised.value.exit_code == 75
    assert str(raised.value) == (
        "SIGTERM: saved a checkpoint at step 30; rerun the same command to continue from it "
        "(exit code 75 means: preempted, restart me)"
    )
    assert saves(log) == [30]
    assert checkpoints_in(tmp_path) == [30]
    assert ("train", 40) not in log, "no loop after the notice"
    assert log[-1] == ("action.close",)


def test_sigterm_in_the_last_loop_just_finishes(tmp_path, clock):
    log: list = []
    trainer = FakeTrainer(log, clock, on_loop=sigterm_at(30))
    Controller(
        make_run(tmp_path, train_steps=30, iterations=10),
        Cluster(tf.distribute.get_strategy(), "test"),
        trainer,
        actions=[Recorder(log)],
    ).train()
    assert saves(log) == [30]


def test_sigterm_notice_sets_the_event_and_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGTERM)
    with sigterm_notice() as preempted:
        assert not preempted.is_set()
        signal.raise_signal(signal.SIGTERM)  # the process lives on
        assert preempted.is_set()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigterm_notice_off_the_main_thread_installs_nothing():
    import threading

    seen: list = []

    def in_thread() -> None:
        with sigterm_notice() as preempted:
            seen.append((preempted.is_set(), signal.getsignal(signal.SIGTERM)))

    previous = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [(False, previous)]
