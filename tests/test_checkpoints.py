"""checkpoints: what a resume reads, on small in-process checkpoints."""

from __future__ import annotations

import json

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from tpurun import checkpoints, config_files
from tpurun.errors import UsageError
from tpurun.run_config import RunConfig


def model_and_optimizer(seed: int) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dropout(0.5, seed=seed)(keras.layers.Dense(8)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return model, optimizer


def trainer_checkpoint(model, optimizer) -> tf.train.Checkpoint:
    """As train.Trainer builds it."""
    return tf.train.Checkpoint(
        model=model, optimizer=optimizer, model_variables=list(model.variables)
    )


def test_a_checkpoint_of_tpurun_0_1_without_model_variables_still_restores(tmp_path):
    old_model, old_optimizer = model_and_optimizer(1)
    path = tf.train.Checkpoint(model=old_model, optimizer=old_optimizer).write(
        str(tmp_path / "ckpt-5")
    )
    model, optimizer = model_and_optimizer(2)
    checkpoints._read_whole(trainer_checkpoint(model, optimizer), path)
    for old, new in zip(old_model.trainable_variables, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(old.numpy(), new.numpy())


def test_the_dropout_random_state_is_saved_and_restored(tmp_path):
    model, optimizer = model_and_optimizer(1)
    (state,) = [v for v in model.variables if "seed_generator" in v.path]
    state.assign(state.numpy() + 1000)  # as after many training steps
    path = trainer_checkpoint(model, optimizer).write(str(tmp_path / "ckpt-5"))
    restored_model, restored_optimizer = model_and_optimizer(1)
    checkpoints._read_whole(trainer_checkpoint(restored_model, restored_optimizer), path)
    (restored,) = [v for v in restored_model.variables if "seed_generator" in v.path]
    np.testing.assert_array_equal(restored.numpy(), state.numpy())


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
    checkpoints.write_train_config(iris_run(tmp_path, **trained))
    run = iris_run(tmp_path, **resumed)
    if refused is None:
        checkpoints.check_resume_config(run)
        return
    with pytest.raises(UsageError, match="trained with a different config") as raised:
        checkpoints.check_resume_config(run)
    assert refused in str(raised.value)


def test_a_record_of_an_older_tpurun_resumes_with_the_new_keys_at_their_defaults(tmp_path):
    run = iris_run(tmp_path)
    recorded = run.config.to_dict()
    del recorded["optimizer"]["schedule"], recorded["optimizer"]["clip_norm"]
    del recorded["train"]["ema_decay"]
    (tmp_path / checkpoints.TRAIN_CONFIG).write_text(json.dumps(recorded))
    checkpoints.check_resume_config(run)
    with pytest.raises(UsageError, match="train.ema_decay: 0.0 -> 0.5"):
        checkpoints.check_resume_config(iris_run(tmp_path, train__ema_decay=0.5))
