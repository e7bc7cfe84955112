"""What a command does with model_dir around its run: created and probed (train), the
checkpoint it reads chosen (eval, predict, export), the run record written, and what a
failed run made removed again."""

from __future__ import annotations

import json
import sys
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.actions.goodput import initial_account
from tpurun.cluster import is_chief_process
from tpurun.errors import RunError, Unavailable, storage_errors
from tpurun.errors.tf_errors import one_line
from tpurun.foreign import outside
from tpurun.layout import names, time_account
from tpurun.run_config import (
    RunConfig,
)
from tpurun.run_config.command_table import COMMAND, ModelDir
from tpurun.runners import restore
from tpurun.storage import best, checkpoints


def require_checkpoint(run: RunConfig) -> None:
    """Fails unless there is a checkpoint to read (the latest, or the one --best or
    --checkpoint chose)."""
    checkpoints.require_latest(run)
    if run.best:
        best.require(run)
    elif isinstance(run.checkpoint, int):
        checkpoints.require_step(run, run.checkpoint)


def chosen_checkpoint(run: RunConfig) -> restore.Chosen:
    """What eval, predict and export read: --best's, --checkpoint=N's or =PATH's, else the
    latest."""
    if isinstance(run.checkpoint, str):
        return outside.open_outside(run)
    if run.best:
        chosen = best.require(run)
        logging.info(
            "The best checkpoint: step %d, %s=%.4f%s (%s).",
            chosen.step,
            chosen.metric,
            chosen.value,
            f" on {chosen.split}" if chosen.split else "",
            chosen.path,
        )
        return chosen.path
    if run.checkpoint is not None:
        return checkpoints.require_step(run, run.checkpoint)
    return checkpoints.require_latest(run)


def outputs(run: RunConfig) -> object:
    """What a run keeps even when it fails later: train's checkpoints, a sidecar's results."""
    if COMMAND[run.command].model_dir is ModelDir.WRITES:
        return checkpoints.latest(run.model_dir)
    if run.continuous:
        found = []
        for pattern in names.eval_results_globs(run.model_dir):
            try:
                found += tf.io.gfile.glob(pattern)
            except tf.errors.NotFoundError:
                pass
        return sorted(found)
    return None  # eval/predict/export write their one output last


def undo(model_dir: str, created: bool, record: str | None) -> None:
    """Removes model_dir if this run created it, else this run's record; never raises."""
    try:
        if created:
            storage.remove_tree(model_dir)
        elif record:
            storage.remove_file(model_dir, record, names.RUN_RECORD)
    except (tf.errors.OpError, OSError) as e:
        logging.warning("Could not clean up after the failed run: %s", e)


# --- model_dir and the run record ----------------------------------------------------


def prepare_model_dir(run: RunConfig) -> bool:
    """Creates model_dir, or fails with a message if it cannot be written.

    Returns whether it created the directory (then a failed run removes it again).
    The chief also removes what tpurun processes that died left there.
    """
    try:
        created = not storage.isdir(run.model_dir)
        storage.make_dir(run.model_dir, run.model_dir)
        # A name of its own: every worker of a cluster probes the same model_dir at
        # once, and one removing another's probe made that one fail.
        storage.probe_writable(run.model_dir)
        if not created and is_chief_process():
            storage.remove_leftovers(run.model_dir)
    except (tf.errors.OpError, OSError) as e:
        # On gs:// what failed and its fix (a bucket, credentials, a role), else the message.
        message = str(getattr(e, "message", None) or e)
        explained = storage_errors.explain(message, type(e).__name__)
        transient = explained and storage_errors.is_transient(message, type(e).__name__)
        raise (Unavailable if transient else RunError)(
            f"cannot write to --model_dir={run.model_dir}: {explained}"
            if explained
            else f"cannot write to --model_dir={run.model_dir} ({one_line(e)}); "
            "choose a directory you can write"
        ) from None
    return created


def write_record(run: RunConfig) -> tuple[str, dict[str, Any]]:
    """The run record: run config and versions, one JSON file per run under model_dir/runs
    (a train's also the start of its time account: `actions.goodput`). Its path and content."""
    runs = storage.make_dir(run.model_dir, names.runs_dir(run.model_dir))
    path = storage.join(runs, names.run_record_name(run.command))
    record = json.loads(run.record(tf.__version__))
    if COMMAND[run.command].keeps_account:
        record[time_account.KEY] = initial_account()
    storage.write_atomically(path, time_account.record_text(record))
    print(f"tpurun {run.command}: model_dir {run.model_dir}", file=sys.stderr)
    return path, record
