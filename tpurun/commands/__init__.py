"""What each command does, from a RunConfig: the one place a run's pieces are put together.

A command is a row of `tpurun.run_config.command_table` and the function it names: one
module here for each command of a model_dir (`tpurun check` has its package, `tpurun.check`).

* `running`: `run`, a command's run put together from its row: model_dir, the lease, the
  strategy, the model, the run's length, the run record, then the command's function with
  what it `Prepared`; nothing half-made left behind on failure;
* `model_dir`: model_dir created and probed, the checkpoint a command reads, the run record;
* `train`, `evaluate`, `predict`, `export`: each command's function.
"""

from __future__ import annotations

from tpurun.commands.running import Prepared, run

__all__ = ["Prepared", "run"]
