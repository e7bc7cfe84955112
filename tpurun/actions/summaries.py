"""TensorBoard events of a training run, under model_dir."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun.actions.base import Action, LoopStats
from tpurun.tf_errors import user_code_line


class TrainSummaries(Action):
    """TensorBoard under model_dir: the model's graph at the start, then after every host loop
    loss (or each named scalar of the step: d_loss, g_loss, ...), learning_rate (or
    learning_rate/<optimizer>), global_step/sec, examples/sec and input_wait_share (0
    with device data, whose steps gather their batches and wait for nothing).

    The events file is created at `start`, once the run has restored and built its
    input: a run that fails before then leaves none.
    """

    def __init__(self, model_dir: str, graph: Callable[[], tf.Graph] | None = None):
        self._model_dir = model_dir
        self._writer: Any = None
        self._graph = graph

    def start(self, step: int, last_step: int) -> None:
        self._writer = tf.summary.create_file_writer(self._model_dir)
        if self._graph is None:
            return
        try:
            graph = self._graph()
        except Exception as e:  # a view of the model is never a reason to stop training
            logging.warning(
                "No model graph for TensorBoard: tracing the model failed: %s", user_code_line(e)
            )
            return
        with self._writer.as_default():
            tf.summary.graph(graph)

    def after_loop(self, stats: LoopStats) -> None:
        try:
            with self._writer.as_default(step=stats.step):
                for name, value in {**stats.named_scalars(), **stats.named_rates()}.items():
                    tf.summary.scalar(name, value)
                tf.summary.scalar("global_step/sec", stats.steps_per_sec)
                tf.summary.scalar("examples/sec", stats.examples_per_sec)
                tf.summary.scalar("input_wait_share", stats.input_wait_share)
        except (tf.errors.OpError, OSError) as e:
            # Only the chief writes events: failing here would leave the other
            # workers blocked in their next all-reduce. Training goes on.
            logging.warning("Could not write TensorBoard events (step %d): %s", stats.step, e)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
