"""config.train.deterministic: what each platform's runs decide and say of their resumes
(tpurun.run_config.keys.determinism), TensorFlow set for a run and put back after it
(tpurun.cluster.determinism), and runs that say it at their start and in their record.

That two runs of the full-size ResNet-50 are bit-identical with it, and a SIGKILLed one
resumes to the uninterrupted run's weights, is tests/test_models_resnet50.py's (full_size).
"""

from __future__ import annotations

import json
import os
import sys

import forked
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, assert_ok
from synthetic_images import write_digit_records

from tpurun import tf_internals
from tpurun.cluster import determinism as applying
from tpurun.layout.time_account import Resume
from tpurun.run_config.keys import determinism
from tpurun.run_config.keys.determinism import CPU, GPU, TPU, decide, verdict

BIT_IDENTICAL = "Resumes are bit-identical: "
MAY_DIFFER = "Resumes continue the same run but may differ in the last bits: "


@pytest.mark.parametrize(
    "choice, platform, deterministic, said",
    [
        ("auto", CPU, True, "(config.train.deterministic='auto', which turns them on on a CPU)"),
        ("auto", GPU, False, "'auto', which turns them off on a GPU; --config.train.determ"),
        ("auto", TPU, False, "XLA compiles the training step into the same TPU program"),
        (True, CPU, True, "op determinism on and Grappler's arithmetic rewrites off (config"),
        (True, GPU, True, "(config.train.deterministic=true)."),
        (False, CPU, False, "the CPU's kernels and Grappler's arithmetic rewrites do not fix"),
        (False, TPU, False, "XLA compiles the training step into the same TPU program"),
    ],
)
def test_each_platform_decides_and_says_what_a_resume_reproduces(
    choice, platform, deterministic, said
):
    kernels = decide(choice, platform)
    assert kernels.deterministic is deterministic
    line = kernels.line()
    # A TPU's resumes are bit-identical whatever the key: XLA's programs are deterministic.
    exact = deterministic or platform == TPU
    assert line.startswith(BIT_IDENTICAL if exact else MAY_DIFFER) and said in line, line
    assert kernels.as_record().bit_identical is exact
    assert verdict(kernels.as_record()) == line.removeprefix("Resumes ").rstrip(".")


@pytest.mark.parametrize("platform", [CPU, TPU])
def test_a_served_input_makes_no_resume_exact_whatever_the_kernels(platform):
    """Under a tf.data service a resumed run restarts its input at its epoch's start."""
    kernels = decide(True, platform, served_input=True)
    assert not kernels.bit_identical and not kernels.as_record().bit_identical
    assert kernels.line().startswith(MAY_DIFFER)
    assert "its input comes from a tf.data service (config.data.service)" in kernels.line()


def test_op_determinism_set_before_the_run_is_said_and_is_not_enough():
    """TF_DETERMINISTIC_OPS=1 with the key false: op determinism on, Grappler's rewrites not
    off, so the resume may still differ."""
    kernels = decide(False, CPU, op_determinism_already=True)
    assert kernels.op_determinism and not kernels.bit_identical
    assert "TensorFlow's op determinism is on (TF_DETERMINISTIC_OPS), but Grappler's" in (
        kernels.line()
    )


def test_a_record_without_a_verdict_says_none():
    assert verdict(None) is None
    assert verdict(Resume(bit_identical=True)) == determinism.BIT_IDENTICAL


def test_a_deterministic_run_sets_tensorflow_and_puts_it_back():
    before = tf.config.optimizer.get_experimental_options()
    assert not tf_internals.op_determinism_enabled()
    with applying.applied(decide(True, CPU)):
        assert tf_internals.op_determinism_enabled()
        assert tf.config.optimizer.get_experimental_options()[applying.ARITHMETIC] is False
    assert not tf_internals.op_determinism_enabled()
    after = tf.config.optimizer.get_experimental_options()
    assert after.get(applying.ARITHMETIC, True) == before.get(applying.ARITHMETIC, True)
    with applying.applied(decide(False, CPU)):  # TensorFlow's defaults: nothing set
        assert not tf_internals.op_determinism_enabled()
        assert tf.config.optimizer.get_experimental_options() == after


def test_without_the_key_a_cpu_run_says_its_resume_may_differ(tpurun_cli, tmp_path):
    """At its start and in its run record's time account (what `tpurun report` reads)."""
    result = assert_ok(
        tpurun_cli(
            "train",
            "--config=iris",
            "--use_tpu=false",
            "--train_steps=1",
            "--config.train.deterministic=false",
            f"--model_dir={tmp_path}",
        )
    )
    assert MAY_DIFFER + "the CPU's kernels and Grappler's arithmetic rewrites" in result.stderr
    (record,) = (tmp_path / "runs").glob("*-train.json")
    resume = json.loads(record.read_text())["goodput"]["resume"]
    assert resume["bit_identical"] is False and resume["deterministic"] is False
    assert not tf_internals.op_determinism_enabled()


@pytest.mark.slow
def test_tf_deterministic_ops_trains_mnist_with_its_input_wait_measured(tmp_path):
    """TensorFlow's own switch, set before tpurun runs (read by TensorFlow in the process: a
    process of its own): tf.data's input through the host loop, whose input wait is then
    timed by the host's clock, tf.timestamp being refused; the key false says what it lacks."""
    data = write_digit_records(tmp_path / "digits", train=256, test=64)
    model_dir = tmp_path / "model"
    result = forked.run(
        [
            sys.executable,
            "-m",
            "tpurun",
            "train",
            "--config=mnist",
            "--use_tpu=false",
            f"--data_dir={data}",
            f"--model_dir={model_dir}",
            "--batch_size=32",
            "--iterations=3",
            "--train_steps=6",
            "--config.train.deterministic=false",
        ],
        env={**os.environ, **OFFLINE_ENV, "TF_DETERMINISTIC_OPS": "1"},
        capture_output=True,
        text=True,
    )
    assert_ok(result)
    assert "op determinism is on (TF_DETERMINISTIC_OPS), but Grappler's" in result.stderr
    assert "step 6/6" in result.stderr
    (record,) = (model_dir / "runs").glob("*-train.json")
    loops = json.loads(record.read_text())["goodput"]["loops"]
    assert 0 < loops["input_seconds"] < loops["seconds"], loops
