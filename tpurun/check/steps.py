"""One step at a time: what `tpurun check` does for the train, eval and predict steps.

`StepChecker` builds each step as `tpurun train/eval/predict` build it (the
runners' public `replica_step`), then applies the input rules to its batches,
walks its traced graph and compiles it with XLA. A model with `train_arrays` has
two train steps, both checked: the one that gathers its batch from device data
(`Trainer.device_replica_step`, what trains by default) and the tf.data one it
falls back to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import inputs
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


class StepChecker:
    """Checks the steps of `model` as `run` would run them on `cluster` (logical CPU replicas)."""

    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.cluster = cluster
        self.model = model
        self.name = type(model).__name__
        self.replicas = cluster.num_replicas
        self.single = Cluster(tf.distribute.get_strategy(), "1 CPU (XLA compile)")
        self.scopes = LayerScopes()
        self._uids = KerasNames()
        xla.populate_xla_registry()

    def global_batch(self, mode: Mode) -> int:
        return {
            Mode.TRAIN: self.run.train_batch_size,
            Mode.EVAL: self.run.eval_batch_size,
            Mode.PREDICT: self.run.predict_batch_size,
        }[mode]

    def batch_split(self) -> list[Problem]:
        return input_rules.batch_split(
            {mode: self.global_batch(mode) for mode in Mode}, self.replicas
        )

    def check_mode(self, mode: Mode) -> list[Problem]:
        step = STEP_NAMES[mode]
        problems: list[Problem] = []
        per_replica = max(1, self.global_batch(mode) // self.replicas)
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
        trace_spec = input_rules.static_batch(spec, per_replica)
        steps: list[tuple[Callable[[Mode, Cluster], Callable[..., Any]], Any]]
        steps = [(self.build_step, trace_spec)]
        device_step = self.device_step(self.cluster) if mode is Mode.TRAIN else None
        if device_step is not None:
            steps.append((self.build_device_step, device_step[1]))
        for build, step_spec in steps:
            problems += self.check_graph(mode, step_spec, build)
            if any(p.rule == "trace" for p in problems):
                return problems  # the compile would only fail the same way
            # The XLA compile stops at the first problem, which the graph may have shown.
            unsupported = {p.op_type for p in problems if p.rule == "xla-unsupported"}
            ops = {p.op_name for p in problems if p.op_name}
            for problem in self.check_xla(mode, step_spec, build):
                if problem.op_type in unsupported or problem.op_name in ops:
                    continue
                problems.append(problem)
        return problems

    def build_device_step(self, mode: Mode, cluster: Cluster) -> Callable[..., Any]:
        """The train step on device data (for `check_graph`, `check_xla`)."""
        built = self.device_step(cluster)
        assert built is not None
        return built[0]

    def device_step(self, cluster: Cluster) -> tuple[Callable[..., Any], Any] | None:
        """The train step on device data as `tpurun train` builds it, and the spec of its
        arguments (step, arrays); None when the model trains from tf.data only."""
        arrays = inputs.train_arrays(self.model)
        if arrays is None:
            return None
        self._uids.reset()
        trainer = Trainer(self.run, cluster, self.model)
        if not trainer.prepare_device_data(arrays, place=False):
            return None
        assert trainer.device_data is not None
        return trainer.device_replica_step, (
            tf.TensorSpec([], tf.int64),
            trainer.device_data.spec(),
        )

    def per_replica_spec(self, mode: Mode, per_replica: int) -> Any:
        """What one replica receives per step, as `tpurun.inputs.distribute` builds it.

        TRAIN: the input function's dataset as is; EVAL/PREDICT: after the launcher's
        padding, so (features, labels, mask) / (features, mask).
        """
        params = self.input_params(mode, per_replica)
        if mode is Mode.TRAIN:
            dataset = inputs.train_dataset(self.model, params)
        else:
            dataset = self.model.input_fn(mode, params)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"returned {type(dataset).__name__}; return a tf.data.Dataset")
        if mode is Mode.TRAIN:
            return dataset.element_spec
        return inputs.pad_batches(dataset, per_replica, self.replicas).element_spec

    def input_params(self, mode: Mode, per_replica: int) -> InputParams:
        """As `tpurun.inputs` makes them for one host feeding every replica."""
        ctx = tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=self.replicas
        )
        # The rounded-down batch when it does not split (batch-split reports that), so
        # the other checks still run.
        params = inputs.input_params(ctx, per_replica * self.replicas, self.run.seed)
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
                self.global_batch(mode),
                self.run.seed,
                exact_pass=not (mode is Mode.EVAL and self.run.config.eval.steps),
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

    def build_step(self, mode: Mode, cluster: Cluster) -> Callable[..., Any]:
        """The launcher's replica step for `mode`, built as `tpurun train/eval/predict` build it."""
        self._uids.reset()  # layer names as in a real run, whichever build this is
        if mode is Mode.TRAIN:
            return Trainer(self.run, cluster, self.model).replica_step
        if mode is Mode.EVAL:
            return Evaluator(self.run, cluster, self.model).replica_step
        return Predictor(self.run, cluster, self.model).replica_step

    # Rules: dynamic-shape, summary, dtype (float64 inside), xla-unsupported (kernel registry).
    def check_graph(
        self, mode: Mode, spec: Any, build: Callable[..., Any] | None = None
    ) -> list[Problem]:
        strategy = self.cluster.strategy
        try:
            replica_step = (build or self.build_step)(mode, self.cluster)

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
    def check_xla(
        self, mode: Mode, spec: Any, build: Callable[..., Any] | None = None
    ) -> list[Problem]:
        if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
            return []  # static-batch reported it; XLA cannot compile an unknown shape
        try:
            replica_step = (build or self.build_step)(mode, self.single)
        except Exception as e:  # noqa: BLE001
            return [trace_failure(self.name, mode, e)]
        return xla.compile_problems(mode, replica_step, spec, self.scopes)
