"""`Step`: what the launcher hands a model's `train_step`, one replica's view of one training step.

A training step runs on every replica at once (inside `strategy.run`), each on
its own part of the global batch, and their gradients are summed by the
optimizers' all-reduce. For N replicas to compute the update one replica would,
a loss must be averaged over the *global* batch (`Step.mean`), regularization
scaled by the replicas (`Step.regularization`), random numbers drawn per example
of the global batch (`Step.random`), and gradients applied by the optimizer that
owns the variables, with the precision's loss scaling (`Step.minimize`, or
`Step.gradients` then `Step.apply`). The step returns named scalars, each this
replica's share (what `Step.mean` gives): the launcher sums them over the
replicas (so a share of the global mean adds up to the global mean) and averages
them over the host loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tpurun.training_step.keyed_random import KeyedRandom


class Step:
    """One replica's training step: the models, named optimizers, scaling helpers, keyed draws.

    Made by the launcher for each trace of the step; a model's `train_step` reads it:

    * `models` (by name, as `Model.build` returned them), `model` (the serving one);
    * `optimizers` by name: `optimizer` for `config.optimizer`, else the names of
      `config.optimizers`; each updates the variables `Model.optimized_variables`
      gives it (`variables(name)`);
    * `number`: the global step (int64 tensor, the steps done before this one): what
      schedules, cadences and checkpoints count, whatever the optimizers' own
      `iterations` say;
    * `global_batch`: the examples of the whole step over all replicas (times
      `micro_batches` with the default step's accumulation); `batch_size`: this
      replica's rows;
    * `random`: draws keyed on (seed, step, example) (`KeyedRandom`).
    """

    def __init__(
        self,
        *,
        models: Mapping[str, keras.Model],
        serving: str,
        optimizers: Mapping[str, Any],
        applying: Mapping[str, Any],
        variables: Mapping[str, Sequence[Any]],
        number: tf.Variable,
        seed: int,
        global_batch: int,
        batch_size: int,
        micro_batches: int = 1,
    ):
        self.models = dict(models)
        self.model = self.models[serving]
        self.optimizers = dict(optimizers)
        self._applying = dict(applying)  # the LossScaleOptimizer around each under mixed_float16
        self._variables = {name: list(v) for name, v in variables.items()}
        self._number = number
        self.global_batch = global_batch * micro_batches
        self.batch_size = batch_size
        self.micro_batches = micro_batches
        self._micro_batch: Any = 0
        self.random = KeyedRandom(seed, lambda: self.number, self._rows)

    @property
    def number(self) -> tf.Tensor:
        """The global step (int64): the steps done before this one. Read when asked: a step
        that never asks reads nothing."""
        return tf.convert_to_tensor(self._number)

    def _rows(self) -> tf.Tensor:
        """int64 [batch]: each row's index in the step's global batch.

        Replica r holds the r-th slice of the global batch (the input deals
        consecutive per-replica batches to the replicas in order, tpurun.inputs and
        tpurun.inputs.device_data), and with accumulation micro-batch m of replica r is
        batch r * micro_batches + m of the step.
        """
        context = tf.distribute.get_replica_context()
        replica = 0 if context is None else context.replica_id_in_sync_group
        replica = tf.cast(replica, tf.int64)
        first = (replica * self.micro_batches + tf.cast(self._micro_batch, tf.int64)) * (
            self.batch_size
        )
        return first + tf.range(self.batch_size, dtype=tf.int64)

    @contextlib.contextmanager
    def micro_batch(self, index: Any) -> Iterator[None]:
        """Within the block, `random` draws for micro-batch `index` (the default step's
        accumulation loop sets it)."""
        previous, self._micro_batch = self._micro_batch, index
        try:
            yield
        finally:
            self._micro_batch = previous

    def variables(self, optimizer: str) -> list[Any]:
        """The variables `optimizer` updates (`Model.optimized_variables`)."""
        self._require(optimizer)
        return self._variables[optimizer]

    # do_not_convert (here and below): no tensor-dependent Python control flow, no user
    # code; why it pays, at tpurun.precision.float32.
    @tf.autograph.experimental.do_not_convert
    def mean(self, per_example: tf.Tensor) -> tf.Tensor:
        """This replica's share of the mean over the global batch (float32): summed over the
        replicas it is the mean of the whole step, and so are its gradients.

        `per_example` has one value per row of the replica's batch (shape [batch] or
        [batch, ...], summed over the rest). Not `tf.reduce_mean`: on N replicas that
        makes every gradient N times too large.
        """
        per_example = tf.cast(per_example, tf.float32)
        return tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)

    def regularization(self, model: str | None = None) -> tf.Tensor:
        """The model's (default: the serving model's) regularization losses, scaled for the
        replicas (and micro-batches) so that they add up to one copy; 0.0 if it has none.
        Read it inside the tape, after the model's forward pass."""
        losses = self.models[model].losses if model else self.model.losses
        if not losses:
            return tf.constant(0.0)
        total = tf.add_n([tf.cast(loss, tf.float32) for loss in losses])
        return tf.nn.scale_regularization_loss(total) / self.micro_batches

    def gradients(self, optimizer: str, tape: tf.GradientTape, loss: tf.Tensor) -> list[Any]:
        """Gradients of `loss` (a share, from `mean`) for the variables of `optimizer`.

        Under mixed_float16 they are of the loss-scaled loss, as `apply` expects.
        """
        applying = self._applying[self._require(optimizer)]
        if applying is not self.optimizers[optimizer]:  # the precision's loss scale
            scale = tf.cast(applying.scale_loss(tf.constant(1.0)), loss.dtype)
            return tape.gradient(loss, self._variables[optimizer], output_gradients=scale)
        return tape.gradient(loss, self._variables[optimizer])

    def apply(self, optimizer: str, gradients: Sequence[Any]) -> None:
        """Applies `gradients` (from `gradients`, in the order of `variables(optimizer)`):
        the all-reduce over the replicas, clipping, weight decay, the update, EMA."""
        variables = self._variables[self._require(optimizer)]
        self._applying[optimizer].apply_gradients(zip(gradients, variables, strict=True))

    def minimize(self, optimizer: str, tape: tf.GradientTape, loss: tf.Tensor) -> None:
        """One update of `optimizer`'s variables against `loss` (a share, from `mean`):
        `gradients`, then `apply`. Call it after the tape's block."""
        self.apply(optimizer, self.gradients(optimizer, tape, loss))

    @tf.autograph.experimental.do_not_convert
    def _require(self, optimizer: str) -> str:
        if optimizer not in self.optimizers:
            raise ValueError(
                f"no optimizer {optimizer!r} in this run (it has "
                f"{', '.join(sorted(self.optimizers))}): config.optimizers.<name> names them, "
                "config.optimizer is the one named 'optimizer'"
            )
        return optimizer
