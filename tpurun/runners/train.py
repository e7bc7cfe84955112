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
step gathering its own batch. With device data and one replica (a CPU, a GPU) the
whole host loop is compiled by XLA; under MirroredStrategy it is not (XLA compiles
for one device, and the all-reduce and the mirrored variables' updates span all of
them), and on a TPU XLA compiles the replicated step anyway.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import inputs
from tpurun.actions.base import LoopStats
from tpurun.cluster import Cluster
from tpurun.errors import RunError
from tpurun.errors.tf_errors import one_line
from tpurun.inputs import device_data
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import Mode, Model, TrainArrays, build_models, has_own_train_step
from tpurun.run_config import RunConfig
from tpurun.training_step import keyed_random
from tpurun.training_step.state import TrainState

# The most named scalars a training step may return: the host loops add them up in
# one vector of this size (a loop's carried values need their shape before the step
# is traced, which is when the names are known).
MAX_SCALARS = 16


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
        self._loop = tf.function(self._host_loop)
        self._iterator: Any = None  # the training input, from start_input()...
        self.device_data: device_data.DeviceData | None = None  # ...or this
        self._device_loop: Any = None
        self._compiled = False  # whether _device_loop is the XLA-compiled one
        self._position = 0  # device data: the steps its stream has given
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

    def _rows_of(self, features: Any) -> int:
        """This replica's (micro-)batch size, from its static shape (`tpurun check` compiles
        one replica's step of a larger cluster on one device)."""
        shape = tf.nest.flatten(features)[0].shape
        rows = shape[1] if self.micro_batches > 1 else shape[0]
        return rows if rows is not None else self.global_batch // self.strategy.num_replicas_in_sync

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

    def device_replica_step(self, step: tf.Tensor, values: Any) -> dict[str, tf.Tensor]:
        """One replica's training step on device data: gathers its batch of `step` from
        `values` (`DeviceData.values`), then `replica_step`."""
        assert self.device_data is not None
        features, labels = self.device_data.replica_batch(step, values)
        return self.replica_step(features, labels)

    def _summed(self, per_replica: dict[str, Any]) -> tf.Tensor:
        """The step's scalars summed over the replicas, as one [MAX_SCALARS] vector."""
        sums = [
            self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[name], axis=None)
            for name in self._scalar_names
        ]
        return tf.pad(tf.stack(sums), [[0, MAX_SCALARS - len(sums)]])

    def _finite(self) -> tf.Tensor:
        """Whether every trainable weight is finite."""
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self.state.trainable])

    def _host_loop(self, iterator, num_steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Runs num_steps replicated steps in-graph.

        Returns the mean of their scalars (`_summed`), the seconds spent waiting for batches (the
        timestamps around `next(iterator)` are stateful ops, so automatic control
        dependencies keep them before and after the fetch), and whether every
        weight is still finite: the last step's update can be NaN while its loss,
        computed before it, was not, and such weights must never be saved.
        """
        total = tf.zeros([MAX_SCALARS])
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            before = tf.timestamp()
            batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += tf.timestamp() - before
            total += self._summed(self.strategy.run(self.replica_step, args=batch))
            self.state.global_step.assign_add(1, read_value=False)  # once, not per replica
        return total / tf.cast(num_steps, tf.float32), waited, self._finite()

    def _device_host_loop(self, first_step: tf.Tensor, num_steps: tf.Tensor) -> tuple[Any, ...]:
        """num_steps replicated steps on device data, from step `first_step` of its stream.

        Returns the mean of their scalars and whether every weight is still finite, as
        `_host_loop` does (there is no input to wait for), and the step and learning
        rates after them: read here, they cost the host nothing more (a compiled loop's
        steps take microseconds, an eager read of a variable a good part of one).
        """
        assert self.device_data is not None
        values = self.device_data.values

        def step(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            args = (first_step + tf.cast(i, tf.int64), values)
            summed = self._summed(self.strategy.run(self.device_replica_step, args=args))
            self.state.global_step.assign_add(1, read_value=False)  # once, not per replica
            return i + 1, total + summed

        # A while_loop without maximum_iterations (a `for` over tf.range sets it): XLA
        # would take that bound as a constant and compile again for every loop length.
        _, total = tf.while_loop(
            lambda i, _: i < num_steps, step, (tf.constant(0), tf.zeros([MAX_SCALARS]))
        )
        rates = tf.stack([tf.cast(o.learning_rate, tf.float32) for o in self.optimizers.values()])
        mean = total / tf.cast(num_steps, tf.float32)
        return mean, self._finite(), self.state.global_step.read_value(), rates

    def start_input(self) -> None:
        """Builds the training input at the global step (once; `train` needs it).

        A restored run continues the stream where the checkpoint's step left it. Built
        before anything is written, so bad data fails a run that has written nothing.
        """
        if self._iterator is not None or self.device_data is not None:
            return
        arrays = self.arrays
        if arrays is not None and self.prepare_device_data(arrays, place=True):
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
        self._iterator = iter(dataset)

    @functools.cached_property
    def arrays(self) -> TrainArrays | None:
        """The model's training arrays, read once: `train_arrays` may read the model's files."""
        return inputs.train_arrays(self.model)

    def prepare_device_data(self, arrays: TrainArrays, place: bool) -> bool:
        """Trains on device data from `arrays`, unless off or too large (said in one line).

        `place`: put them in the replicas' memory (`tpurun check` only traces the step).
        """
        if not self.run.config.train.device_data:
            device_data.log_fallback("config.train.device_data=false")
            return False
        order = ExampleOrder(arrays.num_examples, self.run.seed)
        reason = device_data.why_not(
            arrays, order, self.cluster, self.run.config.train.device_data_mb
        )
        if reason:
            device_data.log_fallback(reason)
            return False
        self.device_data = device_data.DeviceData(
            arrays, order, self.strategy.num_replicas_in_sync, self.global_batch, self.micro_batches
        )
        if not place:
            return True
        self.device_data.place(self.strategy)
        self._position = self.step
        self._device_loop = tf.function(self._device_host_loop)
        compile_note = self._xla_applies()
        self._compiled = not compile_note
        if self._compiled:
            self._device_loop = tf.function(self._device_host_loop, jit_compile=True)
        logging.info(
            "Training data on the device (%s): each replica step gathers its own batch; %s.",
            device_data.describe(arrays, order),
            compile_note or "the host loop is compiled by XLA",
        )
        return True

    def _xla_applies(self) -> str:
        """Why the device-data host loop is not compiled by XLA as a whole ("" when it is)."""
        if self.cluster.is_tpu:
            return "XLA compiles the replicated step for the TPU"
        if self.strategy.num_replicas_in_sync > 1:
            # The all-reduce and the mirrored variables' updates span every replica's
            # device; each replica's ops are dispatched one by one (docs/benchmarks.md).
            return (
                "the host loop is not compiled by XLA: it spans every replica's device, and "
                "XLA compiles for one"
            )
        if not self.run.config.train.xla:
            return "the host loop is not compiled by XLA (config.train.xla=false)"
        if self.run.config.precision == "mixed_bfloat16" and (
            device_data.device_kind(self.strategy) == "CPU"
        ):
            # Measured on Shakespeare's LSTM: 5x slower than TensorFlow's kernels (docs/device-data.md).
            return (
                "the host loop is not compiled by XLA: its CPU backend has no fast bfloat16 matmuls"
            )
        return ""

    def train(self, num_steps: int) -> LoopStats:
        """Runs one host loop of `num_steps` steps, from the global step."""
        self.start_input()
        start = time.perf_counter()
        if self.device_data is not None:
            totals, finite, step, rates = self._run_device_loop(num_steps)
            scalars = self._named(totals)  # waits for the loop to finish
            step, rate_values, waited = int(step), [float(r) for r in rates.numpy()], 0.0
        else:
            totals, waited_tensor, finite = self._loop(self._iterator, tf.constant(num_steps))
            scalars = self._named(totals)  # waits for the loop to finish
            step, waited = self.step, float(waited_tensor)
            rate_values = list(self.state.learning_rates().values())
        named_rates = dict(zip(self.optimizers, rate_values, strict=True))
        return LoopStats(
            step=step,
            num_steps=num_steps,
            # The scalar named "loss" (the supervised step's), else the step's first.
            loss=scalars.get("loss", next(iter(scalars.values()))),
            seconds=time.perf_counter() - start,
            input_seconds=waited,
            global_batch=self.global_batch * self.micro_batches,
            learning_rate=rate_values[0],
            weights_finite=bool(finite),
            device_input=self.device_data is not None,
            scalars=scalars,
            learning_rates=named_rates if self.state.named else {},
        )

    def _named(self, totals: tf.Tensor) -> dict[str, float]:
        """The loop's mean of each scalar, by the names the step returned them under."""
        values = totals.numpy()
        return {name: float(values[i]) for i, name in enumerate(self._scalar_names)}

    def _run_device_loop(self, num_steps: int) -> tuple[Any, ...]:
        """The device-data host loop; XLA-compiled when it can be (else, once, a line why)."""
        first = tf.constant(self._position, tf.int64)
        try:
            result = self._device_loop(first, tf.constant(num_steps))
        except Exception as e:  # noqa: BLE001 - whatever XLA rejects, the plain loop runs
            if not self._compiled:
                raise
            # XLA compiles the whole loop before it runs a step, and writes the
            # variables only after the last: a failed call changed nothing. An error
            # that is not XLA's comes back from the plain loop, as it always did.
            logging.info(
                "The host loop runs without XLA, which failed on %s's step: %s",
                type(self.model).__name__,
                one_line(e, 200),
            )
            self._compiled = False
            self._device_loop = tf.function(self._device_host_loop)
            result = self._device_loop(first, tf.constant(num_steps))
        self._position += num_steps
        return result

    def forward_graph(self) -> tf.Graph:
        """The serving model's forward pass, traced (not run) on one replica's training
        features (with a training step of its own, on the model's own inputs: a GAN's
        generator takes noise, not the training data)."""
        if has_own_train_step(self.model):
            features_spec = tf.nest.map_structure(
                lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.name), self.keras_model.input
            )
        else:
            ctx = tf.distribute.InputContext(
                num_replicas_in_sync=self.strategy.num_replicas_in_sync
            )
            params = inputs.input_params(ctx, self.global_batch, self.run.seed)
            features_spec, _ = inputs.train_dataset(self.model, params, self.arrays).element_spec
            if isinstance(features_spec, dict):  # the graph's inputs named after the features
                features_spec = {
                    k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in features_spec.items()
                }
        forward = tf.function(lambda features: self.keras_model(features, training=True))
        with self.strategy.scope():
            return forward.get_concrete_function(features_spec).graph
