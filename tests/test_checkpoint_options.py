"""Checkpoint cadence and retention, refusing a changed config, warm starts."""

from __future__ import annotations

import json
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import USAGE, assert_fails, assert_ok, tpurun_in_process
from fakes import FakeClock
from test_resume import weights

pytestmark = pytest.mark.slow

# The plain host loop (XLA's, config.train.xla="auto"'s pick for Iris, is compiled by
# XLA first, more than the rest of an Iris run costs): the loop is not what this file tests
# (test_device_data.py, test_host_loops.py).
IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10", "--config.train.xla=false")
# Where a checkpoint keeps the model's variables (trainer.checkpoint's model_variables).
MODEL_VARIABLES = "model_variables/"


def steps_saved(model_dir) -> list[int]:
    return sorted(
        int(p.name[len("ckpt-") : -len(".index")]) for p in model_dir.glob("ckpt-*.index")
    )


def test_step_cadence_is_rounded_to_the_loop_with_a_notice_and_retention_applies(
    tpurun_cli, tmp_path
):
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=95",
            "--save_checkpoints_steps=25",
            "--keep_checkpoint_max=2",
            f"--model_dir={tmp_path}",
        )
    )
    assert "save_checkpoints_steps=25 rounded up to 30, a multiple of --iterations=10" in (
        result.stderr
    )
    saved = [int(step) for step in re.findall(r"Saved checkpoint \S+ckpt-(\d+)\. ", result.stderr)]
    assert saved == [30, 60, 90, 95]
    assert steps_saved(tmp_path) == [90, 95]


def test_time_cadence_saves_after_the_loop_that_passes_it(tpurun_cli, tmp_path, monkeypatch):
    only_end = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=30",
            "--save_checkpoints_secs=100000",
            f"--model_dir={tmp_path / 'a'}",
        )
    )
    assert only_end.stderr.count("Saved checkpoint") == 1
    # The controller's clock moves a second at each look: every host loop passes a 1 s
    # cadence, whatever this machine's speed (tests/test_controller.py has the cases).
    from tpurun.runners import controller

    clock = FakeClock()

    def monotonic() -> float:
        clock.advance(1.0)
        return clock.now

    monkeypatch.setattr(controller, "time", types.SimpleNamespace(monotonic=monotonic))
    by_time = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=35",
            "--save_checkpoints_secs=1",
            f"--model_dir={tmp_path / 'b'}",
        )
    )
    saved = re.findall(r"Saved checkpoint \S+/ckpt-(\d+)\.", by_time.stderr)
    # By time after each loop (the last one's at the end of the run).
    assert saved == ["10", "20", "30", "35"], by_time.stderr


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Iris trained to step 200: the run the warm starts start from (none writes to it), and
    a copy of which the resumes with a changed config resume."""
    model_dir = tmp_path_factory.mktemp("source")
    assert_ok(tpurun_in_process("train", *IRIS, "--train_steps=200", f"--model_dir={model_dir}"))
    return model_dir


def test_resuming_with_a_changed_model_or_batch_is_refused_with_the_differences(
    tpurun_cli, tmp_path, source
):
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)  # trained to step 200
    line = assert_fails(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=220",
            "--batch_size=16",
            "--config.hidden_units=(12, 10)",
            f"--model_dir={tmp_path}",
        ),
        USAGE,
        "trained with a different config",
        "hidden_units: [10, 10] -> [12, 10]",
        "train.batch_size: 32 -> 16",
        "--force_resume",
    )
    assert "train.steps" not in line
    # What may change on resume: steps, learning rate, cadence.
    assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=220",
            "--config.optimizer.learning_rate=0.05",
            "--save_checkpoints_steps=20",
            f"--model_dir={tmp_path}",
        )
    )
    forced = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=240",
            "--batch_size=16",
            "--force_resume",
            f"--model_dir={tmp_path}",
        )
    )
    assert "Resuming with a changed config (--force_resume)" in forced.stderr
    recorded = json.loads((tmp_path / "train_config.json").read_text())
    assert recorded["train"]["batch_size"] == 16  # the new run's config is the record now


def test_warm_start_takes_the_weights_and_trains_from_step_zero(tpurun_cli, tmp_path, source):
    target = tmp_path / "target"
    # 0 steps: the checkpoint written is exactly what the warm start loaded.
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=10",
            f"--warm_start_from={source}",
            "--config.optimizer.learning_rate=0",
            f"--model_dir={target}",
        )
    )
    assert f"from {source / 'ckpt-200'}; training starts at step 0" in result.stderr
    assert "Resuming" not in result.stderr
    before, after = weights(source / "ckpt-200"), weights(target / "ckpt-10")
    model = [n for n in before if n.startswith(MODEL_VARIABLES)]
    assert len(model) == 6 and all(np.array_equal(before[n], after[n]) for n in model)
    assert int(after["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == 10
    assert_ok(tpurun_cli("eval", "--config=iris", "--use_tpu=false", f"--model_dir={target}"))


def test_warm_start_of_matching_variables_only(tpurun_cli, tmp_path, source):
    target = tmp_path / "target"
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=10",
            f"--warm_start_from={source / 'ckpt-200'}",
            "--config.train.warm_start_vars=logits",
            "--config.optimizer.learning_rate=0",
            f"--model_dir={target}",
        )
    )
    assert "Warm-started 2 of 6 variables" in result.stderr
    before, after = weights(source / "ckpt-200"), weights(target / "ckpt-10")
    same = {
        n for n in before if n.startswith(MODEL_VARIABLES) and np.array_equal(before[n], after[n])
    }
    assert len(same) == 2, same


def test_warm_start_errors_are_one_line(tpurun_cli, tmp_path, source):
    assert_fails(
        tpurun_cli(
            "train",
            *IRIS,
            f"--warm_start_from={tmp_path / 'nothing'}",
            f"--model_dir={tmp_path / 'a'}",
        ),
        USAGE,
        "--warm_start_from=",
        "is neither a checkpoint",
    )
    assert_fails(
        tpurun_cli(
            "train",
            *IRIS,
            f"--warm_start_from={source}",
            "--config.train.warm_start_vars=nomatch",
            f"--model_dir={tmp_path / 'b'}",
        ),
        USAGE,
        "warm_start_vars='nomatch' matches none",
    )
    assert_fails(
        tpurun_cli(
            "train",
            *IRIS,
            f"--warm_start_from={source}",
            "--config.hidden_units=(7,)",
            f"--model_dir={tmp_path / 'c'}",
        ),
        USAGE,
        "cannot take the weights of --warm_start_from=",
        "[4, 7] float32 here",
    )
    import tensorflow as tf

    # Not a checkpoint of this model: nothing would be restored, so nothing is taken.
    foreign = tf.train.Checkpoint(other=tf.Variable([1.0, 2.0])).write(str(tmp_path / "foreign"))
    assert_fails(
        tpurun_cli("train", *IRIS, f"--warm_start_from={foreign}", f"--model_dir={tmp_path / 'd'}"),
        USAGE,
        "nothing fills",
        "leave such variables out with config.train.warm_start_vars",
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
