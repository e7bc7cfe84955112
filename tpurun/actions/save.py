"""Saving a checkpoint at a step: the chief into model_dir, in the background or not; other
workers take part."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import os
import time

import tensorflow as tf
from absl import logging

from tpurun import storage, tf_internals
from tpurun.actions.base import Saved, SaveState
from tpurun.cluster import Cluster
from tpurun.errors import RunError, TpurunError, Unavailable, storage_errors
from tpurun.run_config import RunConfig
from tpurun.storage import checkpoints
from tpurun.storage.background import Writer


@dataclasses.dataclass(frozen=True)
class _InFlight:
    step: int
    path: str
    done: concurrent.futures.Future[float]  # when the commit ended (time.monotonic())
    started: float
    waited: float


class SaveCheckpoint:
    """`save(step)` writes `ckpt-<step>` (atomically: see `tpurun.storage.checkpoints`); returns its path.

    With config.train.async_checkpoint (and a `writer`), the save copies the state at
    the step into host memory and the writer's thread writes it while training goes
    on: the loop waits only for the copy, and for the previous save if it is still
    being written (at most one is). `poll()` and `wait()` give the saves that became
    the newest checkpoint, and raise the error of one that failed: the same error,
    so the same line, as a save the loop waited for. Without it, `save` writes the
    checkpoint before it returns, as tpurun always did.

    Every worker of a MultiWorkerMirroredStrategy must take part in a save, but
    only the chief's copy is kept: the others write theirs to a scratch directory
    and delete it, or in the background mode only copy the state (reading it is
    their part) and write nothing. Built after the restore, since the saver reads
    the state file, which the restore may rewrite.
    """

    def __init__(
        self,
        run: RunConfig,
        checkpoint: tf.train.Checkpoint,
        cluster: Cluster,
        writer: Writer | None = None,
    ):
        self._model_dir = run.model_dir
        self._checkpoint = checkpoint
        self._writer = writer if run.config.train.async_checkpoint else None
        self._scratch = None if cluster.is_chief else checkpoints.scratch_dir(run, cluster.task)
        self._saver = (
            checkpoints.Saver(checkpoint, run.model_dir, run.config.train.keep_checkpoint_max)
            if cluster.is_chief
            else None
        )
        self._in_flight: _InFlight | None = None
        self._saved: list[Saved] = []
        self._last: Saved | None = None
        self._warned = False

    @property
    def state(self) -> SaveState:
        return SaveState(
            in_flight=self._in_flight.step if self._in_flight else None,
            last_seconds=self._last.seconds if self._last else None,
            writing=self._in_flight.done if self._in_flight else None,
        )

    def __call__(self, step: int) -> str:
        started = time.monotonic()
        self._finish()  # at most one save in flight: the previous one first
        if self._saver is None:
            return self._take_part(step)
        snapshot = self._saver.snapshot(step, host_copy=self._writer is not None)
        if snapshot.tensors is None or self._writer is None:
            if self._writer is not None and not self._warned:
                self._warned = True
                logging.warning(
                    "config.train.async_checkpoint: this checkpoint cannot be copied to host "
                    "memory (an object with a saver of its own, or a TensorFlow without the API "
                    "tpurun uses); saving while training waits."
                )
            self._commit(snapshot)
            now = time.monotonic()
            self._saved.append(Saved(step, snapshot.path, now - started, now - started))
            return snapshot.path
        copied = time.monotonic()
        done = self._writer.submit(lambda: self._commit(snapshot))
        self._in_flight = _InFlight(step, snapshot.path, done, started, copied - started)
        return snapshot.path

    def poll(self) -> list[Saved]:
        """The saves that became the newest checkpoint since the last call, oldest first.

        Raises the error of a background save that failed.
        """
        if self._in_flight is not None and self._in_flight.done.done():
            self._finish()
        saved, self._saved = self._saved, []
        for each in saved:
            if each.background:
                how = f"written in the background in {each.seconds:.2f}s; training waited "
                how += f"{each.waited:.2f}s for it"
            else:
                how = f"written in {each.seconds:.2f}s while training waited"
            logging.info("Saved checkpoint %s. (%s)", each.path, how)
        if saved:
            self._last = saved[-1]
        return saved

    def wait(self) -> list[Saved]:
        """`poll()` once the save in flight, if any, is written: for a checkpoint that must
        be there before the run goes on (evaluated, the last, before a stop)."""
        started = time.monotonic()
        if self._in_flight is not None:
            self._finish()
            # The loop waited for all of this one: said so in its log line.
            last = self._saved[-1]
            waited = last.waited + time.monotonic() - started
            self._saved[-1] = dataclasses.replace(last, waited=waited)
        return self.poll()

    def close(self) -> None:
        """Training ended early (an error, Ctrl-C): the save in flight is finished, so the
        checkpoint is whole and the lease still held. Its own failure is only logged:
        the error that ended training is the one to report."""
        try:
            self._finish()
            self.poll()  # its log line
        except Exception as e:  # noqa: BLE001 - whatever the save raised; the run's error wins
            logging.warning("The checkpoint being saved in the background failed too: %s", e)

    def _finish(self) -> None:
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            ended = flight.done.result()  # its error, raised here
            seconds = ended - flight.started
            self._saved.append(Saved(flight.step, flight.path, seconds, flight.waited, True))

    def _commit(self, snapshot: checkpoints.Snapshot) -> float:
        assert self._saver is not None
        try:
            self._saver.commit(snapshot)
        except Exception as e:
            # A storage failure mid-save leaves ckpt-<step>_temp/ (or a .data without
            # its .index): removed now if the storage lets us, else by the next run.
            self._saver.discard(snapshot)
            if not isinstance(e, (OSError, tf.errors.OpError)):
                raise
            raise save_failed(self._model_dir, snapshot.path, e) from None
        return time.monotonic()

    def _take_part(self, step: int) -> str:
        """A worker's part in the save: a copy to scratch (no state, no retention), deleted;
        in the background mode only the copy to host memory (reading the state is the part
        every worker must play)."""
        self._checkpoint.save_counter.assign_add(1)
        if self._writer is None or tf_internals.host_copy(self._checkpoint) is None:
            assert self._scratch is not None
            self._checkpoint.write(checkpoints.path_of(self._scratch, step))
            checkpoints.remove_scratch(self._model_dir, self._scratch)
        return checkpoints.path_of(self._model_dir, step)  # the chief's copy


# A failed save's cause on a local disk, by the words of the OS (in TensorFlow's message
# too), and the fix.
_WRITABLE = "make it writable for this user (its permissions, `chattr -i`)"
_CAUSES = (
    (errno.ENOSPC, "No space left on device", "the disk is full", "make room on it"),
    (errno.EROFS, "Read-only file system", "its file system is read-only", "remount it read-write"),
    (errno.EACCES, "Permission denied", "writing there is not permitted", _WRITABLE),
    (errno.EPERM, "Operation not permitted", "writing there is not permitted", _WRITABLE),
)


def save_failed(model_dir: str, path: str, error: OSError | tf.errors.OpError) -> TpurunError:
    """The one line for a save that failed in storage, in the background or not: the
    model_dir, the cause and its fix, and the last good checkpoint (intact: the failed
    save's files were removed, `Saver.discard`); Unavailable for gs:// failing past its
    retries (a restart resumes), else RunError."""
    message = " ".join(str(getattr(error, "message", None) or error).split())
    where = f"could not save {storage.basename(path)} in --model_dir={model_dir}"
    explained = storage_errors.explain(message, type(error).__name__)
    if storage.is_local(model_dir) and not os.path.isdir(model_dir):
        gone = "is no longer a directory" if os.path.lexists(model_dir) else "is gone"
        return RunError(
            f"{where}: the model_dir {gone} (removed or replaced while training?), and its "
            "checkpoints with it; restore it from a copy to resume, or rerun the same command "
            "to train from step 0"
        )
    code = getattr(error, "errno", None)
    cause, fix = next(
        (
            (f"{what} ({words})", fix)
            for number, words, what, fix in _CAUSES
            if code == number or words in message
        ),
        (explained or f"{type(error).__name__}: {message[:200]}", "fix the storage"),
    )
    try:
        latest = checkpoints.latest(model_dir)
    except Exception:  # noqa: BLE001 - the storage that failed may fail this too
        latest = None
    kept = (
        f"the last good checkpoint is {storage.basename(latest)} (intact: nothing of the "
        "failed save is left)"
        if latest
        else "no checkpoint was saved before it"
    )
    line = f"{where}: {cause}; {kept}: {fix}, then rerun the same command to resume"
    transient = explained and storage_errors.is_transient(message, type(error).__name__)
    return (Unavailable if transient else RunError)(line)
