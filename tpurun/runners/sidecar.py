"""`eval --continuous`: a sidecar evaluator beside a training run, in a process of its own.

It drives the same eval actions as `train --eval_every` (`tpurun.actions.evaluation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.errors import RunError
from tpurun.layout import names
from tpurun.run_config import RunConfig
from tpurun.run_config.splits import Splits
from tpurun.storage import checkpoints, records
from tpurun.storage.eval_results import evaluated_before

# How often a sidecar looks for a new checkpoint: one stat of the small `checkpoint`
# state file (on gs:// one metadata request, fewer within TensorFlow's 5-second stat
# cache), and a second is short next to the time between saves.
POLL_SECONDS = 1.0


def saved_checkpoints(model_dir: str) -> list[str]:
    """model_dir's complete checkpoints, oldest first, as its `checkpoint` state file lists them.

    The state file, not a glob of ckpt-* files: a save rewrites it (atomically)
    only after every file of the new checkpoint is written, so what it lists was
    complete, though keep_checkpoint_max may have deleted it since.
    """
    try:
        return checkpoints.state(model_dir) or []
    except records.DamagedRecord as e:
        logging.warning("%s; going by the checkpoint files instead.", e)
        return sorted(checkpoints.candidates(model_dir), key=checkpoints.step_of)


class StateWatch:
    """`saved_checkpoints` of a model_dir, read again only when its state file changed.

    A poll stats the state file (one request on gs://) and downloads it only when
    its time or size moved: a save rewrites it.
    """

    def __init__(self, model_dir: str):
        self._model_dir = model_dir
        self._path = storage.join(model_dir, names.STATE_FILE)
        self._seen: tuple[int, int] | None = None
        self._listed: list[str] = []

    def saved_checkpoints(self) -> list[str]:
        try:
            stat = tf.io.gfile.stat(self._path)
            version: tuple[int, int] | None = (stat.mtime_nsec, stat.length)
        except tf.errors.NotFoundError:
            version = None
        if version is None:  # no state file: no save finished yet
            self._listed = []
        elif version != self._seen:
            self._listed = saved_checkpoints(self._model_dir)
        self._seen = version
        return self._listed


def still_saved(path: str) -> bool:
    """Whether the checkpoint's files are all still there (keep_checkpoint_max deletes them)."""
    index, data = names.index_file(path), names.data_files_glob(path)
    return tf.io.gfile.exists(index) and bool(tf.io.gfile.glob(data))


def _nothing_appeared(run: RunConfig) -> RunError:
    return RunError(
        f"no checkpoint appeared in {run.model_dir} within --eval_timeout={run.eval_timeout:g}s; "
        f"start tpurun train --config={run.config_name} --model_dir={run.model_dir} "
        "(before or after the sidecar), or raise --eval_timeout"
    )


def wait_for_checkpoint(run: RunConfig) -> None:
    """Waits until model_dir has a checkpoint, up to --eval_timeout seconds; reads nothing else.

    A sidecar may start before the trainer has created model_dir; until the first
    checkpoint it writes nothing, so one that gives up leaves no trace.
    """
    deadline = time.monotonic() + run.eval_timeout
    logged = False
    watch = StateWatch(run.model_dir)
    while not watch.saved_checkpoints():
        if time.monotonic() >= deadline:
            raise _nothing_appeared(run)
        if not logged:
            logging.info("Waiting for a checkpoint in %s.", run.model_dir)
            logged = True
        time.sleep(POLL_SECONDS)


def evaluate_continuously(
    run: RunConfig,
    evaluate: Callable[[str], dict[str, float]],
    report: Callable[[str, dict[str, float]], None],
    model_splits: Splits,
) -> str:
    """Evaluates every checkpoint of model_dir once, in step order, as they appear, on the
    split `model_splits.chosen` (--split).

    Stops after the checkpoint of the final step (config train.steps), or after
    --eval_timeout seconds without a new one; returns the line saying which.
    A checkpoint with eval/<split>/results-<step>.json was evaluated already on
    that split (by an earlier sidecar, `tpurun eval` or `train --eval_every`): an
    evaluation is exact, so doing it again would only repeat the numbers; it is
    skipped. Sidecars on different splits write different files: they run side by
    side. One deleted by keep_checkpoint_max before it was read is skipped too.
    """
    final, timeout = run.train_steps, run.eval_timeout
    epochs = run.config.train.epochs
    of_epochs = f"--train_epochs={epochs:g}: {final} steps" if epochs else ""
    seen: set[int] = set()
    evaluated: list[int] = []
    deadline = time.monotonic() + timeout
    watch = StateWatch(run.model_dir)
    while True:
        new = [p for p in watch.saved_checkpoints() if checkpoints.step_of(p) not in seen]
        if len(new) > 1:
            logging.info(
                "%d new checkpoints (steps %s): evaluating each, in step order.",
                len(new),
                ", ".join(str(checkpoints.step_of(p)) for p in new),
            )
        for path in new:
            step = checkpoints.step_of(path)
            seen.add(step)
            results = _evaluate_once(run, path, evaluate, model_splits)
            if results is not None:
                report(path, results)
                evaluated.append(step)
        if new:
            deadline = time.monotonic() + timeout
        if seen and max(seen) >= final:
            return (
                f"eval --continuous: stopped after the checkpoint of the final step {max(seen)} "
                f"({of_epochs or f'--train_steps={final}'}); evaluated {len(evaluated)} "
                "checkpoint(s) in this run"
            )
        if time.monotonic() >= deadline:
            if not seen:
                raise _nothing_appeared(run)
            return (
                f"eval --continuous: stopped: no new checkpoint in {run.model_dir} for "
                f"{timeout:g}s (--eval_timeout) and the final step {final} "
                f"({of_epochs or '--train_steps'}) is "
                f"not reached; evaluated {len(evaluated)} checkpoint(s) in this run, the newest "
                f"is step {max(seen)}"
            )
        time.sleep(POLL_SECONDS)


def _evaluate_once(
    run: RunConfig, path: str, evaluate: Callable[[str], dict[str, float]], model_splits: Splits
) -> dict[str, float] | None:
    """The checkpoint's results; None if it was evaluated before or deleted before it was read."""
    step = checkpoints.step_of(path)
    done = evaluated_before(run.model_dir, step, model_splits.chosen, model_splits.best)
    if done is not None:
        logging.info(
            "Step %d was evaluated on %s before (%s): not again.", step, model_splits.chosen, done
        )
        return None
    deleted = f"Checkpoint {path} was deleted (keep_checkpoint_max) before it was read: skipped."
    if not still_saved(path):
        logging.warning(deleted)
        return None
    try:
        return evaluate(path)
    except checkpoints.CheckpointGone:
        # Only a failure to read the checkpoint itself: once restored, any error
        # (bad eval data, no examples) is the run's error, deleted checkpoint or not.
        if still_saved(path):
            raise
        logging.warning(deleted)
        return None
