"""The two compiled host loops of training: over tf.data batches, or over device data.

Each runs `num_steps` replicated steps in one call (TPUEstimator's iterations per
loop) and returns a `LoopResult`. Both are handed what the Trainer owns: its
replica step (the model's `train_step`), the sum of its named scalars over the
replicas, the finiteness of the weights, the global step and the learning rates.
`InputLoop` takes each step's batch from a distributed tf.data iterator;
`DeviceLoop` gives each replica step the step number and the arrays in every
replica's memory (`tpurun.inputs.device_data`), from which it gathers its own batch.
With one replica (a CPU, a GPU) the device loop is compiled by XLA as a whole;
under MirroredStrategy it is not (XLA compiles for one device, and the all-reduce
and the mirrored variables' updates span all of them), and on a TPU XLA compiles
the replicated step anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tpurun.errors.tf_errors import one_line
from tpurun.inputs.device_data import DeviceData

# The most named scalars a training step may return: the host loops add them up in
# one vector of this size (a loop's carried values need their shape before the step
# is traced, which is when the names are known).
MAX_SCALARS = 16


class LoopResult(NamedTuple):
    """What one host loop returns, whichever loop ran it (tensors: reading one waits for it)."""

    means: tf.Tensor  # [MAX_SCALARS]: the mean of each named scalar over the loop's steps
    waited: tf.Tensor  # seconds the steps waited for their batches (0 on device data)
    # Every trainable weight still finite: the last step's update can be NaN while its
    # loss, computed before it, was not, and such weights must never be saved.
    finite: tf.Tensor
    step: tf.Tensor  # the global step after the loop
    rates: tf.Tensor  # each optimizer's learning rate for the next step


@dataclasses.dataclass(frozen=True)
class LoopParts:
    """What a host loop is handed by the Trainer that owns the step and the state."""

    strategy: tf.distribute.Strategy
    # One replica's step on its batch: (features, labels) -> {name: scalar}.
    replica_step: Callable[..., dict[str, tf.Tensor]]
    # The step's scalars (per replica) summed over the replicas, as one [MAX_SCALARS] vector.
    summed: Callable[[dict[str, Any]], tf.Tensor]
    finite: Callable[[], tf.Tensor]  # whether every trainable weight is finite
    global_step: tf.Variable
    rates: Callable[[], tf.Tensor]  # each optimizer's learning rate, in graph
    model_name: str  # the model's class name, for what is logged

    def after(self, total: tf.Tensor, num_steps: tf.Tensor, waited: tf.Tensor) -> LoopResult:
        """The result of a loop that summed `total` over `num_steps` steps."""
        mean = total / tf.cast(num_steps, tf.float32)
        return LoopResult(mean, waited, self.finite(), self.global_step.read_value(), self.rates())


class InputLoop:
    """The host loop over a distributed tf.data iterator: each step takes the next batch."""

    def __init__(self, parts: LoopParts, iterator: Any):
        self.parts = parts
        self.iterator = iterator
        self._loop = tf.function(self._host_loop)

    def describe(self) -> str:
        return "tf.data"

    def run(self, num_steps: int) -> LoopResult:
        return self._loop(self.iterator, tf.constant(num_steps))

    def _host_loop(self, iterator: Any, num_steps: tf.Tensor) -> LoopResult:
        """num_steps replicated steps in-graph; the seconds spent waiting for batches are the
        timestamps around `next(iterator)` (stateful ops: automatic control dependencies
        keep them before and after the fetch)."""
        parts = self.parts
        total = tf.zeros([MAX_SCALARS])
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            before = tf.timestamp()
            batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += tf.timestamp() - before
            total += parts.summed(parts.strategy.run(parts.replica_step, args=batch))
            parts.global_step.assign_add(1, read_value=False)  # once, not per replica
        return parts.after(total, num_steps, waited)


class DeviceLoop:
    """The host loop over device data: each replica step gathers its batch of the step.

    `position`: the steps its stream has given (the global step it starts at).
    `xla_note`: why the loop is not compiled by XLA as a whole ("" when it is).
    """

    def __init__(self, parts: LoopParts, data: DeviceData, position: int, xla_note: str):
        self.parts = parts
        self.data = data
        self.position = position
        self.compiled = not xla_note
        self.xla_note = xla_note
        self._loop = tf.function(self._host_loop, jit_compile=self.compiled or None)

    def describe(self) -> str:
        return self.xla_note or "the host loop is compiled by XLA"

    def replica_step(self, step: tf.Tensor, values: Any) -> dict[str, tf.Tensor]:
        """One replica's training step on device data: gathers its batch of `step` from
        `values` (`DeviceData.values`), then the Trainer's replica step."""
        features, labels = self.data.replica_batch(step, values)
        return self.parts.replica_step(features, labels)

    def run(self, num_steps: int) -> LoopResult:
        """The loop, XLA-compiled when it can be (else, once, a line why)."""
        first = tf.constant(self.position, tf.int64)
        try:
            result = self._loop(first, tf.constant(num_steps))
        except Exception as e:  # noqa: BLE001 - whatever XLA rejects, the plain loop runs
            if not self.compiled:
                raise
            # XLA compiles the whole loop before it runs a step, and writes the
            # variables only after the last: a failed call changed nothing. An error
            # that is not XLA's comes back from the plain loop, as it always did.
            logging.info(
                "The host loop runs without XLA, which failed on %s's step: %s",
                self.parts.model_name,
                one_line(e, 200),
            )
            self.compiled = False
            self._loop = tf.function(self._host_loop)
            result = self._loop(first, tf.constant(num_steps))
        self.position += num_steps
        return result

    def _host_loop(self, first_step: tf.Tensor, num_steps: tf.Tensor) -> LoopResult:
        """num_steps replicated steps from step `first_step` of the data's stream; the step
        and learning rates after them are read here, where they cost the host nothing more
        (a compiled loop's steps take microseconds, an eager read of a variable a good part
        of one)."""
        parts = self.parts
        values = self.data.values

        def step(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            args = (first_step + tf.cast(i, tf.int64), values)
            summed = parts.summed(parts.strategy.run(self.replica_step, args=args))
            parts.global_step.assign_add(1, read_value=False)  # once, not per replica
            return i + 1, total + summed

        # A while_loop without maximum_iterations (a `for` over tf.range sets it): XLA
        # would take that bound as a constant and compile again for every loop length.
        _, total = tf.while_loop(
            lambda i, _: i < num_steps, step, (tf.constant(0), tf.zeros([MAX_SCALARS]))
        )
        return parts.after(total, num_steps, tf.constant(0.0, tf.float64))
