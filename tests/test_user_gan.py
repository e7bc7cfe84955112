"""A GAN of a user's own, outside this repo: the manual's `my_gan/` example, through the CLI.

The two files are taken from the manual's code blocks (docs/own-step.md, those starting with
`# my_gan/<file>.py`), written into a directory of their own with two variants of
the test's (a step whose d_loss turns NaN, a step with an op no TPU runs). What a
model with its own step must keep of every launcher guarantee: 1 and 2 replicas
reach the same weights, a run killed at a random moment resumes bit for bit,
mixed_bfloat16 trains and exports float32, the NaN guard names the scalar, and
`tpurun check` traces and sizes the step.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import manual
import numpy as np
import pytest
from conftest import OFFLINE_ENV, REPO, assert_fails, assert_ok, tpurun_in_process
from test_resume import assert_bit_identical, group_survivors, weights

pytestmark = pytest.mark.slow

CONFIG = "--config=my_gan/ring_config.py"

# Variants of the manual's model, as a user would write them beside it.
NAN_GAN = '''
import tensorflow as tf
from ring_gan import RingGan
from tpurun.model import register


@register("nan_ring_gan")
class NanRingGan(RingGan):
    """The manual's GAN, whose reported d_loss turns NaN from step 8 on."""

    def train_step(self, step, features, labels):
        scalars = super().train_step(step, features, labels)
        poison = tf.where(step.number >= 7, float("nan"), 0.0)
        return {**scalars, "d_loss": scalars["d_loss"] + poison}
'''
BAD_OP_GAN = '''
import tensorflow as tf
from ring_gan import RingGan
from tpurun.model import register


@register("bad_op_ring_gan")
class BadOpRingGan(RingGan):
    """The manual's GAN, whose step runs Python (tf.numpy_function): no TPU can."""

    def train_step(self, step, features, labels):
        scalars = super().train_step(step, features, labels)
        doubled = tf.numpy_function(lambda x: 2 * x, [scalars["g_loss"]], tf.float32)
        return {**scalars, "g_loss": tf.reshape(doubled, [])}
'''


def variant_config(model: str, module: str) -> str:
    return (
        "from ring_config import get_config as ring_config\n\n\n"
        "def get_config():\n"
        "    config = ring_config()\n"
        f"    config.model = {model!r}\n"
        f"    config.model_module = {module!r}\n"
        "    return config\n"
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The manual's my_gan/ files (and the variants) in a directory outside the repo."""
    directory = tmp_path_factory.mktemp("user")
    manual.example_project(directory, "my_gan")
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*.py"))
    assert files == ["my_gan/ring_config.py", "my_gan/ring_gan.py"]
    gan = directory / "my_gan"
    (gan / "nan_gan.py").write_text(NAN_GAN)
    (gan / "nan_config.py").write_text(variant_config("nan_ring_gan", "nan_gan"))
    (gan / "bad_op_gan.py").write_text(BAD_OP_GAN)
    (gan / "bad_op_config.py").write_text(variant_config("bad_op_ring_gan", "bad_op_gan"))
    assert REPO not in directory.parents
    return directory


def tpurun(*args: str, cwd: Path):
    return tpurun_in_process(*args, cwd=cwd)


# 40 steps of 5 per host loop, a save after each. The reference keeps every checkpoint
# (ckpt-10 is the 1-replica side of the replica test); the killed run keeps 3, so
# its saves delete old checkpoints too. The plain loop (config.train.xla=false), not auto's
# choice: auto compiles and times both loops first (~5 CPU-s a run), and the reference, the
# killed run and its resume run the same loop by construction (on 2 replicas it is the plain
# one anyway). The mixed_bfloat16 run keeps auto's choice.
TRAIN = (CONFIG, "--use_tpu=false", "--iterations=5", "--config.train.xla=false")
KILLED = (*TRAIN, "--train_steps=40", "--save_checkpoints_steps=5", "--keep_checkpoint_max=3")
# A log line: the host loop that ended at a step while a background save is written.
SAVING = re.compile(r"\] step (\d+)/40 .*  saving ckpt-(\d+)")
STARTED = re.compile(r"\] Training from step (\d+) to 40")


@pytest.fixture(scope="module")
def reference(project, tmp_path_factory) -> Path:
    """An uninterrupted 40-step run on one replica, in this process, every checkpoint kept."""
    model_dir = tmp_path_factory.mktemp("reference")
    args = (*KILLED[:-1], "--keep_checkpoint_max=20", f"--model_dir={model_dir}")
    assert_ok(tpurun("train", *args, cwd=project))
    return model_dir


def test_1_and_2_replicas_reach_the_same_weights(project, reference, tmp_path):
    """10 steps, two updates each: the noise is keyed on the example, not the replica
    (which two replicas show as well as eight: each draws for half the batch, a replica
    id of 1 in the key would differ). (The reference's first 10 steps are a 10-step
    run's: a constant rate, saves apart.)"""
    many = tmp_path / "many"
    args = (*TRAIN, "--train_steps=10", "--num_shards=2", f"--model_dir={many}")
    assert_ok(tpurun("train", *args, cwd=project))
    a, b = weights(reference / "ckpt-10"), weights(many / "ckpt-10")
    assert a.keys() == b.keys()
    floats = [k for k in a if np.issubdtype(np.asarray(a[k]).dtype, np.floating)]
    worst = max(float(np.max(np.abs(a[k] - b[k]), initial=0.0)) for k in floats)
    assert worst <= 1e-4, worst
    counts = {k: int(v) for k, v in a.items() if "_iterations" in k or k.startswith("step/")}
    assert counts == {
        "optimizers/critic/_iterations/.ATTRIBUTES/VARIABLE_VALUE": 10,
        "optimizers/generator/_iterations/.ATTRIBUTES/VARIABLE_VALUE": 10,
        "step/.ATTRIBUTES/VARIABLE_VALUE": 10,
    }
    assert counts == {k: int(b[k]) for k in counts}


def test_sigkill_at_a_random_moment_then_resume_is_bit_identical(project, reference, tmp_path):
    """A run killed at a random step while a save is being written in the background
    (the default, async_checkpoint; each write slowed by 2 x 0.1 s by tests/slow_saves.py,
    so one is always in flight), at a random moment of it; then the resume, in this
    process, ends with the reference's weights, bit for bit. (Killing a run that had
    itself resumed is tests/test_resume.py's.)"""
    model_dir = tmp_path / "killed"
    rng = random.Random(31)
    killed_at, starts = [], []
    # At step 15, 20 or 25: after ckpt-5 is whole (killed at 10, the first save could be
    # the one in flight: nothing to resume), three host loops or more before the end.
    for target in rng.sample(range(15, 30, 5), 1):
        process = forked.Popen(
            [sys.executable, str(REPO / "tests" / "slow_saves.py"), "0.1", "train", *KILLED]
            + [f"--model_dir={model_dir}"],
            cwd=project,
            env={**os.environ, **OFFLINE_ENV},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: what it started is found by it
        )
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if started := STARTED.search(line):
                starts.append(int(started.group(1)))
            saving = SAVING.search(line)
            if saving and int(saving.group(1)) >= target:
                killed_at.append(int(saving.group(1)))
                time.sleep(rng.uniform(0.0, 0.2))  # in the save's tensors, merge or state
                process.send_signal(signal.SIGKILL)  # the tpurun process itself
                break
        assert process.wait(timeout=120) == -signal.SIGKILL, "".join(lines)[-3000:]
        assert not group_survivors(process), "the killed trainer left a process behind"
    resumed = assert_ok(tpurun("train", *KILLED, f"--model_dir={model_dir}", cwd=project))
    assert "Resuming from" in resumed.stderr
    starts.append(int(STARTED.search(resumed.stderr).group(1)))
    # The resume started at most two saves behind the loop the run was killed after:
    # the save in flight is lost, the one before it was whole.
    assert starts[0] == 0 and len(killed_at) == 1, (killed_at, starts)
    for killed, start in zip(killed_at, starts[1:], strict=True):
        assert killed - 10 <= start, (killed_at, starts)
    assert_bit_identical(model_dir / "ckpt-40", reference / "ckpt-40")
    assert not [p for p in model_dir.rglob("*") if re.search(r"_temp|tempstate|tpurun-tmp", p.name)]


def test_mixed_bfloat16_trains_and_exports_float32_with_the_generators_averages(project, tmp_path):
    common = (CONFIG, f"--model_dir={tmp_path / 'model'}", "--precision=mixed_bfloat16")
    common += ("--config.train.ema_decay=0.9",)
    steps = ("--use_tpu=false", "--train_steps=20", "--iterations=10")
    trained = assert_ok(tpurun("train", *common, *steps, cwd=project))
    assert "step 20/20  d_loss " in trained.stderr
    # EMA averages the serving model's weights, in its optimizer: Adam's two moments and
    # an average per generator variable, two moments per critic variable.
    saved = weights(tmp_path / "model" / "ckpt-20")
    slots = {
        name: len([k for k in saved if k.startswith(f"optimizers/{name}/_variables/")])
        for name in ("critic", "generator")
    }
    assert slots == {"critic": 12, "generator": 18}, slots
    export = tmp_path / "export"
    exported = assert_ok(tpurun("export", *common, f"--export_dir={export}", cwd=project))
    assert (
        "Using the moving averages of the weights of generator (config.train.ema_decay=0.9)"
        in exported.stderr
    )
    import tensorflow as tf

    serving = tf.saved_model.load(str(export)).signatures["serving_default"]
    inputs = serving.structured_input_signature[1]
    assert {k: s.dtype for k, s in inputs.items()} == {"noise": tf.float32}
    assert {k: t.dtype for k, t in serving.structured_outputs.items()} == {"xy": tf.float32}
    served = serving(noise=tf.zeros([3, 2]))["xy"]
    assert served.dtype == tf.float32 and served.shape == (3, 2)
    assert all(np.asarray(v).dtype != np.dtype("bfloat16") for v in saved.values())


def test_the_nan_guard_names_the_scalar(project, tmp_path):
    result = tpurun(
        "train",
        "--config=my_gan/nan_config.py",
        "--use_tpu=false",
        "--config.train.xla=false",  # the guard reads the loop's scalars, whichever loop
        "--train_steps=10",
        "--iterations=5",
        "--save_checkpoints_steps=5",
        f"--model_dir={tmp_path}",
        cwd=project,
    )
    assert_fails(
        result, 1, "d_loss became nan between steps 6 and 10", "ckpt-5", "config.optimizers"
    )
    assert not (tmp_path / "ckpt-10.index").exists()


def test_check_names_an_op_no_tpu_runs_inside_the_step(project):
    # The model declares arrays: the check traces and compiles its train step through
    # tf.data and on device data (as `tpurun train` runs it), the own step's only check on
    # device data (test_check_target_sizes_the_step sizes the tf.data one).
    result = tpurun("check", "--config=my_gan/bad_op_config.py", "--num_shards=1", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    found = [
        line for line in result.stdout.splitlines() if "error:" in line and "train step" in line
    ]
    assert found and "op 'PyFunc'" in found[0], result.stdout
    assert "created at my_gan/bad_op_gan.py:13" in found[0], found[0]


def test_check_target_sizes_the_step(project, tmp_path):
    """On one chip: a check traces the step once per replica (a v5e-4's took 29 CPU-s), and
    the sizing compiles one replica's step whatever the slice; the batch split over a
    slice's replicas is test_check_preflight.py's mnist on a v5e-4, this step on 2 replicas
    test_1_and_2_replicas_reach_the_same_weights. The own step through tf.data
    (config.train.device_data=false): sizing its device-data variant cost ~4 CPU-s here
    and ~6 in the TPU compiler's child, and nothing asserted below depends on it; a
    device-data step sized (the arrays as its input) is test_device_data.py's
    test_check_target_counts_the_arrays_as_the_train_steps_input, this own step traced and
    compiled on device data test_check_names_an_op_no_tpu_runs_inside_the_step."""
    report = tmp_path / "report.json"
    result = tpurun(
        "check",
        CONFIG,
        "--target=v5e-1",
        f"--report={report}",
        "--input_check=false",
        "--config.train.device_data=false",
        cwd=project,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "Memory per replica on a v5litepod-1" in result.stdout
    assert "each step fits a replica's" in result.stdout
    steps = json.loads(report.read_text())["steps"]
    train, predict = steps["train"], steps["predict"]
    assert train["fits"] and train["batch_per_replica"] == 64  # the config's, on 1 replica
    # The train step holds both models (predict: the generator alone) and both Adams'
    # two moments per variable.
    assert train["weights_bytes"] > predict["weights_bytes"] > 0
    assert train["optimizer_bytes"] >= 2 * train["weights_bytes"], train
