"""--warm_start_from: a new run's weights taken from another run's checkpoint."""

from __future__ import annotations

import re

import keras
import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.errors import RunError, UsageError
from tpurun.errors.tf_errors import one_line
from tpurun.layout import names
from tpurun.model import Model, build_keras_model
from tpurun.run_config import RunConfig
from tpurun.storage import checkpoints

# What reading a checkpoint that does not fit (or is damaged) raises.
DAMAGE_ERRORS = (tf.errors.OpError, ValueError, AssertionError)


def warm_start(model: Model, keras_model: keras.Model, run: RunConfig) -> None:
    """Copies the variables matching train.warm_start_vars from another run's checkpoint.

    The checkpoint is read into a second copy of this config's model, so a
    variable is found by its place in the model, as a restore would; only the
    model's weights are taken (no optimizer state, no step). A model that builds
    several (a GAN) warm-starts its serving model.
    """
    source = run.config.train.warm_start_from
    path = source
    if storage.isdir(source):
        path = checkpoints.latest(source)
        if path is None:
            raise UsageError(f"--warm_start_from={source} holds no checkpoint; pass a ckpt-N path")
    elif not tf.io.gfile.exists(names.index_file(path)):
        raise UsageError(
            f"--warm_start_from={source} is neither a model_dir nor a checkpoint (no "
            f"{names.index_file(path)})"
        )
    pattern_text = run.config.train.warm_start_vars
    try:
        pattern = re.compile(pattern_text)
    except re.error as e:
        raise UsageError(
            f"config.train.warm_start_vars={pattern_text!r} is not a regex: {e}"
        ) from None
    source_model = build_keras_model(model)  # the serving model (with several, it alone)
    for variable in source_model.variables:
        # NaN until restored: a selected variable the checkpoint has no value for
        # must fail, not be copied over as the source model's random init.
        if tf.as_dtype(variable.dtype).is_floating:
            variable.assign(tf.fill(tf.shape(variable), float("nan")))
    try:
        tf.train.Checkpoint(model=source_model).read(path).expect_partial()
    except DAMAGE_ERRORS as e:
        reason = one_line(e, 300)
        raise RunError(
            f"cannot warm-start from {path}: it does not fit the model of this config ({reason})"
        ) from None
    taken = []
    missing = []
    for target, value in zip(keras_model.variables, source_model.variables, strict=True):
        if pattern.search(target.path) and tf.as_dtype(value.dtype).is_floating:
            if not bool(tf.reduce_all(tf.math.is_finite(value))):
                missing.append(target.path)
                continue
            if tuple(target.shape) != tuple(value.shape):
                raise RunError(
                    f"cannot warm-start {target.path}: shape {tuple(target.shape)} here, "
                    f"{tuple(value.shape)} in {path}; exclude it with config.train.warm_start_vars"
                )
            target.assign(value)
            taken.append(target.path)
    if missing:
        raise UsageError(
            f"--warm_start_from={source}: {path} has no value for {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''} (is it a tpurun checkpoint of this model?); "
            "leave them out with config.train.warm_start_vars"
        )
    if not taken:
        raise UsageError(
            f"config.train.warm_start_vars={pattern_text!r} matches none of the model's "
            f"variables ({', '.join(v.path for v in keras_model.variables[:6])}, ...)"
        )
    logging.info(
        "Warm-started %d of %d variables from %s; training starts at step 0.",
        len(taken),
        len(keras_model.variables),
        path,
    )
