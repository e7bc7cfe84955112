"""Device data: training arrays in every replica's memory, each replica step gathering its batch.

The batches are tf.data's, in the same order, on 1 and 8 replicas, with and
without accumulation, compiled by XLA or not; a run that does not fit the budget,
or sets device_data=false, trains through tf.data and says why; the log line and
TensorBoard say there is no input wait; what XLA cannot compile runs without it;
`tpurun check` traces the device-data step and `--target` counts its arrays as its
input; a resumed run is exact. (Kills:
tests/test_resume.py, whose Iris runs train on device data.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    assert_ok,
    capture_info_logs,
    needs_xla_cpu,
    short_input_check,
    tpurun_in_process,
)

from tpurun import inputs
from tpurun import model as model_lib
from tpurun.actions.base import LoopStats
from tpurun.actions.progress import InputBound, LogLines
from tpurun.check.rules.steps import StepChecker
from tpurun.check.sizing import memory
from tpurun.check.sizing.preflight import Preflight
from tpurun.cluster import Cluster, device_kind, strategy
from tpurun.inputs import device_data
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import Mode, Model, TrainArrays
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.tpu_vm import installed, launch_lines

GLOBAL_BATCH, SEED = 16, 3
IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10")


class Rows(Model):
    """`count` examples whose features name them: x = the example's index, labels 10 x."""

    def __init__(self, count: int):
        super().__init__(None)
        self.count = count

    def train_arrays(self) -> TrainArrays:
        x = np.arange(self.count, dtype=np.int32)
        return TrainArrays(({"x": x, "pair": np.stack([x, -x], axis=1)}, 10 * x))

    def input_fn(self, mode, params):
        raise AssertionError("TRAIN comes from train_arrays")

    def build(self):
        raise NotImplementedError

    def loss(self, labels, outputs):
        raise NotImplementedError


@pytest.fixture(scope="module")
def eight() -> tf.distribute.Strategy:
    return strategy.local(8).strategy  # the test process's CPU is split into 8 (conftest)


def local(strategy_: tf.distribute.Strategy, per_replica) -> list:
    """Each replica's part of a distributed value, as numpy, in replica order."""
    leaves = [strategy_.experimental_local_results(v) for v in tf.nest.flatten(per_replica)]
    return [
        tf.nest.pack_sequence_as(per_replica, [np.asarray(parts[i]) for parts in leaves])
        for i in range(strategy_.num_replicas_in_sync)
    ]


def tf_data_batches(strategy_, model, start: int, steps: int, micro: int) -> list:
    dataset = inputs.distribute(
        strategy_, model, Mode.TRAIN, GLOBAL_BATCH, SEED, start_step=start, micro_batches=micro
    )
    iterator = iter(dataset)
    return [local(strategy_, next(iterator)) for _ in range(steps)]


def device_batches(strategy_, model, start: int, steps: int, micro: int, jit: bool) -> list:
    arrays = model.train_arrays()
    data = device_data.DeviceData(
        arrays,
        ExampleOrder(arrays.num_examples, SEED),
        strategy_.num_replicas_in_sync,
        GLOBAL_BATCH,
        micro,
    )
    data.place(strategy_)
    batch = tf.function(
        lambda step: strategy_.run(data.replica_batch, args=(step, data.values)),
        jit_compile=jit,
    )
    return [local(strategy_, batch(tf.constant(start + s, tf.int64))) for s in range(steps)]


# Three choices, each of its own code path: the replicas (1: the default strategy's batch, in
# an XLA-compiled function, a 1-replica loop's; 8: MirroredStrategy's per-replica batches, in a
# plain tf.function, a several-replica loop's, which XLA does not compile), accumulation (the
# batch in micro-batches, or not) and the order (120 examples: a table of the permutation;
# 70000: computed by encryption). Every pair of them once, in 4 cases (not all 8).
@pytest.mark.parametrize(
    "replicas, jit, micro, count",
    [
        pytest.param(1, True, 1, 120, marks=needs_xla_cpu, id="1-xla-plain-tabled"),
        pytest.param(1, True, 3, 70000, marks=needs_xla_cpu, id="1-xla-accumulating-encrypted"),
        pytest.param(8, False, 1, 70000, id="8-plain-encrypted"),
        pytest.param(8, False, 3, 120, id="8-accumulating-tabled"),
    ],
)
def test_device_data_gives_each_replica_tf_datas_batches(eight, count, micro, replicas, jit):
    """Resumed at step 37, three steps: every replica's (features, labels), element for element."""
    strategy_ = eight if replicas == 8 else tf.distribute.get_strategy()
    model = Rows(count)
    expected = tf_data_batches(strategy_, model, 37, 3, micro)
    found = device_batches(strategy_, model, 37, 3, micro, jit)
    for step_expected, step_found in zip(expected, found, strict=True):
        for want, got in zip(step_expected, step_found, strict=True):
            tf.nest.map_structure(np.testing.assert_array_equal, got, want)
    # The rows are whole: labels follow their features.
    features, labels = found[0][0]
    np.testing.assert_array_equal(labels, 10 * features["x"])
    assert features["x"].shape == ((micro,) if micro > 1 else ()) + (GLOBAL_BATCH // replicas,)


def weights(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(model_dir / f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith("save_counter") and name.endswith("VARIABLE_VALUE")
    }


@pytest.fixture(scope="module")
def on_and_off(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Iris trained 100 steps (10 host loops) with config.train.device_data true and false:
    each run's model_dir and log, for the tests below to read (and copy to resume). XLA's
    loop, which "auto" would not compile for a run this short: device data's own path."""
    runs = {}
    for device in ("true", "false"):
        model_dir = tmp_path_factory.mktemp(f"device-data-{device}")
        result = tpurun_in_process(
            "train",
            *IRIS,
            "--train_steps=100",
            "--config.train.xla=true",
            f"--config.train.device_data={device}",
            f"--model_dir={model_dir}",
        )
        runs[device] = (model_dir, assert_ok(result).stderr)
    return runs


@needs_xla_cpu
def test_device_data_false_trains_through_tf_data_on_the_same_batches(on_and_off):
    (on_dir, on_log), (off_dir, off_log) = on_and_off["true"], on_and_off["false"]
    assert "Training data on the device (120 examples" in on_log
    assert "the host loop is compiled by XLA" in on_log
    assert "input on device (no wait)" in on_log and "input wait" not in on_log
    assert (
        "Training data stays in tf.data, not on the device: config.train.device_data=false."
        in off_log
    )
    assert "input wait" in off_log and "input on device" not in off_log
    on, off = weights(on_dir, 100), weights(off_dir, 100)
    assert on.keys() == off.keys()
    # The same batches; XLA only rounds differently.
    for name in on:
        np.testing.assert_allclose(on[name], off[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_arrays_over_the_budget_stay_in_tf_data_and_say_why(tpurun_cli, tmp_path):
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=20",
            "--config.train.device_data_mb=0.01",
            f"--model_dir={tmp_path}",
        )
    )
    lines = [line for line in result.stderr.splitlines() if "stays in tf.data" in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith(
        "Training data stays in tf.data, not on the device: the arrays take 0.1 MB per replica, "
        "more than config.train.device_data_mb=0.01; raise it if the device has the memory."
    ), lines[0]
    assert "input wait" in result.stderr


def test_the_automatic_budget_on_cpu_is_fixed():
    default = tf.distribute.get_strategy()
    assert device_data.budget_mb(0.0, device_kind(default)) == device_data.CPU_BUDGET_MB
    assert device_data.budget_mb(64.0, device_kind(default)) == 64.0


def test_a_stand_in_cluster_is_judged_as_what_it_stands_for():
    """tpurun check traces a TPU slice on CPU devices: its hosts and kind decide."""
    from tpurun.cluster import Cluster

    arrays = TrainArrays(({"x": np.zeros((8, 2), np.float32)}, np.zeros(8, np.int32)))
    order = ExampleOrder(arrays.num_examples, 0)
    default = tf.distribute.get_strategy()
    assert device_data.why_not(arrays, order, Cluster(default, "1 CPU"), 0.0) == ""
    slice_of_4 = Cluster(default, "v4-32", hosts=4, device_kind="TPU")
    assert device_data.why_not(arrays, order, slice_of_4, 0.0) == device_data.SEVERAL_HOSTS
    assert device_data.budget_mb(0.0, "TPU") == device_data.ACCELERATOR_BUDGET_MB


def test_with_device_data_the_input_wait_is_zero_and_never_input_bound(caplog):
    stats = LoopStats(
        step=200,
        num_steps=100,
        loss=0.1,
        seconds=0.002,
        input_seconds=0.0,
        global_batch=32,
        learning_rate=0.1,
        device_input=True,
    )
    bound = InputBound("Iris")
    lines = LogLines()
    lines.start(100, 1000)
    capture_info_logs(caplog)
    for _ in range(3):
        bound.after_loop(stats)
    lines.after_loop(stats)
    assert "input-bound" not in caplog.text
    assert "input on device (no wait)" in caplog.text
    assert stats.input_wait_share == 0.0


def test_tensorboard_has_zero_input_wait(on_and_off):
    from tensorboard.backend.event_processing import event_accumulator

    model_dir, _ = on_and_off["true"]
    events = event_accumulator.EventAccumulator(
        str(model_dir), size_guidance={event_accumulator.TENSORS: 0}
    ).Reload()
    shares = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("input_wait_share")]
    assert shares == [0.0] * 10  # one per host loop


UNCOMPILABLE_MODEL = '''
"""Points above the line y = x; a layer runs Python (tf.numpy_function), which XLA cannot
compile, or (`in_batch`) the batch function does."""

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import Mode, Model, TrainArrays, register


def python_identity(x):
    y = tf.numpy_function(lambda a: a, [x], x.dtype)
    y.set_shape(x.shape)
    return y


class Python(keras.layers.Layer):
    def call(self, x):
        return python_identity(x)


@register("uncompilable")
class Uncompilable(Model):
    def train_arrays(self):
        xy = np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32)
        labels = (xy[:, 1] > xy[:, 0]).astype(np.int32)
        if not self.config.in_batch:
            return TrainArrays(({"xy": xy}, labels))
        return TrainArrays(
            {"xy": xy, "labels": labels},
            count=64,
            batch=lambda a, rows: (
                {"xy": python_identity(tf.gather(a["xy"], rows))},
                tf.gather(a["labels"], rows),
            ),
        )

    def input_fn(self, mode, params):
        xy = np.random.default_rng(1).normal(size=(16, 2)).astype(np.float32)
        labels = (xy[:, 1] > xy[:, 0]).astype(np.int32)
        if mode is Mode.PREDICT:
            return tf.data.Dataset.from_tensor_slices({"xy": xy}).batch(params.batch_size)
        return tf.data.Dataset.from_tensor_slices(({"xy": xy}, labels)).batch(params.batch_size)

    def build(self):
        inputs = {"xy": keras.Input(shape=(2,), name="xy")}
        hidden = inputs["xy"] if self.config.in_batch else Python()(inputs["xy"])
        return keras.Model(inputs, keras.layers.Dense(2)(hidden))

    def loss(self, labels, outputs):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)
'''

UNCOMPILABLE_CONFIG = '''
"""uncompilable: a model XLA cannot compile (tests)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="uncompilable")
    config.model_module = "uncompilable"
    config.in_batch = False
    config.train.batch_size = 16
    config.train.steps = 20
    config.train.iterations = 10
    config.eval.batch_size = 16
    config.predict.batch_size = 16
    return config
'''


@pytest.fixture
def uncompilable(tmp_path) -> Path:
    (tmp_path / "uncompilable.py").write_text(UNCOMPILABLE_MODEL)
    (tmp_path / "uncompilable_config.py").write_text(UNCOMPILABLE_CONFIG)
    return tmp_path / "uncompilable_config.py"


@needs_xla_cpu
def test_what_xla_cannot_compile_runs_without_it_and_says_so(tpurun_cli, uncompilable):
    result = assert_ok(
        tpurun_cli(
            "train",
            f"--config={uncompilable}",
            "--use_tpu=false",
            "--config.train.xla=true",  # "auto" would not try XLA for 20 steps
            f"--model_dir={uncompilable.parent / 'model'}",
        )
    )
    lines = [line for line in result.stderr.splitlines() if "runs without XLA" in line]
    assert len(lines) == 1, result.stderr
    assert "The host loop runs without XLA, which failed on Uncompilable's step: " in lines[0]
    assert "PyFunc" in lines[0]
    assert "step 20/20" in result.stderr


@needs_xla_cpu
def test_check_traces_and_compiles_the_device_data_step(tpurun_cli, uncompilable, tmp_path):
    """Python in the batch function: tf.data runs it, but the step on device data cannot.
    On one replica: the rule is found in any replica's step, and a check traces the step once
    per replica (as test_check.py's rule cases; the 8 replicas of a v3-8: its iris check)."""
    work = tmp_path / "work"
    work.mkdir()
    result = tpurun_cli(
        "check", f"--config={uncompilable}", "--config.in_batch=true", "--num_shards=1", cwd=work
    )
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if "] error: " in line]
    assert errors and all(line.startswith("[xla-unsupported] error: ") for line in errors), (
        result.stdout + result.stderr
    )
    assert any("(PyFunc" in line and "train step" in line for line in errors), errors
    assert list(work.iterdir()) == []


# Every recipe that changes the compiled update, on in one run: LossScaleOptimizer (a cond
# around the update), clipping, weight decay, a schedule and EMA; a part XLA could not
# compile would make the whole loop fall back, and say so.
RECIPES = (
    "--precision=mixed_float16",
    "--config.optimizer.clip_norm=0.5",
    "--config.optimizer.weight_decay=0.01",
    "--config.optimizer.schedule=cosine",
    "--config.train.ema_decay=0.9",
)


@needs_xla_cpu
def test_xla_compiles_the_recipes(tpurun_cli, tmp_path):
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            *RECIPES,
            "--train_steps=20",
            "--config.train.xla=true",
            f"--model_dir={tmp_path}",
        )
    )
    assert "the host loop is compiled by XLA" in result.stderr
    assert "runs without XLA" not in result.stderr


DROPOUT_MODEL = """
import keras
import numpy as np
import tensorflow as tf

from tpurun.model import Classifier, TrainArrays, register


@register("dropout_arrays")
class DropoutArrays(Classifier):
    def train_arrays(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(200, 4)).astype(np.float32)
        return TrainArrays((x, (x.sum(axis=1) > 0).astype(np.int32)))

    def input_fn(self, mode, params):
        x, y = self.train_arrays().arrays
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(params.batch_size)

    def build(self):
        inputs = keras.Input(shape=(4,))
        hidden = keras.layers.Dropout(0.5, seed=1)(keras.layers.Dense(16, "relu")(inputs))
        return keras.Model(inputs, keras.layers.Dense(2)(hidden))
"""

DROPOUT_CONFIG = """
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="dropout_arrays")
    config.model_module = "dropout_arrays"
    config.train.batch_size = 16
    config.train.iterations = 10
    return config
"""


@needs_xla_cpu
def test_dropout_and_accumulation_under_xla_resume_bit_identically(tpurun_cli, tmp_path):
    """Dropout's random state (a variable) is drawn in the compiled loop, accumulating 2
    micro-batches, and checkpointed: resumed off a loop boundary (at 15, in loops of 10),
    the run ends bit-identical to an uninterrupted one. The uninterrupted run (loops of 5)
    saves ckpt-15 on its way: the resumed run starts from a copy of its model_dir cut
    back to that checkpoint, one XLA compile of the loop less than a run stopped at 15
    (on one compile a run: the loop's length is not in it). (On 2 replicas the loop is not
    compiled; their exact resume: test_resume.py's 2-replica cases, and their accumulated
    batches at a resumed step: test_device_data_gives_each_replica_tf_datas_batches.)"""
    from tpurun.storage import checkpoints

    (tmp_path / "dropout_arrays.py").write_text(DROPOUT_MODEL)
    (tmp_path / "dropout_config.py").write_text(DROPOUT_CONFIG)
    common = (
        f"--config={tmp_path / 'dropout_config.py'}",
        "--use_tpu=false",
        # XLA's loop, forced: auto times both loops first, and under a heavy load picked the
        # plain one (this test's subject is the compiled loop).
        "--config.train.xla=true",
        "--config.train.accumulate_steps=2",
        "--batch_size=16",
        "--train_steps=30",
    )
    whole = assert_ok(
        tpurun_cli(
            "train",
            *common,
            "--iterations=5",
            "--save_checkpoints_steps=5",
            f"--model_dir={tmp_path / 'a'}",
        )
    )
    assert "the host loop is compiled by XLA" in whole.stderr
    # The uninterrupted run's model_dir as a run stopped at 15 leaves it.
    cut = shutil.copytree(tmp_path / "a", tmp_path / "b")
    for later in cut.glob("ckpt-*"):
        if int(later.name[len("ckpt-") :].split(".")[0]) > 15:
            later.unlink()
    checkpoints.write_state(str(cut), [str(cut / f"ckpt-{step}") for step in (10, 15)])
    resumed = assert_ok(tpurun_cli("train", *common, f"--model_dir={cut}"))  # loops of 10
    assert f"Resuming from {cut / 'ckpt-15'} " in resumed.stderr
    assert "Training data on the device" in resumed.stderr
    assert "the host loop is compiled by XLA" in resumed.stderr
    assert "step 25/30 " in resumed.stderr and "step 30/30 " in resumed.stderr
    first, second = weights(tmp_path / "a", 30), weights(cut, 30)
    assert first.keys() == second.keys()
    assert [n for n in first if not np.array_equal(first[n], second[n])] == []


@needs_xla_cpu
def test_xla_false_runs_the_plain_loop_and_resumes_from_a_compiled_one(
    tpurun_cli, tmp_path, on_and_off
):
    """config.train.xla is resumable: the same batches, a plain tf.function, one line."""
    compiled, log = on_and_off["true"]
    assert "the host loop is compiled by XLA" in log
    model_dir = shutil.copytree(compiled, tmp_path / "model")
    plain = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=120",
            "--config.train.xla=false",
            f"--model_dir={model_dir}",
        )
    )
    assert "Resuming from" in plain.stderr and "step 120/120" in plain.stderr
    lines = [line for line in plain.stderr.splitlines() if "Training data on the device" in line]
    assert len(lines) == 1, plain.stderr
    assert lines[0].endswith(
        "each replica step gathers its own batch; "
        "the host loop is not compiled by XLA (config.train.xla=false)."
    ), lines[0]
    assert "runs without XLA" not in plain.stderr


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_xla_value_is_a_one_line_usage_error(tpurun_cli, tmp_path, value):
    result = tpurun_cli("train", *IRIS, f"--config.train.xla={value}", f"--model_dir={tmp_path}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpurun train: error: "), result.stderr
    assert "config.train.xla=" in lines[0] and "true, false or 'auto'" in lines[0]
    assert list(tmp_path.iterdir()) == []


@needs_xla_cpu
def test_check_target_counts_the_arrays_as_the_train_steps_input(tpurun_cli, tmp_path):
    """--target estimates the device-data train step: its input is the arrays and the
    order's table each replica holds (no prefetched batch). In mixed_bfloat16 (the arrays
    keep their dtype) on a v5e-8: this is also iris's seed-config check (its bfloat16 check,
    which must be clean, and each step sized to fit: test_check_preflight.py's
    test_every_seed_config_is_sized_on_a_v5e_slice has the other shipped configs'). With
    device_data=false the estimate's input is 2 batches: the multi-host test below (iris's
    tf.data step) and test_check_preflight.py's test_the_estimate_follows_the_training_recipe."""
    iris = model_lib.create(config_files.load(config_files.resolve("iris")))
    arrays = iris.train_arrays()
    held = device_data.nbytes(arrays, ExampleOrder(arrays.num_examples, 0))
    report, work = tmp_path / "report.json", tmp_path / "work"
    work.mkdir()
    result = tpurun_cli(
        "check",
        "--config=iris",
        "--target=v5e-8",
        "--precision=mixed_bfloat16",
        f"--report={report}",
        "--input_check=false",  # the multi-host test below measures a tf.data input
        cwd=work,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text, data = result.stdout, json.loads(report.read_text())
    steps = data["steps"]
    assert text.startswith("Memory per replica on a v5litepod-8: 8 replicas with 16 GB of HBM each")
    # bfloat16 activations keep iris's steps TPU-clean (warnings allowed).
    assert "tpurun check: clean: the train, eval and predict steps of iris" in text
    assert "error" not in "\n".join(line for line in text.splitlines() if line.startswith("["))
    assert list(work.iterdir()) == [], "check writes only the report asked for"
    assert "each step fits a replica's 16" in text  # 16.9 GB by the TPU compiler, 16 without
    assert data["target"] == "v5litepod-8" and data["replicas"] == 8
    assert set(steps) == {"train", "eval", "predict"}
    for step in steps.values():
        assert step["fits"] and 0 < step["total_bytes"] < 16 * 10**9
    assert steps["train"]["device_data"] is True and "device_data" not in steps["eval"]
    # Tile padding only adds; the step's int64 index is the rest.
    assert held <= steps["train"]["input_bytes"] < 2 * held
    assert "\n  input " in text and "input of train: the training arrays" in text


@needs_xla_cpu
def test_check_target_on_a_multi_host_slice_sizes_the_tf_data_step(
    tpurun_cli, tmp_path, monkeypatch
):
    """A v4-16 is 2 hosts: training there keeps tf.data, and so does its estimate; that
    input (one of the 2 hosts' pipelines) is measured against the train step's bound. (The
    smallest multi-host v4; its 8 replicas traced on 2, as every check traces.)"""
    short_input_check(monkeypatch)
    report = tmp_path / "v4-16.json"
    batches = [f"--{flag}=128" for flag in ("batch_size", "eval_batch_size", "predict_batch_size")]
    result = tpurun_cli(
        "check", "--config=iris", "--target=v4-16", *batches, f"--report={report}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "Training data stays in tf.data, not on the device: it runs on one host, and this "
        "cluster feeds its replicas from several." in result.stderr
    )
    data = json.loads(report.read_text())
    assert "device_data" not in data["steps"]["train"]
    assert "\n  input (2 batches) " in result.stdout
    # 128 over 8 replicas, 4 on each host: 64 examples per host per step, 240 vCPUs each.
    figures = data["input"]
    assert (figures["hosts"], figures["examples_per_host_step"], figures["host_vcpus"]) == (
        2,
        64,
        240,
    )
    assert figures["input_bound"] is not None  # the TPU compiler bounds the step: a verdict
    verdict = "input-bound: " if figures["input_bound"] else "keeps up: "
    assert f"\n  {verdict}a v4-16 host (240 vCPUs, " in result.stdout
    # After the verdict, how to launch it there (tests/test_tpu_vm_launch_lines.py has the lines).
    assert result.stdout.rstrip().endswith("\n".join(launch_lines.lines("v4-16", 2, "iris")))
    # Beside tensorflow-tpu (`make test-tpu-wheel`), one line says where the TPU compiler runs.
    conflict = installed.tpu_compiler_conflict()
    assert conflict is None or result.stdout.count(conflict) == 1


@needs_xla_cpu
def test_the_device_data_steps_estimate_grows_with_its_batch_not_its_input():
    """The batch search compiles the device-data step at each batch: the arrays stay."""
    config = merge_flags(config_files.load(config_files.resolve("iris")), {})
    run = RunConfig(command="check", config_name="iris", config=config, model_dir="unused")
    checker = StepChecker(
        run, Cluster(tf.distribute.get_strategy(), "1 CPU"), model_lib.create(config)
    )
    runner, _ = checker.single_device_step(Mode.TRAIN)
    assert runner.device_data is not None
    preflight = Preflight(checker, hbm_bytes=10**9)
    small, large = preflight.estimate(Mode.TRAIN, 4), preflight.estimate(Mode.TRAIN, 4096)
    assert small.input_batches == 1
    assert small.bytes(memory.INPUT) == large.bytes(memory.INPUT)
    assert large.bytes(memory.OTHER) > small.bytes(memory.OTHER) + 4000 * 4 * 4  # the batch
