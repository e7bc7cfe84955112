"""The steps `tpurun check` checks and sizes, built as `tpurun train/eval/predict` build them.

`StepBuilder` builds each runner (`Trainer`, `Evaluator`, `Predictor`) of a run on the
traced replicas or on one device, and hands out its public `replica_step` with the specs
of its arguments at any per-replica batch (`step_call`): what the rules check
(`steps.StepChecker`), the memory estimate sizes (`tpurun.check.sizing.preflight`),
the FLOPs count counts (`tpurun.check.bounds.step_flops`) and the input check reads
(`tpurun.check.bounds.host_input`). Nothing is checked here. A model with
`train_arrays` trains on device data where the runners' `LoopPlan` would
(`tpurun.runners.loop_plan`): its train step then gathers its batch from the arrays
(`DeviceLoop.replica_step`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from tpurun import inputs
from tpurun.check.rules.introspection import KerasNames
from tpurun.cluster import Cluster
from tpurun.inputs import device_data
from tpurun.model import InputParams, Mode, Model, TrainArrays
from tpurun.run_config import RunConfig, splits
from tpurun.runners import loop_plan
from tpurun.runners.evaluate import Evaluator
from tpurun.runners.loop_plan import LoopPlan
from tpurun.runners.predict import Predictor
from tpurun.runners.train import Trainer

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

    runner: Runner  # a Trainer with `device_data` set trains on device data (`step_call`)
    # One batch as the input function yields it, (features, labels[, mask]) or
    # (features, mask); `StepBuilder.step_args` makes the step's arguments of it.
    spec: Any


class StepBuilder:
    """Builds the steps of `model` as `run` would run them on `cluster` (logical CPU replicas).

    `replicas`: the replicas the batches are split over, when not the cluster's own
    (a large TPU slice, traced on fewer logical CPU devices); `arrays`: the model's
    training arrays when the caller read them already. Whether the run would
    train on device data is decided for what `cluster` stands for (its `hosts` and
    `device_kind`), on the traced clusters too.
    """

    def __init__(
        self,
        run: RunConfig,
        cluster: Cluster,
        model: Model,
        replicas: int = 0,
        arrays: TrainArrays | None = None,
    ):
        self.run = run
        self.cluster = cluster
        self.model = model
        self.name = type(model).__name__
        self.replicas = replicas or cluster.num_replicas
        # The eval step is checked on the split that chooses the best checkpoint.
        self.eval_split = splits.resolve(type(model), run.config).best
        self.single = Cluster(
            tf.distribute.get_strategy(),
            "1 CPU (XLA compile)",
            num_workers=cluster.num_workers,
            hosts=cluster.hosts or device_data.hosts(cluster.strategy),
            device_kind=cluster.replica_kind,
        )
        # The single-device builds to size: those the checks compiled cleanly
        # (`StepChecker.check_xla`), or `single_device_step`'s, unchecked.
        self.single_device_steps: dict[Mode, SingleDeviceStep] = {}
        self._jit_steps: dict[tuple[Runner, Mode, int], Any] = {}  # jit_step's
        self._uids = KerasNames()
        self._tf_data_only = False  # device data does not apply (build_device_trainer)
        if arrays is not None:
            self.arrays = arrays  # read already (the cached property below, set)

    def global_batch(self, mode: Mode) -> int:
        return global_batch(self.run, mode)

    def per_replica_batch(self, mode: Mode) -> int:
        """Global batch / replicas, rounded down when it does not split (batch-split says so)."""
        return max(1, self.global_batch(mode) // self.replicas)

    @functools.cached_property
    def arrays(self) -> TrainArrays | None:
        """The model's training arrays, read once: a model's `train_arrays` may read its
        files (a failure is not kept: each use reports it where it is read)."""
        return inputs.train_arrays(self.model)

    def has_arrays(self, mode: Mode) -> bool:
        """Whether `mode`'s step may train on device data: TRAIN of a model with arrays."""
        return mode is Mode.TRAIN and self.arrays is not None

    def build_device_trainer(self, cluster: Cluster) -> Trainer | None:
        """The Trainer as `tpurun train` builds it on device data, its arrays not placed;
        None when the run would train through tf.data (said in one line, as it would)."""
        arrays = self.arrays
        if arrays is None or self._tf_data_only:
            return None  # (the line said once)
        data = loop_plan.device_data_for(self.run, cluster, arrays)
        if data is None:
            self._tf_data_only = True
            return None
        trainer = self.build_runner(Mode.TRAIN, cluster, LoopPlan(data))
        assert isinstance(trainer, Trainer)
        return trainer

    def step_call(
        self, mode: Mode, runner: Runner, spec: Any, per_replica: int, replicas: int = 1
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """`runner`'s replica step and the specs of its arguments at a `per_replica` batch.

        On device data (a Trainer whose `device_data` is set) the step is
        `DeviceLoop.replica_step` on arrays dealt to `replicas` at that batch: it
        takes (step, the arrays and their order's table), and gathers its batch itself.
        Otherwise it takes a batch, `step_args` of `spec`.
        """
        data = runner.device_data if isinstance(runner, Trainer) else None
        if data is None:
            return runner.replica_step, tuple(self.step_args(mode, spec, per_replica))
        sized = device_data.DeviceData(
            data.examples, data.order, replicas, per_replica * replicas, data.micro_batches
        )

        def device_replica_step(step: tf.Tensor, values: Any) -> tf.Tensor:
            # DeviceLoop.replica_step, on the data at this batch.
            return runner.replica_step(*sized.replica_batch(step, values))

        return device_replica_step, (tf.TensorSpec([], tf.int64), sized.spec())

    def per_replica_spec(self, mode: Mode, per_replica: int) -> Any:
        """What one replica receives per step, as `tpurun.inputs.distribute` builds it.

        TRAIN: the input function's dataset as is, or a batch of the training arrays;
        EVAL/PREDICT: after the launcher's padding, so (features, labels, mask) /
        (features, mask).
        """
        params = self.input_params(mode, per_replica)
        if mode is Mode.TRAIN and self.arrays is not None:
            # From the arrays' specs (StepChecker.check_distribute builds the dataset of them).
            return self.arrays.batch_spec(params.batch_size)
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
        spec = static_batch(spec, per_replica)
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

    def build_runner(self, mode: Mode, cluster: Cluster, plan: LoopPlan | None = None) -> Runner:
        """The launcher's runner for `mode`, built as `tpurun train/eval/predict` build it
        (a Trainer's host loop as `plan` says: tf.data without one)."""
        self._uids.reset()  # layer names as in a real run, whichever build this is
        if mode is Mode.TRAIN:
            return Trainer(self.run, cluster, self.model, plan=plan)
        return RUNNERS[mode](self.run, cluster, self.model)

    def jit_step(
        self, runner: Runner, mode: Mode, per_replica: int, function: Any, args: Any
    ) -> Any:
        """`runner`'s step of `mode` at `per_replica`, as `jit_flat` makes it: made
        once, so that the XLA rules' trace is the memory estimate's too."""
        # The runner itself, not its id: a runner dropped after failing a rule could
        # leave its id to a new one, which would find the old runner's step here.
        key = (runner, mode, per_replica)
        if key not in self._jit_steps:
            self._jit_steps[key] = jit_flat(function, args)
        return self._jit_steps[key]

    def single_device_step(self, mode: Mode) -> SingleDeviceStep:
        """The step of `mode` on one device, at the per-replica batch, without checking it
        (for sizing the step of a run that is already under way)."""
        if mode not in self.single_device_steps:
            spec = self.per_replica_spec(mode, self.per_replica_batch(mode))
            device = self.build_device_trainer(self.single) if self.has_arrays(mode) else None
            self.single_device_steps[mode] = SingleDeviceStep(
                device or self.build_runner(mode, self.single), spec
            )
        return self.single_device_steps[mode]


def static_batch(spec: Any, per_replica: int) -> Any:
    """The spec with the batch dimension set to the static per-replica batch, for tracing.

    A dynamic batch is reported by static-batch; tracing with it would only make every
    tensor of the step dynamic and hide the problems the step itself has.
    """

    def fix(leaf: Any) -> Any:
        if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank:
            return tf.TensorSpec([per_replica, *leaf.shape[1:]], leaf.dtype, name=leaf.name)
        return leaf

    return tf.nest.map_structure(fix, spec)


def jit_flat(fn: Callable[..., Any], args_specs: Sequence[Any]) -> Any:
    """`fn(*args)` as an XLA-compiled tf.function of the flat tensors of `args_specs`:
    what check's XLA rules and the memory estimate both compile (one trace for both)."""

    def flat_step(*tensors: tf.Tensor) -> Any:
        return fn(*tf.nest.pack_sequence_as(list(args_specs), list(tensors)))

    return tf.function(flat_step, jit_compile=True)
