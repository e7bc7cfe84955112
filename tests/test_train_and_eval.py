"""Train and eval: train --eval_every, the eval --continuous sidecar, the best checkpoint.

The unit tests drive the sidecar's loop and the best-checkpoint bookkeeping on
fake checkpoint files in one process; the end-to-end ones (marked slow) run the
real CLI, the sidecar in a second process beside a training run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    run_tpurun,
)

from tpurun import config_files
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig, merge_flags

COMMON = ("--config=iris", "--use_tpu=false")


def iris_run(model_dir: Path, **flags) -> RunConfig:
    """The RunConfig of `tpurun eval --continuous` on Iris, with config flags applied."""
    run_flags = {k: flags.pop(k) for k in ("eval_timeout",) if k in flags}
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    return RunConfig(
        command="eval",
        config_name="iris",
        config=config,
        model_dir=str(model_dir),
        continuous=True,
        **run_flags,
    )


def fake_checkpoint(model_dir: Path, step: int) -> str:
    """ckpt-<step> files (contents unread here) and the state file listing every one."""
    import tensorflow as tf

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / f"ckpt-{step}.index").write_text(f"index {step}")
    (model_dir / f"ckpt-{step}.data-00000-of-00001").write_text(f"data {step}")
    saved = sorted((str(p)[: -len(".index")] for p in model_dir.glob("ckpt-*.index")), key=step_of)
    tf.compat.v1.train.update_checkpoint_state(
        str(model_dir), saved[-1], all_model_checkpoint_paths=saved
    )
    return str(model_dir / f"ckpt-{step}")


def delete_checkpoint(model_dir: Path, step: int) -> None:
    """What keep_checkpoint_max does: the files go, the state file may still list them."""
    for path in model_dir.glob(f"ckpt-{step}.*"):
        path.unlink()


def step_of(path: str) -> int:
    return int(path.rsplit("-", 1)[1])


class Sidecar:
    """Fake evaluate/report callbacks for evaluate_continuously: records the steps."""

    def __init__(self, on_report=None):
        self.evaluated: list[int] = []
        self.reported: list[int] = []
        self.on_report = on_report

    def evaluate(self, path: str) -> dict[str, float]:
        self.evaluated.append(step_of(path))
        return {"loss": 1.0 / step_of(path), "num_examples": 30, "global_step": step_of(path)}

    def report(self, path: str, results: dict[str, float]) -> None:
        self.reported.append(int(results["global_step"]))
        if self.on_report:
            self.on_report(results)


@pytest.fixture
def fast_polls(monkeypatch):
    from tpurun import sidecar

    monkeypatch.setattr(sidecar, "POLL_SECONDS", 0.01)


# --- The sidecar's loop, on fake checkpoints. ---


def test_sidecar_evaluates_each_checkpoint_once_in_step_order_and_stops_at_the_final_step(
    tmp_path, fast_polls
):
    from tpurun.sidecar import evaluate_continuously

    for step in (20, 10):
        fake_checkpoint(tmp_path, step)

    def trainer_saves_more(results):  # the trainer saves while the sidecar evaluates
        newest = max(step_of(str(p)[: -len(".index")]) for p in tmp_path.glob("ckpt-*.index"))
        if newest < 40:
            fake_checkpoint(tmp_path, newest + 10)

    sidecar = Sidecar(on_report=trainer_saves_more)
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=40, eval_timeout=30), sidecar.evaluate, sidecar.report
    )
    assert sidecar.evaluated == sidecar.reported == [10, 20, 30, 40]
    assert "stopped after the checkpoint of the final step 40 (--train_steps=40)" in line
    assert "evaluated 4 checkpoint(s)" in line


def test_sidecar_skips_deleted_and_already_evaluated_checkpoints(tmp_path, fast_polls):
    from tpurun.sidecar import evaluate_continuously

    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    delete_checkpoint(tmp_path, 10)  # by keep_checkpoint_max, before the sidecar read it
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results-20.json").write_text("{}")  # by an earlier sidecar

    def evaluate(path):
        if step_of(path) == 30:  # deleted while being read
            delete_checkpoint(tmp_path, 30)
            from tpurun.checkpoints import CheckpointGone

            raise CheckpointGone(f"checkpoint {path} is gone (data file not found)")
        return Sidecar().evaluate(path)

    sidecar = Sidecar()
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=40, eval_timeout=30), evaluate, sidecar.report
    )
    assert sidecar.reported == [40]
    assert "final step 40" in line and "evaluated 1 checkpoint(s)" in line


def test_sidecar_raises_an_eval_error_even_when_the_checkpoint_was_deleted_meanwhile(
    tmp_path, fast_polls
):
    from tpurun.errors import RunError
    from tpurun.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)

    def evaluate(path):
        delete_checkpoint(tmp_path, 10)  # rotated away while its eval ran, and then
        raise RunError("Iris.input_fn(eval) yielded no examples")  # a real failure

    with pytest.raises(RunError, match="yielded no examples"):
        evaluate_continuously(iris_run(tmp_path, train_steps=40, eval_timeout=30), evaluate, print)


def test_sidecar_read_error_of_a_checkpoint_still_there_is_raised(tmp_path, fast_polls):
    import tensorflow as tf

    from tpurun.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)

    def evaluate(path):
        raise tf.errors.DataLossError(None, None, "checksum mismatch")

    with pytest.raises(tf.errors.DataLossError):
        evaluate_continuously(
            iris_run(tmp_path, train_steps=10, eval_timeout=30), evaluate, Sidecar().report
        )


def test_sidecar_stops_after_eval_timeout_without_a_new_checkpoint(tmp_path, fast_polls):
    from tpurun.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)
    sidecar = Sidecar()
    start = time.monotonic()
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=100, eval_timeout=0.3), sidecar.evaluate, sidecar.report
    )
    assert 0.3 <= time.monotonic() - start < 10
    assert sidecar.reported == [10]
    assert "no new checkpoint" in line and "--eval_timeout" in line
    assert "final step 100 (--train_steps) is not reached" in line


def test_waiting_for_a_first_checkpoint_that_never_comes_is_an_error(tmp_path, fast_polls):
    from tpurun.sidecar import wait_for_checkpoint

    with pytest.raises(RunError, match="no checkpoint appeared in .* within --eval_timeout=0.2s"):
        wait_for_checkpoint(iris_run(tmp_path / "model", eval_timeout=0.2))
    assert not (tmp_path / "model").exists()


# --- The best checkpoint, on fake checkpoints. ---


def best_run(model_dir: Path, metric: str = "accuracy", mode: str = "max") -> RunConfig:
    config = config_files.load(config_files.resolve("iris"))
    config.eval.best_metric, config.eval.best_mode = metric, mode
    return RunConfig(
        command="eval",
        config_name="iris",
        config=ml_collections.FrozenConfigDict(config),
        model_dir=str(model_dir),
    )


def results(step: int, **metrics: float) -> dict[str, float]:
    return {**metrics, "num_examples": 30, "global_step": step}


@pytest.mark.parametrize(
    "mode, values, best_step",
    [("max", (0.5, 0.9, 0.7, 0.9), 20), ("min", (0.5, 0.9, 0.3, 0.3), 30)],
    ids=["max_keeps_the_first_of_a_tie", "min"],
)
def test_best_follows_the_metric_and_mode(tmp_path, mode, values, best_step):
    from tpurun import best

    run = best_run(tmp_path, "accuracy", mode)
    for i, value in enumerate(values):
        step = 10 * (i + 1)
        best.update(run, fake_checkpoint(tmp_path, step), results(step, accuracy=value, loss=1.0))
    kept = best.read(str(tmp_path))
    assert (kept.step, kept.checkpoint) == (best_step, f"ckpt-{best_step}")
    assert json.loads((tmp_path / "best" / "best.json").read_text()) == {
        "step": best_step,
        "metric": "accuracy",
        "mode": mode,
        "value": values[best_step // 10 - 1],
        "checkpoint": f"ckpt-{best_step}",
    }
    assert {p.name for p in (tmp_path / "best").iterdir()} == {
        "best.json",
        f"ckpt-{best_step}.index",
        f"ckpt-{best_step}.data-00000-of-00001",
    }
    assert (tmp_path / "best" / f"ckpt-{best_step}.index").read_text() == f"index {best_step}"
    assert not list(tmp_path.glob(".best*")), "temporary directories left behind"


def test_best_copy_is_independent_of_the_checkpoint(tmp_path):
    from tpurun import best

    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.9, loss=1.0))
    delete_checkpoint(tmp_path, 10)  # keep_checkpoint_max
    assert best.require(run).path == str(tmp_path / "best" / "ckpt-10")
    assert (tmp_path / "best" / "ckpt-10.data-00000-of-00001").read_text() == "data 10"


def test_a_replacement_killed_between_its_renames_leaves_the_old_best_readable(tmp_path):
    from tpurun import best

    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0))
    (tmp_path / "best").rename(tmp_path / ".best.previous")  # killed right after this rename
    assert best.read(str(tmp_path)).step == 10
    assert best.update(run, fake_checkpoint(tmp_path, 20), results(20, accuracy=0.9, loss=1.0))
    assert best.read(str(tmp_path)).step == 20
    assert not list(tmp_path.glob(".best*"))


def test_a_checkpoint_deleted_before_it_is_kept_leaves_the_best_as_it_was(tmp_path):
    from tpurun import best

    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0))
    path = fake_checkpoint(tmp_path, 20)
    delete_checkpoint(tmp_path, 20)
    assert not best.update(run, path, results(20, accuracy=0.9, loss=1.0))
    assert best.read(str(tmp_path)).step == 10
    assert not list(tmp_path.glob(".best*"))


def test_unknown_best_metric_names_the_available_ones(tmp_path):
    from tpurun import best

    with pytest.raises(UsageError) as raised:
        best.check_metric(best_run(tmp_path, metric="f1"), results(10, accuracy=0.9, loss=1.0))
    assert str(raised.value) == (
        "config.eval.best_metric='f1' is not an eval metric of this model; "
        "use one of accuracy, loss (--config.eval.best_metric=NAME)"
    )


def test_no_best_yet_says_how_to_make_one(tmp_path):
    from tpurun import best

    with pytest.raises(RunError, match=r"no best checkpoint in .*best yet; evaluate first"):
        best.require(best_run(tmp_path))


# --- End to end, through the CLI. ---


def eval_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars under `directory` by tag, read back as TensorBoard reads them."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0}
    ).Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
        for tag in accumulator.Tags()["tensors"]
    }


def model_weights(checkpoint: Path) -> list[np.ndarray]:
    """The Iris model's weights in a checkpoint, restored as tpurun restores them."""
    from tpurun import checkpoints, model

    config = ml_collections.FrozenConfigDict(config_files.load(config_files.resolve("iris")))
    keras_model = model.create(config).build()
    checkpoints.restore_model(keras_model, str(checkpoint))
    return [w.numpy() for w in keras_model.weights]


def printed_steps(stdout: str) -> list[int]:
    return [int(s) for s in re.findall(r"^eval at step (\d+): ", stdout, re.MULTILINE)]


# 310 steps, eval every 40 rounded up to 50 (two loops of 25): evals at 50..300 and
# at the end, 310. Iris (accuracy, max) peaks at step 250 with seed 0.
TRAIN_STEPS, EVAL_STEPS = 310, [50, 100, 150, 200, 250, 300, 310]
TRAIN_AND_EVAL = ("--train_steps=310", "--iterations=25", "--eval_every=40")


@pytest.fixture(scope="module")
def trained_with_evals(tmp_path_factory):
    """A model_dir trained with --eval_every and --keep_checkpoint_max=1; and its stdout."""
    model_dir = tmp_path_factory.mktemp("train_and_eval") / "model"
    result = assert_ok(
        run_tpurun(
            "train", *COMMON, *TRAIN_AND_EVAL, "--keep_checkpoint_max=1", f"--model_dir={model_dir}"
        )
    )
    return model_dir, result


@pytest.mark.slow
def test_train_eval_every_evaluates_at_each_eval_step_and_the_end(trained_with_evals):
    model_dir, result = trained_with_evals
    assert "eval_every=40 rounded up to 50, a multiple of --iterations=25" in result.stderr
    assert printed_steps(result.stdout) == EVAL_STEPS
    results = {p.name for p in (model_dir / "eval").glob("results-*.json")}
    assert results == {f"results-{step}.json" for step in EVAL_STEPS}
    scalars = eval_scalars(model_dir / "eval")
    assert [step for step, _ in scalars["accuracy"]] == EVAL_STEPS
    assert [step for step, _ in scalars["loss"]] == EVAL_STEPS
    for step, accuracy in scalars["accuracy"]:
        stored = json.loads((model_dir / "eval" / f"results-{step}.json").read_text())
        assert accuracy == pytest.approx(stored["accuracy"])
    assert len(list((model_dir / "eval").glob("events.out.tfevents.*"))) == 1


@pytest.mark.slow
def test_evaluating_while_training_does_not_change_what_is_trained(trained_with_evals, tmp_path):
    model_dir, _ = trained_with_evals
    plain = tmp_path / "plain"
    assert_ok(
        run_tpurun("train", *COMMON, "--train_steps=310", "--iterations=25", f"--model_dir={plain}")
    )
    for with_evals, without in zip(
        model_weights(model_dir / "ckpt-310"), model_weights(plain / "ckpt-310"), strict=True
    ):
        np.testing.assert_array_equal(with_evals, without)


@pytest.mark.slow
def test_best_survives_keep_checkpoint_max_and_export_best_exports_it(trained_with_evals, tmp_path):
    model_dir, _ = trained_with_evals
    record = json.loads((model_dir / "best" / "best.json").read_text())
    accuracies = {
        step: json.loads((model_dir / "eval" / f"results-{step}.json").read_text())["accuracy"]
        for step in EVAL_STEPS
    }
    first_best = min(step for step in EVAL_STEPS if accuracies[step] == max(accuracies.values()))
    assert record == {
        "step": first_best,
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
        run_tpurun(
            "export", *COMMON, "--best", f"--model_dir={model_dir}", f"--export_dir={export_dir}"
        )
    )
    assert result.stdout.strip() == str(export_dir)
    assert f"Exporting the best checkpoint: step {first_best}" in result.stderr

    import tensorflow as tf

    exported = [v.numpy() for v in tf.saved_model.load(str(export_dir)).variables]
    best_weights = model_weights(model_dir / "best" / f"ckpt-{first_best}")
    latest_weights = model_weights(model_dir / "ckpt-310")
    for exported_value, best_value in zip(exported, best_weights, strict=True):
        np.testing.assert_array_equal(exported_value, best_value)
    assert not all(np.array_equal(a, b) for a, b in zip(exported, latest_weights, strict=True))


@pytest.mark.slow
def test_sidecar_started_before_training_evaluates_every_saved_checkpoint_once(tmp_path):
    model_dir = tmp_path / "model"
    steps = ("--train_steps=1500", "--iterations=5")
    sidecar_err = tmp_path / "sidecar.stderr"
    with open(tmp_path / "sidecar.stdout", "w") as out, open(sidecar_err, "w") as err:
        sidecar = subprocess.Popen(
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
                run_tpurun(
                    "train",
                    *COMMON,
                    *steps,
                    "--save_checkpoints_steps=100",
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
    assert saved == list(range(100, 1501, 100))
    evaluated = printed_steps(stdout)
    assert evaluated == saved, "each checkpoint exactly once, in step order"
    assert {p.name for p in (model_dir / "eval").glob("results-*.json")} == {
        f"results-{step}.json" for step in saved
    }
    assert [step for step, _ in eval_scalars(model_dir / "eval")["loss"]] == saved
    assert stdout.splitlines()[-1] == (
        "eval --continuous: stopped after the checkpoint of the final step 1500 "
        "(--train_steps=1500); evaluated 15 checkpoint(s) in this run"
    )
    assert (model_dir / "best" / "best.json").exists()


@pytest.mark.slow
def test_sidecar_on_a_dir_with_no_new_checkpoint_stops_after_eval_timeout(
    trained_with_evals, tmp_path
):
    model_dir = tmp_path / "model"
    shutil.copytree(trained_with_evals[0], model_dir)
    start = time.monotonic()
    result = assert_ok(
        run_tpurun(
            "eval", *COMMON, "--continuous", "--eval_timeout=2", "--train_steps=1000",
            f"--model_dir={model_dir}",
        )
    )  # fmt: skip
    assert time.monotonic() - start >= 2
    # ckpt-310 was evaluated by the training run (eval/results-310.json): not again.
    assert printed_steps(result.stdout) == []
    assert "Step 310 was evaluated before" in result.stderr
    assert result.stdout.strip() == (
        f"eval --continuous: stopped: no new checkpoint in {model_dir} for 2s (--eval_timeout) "
        "and the final step 1000 (--train_steps) is not reached; evaluated 0 checkpoint(s) in "
        "this run, the newest is step 310"
    )


@pytest.mark.slow
def test_sidecar_that_never_sees_a_checkpoint_fails_and_writes_nothing(tmp_path):
    model_dir = tmp_path / "model"
    result = run_tpurun(
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


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "train"])
def test_unknown_best_metric_fails_before_evaluating_or_training(
    trained_with_evals, tmp_path, command
):
    model_dir = tmp_path / "model"
    if command == "eval":
        shutil.copytree(trained_with_evals[0], model_dir)
    before = contents(tmp_path)
    extra = ("--eval_every=50",) if command == "train" else ()
    result = run_tpurun(
        command, *COMMON, *extra, "--config.eval.best_metric=f1", f"--model_dir={model_dir}"
    )
    assert_fails(
        result,
        USAGE,
        "config.eval.best_metric='f1' is not an eval metric",
        "use one of accuracy, loss",
    )
    assert contents(tmp_path) == before, "nothing written, no model_dir created"


@pytest.mark.slow
def test_export_best_without_a_best_says_how_to_make_one(trained_with_evals, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(trained_with_evals[0], model_dir)
    shutil.rmtree(model_dir / "best")
    before = contents(tmp_path)
    result = run_tpurun("export", *COMMON, "--best", f"--model_dir={model_dir}")
    assert_fails(
        result,
        RUN_FAILURE,
        f"no best checkpoint in {model_dir / 'best'} yet",
        f"tpurun eval --config=iris --model_dir={model_dir}",
        "--eval_every=N",
    )
    assert contents(tmp_path) == before
