"""The training runner: a model, its optimizer and the compiled host loop of `--iterations` steps.

The Trainer knows nothing of cadences, checkpoint files, signals or what is shown:
`tpurun.controller` asks it for `train(num_steps)` and decides the rest. The
recipe lives in the step: the precision policy the model was built under (the
loss in float32; float16 with dynamic loss scaling), the optimizer of
`tpurun.optimization` (schedule, weight decay, clipping, EMA), and gradient
accumulation: with `train.accumulate_steps` = N, one step sums the gradients of N
micro-batches of `--batch_size` in-graph and applies them once.

The input is tf.data (`tpurun.inputs`), or for a model with `train_arrays` device
data (`tpurun.device_data`): the arrays in every replica's memory and each replica
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

import keras
import tensorflow as tf
from absl import logging

from tpurun import device_data, inputs, optimization, precision
from tpurun.actions.base import LoopStats
from tpurun.cluster import Cluster
from tpurun.example_order import ExampleOrder
from tpurun.model import Mode, Model, TrainArrays, build_keras_model
from tpurun.run_config import RunConfig
from tpurun.tf_errors import one_line


class Trainer:
    """Holds the model, optimizer and compiled host loop of one training run."""

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
        with self.strategy.scope():
            self.keras_model = build_keras_model(model)
            # The optimizer whose state a checkpoint holds, whatever the precision.
            self.optimizer = model.optimizer()
            self._applies = self.optimizer
            if precision.needs_loss_scaling(run.config.precision):
                self._applies = keras.optimizers.LossScaleOptimizer(self.optimizer)
            # Slot variables must exist before the first replicated step: created
            # lazily inside it, they break with 2+ replicas.
            self._applies.build(self.keras_model.trainable_variables)
        # What a checkpoint holds; saves write this one.
        self.checkpoint = self.fresh_checkpoint()
        self._configured_learning_rate = self._constant_learning_rate()
        self._loop = tf.function(self._host_loop)
        self._iterator: Any = None  # the training input, from start_input()...
        self.device_data: device_data.DeviceData | None = None  # ...or this
        self._device_loop: Any = None
        self._compiled = False  # whether _device_loop is the XLA-compiled one
        self._position = 0  # device data: the steps its stream has given
        if arrays is not None:
            self.arrays = arrays  # read once (the cached property below, set)

    def fresh_checkpoint(self, present: Collection[str] | None = None) -> tf.train.Checkpoint:
        """A new checkpoint object over the model and optimizer (a restore attempt takes one).

        `present`: the parts a checkpoint file has, to read one that lacks an optional
        part (`model_variables` before tpurun 0.2; `loss_scale` when not trained in
        float16); None: every part, to save.
        """
        parts: dict[str, Any] = {"model": self.keras_model, "optimizer": self.optimizer}
        # Every model variable by name too: Keras's random-number states (Dropout's
        # seed_generator_state) are not reachable through `model`, and a resume that
        # restarted them would draw the first steps' dropout masks again.
        parts["model_variables"] = list(self.keras_model.variables)
        if self._applies is not self.optimizer:
            # float16's loss scale: apart from the optimizer, so a checkpoint reads the
            # same under every precision.
            parts["loss_scale"] = self._applies
        if present is not None:
            parts = {k: v for k, v in parts.items() if k in present or k in ("model", "optimizer")}
        return tf.train.Checkpoint(**parts)

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    @property
    def learning_rate(self) -> float:
        """The rate the next step uses (a schedule's value at the current step)."""
        return optimization.learning_rate_at(self.optimizer, self.step)

    def keep_configured_learning_rate(self) -> None:
        """After a restore: a constant learning rate comes from this run's config.

        A constant rate is a variable, so the checkpoint brought back the old one;
        the config of this run decides, as the flags did for TPUEstimator.
        """
        configured, restored = self._configured_learning_rate, self._constant_learning_rate()
        if configured is not None and restored != configured:
            self.optimizer.learning_rate = configured
            logging.info(
                "Learning rate %g from the config (the checkpoint had %g).", configured, restored
            )

    def _constant_learning_rate(self) -> float | None:
        """The optimizer's learning rate, or None when it follows a schedule.

        Keras's public `get_config` gives a constant rate as a number and a schedule
        as its serialized description.
        """
        if not isinstance(self.optimizer.get_config().get("learning_rate"), (int, float)):
            return None
        return self.learning_rate

    def replica_step(self, features, labels) -> tf.Tensor:
        """One replica's training step on its batch; returns its share of the loss.

        With accumulation, `features` and `labels` stack the step's micro-batches
        ([micro_batches, batch, ...]): their gradients are summed, then applied once.
        """
        variables = self.keras_model.trainable_variables
        if self.micro_batches == 1:
            loss, gradients = self._gradients(features, labels)
        else:
            loss = tf.constant(0.0)
            gradients = [tf.zeros_like(v) for v in variables]
            for i in tf.range(self.micro_batches):
                micro_features, micro_labels = tf.nest.map_structure(
                    lambda t, i=i: t[i], (features, labels)
                )
                micro_loss, micro_gradients = self._gradients(micro_features, micro_labels)
                loss += micro_loss
                gradients = [
                    g if m is None else g + tf.convert_to_tensor(m)  # sparse ones made dense
                    for g, m in zip(gradients, micro_gradients, strict=True)
                ]
        self._applies.apply_gradients(zip(gradients, variables, strict=True))
        return loss

    def _gradients(self, features, labels) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """This replica's loss on one (micro-)batch and its gradients (of the loss-scaled
        loss with float16: the LossScaleOptimizer unscales them)."""
        with tf.GradientTape() as tape:
            outputs = precision.float32(self.keras_model(features, training=True))
            per_example = self.model.loss(labels, outputs)
            # Scaled by the global batch of a whole step (all micro-batches), so the
            # all-reduced (summed) gradients equal those of one replica on it.
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=self.global_batch * self.micro_batches
            )
            if self.keras_model.losses:
                regularization = tf.add_n([tf.cast(x, tf.float32) for x in self.keras_model.losses])
                loss += tf.nn.scale_regularization_loss(regularization) / self.micro_batches
            scaled = self._applies.scale_loss(loss) if self._applies is not self.optimizer else loss
        return loss, tape.gradient(scaled, self.keras_model.trainable_variables)

    def device_replica_step(self, step: tf.Tensor, values: Any) -> tf.Tensor:
        """One replica's training step on device data: gathers its batch of `step` from
        `values` (`DeviceData.values`), then `replica_step`."""
        assert self.device_data is not None
        features, labels = self.device_data.replica_batch(step, values)
        return self.replica_step(features, labels)

    def _host_loop(self, iterator, num_steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Runs num_steps replicated steps in-graph.

        Returns their mean loss, the seconds spent waiting for batches (the
        timestamps around `next(iterator)` are stateful ops, so automatic control
        dependencies keep them before and after the fetch), and whether every
        weight is still finite: the last step's update can be NaN while its loss,
        computed before it, was not, and such weights must never be saved.
        """
        total = tf.constant(0.0)
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            before = tf.timestamp()
            batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += tf.timestamp() - before
            per_replica_loss = self.strategy.run(self.replica_step, args=batch)
            total += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        finite = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(v)) for v in self.keras_model.trainable_variables]
        )
        return total / tf.cast(num_steps, tf.float32), waited, finite

    def _device_host_loop(self, first_step: tf.Tensor, num_steps: tf.Tensor) -> tuple[Any, ...]:
        """num_steps replicated steps on device data, from step `first_step` of its stream.

        Returns their mean loss and whether every weight is still finite, as
        `_host_loop` does (there is no input to wait for), and the step and learning
        rate after them: read here, they cost the host nothing more (a compiled loop's
        steps take microseconds, an eager read of a variable a good part of one).
        """
        assert self.device_data is not None
        values = self.device_data.values

        def step(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            args = (first_step + tf.cast(i, tf.int64), values)
            per_replica_loss = self.strategy.run(self.device_replica_step, args=args)
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
            return i + 1, total + loss

        # A while_loop without maximum_iterations (a `for` over tf.range sets it): XLA
        # would take that bound as a constant and compile again for every loop length.
        _, total = tf.while_loop(
            lambda i, _: i < num_steps, step, (tf.constant(0), tf.constant(0.0))
        )
        finite = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(v)) for v in self.keras_model.trainable_variables]
        )
        rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        return total / tf.cast(num_steps, tf.float32), finite, self.optimizer.iterations, rate

    def start_input(self) -> None:
        """Builds the training input at the optimizer's current step (once; `train` needs it).

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
        """Runs one host loop of `num_steps` steps, from the optimizer's current step."""
        self.start_input()
        start = time.perf_counter()
        if self.device_data is not None:
            loss, finite, step, rate = self._run_device_loop(num_steps)
            loss_value = float(loss)  # waits for the loop to finish
            return LoopStats(
                step=int(step),
                num_steps=num_steps,
                loss=loss_value,
                seconds=time.perf_counter() - start,
                input_seconds=0.0,
                global_batch=self.global_batch * self.micro_batches,
                learning_rate=float(rate),
                weights_finite=bool(finite),
                device_input=True,
            )
        loss, waited, finite = self._loop(self._iterator, tf.constant(num_steps))
        loss_value = float(loss)  # waits for the loop to finish
        return LoopStats(
            step=self.step,
            num_steps=num_steps,
            loss=loss_value,
            seconds=time.perf_counter() - start,
            input_seconds=float(waited),
            global_batch=self.global_batch * self.micro_batches,
            learning_rate=self.learning_rate,
            weights_finite=bool(finite),
        )

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
        """The model's forward pass, traced (not run) on one replica's training features."""
        ctx = tf.distribute.InputContext(num_replicas_in_sync=self.strategy.num_replicas_in_sync)
        params = inputs.input_params(ctx, self.global_batch, self.run.seed)
        features_spec, _ = inputs.train_dataset(self.model, params, self.arrays).element_spec
        if isinstance(features_spec, dict):  # the graph's inputs named after the features
            features_spec = {
                k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in features_spec.items()
            }
        forward = tf.function(lambda features: self.keras_model(features, training=True))
        with self.strategy.scope():
            return forward.get_concrete_function(features_spec).graph
