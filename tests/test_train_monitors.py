"""Watching a training run end to end: progress line or log lines, TensorBoard graph and
input wait, the input-bound warning, --profile_steps and the --hang_timeout watchdog.

The actions' logic is unit-tested with made-up loops in test_actions.py; here tpurun
runs Iris, and a model of its own whose input is slow, or blocks forever after a
number of batches.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import forked
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, assert_ok, error_lines, run_tpurun, tpurun_in_process

from tpurun.errors import EXIT_HUNG

LOG_LINE = re.compile(
    r"step (\d+)/(\d+)  loss [\d.]+  [\d.]+ steps/sec  \d+ examples/sec  input wait (\d+)%"
)
INPUT_BOUND = "Training is input-bound"


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
from batch `slow_from_batch` on: slow input; and that never comes from the batch the
environment's SLOW_INPUT_HANGS_AT names on (not a config key: a resumed run keeps its
config)."""

import os
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
        hangs_at = int(os.environ.get("SLOW_INPUT_HANGS_AT", "-1"))

        def sleep(index):
            if 0 <= hangs_at <= index:
                time.sleep(3600)
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
    result = tpurun_in_process(
        "train", *IRIS, "--profile_steps=120,180", f"--model_dir={model_dir}"
    )
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
    # (Whether in-memory Iris's loops look input-bound depends on the machine's load: its
    # step is ~0.1 ms, tf.data's hand-over of a batch as long. The warning's rule is tested
    # on given times in tests/test_actions.py.)


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
    """Runs tpurun with stderr on a pseudo-terminal (120 columns); its exit code and stderr.

    Forked from a process that imported TensorFlow already (tests/forked): TensorFlow's
    start-up lines, which tpurun hides the same way whatever stderr is, are
    tests/test_terminal.py's, in fresh interpreters (here the GPU probe's line shows, as
    it does in every forked run)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = forked.Popen(
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
    assert "Training from step 0 to 300" in shown
    # Other log lines print above the bar, each on a line of its own.
    lines = re.split(r"[\r\n]+", shown)
    saved = re.compile(r"I\d{4} .*Saved checkpoint .*ckpt-300\. \(written .*\)$")
    assert any(saved.match(line) for line in lines), shown


@pytest.mark.slow
def test_slow_input_warns_once_that_training_is_input_bound(tpurun_cli, slow_input):
    # The first host loop's input is fast (it traces the step: on a fast machine that
    # may take less than its input's sleeps); from the second on, 20 ms per batch: many
    # times a step of this model, even on a busy machine.
    result = assert_ok(
        tpurun_cli(
            "train",
            f"--config={slow_input}",
            "--use_tpu=false",
            "--config.input_sleep=0.02",
            "--config.slow_from_batch=20",
            f"--model_dir={slow_input.parent / 'model'}",
        )
    )
    shares = [int(share) for _, _, share in LOG_LINE.findall(result.stderr)]
    assert len(shares) == 4 and min(shares[1:]) > 50, result.stderr
    assert result.stderr.count(INPUT_BOUND) == 1, result.stderr
    assert "in the host loop up to step 40" in result.stderr
    assert "SlowInput.input_fn makes batches" in result.stderr


@pytest.mark.slow
def test_hang_timeout_ends_a_run_whose_input_never_comes(tpurun_cli, slow_input):
    """Trained to step 20 here, resumed in a process of its own whose batch 40 (step 41)
    never comes: its first host loop (21..40, where it traces the step and reads the 20
    batches it trained on again: slow_input's input does not seek) is not watched, so
    the watchdog ends the loop after it, whatever this machine's speed."""
    model_dir = slow_input.parent / "model"
    common = (f"--config={slow_input}", "--use_tpu=false", f"--model_dir={model_dir}")
    assert_ok(tpurun_cli("train", *common, "--train_steps=20"))
    result = run_tpurun(
        "train",
        *common,
        "--save_checkpoints_steps=40",
        "--hang_timeout=3",
        env={"SLOW_INPUT_HANGS_AT": "40"},
        timeout=180,
    )
    assert result.returncode == EXIT_HUNG, result.stderr
    assert f"Resuming from {model_dir / 'ckpt-20'} (step 20)" in result.stderr
    (line,) = error_lines(result)
    assert line == (
        "tpurun train: error: no progress for --hang_timeout=3s at step 40 (in the host loop of "
        "steps 41..60): stuck waiting for input or the TPU; the latest checkpoint is "
        f"{model_dir / 'ckpt-40'}; rerun the same command to resume from it (or raise "
        "--hang_timeout if a host loop really takes that long)"
    )
    assert "Traceback" not in result.stderr
    assert (model_dir / "ckpt-40.index").is_file()
