"""Train and eval end to end through the CLI: train --eval_every, the eval --continuous
sidecar, the best checkpoint and export --best.

The runs are in-process (`tpurun_cli`), except the sidecar that runs beside a
training run: a process of its own, as it is used. The sidecar's loop and the best
checkpoint's bookkeeping are unit-tested in test_sidecar.py and test_best.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import forked
import ml_collections
import numpy as np
import pytest
from conftest import (
    OFFLINE_ENV,
    RUN_FAILURE,
    USAGE,
    assert_fails,
    assert_ok,
    contents,
    tensorboard_scalars,
    tpurun_in_process,
)

from tpurun.run_config import config_files
from tpurun.runners import restore

pytestmark = pytest.mark.slow

# The plain host loop (XLA's, config.train.xla="auto"'s pick for Iris, is compiled by
# XLA first, more than the rest of an Iris run costs): the loop is not what this file tests
# (test_device_data.py, test_host_loops.py).
COMMON = ("--config=iris", "--use_tpu=false", "--config.train.xla=false")


def model_weights(checkpoint: Path) -> list[np.ndarray]:
    """The Iris model's weights in a checkpoint, restored as tpurun restores them."""
    from tpurun import model

    config = ml_collections.FrozenConfigDict(config_files.load(config_files.resolve("iris")))
    keras_model = model.create(config).build()
    restore.restore_model(keras_model, str(checkpoint))
    return [w.numpy() for w in keras_model.weights]


def printed_steps(stdout: str) -> list[int]:
    return [int(s) for s in re.findall(r"^eval at step (\d+) on test: ", stdout, re.MULTILINE)]


# 310 steps, eval every 40 rounded up to 50 (two loops of 25): evals at 50..300 and
# at the end, 310. Iris (accuracy, max) peaks at step 250 with seed 0.
TRAIN_STEPS, EVAL_STEPS = 310, [50, 100, 150, 200, 250, 300, 310]
TRAIN_AND_EVAL = ("--train_steps=310", "--iterations=25", "--eval_every=40")


@pytest.fixture(scope="module")
def trained_with_evals(tmp_path_factory):
    """A model_dir trained with --eval_every and --keep_checkpoint_max=1; and its stdout."""
    model_dir = tmp_path_factory.mktemp("train_and_eval") / "model"
    result = assert_ok(
        tpurun_in_process(
            "train", *COMMON, *TRAIN_AND_EVAL, "--keep_checkpoint_max=1", f"--model_dir={model_dir}"
        )
    )
    return model_dir, result


def test_train_eval_every_evaluates_at_each_eval_step_and_the_end(trained_with_evals):
    model_dir, result = trained_with_evals
    assert "eval_every=40 rounded up to 50, a multiple of --iterations=25" in result.stderr
    assert printed_steps(result.stdout) == EVAL_STEPS
    results = {p.name for p in (model_dir / "eval" / "test").glob("results-*.json")}
    assert results == {f"results-{step}.json" for step in EVAL_STEPS}
    scalars = tensorboard_scalars(model_dir / "eval_test")
    assert [step for step, _ in scalars["accuracy"]] == EVAL_STEPS
    assert [step for step, _ in scalars["loss"]] == EVAL_STEPS
    for step, accuracy in scalars["accuracy"]:
        stored = json.loads((model_dir / "eval" / "test" / f"results-{step}.json").read_text())
        assert accuracy == pytest.approx(stored["accuracy"])
    assert len(list((model_dir / "eval_test").glob("events.out.tfevents.*"))) == 1


def test_evaluating_while_training_does_not_change_what_is_trained(
    tpurun_cli, trained_with_evals, tmp_path
):
    model_dir, _ = trained_with_evals
    plain = tmp_path / "plain"
    assert_ok(
        tpurun_cli("train", *COMMON, "--train_steps=310", "--iterations=25", f"--model_dir={plain}")
    )
    for with_evals, without in zip(
        model_weights(model_dir / "ckpt-310"), model_weights(plain / "ckpt-310"), strict=True
    ):
        np.testing.assert_array_equal(with_evals, without)


def test_best_survives_keep_checkpoint_max_and_export_best_exports_it(
    tpurun_cli, trained_with_evals, tmp_path
):
    model_dir, _ = trained_with_evals
    record = json.loads((model_dir / "best" / "best.json").read_text())
    accuracies = {
        step: json.loads((model_dir / "eval" / "test" / f"results-{step}.json").read_text())[
            "accuracy"
        ]
        for step in EVAL_STEPS
    }
    first_best = min(step for step in EVAL_STEPS if accuracies[step] == max(accuracies.values()))
    assert record == {
        "step": first_best,
        "split": "test",
        "metric": "accuracy",
        "mode": "max",
        "value": accuracies[first_best],
        "checkpoint": f"ckpt-{first_best}",
    }
    assert first_best < TRAIN_STEPS, "the test needs a best that is not the latest"
    # keep_checkpoint_max=1 deleted ckpt-<best> from model_dir; the copy in best/ stays.
    assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == ["ckpt-310.index"]
    assert (model_dir / "best" / f"ckpt-{first_best}.index").exists()

    export_dir = tmp_path / "exported"
    result = assert_ok(
        tpurun_cli(
            "export", *COMMON, "--best", f"--model_dir={model_dir}", f"--export_dir={export_dir}"
        )
    )
    assert result.stdout.strip() == str(export_dir)
    assert f"The best checkpoint: step {first_best}" in result.stderr

    import tensorflow as tf

    exported = [v.numpy() for v in tf.saved_model.load(str(export_dir)).variables]
    best_weights = model_weights(model_dir / "best" / f"ckpt-{first_best}")
    latest_weights = model_weights(model_dir / "ckpt-310")
    for exported_value, best_value in zip(exported, best_weights, strict=True):
        np.testing.assert_array_equal(exported_value, best_value)
    assert not all(np.array_equal(a, b) for a, b in zip(exported, latest_weights, strict=True))


def test_sidecar_started_before_training_evaluates_every_saved_checkpoint_once(
    tpurun_cli, tmp_path
):
    model_dir = tmp_path / "model"
    steps = ("--train_steps=30", "--iterations=5")  # 3 saves, each seen by the sidecar
    sidecar_err = tmp_path / "sidecar.stderr"
    with open(tmp_path / "sidecar.stdout", "w") as out, open(sidecar_err, "w") as err:
        sidecar = forked.Popen(
            [sys.executable, "-m", "tpurun", "eval", *COMMON, *steps, "--continuous",
             "--eval_timeout=120", f"--model_dir={model_dir}"],
            env={**os.environ, **OFFLINE_ENV},
            stdout=out,
            stderr=err,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "Waiting for a checkpoint" not in sidecar_err.read_text():
                assert sidecar.poll() is None, sidecar_err.read_text()
                assert time.monotonic() < deadline, "the sidecar never started waiting"
                time.sleep(0.1)
            assert not model_dir.exists(), "a waiting sidecar must not create model_dir"
            train = assert_ok(
                tpurun_cli(
                    "train",
                    *COMMON,
                    *steps,
                    "--save_checkpoints_steps=10",
                    "--keep_checkpoint_max=100",
                    f"--model_dir={model_dir}",
                )
            )
            sidecar.wait(timeout=120)
        finally:
            if sidecar.poll() is None:
                sidecar.kill()
                sidecar.wait()
    stdout, stderr = (tmp_path / "sidecar.stdout").read_text(), sidecar_err.read_text()
    assert sidecar.returncode == 0, stderr
    saved = [int(s) for s in re.findall(r"Saved checkpoint .*ckpt-(\d+)\.", train.stderr)]
    assert saved == list(range(10, 31, 10))
    evaluated = printed_steps(stdout)
    assert evaluated == saved, "each checkpoint exactly once, in step order"
    assert {p.name for p in (model_dir / "eval" / "test").glob("results-*.json")} == {
        f"results-{step}.json" for step in saved
    }
    assert [step for step, _ in tensorboard_scalars(model_dir / "eval_test")["loss"]] == saved
    assert stdout.splitlines()[-1] == (
        "eval --continuous: stopped after the checkpoint of the final step 30 "
        "(--train_steps=30); evaluated 3 checkpoint(s) in this run"
    )
    assert (model_dir / "best" / "best.json").exists()


def test_sidecar_on_a_dir_with_no_new_checkpoint_stops_after_eval_timeout(
    tpurun_cli, trained_with_evals, tmp_path
):
    model_dir = tmp_path / "model"
    shutil.copytree(trained_with_evals[0], model_dir)
    start = time.monotonic()
    result = assert_ok(
        tpurun_cli(
            "eval", *COMMON, "--continuous", "--eval_timeout=1", "--train_steps=1000",
            f"--model_dir={model_dir}",
        )
    )  # fmt: skip
    assert time.monotonic() - start >= 1
    # ckpt-310 was evaluated by the training run (eval/test/results-310.json): not again.
    assert printed_steps(result.stdout) == []
    assert "Step 310 was evaluated on test before" in result.stderr
    assert result.stdout.strip() == (
        f"eval --continuous: stopped: no new checkpoint in {model_dir} for 1s (--eval_timeout) "
        "and the final step 1000 (--train_steps) is not reached; evaluated 0 checkpoint(s) in "
        "this run, the newest is step 310"
    )


def test_sidecar_that_never_sees_a_checkpoint_fails_and_writes_nothing(tpurun_cli, tmp_path):
    model_dir = tmp_path / "model"
    result = tpurun_cli(
        "eval",
        *COMMON,
        "--continuous",
        "--eval_timeout=1",
        f"--model_dir={model_dir}",
        cwd=tmp_path,
    )
    assert_fails(
        result,
        RUN_FAILURE,
        f"no checkpoint appeared in {model_dir} within --eval_timeout=1s",
        "start tpurun train",
    )
    assert contents(tmp_path) == set()


@pytest.mark.parametrize("command", ["eval", "train"])
def test_unknown_best_metric_fails_before_evaluating_or_training(
    tpurun_cli, trained_with_evals, tmp_path, command
):
    model_dir = tmp_path / "model"
    if command == "eval":
        shutil.copytree(trained_with_evals[0], model_dir)
    before = contents(tmp_path)
    extra = ("--eval_every=50",) if command == "train" else ()
    result = tpurun_cli(
        command, *COMMON, *extra, "--config.eval.best_metric=f1", f"--model_dir={model_dir}"
    )
    assert_fails(
        result,
        USAGE,
        "config.eval.best_metric='f1' is not an eval metric",
        "use one of accuracy, loss",
    )
    assert contents(tmp_path) == before, "nothing written, no model_dir created"


def test_export_best_without_a_best_says_how_to_make_one(tpurun_cli, trained_with_evals, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(trained_with_evals[0], model_dir)
    shutil.rmtree(model_dir / "best")
    before = contents(tmp_path)
    result = tpurun_cli("export", *COMMON, "--best", f"--model_dir={model_dir}")
    assert_fails(
        result,
        RUN_FAILURE,
        f"no best checkpoint in {model_dir / 'best'} yet",
        f"tpurun eval --config=iris --model_dir={model_dir}",
        "--eval_every=N",
    )
    assert contents(tmp_path) == before
