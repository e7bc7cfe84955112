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
step gathering its own batch: which, and how the loop over it is compiled, is the
`LoopPlan` `tpurun.runners.loop_plan` decides; with config.data.service, tf.data made
by a tf.data service's workers (`tpurun.data_service`). The host loop over either is
`tpurun.runners.host_loops`'s. `forward_graph`: the serving model's forward pass as a
graph, for TensorBoard's graph tab (`TrainSummaries`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from typing import Any

import tensorflow as tf

from tpurun import data_service, inputs
from tpurun.actions.base import LoopStats
from tpurun.actions.progress import announced
from tpurun.cluster import Cluster
from tpurun.errors import RunError
from tpurun.inputs.device_data import DeviceData
from tpurun.model import Mode, Model, TrainArrays, build_models, has_own_train_step
from tpurun.run_config import RunConfig
from tpurun.runners import loop_plan
from tpurun.runners.host_loops import (
    MAX_SCALARS,
    DeviceLoop,
    InputLoop,
    LoopParts,
    LoopTimes,
)
from tpurun.runners.loop_plan import LoopPlan
from tpurun.training_step import keyed_random
from tpurun.training_step.state import TrainState


class Trainer:
    """Holds the models, optimizers and compiled host loop of one training run."""

    def __init__(
        self,
        run: RunConfig,
        cluster: Cluster,
        model: Model,
        arrays: TrainArrays | None = None,
        plan: LoopPlan | None = None,
    ):
        """`arrays`: the model's training arrays when the caller read them already; `plan`:
        its host loop when the caller decided it (`tpurun check`, which builds the step it
        checks, but no loop), else `start_input` decides it."""
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
        # The host loop this run trains with: tf.data until start_input() decides.
        self.plan = plan or LoopPlan()
        self._compiled = False  # the loop: by the first train(), or to time it
        # The input through a tf.data service (config.data.service), once start_input built it.
        self.service_input: data_service.ServiceInput | None = None
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

    @property
    def device_data(self) -> DeviceData | None:
        """The in-memory arrays each replica step gathers its batch from (None: tf.data)."""
        return self.plan.device_data

    @property
    def loop_times(self) -> LoopTimes | None:
        """The device-data loops' times the run chose its loop by (None: not chosen by
        timing): what model_dir's record keeps for a resumed run."""
        return self.plan.loop_times

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
        needs it), as `tpurun.runners.loop_plan` decides it.

        A restored run continues the stream where the checkpoint's step left it. Built
        before anything is written, so bad data fails a run that has written nothing.
        `recorded`: the loop times model_dir's record kept (`loop_times`), read only when
        the run decides between the device-data loops by them.
        """
        if self._loop is not None:
            return
        parts, arrays = self._loop_parts(), self.arrays
        service = data_service.service(self.run.config)
        if service is not None:  # config.data.service: made by a tf.data service's workers
            self.service_input = data_service.ServiceInput(
                self.run, service, self.cluster, self.model, arrays, self.step
            )
            self._loop = InputLoop(parts, iter(self.service_input.distribute()))
            return
        self.plan, loop = loop_plan.decide(
            self.run, self.cluster, arrays, parts, self.step, recorded or (lambda: None)
        )
        self._compiled = self.plan.compiled
        if loop is None:
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
            self._loop = InputLoop(parts, iter(dataset))
        else:
            self._loop = loop

    @functools.cached_property
    def arrays(self) -> TrainArrays | None:
        """The model's training arrays, read once: `train_arrays` may read the model's files."""
        return inputs.train_arrays(self.model)

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


def forward_graph(trainer: Trainer) -> tf.Graph:
    """The serving model's forward pass, traced (not run) on one replica's training
    features (with a training step of its own, on the model's own inputs: a GAN's
    generator takes noise, not the training data)."""
    if has_own_train_step(trainer.model):
        features_spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.name), trainer.keras_model.input
        )
    else:
        ctx = tf.distribute.InputContext(num_replicas_in_sync=trainer.strategy.num_replicas_in_sync)
        params = inputs.input_params(ctx, trainer.global_batch, trainer.run.seed)
        if trainer.arrays is not None:  # from their specs: no second dataset of them
            features_spec, _ = trainer.arrays.batch_spec(params.batch_size)
        else:
            features_spec, _ = trainer.model.input_fn(Mode.TRAIN, params).element_spec
        if isinstance(features_spec, dict):  # the graph's inputs named after the features
            features_spec = {
                k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in features_spec.items()
            }
    forward = tf.function(lambda features: trainer.keras_model(features, training=True))
    with trainer.strategy.scope():
        return forward.get_concrete_function(features_spec).graph
