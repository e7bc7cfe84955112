"""Saving a checkpoint at a step: the chief into model_dir, other workers into a scratch dir."""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tpurun import checkpoints
from tpurun.cluster import Cluster
from tpurun.run_config import RunConfig


class SaveCheckpoint:
    """`save(step)` writes `ckpt-<step>` (atomically: see `tpurun.checkpoints`); returns its path.

    Every worker of a MultiWorkerMirroredStrategy must take part in a save, but
    only the chief's copy is kept: the others write theirs to a scratch directory
    and delete it. Built after the restore, since the saver reads the state file,
    which the restore may rewrite.
    """

    def __init__(self, run: RunConfig, checkpoint: tf.train.Checkpoint, cluster: Cluster):
        self._model_dir = run.model_dir
        self._checkpoint = checkpoint
        self._scratch = None if cluster.is_chief else checkpoints.scratch_dir(run, cluster.task)
        self._saver = (
            checkpoints.Saver(checkpoint, run.model_dir, run.config.train.keep_checkpoint_max)
            if cluster.is_chief
            else None
        )

    def __call__(self, step: int) -> str:
        if self._saver is None:
            return self._save_a_copy(step)
        try:
            path = self._saver.save(step)
        except tf.errors.OpError:
            # A storage failure mid-save leaves ckpt-<step>_temp/ (or a .data without
            # its .index): removed now if the storage lets us, else by the next run.
            checkpoints.remove_partial_saves_quietly(self._model_dir)
            raise
        logging.info("Saved checkpoint %s.", path)
        return path

    def _save_a_copy(self, step: int) -> str:
        """A worker's part in the save: its copy, to scratch (no state, no retention), deleted."""
        assert self._scratch is not None
        self._checkpoint.save_counter.assign_add(1)
        self._checkpoint.write(checkpoints.path_of(self._scratch, step))
        checkpoints.remove_scratch(self._model_dir, self._scratch)
        return checkpoints.path_of(self._model_dir, step)  # the chief's copy
