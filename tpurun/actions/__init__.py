"""What the controller calls around the compiled loops: each action one job, given explicit values.

* `base`: the Action hooks, LoopStats, Saved, SaveState;
* `selection.for_training`: the actions a training run gets;
* `save.SaveCheckpoint`: a checkpoint at a step (the controller decides when);
* `evaluation`: evaluate a checkpoint, then its results file, TensorBoard, the best, a line;
* `progress`: a live line on a terminal or log lines, the input-bound warning, the resume
  cost (`ResumeCost` times the restore from its making: made just before it);
* `summaries.TrainSummaries`: TensorBoard scalars per loop and the model's graph (on gs://
  uploaded in the background: `tpurun.storage.background`);
* `profiler.ProfileSteps`: `--profile_steps`;
* `hang.HangTimeout` and `watchdog`: `--hang_timeout`;
* `lease_renewal.RenewLease`: the trainer's lease on model_dir, kept fresh;
* `goodput.GoodputRecord`: the run's time account, in its run record.
"""

from __future__ import annotations

from tpurun.actions.base import Action, LoopStats
from tpurun.actions.selection import for_training

__all__ = ["Action", "LoopStats", "for_training"]
