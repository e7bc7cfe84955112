"""Training recipes from the config, end to end through the CLI (in this process).

Schedules read back from the TensorBoard `learning_rate` scalar, gradient
accumulation against the big batch on 1 and 2 replicas, EMA in eval, mixed
bfloat16 MNIST against float32 and its export, and each bad value's one line.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import USAGE, assert_fails, assert_ok
from conftest import tensorboard_scalars as scalars
from test_check import findings, shipped_config_args
from test_resume import weights

pytestmark = pytest.mark.slow

IRIS = ("--config=iris", "--use_tpu=false")
# The plain host loop (XLA's, config.train.xla="auto"'s pick for Iris, is compiled by XLA
# first, more than the rest of an Iris run costs) where the loop is not what a test is
# about: the schedules', accumulation's (2 replicas run the plain loop anyway) and EMA's
# (the loops: test_device_data.py, test_host_loops.py).
PLAIN = ("--config.train.xla=false",)


# 400 steps counted in epochs: 100 of iris's 120 examples at 30 per step.
IN_EPOCHS = ("--train_epochs=100", "--batch_size=30")


def _cosine(step: int) -> float:
    return 0.1 * 0.5 * (1 + math.cos(math.pi * step / 400))


def rates(model_dir: Path) -> dict[int, float]:
    return dict(scalars(model_dir)["learning_rate"])


# --- schedules, read back from TensorBoard ------------------------------------------


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            [
                "--config.optimizer.schedule=exponential",
                "--config.optimizer.decay_steps=100",
                "--config.optimizer.decay_rate=0.5",
                "--config.optimizer.staircase=true",
            ],
            lambda step: 0.1 * 0.5 ** (step // 100),
        ),
        (
            # In epochs: 100 of iris's 120 examples at 30 per step are 400 steps, cosine's
            # horizon (it once stayed at train.steps=0, the rate constant); the warmup's 25
            # epochs are 100 steps.
            [
                *IN_EPOCHS,
                "--config.optimizer.schedule=cosine",
                "--config.optimizer.warmup_epochs=25",
            ],
            # Warmup: linear from 0 to the schedule's value where it ends (Model Garden's).
            lambda step: min(step / 100, 1) * _cosine(max(step, 100)),
        ),
        (
            ["--config.optimizer.schedule=linear", "--config.optimizer.end_learning_rate=0.02"],
            lambda step: 0.1 + (0.02 - 0.1) * step / 400,
        ),
        (
            # Boundaries in epochs (resnet_main.py's): the rate changes once 37.5 and 75
            # epochs are done, at steps 150 and 300 (in steps, boundaries=(149, 299)).
            [
                *IN_EPOCHS,
                "--config.optimizer.schedule=piecewise",
                "--config.optimizer.boundary_epochs=(37.5,75)",
                "--config.optimizer.multipliers=(1.0,0.5,0.1)",
            ],
            lambda step: 0.1 * (1.0 if step < 150 else 0.5 if step < 300 else 0.1),
        ),
    ],
    # One case a schedule (and staircase's own path); the exponential's smooth decay (the
    # seed MNIST program's tf.train.exponential_decay) is test_a_resumed_run_continues_on_the_curve's.
    ids=[
        "staircase",
        "cosine_with_warmup_in_epochs",
        "linear",
        "piecewise_in_epochs",
    ],
)
def test_a_schedule_is_what_tensorboard_shows(tpurun_cli, tmp_path, flags, expected):
    length = () if "--train_epochs=100" in flags else ("--train_steps=400",)
    result = tpurun_cli(
        "train", *IRIS, *PLAIN, *length, "--iterations=50", f"--model_dir={tmp_path}", *flags
    )
    assert_ok(result)
    shown = rates(tmp_path)
    assert sorted(shown) == list(range(50, 401, 50))
    for step, value in shown.items():
        assert value == pytest.approx(expected(step), abs=1e-7), step


def test_a_resumed_run_continues_on_the_curve(tpurun_cli, tmp_path):
    # Exponential: train.steps may change on resume (cosine and linear end there).
    schedule = (
        "--config.optimizer.schedule=exponential",
        "--config.optimizer.decay_steps=100",
        "--config.optimizer.decay_rate=0.5",
        "--config.optimizer.warmup_steps=50",
    )
    common = (*IRIS, *PLAIN, "--iterations=50", *schedule)
    for steps in ("150", "400"):
        assert_ok(tpurun_cli("train", *common, f"--train_steps={steps}", f"--model_dir={tmp_path}"))
    shown = rates(tmp_path)
    assert sorted(shown) == list(range(50, 401, 50))
    # What an uninterrupted run shows (test_a_schedule_is_what_tensorboard_shows reads the
    # schedules so): linear to the schedule's rate at step 50, then halving every 100 steps.
    for step, value in shown.items():
        expected = min(step / 50, 1) * 0.1 * 0.5 ** (max(step, 50) / 100)
        assert value == pytest.approx(expected, abs=1e-7), step


# --- gradient accumulation -------------------------------------------------------------


def test_accumulating_four_batches_of_8_is_one_batch_of_32(tpurun_cli, tmp_path):
    """On 1 replica, and on 2 (a micro-batch of 4 examples each: the all-reduce of the
    accumulated gradients, as on any number), against one batch of 32 on 1."""
    common = (*IRIS, *PLAIN, "--train_steps=20", "--iterations=10")
    big = tmp_path / "big"
    accumulated = {shards: tmp_path / f"accumulated-on-{shards}" for shards in ("1", "2")}
    assert_ok(tpurun_cli("train", *common, "--batch_size=32", f"--model_dir={big}"))
    for shards, model_dir in accumulated.items():
        assert_ok(
            tpurun_cli(
                "train",
                *common,
                f"--num_shards={shards}",
                "--batch_size=8",
                "--config.train.accumulate_steps=4",
                f"--model_dir={model_dir}",
            )
        )
    # A step is 32 examples either way, and TensorBoard counts them so.
    for model_dir in (big, *accumulated.values()):
        found = scalars(model_dir)
        for (_, examples), (_, steps) in zip(
            found["examples/sec"], found["global_step/sec"], strict=True
        ):
            assert examples == pytest.approx(32 * steps, rel=1e-4)
    one = weights(big / "ckpt-20")
    numbers = [k for k in one if np.issubdtype(np.asarray(one[k]).dtype, np.number)]
    for shards, model_dir in accumulated.items():
        other = weights(model_dir / "ckpt-20")
        assert one.keys() == other.keys()
        worst = max(float(np.max(np.abs(one[k] - other[k]))) for k in numbers)
        assert worst <= 1e-5, (shards, worst)


# --- EMA ------------------------------------------------------------------------------


def test_eval_with_ema_reports_the_averages_not_the_raw_weights(tpurun_cli, tmp_path):
    ema = ("--config.train.ema_decay=0.9",)
    common = (*IRIS, f"--model_dir={tmp_path}", *ema)
    assert_ok(tpurun_cli("train", *common, *PLAIN, "--train_steps=60", "--iterations=20"))
    # Without the override, eval reads the averages: the model_dir's trained config keeps
    # ema_decay (docs/predict-export.md), and says it differs from the config file.
    result = assert_ok(tpurun_cli("eval", *IRIS, f"--model_dir={tmp_path}"))
    assert "Using the moving averages of the weights (config.train.ema_decay=0.9)" in result.stderr
    assert "train.ema_decay=0.9 (the config file: 0.0)" in result.stderr
    averaged = json.loads((tmp_path / "eval" / "test" / "results-60.json").read_text())

    # The same loss from a model holding the averages the checkpoint keeps.
    import tensorflow as tf

    from tpurun import model, optimization
    from tpurun.run_config import config_files

    config = config_files.load(config_files.resolve("iris"))
    config.train.ema_decay = 0.9
    keras_model = model.create(config).build()
    checkpoint = str(tmp_path / "ckpt-60")
    tf.train.Checkpoint(model=keras_model).read(checkpoint).expect_partial()
    raw_weights = [v.numpy() for v in keras_model.trainable_variables]
    optimization.restore_ema_weights(keras_model, config, checkpoint)
    averages = [v.numpy() for v in keras_model.trainable_variables]
    assert any(not np.allclose(r, a) for r, a in zip(raw_weights, averages, strict=True))
    features, labels = _iris_test_set()
    logits = keras_model(features, training=False)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    assert averaged["loss"] == pytest.approx(float(tf.reduce_mean(loss)), rel=1e-4)

    # --config.train.ema_decay=0 reads the raw weights, and says it overrides the trained config.
    raw = assert_ok(
        tpurun_cli("eval", *IRIS, f"--model_dir={tmp_path}", "--config.train.ema_decay=0")
    )
    assert "Using the moving averages" not in raw.stderr
    assert (
        "Overriding the config the checkpoints were trained with: train.ema_decay=0.9 (given: 0.0)."
    ) in raw.stderr


def _iris_test_set():
    from tpurun.models import iris

    frame = iris.read_csv(iris.shipped_csv("iris_test.csv"), with_labels=True)
    features = {name: frame[name].to_numpy() for name in iris.FEATURES}
    return features, frame[iris.LABEL].to_numpy()


# --- bfloat16 --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from tests.synthetic_images import write_digit_records

    return write_digit_records(tmp_path_factory.mktemp("digits"), train=1024, test=256)


# mnist at a quarter of its width (8 and 16 filters, 32 units): it learns the synthetic
# digits as well, in a quarter of the time, to >= 0.9 in 60 steps of 32 (tests/test_models_mnist.py).
SMALL_MNIST = ("--config.conv_filters=(8, 16)", "--config.hidden_units=32")


def test_mixed_bfloat16_mnist_matches_float32_and_exports_float32(tpurun_cli, tmp_path, digits):
    accuracy = {}
    for precision in ("float32", "mixed_bfloat16"):
        model_dir = tmp_path / precision
        common = (
            "--config=mnist",
            *SMALL_MNIST,
            "--use_tpu=false",
            f"--data_dir={digits}",
            f"--model_dir={model_dir}",
            f"--precision={precision}",
        )
        assert_ok(
            tpurun_cli(
                "train",
                *common,
                "--batch_size=32",
                # 120 steps, not 60: at 60 the accuracy is still climbing (0.77 to 1.0 over
                # seeds 0 to 4, in either precision), and where it had passed, a machine with
                # another CPU (AMX) gave 0.96 against 1.0; at 120 each seed reached 1.0 in both
                # precisions.
                "--train_steps=120",
                "--iterations=60",
                "--config.optimizer.learning_rate=0.1",
                # Evaluated at the end by the train (one run, not two, per precision).
                "--eval_every=120",
                "--eval_batch_size=64",
            )
        )
        accuracy[precision] = json.loads(
            (model_dir / "eval" / "test" / "results-120.json").read_text()
        )["accuracy"]
    assert accuracy["float32"] >= 0.9, accuracy
    assert abs(accuracy["mixed_bfloat16"] - accuracy["float32"]) <= 0.02, accuracy

    export = tmp_path / "export"
    bf16 = tmp_path / "mixed_bfloat16"
    assert_ok(
        tpurun_cli(
            "export",
            "--config=mnist",
            *SMALL_MNIST,
            f"--data_dir={digits}",
            f"--model_dir={bf16}",
            "--precision=mixed_bfloat16",
            "--config.serving_input=image",
            f"--export_dir={export}",
        )
    )
    # The serving signature as `saved_model_cli show --tag_set serve --signature_def
    # serving_default` prints it (read here, without a TensorFlow process of its own).
    from tensorflow.python.tools import saved_model_utils

    meta_graph = saved_model_utils.get_meta_graph_def(str(export), "serve")
    shown = str(meta_graph.signature_def["serving_default"])
    assert "dtype: DT_FLOAT" in shown and "DT_BFLOAT16" not in shown, shown


# --- bad values: one line, exit 2 -------------------------------------------------------


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (["--config.optimizer.schedule=sawtooth"], ["schedule", "sawtooth", "cosine"]),
        (["--config.optimizer.warmup_steps=-1"], ["warmup_steps=-1", "integer >= 0"]),
        (["--config.optimizer.clip_norm=-1"], ["clip_norm=-1"]),
        (
            ["--config.train.accumulate_steps=0"],
            ["config.train.accumulate_steps=0", "positive integer"],
        ),
        (
            ["--precision=mixed_float16", "--tpu=grpc://10.0.0.2:8470"],
            ["mixed_float16", "mixed_bfloat16"],
        ),
        (["--precision=float8"], ["--precision", "float8"]),
    ],
    ids=[
        "unknown_schedule",
        "negative_warmup",
        "negative_clip",
        "no_accumulation",
        "float16_on_a_tpu",
        "unknown_precision",
    ],
)
def test_a_bad_recipe_value_is_one_line(tpurun_cli, tmp_path, flags, keywords):
    result = tpurun_cli("train", *IRIS[:1], *flags, f"--model_dir={tmp_path / 'm'}", cwd=tmp_path)
    assert_fails(result, USAGE, *keywords)
    assert not (tmp_path / "m").exists()


# --- exact resume with every recipe on ---------------------------------------------------

RECIPE = (
    "--precision=mixed_bfloat16",
    "--config.optimizer.schedule=cosine",
    "--config.optimizer.warmup_steps=30",
    "--config.train.ema_decay=0.9",
    "--config.train.accumulate_steps=2",
    "--batch_size=16",
)


def test_sigkill_with_every_recipe_on_then_resume_is_bit_identical(tpurun_cli, tmp_path):
    """bfloat16, a schedule with warmup, EMA and accumulation: killed at a random moment
    (the tpurun process itself), the resume ends as one uninterrupted run. (Kills of runs
    that resumed, and inside saves: test_resume.py; this one is about the recipes' state.)"""
    import random
    import re
    import signal

    from test_resume import IRIS as RESUME_IRIS
    from test_resume import (
        assert_bit_identical,
        group_survivors,
        resume_in_process,
        train_process,
    )

    # 100 steps (train_process's 300 overridden: the last flag wins): past the warmup's 30,
    # with accumulation's and EMA's state in every checkpoint.
    recipe = (*RECIPE, "--train_steps=100")
    reference = tmp_path / "reference"
    assert_ok(
        tpurun_cli(
            "train",
            *RESUME_IRIS,
            *recipe,
            "--keep_checkpoint_max=3",
            f"--model_dir={reference}",
        )
    )
    model_dir = tmp_path / "killed"
    rng = random.Random(7)
    target = rng.choice(range(40, 90, 10))
    process = train_process(model_dir, *recipe)
    assert process.stderr is not None
    for line in process.stderr:
        if re.search(rf"\] step {target}/100 ", line):
            time.sleep(rng.uniform(0.0, 0.02))
            process.send_signal(signal.SIGKILL)
            break
    assert process.wait(timeout=120) == -signal.SIGKILL
    assert not group_survivors(process), "the killed trainer left a process behind"
    assert "Resuming from" in resume_in_process(model_dir, *recipe).stderr
    assert_bit_identical(model_dir / "ckpt-100", reference / "ckpt-100")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flops"])
def test_every_shipped_config_passes_check_in_mixed_bfloat16(tpurun_cli, tmp_path, name):
    """bfloat16 activations keep every shipped model's steps TPU-clean (warnings allowed).

    mnist's config is in mixed_bfloat16 already; fashion_mnist is checked in it and
    shakespeare sized in it by test_check_preflight.py (BFLOAT16_CHECKED); iris's,
    sized on a v5e-8, is test_device_data.py's
    test_check_target_counts_the_arrays_as_the_train_steps_input. On 2 replicas: a check
    traces the step once per replica, and what bfloat16 makes of an op (its dtype, its XLA
    kernel) is the same on each (test_check.py's rule cases check on 1)."""
    result = tpurun_cli(
        "check",
        f"--config={name}",
        "--precision=mixed_bfloat16",
        "--num_shards=2",
        *shipped_config_args(name, tmp_path / "data"),
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert f"tpurun check: clean: the train, eval and predict steps of {name}" in result.stdout
    assert "error" not in "\n".join(findings(result)).lower()
