"""A schedule that follows the run's global step, and the rate an optimizer uses at a step.

Schedules are Keras LearningRateSchedules, which Keras evaluates at
`optimizer.iterations`; `follow_step` makes them follow the run's global step
instead (a GAN's critic updates several times per step), the step a checkpoint
restores: a resumed run continues on the curve. The schedule itself is not in the
checkpoint (only variables are); it is rebuilt from the config, which is why
checkpoints.py refuses a resume that changes it.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tpurun.optimization.keras_private import SCHEDULE


def learning_rate_at(optimizer: keras.optimizers.Optimizer, step: Any) -> tf.Tensor:
    """The rate the optimizer uses for the update after `step` steps (for TensorBoard), as
    a float32 tensor: `step` may be a tensor, in a host loop's graph."""
    rate = getattr(optimizer, SCHEDULE, None)
    if isinstance(rate, StepSchedule):
        rate = rate.schedule
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return tf.cast(rate(step), tf.float32)
    return tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)


class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule evaluated at the run's global step, not at the optimizer's `iterations`.

    Keras evaluates a schedule at `optimizer.iterations`, the updates that optimizer
    made: a GAN's critic makes several per step, so its curve would run ahead of the
    run's. `step` is the Trainer's global step variable (the steps done).
    """

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, step: Any):
        self.schedule = schedule
        self.step = step

    def __call__(self, iterations: Any) -> tf.Tensor:
        return self.schedule(self.step)

    def get_config(self) -> dict[str, Any]:
        return self.schedule.get_config()


def follow_step(optimizer: keras.optimizers.Optimizer, step: Any) -> None:
    """Makes the optimizer's schedule (if it has one) follow the global step `step`.

    A constant rate stays the variable it is (a resumed run sets it from its config).
    """
    rate = getattr(optimizer, SCHEDULE, None)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) and not isinstance(
        rate, StepSchedule
    ):
        optimizer.learning_rate = StepSchedule(rate, step)
