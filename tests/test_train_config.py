"""train_config: what a resumed run may change, from the config its checkpoints were trained with."""

from __future__ import annotations

import dataclasses
import json

import ml_collections
import pytest
from iris_runs import iris_run as run_with_flags

from tpurun import config_defaults
from tpurun.errors import RunError, UsageError
from tpurun.layout import names
from tpurun.run_config import RunConfig, config_files
from tpurun.run_config.keys import trained_keys
from tpurun.storage import train_config


def iris_run(model_dir, **keys) -> RunConfig:
    """An iris train run; keys: section__leaf (optimizer__schedule) and their values."""
    config = config_files.load(config_files.resolve("iris"))
    for key, value in keys.items():
        section, leaf = key.split("__")
        config[section][leaf] = value
    frozen = ml_collections.FrozenConfigDict(config)
    return RunConfig(command="train", config_name="iris", config=frozen, model_dir=str(model_dir))


COSINE = {"optimizer__schedule": "cosine"}


@pytest.mark.parametrize(
    "trained, resumed, refused",
    [
        ({}, {"optimizer__learning_rate": 0.5}, None),
        (
            {"optimizer__warmup_steps": 10},
            {"optimizer__warmup_steps": 10, "optimizer__learning_rate": 0.5},
            None,
        ),
        ({}, {"train__steps": 5000}, None),
        (
            COSINE,
            {**COSINE, "optimizer__learning_rate": 0.5},
            "optimizer.learning_rate: 0.1 -> 0.5",
        ),
        (COSINE, {**COSINE, "train__steps": 5000}, "train.steps: 1000 -> 5000"),
        ({}, COSINE, "optimizer.schedule: 'constant' -> 'cosine'"),
        ({}, {"optimizer__warmup_steps": 10}, "optimizer.warmup_steps: 0 -> 10"),
        ({}, {"train__ema_decay": 0.99}, "train.ema_decay: 0.0 -> 0.99"),
        ({}, {"optimizer__clip_norm": 1.0}, "optimizer.clip_norm: 0.0 -> 1.0"),
    ],
    ids=[
        "constant_rate",
        "constant_rate_with_warmup",
        "steps_of_a_constant_rate",
        "rate_of_a_schedule",
        "steps_of_a_schedule_ending_there",
        "schedule",
        "warmup",
        "ema",
        "clipping",
    ],
)
def test_what_a_resume_may_change_depends_on_the_schedule(tmp_path, trained, resumed, refused):
    train_config.write(iris_run(tmp_path, **trained))
    run = iris_run(tmp_path, **resumed)
    if refused is None:
        train_config.check_resume(run)
        return
    with pytest.raises(UsageError, match="trained with a different config") as raised:
        train_config.check_resume(run)
    assert refused in str(raised.value)


def test_a_record_of_an_older_tpurun_resumes_with_the_new_keys_at_their_defaults(tmp_path):
    run = iris_run(tmp_path)
    recorded = run.config.to_dict()
    del recorded["optimizer"]["schedule"], recorded["optimizer"]["clip_norm"]
    del recorded["train"]["ema_decay"]
    (tmp_path / names.TRAIN_CONFIG).write_text(json.dumps(recorded))
    train_config.check_resume(run)
    with pytest.raises(UsageError, match="train.ema_decay: 0.0 -> 0.5"):
        train_config.check_resume(iris_run(tmp_path, train__ema_decay=0.5))


# --- the record, and a resume's changes given as flags ------------------------------


def recorded(model_dir, **flags) -> None:
    train_config.write(run_with_flags(model_dir, **flags))


def test_write_records_the_config_name_and_the_config(tmp_path):
    recorded(tmp_path, batch_size=16)
    name, config = train_config.read(run_with_flags(tmp_path))
    assert name == "iris"
    written = run_with_flags(tmp_path, batch_size=16).config.to_dict()
    assert config == json.loads(json.dumps(written))  # as JSON has it: tuples become lists
    assert config["train"]["batch_size"] == 16


@pytest.mark.parametrize(
    "flags",
    [
        {"train_steps": 5000, "iterations": 7, "save_checkpoints_steps": 10},
        {"keep_checkpoint_max": 1, "eval_every": 100, "eval_batch_size": 8, "eval_steps": 3},
        {"predict_batch_size": 1, "save_checkpoints_secs": 5},
    ],
    ids=["how_long_and_how_often", "retention_and_eval", "predict_and_time"],
)
def test_what_a_resumed_run_may_change(tmp_path, flags):
    recorded(tmp_path)
    train_config.check_resume(run_with_flags(tmp_path, **flags))


def test_a_changed_data_location_may_resume(tmp_path):
    recorded(tmp_path)
    run = run_with_flags(tmp_path)
    config = run.config.to_dict()
    config["data"]["train_path"] = "gs://moved/iris_training.csv"
    train_config.check_resume(
        dataclasses.replace(run, config=ml_collections.FrozenConfigDict(config))
    )


@pytest.mark.parametrize(
    "flags, difference",
    [
        ({"batch_size": 16}, "train.batch_size: 32 -> 16"),
        ({"seed": 3}, "seed: 0 -> 3"),
    ],
    ids=["batch", "seed"],
)
def test_a_changed_model_batch_or_seed_is_refused_with_the_difference(tmp_path, flags, difference):
    recorded(tmp_path)
    with pytest.raises(UsageError) as raised:
        train_config.check_resume(run_with_flags(tmp_path, **flags))
    message = str(raised.value)
    assert message == (
        f"the checkpoints in {tmp_path} were trained with a different config: {difference}. "
        "Use a new --model_dir (or --warm_start_from to start from these weights), or pass "
        "--force_resume to continue anyway"
    )


def test_force_resume_goes_on_with_a_warning(tmp_path, caplog):
    recorded(tmp_path)
    train_config.check_resume(
        run_with_flags(tmp_path, batch_size=16, fields={"force_resume": True})
    )
    assert caplog.messages == [
        "Resuming with a changed config (--force_resume): train.batch_size: 32 -> 16."
    ]


def test_no_record_nothing_to_compare(tmp_path):
    assert train_config.read(run_with_flags(tmp_path)) is None
    train_config.check_resume(run_with_flags(tmp_path, batch_size=16))


def test_a_record_of_tpurun_0_2_is_the_config_alone(tmp_path):
    run = run_with_flags(tmp_path)
    (tmp_path / "train_config.json").write_text(json.dumps(run.config.to_dict(), default=str))
    name, config = train_config.read(run)
    assert name is None and config["model"] == "iris"
    with pytest.raises(UsageError, match="train.batch_size: 32 -> 16"):
        train_config.check_resume(run_with_flags(tmp_path, batch_size=16))


def test_a_model_dir_of_another_model_is_named(tmp_path):
    mnist = config_files.load(config_files.resolve("mnist"))
    train_config.write(
        RunConfig("train", "mnist", ml_collections.FrozenConfigDict(mnist), str(tmp_path))
    )
    with pytest.raises(UsageError) as raised:
        train_config.check_same_model(run_with_flags(tmp_path))
    assert str(raised.value) == (
        f"{tmp_path} was trained with --config=mnist (model mnist), but this is --config=iris "
        "(model iris): pass --config=mnist, or the --model_dir of a iris run"
    )


@pytest.mark.parametrize("text", ['{"config": ', "[1, 2]"], ids=["truncated", "not_an_object"])
def test_a_damaged_record_is_one_error_unless_force_resume(tmp_path, caplog, text):
    (tmp_path / "train_config.json").write_text(text)
    with pytest.raises(RunError, match=r"train_config.json .*--force_resume to go on"):
        train_config.read(run_with_flags(tmp_path))
    assert train_config.read(run_with_flags(tmp_path, fields={"force_resume": True})) is None
    assert "going on without comparing configs" in caplog.messages[-1]


# --- eval, predict and export build the trained model (run_config/keys/trained_keys.py) ----------


def serving_run(model_dir, command="predict", given=(), **keys) -> RunConfig:
    """An iris run of `command`, its config file's keys changed by `keys` (section__leaf, or a
    top-level key), `given`: the keys the command line set."""
    config = config_files.load(config_files.resolve("iris"))
    for key, value in keys.items():
        section, _, leaf = key.rpartition("__")
        (config[section] if section else config)[leaf] = value
    return RunConfig(
        command=command,
        config_name="iris",
        config=ml_collections.FrozenConfigDict(config),
        model_dir=str(model_dir),
        given_keys=tuple(given),
    )


def trained_with(model_dir, **keys) -> None:
    train_config.write(dataclasses.replace(serving_run(model_dir, **keys), command="train"))


def test_the_trained_model_keys_replace_the_config_files(tmp_path, caplog):
    caplog.set_level("INFO")
    caplog.set_level("INFO", logger="absl")  # whatever an earlier run of this process set
    trained_with(
        tmp_path,
        hidden_units=(20, 20),
        precision="mixed_bfloat16",
        optimizer__name="sgd",
        train__ema_decay=0.5,
        train__batch_size=64,
        data__train_path="/trained/train.csv",
        eval__batch_size=8,
        seed=3,
    )
    run, overridden = train_config.for_serving(serving_run(tmp_path))
    config = run.config
    # The model the checkpoint holds: its keys, precision, recipe and averages.
    assert config.hidden_units == (20, 20) and config.precision == "mixed_bfloat16"
    assert config.optimizer.name == "sgd" and config.train.ema_decay == 0.5
    # How this command runs: the config file's (its batch, seed, data, eval keys).
    assert config.train.batch_size == 32 and config.seed == 0
    assert config.data.train_path == "" and config.eval.batch_size == 32
    assert overridden == ()
    assert caplog.messages == [
        f"The model as trained ({tmp_path}/train_config.json): hidden_units=(20, 20) (the config "
        "file: (10, 10)), optimizer.name='sgd' (the config file: 'adagrad'), "
        "precision='mixed_bfloat16' (the config file: 'float32'), train.ema_decay=0.5 (the "
        "config file: 0.0); --config.<key>=<value> overrides one."
    ]


def test_what_the_command_line_gives_wins_and_is_said(tmp_path, caplog):
    caplog.set_level("INFO")
    caplog.set_level("INFO", logger="absl")  # whatever an earlier run of this process set
    trained_with(tmp_path, hidden_units=(20, 20), n_classes=3)
    given = ("hidden_units", "precision")
    run, overridden = train_config.for_serving(
        serving_run(tmp_path, given=given, hidden_units=(8,), precision="mixed_bfloat16")
    )
    assert run.config.hidden_units == (8,) and run.config.precision == "mixed_bfloat16"
    assert [(d.key, d.trained, d.now) for d in overridden] == [
        ("hidden_units", [20, 20], [8]),
        ("precision", "float32", "mixed_bfloat16"),
    ]
    assert caplog.messages == [
        "Overriding the config the checkpoints were trained with: hidden_units=(20, 20) "
        "(given: (8,)), precision='float32' (given: 'mixed_bfloat16')."
    ]
    line = trained_keys.conflict(str(tmp_path), overridden[:1], "Received incompatible tensor")
    assert line == (
        f"the checkpoint in {tmp_path} does not fit the model this command line builds "
        "(--config.hidden_units=(8,), trained with (20, 20)): Received incompatible tensor. Drop "
        f"the override (eval, predict and export build the model {tmp_path}/train_config.json "
        "records), or train a model_dir with it"
    )
    assert trained_keys.conflict(str(tmp_path), (), "why") is None


def test_named_recipes_are_taken_whole(tmp_path):
    """The averages are read through the optimizer that kept them: a recipe of another name
    in the config file would not find them."""
    config = config_files.load(config_files.resolve("iris"))
    config.optimizer = config_defaults.optimizer_recipe()  # at its defaults, with named ones
    config.optimizers.critic = config_defaults.optimizer_recipe(learning_rate=1e-4)
    config.optimizers.generator = config_defaults.optimizer_recipe(name="sgd")
    gan = config.optimizers.to_dict()
    train_config.write(
        RunConfig("train", "iris", ml_collections.FrozenConfigDict(config), str(tmp_path))
    )
    other = serving_run(tmp_path)  # the config file names none
    run, _ = train_config.for_serving(other)
    assert run.config.optimizers.to_dict() == gan


def test_without_a_record_the_config_is_as_given(tmp_path):
    run = serving_run(tmp_path, hidden_units=(5,))
    assert train_config.for_serving(run) == (run, ())
