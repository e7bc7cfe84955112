"""tpurun.actions: what the controller calls around the host loops, each given explicit
values: progress lines, the input-bound warning, the resume cost, TensorBoard events,
--profile_steps, --hang_timeout, saving a checkpoint, and what follows an evaluation.

Every action is driven here with made-up loops (`LoopStats`), in-process; the
end-to-end runs that show them in a real training run are in test_train_monitors.py.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import re
import sys
import threading
import time

import ml_collections
import pytest
import tensorflow as tf
from conftest import capture_info_logs
from conftest import tensorboard_scalars as scalars
from fakes import FakeClock, fake_checkpoint

from tpurun import actions, config_defaults
from tpurun.actions import hang, progress, watchdog
from tpurun.actions.base import Saved, SaveState
from tpurun.actions.profiler import ProfileSteps
from tpurun.actions.summaries import TrainSummaries
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.splits import Splits

LOG_LINE = re.compile(
    r"step (\d+)/(\d+)  loss [\d.]+  [\d.]+ steps/sec  \d+ examples/sec  input wait (\d+)%"
)
INPUT_BOUND = "Training is input-bound"


def loop(step: int, seconds: float = 1.0, input_seconds: float = 0.0, num_steps: int = 100):
    return actions.LoopStats(
        step=step,
        num_steps=num_steps,
        loss=0.5,
        seconds=seconds,
        input_seconds=input_seconds,
        global_batch=32,
        learning_rate=0.1,
    )


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def infos_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "INFO"]


# --- LoopStats -------------------------------------------------------------------------


def test_loop_stats_rates_and_input_wait_share():
    stats = loop(200, seconds=2.0, input_seconds=0.5, num_steps=100)
    assert stats.steps_per_sec == 50.0
    assert stats.examples_per_sec == 50.0 * 32
    assert stats.input_wait_share == 0.25


@pytest.mark.parametrize(
    "seconds, input_seconds, share",
    [(1.0, 2.0, 1.0), (0.0, 0.0, 0.0)],
    ids=["capped_at_1", "zero_seconds"],
)
def test_loop_stats_input_wait_share_stays_in_0_1(seconds, input_seconds, share):
    assert loop(100, seconds, input_seconds).input_wait_share == share


# --- log lines -------------------------------------------------------------------------


def test_log_lines_one_line_per_loop_with_the_last_step(caplog):
    capture_info_logs(caplog)
    lines = progress.LogLines()
    lines.start(0, 300)
    lines.after_loop(loop(100, seconds=2.0, input_seconds=0.5))
    lines.after_loop(loop(200, seconds=1.0))
    logged = [LOG_LINE.search(m) for m in infos_in(caplog)]
    assert [m.groups() for m in logged if m] == [("100", "300", "25"), ("200", "300", "0")]
    assert infos_in(caplog)[0] == (
        "step 100/300  loss 0.5000  50.0 steps/sec  1600 examples/sec  input wait 25%"
    )


def test_log_lines_say_which_save_is_in_flight_or_how_long_the_last_took(caplog):
    capture_info_logs(caplog)
    lines = progress.LogLines()
    lines.start(0, 300)
    lines.after_loop(loop(100))
    lines.save_state(SaveState(in_flight=100))
    lines.after_loop(loop(200))
    lines.save_state(SaveState(last_seconds=2.414))
    lines.after_loop(loop(300))
    assert [m.split("input wait 0%")[1] for m in infos_in(caplog)] == [
        "",
        "  saving ckpt-100",
        "  last save 2.41s",
    ]


# --- the input-bound warning ----------------------------------------------------------


def test_input_bound_warns_once_naming_the_fixes(caplog):
    watcher = progress.InputBound("SlowModel")
    for step in (100, 200, 300, 400):
        watcher.after_loop(loop(step, seconds=1.0, input_seconds=0.8))
    (warning,) = warnings_in(caplog)
    assert warning.startswith(f"{INPUT_BOUND}: in the host loop up to step 200")
    assert "waited for input 80% of the time" in warning and "SlowModel.input_fn" in warning
    for fix in ("prefetch", "num_parallel_calls", "interleave", "num_parallel_reads", "cache"):
        assert fix in warning
    assert "larger files" in warning


@pytest.mark.parametrize(
    "loops",
    [
        [(1.0, 0.9)],  # the first loop: compiling, filling the pipeline
        [(1.0, 0.1), (1.0, 0.5)],  # not above the share
        [(0.02, 0.001), (0.02, 0.015)],  # above it, but 0.15 ms a step: tf.data's own cost
    ],
    ids=["first_loop", "at_the_share", "under_a_millisecond_a_step"],
)
def test_input_bound_stays_quiet(caplog, loops):
    watcher = progress.InputBound("Iris")
    for i, (seconds, input_seconds) in enumerate(loops):
        watcher.after_loop(loop(100 * (i + 1), seconds, input_seconds))
    assert warnings_in(caplog) == []


# --- --profile_steps -------------------------------------------------------------------


class FakeProfiler:
    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        monkeypatch.setattr(
            tf.profiler.experimental, "start", lambda logdir: self.calls.append(logdir)
        )
        monkeypatch.setattr(tf.profiler.experimental, "stop", lambda: self.calls.append("stop"))


def run_loops(watcher: actions.Action, step: int, last: int, iterations: int) -> None:
    watcher.start(step, last)
    while step < last:
        num_steps = min(iterations, last - step)
        watcher.before_loop(step, num_steps)
        step += num_steps
        watcher.after_loop(loop(step, num_steps=num_steps))
    watcher.close()


@pytest.mark.parametrize(
    "wanted, resumed_at, captured",
    [
        ((120, 180), 0, "101..200"),  # whole loops around the range
        ((101, 150), 0, "101..150"),  # exactly one loop
        ((260, 900), 0, "251..300"),  # past the end: stopped at close
        ((50, 260), 200, "201..300"),  # starts before this (resumed) run
    ],
    ids=["inside", "one_loop", "past_the_end", "before_the_resume"],
)
def test_profile_steps_captures_whole_loops_and_says_which(
    monkeypatch, caplog, tmp_path, wanted, resumed_at, captured
):
    profiler = FakeProfiler(monkeypatch)
    capture_info_logs(caplog)
    run_loops(ProfileSteps(str(tmp_path), *wanted), resumed_at, 300, iterations=50)
    assert profiler.calls == [str(tmp_path), "stop"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Profiled")]
    assert line.startswith(
        f"Profiled steps {captured} (whole host loops) into {tmp_path}/plugins/profile"
    )
    inside = wanted[0] > resumed_at and wanted[1] <= 300
    assert bool(warnings_in(caplog)) is not inside


def test_profile_steps_outside_the_run_warn_and_profile_nothing(monkeypatch, caplog, tmp_path):
    profiler = FakeProfiler(monkeypatch)
    run_loops(ProfileSteps(str(tmp_path), 500, 600), 0, 300, iterations=50)
    assert profiler.calls == []
    (warning,) = warnings_in(caplog)
    assert warning == (
        "--profile_steps=500,600 is outside the steps this run trains (1..300): nothing will "
        "be profiled; pick steps in that range."
    )


# --- --hang_timeout (time is a FakeClock: see tests/test_watchdog.py) -----------------


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock(reads_by="tpurun-watchdog")
    monkeypatch.setattr(watchdog, "time", clock.as_time_module())
    return clock


class Hangs:
    """HangTimeout's on_hang: records the messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.fired = threading.Event()

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        self.fired.set()


def test_hang_timeout_fires_once_with_the_step_and_the_checkpoint(tmp_path, clock):
    hangs = Hangs()
    messages = hangs.messages
    watcher = hang.HangTimeout(0.5, str(tmp_path), on_hang=hangs)
    watcher.start(0, 1000)
    watcher.before_loop(0, 100)
    watcher.after_loop(loop(100))
    watcher.saved(Saved(100, "/runs/x/ckpt-100", seconds=0.0, waited=0.0))
    watcher.before_loop(100, 100)
    clock.advance(2.0)
    assert hangs.fired.wait(60)
    watcher.close()
    assert messages == [
        "tpurun train: error: no progress for --hang_timeout=0.5s at step 100 (in the host loop "
        "of steps 101..200): stuck waiting for input or the TPU; the latest checkpoint is "
        "/runs/x/ckpt-100; rerun the same command to resume from it (or raise --hang_timeout "
        "if a host loop really takes that long)"
    ]


def test_hang_timeout_names_a_save_written_in_the_background_while_the_loop_hung(tmp_path, clock):
    hangs = Hangs()
    watcher = hang.HangTimeout(0.5, str(tmp_path), on_hang=hangs)
    watcher.start(0, 1000)
    watcher.after_loop(loop(100))
    written: concurrent.futures.Future[float] = concurrent.futures.Future()
    watcher.save_state(SaveState(in_flight=100, writing=written))
    watcher.before_loop(100, 100)
    written.set_result(0.0)  # whole, but the controller never heard: the loop hangs
    clock.advance(2.0)
    assert hangs.fired.wait(60)
    watcher.close()
    (message,) = hangs.messages
    assert f"the latest checkpoint is {tmp_path / 'ckpt-100'};" in message


def test_hang_timeout_stays_quiet_while_loops_come(tmp_path, clock):
    hangs = Hangs()
    messages = hangs.messages
    # Loops of 0.3 timeouts each, as the 0.15 s loops of a 0.5 s timeout.
    watcher = hang.HangTimeout(0.04, str(tmp_path), on_hang=hangs)
    watcher.start(0, 1000)
    for step in range(0, 1000, 100):
        watcher.before_loop(step, 100)
        clock.advance(0.012)
        assert clock.wait_for_reads(2)  # the watchdog looked at the clock after the loop
        watcher.after_loop(loop(step + 100))
    watcher.close()
    clock.advance(100.0)  # closed: the thread is gone, nothing fires after training ended
    assert not [t for t in threading.enumerate() if t.name == "tpurun-watchdog"]
    assert messages == []


def test_hang_timeout_names_the_latest_checkpoint_found_at_start(tmp_path, clock):
    fake_checkpoint(tmp_path, 500)
    hangs = Hangs()
    watcher = hang.HangTimeout(0.04, str(tmp_path), on_hang=hangs)
    watcher.start(500, 1000)
    clock.advance(1.0)  # before the first loop: the restore or the input's start-up hangs
    assert hangs.fired.wait(60)
    watcher.close()
    (message,) = hangs.messages
    assert "at step 500 (before the first host loop)" in message
    assert f"the latest checkpoint is {tmp_path / 'ckpt-500'};" in message


def test_hang_timeout_does_not_watch_the_first_loop_of_a_resumed_input_that_cannot_seek(
    tmp_path, clock
):
    """That loop reads every batch already trained on: its time grows with the step."""
    hangs = Hangs()
    watcher = hang.HangTimeout(0.04, str(tmp_path), on_hang=hangs, input_seeks=False)
    watcher.start(500, 1000)
    watcher.before_loop(500, 100)
    clock.advance(100.0)
    assert clock.wait_for_reads(2)
    assert hangs.messages == []
    watcher.after_loop(loop(600))  # watched again from here
    watcher.before_loop(600, 100)
    clock.advance(1.0)
    assert hangs.fired.wait(60)
    watcher.close()
    (message,) = hangs.messages
    assert "at step 600 (in the host loop of steps 601..700)" in message


@pytest.mark.parametrize("step, input_seeks", [(0, False), (500, True)], ids=["fresh", "seeks"])
def test_hang_timeout_watches_the_first_loop_otherwise(tmp_path, clock, step, input_seeks):
    hangs = Hangs()
    watcher = hang.HangTimeout(0.04, str(tmp_path), on_hang=hangs, input_seeks=input_seeks)
    watcher.start(step, 1000)
    watcher.before_loop(step, 100)
    clock.advance(1.0)
    assert hangs.fired.wait(60)
    watcher.close()
    assert f"in the host loop of steps {step + 1}..{step + 100}" in hangs.messages[0]


# --- the progress line -----------------------------------------------------------------


def test_progress_bar_shows_steps_loss_and_eta_and_puts_logs_above_it():
    from absl import logging

    stream = io.StringIO()
    stderr, handler = sys.stderr, logging.get_absl_handler().python_handler
    handler_stream = handler.stream
    bar = progress.ProgressBar(stream)
    bar.start(100, 400)
    for step in (200, 300, 400):
        bar.before_loop(step - 100, 100)
        bar.after_loop(loop(step, seconds=0.5, input_seconds=0.1))
    print("Saved checkpoint /x/ckpt-400.", file=sys.stderr)  # as absl writes it
    bar.close()
    assert sys.stderr is stderr and handler.stream is handler_stream
    shown = stream.getvalue()
    assert re.search(
        r"step 400/400, loss 0\.5000, input wait 20% \[[\d.]+ steps/s, ETA 00:00\]", shown
    )
    assert "\rSaved checkpoint /x/ckpt-400.\n" in shown  # on a line of its own


def test_log_lines_and_the_progress_bar_show_the_epoch(caplog):
    from tpurun.run_config.epochs import EpochCount

    capture_info_logs(caplog)
    epochs = EpochCount(examples=6400, per_step=32, total=2)  # 200 steps per epoch
    lines = progress.LogLines(epochs)
    lines.start(0, 400)
    lines.after_loop(loop(100, seconds=2.0))
    assert infos_in(caplog)[0].startswith("step 100/400  epoch 0.50/2  loss 0.5000  ")
    stream = io.StringIO()
    bar = progress.ProgressBar(stream, epochs=epochs)
    bar.start(200, 400)
    bar.after_loop(loop(300, seconds=1.0))
    bar.close()
    assert "step 300/400, epoch 1.50/2, loss 0.5000, input wait" in stream.getvalue()


# --- which actions a training run gets ---------------------------------------------------------


def make_run(tmp_path, **fields) -> RunConfig:
    config = ml_collections.FrozenConfigDict(config_defaults.base_config(model="iris"))
    return RunConfig(
        command="train", config_name="iris", config=config, model_dir=str(tmp_path), **fields
    )


def kinds(run: RunConfig, is_chief: bool, terminal: bool) -> list[str]:
    watchers = actions.for_training(
        run, is_chief=is_chief, model_name="Iris", input_seeks=True, terminal=terminal
    )
    for watcher in watchers:
        watcher.close()
    return [type(w).__name__ for w in watchers]


@pytest.mark.parametrize(
    "is_chief, terminal, fields, expected",
    [
        (True, True, {}, ["HangTimeout", "ProgressBar", "InputBound", "TrainSummaries"]),
        (True, False, {}, ["HangTimeout", "LogLines", "InputBound", "TrainSummaries"]),
        (False, True, {}, ["HangTimeout", "LogLines", "InputBound"]),
        (
            True,
            False,
            {"hang_timeout": 0, "profile_steps": (1, 2)},
            ["LogLines", "InputBound", "TrainSummaries", "ProfileSteps"],
        ),
        (False, False, {"profile_steps": (1, 2)}, ["HangTimeout", "LogLines", "InputBound"]),
    ],
    ids=[
        "chief_terminal",
        "chief_log",
        "worker_terminal",
        "chief_profile_no_watchdog",
        "worker_profile",
    ],
)
def test_for_training_picks_the_monitors(tmp_path, is_chief, terminal, fields, expected):
    assert kinds(make_run(tmp_path, **fields), is_chief, terminal) == expected


# --- what a resume cost ------------------------------------------------------------------


def test_resume_cost_is_logged_once_after_the_first_loop_of_a_resumed_run(caplog):
    capture_info_logs(caplog)
    cost = progress.ResumeCost()
    cost.start(150, 300)
    cost.after_loop(loop(250, seconds=0.25))
    cost.after_loop(loop(300))
    (line,) = [m for m in infos_in(caplog) if m.startswith("Resumed")]
    assert re.fullmatch(
        r"Resumed at step 150 in [\d.]+s: restore [\d.]+s, first host loop 0\.25s\.", line
    )


def test_resume_cost_says_nothing_for_a_fresh_start(caplog):
    capture_info_logs(caplog)
    cost = progress.ResumeCost()
    cost.start(0, 300)
    cost.after_loop(loop(100))
    assert not [m for m in infos_in(caplog) if m.startswith("Resumed")]


# --- TensorBoard events of training --------------------------------------------------


def test_train_summaries_write_the_scalars_of_every_loop(tmp_path):
    summaries = TrainSummaries(str(tmp_path))
    assert list(tmp_path.iterdir()) == [], "no events file before start"
    summaries.start(0, 200)
    summaries.after_loop(loop(100, seconds=2.0, input_seconds=0.5))
    summaries.after_loop(loop(200, seconds=1.0))
    summaries.close()
    (events,) = tmp_path.glob("events.out.tfevents.*")
    found = scalars(tmp_path)
    assert set(found) == {
        "loss",
        "learning_rate",
        "global_step/sec",
        "examples/sec",
        "input_wait_share",
    }
    assert found["global_step/sec"] == [(100, 50.0), (200, 100.0)]
    assert found["input_wait_share"] == [(100, 0.25), (200, 0.0)]
    assert found["learning_rate"] == [(100, pytest.approx(0.1)), (200, pytest.approx(0.1))]


def test_train_summaries_survive_a_model_graph_that_fails_to_trace(tmp_path, caplog):
    def graph():
        raise ValueError("cannot trace")

    summaries = TrainSummaries(str(tmp_path), graph=graph)
    summaries.start(0, 100)
    summaries.after_loop(loop(100))
    summaries.close()
    assert warnings_in(caplog) == [
        "No model graph for TensorBoard: tracing the model failed: cannot trace"
    ]
    assert [step for step, _ in scalars(tmp_path)["loss"]] == [100]


# --- saving a checkpoint -------------------------------------------------------------


def iris_run(model_dir, command: str = "train", **flags) -> RunConfig:
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    return RunConfig(command=command, config_name="iris", config=config, model_dir=str(model_dir))


def test_save_checkpoint_writes_ckpt_step_and_keeps_keep_checkpoint_max(tmp_path):
    from tpurun.actions.save import SaveCheckpoint
    from tpurun.cluster import Cluster

    cluster = Cluster(tf.distribute.get_strategy(), "test")
    checkpoint = tf.train.Checkpoint(value=tf.Variable(1.0))
    save = SaveCheckpoint(iris_run(tmp_path, keep_checkpoint_max=2), checkpoint, cluster)
    paths = [save(step) for step in (10, 20, 30)]
    assert paths == [str(tmp_path / f"ckpt-{step}") for step in (10, 20, 30)]
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == [
        "ckpt-20.index",
        "ckpt-30.index",
    ]
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[-1]


def test_a_non_chief_saves_into_a_scratch_dir_and_deletes_it(tmp_path):
    """Every worker takes part in a save; only the chief's copy is kept."""
    from tpurun.actions.save import SaveCheckpoint
    from tpurun.cluster import Cluster

    cluster = Cluster(tf.distribute.get_strategy(), "test", is_chief=False, task="worker-1")
    checkpoint = tf.train.Checkpoint(value=tf.Variable(1.0))
    save = SaveCheckpoint(iris_run(tmp_path), checkpoint, cluster)
    assert save(10) == str(tmp_path / "ckpt-10")  # where the chief's copy is
    assert not list(tmp_path.glob("ckpt-*"))
    assert not (tmp_path / ".scratch" / "worker-1").exists()


# --- what follows an evaluation -------------------------------------------------------


def results(step: int, accuracy: float) -> dict[str, float]:
    return {"accuracy": accuracy, "loss": 0.5, "num_examples": 30, "global_step": step}


IRIS = Splits(names=("test",), best="test", chosen="test", also=())
VAL_AND_TEST = Splits(names=("val", "test"), best="val", chosen="val", also=("test",))


def test_report_eval_on_the_chief_writes_results_scalars_and_the_best(tmp_path, capsys):
    from tpurun.actions.evaluation import ReportEval

    report = ReportEval(iris_run(tmp_path, "eval"), is_chief=True, model_splits=IRIS)
    for step, accuracy in ((10, 0.5), (20, 0.9), (30, 0.7)):
        report(fake_checkpoint(tmp_path, step), "test", results(step, accuracy))
    assert capsys.readouterr().out.splitlines() == [
        "eval at step 10 on test: accuracy=0.5000  loss=0.5000  (30 examples)",
        "eval at step 20 on test: accuracy=0.9000  loss=0.5000  (30 examples)",
        "eval at step 30 on test: accuracy=0.7000  loss=0.5000  (30 examples)",
    ]
    written = json.loads((tmp_path / "eval" / "test" / "results-20.json").read_text())
    assert written == results(20, 0.9)
    found = scalars(tmp_path / "eval_test")
    assert found["accuracy"] == [(10, 0.5), (20, pytest.approx(0.9)), (30, pytest.approx(0.7))]
    assert "global_step" not in found
    assert len(list((tmp_path / "eval_test").glob("events.out.tfevents.*"))) == 1
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 20


def test_report_eval_of_another_split_leaves_best_alone_and_says_so_once(tmp_path, capsys):
    from tpurun.actions.evaluation import ReportEval

    report = ReportEval(iris_run(tmp_path, "eval"), is_chief=True, model_splits=VAL_AND_TEST)
    report(fake_checkpoint(tmp_path, 10), "val", results(10, 0.5))
    for step in (10, 20):
        report(fake_checkpoint(tmp_path, step), "test", results(step, 0.9))
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "eval at step 10 on val",
        "eval at step 10 on test",
        "not the best_split 'val'",
        "eval at step 20 on test",
    ]
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 10
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith("eval")} == {
        "eval",
        "eval_val",
        "eval_test",
    }


def test_report_eval_on_another_worker_only_prints(tmp_path, capsys):
    from tpurun.actions.evaluation import ReportEval

    ReportEval(iris_run(tmp_path, "eval"), is_chief=False, model_splits=IRIS)(
        str(tmp_path / "ckpt-10"), "test", results(10, 0.5)
    )
    assert (
        capsys.readouterr().out
        == "eval at step 10 on test: accuracy=0.5000  loss=0.5000  (30 examples)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_failed_best_update_is_a_warning_not_a_failure(tmp_path, monkeypatch, caplog, capsys):
    """The chief alone writes these: failing would leave the other workers blocked."""
    from tpurun.actions.evaluation import ReportEval
    from tpurun.storage import best

    def fail(*args):
        raise tf.errors.UnavailableError(None, None, "storage is down")

    monkeypatch.setattr(best, "update", fail)
    ReportEval(iris_run(tmp_path, "eval"), is_chief=True, model_splits=IRIS)(
        fake_checkpoint(tmp_path, 10), "test", results(10, 0.5)
    )
    assert warnings_in(caplog) == [
        "Could not write the eval summaries or the best checkpoint: UnavailableError: storage "
        "is down; the results of step 10 are not recorded, so the next evaluation of this "
        "model_dir evaluates it again"
    ]
    assert "eval at step 10" in capsys.readouterr().out
    # Not marked evaluated: a sidecar or a resumed run offers step 10 to best/ again.
    assert not (tmp_path / "eval" / "test" / "results-10.json").exists()


def test_evaluate_checkpoint_makes_its_evaluator_at_the_first_evaluation_only():
    from tpurun.actions.evaluation import EvaluateCheckpoint

    made: list[str] = []
    reported: list[tuple[str, dict]] = []

    def make_evaluate():
        made.append("evaluator")
        return lambda path, split: {"global_step": int(path.rsplit("-", 1)[1])}

    evaluate = EvaluateCheckpoint(
        make_evaluate,
        lambda path, split, r: reported.append((path, split, r)),
        VAL_AND_TEST.every_eval(),
    )
    assert made == []  # not when training starts: it would draw from the seeded state
    evaluate("/m/ckpt-10")
    evaluate("/m/ckpt-20")
    assert made == ["evaluator"]
    assert reported == [
        ("/m/ckpt-10", "val", {"global_step": 10}),
        ("/m/ckpt-10", "test", {"global_step": 10}),
        ("/m/ckpt-20", "val", {"global_step": 20}),
        ("/m/ckpt-20", "test", {"global_step": 20}),
    ]


def test_a_finished_run_whose_record_cannot_be_rewritten_records_its_end_under_a_new_name(
    tmp_path, caplog
):
    """Another file in its record's place at the end: the account goes to a new record, so
    the report counts a run that finished, not a disruption."""
    from tpurun import report
    from tpurun.actions.goodput import GoodputRecord, initial_account
    from tpurun.layout.names import run_record_name as record_name

    runs = tmp_path / "runs"
    runs.mkdir()
    path = runs / record_name("train")
    account = GoodputRecord(str(path), {"run_config": {}, "goodput": initial_account()})
    account.start(0, 10)  # written at once
    path.unlink()
    path.mkdir()  # in the way of its last write
    account.finish("finished")
    assert "Could not rewrite the run record" in caplog.text
    later = {"process_start": time.time() + 1, "end": {"t": time.time() + 2, "reason": "finished"}}
    (runs / "29991231T000000.000000Z-train.json").write_text(json.dumps({"goodput": later}))
    summary = report.read(str(tmp_path))
    assert (summary.processes, summary.disruptions) == (2, 0)
