"""The training runner: a model, its optimizers and the compiled host loop of `--iterations` steps.

The Trainer knows nothing of cadences, checkpoint files, signals or what is shown:
`tpurun.runners.controller` asks it for `train(num_steps)` and decides the rest. What the
run owns (models, named optimizers, the global step) is a
`tpurun.training_step.TrainState`; the step is the model's `train_step`, by
default the supervised one, handed a `Step`: the precision policy the model was
built under (the loss in float32; float16 with dynamic loss scaling), the
optimizers of `tpurun.optimization` (schedule, weight decay, clipping, EMA), and
gradient accumulation: with `train.accumulate_steps` = N, one step sums the
gradients of N micro-batches of `--batch_size` in-graph and applies them once. The
host loop adds up the named scalars the step returns.

The input is tf.data (`tpurun.inputs`), or for a model with `train_arrays` device
data (`tpurun.inputs.device_data`): the arrays in every replica's memory and each replica
step gathering its own batch. The host loop over either is `tpurun.runners.host_loops`'s.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import inputs
from tpurun.actions.base import LoopStats
from tpurun.actions.progress import announced
from tpurun.cluster import Cluster, device_kind
from tpurun.errors import RunError
from tpurun.inputs import device_data
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import Mode, Model, TrainArrays, build_models
from tpurun.run_config import RunConfig
from tpurun.runners import host_loops
from tpurun.runners.host_loops import (
    MAX_SCALARS,
    DeviceLoop,
    InputLoop,
    LoopParts,
    LoopTimes,
)
from tpurun.training_step import keyed_random
from tpurun.training_step.state import TrainState


class Trainer:
    """Holds the models, optimizers and compiled host loop of one training run."""

    def __init__(
        self, run: RunConfig, cluster: Cluster, model: Model, arrays: TrainArrays | None = None
    ):
        """`arrays`: the model's training arrays when the caller read them already."""
        self.run = run
        self.cluster = cluster
        self.strategy = cluster.strategy
        self.model = model
        self.global_batch = run.train_batch_size
        self.micro_batches = run.config.train.accumulate_steps
        names = list(run.config.get("optimizers") or {})
        with self.strategy.scope():
            models = build_models(model)
            self.state = TrainState(
                models,
                model.serving_model,
                names,
                model.optimized_variables(models),
                lambda name: model.optimizer(name) if names else model.optimizer(),
                run.config.precision,
                type(model).__name__,
            )
        self.models = self.state.models
        self.keras_model = self.state.serving_model  # what eval, predict and export serve
        self.optimizers = self.state.optimizers
        # The optimizer of config.optimizer (with config.optimizers: the first named).
        self.optimizer = next(iter(self.optimizers.values()))
        # What a checkpoint holds; saves write this one.
        self.checkpoint = self.fresh_checkpoint()
        self._scalar_names: list[str] = []  # what the step returns, known once it is traced
        self._loop: InputLoop | DeviceLoop | None = None  # built by start_input()
        self._compiled = False  # the loop: by the first train(), or to time it
        # The device-data loops' times, by which the run chose one (`_device_loop`): what
        # model_dir's record keeps for a resumed run. None: not chosen by timing.
        self.loop_times: LoopTimes | None = None
        # The in-memory arrays each replica step gathers its batch from (None: tf.data):
        # decided by plan_device_data().
        self.device_data: device_data.DeviceData | None = None
        if arrays is not None:
            self.arrays = arrays  # read once (the cached property below, set)

    def fresh_checkpoint(self, present: Collection[str] | None = None) -> tf.train.Checkpoint:
        """A new checkpoint object over what the run owns (a restore attempt takes one).

        `present`: the parts a checkpoint file has, to read one written before a part
        existed (`tpurun.training_step.state`); None: every part, to save.
        """
        return self.state.checkpoint(present)

    @property
    def step(self) -> int:
        """The global step: steps done (not an optimizer's own `iterations`)."""
        return self.state.step

    @property
    def weights(self) -> list[Any]:
        """Every variable of every model (non-trainable ones too)."""
        return self.state.weights

    @property
    def optimizer_variables(self) -> list[Any]:
        """Every variable of every optimizer (and loss scale)."""
        return self.state.optimizer_variables

    def restored(self) -> None:
        """After a restore: an older checkpoint's step, and this config's constant rates."""
        self.state.restored()

    def replica_step(self, features, labels) -> dict[str, tf.Tensor]:
        """One replica's training step on its batch: the model's `train_step` (by default the
        supervised one). Returns the step's named scalars, each this replica's share
        (summed over the replicas). The host loops count the global step after it.

        With accumulation, `features` and `labels` stack the step's micro-batches
        ([micro_batches, batch, ...]).
        """
        step = self.state.step_of(
            self.run.seed, self.global_batch, self._rows_of(features), self.micro_batches
        )
        with keyed_random.active(step.random):
            scalars = self.model.train_step(step, features, labels)
        return self._checked_scalars(scalars)

    # do_not_convert (here and below): no tensor-dependent Python control flow, no user
    # code; why it pays, at tpurun.precision.float32.
    @tf.autograph.experimental.do_not_convert
    def _rows_of(self, features: Any) -> int:
        """This replica's (micro-)batch size, from its static shape (`tpurun check` compiles
        one replica's step of a larger cluster on one device)."""
        shape = tf.nest.flatten(features)[0].shape
        rows = shape[1] if self.micro_batches > 1 else shape[0]
        return rows if rows is not None else self.global_batch // self.strategy.num_replicas_in_sync

    @tf.autograph.experimental.do_not_convert
    def _checked_scalars(self, scalars: Any) -> dict[str, tf.Tensor]:
        """The step's named scalars as float32, their names kept for the host loop."""
        name = f"{type(self.model).__name__}.train_step"
        if not isinstance(scalars, dict) or not scalars:
            raise RunError(
                f"{name} returned {type(scalars).__name__}; return a dict of named scalars, "
                "e.g. {'loss': step.mean(per_example_loss)}"
            )
        if len(scalars) > MAX_SCALARS:
            raise RunError(f"{name} returned {len(scalars)} scalars; return at most {MAX_SCALARS}")
        checked = {}
        for key, value in scalars.items():
            value = tf.convert_to_tensor(value)
            if not isinstance(key, str) or value.shape.rank != 0:
                raise RunError(
                    f"{name} returned {key!r} of shape {value.shape}; return scalars by name, "
                    "each this replica's share (step.mean(per_example))"
                )
            checked[key] = tf.cast(value, tf.float32)
        self._scalar_names = list(checked)
        return checked

    @tf.autograph.experimental.do_not_convert
    def _summed(self, per_replica: dict[str, Any]) -> tf.Tensor:
        """The step's scalars summed over the replicas, as one [MAX_SCALARS] vector."""
        sums = [
            self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[name], axis=None)
            for name in self._scalar_names
        ]
        return tf.pad(tf.stack(sums), [[0, MAX_SCALARS - len(sums)]])

    @tf.autograph.experimental.do_not_convert
    def _finite(self) -> tf.Tensor:
        """Whether every trainable weight is finite."""
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self.state.trainable])

    def _loop_parts(self) -> LoopParts:
        return LoopParts(
            strategy=self.strategy,
            replica_step=self.replica_step,
            summed=self._summed,
            finite=self._finite,
            global_step=self.state.global_step,
            rates=self.state.rates_in_graph,
            model_name=type(self.model).__name__,
        )

    def start_input(self, recorded: Callable[[], LoopTimes | None] | None = None) -> None:
        """Builds the training input and its host loop at the global step (once; `train`
        needs it).

        A restored run continues the stream where the checkpoint's step left it. Built
        before anything is written, so bad data fails a run that has written nothing.
        `recorded`: the loop times model_dir's record kept (`loop_times`), read only when
        the run decides between the device-data loops by them.
        """
        if self._loop is not None:
            return
        arrays = self.arrays
        if arrays is not None and self.plan_device_data(arrays) is not None:
            assert self.device_data is not None
            self.device_data.place(self.strategy)
            loop = self._device_loop(recorded or (lambda: None))
            logging.info(
                "Training data on the device (%s): each replica step gathers its own batch; %s.",
                device_data.describe(arrays, self.device_data.order),
                loop.describe(),
            )
            self._loop = loop
            return
        dataset = inputs.distribute(
            self.strategy,
            self.model,
            Mode.TRAIN,
            self.global_batch,
            self.run.seed,
            start_step=self.step,
            micro_batches=self.micro_batches,
            arrays=arrays,
        )
        self._loop = InputLoop(self._loop_parts(), iter(dataset))

    @functools.cached_property
    def arrays(self) -> TrainArrays | None:
        """The model's training arrays, read once: `train_arrays` may read the model's files."""
        return inputs.train_arrays(self.model)

    def plan_device_data(self, arrays: TrainArrays) -> device_data.DeviceData | None:
        """The device data this run trains on from `arrays` (set as `device_data`, not yet
        placed in the replicas' memory), or None when it is off or too large (said in
        one line): then the arrays go through tf.data."""
        if not self.run.config.train.device_data:
            device_data.log_fallback("config.train.device_data=false")
            return None
        order = ExampleOrder(arrays.num_examples, self.run.seed)
        reason = device_data.why_not(
            arrays, order, self.cluster, self.run.config.train.device_data_mb
        )
        if reason:
            device_data.log_fallback(reason)
            return None
        self.device_data = device_data.DeviceData(
            arrays, order, self.strategy.num_replicas_in_sync, self.global_batch, self.micro_batches
        )
        return self.device_data

    def _device_loop(self, recorded: Callable[[], LoopTimes | None]) -> DeviceLoop:
        """The device-data host loop: XLA-compiled as a whole or not, and why (logged).

        What cannot be compiled as one computation is not (a TPU's step is anyway, several
        replicas span several devices); the user's config.train.xla=true or false is kept.
        With "auto" (the default) a run of at most SHORT_RUN_STEPS steps runs the plain
        loop (XLA's compile would cost more than it saves). A longer one times the loops
        on the model's own step
        (`DeviceLoop.time_both`) and XLA's runs unless the plain one is clearly faster
        (`LoopTimes.measured`): XLA speeds up a step of many small ops (Iris: ~5x, its
        dispatch gone) and slows down one of large matmuls or convolutions on a CPU, where
        TensorFlow's oneDNN kernels beat XLA's (keras-io's DCGAN, a WGAN-GP of 512-unit
        layers: docs/benchmarks.md). The op mix alone does not tell the two apart, the
        step's time does. The choice is recorded in model_dir (`loop_times`): a resumed
        run runs the loop its checkpoints were trained with, for the two loops round
        floating-point sums differently and a resume must be bit-identical.
        """
        parts, data, step = self._loop_parts(), self.device_data, self.step
        assert data is not None
        choice = self.run.config.train.xla
        off = self._without_xla(choice)
        if off or choice is True:
            why = off or "the host loop is compiled by XLA (config.train.xla=true)"
            return DeviceLoop(parts, data, step, not off, why)
        auto = "config.train.xla='auto'; true or false forces one"
        kept = recorded()
        if kept is not None:
            self.loop_times = kept
            first = f"as this model_dir's first run chose it ({kept.shown()}; {auto})"
            why = f"{_loop_name(kept)}, {first}"
            return DeviceLoop(parts, data, step, kept.use_xla, why)
        loop = DeviceLoop(parts, data, step, False, "")
        run_steps = self.run.train_steps - step
        if run_steps <= host_loops.SHORT_RUN_STEPS:
            times = self.loop_times = LoopTimes.short_run(run_steps)
        else:
            times = self.loop_times = loop.time_both()
            self._compiled = True  # the loop chosen was, to time it
        loop.why = f"{_loop_name(times)}: {times.shown()} ({auto})"
        return loop

    def _without_xla(self, choice: object) -> str:
        """Why the device-data host loop cannot or will not be compiled by XLA ("": it may)."""
        if self.cluster.is_tpu:
            return "XLA compiles the replicated step for the TPU"
        if self.strategy.num_replicas_in_sync > 1:
            # The all-reduce and the mirrored variables' updates span every replica's
            # device; each replica's ops are dispatched one by one (docs/benchmarks.md).
            return (
                "the host loop is not compiled by XLA: it spans every replica's device, and "
                "XLA compiles for one"
            )
        if choice is False:
            return "the host loop is not compiled by XLA (config.train.xla=false)"
        if (
            choice is not True  # "auto"
            and self.run.config.precision == "mixed_bfloat16"
            and device_kind(self.strategy) == "CPU"
        ):
            # Measured on Shakespeare's LSTM: 5x slower than TensorFlow's kernels (docs/device-data.md).
            return (
                "the host loop is not compiled by XLA: its CPU backend has no fast bfloat16 "
                "matmuls (config.train.xla=true forces it)"
            )
        return ""

    def train(self, num_steps: int) -> LoopStats:
        """Runs one host loop of `num_steps` steps, from the global step. The first compiles
        the loop first (in its time: the time account calls the excess compile), said in
        two lines."""
        self.start_input()
        assert self._loop is not None
        start = time.perf_counter()
        if not self._compiled:
            loop = f"the host loop of {type(self.model).__name__}'s train_step"
            with announced(f"Compiling {loop}", f"Compiled {loop}"):
                self._loop.run(0)  # runs no step, moves no data: traces, optimizes, compiles
            self._compiled = True
        result = self._loop.run(num_steps)
        scalars = self._named(result.means)  # waits for the loop to finish
        rates = [float(r) for r in result.rates.numpy()]
        return LoopStats(
            step=int(result.step),
            num_steps=num_steps,
            # The scalar named "loss" (the supervised step's), else the step's first.
            loss=scalars.get("loss", next(iter(scalars.values()))),
            seconds=time.perf_counter() - start,
            input_seconds=float(result.waited),
            global_batch=self.global_batch * self.micro_batches,
            learning_rate=rates[0],
            weights_finite=bool(result.finite),
            device_input=isinstance(self._loop, DeviceLoop),
            scalars=scalars,
            learning_rates=dict(zip(self.optimizers, rates, strict=True))
            if self.state.named
            else {},
        )

    def _named(self, totals: tf.Tensor) -> dict[str, float]:
        """The loop's mean of each scalar, by the names the step returned them under."""
        values = totals.numpy()
        return {name: float(values[i]) for i, name in enumerate(self._scalar_names)}


def _loop_name(times: LoopTimes) -> str:
    return (
        "the host loop is compiled by XLA"
        if times.use_xla
        else "the host loop is not compiled by XLA"
    )
