"""run_config: merging flags into the config and validating a run, without TensorFlow."""

from __future__ import annotations

import json
import platform

import ml_collections
import pytest

from tpurun import __version__, config_defaults
from tpurun.errors import EXIT_USAGE, UsageError
from tpurun.run_config import RunConfig, aligned_to_loop, check_divisible, config_files, merge_flags


@pytest.mark.parametrize("batch_size, replicas", [(96, 8), (8, 8), (7, 1), (1024, 32)], ids=str)
def test_check_divisible_accepts_multiples(batch_size, replicas):
    assert check_divisible("--batch_size", batch_size, replicas) is None


@pytest.mark.parametrize(
    "batch_size, replicas, suggestion",
    [(100, 8, "(e.g. 96 or 104)"), (4, 8, "(e.g. 8)"), (33, 2, "(e.g. 32 or 34)")],
    ids=["between_multiples", "below_the_replicas", "odd_for_two"],
)
def test_check_divisible_suggests_the_nearest_multiples(batch_size, replicas, suggestion):
    with pytest.raises(UsageError) as raised:
        check_divisible("--eval_batch_size", batch_size, replicas)
    message = str(raised.value)
    assert message.startswith(f"--eval_batch_size={batch_size} is not divisible by the {replicas}")
    assert f"use a multiple of {replicas} {suggestion}" in message
    assert raised.value.exit_code == EXIT_USAGE == 2


@pytest.mark.parametrize(
    "steps, iterations, expected",
    [(0, 100, 0), (-5, 10, 0), (500, 100, 500), (501, 100, 600), (1, 100, 100), (7, 1, 7)],
)
def test_aligned_to_loop_rounds_up_to_whole_loops(steps, iterations, expected):
    assert aligned_to_loop(steps, iterations) == expected


@pytest.fixture
def iris_config() -> ml_collections.ConfigDict:
    return config_files.load(config_files.resolve("iris"))


def test_merge_flags_flag_beats_config(iris_config):
    merged = merge_flags(
        iris_config,
        {"batch_size": 64, "train_steps": 7, "iterations": 3, "seed": 42, "input": "rows.csv"},
    )
    assert merged.train.batch_size == 64
    assert merged.train.steps == 7
    assert merged.train.iterations == 3
    assert merged.seed == 42
    assert merged.predict.input == "rows.csv"


def test_merge_flags_none_keeps_the_config_value(iris_config):
    merged = merge_flags(iris_config, {"batch_size": None, "eval_steps": None, "output": None})
    assert merged.train.batch_size == iris_config.train.batch_size == 32
    assert merged.eval.steps == 0
    assert merged.predict.output == ""


def test_merge_flags_zero_is_a_value_not_unset(iris_config):
    assert merge_flags(iris_config, {"eval_steps": 0, "train_steps": 0}).train.steps == 0


def test_merge_flags_freezes_a_copy(iris_config):
    merged = merge_flags(iris_config, {"batch_size": 64})
    assert isinstance(merged, ml_collections.FrozenConfigDict)
    assert iris_config.train.batch_size == 32, "the caller's config must stay as it was"
    with pytest.raises((AttributeError, ValueError)):
        merged.train.batch_size = 8


def test_merge_flags_rejects_a_flag_whose_key_the_config_lacks():
    config = config_defaults.base_config(model="iris")
    del config.predict["input"]
    with pytest.raises(UsageError, match=r"--input sets config key predict.input.*base_config\(\)"):
        merge_flags(config, {"input": "rows.csv"})


def make_run(config: ml_collections.ConfigDict | None = None, **fields) -> RunConfig:
    if config is None:
        config = config_files.load(config_files.resolve("iris"))
    flags = {
        k: fields.pop(k)
        for k in list(fields)
        if k
        in (
            "batch_size",
            "train_steps",
            "eval_steps",
            "iterations",
            "eval_batch_size",
            "predict_batch_size",
        )
    }
    fields.setdefault("model_dir", "/tmp/unused-model-dir")
    return RunConfig(
        command="train", config_name="iris", config=merge_flags(config, flags), **fields
    )


def test_valid_run_exposes_the_tpuestimator_names():
    run = make_run(batch_size=64, num_shards=8, iterations=50)
    assert (run.train_batch_size, run.eval_batch_size, run.predict_batch_size) == (64, 32, 8)
    assert (run.iterations, run.train_steps, run.seed) == (50, 1000, 0)


def test_record_is_json_with_the_run_and_versions():
    record = json.loads(make_run(train_steps=20).record(tf_version="2.99.0"))
    assert record["run_config"]["config"]["train"]["steps"] == 20
    assert record["run_config"]["model_dir"] == "/tmp/unused-model-dir"
    assert record["versions"] == {
        "tpurun": __version__,
        "tensorflow": "2.99.0",
        "python": platform.python_version(),
    }
    assert record["started_utc"].endswith("+00:00")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"batch_size": 0}, "--batch_size (config.train.batch_size)=0 must be a positive integer"),
        ({"eval_batch_size": -8}, "--eval_batch_size (config.eval.batch_size)=-8 must be"),
        ({"predict_batch_size": 0}, "--predict_batch_size (config.predict.batch_size)=0 must"),
        ({"iterations": 0}, "--iterations (config.train.iterations)=0 must be a positive"),
        ({"train_steps": -1}, "--train_steps (config.train.steps)=-1 must be >= 0"),
        (
            {"eval_steps": -1},
            "--eval_steps (config.eval.steps)=-1 must be >= 0 (0 = one exact pass)",
        ),
        ({"num_shards": 0}, "--num_shards=0 must be a positive integer"),
        ({"num_shards": 8, "batch_size": 100}, "--batch_size=100 is not divisible by the 8"),
        ({"num_shards": 8, "eval_batch_size": 12}, "--eval_batch_size=12 is not divisible"),
        ({"num_shards": 3}, "--batch_size=32 is not divisible by the 3 replicas"),
        ({"use_tpu": False, "tpu": "grpc://10.0.0.2:8470"}, "contradicts --use_tpu=false"),
        ({"tpu": "my-tpu"}, "--tpu=my-tpu is a TPU name: pass --tpu_zone and --gcp_project"),
        ({"tpu": "my-tpu", "gcp_project": "p"}, "--tpu=my-tpu is a TPU name"),
        ({"model_dir": ""}, "--model_dir must not be empty"),
    ],
    ids=[
        "zero_batch",
        "negative_eval_batch",
        "zero_predict_batch",
        "zero_iterations",
        "negative_train_steps",
        "negative_eval_steps",
        "zero_shards",
        "train_batch_indivisible",
        "eval_batch_indivisible",
        "default_batch_indivisible",
        "tpu_and_use_tpu_false",
        "tpu_name_alone",
        "tpu_name_without_zone",
        "empty_model_dir",
    ],
)
def test_run_config_rejects(fields, message):
    with pytest.raises(UsageError) as raised:
        make_run(**fields)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "tpu, extra",
    [
        ("local", {}),
        ("grpc://10.0.0.2:8470", {}),
        ("my-tpu", {"tpu_zone": "us-central1-b", "gcp_project": "my-project"}),
    ],
    ids=["local", "grpc_address", "name_with_zone_and_project"],
)
def test_run_config_accepts_a_complete_tpu_address(tpu, extra):
    assert make_run(tpu=tpu, **extra).tpu == tpu


@pytest.mark.parametrize(
    "key, message",
    [
        (
            "train.save_checkpoints_steps",
            r"save_checkpoints_steps \(config.train.save_checkpoints_steps\)=-1 must be an "
            "integer >= 0",
        ),
        (
            "train.save_checkpoints_secs",
            r"save_checkpoints_secs \(config.train.save_checkpoints_secs\)=-1 must be an "
            "integer >= 0",
        ),
        ("train.eval_every", r"--eval_every \(config.train.eval_every\)=-1 must be"),
        (
            "train.keep_checkpoint_max",
            r"\(config.train.keep_checkpoint_max\)=-1 must be a positive",
        ),
        (
            "train.summary_upload_secs",
            r"^config.train.summary_upload_secs=-1 must be a number of seconds >= 0",
        ),
    ],
)
def test_run_config_rejects_negative_config_values(key, message):
    config = config_files.load(config_files.resolve("iris"))
    section, leaf = key.split(".")
    config[section][leaf] = -1
    with pytest.raises(UsageError, match=message):
        make_run(config)


def test_run_config_names_a_missing_standard_key():
    config = config_defaults.base_config(model="iris")
    del config.optimizer["learning_rate"]
    with pytest.raises(UsageError) as raised:
        make_run(config)
    assert "has no key optimizer.learning_rate" in str(raised.value)
    assert "tpurun.config_defaults.base_config()" in str(raised.value)


def test_run_config_is_frozen():
    run = make_run()
    with pytest.raises(AttributeError):
        run.model_dir = "/elsewhere"  # type: ignore[misc]


def test_run_config_rejects_a_bad_best_mode_and_profile_range():
    config = config_files.load(config_files.resolve("iris"))
    config.eval.best_mode = "highest"
    with pytest.raises(UsageError, match="best_mode='highest' must be 'min' or 'max'"):
        make_run(config)
    with pytest.raises(UsageError, match="--profile_steps=20,10 must be START,END"):
        make_run(profile_steps=(20, 10))
    with pytest.raises(UsageError, match="--hang_timeout=-1 must be"):
        make_run(hang_timeout=-1)


@pytest.mark.parametrize(
    "key, allowed",
    [
        ("device_data", "true or false"),
        ("xla", "true, false or 'auto'"),  # "auto": the faster loop, timed
        ("deterministic", "true, false or 'auto'"),  # "auto": by the platform
        ("async_checkpoint", "true or false"),
    ],
)
def test_run_config_takes_only_a_bool_for_the_switches(key, allowed):
    config = config_files.load(config_files.resolve("iris"))
    del config.train[key]  # a config file that sets its own value, of the wrong type
    config.train[key] = "yes"
    with pytest.raises(UsageError, match=rf"^config.train.{key}='yes' must be {allowed}$"):
        make_run(config)
