"""One step at a time: what `tpurun check` does for the train, eval and predict steps.

`StepChecker` takes each step as `tpurun train/eval/predict` build it (the
runners' public `replica_step`, built by `step_builds.StepBuilder`), then applies the
input rules to its batches, walks its traced graph and compiles it with XLA. A model
with `train_arrays` has two train steps, both checked: the one that gathers its batch
from device data (`DeviceLoop.replica_step`, what trains by default) and the tf.data
one it falls back to. The single-device build that compiled cleanly is kept
(`single_device_steps`; for TRAIN the device-data step where it applies) for the
memory estimate of `--target` (`tpurun.check.sizing.preflight`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import inputs
from tpurun.check.rules import input_rules, replica_rules, xla
from tpurun.check.rules.findings import ERROR, STEP_NAMES, Problem
from tpurun.check.rules.fixes import graph_problems, trace_failure
from tpurun.check.rules.graph_walk import GraphWalker
from tpurun.check.rules.introspection import LayerScopes
from tpurun.check.rules.step_builds import SingleDeviceStep, StepBuilder
from tpurun.errors.tf_errors import user_code_line
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import Mode, TrainArrays
from tpurun.runners.train import Trainer


@contextlib.contextmanager
def symbolic(arrays: TrainArrays | None, seed: int) -> Iterator[TrainArrays | None]:
    """The training arrays as placeholders of a graph of their own, for building datasets.

    A dataset built from them has the element spec one built from the values would
    have, and nothing is allocated: the flops model's 64 GiB of rows at
    --batch_size=1048576 are sized from their shapes (declared arrays are never
    built). Nothing may iterate such a dataset; check only reads its spec.
    """
    if arrays is None:
        yield None
        return
    # The order's table is computed eagerly, and cached: made here, before the graph,
    # the dataset built inside finds it (`seed`: the run's, as tpurun.inputs passes it).
    ExampleOrder(arrays.num_examples, seed)
    with tf.Graph().as_default():
        placeholders = tf.nest.map_structure(
            lambda spec: tf.compat.v1.placeholder(spec.dtype, spec.shape), arrays.specs
        )
        yield TrainArrays(placeholders, count=arrays.num_examples, batch=arrays.batch)


class StepChecker(StepBuilder):
    """Checks the steps of `model` as `run` would run them on `cluster` (logical CPU
    replicas), as `StepBuilder` builds them; its arguments are the builder's."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.scopes = LayerScopes()  # which Keras layer made each op, recorded as traced
        xla.populate_xla_registry()

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
        # The device-data train step where the model declares arrays (checked after the
        # tf.data one, which it falls back to): its args are (step, the arrays).
        for device in (False, True) if self.has_arrays(mode) else (False,):
            problems += self.check_graph(mode, spec, device)
            if any(p.rule == "trace" for p in problems):
                return problems  # the compile would only fail the same way
            # The XLA compile stops at the first problem, which the graph may have shown.
            unsupported = {p.op_type for p in problems if p.rule == "xla-unsupported"}
            ops = {p.op_name for p in problems if p.op_name}
            for problem in self.check_xla(mode, spec, per_replica, device):
                if problem.op_type in unsupported or problem.op_name in ops:
                    continue
                problems.append(problem)
        return problems

    def check_distribute(self, mode: Mode) -> list[Problem]:
        """The launcher's own distribution of the input (also its checks, e.g. a finite eval)."""
        if self.global_batch(mode) % self.replicas:
            return []  # batch-split already says so; distributing would only fail on it
        try:
            with symbolic(self.arrays if mode is Mode.TRAIN else None, self.run.seed) as arrays:
                inputs.distribute(
                    self.cluster.strategy,
                    self.model,
                    mode,
                    # The per-replica batch over the replicas traced (fewer than a large
                    # slice's).
                    self.per_replica_batch(mode) * self.cluster.num_replicas,
                    self.run.seed,
                    exact_pass=not (mode is Mode.EVAL and self.run.config.eval.steps),
                    micro_batches=self.run.config.train.accumulate_steps,
                    split=self.eval_split,
                    arrays=arrays,
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

    # Rules: dynamic-shape, summary, dtype (float64 inside), xla-unsupported (kernel
    # registry); batch-norm on the train step's model (replica_rules).
    def check_graph(self, mode: Mode, spec: Any, device: bool = False) -> list[Problem]:
        strategy = self.cluster.strategy
        try:
            built = (
                self.build_device_trainer(self.cluster)
                if device
                else self.build_runner(mode, self.cluster)
            )
            if built is None:
                return []  # trains through tf.data (said in one line): checked already
            replica_step, spec = self.step_call(
                mode, built, spec, self.per_replica_batch(mode), self.cluster.num_replicas
            )

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
        problems = graph_problems(GraphWalker(graph).findings(), self.scopes, mode)
        if isinstance(built, Trainer):
            problems += replica_rules.batch_norm_problems(  # every model the step trains
                built.state.models.values(), self.replicas, self.global_batch(mode)
            )
        return problems

    # Rules: xla-unsupported and xla-compile, from a real XLA compile of one replica's step.
    def check_xla(
        self, mode: Mode, spec: Any, per_replica: int, device: bool = False
    ) -> list[Problem]:
        args = self.step_args(mode, spec, per_replica)
        if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(args)):
            return []  # static-batch reported it; XLA cannot compile an unknown shape
        try:
            runner = (
                self.build_device_trainer(self.single)
                if device
                else self.build_runner(mode, self.single)
            )
            if runner is None:
                return []
            step = SingleDeviceStep(runner, spec)
            function, args = self.step_call(mode, runner, spec, per_replica)
        except Exception as e:  # noqa: BLE001
            return [trace_failure(self.name, mode, e)]
        compiled = self.jit_step(runner, mode, per_replica, function, args)
        problems = xla.compile_problems(mode, compiled, args, self.scopes)
        if not problems:
            self.single_device_steps[mode] = step
        return problems
