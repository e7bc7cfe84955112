"""Checkpoints in model_dir: `ckpt-<step>` files written by tf.train.CheckpointManager."""

from __future__ import annotations

import re

import keras
import tensorflow as tf

from tpurun.errors import RunError
from tpurun.run_config import RunConfig


def manager(
    run: RunConfig,
    keras_model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    directory: str | None = None,
) -> tf.train.CheckpointManager:
    """Writes ckpt-<step> to `directory` (default: model_dir)."""
    checkpoint = tf.train.Checkpoint(model=keras_model, optimizer=optimizer)
    return tf.train.CheckpointManager(
        checkpoint, directory or run.model_dir, max_to_keep=run.config.train.keep_checkpoint_max
    )


def scratch_dir(run: RunConfig, task: str) -> str:
    """Where a non-chief worker writes its copy of a checkpoint, deleted right after.

    Every worker of a MultiWorkerMirroredStrategy must take part in a save, but
    only the chief's copy is kept.
    """
    return tf.io.gfile.join(run.model_dir, ".scratch", task)


def latest(model_dir: str) -> str | None:
    return tf.train.latest_checkpoint(model_dir)


def require_latest(run: RunConfig) -> str:
    """The newest checkpoint, or a RunError saying how to make one."""
    path = latest(run.model_dir) if tf.io.gfile.isdir(run.model_dir) else None
    if path is None:
        raise RunError(
            f"no checkpoint in {run.model_dir}; train first "
            f"(tpurun train --config={run.config_name} --model_dir={run.model_dir}) "
            "or point --model_dir at a trained run"
        )
    return path


def step_of(path: str) -> int:
    match = re.search(r"ckpt-(\d+)$", path)
    if not match:
        raise RunError(f"checkpoint {path} is not named ckpt-<step>; was it written by tpurun?")
    return int(match.group(1))


def restore_model(keras_model: keras.Model, path: str) -> None:
    """Loads the model's weights (not the optimizer's) from a training checkpoint."""
    status = tf.train.Checkpoint(model=keras_model).read(path)
    try:
        status.expect_partial().assert_existing_objects_matched()
    except AssertionError as e:
        raise RunError(
            f"checkpoint {path} does not match the model built from this config "
            f"({' '.join(str(e).split())[:300]}); use the config it was trained with"
        ) from None
