"""Training length in epochs: --train_epochs / config.train.epochs, --eval_every=epoch.

Steps = ceil(epochs x training examples / examples per step), the examples counted
from the model's train_arrays (iris: 120), else config.data.train_examples; a
resumed run counts in the examples its model_dir recorded. Iris trains in-process
on one replica, from the flag on device data and from the config key through
tf.data, then resumes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from conftest import USAGE, assert_fails, assert_ok, tpurun_in_process

from tpurun.datasets import train_count
from tpurun.errors import UsageError
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.epochs import Counted, EpochCount, resolve_length, steps_for_epochs
from tpurun.storage import train_config

FIXTURES = Path(__file__).resolve().parent / "check_fixtures"


# --- the arithmetic ------------------------------------------------------------------


@pytest.mark.parametrize(
    "epochs, examples, per_step, steps",
    [
        (2, 120, 30, 8),  # iris: 2 epochs of 30
        (2, 120, 32, 8),  # 7.5 steps: the last one ends the second epoch
        (1, 120, 128, 1),  # a batch larger than an epoch
        (0.3, 100, 10, 3),  # not 4: 0.3 x 100 / 10 is 3.0000000000000004 in floats
        (0.5, 60_000, 1024, 30),
    ],
)
def test_steps_are_the_ceiling_of_epochs_times_examples_over_examples_per_step(
    epochs, examples, per_step, steps
):
    assert steps_for_epochs(epochs, examples, per_step) == steps


def test_epoch_count_says_where_each_epoch_ends():
    count = EpochCount(examples=120, per_step=25, total=3)  # 4.8 steps per epoch
    assert [count.end_after(step) for step in (0, 4, 5, 9, 10, 14)] == [5, 5, 10, 10, 15, 15]
    assert [count.crossed(step, 1) for step in (4, 5, 6, 10)] == [False, True, False, True]
    assert count.text(6) == "epoch 1.25/3"
    assert EpochCount(120, 30).text(4) == "epoch 1.00"  # counted in steps: no total


# --- steps from the examples -----------------------------------------------------------


def epochs_run(model_dir, command="train", data=None, warmup=0, **flags) -> RunConfig:
    """Iris's config with flags; `data`: a `data` section to add to it."""
    config = config_files.load(config_files.resolve("iris"))
    config.optimizer.warmup_steps = warmup
    if data is not None:
        config = ml_collections.ConfigDict({**config.to_dict(), "data": data})
    return RunConfig(command, "iris", merge_flags(config, flags), model_dir=str(model_dir))


def counted(examples: int) -> Counted:
    return Counted(examples, "counted in the model's train_arrays")


def test_a_tf_data_input_counts_config_data_train_examples(tmp_path):
    run = epochs_run(tmp_path, data={"train_examples": 64}, train_epochs=2, batch_size=32)
    assert run.train_steps == 0  # not known before the examples are counted
    resolved = resolve_length(run)
    assert (resolved.train_steps, resolved.train_examples) == (4, 64)
    assert resolved.config.train.epochs == 2


def test_accumulated_micro_batches_count_in_the_examples_per_step(tmp_path):
    run = epochs_run(tmp_path, train_epochs=2, batch_size=8)
    accumulating = RunConfig(
        "train",
        "iris",
        ml_collections.FrozenConfigDict(
            {**run.config.to_dict(), "train": {**run.config.train.to_dict(), "accumulate_steps": 4}}
        ),
        model_dir=str(tmp_path),
    )
    # One optimizer step takes 4 micro-batches of 8: 32 examples.
    assert resolve_length(accumulating, counted(120)).train_steps == 8


def test_a_recipe_is_checked_against_the_steps_the_epochs_make(tmp_path):
    config = config_files.load(config_files.resolve("iris"))
    config.optimizer.update(
        schedule="piecewise", boundary_epochs=(0.01, 0.02), multipliers=(1.0, 0.1, 0.01)
    )
    run = RunConfig(
        "train", "iris", merge_flags(config, {"train_epochs": 2, "batch_size": 30}), model_dir="m"
    )
    # Both boundaries fall in the first step: boundaries (0, 0).
    said = (
        r"boundaries=\(0, 0\) must be increasing .*; --train_epochs=2 of 120 examples "
        r"\(.*\) at 30 per step is 8 steps"
    )
    with pytest.raises(UsageError, match=said):
        resolve_length(run, counted(120))


@pytest.mark.parametrize(
    "warmup, flags, said",
    [
        (
            {"warmup_epochs": 5.0},
            {"train_steps": 4},
            "config.optimizer.warmup_steps=20 (warmup_epochs=5 at 120 examples / 30 per step) "
            "does not end before the run's train.steps=4: the run ends inside its warmup, its "
            "learning rate short of the peak; to warm up within it, pass "
            "--config.optimizer.warmup_epochs=E with fewer epochs (0 = no warmup).",
        ),
        (
            {"warmup_epochs": 2.0},
            {"train_epochs": 2},
            "config.optimizer.warmup_steps=8 (warmup_epochs=2 at 120 examples / 30 per step) "
            "does not end before the run's train.steps=8",
        ),
        (
            {"warmup_steps": 8},
            {"train_epochs": 2},
            "config.optimizer.warmup_steps=8 does not end before the run's train.steps=8: the "
            "run ends inside its warmup, its learning rate short of the peak; to warm up "
            "within it, pass --config.optimizer.warmup_steps=N with N < 8 (0 = no warmup).",
        ),
        (
            {"warmup_steps": 10_000},
            {"train_steps": 4},
            "config.optimizer.warmup_steps=10000 does not end before the run's train.steps=4",
        ),
    ],
    ids=["epochs_in_a_smoke_run", "epochs_in_epochs", "steps_in_epochs", "steps_in_a_smoke_run"],
)
def test_a_run_shorter_than_its_warmup_runs_with_one_warning(tmp_path, caplog, warmup, flags, said):
    """resnet50's 5 warmup epochs and BERT's 10,000 warmup steps in a smoke run of 4 steps."""
    config = config_files.load(config_files.resolve("iris"))
    config.optimizer.update(warmup)
    run = RunConfig(
        "train", "iris", merge_flags(config, {"batch_size": 30, **flags}), model_dir=str(tmp_path)
    )
    resolved = resolve_length(run, counted(120))
    assert resolved.config.optimizer.warmup_epochs == 0  # said in steps, as the record keeps it
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and warned[0].startswith(said), warned


def test_a_warmup_that_ends_inside_the_run_says_nothing(tmp_path, caplog):
    run = epochs_run(tmp_path, warmup=7, train_epochs=2, batch_size=30)
    assert resolve_length(run, counted(120)).train_steps == 8
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize(
    "keys, said",
    [
        ({"warmup_steps": -1}, "config.optimizer.warmup_steps=-1 must be an integer >= 0"),
        ({"warmup_epochs": -0.5}, "config.optimizer.warmup_epochs=-0.5 must be a number >= 0"),
        ({"warmup_steps": True}, "config.optimizer.warmup_steps=True must be an integer >= 0"),
    ],
    ids=["negative_steps", "negative_epochs", "a_bool"],
)
def test_a_warmup_that_cannot_be_meant_is_still_refused(tmp_path, keys, said):
    config = config_files.load(config_files.resolve("iris"))
    config.optimizer.update(keys)
    with pytest.raises(UsageError, match=re.escape(said)):
        RunConfig("train", "iris", merge_flags(config, {}), model_dir=str(tmp_path))


def test_eval_every_epoch_counts_the_examples_and_keeps_the_steps(tmp_path):
    run = resolve_length(epochs_run(tmp_path, eval_every="epoch"), counted(120))
    assert (run.train_examples, run.train_steps) == (120, 1000)


def test_a_resumed_run_counts_the_examples_its_model_dir_recorded(tmp_path, caplog):
    train_config.write(resolve_length(epochs_run(tmp_path, train_epochs=2), counted(120)))
    assert json.loads((tmp_path / "train_config.json").read_text())["__train_examples__"] == 120
    # The data now hold 150 rows (a moved file of another size): still 120 per epoch.
    run = epochs_run(tmp_path, train_epochs=4, batch_size=30)
    recorded = train_config.recorded_examples(run)
    assert recorded == Counted(120, str(tmp_path / "train_config.json"))
    resumed = resolve_length(run, counted(150), recorded)
    assert (resumed.train_examples, resumed.train_steps) == (120, 16)
    assert any("epochs keep counting 120" in m for m in caplog.messages), caplog.messages


def test_without_examples_to_count_one_line_asks_for_them(tpurun_cli, tmp_path):
    """A tf.data model (no train_arrays) whose config has no data.train_examples."""
    model_dir = tmp_path / "model"
    result = tpurun_cli(
        "train",
        f"--config={FIXTURES / 'batch_split.py'}",
        "--train_epochs=2",
        f"--model_dir={model_dir}",
        cwd=tmp_path,
    )
    assert_fails(
        result,
        USAGE,
        "--train_epochs=2 needs the number of training examples",
        "add `config.data.train_examples = <N>` to the config",
        "or count in --train_steps",
    )
    assert not model_dir.exists()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--train_epochs=2", "--train_steps=8"], "--train_epochs=2 and --train_steps=8 both"),
        (
            ["--config.train.epochs=2", "--train_steps=8"],
            "--config.train.epochs=2 and --train_steps",
        ),
        (["--train_epochs=0.5", "--config.train.steps=8"], "--train_epochs=0.5 and --config.train"),
        (
            ["--train_epochs=-1"],
            "--train_epochs (config.train.epochs)=-1 must be a number of epochs",
        ),
        (["--eval_every=sometimes"], "--eval_every=sometimes must be a number of steps"),
    ],
    ids=["flags", "key_and_flag", "flag_and_key", "negative", "eval_every"],
)
def test_a_length_said_twice_or_nonsense_is_one_line(tpurun_cli, tmp_path, args, said):
    result = tpurun_cli("train", *args, f"--model_dir={tmp_path / 'model'}", cwd=tmp_path)
    assert_fails(result, USAGE, said)
    assert not (tmp_path / "model").exists()


def test_steps_on_the_command_line_replace_a_config_files_epochs(tmp_path):
    config = config_files.load(config_files.resolve("iris"))
    config.train.epochs = 5.0
    flagged = merge_flags(config, {"train_steps": 30})
    assert (flagged.train.steps, flagged.train.epochs) == (30, 0)
    counted = merge_flags(config, {})  # the file's epochs: steps derived when it starts
    assert (counted.train.steps, counted.train.epochs) == (0, 5)


# --- iris, through the CLI -------------------------------------------------------------

COMMON = ("--config=iris", "--use_tpu=false", "--batch_size=30")


def weights(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(model_dir / f"ckpt-{step}"))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if "model" in n}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """(model_dir, stderr) of 2 epochs of 30: from the flag on device data, evaluating every
    epoch; and from the config key through tf.data."""
    root = tmp_path_factory.mktemp("epochs")
    runs = {}
    for name, args in (
        ("flag", ("--train_epochs=2", "--eval_every=epoch")),
        ("key", ("--config.train.epochs=2", "--config.train.device_data=false")),
    ):
        model_dir = root / name
        result = tpurun_in_process("train", *COMMON, *args, f"--model_dir={model_dir}", cwd=root)
        runs[name] = (model_dir, assert_ok(result).stderr)
    return runs


@pytest.mark.parametrize("name", ["flag", "key"])
def test_two_epochs_of_30_iris_examples_are_8_steps(trained, name):
    model_dir, log = trained[name]
    said = (
        "--train_epochs=2: 8 steps (ceil(2 epochs x 120 training examples (counted in the "
        "model's train_arrays) / 30 examples per step))."
    )
    assert said in log
    assert "Training from step 0 to 8 (epoch 0.00 to 2.00)" in log
    assert "step 8/8  epoch 2.00/2  loss" in log
    # The flag's run evaluated (and so saved) the end of the first epoch too.
    saved = ["ckpt-4.index", "ckpt-8.index"] if name == "flag" else ["ckpt-8.index"]
    assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == saved
    recorded = json.loads((model_dir / "train_config.json").read_text())
    assert recorded["__train_examples__"] == 120
    assert (recorded["train"]["epochs"], recorded["train"]["steps"]) == (2, 8)
    if name == "key":
        assert "Training data stays in tf.data" in log


def test_the_flag_on_device_data_and_the_key_through_tf_data_train_alike(trained):
    on_device, through_tf_data = (weights(trained[name][0], 8) for name in ("flag", "key"))
    assert on_device.keys() == through_tf_data.keys() and on_device
    for key, value in on_device.items():
        np.testing.assert_allclose(value, through_tf_data[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_eval_every_epoch_evaluates_at_the_end_of_each_epoch(trained):
    model_dir, log = trained["flag"]
    results = sorted(p.name for p in (model_dir / "eval" / "test").glob("results-*.json"))
    assert results == ["results-4.json", "results-8.json"]
    assert "step 4/8  epoch 1.00/2  loss" in log


def test_a_resumed_run_keeps_counting_in_the_same_steps(trained):
    model_dir, _ = trained["flag"]
    again = assert_ok(
        tpurun_in_process("train", *COMMON, "--train_epochs=2", f"--model_dir={model_dir}")
    )
    assert "Already at step 8 of --train_epochs=2 (8 steps): nothing to train." in again.stderr
    longer = assert_ok(
        tpurun_in_process("train", *COMMON, "--train_epochs=3", f"--model_dir={model_dir}")
    )
    assert "Training from step 8 to 12 (epoch 2.00 to 3.00)" in longer.stderr
    assert "step 12/12  epoch 3.00/3  loss" in longer.stderr
    assert (model_dir / "ckpt-12.index").is_file()


def test_a_smoke_run_inside_the_recipes_warmup_trains_and_says_so(tpurun_cli, tmp_path):
    """As resnet50's 5 warmup epochs in a 4-step smoke run: no warmup_steps was given."""
    result = tpurun_cli(
        "train",
        *COMMON,
        "--train_steps=2",
        "--config.optimizer.warmup_epochs=5",
        f"--model_dir={tmp_path / 'model'}",
        cwd=tmp_path,
    )
    log = assert_ok(result).stderr
    warned = [line for line in log.splitlines() if "warmup" in line]
    assert len(warned) == 1 and warned[0].startswith("W"), warned
    assert warned[0].endswith(
        "config.optimizer.warmup_steps=20 (warmup_epochs=5 at 120 examples / 30 per step) does "
        "not end before the run's train.steps=2: the run ends inside its warmup, its learning "
        "rate short of the peak; to warm up within it, pass --config.optimizer.warmup_epochs=E "
        "with fewer epochs (0 = no warmup)."
    )
    assert (tmp_path / "model" / "ckpt-2.index").exists()


# --- the examples counted in TFRecord files ----------------------------------------------


def write_records(path: Path, sizes: list[int]) -> Path:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for size in sizes:
            writer.write(b"x" * size)
    return path


def test_records_are_counted_by_their_lengths(tmp_path):
    files = [write_records(tmp_path / "a", [0, 5, 300]), write_records(tmp_path / "b", [7] * 9)]
    assert train_count.count_records([str(f) for f in files]) == 12
    assert train_count.count_records([]) == 0


@pytest.mark.parametrize("damage", ["truncated", "gzip", "text", "on_gcs", "too_large"])
def test_records_that_cannot_be_counted_cheaply_are_not(tmp_path, monkeypatch, damage):
    import gzip

    path = write_records(tmp_path / "a", [10, 20])
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "gzip":
        path.write_bytes(gzip.compress(path.read_bytes()))
    elif damage == "text":
        path.write_text("label,pixels\n3,0 0 0\n")
    elif damage == "too_large":
        monkeypatch.setattr(train_count, "COUNT_BYTES", path.stat().st_size - 1)
    name = "gs://bucket/a" if damage == "on_gcs" else str(path)
    assert train_count.count_records([name]) is None


def test_the_step_line_names_where_the_examples_came_from(tmp_path, caplog):
    caplog.set_level("INFO", logger="absl")
    run = epochs_run(tmp_path, data={"train_examples": 64}, train_epochs=2, batch_size=32)
    resolve_length(run)
    said = (
        "--train_epochs=2: 4 steps (ceil(2 epochs x 64 training examples "
        "(config.data.train_examples) / 32 examples per step))."
    )
    assert said in caplog.messages


def test_a_model_whose_data_cannot_be_listed_is_not_counted():
    """No --data_dir yet: the declared examples count, and the input says what is missing
    when it reads (as `tpurun check` lists it among its findings)."""
    from tpurun.errors import UsageError as NoData

    class Unlisted:
        config = config_files.load(config_files.resolve("iris"))

        def train_record_files(self):
            raise NoData("no train data: pass --data_dir")

    assert train_count.counted(Unlisted(), None) is None
