"""One step at a time: what `tpurun check` does for the train, eval and predict steps.

`StepChecker` builds each step as `tpurun train/eval/predict` build it (the
runners' public `replica_step`), then applies the input rules to its batches,
walks its traced graph and compiles it with XLA. The single-device build that
compiled cleanly is kept (`single_device_steps`) for the memory estimate of
`--target` (`tpurun.check.preflight`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tpurun import inputs, splits
from tpurun.check import input_rules, xla
from tpurun.check.findings import ERROR, STEP_NAMES, Problem
from tpurun.check.fixes import graph_problems, trace_failure
from tpurun.check.graph_walk import GraphWalker
from tpurun.check.introspection import KerasNames, LayerScopes
from tpurun.cluster import Cluster
from tpurun.evaluate import Evaluator
from tpurun.model import InputParams, Mode, Model
from tpurun.predict import Predictor
from tpurun.run_config import RunConfig
from tpurun.tf_errors import user_code_line
from tpurun.train import Trainer

Runner = Trainer | Evaluator | Predictor
RUNNERS: dict[Mode, type[Runner]] = {
    Mode.TRAIN: Trainer,
    Mode.EVAL: Evaluator,
    Mode.PREDICT: Predictor,
}


def global_batch(run: RunConfig, mode: Mode) -> int:
    """The global batch of `mode`'s step."""
    return {
        Mode.TRAIN: run.train_batch_size,
        Mode.EVAL: run.eval_batch_size,
        Mode.PREDICT: run.predict_batch_size,
    }[mode]


class SingleDeviceStep(NamedTuple):
    """A runner built on one device and the spec of its replica step's arguments."""

    runner: Runner
    # One batch as the input function yields it, (features, labels[, mask]) or
    # (features, mask); `StepChecker.step_args` makes the step's arguments of it.
    spec: Any


class StepChecker:
    """Checks the steps of `model` as `run` would run them on `cluster` (logical CPU replicas).

    `replicas`: the replicas the batches are split over, when not the cluster's own
    (a large TPU slice, traced on fewer logical CPU devices).
    """

    def __init__(self, run: RunConfig, cluster: Cluster, model: Model, replicas: int = 0):
        self.run = run
        self.cluster = cluster
        self.model = model
        self.name = type(model).__name__
        self.replicas = replicas or cluster.num_replicas
        # The eval step is checked on the split that chooses the best checkpoint.
        self.eval_split = splits.resolve(type(model), run.config).best
        self.single = Cluster(tf.distribute.get_strategy(), "1 CPU (XLA compile)")
        self.scopes = LayerScopes()
        self.single_device_steps: dict[Mode, SingleDeviceStep] = {}
        self._uids = KerasNames()
        xla.populate_xla_registry()

    def global_batch(self, mode: Mode) -> int:
        return global_batch(self.run, mode)

    def per_replica_batch(self, mode: Mode) -> int:
        """Global batch / replicas, rounded down when it does not split (batch-split says so)."""
        return max(1, self.global_batch(mode) // self.replicas)

    def batch_split(self) -> list[Problem]:
        return input_rules.batch_split(
            {mode: self.global_batch(mode) for mode in Mode}, self.replicas
        )

    def check_mode(self, mode: Mode) -> list[Problem]:
        step = STEP_NAMES[mode]
        problems: list[Problem] = []
        per_replica = self.per_replica_batch(mode)
        try:
            spec = self.per_replica_spec(mode, per_replica)
        except Exception as e:  # noqa: BLE001 - the user's input_fn: any failure is a finding
            logging.debug("input_fn(%s) failed:", step, exc_info=True)
            return [
                Problem(
                    "input",
                    ERROR,
                    f"{self.name}.input_fn({step})",
                    f"{self.name}.input_fn({step}) failed in the {{steps}}: {user_code_line(e)}",
                    f"fix the input function (`tpurun {step}` would fail the same way; rerun "
                    "with --verbosity=1 for the traceback)",
                    mode,
                )
            ]
        problems += input_rules.check_spec(mode, spec, per_replica, self.name)
        if not any(p.rule == "static-batch" for p in problems):
            problems += self.check_distribute(mode)
        trace_spec = self.step_args(mode, spec, per_replica)
        problems += self.check_graph(mode, trace_spec)
        if any(p.rule == "trace" for p in problems):
            return problems  # the compile would only fail the same way
        # The XLA compile stops at the first problem, which the graph may have shown already.
        unsupported = {p.op_type for p in problems if p.rule == "xla-unsupported"}
        ops = {p.op_name for p in problems if p.op_name}
        for problem in self.check_xla(mode, spec, per_replica):
            if problem.op_type in unsupported or problem.op_name in ops:
                continue
            problems.append(problem)
        return problems

    def per_replica_spec(self, mode: Mode, per_replica: int) -> Any:
        """What one replica receives per step, as `tpurun.inputs.distribute` builds it.

        TRAIN: the input function's dataset as is; EVAL/PREDICT: after the launcher's
        padding, so (features, labels, mask) / (features, mask).
        """
        params = self.input_params(mode, per_replica)
        dataset = self.model.input_fn(mode, params)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"returned {type(dataset).__name__}; return a tf.data.Dataset")
        if mode is Mode.TRAIN:
            return dataset.element_spec
        return inputs.pad_batches(dataset, per_replica, self.replicas).element_spec

    def step_args(self, mode: Mode, spec: Any, per_replica: int) -> Any:
        """The replica step's arguments: `spec` (a batch as the input function yields it)
        at the static `per_replica` batch; with gradient accumulation a TRAIN step takes
        its micro-batches stacked, [accumulate_steps, batch, ...], as tpurun.inputs
        stacks them.
        """
        spec = input_rules.static_batch(spec, per_replica)
        micro_batches = self.run.config.train.accumulate_steps
        if mode is not Mode.TRAIN or micro_batches == 1:
            return spec

        def stack(leaf: Any) -> Any:
            if isinstance(leaf, tf.TensorSpec):
                return tf.TensorSpec([micro_batches, *leaf.shape], leaf.dtype, name=leaf.name)
            return leaf

        return tf.nest.map_structure(stack, spec)

    def input_params(self, mode: Mode, per_replica: int) -> InputParams:
        """As `tpurun.inputs` makes them for one host feeding every replica."""
        ctx = tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=self.replicas
        )
        # The rounded-down batch when it does not split (batch-split reports that), so
        # the other checks still run.
        params = inputs.input_params(
            ctx,
            per_replica * self.replicas,
            self.run.seed,
            split=self.eval_split if mode is Mode.EVAL else None,
        )
        return dataclasses.replace(params, global_batch_size=self.global_batch(mode))

    def check_distribute(self, mode: Mode) -> list[Problem]:
        """The launcher's own distribution of the input (also its checks, e.g. a finite eval)."""
        if self.global_batch(mode) % self.replicas:
            return []  # batch-split already says so; distributing would only fail on it
        try:
            inputs.distribute(
                self.cluster.strategy,
                self.model,
                mode,
                # The per-replica batch over the replicas traced (fewer than a large slice's).
                self.per_replica_batch(mode) * self.cluster.num_replicas,
                self.run.seed,
                exact_pass=not (mode is Mode.EVAL and self.run.config.eval.steps),
                micro_batches=self.run.config.train.accumulate_steps,
                split=self.eval_split,
            )
        except Exception as e:  # noqa: BLE001 - reported, the other checks still run
            step = STEP_NAMES[mode]
            return [
                Problem(
                    "input",
                    ERROR,
                    f"{self.name}.input_fn({step})",
                    f"distributing {self.name}.input_fn({step}) over {self.replicas} "
                    f"replicas failed in the {{steps}}: {user_code_line(e)}",
                    f"fix what the message says; `tpurun {step}` would fail the same way",
                    mode,
                )
            ]
        return []

    def build_runner(self, mode: Mode, cluster: Cluster) -> Runner:
        """The launcher's runner for `mode`, built as `tpurun train/eval/predict` build it."""
        self._uids.reset()  # layer names as in a real run, whichever build this is
        return RUNNERS[mode](self.run, cluster, self.model)

    # Rules: dynamic-shape, summary, dtype (float64 inside), xla-unsupported (kernel registry).
    def check_graph(self, mode: Mode, spec: Any) -> list[Problem]:
        strategy = self.cluster.strategy
        try:
            replica_step = self.build_runner(mode, self.cluster).replica_step

            @tf.function
            def replicated(*args: Any) -> Any:
                return strategy.run(replica_step, args=args)

            with contextlib.ExitStack() as stack:
                logdir = stack.enter_context(tempfile.TemporaryDirectory())
                # A default writer, so that tf.summary calls leave ops to find.
                writer = tf.summary.create_file_writer(logdir)
                stack.enter_context(writer.as_default(step=tf.constant(0, tf.int64)))
                stack.enter_context(tf.summary.record_if(True))
                stack.enter_context(self.scopes.recording())
                graph = replicated.get_concrete_function(*spec).graph
                writer.close()
        except Exception as e:  # noqa: BLE001 - the user's model: any failure is a finding
            return [trace_failure(self.name, mode, e)]
        return graph_problems(GraphWalker(graph).findings(), self.scopes, mode)

    # Rules: xla-unsupported and xla-compile, from a real XLA compile of one replica's step.
    def check_xla(self, mode: Mode, spec: Any, per_replica: int) -> list[Problem]:
        args = self.step_args(mode, spec, per_replica)
        if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(args)):
            return []  # static-batch reported it; XLA cannot compile an unknown shape
        try:
            step = SingleDeviceStep(self.build_runner(mode, self.single), spec)
        except Exception as e:  # noqa: BLE001
            return [trace_failure(self.name, mode, e)]
        problems = xla.compile_problems(mode, step.runner.replica_step, args, self.scopes)
        if not problems:
            self.single_device_steps[mode] = step
        return problems

    def single_device_step(self, mode: Mode) -> SingleDeviceStep:
        """The step of `mode` on one device, at the per-replica batch, without checking it
        (for sizing the step of a run that is already under way)."""
        if mode not in self.single_device_steps:
            spec = self.per_replica_spec(mode, self.per_replica_batch(mode))
            self.single_device_steps[mode] = SingleDeviceStep(
                self.build_runner(mode, self.single), spec
            )
        return self.single_device_steps[mode]
