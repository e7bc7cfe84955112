"""`tpurun check`: would this model run on a TPU? Its steps are traced on the CPU; nothing trains.

The package, top to bottom: each room imports only those below it (setup.cfg's
`[importlinter:contract:check]`).

* `command`: the `tpurun check` command: the run's steps traced and checked, with
  `--target` sized and bounded, then the table, the findings and the verdict printed.
* `report/`: what check says of a step's memory, and what it writes: the table
  (`fit_report`, also the `--report` JSON), the `memory` finding and its levers
  (`fit_findings`), and the same advice on the device for a TPU's out-of-memory error,
  with the memory a finished run records (`device_memory`).
* `bounds/`: how fast and how cheap a step can be at best (`step_bounds`), whether the
  target's hosts keep its chips fed (`host_input`), and MFU's numerator and denominator
  for `tpurun report` (`step_flops`, `peaks`).
* `sizing/`: each step's memory per replica on the target: the TPU's own compiler
  (`tpu_compiler/`), else the XLA:CPU estimate (`memory`, from `buffers`), searched for
  the largest batch that fits (`batch_search`, `preflight`).
* `rules/`: the TPU rules on a traced step: the steps built as the runners build them
  (`step_builds`, also what sizing and bounds take) and checked (`steps`): the input (`input_rules`), the graph walked op
  by op (`graph_walk`, what each finding means and its fix: `fixes`, `origin`), XLA's
  compile (`xla`), the replica count (`replica_rules`); the findings (`findings`); every
  private Keras and TensorFlow detail they read (`introspection`).
* `targets`: the Cloud TPU accelerator types: replicas, hosts, HBM, peaks and prices.

Below: what the rest of tpurun calls.
"""

from __future__ import annotations

from tpurun.check.bounds.peaks import peak_flops
from tpurun.check.bounds.step_flops import train_step_flops
from tpurun.check.command import main
from tpurun.check.report.device_memory import out_of_memory, record_memory
from tpurun.check.rules.replica_rules import batch_norm_warning

__all__ = [
    "batch_norm_warning",  # train: rule batch-norm, said where the run's log begins
    "main",  # `tpurun check`
    "out_of_memory",  # train/eval/predict: a TPU's out-of-memory error as check's advice
    "peak_flops",  # a finished train's account: the devices' peak FLOP/s
    "record_memory",  # the run record: the devices' peak memory beside the estimate
    "train_step_flops",  # a finished train's account: the FLOPs of its step
]
