"""A user's own model, outside this repo: the manual's example, run as the manual says.

The two files are taken from the manual's code blocks (those starting with
`# my_project/<file>.py`, tests/manual.py), so the documented example cannot rot: it is written
into a directory of its own, and tpurun runs from there: the training as the
installed command (a process of its own, which does not put the working directory
on sys.path; forked from a process that imported TensorFlow already, tests/forked), the
rest in-process (nor does the test process). Then a model trained with
an architecture override: eval, predict and export build it from the model_dir's trained
config without the override, and refuse one that does not fit its checkpoint in one line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import forked
import manual
import pytest
from conftest import OFFLINE_ENV, REPO, USAGE, assert_fails, assert_ok, tpurun_in_process

CONFIG = "--config=my_project/my_config.py"


def readme_project(directory: Path) -> Path:
    """Writes the manual's `my_project/*.py` code blocks below `directory`; returns it."""
    manual.example_project(directory, "my_project")
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*.py"))
    assert files == ["my_project/my_config.py", "my_project/my_model.py"]
    return directory


def tpurun(*args: str, cwd: Path):
    return assert_ok(tpurun_in_process(*args, cwd=cwd))


def installed_tpurun(*args: str, cwd: Path):
    """The `tpurun` console script, in a process of its own: the script file run as
    `python SCRIPT` runs it (its directory, not the working directory, first on
    sys.path), forked (tests/forked) rather than a fresh interpreter: its start-up is not
    the subject."""
    script = Path(sys.executable).with_name("tpurun")
    return assert_ok(
        forked.run(
            [sys.executable, str(script), *args],
            cwd=cwd,
            env={**os.environ, **OFFLINE_ENV},
            capture_output=True,
            text=True,
            timeout=300,
        )
    )


def test_list_shows_the_users_config(tmp_path):
    result = tpurun("list", cwd=readme_project(tmp_path))
    lines = result.stdout.splitlines()
    assert "config files in this directory (pass --config=<path>):" in lines
    assert (
        "  my_project/my_config.py  Above the line: a small classifier of random points in the "
        "plane (my own model)."
    ) in lines
    assert not [line for line in lines if "my_model.py" in line], "the model file has no get_config"


@pytest.mark.slow
def test_readme_example_trains_evaluates_predicts_and_exports(tmp_path):
    project = readme_project(tmp_path)
    assert REPO not in project.parents
    installed_tpurun("train", CONFIG, "--use_tpu=false", cwd=project)
    model_dir = project / "my_config"  # the default: ./<config name>
    assert (model_dir / "ckpt-300.index").is_file()

    result = tpurun("eval", CONFIG, cwd=project)
    assert "(1000 examples)" in result.stdout
    accuracy = json.loads((model_dir / "eval" / "results-300.json").read_text())["accuracy"]
    assert accuracy >= 0.95, f"the manual promises about 0.99, got {accuracy}"

    tpurun("predict", CONFIG, "--output=predictions.jsonl", cwd=project)
    rows = [json.loads(line) for line in (project / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 1000 and set(rows[0]) == {"class_ids", "probabilities"}

    export_dir = Path(tpurun("export", CONFIG, cwd=project).stdout.strip())
    assert (export_dir / "saved_model.pb").is_file()
    assert export_dir.parent == model_dir / "export"


# --- The trained config: eval, predict and export build the model the checkpoint holds ---


@pytest.fixture(scope="module")
def wider(tmp_path_factory) -> tuple[Path, Path]:
    """The manual's project trained with `--config.hidden_units=32` (the file says 16): the
    project directory and the model_dir."""
    project = readme_project(tmp_path_factory.mktemp("user"))
    model_dir = project / "wider"
    tpurun(
        "train",
        CONFIG,
        "--use_tpu=false",
        "--config.hidden_units=32",
        "--train_steps=20",
        "--iterations=10",
        f"--model_dir={model_dir}",
        cwd=project,
    )
    return project, model_dir


TAKEN = "hidden_units=32 (the config file: 16); --config.<key>=<value> overrides one."


def test_eval_predict_and_export_build_the_trained_model_without_the_override(wider, tmp_path):
    project, model_dir = wider
    given = (CONFIG, f"--model_dir={model_dir}")
    evaluated = tpurun("eval", *given, cwd=project)
    assert TAKEN in evaluated.stderr and "eval at step 20" in evaluated.stdout
    # A model key that shapes no weight may still be overridden: it is said, and used.
    predicted = tpurun("predict", *given, "--config.examples=7", cwd=project)
    assert TAKEN in predicted.stderr
    overriding = (
        "Overriding the config the checkpoints were trained with: examples=1000 (given: 7)."
    )
    assert overriding in predicted.stderr
    assert len(predicted.stdout.splitlines()) == 7
    exported = tpurun("export", *given, f"--export_dir={tmp_path / 'served'}", cwd=project)
    assert TAKEN in exported.stderr
    import tensorflow as tf

    loaded = tf.saved_model.load(str(tmp_path / "served"))
    dense = [
        tuple(v.shape) for v in loaded.signatures["serving_default"].variables if v.shape.rank == 2
    ]
    assert sorted(dense) == [(2, 32), (32, 2)], dense


@pytest.mark.parametrize("command", ["eval", "predict", "export"])
def test_an_override_the_checkpoint_does_not_fit_is_one_line(wider, command):
    project, model_dir = wider
    result = tpurun_in_process(
        command, CONFIG, f"--model_dir={model_dir}", "--config.hidden_units=8", cwd=project
    )
    line = assert_fails(
        result,
        USAGE,
        f"the checkpoint in {model_dir} does not fit the model this command line builds "
        "(--config.hidden_units=8, trained with 32): ",
        "Drop the override",
        f"{model_dir}/train_config.json",
    )
    assert "unexpected" not in line and "incompatible tensor" in line.lower(), line
    assert "WARNING" not in result.stderr and "W1" not in result.stderr, result.stderr
