"""The two compiled host loops of training: over tf.data batches, or over device data.

Each runs `num_steps` replicated steps in one call (TPUEstimator's iterations per
loop) and returns a `LoopResult`. Both are handed what the Trainer owns: its
replica step (the model's `train_step`), the sum of its named scalars over the
replicas, the finiteness of the weights, the global step and the learning rates.
`InputLoop` takes each step's batch from a distributed tf.data iterator;
`DeviceLoop` gives each replica step the step number and the arrays in every
replica's memory (`tpurun.inputs.device_data`), from which it gathers its own batch.
With one replica (a CPU, a GPU) the device loop may be compiled by XLA as a whole,
which is many times faster for a step of many small ops and several times slower for
one of large convolutions on a CPU: `DeviceLoop.time_both` times both on the model's
own step (the Trainer decides, `tpurun.runners.train`). Under MirroredStrategy it is
not (XLA compiles for one device, and the all-reduce and the mirrored variables'
updates span all of them), and on a TPU XLA compiles the replicated step anyway.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tpurun.actions.progress import announced
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


# XLA stays unless the plain loop is this much faster: within the timings' noise two fresh
# runs of one model could choose differently (the two loops round sums differently, so
# their weights would differ in the last bits); XLA was the loop before the timing.
PLAIN_MARGIN = 1.3


@dataclasses.dataclass(frozen=True)
class LoopTimes:
    """The device-data loops timed on the same state: seconds per step of each."""

    plain: float
    xla: float | None  # None: XLA could not compile the step (`xla_error` says why)
    steps: int  # per timed call
    xla_error: str = ""

    @property
    def use_xla(self) -> bool:
        """XLA, unless it failed or takes PLAIN_MARGIN times the plain loop's time or more."""
        return self.xla is not None and self.xla < PLAIN_MARGIN * self.plain

    def as_record(self) -> dict[str, Any]:
        """What model_dir/train_config.json keeps of it: a resumed run runs the same loop."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Any) -> LoopTimes | None:
        """The times a record kept; None if it kept none, or not in this form."""
        try:
            times = cls(**record)
        except TypeError:
            return None
        plain, xla = times.plain, times.xla
        valid = isinstance(plain, float) and (xla is None or isinstance(xla, float))
        return times if valid and isinstance(times.steps, int) else None

    def shown(self) -> str:
        """Why this loop: `1.2 ms a step with XLA against 3.4 ms without (2.8x faster), timed
        on 100 steps each`."""
        if self.xla is None:
            return f"XLA could not compile the step ({self.xla_error})"
        ratio = self.plain / self.xla
        how = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
        if not self.use_xla:
            how += f", {PLAIN_MARGIN:g}x or more"
        elif ratio < 1:
            how += f", less than {PLAIN_MARGIN:g}x"
        return (
            f"{_duration(self.xla)} a step with XLA against {_duration(self.plain)} without "
            f"({how}), timed on {self.steps} step{'s' * (self.steps > 1)} each"
        )


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


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
    `compiled`: whether XLA compiles the whole loop; `why`: what the log says of it.
    """

    def __init__(self, parts: LoopParts, data: DeviceData, position: int, compiled: bool, why: str):
        self.parts = parts
        self.data = data
        self.position = position
        self.compiled = compiled
        self.why = why
        self._loop = self._function(compiled)

    def _function(self, compiled: bool) -> Any:
        return tf.function(self._host_loop, jit_compile=compiled or None)

    def describe(self) -> str:
        return self.why

    def replica_step(self, step: tf.Tensor, values: Any) -> dict[str, tf.Tensor]:
        """One replica's training step on device data: gathers its batch of `step` from
        `values` (`DeviceData.values`), then the Trainer's replica step."""
        features, labels = self.data.replica_batch(step, values)
        return self.parts.replica_step(features, labels)

    def run(self, num_steps: int) -> LoopResult:
        """The loop, XLA-compiled when it can be (else, once, a line why); 0 steps compile it."""
        first = tf.constant(self.position, tf.int64)
        try:
            result = self._loop(first, tf.constant(num_steps))
        except Exception as e:  # noqa: BLE001 - whatever XLA rejects, the plain loop runs
            if not self.compiled:
                raise
            # XLA compiles the whole loop before it runs a step, and writes the
            # variables only after the last: a failed call changed nothing. An error
            # that is not XLA's comes back from the plain loop, as it always did.
            failed = f"which failed on {self.parts.model_name}'s step: {one_line(e, 200)}"
            self.why = f"the host loop is not compiled by XLA, {failed}"
            logging.info("The host loop runs without XLA, %s", failed)
            self.compiled = False
            self._loop = self._function(False)
            result = self._loop(first, tf.constant(num_steps))
        self.position += num_steps
        return result

    def time_both(self, max_steps: int) -> LoopTimes:
        """Times the plain and the XLA-compiled loop on this model's step and runs XLA's from
        then on unless the plain one is clearly faster (`LoopTimes.use_xla`; both are
        compiled already); the state is put back as it was, bit for bit.

        Both loops run the same steps from the same state: every variable a loop call may
        write (it captures them: weights, optimizer slots and counts, the global step,
        Keras' seed generators, a user's own) is copied first and assigned back after,
        and the data position does not move, so the run's first real loop starts where it
        would have. A run that times both trains the weights a run forcing the faster one
        does. Calls of as many steps as take the plain loop 0.1 s (at most `max_steps`,
        the run's host loop), taking turns until both ran 0.5 s or one is clearly 2x the
        other: beyond the two compiles, a second, or a few steps of a slow model.
        """
        first = tf.constant(self.position, tf.int64)
        plain, xla = self._function(False), self._function(True)
        state = self._state(plain.get_concrete_function(first, tf.constant(0)))
        saved = [tf.raw_ops.DeepCopy(x=variable.read_value()) for variable in state]
        try:
            times = self._time(plain, xla, first, max_steps)
        finally:
            for variable, value in zip(state, saved, strict=True):
                variable.assign(value, read_value=False)
        self.compiled = times.use_xla
        self._loop = xla if self.compiled else plain
        return times

    def _state(self, traced: Any) -> list[Any]:
        """What a call of the loop may write: the variables it captures, but the data's."""
        data = {id(v) for v in tf.nest.flatten(self.data.values)}
        return [v for v in traced.variables if id(v) not in data]

    def _time(self, plain: Any, xla: Any, first: tf.Tensor, max_steps: int) -> LoopTimes:
        def timed(loop: Any, steps: int) -> float:
            start = time.perf_counter()
            loop(first, tf.constant(steps)).step.numpy()  # reading one waits for the loop
            return time.perf_counter() - start

        name = f"the host loop of {self.parts.model_name}'s train_step"
        purpose = " (to time it against the other, then train with the faster)"
        with announced(f"Compiling {name} without XLA{purpose}", f"Compiled {name} without XLA"):
            timed(plain, 0)
        # As many steps as make a call 0.1 s, up to a host loop's: fewer, and the call's own
        # overhead (milliseconds, XLA's larger) would be timed instead of the steps.
        steps = 1
        while (seconds := min(timed(plain, steps), timed(plain, steps))) < 0.1:
            if steps >= max_steps:
                break
            steps = min(max_steps, 4 * steps)
        try:
            with announced(f"Compiling {name} with XLA{purpose}", f"Compiled {name} with XLA"):
                timed(xla, 0)
        except Exception as e:  # noqa: BLE001 - what XLA cannot compile runs without it
            failed = one_line(e, 200)
            logging.info(
                "The host loop runs without XLA, which failed on %s's step: %s",
                self.parts.model_name,
                failed,
            )
            return LoopTimes(seconds / steps, None, steps, failed)
        plains, xlas = [seconds], [timed(xla, steps)]
        while len(xlas) < 5:
            # Taking turns, the machine's load falls on both alike; the fastest of each
            # counts. A ratio 2x away from the margin is clear after two rounds, or after
            # one of long calls; else until both ran 0.5 s.
            away = min(xlas) / min(plains) / PLAIN_MARGIN
            clear = not 0.5 < away < 2 and (len(xlas) >= 2 or min(plains + xlas) >= 1.0)
            if clear or (len(xlas) >= 2 and min(sum(plains), sum(xlas)) >= 0.5):
                break
            plains.append(timed(plain, steps))
            xlas.append(timed(xla, steps))
        return LoopTimes(min(plains) / steps, min(xlas) / steps, steps)

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
