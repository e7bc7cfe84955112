"""The run record's time account: what this train process did and when, written as it goes.

`tpurun report` reads it (`tpurun.layout.time_account` names and checks its fields); a
process that is killed leaves its account up to its last write. The record is
rewritten whole through the run's background writer (only the newest version of a
path is written, so a fast loop costs an update of the account), at most every
WRITE_EVERY seconds for the loops and at once for a save, an evaluation and the first
loop; the end is written before the process exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

from absl import logging

from tpurun import storage
from tpurun.actions.base import Action, LoopStats, Saved
from tpurun.layout import names, time_account
from tpurun.layout.time_account import (
    Device,
    End,
    Evaluation,
    FirstLoop,
    Last,
    Loops,
    Resume,
    Save,
    TimeAccount,
    TrainingStart,
)
from tpurun.storage.background import Writer
from tpurun.supervisor.protocol import (
    PREVIOUS_DEATH_ENV,
    PROGRESS_FD_ENV,
    SUPERVISED_ENV,
    SUPERVISOR_START_ENV,
    process_start,
)

WRITE_EVERY = 2.0  # seconds between writes of the loops' progress


def initial_account() -> TimeAccount:
    """The account as the run record is first written: the process's start, and the death
    and restart number the supervisor passed on."""
    account = TimeAccount(process_start=process_start(), updated=time.time())
    supervised = os.environ.get(SUPERVISED_ENV)
    if supervised:
        account.restart = int(supervised.split("/")[0])
        account.spawned_at = account.process_start
        with contextlib.suppress(ValueError):  # which supervisor: its trainers' records say
            account.supervisor_start = float(os.environ.get(SUPERVISOR_START_ENV, ""))
    death = os.environ.get(PREVIOUS_DEATH_ENV)
    if death:
        account.previous_death = time_account.death_from_json(death)
    return account


def _progress_fd() -> int | None:
    """The supervisor's progress pipe, made non-blocking; None when not supervised."""
    value = os.environ.get(PROGRESS_FD_ENV)
    if not value:
        return None
    try:
        fd = int(value)
        os.set_blocking(fd, False)
    except (ValueError, OSError):
        return None
    return fd


class GoodputRecord(Action):
    """Keeps the time account of the run record at `path` (`record`: the whole record as
    written first, its account under `time_account.KEY`) up to date: the cluster, training
    start, loops, saves, evaluations, the end."""

    def __init__(self, path: str, record: dict[str, Any]):
        self._path = path
        self._record = record
        account = record.get(time_account.KEY)
        self.account = account if isinstance(account, TimeAccount) else initial_account()
        record[time_account.KEY] = self.account
        if self.account.loops is None:
            self.account.loops = Loops(count=0, steps=0, seconds=0.0, input_seconds=0.0)
        self._writer: Writer | None = None
        self._written = 0.0
        self._progress_fd = _progress_fd()
        self._reached: dict[int, float] = {}  # recent host loops: step -> when it ended

    @property
    def trained(self) -> bool:
        """Whether training started (not "already at step N")."""
        return self.account.training_start is not None

    @property
    def has_end(self) -> bool:
        return self.account.end is not None

    def cluster_ready(self, at: float, device_kind: str, replicas: int) -> None:
        """The strategy was built at `at` (the TPU found and initialized), with `replicas`
        replicas of `device_kind`: written with the training start."""
        self.account.cluster_ready = at
        self.account.device = Device(kind=device_kind, replicas=replicas)

    def resume(self, resume: Resume) -> None:
        """Whether a resume of the run is bit-identical: written with the training start."""
        self.account.resume = resume

    def step_costs(
        self,
        model_flops_per_step: float | None = None,
        peak_flops_per_s: float | None = None,
        peak_why: str | None = None,
    ) -> None:
        """What is known only after training (the step's FLOPs, the device's peak, or why
        not): written with the end."""
        self.account.model_flops_per_step = model_flops_per_step
        self.account.peak_flops_per_s = peak_flops_per_s
        self.account.peak_why = peak_why

    def set_field(self, name: str, value: Any) -> None:
        """A field of the run record beside the account (`layout.served_input.KEY`: how a
        tf.data service made the input and where a resumed run's input restarted), written
        with the account's next write."""
        self._record[name] = value

    @contextlib.contextmanager
    def writing_through(self, writer: Writer) -> Iterator[None]:
        """Writes go through `writer` while training runs (off the loop)."""
        self._writer = writer
        try:
            yield
        finally:
            self._writer = None

    def start(self, step: int, last_step: int) -> None:
        self.account.training_start = TrainingStart(t=time.time(), step=step)
        self.account.last = Last(step=step, t=time.time())
        self._tell_supervisor(step)
        self._write(now=True)

    def after_loop(self, stats: LoopStats) -> None:
        loops = self.account.loops
        assert loops is not None
        first = loops.count == 0
        loops.count = (loops.count or 0) + 1
        loops.steps = (loops.steps or 0) + stats.num_steps
        loops.seconds = (loops.seconds or 0.0) + stats.seconds
        loops.input_seconds = (loops.input_seconds or 0.0) + stats.input_seconds
        if first:
            self.account.first_loop = FirstLoop(
                steps=stats.num_steps, seconds=stats.seconds, input_seconds=stats.input_seconds
            )
        now = time.time()
        self.account.last = Last(step=stats.step, t=now)
        self._reached[stats.step] = now
        if len(self._reached) > 64:  # a save is polled a few loops after its step at most
            del self._reached[min(self._reached)]
        self._tell_supervisor(stats.step)
        self._write(now=first)

    def saved(self, saved: Saved) -> None:
        # reached_t: when the loop reached its step, a resume's point.
        reached = self._reached.get(saved.step)
        save = Save(step=saved.step, t=time.time(), blocking_s=saved.waited, reached_t=reached)
        self.account.saves.append(save)
        self._write(now=True)

    def evaluated(self, step: int, seconds: float) -> None:
        self.account.evaluations.append(Evaluation(step=step, t=time.time(), seconds=seconds))
        self._write(now=True)

    def finish(self, reason: str) -> None:
        """The end of the process (`reason`: time_account.FINISHED, PREEMPTED, ERROR or
        INTERRUPTED), written now."""
        self.account.end = self._end(reason)
        try:
            self._write(now=True, wait=True)
        except Exception as e:  # noqa: BLE001 - storage's errors (OSError, TensorFlow's), others
            # Its record cannot be rewritten (a directory or another file put in its place):
            # the whole account under a new name, so the report sees how it ended.
            lost, self._path = (
                self._path,
                storage.join(self._path.rsplit("/", 1)[0], names.run_record_name("train")),
            )
            self._write(now=True, wait=True)
            logging.warning(
                "Could not rewrite the run record %s (%s); its account is in %s.",
                lost,
                e,
                self._path,
            )

    def ended(self, reason: str) -> TimeAccount:
        """This account as it would read if the process ended now (for the report `train`
        ends with, before the end is written)."""
        return dataclasses.replace(self.account, end=self._end(reason))

    def _end(self, reason: str) -> End:
        last = self.account.last or Last()
        return End(t=time.time(), reason=reason, step=last.step)

    @property
    def path(self) -> str:
        return self._path

    def _tell_supervisor(self, step: int) -> None:
        """One line on the supervisor's pipe; never waits (a full pipe drops the line)."""
        if self._progress_fd is None:
            return
        try:
            os.write(self._progress_fd, f"{step} {time.time():.6f}\n".encode())
        except (BlockingIOError, BrokenPipeError, OSError):
            pass

    def _write(self, now: bool = False, wait: bool = False) -> None:
        moment = time.time()
        if not now and moment - self._written < WRITE_EVERY:
            return
        self._written = moment
        self.account.updated = moment
        text = time_account.record_text(self._record)
        if self._writer is not None and not wait:
            self._writer.write(self._path, text)
        else:
            storage.write_atomically(self._path, text)


def writing_through(
    account: GoodputRecord | None, writer: Writer
) -> contextlib.AbstractContextManager[None]:
    """The account's writes through the run's writer while it trains (no account: nothing)."""
    return account.writing_through(writer) if account else contextlib.nullcontext()
