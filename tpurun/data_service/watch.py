"""A training run's watch over its tf.data service: lost servers said, a lost input ended.

TensorFlow's client reads on from the workers that answer and says nothing of one it
lost; while its dispatcher is silent it retries for ever, and with no worker left its
next batch never comes. So a thread asks the service every few seconds
(`tpurun.data_service.state`) and the run:

* says in one line each change: a worker lost (training goes on with the others), a
  worker joined or back, the dispatcher silent or back;
* ends when its job is lost (`input_errors`: a dispatcher restarted without a work_dir
  forgets it, and TensorFlow's client fails with "Unknown iteration client id"), with
  exit 69, as below;
* ends when the dispatcher, or every worker, stays silent for config.data.service_timeout
  seconds: with exit 69 (Unavailable, what `train --max_restarts` restarts on) at its
  last checkpoint. Where the training loop still moves (the workers still serve the
  tasks they have), it stops at the end of its host loop (`ServiceWatch`: Unavailable,
  raised in the loop); where it waits for a batch that will not come, the thread ends
  the process itself (os._exit, as the hang watchdog does: checkpoints are written
  atomically, the latest stays whole), unless a loop ends within another timeout.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun.actions import watchdog
from tpurun.actions.base import Action, LoopStats, Saved
from tpurun.data_service import state
from tpurun.data_service.rpc import Servers
from tpurun.errors import EXIT_UNAVAILABLE, Unavailable
from tpurun.errors.tf_errors import one_line
from tpurun.layout import served_input
from tpurun.run_config.keys.service_keys import Service
from tpurun.storage import checkpoints

POLL_SECONDS = 5.0  # at most: a short timeout polls more often


class Watch:
    """The thread that watches `service` for a run (`model_dir`) from `step` on."""

    def __init__(
        self,
        service: Service,
        model_dir: str,
        step: int,
        exit_process: Callable[[str], None] | None = None,
        servers: Servers | None = None,
    ):
        """`exit_process(line)`: ends the process (default: the line, then os._exit(69));
        `servers`: what answers for the service (default: its servers over gRPC)."""
        self.service = service
        self._servers = servers or Servers.of(service)
        self._poll = min(POLL_SECONDS, service.timeout / 4)
        self._model_dir = model_dir
        self.latest = checkpoints.path_of(model_dir, step) if step else None
        self._exit = exit_process or (
            lambda message: watchdog.exit_hung(message, exit_code=EXIT_UNAVAILABLE)
        )
        self._look: state.Look | None = None
        self._silent_since: float | None = None  # the input's sources silent since then
        self._progress = time.monotonic()  # the training loop's last sign of life
        self.failure: str | None = None  # the run must end: why (its error line)
        self._failed_at = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tpurun-data-service", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._servers.close()

    def progressed(self, now: float | None = None) -> None:
        """The training loop moved (a host loop began or ended, a save was made)."""
        self._progress = time.monotonic() if now is None else now

    def _watch(self) -> None:
        self.check(time.monotonic())  # at once: the workers serving, said as the run starts
        while not self._stopped.wait(self._poll):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One look at the service, its lines, and the deadline (the thread's loop body)."""
        look = state.look(self._servers, self._look)
        for change in state.changes(self._look, look, self.service.address):
            _say(change, self.service)
        self._look = look
        silent = look.silent or not look.answering
        if not silent:
            self._silent_since = None
            return
        if self._silent_since is None:
            self._silent_since = now
        if self.failure is None and now - self._silent_since >= self.service.timeout:
            self.failure, self._failed_at = self._failure_line(look), now
        if self.failure is None:
            return
        stuck = self._progress < self._silent_since  # no loop ended since the input went
        if stuck or now - self._failed_at >= self.service.timeout:
            self._exit(f"tpurun train: error: {self.failure}")

    def _failure_line(self, look: state.Look) -> str:
        timeout = f"{self.service.timeout:g}s (config.data.service_timeout)"
        if look.silent:
            what = f"dispatcher at {self.service.address} has not answered for {timeout}"
            restart = "restart it (on its --work_dir, if it had one)"
        else:
            what = f"workers have all been silent for {timeout}"
            restart = (
                f"restart them (tpurun data-service worker --dispatcher={self.service.address})"
            )
        return (
            f"the tf.data service's {what}: the run ends at its last checkpoint "
            f"({self.latest or 'none saved yet'}) with exit {EXIT_UNAVAILABLE}; {restart}, then "
            "rerun the same command (train --max_restarts=N does it), which resumes under a "
            "new job"
        )


def _say(change: state.Change, service: Service) -> None:
    timeout = f"{service.timeout:g}s (config.data.service_timeout)"
    if change.what == state.WORKER_LOST:
        if change.answering:
            logging.warning(
                "tf.data service worker %s is lost (it does not answer): training goes on with "
                "the %d other(s).",
                change.address,
                change.answering,
            )
        else:
            logging.warning(
                "tf.data service worker %s is lost, and no worker answers: the input waits for "
                "one for up to %s, then the run ends with exit %d.",
                change.address,
                timeout,
                EXIT_UNAVAILABLE,
            )
    elif change.what in (state.WORKER_JOINED, state.WORKER_BACK):
        verb = "joined" if change.what == state.WORKER_JOINED else "answers again"
        logging.info(
            "tf.data service worker %s %s (%d answering).", change.address, verb, change.answering
        )
    elif change.what == state.DISPATCHER_LOST:
        logging.warning(
            "The tf.data service's dispatcher at %s does not answer (%s): the workers serve the "
            "tasks they have; silent for %s, the run ends at its last checkpoint with exit %d.",
            change.address,
            change.reason,
            timeout,
            EXIT_UNAVAILABLE,
        )
    else:
        logging.info("The tf.data service's dispatcher at %s answers again.", change.address)


class ServiceWatch(Action):
    """The run's side of the Watch: its start line and record field, its progress, its end.

    `service_input()`: the trainer's `ServiceInput` once its input is built (at the
    controller's start); `write_field(name, value)`: sets a field of the run record (None:
    this worker writes none).
    """

    def __init__(
        self,
        service_input: Callable[[], Any],
        write_field: Callable[[str, Any], None] | None = None,
    ):
        self._input = service_input
        self._write_field = write_field
        self._watch: Watch | None = None

    def start(self, step: int, last_step: int) -> None:
        served = self._input()
        self._watch = served.watch
        logging.info(served.line())
        if self._write_field is not None:
            self._write_field(served_input.KEY, served.record())
        self._tick()

    def before_loop(self, step: int, num_steps: int) -> None:
        self._tick()

    def after_loop(self, stats: LoopStats) -> None:
        self._tick()

    def saved(self, saved: Saved) -> None:
        if self._watch is not None:
            self._watch.latest = saved.path
        self._tick()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def _tick(self) -> None:
        """Progress; the end of the run if the service's deadline passed."""
        if self._watch is None:
            return
        self._watch.progressed()
        if self._watch.failure is not None:
            raise Unavailable(self._watch.failure)


# What TensorFlow's data-service client fails with when the service lost the run's job or
# its tasks: a restarted dispatcher that forgot them, a worker that dropped them.
_LOST_JOB = re.compile(
    r"Unknown iteration client id|Failed to get (tasks|element|split)|iteration client|"
    r"tf\.data service|dispatcher",
    re.IGNORECASE,
)


@contextlib.contextmanager
def input_errors(service: Service | None) -> Iterator[None]:
    """Within: the service's loss of the run's job, as TensorFlow raises it from the input,
    becomes Unavailable (exit 69, restarted by --max_restarts) with what happened and the
    fix, in one line. Nothing changes without a service."""
    try:
        yield
    except tf.errors.OpError as error:
        if service is None or not _LOST_JOB.search(error.message or ""):
            raise
        raise Unavailable(
            f"the tf.data service at {service.target} lost this run's input "
            f"({one_line(error, 300)}): a dispatcher restarted without --work_dir forgets its "
            f"jobs; the run ends at its last checkpoint with exit {EXIT_UNAVAILABLE}; rerun "
            "the same command (train --max_restarts=N does it), which resumes under a new job"
        ) from error
