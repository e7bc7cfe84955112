"""checkpoints: what a resume reads, on small in-process checkpoints."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from tpurun.storage import checkpoints


def model_and_optimizer(seed: int) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dropout(0.5, seed=seed)(keras.layers.Dense(8)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return model, optimizer


def trainer_checkpoint(model, optimizer) -> Callable[..., tf.train.Checkpoint]:
    """As the Trainer makes one (`TrainState.checkpoint`): with the parts a file has."""

    def make(present=None) -> tf.train.Checkpoint:
        parts = {"model": model, "optimizer": optimizer, "model_variables": list(model.variables)}
        if present is not None:
            parts = {k: v for k, v in parts.items() if k in present or k in ("model", "optimizer")}
        return tf.train.Checkpoint(**parts)

    return make


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
    path = trainer_checkpoint(model, optimizer)().write(str(tmp_path / "ckpt-5"))
    restored_model, restored_optimizer = model_and_optimizer(1)
    checkpoints._read_whole(trainer_checkpoint(restored_model, restored_optimizer), path)
    (restored,) = [v for v in restored_model.variables if "seed_generator" in v.path]
    np.testing.assert_array_equal(restored.numpy(), state.numpy())
