"""Named eval splits through the CLI: validation chooses the best checkpoint, test reports on it.

A user's model with a `val` and a `test` split (points in the plane, generated in
the model file, a different seed per split) is trained once per module with
--eval_every; each test works on a copy of that model_dir.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import forked
import pytest
from conftest import (
    OFFLINE_ENV,
    RUN_FAILURE,
    USAGE,
    assert_fails,
    assert_ok,
    contents,
    tpurun_in_process,
)

MODEL = '''
import keras
import numpy as np
import tensorflow as tf

from tpurun.inputs import seekable_batches
from tpurun.model import Classifier, Mode, register

SEEDS = {"train": 0, "val": 1, "test": 2}
SIZES = {"train": 256, "val": 40, "test": 50}


def points(split):
    """Points in the plane; the class is which side of a noisy line they are on."""
    rng = np.random.default_rng(SEEDS[split])
    x = rng.normal(size=(SIZES[split], 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] + rng.normal(scale=0.5, size=len(x)) > 0).astype(np.int32)
    return {"x": x}, y


@register("two_splits")
class TwoSplits(Classifier):
    input_fn_seeks = True
    eval_splits = ("val", "test")

    def input_fn(self, mode, params):
        if mode is Mode.TRAIN:
            return seekable_batches(points("train"), params)
        features, labels = points(params.split if mode is Mode.EVAL else "test")
        data = (features, labels) if mode is Mode.EVAL else features
        dataset = tf.data.Dataset.from_tensor_slices(data)
        dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
        return dataset.batch(params.batch_size)

    def build(self):
        x = keras.Input(shape=(2,), name="x")
        return keras.Model({"x": x}, keras.layers.Dense(2)(x))
'''
CONFIG = """
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="two_splits")
    config.model_module = "two_splits"
    config.train.batch_size = 16
    config.train.steps = 30
    config.train.iterations = 10
    config.eval.batch_size = 16
    config.predict.batch_size = 16
    return config
"""
STEPS = (10, 20, 30)


def project(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "two_splits.py").write_text(MODEL)
    (directory / "two_splits_config.py").write_text(CONFIG)
    return directory


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A model_dir trained 30 steps with --eval_every=10 (on val, the selecting split)."""
    where = project(tmp_path_factory.mktemp("splits"))
    model_dir = where / "model"
    result = assert_ok(tpurun_in_process("train", *args(where, model_dir), "--eval_every=10"))
    assert "eval at step 30 on val: " in result.stdout
    return model_dir


def args(where: Path, model_dir: Path) -> tuple[str, ...]:
    config = where / "two_splits_config.py"
    return f"--config={config}", "--use_tpu=false", f"--model_dir={model_dir}"


@pytest.fixture
def run(trained, tmp_path, tpurun_cli):
    """`run(*command_args)` on a copy of the trained model_dir (at tmp_path/model)."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    where = project(tmp_path / "project")

    def run_tpurun(*command_args: str):
        return tpurun_cli(*command_args[:1], *args(where, model_dir), *command_args[1:])

    return run_tpurun


def results(path: Path) -> dict:
    return json.loads(path.read_text())


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below `directory` (relative name) and its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_eval_every_evaluates_the_selecting_split_and_chooses_the_best_on_it(trained):
    assert {p.name for p in (trained / "eval" / "val").iterdir()} == {
        f"results-{step}.json" for step in STEPS
    }
    assert not (trained / "eval" / "test").exists()
    assert [p.name for p in trained.iterdir() if p.name.startswith("eval")] == ["eval", "eval_val"]
    record = results(trained / "best" / "best.json")
    assert (record["split"], record["metric"]) == ("val", "loss")
    by_step = {step: results(trained / "eval" / "val" / f"results-{step}.json") for step in STEPS}
    assert record["value"] == min(r["loss"] for r in by_step.values())


def test_eval_on_test_leaves_best_unchanged_and_writes_only_under_eval_test(run, tmp_path):
    model_dir = tmp_path / "model"
    before = snapshot(model_dir)
    result = assert_ok(run("eval", "--split=test"))
    assert "eval at step 30 on test: " in result.stdout
    assert "not the best_split 'val': best/ unchanged" in result.stdout
    after = snapshot(model_dir)
    assert {k: v for k, v in after.items() if k.startswith("best")} == {
        k: v for k, v in before.items() if k.startswith("best")
    }
    new = set(after) - set(before)
    written = {name for name in new if not name.startswith("runs/")}  # the run record
    assert {name for name in written if not name.startswith("eval_test/")} == {
        "eval/test/results-30.json"
    }
    assert all(after[name] == before[name] for name in before)
    assert results(model_dir / "eval" / "test" / "results-30.json")["num_examples"] == 50


def test_eval_best_on_test_reports_the_best_step_beside_the_best(run, tmp_path):
    model_dir = tmp_path / "model"
    best_step = results(model_dir / "best" / "best.json")["step"]
    record_before = (model_dir / "best" / "best.json").read_bytes()
    result = assert_ok(run("eval", "--best", "--split=test"))
    assert f"eval at step {best_step} on test: " in result.stdout
    reported = results(model_dir / "best" / "results-test.json")
    assert reported["global_step"] == best_step
    assert (model_dir / "best" / "best.json").read_bytes() == record_before
    assert not (model_dir / "eval" / "test").exists()
    # The best is a copy of ckpt-<best step>: the same numbers.
    assert_ok(run("eval", f"--checkpoint={best_step}", "--split=test"))
    assert results(model_dir / "eval" / "test" / f"results-{best_step}.json") == reported


def test_checkpoint_n_evaluates_step_n(run, tmp_path):
    model_dir = tmp_path / "model"
    during_training = results(model_dir / "eval" / "val" / "results-10.json")
    result = assert_ok(run("eval", "--checkpoint=ckpt-10"))
    assert "eval at step 10 on val: " in result.stdout
    assert results(model_dir / "eval" / "val" / "results-10.json") == during_training


def test_an_absent_checkpoint_lists_those_present(run, tmp_path):
    before = contents(tmp_path / "model")
    result = run("eval", "--checkpoint=15")
    assert_fails(result, RUN_FAILURE, "no checkpoint ckpt-15", "ckpt-10, ckpt-20, ckpt-30")
    assert contents(tmp_path / "model") == before


def test_an_unknown_split_lists_the_models_splits(run, tmp_path):
    before = contents(tmp_path / "model")
    result = run("eval", "--split=train")
    assert_fails(result, USAGE, "--split=train is not a split of TwoSplits", "val, test")
    assert contents(tmp_path / "model") == before


def test_sidecars_on_two_splits_do_not_touch_each_others_files(run, tmp_path):
    """A sidecar on val finds every step evaluated on val; one on test evaluates them all."""
    model_dir = tmp_path / "model"
    before = snapshot(model_dir)
    sidecar = ("--continuous", "--eval_timeout=10")  # both stop after the final step, 30
    on_test = assert_ok(run("eval", "--split=test", *sidecar))
    assert [f"eval at step {s} on test:" in on_test.stdout for s in STEPS] == [True] * 3
    assert "evaluated 3 checkpoint(s)" in on_test.stdout
    after_test = snapshot(model_dir)
    on_val = assert_ok(run("eval", "--split=val", *sidecar))
    assert "evaluated 0 checkpoint(s)" in on_val.stdout
    after_val = snapshot(model_dir)
    # Neither changed a file that was there, nor the other's: only its own split's are new.
    for earlier, later in ((before, after_test), (after_test, after_val)):
        assert all(later[name] == earlier[name] for name in earlier)
    new_by_test = set(after_test) - set(before)
    assert {n for n in new_by_test if not n.startswith(("runs/", "eval_test/"))} == {
        f"eval/test/results-{s}.json" for s in STEPS
    }
    assert {n for n in set(after_val) - set(after_test) if not n.startswith("runs/")} == set()


@pytest.mark.slow
def test_sidecars_on_two_splits_run_side_by_side(trained, tmp_path, tpurun_cli):
    """Two `eval --continuous` on one model_dir at once, val and test: each evaluates its own
    split's missing steps and writes only its own files. The one on test is a process of its
    own; the one on val runs in this process once the other has evaluated its first step."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    for step in STEPS[1:]:  # left for the val sidecar: 20 and 30
        (model_dir / "eval" / "val" / f"results-{step}.json").unlink()
    where = project(tmp_path / "project")
    before = snapshot(model_dir)
    sidecar = ("--continuous", "--eval_timeout=10")
    out, err = tmp_path / "test.stdout", tmp_path / "test.stderr"
    with open(out, "w") as out_file, open(err, "w") as err_file:
        on_test = forked.Popen(
            [sys.executable, "-m", "tpurun", "eval", *args(where, model_dir), "--split=test"]
            + list(sidecar),
            cwd=tmp_path,
            env={**os.environ, **OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
            stdout=out_file,
            stderr=err_file,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            while "eval at step 10 on test: " not in out.read_text():
                assert on_test.poll() is None, err.read_text()[-3000:]
                assert time.monotonic() < deadline, "the test sidecar never evaluated step 10"
                time.sleep(0.1)
            on_val = assert_ok(
                tpurun_cli("eval", *args(where, model_dir), "--split=val", *sidecar, cwd=tmp_path)
            )
            on_test.wait(timeout=240)
        finally:
            if on_test.poll() is None:
                on_test.kill()
                on_test.wait()
    assert on_test.returncode == 0, err.read_text()[-3000:]
    assert "evaluated 2 checkpoint(s)" in on_val.stdout
    assert "evaluated 3 checkpoint(s)" in out.read_text()
    after = snapshot(model_dir)
    new = {n for n in set(after) - set(before) if not n.startswith("runs/")}
    assert {n for n in new if n.startswith("eval/")} == {
        *(f"eval/val/results-{s}.json" for s in STEPS[1:]),
        *(f"eval/test/results-{s}.json" for s in STEPS),
    }
    # Only the val sidecar may touch best/ (a better step than 10 replaces it).
    changed = {n for n in before if n in after and after[n] != before[n]}
    assert all(n.startswith(("best/", "eval_val/")) for n in changed), changed
    assert {n for n in new if not n.startswith("eval/")} <= {
        n for n in new if n.startswith(("best/", "eval_val/", "eval_test/"))
    }
    assert results(model_dir / "best" / "best.json")["split"] == "val"


def test_an_old_layout_model_dir_still_evaluates_and_resumes(run, tmp_path):
    """eval/results-<step>.json (no split) and a best.json without one: read as val's."""
    model_dir = tmp_path / "model"
    for step in STEPS:
        (model_dir / "eval" / "val" / f"results-{step}.json").rename(
            model_dir / "eval" / f"results-{step}.json"
        )
    (model_dir / "eval" / "val").rmdir()
    shutil.rmtree(model_dir / "eval_val")
    record = results(model_dir / "best" / "best.json")
    del record["split"]
    (model_dir / "best" / "best.json").write_text(json.dumps(record))

    sidecar = assert_ok(run("eval", "--continuous", "--eval_timeout=10"))
    assert "evaluated 0 checkpoint(s)" in sidecar.stdout  # the old results count
    evaluated = assert_ok(run("eval", "--checkpoint=20"))
    assert "eval at step 20 on val: " in evaluated.stdout
    assert results(model_dir / "eval" / "val" / "results-20.json") == results(
        model_dir / "eval" / "results-20.json"
    )
    resumed = assert_ok(run("train", "--train_steps=40", "--eval_every=10"))
    [evaluation] = [line for line in resumed.stdout.splitlines() if line.startswith("eval at")]
    assert evaluation.startswith("eval at step 40 on val: ")  # 10 to 30 were evaluated before
    assert (model_dir / "eval" / "val" / "results-40.json").exists()
    assert results(model_dir / "best" / "best.json")["split"] == "val"


def test_config_eval_also_evaluates_test_too_without_touching_best(tmp_path, tpurun_cli):
    where = project(tmp_path)
    model_dir = tmp_path / "model"
    result = assert_ok(
        tpurun_cli(
            "train",
            *args(where, model_dir),
            "--train_steps=20",
            "--eval_every=10",
            "--config.eval.also=test",
        )
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(("eval at", "not"))]
    assert [line.split(":")[0] for line in lines] == [
        "eval at step 10 on val",
        "eval at step 10 on test",
        "not the best_split 'val'",
        "eval at step 20 on val",
        "eval at step 20 on test",
    ]
    assert (model_dir / "eval" / "test" / "results-20.json").exists()
    assert results(model_dir / "best" / "best.json")["split"] == "val"


def test_predict_and_export_take_best_and_checkpoint_too(run, tmp_path):
    model_dir = tmp_path / "model"
    best_step = results(model_dir / "best" / "best.json")["step"]
    by_best, by_step = tmp_path / "best.jsonl", tmp_path / "step.jsonl"
    assert_ok(run("predict", "--best", f"--output={by_best}"))
    assert_ok(run("predict", f"--checkpoint=ckpt-{best_step}", f"--output={by_step}"))
    assert by_best.read_text() == by_step.read_text()
    assert len(by_best.read_text().splitlines()) == 50
    exported = Path(assert_ok(run("export", "--checkpoint=20")).stdout.strip())
    assert (exported / "saved_model.pb").is_file()
    result = run("export", "--checkpoint=40")
    assert_fails(result, RUN_FAILURE, "no checkpoint ckpt-40", "ckpt-10, ckpt-20, ckpt-30")


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (("--best", "--checkpoint=10"), ("--best and --checkpoint=10", "drop one")),
        (("--checkpoint=latest",), ("latest is neither ckpt-N or its step N",)),
        (("--continuous", "--best"), ("eval --continuous", "--best")),
    ],
    ids=["best_and_checkpoint", "not_a_step", "continuous_and_best"],
)
def test_conflicting_checkpoint_choices_are_one_usage_line(run, tmp_path, flags, keywords):
    before = contents(tmp_path / "model")
    assert_fails(run("eval", *flags), USAGE, *keywords)
    assert contents(tmp_path / "model") == before
