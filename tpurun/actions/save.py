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
    and delete it. Built after the restore, since TensorFlow's CheckpointManager
    reads the state file, which the restore may rewrite.
    """

    def __init__(self, run: RunConfig, checkpoint: tf.train.Checkpoint, cluster: Cluster):
        self._model_dir = run.model_dir
        self._scratch = None if cluster.is_chief else checkpoints.scratch_dir(run, cluster.task)
        self._manager = checkpoints.manager(run, checkpoint, self._scratch)

    def __call__(self, step: int) -> str:
        try:
            path = self._manager.save(checkpoint_number=step)
        except tf.errors.OpError:
            # A storage failure mid-save leaves ckpt-<step>_temp/ (or a .data without
            # its .index): removed now if the storage lets us, else by the next run.
            if self._scratch is None:
                checkpoints.remove_partial_saves_quietly(self._model_dir)
            raise
        if self._scratch is None:
            logging.info("Saved checkpoint %s.", path)
            return path
        checkpoints.remove_scratch(self._model_dir, self._scratch)
        return checkpoints.path_of(self._model_dir, step)  # the chief's copy
