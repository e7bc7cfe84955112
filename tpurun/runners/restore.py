"""A checkpoint's trained weights into a built model, for eval, predict and export.

The weights a command serves are the trained ones or, when the config keeps them
(config.train.ema_decay), their moving averages; a checkpoint that does not fit the
model built from this config is refused in one line. Resuming a training run is
`tpurun.storage.checkpoints.restore_newest_intact`'s (the whole TrainState).
"""

from __future__ import annotations

import logging as std_logging
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tpurun import optimization
from tpurun.errors import CheckpointMismatch
from tpurun.errors.tf_errors import one_line
from tpurun.foreign.outside import Outside
from tpurun.model import OPTIMIZER, Model
from tpurun.storage import checkpoints
from tpurun.storage.checkpoints import CheckpointGone


def averages_of(
    model: Model, models: dict[str, keras.Model], config: Any
) -> optimization.MovingAverages | None:
    """What eval, predict and export read besides the weights: the moving averages when the
    config keeps them (config.train.ema_decay), said in the command's first line; else None.

    They average the serving model's weights, kept by its optimizer: config.optimizer's,
    or the one of config.optimizers named after the serving model. Call it in the
    strategy scope `models` (`build_models`) were built in.
    """
    if not config.train.ema_decay:
        return None
    name = model.serving_model if config.get("optimizers") else None
    logging.info(
        "Using the moving averages of the weights%s (config.train.ema_decay=%g), not the raw "
        "weights.",
        f" of {model.serving_model}" if len(models) > 1 else "",
        config.train.ema_decay,
    )
    variables = model.optimized_variables(models)[name or OPTIMIZER]
    return optimization.MovingAverages(variables, config, name)


# What eval, predict and export read: a checkpoint of model_dir (its path), or one
# --checkpoint=PATH gave from outside it.
Chosen = str | Outside


def step_of(checkpoint: Chosen) -> int:
    """The step a checkpoint's results are reported at: ckpt-N's N, an outside one's global_step."""
    return checkpoint.step if isinstance(checkpoint, Outside) else checkpoints.step_of(checkpoint)


def restore_weights(
    models: dict[str, keras.Model],
    path: Chosen,
    averages: optimization.MovingAverages | None,
    serving_model: str = "",
) -> None:
    """The weights eval, predict and export use (`averages_of`): the moving averages or the
    trained weights, of `models` (`build_models`: one, or several by name). A checkpoint
    from outside (--checkpoint=PATH) that tpurun did not write fills the serving model
    through its plan (tpurun.foreign: no moving averages); tpurun's own is read as
    model_dir's are."""
    if isinstance(path, Outside):
        if path.planned:
            path.fill(models, serving_model or next(iter(models)))
            if averages is not None:
                logging.info(
                    "%s keeps no moving averages: its weights are used.", path.source.prefix
                )
            return
        path = path.source.prefix
    if len(models) == 1:
        restore_model(next(iter(models.values())), path)
    else:
        _restore(tf.train.Checkpoint(models=models), path)
    if averages is not None:
        averages.load(path)


def restore_model(keras_model: keras.Model, path: str) -> None:
    """Loads the model's weights (not the optimizer's) from a training checkpoint (the
    serving model's, with several)."""
    _restore(tf.train.Checkpoint(model=keras_model), path)


def _restore(checkpoint: tf.train.Checkpoint, path: str) -> None:
    try:
        status = checkpoint.read(path)
        status.expect_partial().assert_existing_objects_matched()
    except tf.errors.NotFoundError as e:
        raise CheckpointGone(f"checkpoint {path} is gone ({one_line(e, 200)})") from None
    except (AssertionError, ValueError) as e:
        # A variable of another shape (ValueError: "Received incompatible tensor with
        # shape ..."), or one the checkpoint does not have (AssertionError).
        _quiet_echoes()
        raise mismatch(path, e) from None


def mismatch(path: str, error: BaseException) -> CheckpointMismatch:
    """The one line for checkpoint `path` not fitting the model built to read it."""
    reason = one_line(error, 300)
    return CheckpointMismatch(
        f"checkpoint {path} does not fit the model built to read it ({reason}); build it as "
        "it was trained (model_dir/train_config.json holds that config: was the model's code "
        "changed since?)",
        reason,
    )


# What TensorFlow logs when a checkpoint object whose restore failed is deleted: a line per
# value of the file it did not read (40 for a small model), after the one line that said
# the checkpoint does not fit.
_ECHOES = (
    "Detecting that an object or model or tf.train.Checkpoint is being deleted with "
    "unrestored values",
    "Value in checkpoint could not be found in the restored object",
)


class _FailedRestoreEchoes(std_logging.Filter):
    def filter(self, record: std_logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_ECHOES)


def _quiet_echoes() -> None:
    """Drops those lines from now on (the command is ending on the mismatch): once."""
    logger = tf.get_logger()
    if not any(isinstance(f, _FailedRestoreEchoes) for f in logger.filters):
        logger.addFilter(_FailedRestoreEchoes())
