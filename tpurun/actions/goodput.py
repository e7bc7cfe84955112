"""The run record's time account: what this train process did and when, written as it goes.

`tpurun report` reads it (`tpurun.report.goodput` documents the fields); a process
that is killed leaves its account up to its last write. The record is rewritten
whole through the run's background writer (only the newest version of a path is
written, so a fast loop costs a dict update), at most every WRITE_EVERY seconds for
the loops and at once for a save, an evaluation and the first loop; the end is
written before the process exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from absl import logging

from tpurun import storage
from tpurun.actions.base import Action, LoopStats, Saved
from tpurun.report.run_records import record_name
from tpurun.storage.background import Writer
from tpurun.supervisor.protocol import (
    PREVIOUS_DEATH_ENV,
    PROGRESS_FD_ENV,
    SUPERVISED_ENV,
    SUPERVISOR_START_ENV,
    process_start,
)

WRITE_EVERY = 2.0  # seconds between writes of the loops' progress


def initial_account() -> dict[str, Any]:
    """The account as the run record is first written: the process's start, and the death
    and restart number the supervisor passed on."""
    account: dict[str, Any] = {"process_start": process_start(), "updated": time.time()}
    supervised = os.environ.get(SUPERVISED_ENV)
    if supervised:
        account["restart"] = int(supervised.split("/")[0])
        account["spawned_at"] = account["process_start"]
        with contextlib.suppress(ValueError):  # which supervisor: its trainers' records say
            account["supervisor_start"] = float(os.environ.get(SUPERVISOR_START_ENV, ""))
    death = os.environ.get(PREVIOUS_DEATH_ENV)
    if death:
        with contextlib.suppress(ValueError):
            account["previous_death"] = json.loads(death)
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
    """Keeps the `goodput` object of the run record at `path` (`record`: the whole record as
    written first) up to date: training start, loops, saves, evaluations, the end."""

    def __init__(self, path: str, record: dict[str, Any]):
        self._path = path
        self._record = record
        self.account: dict[str, Any] = record.setdefault("goodput", initial_account())
        self.account.setdefault("loops", {"count": 0, "steps": 0, "seconds": 0.0})
        self.account["loops"].setdefault("input_seconds", 0.0)
        self.account.setdefault("saves", [])
        self.account.setdefault("evaluations", [])
        self._writer: Writer | None = None
        self._written = 0.0
        self._progress_fd = _progress_fd()
        self._reached: dict[int, float] = {}  # recent host loops: step -> when it ended

    def set_field(self, name: str, value: Any) -> None:
        """A field of the run record beside the account (`data_service`: how the input was
        made and where a resumed run's input restarted), written with the account's next write."""
        self._record[name] = value

    def mark(self, name: str, **fields: Any) -> None:
        """Records a moment of the start-up (`cluster_ready`): its time, and `fields`."""
        self.account[name] = {"t": time.time(), **fields} if fields else time.time()

    @contextlib.contextmanager
    def writing_through(self, writer: Writer) -> Iterator[None]:
        """Writes go through `writer` while training runs (off the loop)."""
        self._writer = writer
        try:
            yield
        finally:
            self._writer = None

    def start(self, step: int, last_step: int) -> None:
        self.account["training_start"] = {"t": time.time(), "step": step}
        self.account["last"] = {"step": step, "t": time.time()}
        self._tell_supervisor(step)
        self._write(now=True)

    def after_loop(self, stats: LoopStats) -> None:
        loops = self.account["loops"]
        first = loops["count"] == 0
        loops["count"] += 1
        loops["steps"] += stats.num_steps
        loops["seconds"] += stats.seconds
        loops["input_seconds"] += stats.input_seconds
        if first:
            self.account["first_loop"] = {
                "steps": stats.num_steps,
                "seconds": stats.seconds,
                "input_seconds": stats.input_seconds,
            }
        self.account["last"] = {"step": stats.step, "t": time.time()}
        self._reached[stats.step] = self.account["last"]["t"]
        if len(self._reached) > 64:  # a save is polled a few loops after its step at most
            del self._reached[min(self._reached)]
        self._tell_supervisor(stats.step)
        self._write(now=first)

    def saved(self, saved: Saved) -> None:
        save = {"step": saved.step, "t": time.time(), "blocking_s": saved.waited}
        if saved.step in self._reached:  # when the loop reached its step: a resume's point
            save["reached_t"] = self._reached[saved.step]
        self.account["saves"].append(save)
        self._write(now=True)

    def evaluated(self, step: int, seconds: float) -> None:
        self.account["evaluations"].append({"step": step, "t": time.time(), "seconds": seconds})
        self._write(now=True)

    def finish(self, reason: str, **fields: Any) -> None:
        """The end of the process (`reason`: finished, preempted, error, interrupted) and what
        is known only then (the step's FLOPs, the device's peak), written now."""
        self.account.update(fields)
        last = self.account.get("last") or {}
        self.account["end"] = {"t": time.time(), "reason": reason, "step": last.get("step")}
        try:
            self._write(now=True, wait=True)
        except Exception as e:  # noqa: BLE001 - storage's errors (OSError, TensorFlow's), others
            # Its record cannot be rewritten (a directory or another file put in its place):
            # the whole account under a new name, so the report sees how it ended.
            lost, self._path = (
                self._path,
                storage.join(self._path.rsplit("/", 1)[0], record_name("train")),
            )
            self._write(now=True, wait=True)
            logging.warning(
                "Could not rewrite the run record %s (%s); its account is in %s.",
                lost,
                e,
                self._path,
            )

    def ended(self, reason: str, **fields: Any) -> dict[str, Any]:
        """This account as it would read if the process ended now (for the report `train`
        ends with, before the end is written)."""
        last = self.account.get("last") or {}
        ending = {"end": {"t": time.time(), "reason": reason, "step": last.get("step")}}
        return {**self.account, **fields, **ending}

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
        self.account["updated"] = moment
        text = json.dumps(self._record, indent=2, default=str) + "\n"
        if self._writer is not None and not wait:
            self._writer.write(self._path, text)
        else:
            storage.write_atomically(self._path, text)


def writing_through(
    account: GoodputRecord | None, writer: Writer
) -> contextlib.AbstractContextManager[None]:
    """The account's writes through the run's writer while it trains (no account: nothing)."""
    return account.writing_through(writer) if account else contextlib.nullcontext()
