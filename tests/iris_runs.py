"""Iris run configs and checkpoints for the unit tests of the runners (evaluate, predict, export)."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import create
from tpurun.run_config import RunConfig, config_files, merge_flags


def iris_run(
    model_dir: Path | str, command: str = "train", *, fields=None, overrides=None, **flags
) -> RunConfig:
    """The RunConfig of `tpurun <command> --config=iris --<flag>=<value>...`.

    `overrides`: {"train.warm_start_vars": ...} as `--config.<key>=<value>` sets them;
    `fields`: the RunConfig's own (force_resume, export_dir, ...).
    """
    config = config_files.load(config_files.resolve("iris"))
    for key, value in (overrides or {}).items():
        section, _, leaf = key.rpartition(".")
        (config if not section else config.get(section))[leaf] = value
    config = merge_flags(config, flags)
    return RunConfig(command, "iris", config, model_dir=str(model_dir), **(fields or {}))


def iris_checkpoint(model_dir: Path, step: int = 7, seed: int = 1) -> str:
    """ckpt-<step> of a randomly initialised Iris model, holding `model` as training's does."""
    keras.utils.set_random_seed(seed)
    keras_model = create(iris_run(model_dir).config).build()
    return tf.train.Checkpoint(model=keras_model).write(str(model_dir / f"ckpt-{step}"))


def restored_iris(path: str) -> keras.Model:
    """A fresh Iris keras model with the checkpoint's weights."""
    keras_model = create(iris_run("/unused").config).build()
    tf.train.Checkpoint(model=keras_model).read(path).expect_partial()
    return keras_model


def feature_columns(rows: dict[str, np.ndarray]) -> dict[str, tf.Tensor]:
    return {name: tf.constant(values, tf.float32) for name, values in rows.items()}
