"""tpurun.storage.best: the best checkpoint so far by config.eval.best_metric, kept in model_dir/best,
on fake checkpoint files (the end-to-end runs are in test_train_and_eval.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_collections
import pytest
from fakes import delete_checkpoint, fake_checkpoint

from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig, config_files
from tpurun.storage import best


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
    run = best_run(tmp_path, "accuracy", mode)
    for i, value in enumerate(values):
        step = 10 * (i + 1)
        best.update(
            run, fake_checkpoint(tmp_path, step), results(step, accuracy=value, loss=1.0), "test"
        )
    kept = best.read(str(tmp_path))
    assert (kept.step, kept.checkpoint) == (best_step, f"ckpt-{best_step}")
    assert json.loads((tmp_path / "best" / "best.json").read_text()) == {
        "step": best_step,
        "split": "test",
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
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.9, loss=1.0), "test")
    delete_checkpoint(tmp_path, 10)  # keep_checkpoint_max
    assert best.require(run).path == str(tmp_path / "best" / "ckpt-10")
    assert (tmp_path / "best" / "ckpt-10.data-00000-of-00001").read_text() == "data 10"


def test_a_replacement_killed_between_its_renames_leaves_the_old_best_readable(tmp_path):
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0), "test")
    (tmp_path / "best").rename(tmp_path / ".best.previous")  # killed right after this rename
    assert best.read(str(tmp_path)).step == 10
    assert best.update(
        run, fake_checkpoint(tmp_path, 20), results(20, accuracy=0.9, loss=1.0), "test"
    )
    assert best.read(str(tmp_path)).step == 20
    assert not list(tmp_path.glob(".best*"))


def test_a_checkpoint_deleted_before_it_is_kept_leaves_the_best_as_it_was(tmp_path):
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0), "test")
    path = fake_checkpoint(tmp_path, 20)
    delete_checkpoint(tmp_path, 20)
    assert not best.update(run, path, results(20, accuracy=0.9, loss=1.0), "test")
    assert best.read(str(tmp_path)).step == 10
    assert not list(tmp_path.glob(".best*"))


def test_unknown_best_metric_names_the_available_ones(tmp_path):
    with pytest.raises(UsageError) as raised:
        best.check_metric(best_run(tmp_path, metric="f1"), results(10, accuracy=0.9, loss=1.0))
    assert str(raised.value) == (
        "config.eval.best_metric='f1' is not an eval metric of this model; "
        "use one of accuracy, loss (--config.eval.best_metric=NAME)"
    )


def test_no_best_yet_says_how_to_make_one(tmp_path):
    with pytest.raises(RunError, match=r"no best checkpoint in .*best yet; evaluate first"):
        best.require(best_run(tmp_path))


@pytest.mark.parametrize(
    "value, recorded, mode, expected",
    [
        (0.9, None, "max", True),  # nothing recorded yet
        (0.9, 0.8, "max", True),
        (0.8, 0.8, "max", False),  # a tie: the older stays
        (0.7, 0.8, "max", False),
        (0.7, 0.8, "min", True),
        (0.9, 0.8, "min", False),
        (math.nan, None, "max", False),  # never a NaN best
        (math.inf, 0.8, "max", False),
        (0.1, math.nan, "min", True),  # a NaN recorded is beaten by anything finite
    ],
)
def test_improves(value, recorded, mode, expected):
    kept = None
    if recorded is not None:
        kept = best.Best(10, "accuracy", mode, recorded, "ckpt-10", "/m/best/ckpt-10")
    assert best.improves(value, kept, "accuracy", mode) is expected


@pytest.mark.parametrize(
    "metric, mode", [("loss", "max"), ("accuracy", "min")], ids=["other_metric", "other_mode"]
)
def test_a_best_of_another_metric_or_mode_is_replaced(metric, mode):
    """The config chose another metric since: the record says nothing comparable."""
    kept = best.Best(10, metric, mode, 0.99, "ckpt-10", "/m/best/ckpt-10")
    assert best.improves(0.1, kept, "accuracy", "max")


def test_read_skips_a_best_whose_checkpoint_is_not_whole(tmp_path):
    """On GCS a killed directory rename can leave best.json without its checkpoint."""
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0), "test")
    (tmp_path / "best" / "ckpt-10.index").unlink()
    assert best.read(str(tmp_path)) is None


def test_the_record_names_the_checkpoint_and_its_path(tmp_path):
    run = best_run(tmp_path, "loss", "min")
    best.update(run, fake_checkpoint(tmp_path, 30), results(30, accuracy=0.5, loss=0.25), "test")
    assert best.read(str(tmp_path)) == best.Best(
        step=30,
        metric="loss",
        mode="min",
        value=0.25,
        checkpoint="ckpt-30",
        path=str(tmp_path / "best" / "ckpt-30"),
        split="test",
    )


def test_a_best_chosen_on_another_split_is_not_compared(tmp_path):
    """config.eval.best_split changed: the recorded best was measured on other data."""
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.9, loss=1.0), "test")
    assert best.update(
        run, fake_checkpoint(tmp_path, 20), results(20, accuracy=0.5, loss=1.0), "val"
    )
    assert (best.read(str(tmp_path)).step, best.read(str(tmp_path)).split) == (20, "val")


def test_a_record_without_a_split_is_read_as_the_selecting_splits(tmp_path):
    """tpurun before splits recorded none: its best was chosen on the split there was."""
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.9, loss=1.0), "test")
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    del record["split"]
    (tmp_path / "best" / "best.json").write_text(json.dumps(record))
    assert best.read(str(tmp_path)).split == ""
    assert not best.update(
        run, fake_checkpoint(tmp_path, 20), results(20, accuracy=0.5, loss=1.0), "test"
    )


def test_a_new_best_removes_the_results_of_the_previous_one(tmp_path):
    """best/results-<split>.json of `eval --best` would otherwise name the old step."""
    run = best_run(tmp_path)
    best.update(run, fake_checkpoint(tmp_path, 10), results(10, accuracy=0.5, loss=1.0), "val")
    (tmp_path / "best" / "results-test.json").write_text("{}")
    (tmp_path / "best" / "notes.txt").write_text("mine")
    best.update(run, fake_checkpoint(tmp_path, 20), results(20, accuracy=0.9, loss=1.0), "val")
    assert not (tmp_path / "best" / "results-test.json").exists()
    assert (tmp_path / "best" / "notes.txt").exists()
