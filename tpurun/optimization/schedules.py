"""The learning rate over the steps, as config.optimizer describes it: one Keras schedule.

A schedule is a Keras LearningRateSchedule, evaluated at the run's global step
(`tpurun.optimization.follow_step`; the optimizer's own `iterations` would count a
GAN critic's several updates per step), the step a checkpoint restores: a resumed
run continues on the curve. It is not in the
checkpoint (only variables are): it is rebuilt from the config, which is why
tpurun.storage.train_config refuses a resume that changes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import keras
import ml_collections
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tpurun")
class Schedule(keras.optimizers.schedules.LearningRateSchedule):
    """The learning rate at a step (the number of steps done), as config.optimizer describes it.

    `learning_rate` is the peak rate (already scaled with the batch); `total_steps` is
    train.steps, where cosine and linear end. Plain Python values only, so
    `get_config` serializes it.
    """

    def __init__(
        self,
        learning_rate: float,
        schedule: str = "constant",
        total_steps: int = 0,
        warmup_steps: int = 0,
        decay_steps: int = 0,
        warmup_target: str = "schedule",
        decay_rate: float = 0.0,
        staircase: bool = False,
        boundaries: Sequence[int] = (),
        multipliers: Sequence[float] = (),
        alpha: float = 0.0,
        end_learning_rate: float = 0.0,
    ):
        self.learning_rate = float(learning_rate)
        self.schedule = schedule
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.warmup_target = warmup_target
        self.decay_steps = int(decay_steps)
        self.decay_rate = float(decay_rate)
        self.staircase = bool(staircase)
        self.boundaries = [int(b) for b in boundaries]
        self.multipliers = [float(m) for m in multipliers]
        self.alpha = float(alpha)
        self.end_learning_rate = float(end_learning_rate)

    def __call__(self, step: Any) -> tf.Tensor:
        steps_done = tf.cast(step, tf.int64)  # exact, for the piecewise boundaries
        step = tf.cast(step, tf.float32)  # as TF1's schedules compute
        if not self.warmup_steps:
            return self._decayed(step, steps_done)
        warmup = tf.constant(float(self.warmup_steps))
        if self.warmup_target == "peak":
            # google-research/bert's optimization.py: learning_rate x step / warmup_steps,
            # the decay (counted from step 0) taking over at warmup_steps.
            end = tf.constant(self.learning_rate)
        else:
            # Linear to the schedule's rate at the end of the warmup (as tf-models'
            # LinearWarmup), so the curve is continuous there.
            end = self._decayed(warmup, tf.constant(self.warmup_steps, tf.int64))
        return tf.where(step < warmup, end * step / warmup, self._decayed(step, steps_done))

    def _decayed(self, step: tf.Tensor, steps_done: tf.Tensor) -> tf.Tensor:
        rate = tf.constant(self.learning_rate)
        if self.schedule == "exponential":
            # The same float32 ops as tf.compat.v1.train.exponential_decay.
            exponent = step / float(self.decay_steps)
            if self.staircase:
                exponent = tf.floor(exponent)
            return rate * tf.pow(tf.constant(self.decay_rate), exponent)
        if self.schedule == "piecewise":
            # multipliers[i] while boundaries[i-1] < step <= boundaries[i] (TF1's piecewise_constant).
            boundaries = tf.constant(self.boundaries, tf.int64, shape=[len(self.boundaries)])
            index = tf.reduce_sum(tf.cast(steps_done > boundaries, tf.int32))
            return rate * tf.gather(tf.constant(self.multipliers), index)
        # cosine and linear end at total_steps and stay there (a run resumed further).
        done = tf.minimum(step, float(self.total_steps)) / float(max(self.total_steps, 1))
        if self.schedule == "cosine":
            cosine = 0.5 * (1.0 + tf.cos(math.pi * done))
            return rate * ((1.0 - self.alpha) * cosine + self.alpha)
        if self.schedule == "linear":
            return self.end_learning_rate + (rate - self.end_learning_rate) * (1.0 - done)
        return rate  # constant, with a warmup (without, the rate needs no Schedule)

    def get_config(self) -> dict[str, Any]:
        return {
            "learning_rate": self.learning_rate,
            "schedule": self.schedule,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "warmup_target": self.warmup_target,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "boundaries": list(self.boundaries),
            "multipliers": list(self.multipliers),
            "alpha": self.alpha,
            "end_learning_rate": self.end_learning_rate,
        }


def peak_learning_rate(
    optimizer_config: ml_collections.ConfigDict, global_batch_size: int
) -> float:
    """learning_rate, scaled by global_batch_size / base_batch_size when base_batch_size is set."""
    rate = float(optimizer_config.learning_rate)
    base = optimizer_config.base_batch_size
    return rate * global_batch_size / base if base else rate


def learning_rate(
    config: ml_collections.ConfigDict,
    global_batch_size: int,
    recipe: ml_collections.ConfigDict | None = None,
) -> float | Schedule:
    """The optimizer's learning_rate argument: a float for a constant rate, else a Schedule.

    `recipe`: config.optimizer, or one of config.optimizers (default: config.optimizer).
    A constant rate without warmup stays a float, so Keras keeps it in a variable that
    a resumed run sets from its own config (train.py), and the checkpoint layout of
    such runs is what it was before schedules existed.
    """
    opt = config.optimizer if recipe is None else recipe
    rate = peak_learning_rate(opt, global_batch_size)
    if opt.schedule == "constant" and not opt.warmup_steps:
        return rate
    return Schedule(
        rate,
        schedule=opt.schedule,
        total_steps=config.train.steps,
        warmup_steps=opt.warmup_steps,
        warmup_target=opt.get("warmup_target", "schedule"),
        decay_steps=opt.decay_steps,
        decay_rate=opt.decay_rate,
        staircase=opt.staircase,
        boundaries=opt.boundaries,
        multipliers=opt.multipliers,
        alpha=opt.alpha,
        end_learning_rate=opt.end_learning_rate,
    )
