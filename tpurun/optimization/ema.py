"""The moving averages of the weights (config.train.ema_decay): read, swapped in, restored.

`use_ema=True, ema_momentum=d` keeps one average per trainable variable, created by
`build` as ordinary optimizer variables (`optimizer/_variables/<i>` in a
tf.train.Checkpoint, so saved and restored with the optimizer), updated after each
step: the first step copies the weights, then average = d x average + (1 - d) x
weights. With `ema_overwrite_frequency=None` the weights are never replaced during
training; `finalize_variable_values` would overwrite them for good, so tpurun uses
`swap_in_ema` (in-process) and `restore_ema_weights` (an evaluator that restores a
checkpoint) instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tpurun.errors import CheckpointMismatch, RunError
from tpurun.errors.tf_errors import one_line
from tpurun.optimization.building import build_optimizer
from tpurun.optimization.keras_private import AVERAGES, BUILT_ON


def ema_pairs(optimizer: keras.optimizers.Optimizer) -> list[tuple[Any, Any]]:
    """(trainable variable, its moving average) for every variable the optimizer built on."""
    if not optimizer.use_ema:
        raise RunError("the optimizer keeps no moving averages: config.train.ema_decay is 0")
    if not optimizer.built:
        raise RunError("build the optimizer on the trainable variables before reading averages")
    averages = getattr(optimizer, AVERAGES)
    pairs = zip(getattr(optimizer, BUILT_ON), averages, strict=True)
    return [(variable, average) for variable, average in pairs if average is not None]


@contextlib.contextmanager
def swap_in_ema(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Within the block, the model's trainable variables hold their moving averages.

    For an evaluation or export in the training process (in cross-replica context,
    outside `strategy.run`); the raw weights are back afterwards, even on an error.
    """
    pairs = ema_pairs(optimizer)
    raw = [tf.identity(variable) for variable, _ in pairs]
    for variable, average in pairs:
        variable.assign(average)
    try:
        yield
    finally:
        for (variable, _), value in zip(pairs, raw, strict=True):
            variable.assign(value)


class MovingAverages:
    """The moving averages a training checkpoint keeps, read into a model's trainable weights.

    For an evaluator, predictor or export that restores the model only: the averages
    are optimizer variables, found by their place in an optimizer built from the same
    config on the same variables (`variables`, as training built it). `name`: the
    recipe of config.optimizers that kept them (None: config.optimizer). Make it
    (once) in the strategy scope the model was built in; `load(path)` after each
    restore of the model.
    """

    def __init__(
        self,
        variables: Sequence[Any],
        config: ml_collections.ConfigDict,
        name: str | None = None,
    ):
        self._optimizer = build_optimizer(config, config.train.batch_size, name)
        self._optimizer.build(list(variables))
        self._name = name

    def load(self, checkpoint_path: str) -> None:
        # The optimizer tracks the model's variables too: this also restores the raw
        # weights. Every variable of this optimizer must be in the checkpoint: one
        # trained without EMA has fewer, and would otherwise fill the averages with
        # Adam's moments (the variables are matched by their place in the list).
        parts: dict[str, Any] = (
            {"optimizer": self._optimizer}
            if self._name is None
            else {"optimizers": {self._name: self._optimizer}}
        )
        try:
            status = tf.train.Checkpoint(**parts).read(checkpoint_path)
            status.expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:
            reason = one_line(e, 200)
            raise CheckpointMismatch(
                f"{checkpoint_path} has no moving averages for this config's optimizer "
                f"({reason}): it was not trained with this config.train.ema_decay "
                "and optimizer; use the config it was trained with",
                f"no moving averages for this optimizer ({reason})",
            ) from None
        for variable, average in ema_pairs(self._optimizer):
            variable.assign(average)


def restore_ema_weights(
    keras_model: keras.Model, config: ml_collections.ConfigDict, checkpoint_path: str
) -> None:
    """Sets the model's trainable weights to the moving averages of a training checkpoint
    (`MovingAverages`, once)."""
    MovingAverages(keras_model.trainable_variables, config).load(checkpoint_path)
