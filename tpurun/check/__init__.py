"""`tpurun check`: would this model run on a TPU? Its steps are traced on the CPU; nothing trains.

A model that trains locally may still fail on a TPU, where every step is compiled
by XLA for 8 (or more) cores: shapes must be static, every op needs an XLA
kernel, int64/float64/string tensors do not cross to the TPU, and the batch must
split evenly. `run_checks` builds what `tpurun train/eval/predict` build for a
v3-8 - 8 replicas (MirroredStrategy over 8 logical CPU devices, or
`--num_shards` of them), the model's input pipelines as `tpurun.inputs` feeds
them, the Trainer/Evaluator/Predictor with their optimizer and metrics - and
then only traces each replica step (`steps.StepChecker`):

* the input batches' `element_spec` (rules `static-batch`, `dtype`) and the
  batch split (`batch-split`, `batch-padding`);
* the replicated step's graph, walked op by op, nested functions (while bodies,
  cond branches, inner tf.functions) included (`dynamic-shape`, `summary`,
  `dtype`, `xla-unsupported`);
* the replica step compiled by XLA for the CPU (`xla-unsupported`, `xla-compile`).

No step runs: no variable changes, nothing is written (no model_dir, no
checkpoint). Every problem is a `Finding` with the fix; `report` prints them.
`tpurun check` exits 1 if any finding is an error; warnings alone exit 0.

Flags: `--num_shards=N` checks N replicas instead of 8 (e.g. 32 for a v3-32);
the batch flags and `--config.<key>` overrides apply as for train/eval/predict.
`--use_tpu`, `--tpu` and `--model_dir` are accepted but unused: check always
runs on the CPU and neither reads nor writes a model_dir.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import sys
from collections.abc import Iterator
from typing import TextIO

import keras
import tensorflow as tf
from absl import logging

from tpurun import model as model_lib
from tpurun import precision, strategy
from tpurun.check.findings import ERROR, Finding, merge, report
from tpurun.check.steps import StepChecker
from tpurun.cluster import Cluster
from tpurun.errors import RunError
from tpurun.model import Mode
from tpurun.run_config import RunConfig

__all__ = ["DEFAULT_REPLICAS", "Finding", "main", "report", "run_checks"]

# The cores of a Cloud TPU v2-8 / v3-8: what `tpurun check` checks for by default.
DEFAULT_REPLICAS = 8


def run_checks(run: RunConfig) -> list[Finding]:
    """Traces the model's train, eval and predict steps as on a TPU; returns every problem.

    Must be called before TensorFlow has run an op (the CPU is split into replicas).
    """
    replicas = run.num_shards or DEFAULT_REPLICAS
    if run.use_tpu or run.tpu:
        logging.info("tpurun check traces on the CPU; --use_tpu/--tpu are not used.")
    cluster = cpu_cluster(replicas)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(run.seed)
    with _quiet_tensorflow_info(), precision.policy(run.config.precision):
        checker = StepChecker(run, cluster, model)
        problems = checker.batch_split()
        for mode in Mode:
            problems += checker.check_mode(mode)
    return merge(problems)


@contextlib.contextmanager
def _quiet_tensorflow_info() -> Iterator[None]:
    """Hides TensorFlow's INFO lines while tracing (each replica's device list, and the
    traceback of every failure, which becomes a finding), unless --verbosity>=1."""
    tf_logger = std_logging.getLogger("tensorflow")
    level = tf_logger.level
    if not std_logging.getLogger().isEnabledFor(std_logging.DEBUG):
        tf_logger.setLevel(max(level, std_logging.WARNING))
    try:
        yield
    finally:
        tf_logger.setLevel(level)


def main(run: RunConfig, out: TextIO | None = None) -> None:
    """`tpurun check`: prints the findings and a verdict; raises RunError (exit 1) on errors.

    `out`: default the sys.stdout of the call (not of the import: tests swap it).
    """
    out = out or sys.stdout
    replicas = run.num_shards or DEFAULT_REPLICAS
    layout = f"{replicas} replica{'s' if replicas > 1 else ''}"
    layout += " (a v3-8)" if replicas == DEFAULT_REPLICAS else ""
    findings = run_checks(run)
    errors = sum(f.severity == ERROR for f in findings)
    warnings = len(findings) - errors
    if report(findings, out):
        raise RunError(
            f"{errors} error(s) and {warnings} warning(s) above: {run.config_name} would fail "
            f"on a TPU with {layout}; fix the errors and rerun `tpurun check`"
        )
    note = f" ({warnings} warning(s) above)" if warnings else ""
    print(
        f"tpurun check: clean: the train, eval and predict steps of {run.config_name} traced "
        f"and compiled as on a TPU with {layout}, with no errors{note}",
        file=out,
    )


def cpu_cluster(replicas: int) -> Cluster:
    """`replicas` logical CPU devices under MirroredStrategy, as `--num_shards` gives locally."""
    try:
        # The TPU's stand-in is the CPU, even on a machine with GPUs.
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        pass  # TensorFlow already initialised: _local says if the CPU split is missing
    return strategy.local(replicas)
