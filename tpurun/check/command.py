"""The `tpurun check` command: would this model run on a TPU? Its steps are traced on the CPU;
nothing trains.

A model that trains locally may still fail on a TPU, where every step is compiled
by XLA for 8 (or more) cores: shapes must be static, every op needs an XLA
kernel, int64/float64/string tensors do not cross to the TPU, and the batch must
split evenly. `run_checks` builds what `tpurun train/eval/predict` build for a
v3-8 - 8 replicas (MirroredStrategy over 8 logical CPU devices, or
`--num_shards` of them), the model's input pipelines as `tpurun.inputs` feeds
them, the Trainer/Evaluator/Predictor with their optimizer and metrics - and
then only traces each replica step (`rules.steps.StepChecker`):

* the input batches' `element_spec` (rules `static-batch`, `dtype`) and the
  batch split (`batch-split`, `batch-padding`);
* the replicated step's graph, walked op by op, nested functions (while bodies,
  cond branches, inner tf.functions) included (`dynamic-shape`, `summary`,
  `dtype`, `xla-unsupported`);
* the replica step compiled by XLA for the CPU (`xla-unsupported`, `xla-compile`);
* the train step's model on more than one replica: BatchNormalization that
  normalises by each replica's own statistics (`batch-norm`, a warning:
  `rules.replica_rules`);
* with config.data.service, Python in the training input's tf.data graph, which a
  tf.data service's workers cannot run (`data-service`, `tpurun.data_service.pipeline`).

With `--target=TYPE` (a Cloud TPU accelerator type, `tpurun.check.targets`),
the replicas are the slice's, and each step is compiled by the TPU's own compiler
for that generation (`sizing.tpu_compiler`, the `tpu-compile` extra; without it,
XLA's CPU compile estimates it): its memory per replica against a replica's HBM
(`sizing.preflight`, rule `memory`), its FLOPs and bytes against the chip's peaks,
which bound its time and the run's price (`bounds.step_bounds`), and the model's
training input runs here for a few seconds to say whether the target's hosts would
keep its chips fed (`bounds.host_input`; where they would not, how many tf.data service
workers would, `tpurun.data_service.sizing`); `report.fit_report` prints the table and
writes `--report`. On the TPU itself `train`/`eval`/`predict` use the same estimate
(`report.device_memory`): an out-of-memory error becomes that advice, and the run
record keeps it beside the measured peak.

No step runs (only the training input, with --target): no variable changes, nothing is written (no model_dir, no
checkpoint; only the `--report` file asked for). Every problem is a `Finding`
with the fix; `rules.findings.report` prints them. `tpurun check` exits 1 if any finding is an
error; warnings alone exit 0.

Flags: `--num_shards=N` checks N replicas instead of 8 (e.g. 32 for a v3-32);
the batch flags and `--config.<key>` overrides apply as for train/eval/predict.
`--use_tpu`, `--tpu` and `--model_dir` are accepted but unused: check always
runs on the CPU and neither reads nor writes a model_dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as std_logging
import sys
from collections.abc import Iterator
from typing import NamedTuple, TextIO

import keras
import tensorflow as tf
from absl import logging

from tpurun import data_service, inputs, precision
from tpurun import model as model_lib
from tpurun.actions.progress import announced
from tpurun.check import targets
from tpurun.check.bounds import host_input, step_bounds
from tpurun.check.bounds.host_input import HostInput
from tpurun.check.report import fit_findings, fit_report
from tpurun.check.rules import xla
from tpurun.check.rules.findings import ERROR, Finding, Problem, merge, report
from tpurun.check.rules.steps import StepChecker
from tpurun.check.sizing import preflight
from tpurun.check.sizing.preflight import TargetMemory
from tpurun.check.sizing.tpu_compiler import client
from tpurun.check.sizing.tpu_compiler.sizing import TpuSizer
from tpurun.check.targets import Target
from tpurun.cluster import Cluster, determinism, strategy
from tpurun.datasets import train_count
from tpurun.errors import RunError, UsageError
from tpurun.foreign.warm_start import print_mapping
from tpurun.model import Mode
from tpurun.run_config import RunConfig, epochs
from tpurun.tpu_vm import installed, launch_lines

# The cores of a Cloud TPU v2-8 / v3-8: what `tpurun check` checks for by default.
DEFAULT_REPLICAS = 8
# The steps are traced on at most this many logical CPU devices, a slice's per-replica
# batch kept (StepChecker's `replicas` are the slice's). A step is traced once per
# replica, and a second replica shows what more would (code that differs by replica,
# the cross-replica sums); a v5e-8 check of Iris took 7.6 CPU-s on 8, 5.0 on 2.
MAX_TRACED_REPLICAS = 2


def run_checks(run: RunConfig, target: Target | None, cluster: Cluster) -> Checked:
    """Traces the model's train, eval and predict steps as on a TPU; returns every problem,
    and with a `target` the memory of each step on it and whether its hosts' input keeps
    up with its train step (`host_input`, unless --input_check=false).

    `cluster`: `cpu_cluster(_traced_replicas(run, target))`, made before TensorFlow ran
    an op (the CPU is split into replicas).
    """
    replicas = target.replicas if target else run.num_shards or DEFAULT_REPLICAS
    if run.use_tpu or run.tpu:
        logging.info("tpurun check traces on the CPU; --use_tpu/--tpu are not used.")
    model = model_lib.create(run.config)
    model_lib.check_model_config(model)
    arrays = None
    if run.needs_examples:  # steps from epochs: the horizon of cosine and linear schedules
        arrays = inputs.train_arrays(model)
        # check neither reads nor writes a model_dir: no recorded examples.
        run = epochs.resolve_length(run, train_count.counted(model, arrays))
        model.config = run.config  # its optimizer's schedule, in the steps they made
    keras.utils.set_random_seed(run.seed)
    found = host = None
    with _quiet_tensorflow_info(), precision.policy(run.config.precision):
        if target:  # a TPU slice, traced on CPU devices
            cluster = dataclasses.replace(cluster, hosts=target.hosts, device_kind="TPU")
        checker = StepChecker(run, cluster, model, replicas=replicas, arrays=arrays)
        problems = checker.batch_split() + _service_problems(checker)
        # Step by step, a line each: a large model's steps take minutes to trace and compile.
        for mode in Mode:
            doing = f"the {mode.value} step on {replicas} replica{'s' * (replicas > 1)}"
            with announced(f"Tracing and compiling {doing}", f"Checked {doing}"):
                problems += checker.check_mode(mode)
        if target is not None:
            # Only the steps without errors: one that a TPU would reject has no memory to size.
            failing = {p.step for p in problems if p.severity == ERROR}
            for mode in failing:
                checker.single_device_steps.pop(mode, None)
            sizer, note = tpu_sizer(target, run.compile_timeout)
            sizing = f"each step's memory per replica on a {target.name}"
            with announced(f"Sizing {sizing}", f"Sized {sizing}"):
                found = preflight.estimate_steps(checker, target, sizer, note)
            problems += fit_findings.problems(run, found)
            host = host_input.check(checker, found) if run.input_check else None
            host = host or host_input.skipped(target)
    return Checked(merge(problems), found, host, run)


def _service_problems(checker: StepChecker) -> list[Problem]:
    """Rule data-service: with config.data.service, Python in the training input's graph."""
    line = data_service.checked_refusal(
        checker.run, checker.model, checker.arrays, checker.replicas
    )
    if line is None:
        return []
    message, _, fix = line.partition("; ")
    return [Problem("data-service", ERROR, "config.data.service", message, fix, Mode.TRAIN)]


class Checked(NamedTuple):
    """What `run_checks` found, and the run it checked: its epochs turned into steps."""

    findings: list[Finding]
    found: TargetMemory | None
    host: HostInput | None
    run: RunConfig


def tpu_sizer(
    target: Target, compile_timeout: float = client.COMPILE_TIMEOUT_S
) -> tuple[TpuSizer | None, str | None]:
    """The TPU compiler of the target's generation, or None and why there is none.
    `compile_timeout`: --compile_timeout, the seconds one compile may take."""
    conflict = installed.tpu_compiler_conflict()  # tensorflow-tpu is installed here
    if conflict:
        return None, conflict
    missing = client.missing_extra()
    if missing is not None:
        return None, (
            f"the TPU compiler is not installed ({missing} is missing): {client.INSTALL} "
            "sizes each step with the TPU's own compiler"
        )
    compiler = client.shared()
    compiler.compile_timeout = compile_timeout
    return TpuSizer(compiler, targets.generation(target.generation)), None


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

    With --target also the memory table, before the findings, and the --report file.
    `out` defaults to the sys.stdout of the call (not of the import: an in-process
    run's captured stream).
    """
    out = out or sys.stdout
    target = _target(run)
    # Before XLA's probe, which runs this process's first op and so fixes TensorFlow's
    # devices: the CPU is split into the traced replicas first, or the split fails.
    cluster = cpu_cluster(_traced_replicas(run, target))
    if run.config.train.warm_start_from:  # the warm start's mapping, refused as train would
        print_mapping(model_lib.create(run.config), run, out)
    missing = xla.cpu_compiler_missing() if target else None
    if missing:  # neither XLA's CPU estimate nor (beside tensorflow-tpu) the TPU compiler
        raise RunError(
            f"--target={run.target} cannot be sized here: {missing}; "
            + (
                installed.tpu_compiler_conflict()
                or "run it where TensorFlow is the `tensorflow` wheel"
            )
        )
    replicas = target.replicas if target else run.num_shards or DEFAULT_REPLICAS
    layout = f"{replicas} replica{'s' if replicas > 1 else ''}"
    if target:
        layout += f" (a {target.name})"
    elif replicas == DEFAULT_REPLICAS:
        layout += " (a v3-8)"
    findings, found, host, run = run_checks(run, target, cluster)
    if found is not None:
        print("\n".join(fit_report.table(found, run.iterations)), file=out)
        bounds = step_bounds.lines(run, found)
        if bounds:
            print("\n".join(bounds), file=out)
        if host is not None:
            print("\n".join(host_input.lines(host)), file=out)
        if run.report:
            data = fit_report.report(run, found)
            if host is not None:
                data["input"] = host_input.report(host)
            fit_report.write_report(run.report, data)
            print(f"Wrote the report to {run.report}", file=out)
    print("\n".join(determinism.check_lines(run)), file=out)  # whether resumes are exact
    errors = sum(f.severity == ERROR for f in findings)
    warnings = len(findings) - errors
    if report(findings, out):
        raise RunError(
            f"{errors} error(s) and {warnings} warning(s) above: {run.config_name} would fail "
            f"on a TPU with {layout}; fix the errors and rerun `tpurun check`"
        )
    note = f" ({warnings} warning(s) above)" if warnings else ""
    fits = ""
    if target and found is not None and found.steps:
        fits = f", and each step fits a replica's {fit_report.step_hbm_text(found.steps[0])}"
    elif target:
        fits = (
            f", and each step fits a replica's {fit_report.hbm_text(target.hbm_bytes_per_replica)}"
        )
    print(
        f"tpurun check: clean: the train, eval and predict steps of {run.config_name} traced "
        f"and compiled as on a TPU with {layout}, with no errors{fits}{note}",
        file=out,
    )
    if target and target.hosts > 1:
        print("\n".join(launch_lines.lines(target.name, target.hosts, run.config_name)), file=out)


def _target(run: RunConfig) -> Target | None:
    """--target's slice (a UsageError for a type that does not exist), checked against
    --num_shards."""
    if run.target is None:
        return None
    target = targets.parse(run.target)
    if run.num_shards is not None and run.num_shards != target.replicas:
        raise UsageError(
            f"--num_shards={run.num_shards} contradicts --target={run.target}, which has "
            f"{target.replicas} replicas; drop --num_shards"
        )
    return target


def _traced_replicas(run: RunConfig, target: Target | None) -> int:
    """The logical CPU devices the steps are traced on."""
    replicas = target.replicas if target else run.num_shards or DEFAULT_REPLICAS
    return min(replicas, MAX_TRACED_REPLICAS)


def cpu_cluster(replicas: int) -> Cluster:
    """`replicas` logical CPU devices under MirroredStrategy, as `--num_shards` gives locally."""
    try:
        # The TPU's stand-in is the CPU, even on a machine with GPUs.
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        pass  # TensorFlow already initialised: _local says if the CPU split is missing
    return strategy.local(replicas)
