"""Checkpoints in model_dir: `ckpt-<step>` files, the newest `keep_checkpoint_max` kept (`Saver`).

A save is atomic in the way that matters: TensorFlow writes the tensors to a
`ckpt-<step>_temp` directory and merges them into `ckpt-<step>.index/.data-*`,
and only then is the `checkpoint` state file rewritten (atomically). A process
killed at any moment therefore leaves either the new complete checkpoint or the
previous state. On resume every candidate is checked
(the tensor bundle carries a CRC32C per tensor, verified as it is read) and a
damaged one is moved to `model_dir/damaged/`, falling back to the one before.

The `checkpoint` state file is only trusted once checked: a garbled one, or one
naming paths outside model_dir (the saver deletes old checkpoints by the paths it
lists), is rebuilt from the checkpoint files present.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging
from google.protobuf import message as protobuf_message
from google.protobuf import text_format

from tpurun import storage, tf_internals
from tpurun.errors import RunError
from tpurun.errors.tf_errors import one_line
from tpurun.layout import names
from tpurun.run_config import RunConfig
from tpurun.storage import records, train_config
from tpurun.storage.background import checkpoint_upload

# What a read raises when the storage, not the file, failed (GCS unavailable, no
# permission): never a reason to call a checkpoint damaged. A damaged file raises
# DataLoss, NotFound, OutOfRange, a bare OpError ("too short to be an sstable"),
# IndexError ("read less bytes than requested"), ValueError, AssertionError, ...
NOT_DAMAGE = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.ResourceExhaustedError,
    tf.errors.PermissionDeniedError,
    tf.errors.UnauthenticatedError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A checkpoint's state at one step, to be written as `path` (`Saver.commit`).

    `tensors`: its values in host memory (`tf_internals.host_copy`), which another
    thread can write while training goes on; None for a save written from the
    checkpoint's live variables, on the training thread.
    """

    path: str
    tensors: Any | None


class Saver:
    """`save(step)` writes ckpt-<step> into model_dir and keeps the newest `keep_checkpoint_max`.

    TensorFlow's CheckpointManager rewrites the state file twice per save (naming the
    checkpoints it is about to delete, then without them), each through a temporary
    and a rename: 12 of a save's ~40 requests on gs://. Here it is written once,
    naming the new checkpoint and not those about to go, and only then are they
    deleted (the .index first, as TensorFlow does). A kill in between leaves whole
    checkpoints the state does not name: a resume goes by the files, lists them
    again, and the next save deletes them. Make it after `restore_newest_intact`,
    which leaves a state file that names what is there.

    A background save is `snapshot(step)` on the training thread (the state copied
    to host memory: all the loop waits for), then `commit(snapshot)` on another
    thread, one at a time, in step order; `discard(snapshot)` after a failed commit.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, model_dir: str, keep_checkpoint_max: int):
        self._checkpoint = checkpoint
        self._model_dir = model_dir
        self._keep = keep_checkpoint_max
        self._kept = state(model_dir) or []

    def save(self, step: int) -> str:
        """Writes ckpt-<step> from the live variables; returns its path."""
        return self.commit(self.snapshot(step, host_copy=False))

    def snapshot(self, step: int, host_copy: bool = True) -> Snapshot:
        """The state at `step`; with `host_copy`, in host memory where TensorFlow can copy it
        (else `tensors` is None, and `commit` must run before training goes on)."""
        # Counted as TensorFlow's manager counts (checkpoint.save_counter is saved).
        self._checkpoint.save_counter.assign_add(1)
        tensors = tf_internals.host_copy(self._checkpoint) if host_copy else None
        return Snapshot(path_of(self._model_dir, step), tensors)

    def commit(self, snapshot: Snapshot) -> str:
        """Writes `snapshot` as its checkpoint, then makes it the newest: the state file
        names it, and the checkpoints beyond `keep_checkpoint_max` are deleted."""
        path = snapshot.path
        if snapshot.tensors is None:
            path = self._checkpoint.write(path)
        else:
            checkpoint_upload.write(snapshot.tensors, path)
        kept = [p for p in self._kept if p != path] + [path]
        dropped, keep = kept[: -self._keep], kept[-self._keep :]
        write_state(self._model_dir, keep)
        self._kept = keep
        for old in dropped:
            for file in sorted(files_of(old), key=lambda f: not names.is_index(f)):
                storage.remove_file(self._model_dir, file, names.CHECKPOINT_FILE)
        return path

    def discard(self, snapshot: Snapshot) -> None:
        """After a failed commit: leaves model_dir as it was before the save, so that
        `keep_checkpoint_max` holds. Removes what the save left (`ckpt-<step>_temp/`, a
        .data without its .index) and, unless the state file names it, the checkpoint
        itself (complete, but never made the newest). A storage that still fails is
        logged; the next run removes the rest."""
        remove_partial_saves_quietly(self._model_dir)
        try:
            if snapshot.path in (state(self._model_dir) or []):
                return  # the state file was written: the save happened, only a deletion failed
            for file in sorted(files_of(snapshot.path), key=lambda f: not names.is_index(f)):
                storage.remove_file(self._model_dir, file, names.CHECKPOINT_FILE)
        except (tf.errors.OpError, OSError, records.DamagedRecord) as e:
            logging.warning("Could not remove what the failed save left (the next run will): %s", e)


def write_state(model_dir: str, paths: list[str]) -> None:
    """Writes the `checkpoint` state file naming `paths` (oldest first), as TensorFlow reads it."""
    proto = tf_internals.checkpoint_state_proto()
    proto.model_checkpoint_path = storage.basename(paths[-1])  # relative, as TensorFlow writes
    proto.all_model_checkpoint_paths.extend(storage.basename(p) for p in paths)
    storage.write_atomically(
        storage.join(model_dir, names.STATE_FILE), text_format.MessageToString(proto)
    )


def scratch_dir(run: RunConfig, task: str) -> str:
    """Where a non-chief worker writes its copy of a checkpoint, deleted right after.

    Every worker of a MultiWorkerMirroredStrategy must take part in a save, but
    only the chief's copy is kept.
    """
    scratch = storage.make_dir(run.model_dir, storage.join(run.model_dir, names.SCRATCH_DIR))
    return storage.join(scratch, task)


def remove_scratch(model_dir: str, scratch: str) -> None:
    storage.remove(model_dir, scratch, names.SCRATCH_TASK)


def path_of(model_dir: str, step: int) -> str:
    return names.checkpoint_path(model_dir, step)


def step_of(path: str) -> int:
    step = names.checkpoint_step(path)
    if step is None:
        raise RunError(f"checkpoint {path} is not named ckpt-<step>; was it written by tpurun?")
    return step


def state(model_dir: str) -> list[str] | None:
    """The checkpoints the `checkpoint` state file lists, oldest first, newest last.

    None when there is no state file; DamagedRecord when it is not one tpurun's
    saves write (not text, not the format, a path outside model_dir or not named
    ckpt-<step>).
    """
    path = storage.join(model_dir, names.STATE_FILE)
    text = records.read_text(path)
    if text is None:
        return None
    proto = tf_internals.checkpoint_state_proto()
    try:
        text_format.Parse(text, proto)
    except (text_format.ParseError, protobuf_message.DecodeError) as e:
        raise records.DamagedRecord(path, f"not a checkpoint state: {one_line(e, 100)}") from None
    listed = [*proto.all_model_checkpoint_paths]
    if proto.model_checkpoint_path and proto.model_checkpoint_path not in listed:
        listed.append(proto.model_checkpoint_path)
    paths = []
    for name in listed:
        full = name if "/" in name else storage.join(model_dir, name)
        if not (
            storage.inside(model_dir, full) and names.CHECKPOINT.fullmatch(storage.basename(full))
        ):
            raise records.DamagedRecord(path, f"it names {name}, not a ckpt-<step> of {model_dir}")
        paths.append(full)
    return sorted(set(paths), key=step_of)


def latest(model_dir: str) -> str | None:
    """The newest checkpoint: as the state file says, else (none, or damaged) by the files."""
    try:
        listed = state(model_dir)
    except records.DamagedRecord as e:
        logging.warning("%s; going by the checkpoint files instead.", e)
        listed = None
    if listed:
        return listed[-1]
    found = candidates(model_dir)
    return found[0] if found else None


def require_latest(run: RunConfig) -> str:
    """The newest checkpoint, or a RunError saying how to make one."""
    path = latest(run.model_dir) if storage.isdir(run.model_dir) else None
    if path is None:
        raise RunError(
            f"no checkpoint in {run.model_dir}; train first "
            f"(tpurun train --config={run.config_name} --model_dir={run.model_dir}) "
            "or point --model_dir at a trained run"
        )
    return path


def require_step(run: RunConfig, step: int) -> str:
    """The checkpoint ckpt-<step> of model_dir (--checkpoint), or a RunError listing those there."""
    path = path_of(run.model_dir, step)
    if storage.isdir(run.model_dir) and tf.io.gfile.exists(names.index_file(path)):
        return path
    present = sorted(candidates(run.model_dir), key=step_of) if storage.isdir(run.model_dir) else []
    there = ", ".join(storage.basename(p) for p in present) or "none"
    raise RunError(
        f"no checkpoint {names.checkpoint_name(step)} in {run.model_dir} (--checkpoint); the "
        f"checkpoints there: {there}"
    )


def candidates(model_dir: str) -> list[str]:
    """Every checkpoint in model_dir with an index file, newest step first.

    Read from the files, not only from the state file: a run killed after the
    merge but before the state file was rewritten left a complete newer one, and
    the state file itself may be what is damaged.
    """
    paths = [
        storage.join(model_dir, names.checkpoint_of(name))
        for name in storage.listdir(model_dir)
        if names.CHECKPOINT_INDEX.fullmatch(name)
    ]
    return sorted(paths, key=step_of, reverse=True)


def remove_partial_saves(model_dir: str) -> None:
    """Deletes what an interrupted save or deletion left behind.

    A save killed before its merge leaves a `ckpt-<step>_temp` directory; one
    killed while deleting an old checkpoint leaves its .data without its .index.
    Neither can ever be restored. Only names a save makes, matched in full: a
    user's `ckpt-notes_template/` is not one.
    """
    present = {name.rstrip("/") for name in storage.listdir(model_dir)}
    for name in sorted(present):
        path = storage.join(model_dir, name)
        if names.CHECKPOINT_TEMP.fullmatch(name):
            pattern = names.CHECKPOINT_TEMP
        elif names.CHECKPOINT_DATA.fullmatch(name) and (
            names.index_file(names.checkpoint_of(name)) not in present
        ):
            pattern = names.CHECKPOINT_DATA
        else:
            continue
        logging.info("Removing %s, left by an interrupted save.", path)
        storage.remove(model_dir, path, pattern)


def remove_partial_saves_quietly(model_dir: str) -> None:
    """remove_partial_saves after a failed save; a storage that still fails is only logged."""
    try:
        remove_partial_saves(model_dir)
    except (tf.errors.OpError, OSError) as e:
        logging.warning("Could not remove what the failed save left (the next run will): %s", e)


def files_of(path: str) -> list[str]:
    """The files of checkpoint `path`: its .index and .data-NNNNN-of-NNNNN, by exact name."""
    directory, name = path.rsplit("/", 1)
    return [
        storage.join(directory, file)
        for file in storage.listdir(directory)
        if names.is_file_of(name, file) and names.CHECKPOINT_FILE.fullmatch(file)
    ]


def restore_newest_intact(
    make_checkpoint: Callable[..., tf.train.Checkpoint], run: RunConfig, is_chief: bool
) -> str | None:
    """Restores the newest checkpoint that reads back whole; returns its path (None: none).

    A damaged checkpoint (the tensors do not read back, or do not match the
    model) is moved to model_dir/damaged/ by the chief, and the one before it is
    tried, so a run always resumes from the last complete checkpoint.
    `make_checkpoint(present)` gives a fresh checkpoint object over what the run owns
    for each attempt, with the parts the file has (`_read_whole`): a failed read
    leaves restorations queued on its object (the save counter's, read at the next
    save), which must not outlive it.
    """
    model_dir = run.model_dir
    if is_chief:
        remove_partial_saves(model_dir)
    found = candidates(model_dir)
    if found:
        train_config.check_resume(run)
    damaged: list[str] = []
    reasons: list[str] = []
    for path in found:
        try:
            _read_whole(make_checkpoint, path)
        except NOT_DAMAGE as e:
            # The storage failed, not the file: moving a good checkpoint aside and
            # resuming from an older one would silently throw away steps.
            raise RunError(f"cannot read {path}: {storage.failure(e)}") from None
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways (IndexError, ...)
            damaged.append(path)
            reason = f"{type(e).__name__}: {one_line(e)}"
            reasons.append(reason)
            logging.warning(
                "Checkpoint %s is damaged (%s); trying the one before.", path, reason[:300]
            )
            continue
        if is_chief:
            for bad in damaged:
                _move_aside(bad, model_dir)
            _keep_state_true(model_dir, path)
        return path
    if found:
        raise RunError(
            f"no checkpoint in {model_dir} can be restored ({', '.join(found)}; the newest: "
            f"{reasons[0][:200]}): they are damaged, or do not fit the model of this config; "
            "use the config they were trained with, move them away to train from scratch, "
            "or restore the model_dir from a backup"
        )
    if is_chief:
        _keep_state_true(model_dir, None)
    return None


def _read_whole(make_checkpoint: Callable[..., tf.train.Checkpoint], path: str) -> None:
    """Restores every object of the checkpoint `make_checkpoint(present)` gives from `path`,
    or raises.

    `present` names the parts the file has (its keys' first components): one written
    before a part existed (`model_variables` before tpurun 0.2, `step` before 0.3),
    or without one (`loss_scale` when not trained in float16), restores without it.
    """
    # The reader of the prefix itself: tf.train.list_variables first asks whether the
    # path is a directory, which ram:// answers yes for any prefix of a file name.
    keys = set(tf.compat.v1.train.NewCheckpointReader(path).get_variable_to_shape_map())
    present = {key.split("/", 1)[0] for key in keys}
    checkpoint = make_checkpoint(present)
    if "save_counter" in present:
        # Made now, so that it is read back: a checkpoint object makes its save counter at
        # its first save, and one without it leaves the file's value unread, which
        # TensorFlow warns of on every resume as if part of the model were not restored
        # ("could not be found in the restored object: (root).save_counter"). A value the
        # object really lacks is still warned of.
        checkpoint.save_counter  # noqa: B018 - the property makes the variable
    checkpoint.read(path).assert_existing_objects_matched()


def _move_aside(path: str, model_dir: str) -> None:
    moved_to = storage.move_into(model_dir, files_of(path), names.DAMAGED_DIR)
    logging.warning("Moved the damaged checkpoint %s to %s.", path, moved_to)


def _keep_state_true(model_dir: str, newest: str | None) -> None:
    """Makes the `checkpoint` state file list the intact checkpoints up to `newest`.

    Rewritten when it names another newest (a run killed before it was rewritten,
    a damaged checkpoint moved aside), is damaged, or names paths tpurun would
    not write; left alone (no write) when it is already right.
    """
    try:
        listed = state(model_dir)
    except records.DamagedRecord as e:
        logging.warning("%s; rebuilding it from the checkpoint files.", e)
        listed = []
    if newest is None:
        if listed:  # names checkpoints that are gone: TensorFlow's manager would trust it
            state_file = storage.join(model_dir, names.STATE_FILE)
            storage.remove(model_dir, state_file, names.exactly(names.STATE_FILE))
        return
    present = [p for p in reversed(candidates(model_dir)) if step_of(p) <= step_of(newest)]
    if listed != present:
        write_state(model_dir, present)


class CheckpointGone(RunError):
    """The checkpoint's files disappeared before it was read (deleted by keep_checkpoint_max)."""
