"""train_config: what a resumed run may change, from the config its checkpoints were trained with."""

from __future__ import annotations

import json

import ml_collections
import pytest

from tpurun import config_files, train_config
from tpurun.errors import UsageError
from tpurun.run_config import RunConfig


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
    (tmp_path / train_config.FILE).write_text(json.dumps(recorded))
    train_config.check_resume(run)
    with pytest.raises(UsageError, match="train.ema_decay: 0.0 -> 0.5"):
        train_config.check_resume(iris_run(tmp_path, train__ema_decay=0.5))
