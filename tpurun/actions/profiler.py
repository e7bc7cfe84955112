"""--profile_steps: a TensorFlow profiler trace of whole host loops."""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tpurun.actions.base import Action, LoopStats
from tpurun.layout import names


class ProfileSteps(Action):
    """--profile_steps=START,END: a TensorFlow profiler trace of the host loops covering those steps.

    Written to model_dir/plugins/profile/<time>/, where TensorBoard's Profile tab
    looks. The profiler starts and stops between host loops (a loop is one call),
    so it captures whole loops; the log line says which steps those were.
    """

    def __init__(self, model_dir: str, first: int, last: int):
        self._model_dir = model_dir
        self._first, self._last = first, last
        self._done = False
        self._from: int | None = None  # first step of the trace, while it runs
        self._through = 0  # last step finished

    def start(self, step: int, last_step: int) -> None:
        wanted = f"--profile_steps={self._first},{self._last}"
        trains = f"the steps this run trains ({step + 1}..{last_step})"
        if self._first > last_step or self._last <= step:
            logging.warning(
                "%s is outside %s: nothing will be profiled; pick steps in that range.",
                wanted,
                trains,
            )
            self._done = True
        elif self._first <= step or self._last > last_step:
            logging.warning(
                "%s reaches outside %s: only steps inside it are profiled.", wanted, trains
            )

    def before_loop(self, step: int, num_steps: int) -> None:
        overlaps = step + 1 <= self._last and step + num_steps >= self._first
        if self._done or self._from is not None or not overlaps:
            return
        try:
            tf.profiler.experimental.start(self._model_dir)
        except (tf.errors.OpError, RuntimeError) as e:  # e.g. another profiler is running
            logging.warning("--profile_steps: could not start the profiler: %s", e)
            self._done = True
            return
        self._from = step + 1

    def after_loop(self, stats: LoopStats) -> None:
        self._through = stats.step
        if self._from is not None and stats.step >= self._last:
            self._stop()

    def close(self) -> None:
        if self._from is not None:
            self._stop()  # training ended (or failed) inside the range

    def _stop(self) -> None:
        first, self._from, self._done = self._from, None, True
        try:
            tf.profiler.experimental.stop()
        except (tf.errors.OpError, RuntimeError) as e:
            logging.warning("--profile_steps: the profiler failed to write its trace: %s", e)
            return
        logging.info(
            "Profiled steps %d..%d (whole host loops) into %s: TensorBoard's Profile tab "
            "shows them (pip install tensorboard-plugin-profile).",
            first,
            self._through,
            names.profile_dir(self._model_dir),
        )
