"""What a training run shows while it runs: log lines and TensorBoard scalars per host loop.

The Trainer calls every monitor between host loops (never inside the compiled
loop), so watching costs nothing on the device and tags carry no `while/` prefix.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import tensorflow as tf
from absl import logging

from tpurun.run_config import RunConfig

if TYPE_CHECKING:
    from tpurun.train import Trainer


@dataclasses.dataclass(frozen=True)
class LoopStats:
    """What one host loop did."""

    step: int  # global step after the loop
    num_steps: int  # steps the loop ran
    last_step: int  # --train_steps
    loss: float  # mean loss over the loop's steps
    seconds: float  # wall time of the loop call
    input_seconds: float  # part of it spent waiting for the next batch
    global_batch: int
    learning_rate: float

    @property
    def steps_per_sec(self) -> float:
        return self.num_steps / self.seconds

    @property
    def examples_per_sec(self) -> float:
        return self.num_steps * self.global_batch / self.seconds


class Monitor:
    """Base class: every hook does nothing."""

    def start(self, step: int, last_step: int) -> None:
        """Training is about to run from `step` to `last_step`."""

    def before_loop(self, step: int, num_steps: int) -> None:
        """A host loop of num_steps is about to start at `step`."""

    def after_loop(self, stats: LoopStats) -> None:
        """A host loop finished (before its checkpoint, if any, is saved)."""

    def after_save(self, step: int, path: str) -> None:
        """A checkpoint was saved."""

    def close(self) -> None:
        """Training ended (normally or not); release what was opened."""


class LogLines(Monitor):
    """One absl log line per host loop."""

    def after_loop(self, stats: LoopStats) -> None:
        logging.info(
            "step %d/%d  loss %.4f  %.1f steps/sec  %.0f examples/sec",
            stats.step,
            stats.last_step,
            stats.loss,
            stats.steps_per_sec,
            stats.examples_per_sec,
        )


class TrainSummaries(Monitor):
    """TensorBoard scalars under model_dir: loss, learning_rate, global_step/sec, examples/sec."""

    def __init__(self, model_dir: str):
        self._writer = tf.summary.create_file_writer(model_dir)

    def after_loop(self, stats: LoopStats) -> None:
        with self._writer.as_default(step=stats.step):
            tf.summary.scalar("loss", stats.loss)
            tf.summary.scalar("learning_rate", stats.learning_rate)
            tf.summary.scalar("global_step/sec", stats.steps_per_sec)
            tf.summary.scalar("examples/sec", stats.examples_per_sec)

    def close(self) -> None:
        self._writer.close()


def for_training(run: RunConfig, trainer: Trainer) -> list[Monitor]:
    """The monitors of a training run; the summaries are the chief's only."""
    monitors: list[Monitor] = [LogLines()]
    if trainer.is_chief:
        monitors.append(TrainSummaries(run.model_dir))
    return monitors
