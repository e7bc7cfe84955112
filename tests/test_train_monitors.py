"""Watching a training run: progress line or log lines, TensorBoard graph and input wait,
the input-bound warning, --profile_steps and the --hang_timeout watchdog.

The monitors' logic is tested in-process with made-up loops; the end-to-end tests
(marked slow) run tpurun: Iris, and a model of its own whose input is slow, or
blocks forever after a number of batches.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import ml_collections
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, assert_ok, error_lines, run_tpurun

from tpurun import actions, config_defaults
from tpurun.actions import hang, progress
from tpurun.actions.profiler import ProfileSteps
from tpurun.errors import EXIT_HUNG
from tpurun.run_config import RunConfig

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
    caplog.set_level("INFO")
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


# --- --hang_timeout --------------------------------------------------------------------


def test_hang_timeout_fires_once_with_the_step_and_the_checkpoint(tmp_path):
    messages: list[str] = []
    watcher = hang.HangTimeout(0.5, str(tmp_path), on_hang=messages.append)
    watcher.start(0, 1000)
    watcher.before_loop(0, 100)
    watcher.after_loop(loop(100))
    watcher.after_save(100, "/runs/x/ckpt-100")
    watcher.before_loop(100, 100)
    time.sleep(2.0)
    watcher.close()
    assert messages == [
        "tpurun train: error: no progress for --hang_timeout=0.5s at step 100 (in the host loop "
        "of steps 101..200): stuck waiting for input or the TPU; the latest checkpoint is "
        "/runs/x/ckpt-100; rerun the same command to resume from it (or raise --hang_timeout "
        "if a host loop really takes that long)"
    ]


def test_hang_timeout_stays_quiet_while_loops_come(tmp_path):
    messages: list[str] = []
    watcher = hang.HangTimeout(0.5, str(tmp_path), on_hang=messages.append)
    watcher.start(0, 1000)
    for step in range(0, 1000, 100):
        watcher.before_loop(step, 100)
        time.sleep(0.15)
        watcher.after_loop(loop(step + 100))
    watcher.close()
    time.sleep(0.7)  # closed: the thread is gone, nothing fires after training ended
    assert messages == []


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


# --- which monitors a run gets ---------------------------------------------------------


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


# --- end to end ------------------------------------------------------------------------

# Through tf.data, whose steps wait for input (device data's do not: test_device_data.py).
IRIS = (
    "--config=iris",
    "--use_tpu=false",
    "--train_steps=300",
    "--iterations=50",
    "--config.train.device_data=false",
)

MODEL = '''
"""Points above the line y = x, with an input that sleeps `input_sleep` seconds per batch
from batch `slow_from_batch` on: slow input, or (a long sleep) input that never comes."""

import time

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import Mode, Model, register


@register("slow_input")
class SlowInput(Model):
    def input_fn(self, mode, params):
        xy = np.random.default_rng(0).normal(size=(256, 2)).astype(np.float32)
        labels = (xy[:, 1] > xy[:, 0]).astype(np.int32)
        dataset = tf.data.Dataset.from_tensor_slices(({"xy": xy}, labels))
        if mode is not Mode.TRAIN:
            return dataset.batch(params.batch_size)
        dataset = dataset.repeat().batch(params.batch_size, drop_remainder=True)
        seconds, slow_from = self.config.input_sleep, self.config.slow_from_batch

        def sleep(index):
            if index >= slow_from:
                time.sleep(seconds)
            return np.float32(0)

        def slow(index, batch):
            features, labels = batch
            zero = tf.ensure_shape(tf.numpy_function(sleep, [index], tf.float32), [])
            return {"xy": features["xy"] + zero}, labels  # uses it: the sleep cannot be pruned

        return dataset.enumerate().map(slow)

    def build(self):
        inputs = {"xy": keras.Input(shape=(2,), name="xy")}
        return keras.Model(inputs, keras.layers.Dense(2)(inputs["xy"]))

    def loss(self, labels, outputs):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)
'''

CONFIG = '''
"""slow_input: a model whose input is slow on purpose (tests)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="slow_input")
    config.model_module = "slow_input"
    config.input_sleep = 0.0
    config.slow_from_batch = 0
    config.train.batch_size = 16
    config.train.steps = 80
    config.train.iterations = 20
    return config
'''


@pytest.fixture
def slow_input(tmp_path) -> Path:
    """The config file of the slow_input model, written with its model file into tmp_path."""
    (tmp_path / "slow_input.py").write_text(MODEL)
    (tmp_path / "slow_config.py").write_text(CONFIG)
    return tmp_path / "slow_config.py"


@pytest.fixture(scope="module")
def iris_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """Iris trained without a terminal, profiling steps 120..180: the run and its model_dir."""
    model_dir = tmp_path_factory.mktemp("iris") / "model"
    result = run_tpurun("train", *IRIS, "--profile_steps=120,180", f"--model_dir={model_dir}")
    return assert_ok(result), model_dir


@pytest.mark.slow
def test_without_a_terminal_one_log_line_per_loop_with_its_input_wait(iris_run):
    result, _ = iris_run
    logged = LOG_LINE.findall(result.stderr)
    assert [(int(step), int(total)) for step, total, _ in logged] == [
        (step, 300) for step in range(50, 301, 50)
    ]
    assert all(0 <= int(share) <= 100 for _, _, share in logged)
    assert "%|" not in result.stderr and "ETA" not in result.stderr, "no progress bar in a log"
    # In-memory Iris waits for tf.data's hand-over of each batch (about 0.1 ms), not for
    # its input_fn: no warning.
    assert INPUT_BOUND not in result.stderr


@pytest.mark.slow
def test_tensorboard_has_the_model_graph_and_the_input_wait_share(iris_run):
    from tensorboard.backend.event_processing import event_accumulator

    _, model_dir = iris_run
    accumulator = event_accumulator.EventAccumulator(
        str(model_dir), size_guidance={event_accumulator.TENSORS: 0}
    ).Reload()
    assert accumulator.Tags()["graph"]
    graph = accumulator.Graph()
    names = {node.name for node in graph.node}
    assert {"SepalLength", "SepalWidth", "PetalLength", "PetalWidth"} <= names  # the inputs
    assert any(node.op == "MatMul" for node in graph.node)
    shares = [
        (e.step, float(tf.make_ndarray(e.tensor_proto)))
        for e in accumulator.Tensors("input_wait_share")
    ]
    assert [step for step, _ in shares] == list(range(50, 301, 50))
    assert all(0.0 <= share <= 1.0 for _, share in shares)


@pytest.mark.slow
def test_profile_steps_writes_a_trace_of_the_covering_loops(iris_run):
    result, model_dir = iris_run
    assert f"Profiled steps 101..200 (whole host loops) into {model_dir}/plugins/profile" in (
        result.stderr
    )
    (trace,) = (model_dir / "plugins" / "profile").glob("*/*.xplane.pb")
    assert trace.stat().st_size > 0


def run_on_a_terminal(*args: str, cwd: Path) -> tuple[int, str]:
    """Runs tpurun with stderr on a pseudo-terminal (120 columns); its exit code and stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "tpurun", *args],
        cwd=cwd,
        env={**os.environ, **OFFLINE_ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    shown = b""
    while True:  # read as it comes: a full terminal buffer would block the writer
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return process.wait(timeout=120), shown.decode(errors="replace")


@pytest.mark.slow
def test_on_a_terminal_a_live_progress_line(tmp_path):
    code, shown = run_on_a_terminal("train", *IRIS, f"--model_dir={tmp_path}", cwd=tmp_path)
    assert code == 0, shown
    final = re.findall(
        r"100%\|[^\r\n]*\| step 300/300, loss [\d.]+, input wait \d+% \[[\d.]+ steps/s, ETA 00:00\]",
        shown,
    )
    assert final, shown
    assert not LOG_LINE.search(shown), "a terminal gets the live line, not one line per loop"
    # Other log lines print above the bar, each on a line of its own.
    lines = re.split(r"[\r\n]+", shown)
    assert any(re.match(r"I\d{4} .*Saved checkpoint .*ckpt-300\.$", line) for line in lines), shown


@pytest.mark.slow
def test_slow_input_warns_once_that_training_is_input_bound(slow_input):
    result = assert_ok(
        run_tpurun(
            "train",
            f"--config={slow_input}",
            "--use_tpu=false",
            "--config.input_sleep=0.005",
            f"--model_dir={slow_input.parent / 'model'}",
        )
    )
    shares = [int(share) for _, _, share in LOG_LINE.findall(result.stderr)]
    assert len(shares) == 4 and min(shares[1:]) > 50, result.stderr
    assert result.stderr.count(INPUT_BOUND) == 1, result.stderr
    assert "in the host loop up to step 40" in result.stderr
    assert "SlowInput.input_fn makes batches" in result.stderr


@pytest.mark.slow
def test_hang_timeout_ends_a_run_whose_input_never_comes(slow_input):
    model_dir = slow_input.parent / "model"
    started = time.monotonic()
    result = run_tpurun(
        "train",
        f"--config={slow_input}",
        "--use_tpu=false",
        # Batches 0..39 come at once, batch 40 (step 41) never: a checkpoint at step 40.
        "--config.input_sleep=3600.0",
        "--config.slow_from_batch=40",
        "--save_checkpoints_steps=40",
        # Well above the first loop's tracing on a busy 2-core machine.
        "--hang_timeout=12",
        f"--model_dir={model_dir}",
        timeout=180,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_HUNG, result.stderr
    (line,) = error_lines(result)
    assert line == (
        "tpurun train: error: no progress for --hang_timeout=12s at step 40 (in the host loop of "
        "steps 41..60): stuck waiting for input or the TPU; the latest checkpoint is "
        f"{model_dir / 'ckpt-40'}; rerun the same command to resume from it (or raise "
        "--hang_timeout if a host loop really takes that long)"
    )
    assert "Traceback" not in result.stderr
    assert (model_dir / "ckpt-40.index").is_file()
    assert elapsed < 120, f"took {elapsed:.0f} s"  # not the 180 s subprocess timeout
