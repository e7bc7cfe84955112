"""TensorBoard events of a training run, under model_dir."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.actions.base import Action, LoopStats
from tpurun.errors.tf_errors import user_code_line
from tpurun.storage.background import Writer
from tpurun.storage.background.events import StagedEvents


class TrainSummaries(Action):
    """TensorBoard under model_dir: the model's graph at the start, then after every host loop
    loss (or each named scalar of the step: d_loss, g_loss, ...), learning_rate (or
    learning_rate/<optimizer>), global_step/sec, examples/sec and input_wait_share (0
    with device data, whose steps gather their batches and wait for nothing).

    On a local disk TensorFlow's writer writes there. Elsewhere (gs://), given the
    run's `writer`, the events are staged in memory and uploaded in the background
    every `upload_secs` and at the end (`StagedEvents`): no host loop waits on storage.
    The events file is created at `start`, once the run has restored and built its
    input: a run that fails before then leaves none.
    """

    def __init__(
        self,
        model_dir: str,
        graph: Callable[[], tf.Graph] | None = None,
        writer: Writer | None = None,
        upload_secs: float = 30.0,
    ):
        self._model_dir = model_dir
        self._summary_writer: Any = None
        self._staged: StagedEvents | None = None
        self._background = writer if not storage.is_local(model_dir) else None
        self._upload_secs = upload_secs
        self._graph = graph

    def start(self, step: int, last_step: int) -> None:
        if self._background is not None:
            self._staged = StagedEvents(self._model_dir, self._background, self._upload_secs)
        else:
            self._summary_writer = tf.summary.create_file_writer(self._model_dir)
        if self._graph is None:
            return
        try:
            graph = self._graph()
        except Exception as e:  # a view of the model is never a reason to stop training
            logging.warning(
                "No model graph for TensorBoard: tracing the model failed: %s", user_code_line(e)
            )
            return
        with self._events().as_default():
            tf.summary.graph(graph)
        if self._staged is not None:
            self._staged.upload(finish=True)  # a file of its own, uploaded once

    def after_loop(self, stats: LoopStats) -> None:
        try:
            with self._events().as_default(step=stats.step):
                for name, value in {**stats.named_scalars(), **stats.named_rates()}.items():
                    tf.summary.scalar(name, value)
                tf.summary.scalar("global_step/sec", stats.steps_per_sec)
                tf.summary.scalar("examples/sec", stats.examples_per_sec)
                tf.summary.scalar("input_wait_share", stats.input_wait_share)
            if self._staged is not None:
                self._staged.wrote()
                self._staged.after_loop()
        except (tf.errors.OpError, OSError) as e:
            # Only the chief writes events: failing here would leave the other
            # workers blocked in their next all-reduce. Training goes on.
            logging.warning("Could not write TensorBoard events (step %d): %s", stats.step, e)

    def _events(self) -> Any:
        """The summary writer to write to now (a staged one moves to a new file now and then)."""
        return self._staged.summary_writer if self._staged is not None else self._summary_writer

    def close(self) -> None:
        if self._staged is not None:
            self._staged.close()
        elif self._summary_writer is not None:
            self._summary_writer.close()
