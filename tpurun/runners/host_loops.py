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
own step (`tpurun.runners.loop_plan` decides). Under MirroredStrategy it is
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

from tpurun import tf_internals
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
# An XLA-compiled step faster than this keeps XLA without the plain loop being compiled or
# timed: what it saves, dispatching the step's ops one by one, outweighs any kernel of
# such a step (Iris: 0.06 ms a step with XLA against 0.32 ms without; the steps the plain
# loop beat, issue 41's GANs, took a tenth of a second and more with XLA on a CPU).
# Below it the choice does not depend on the machine's load either, so two fresh runs of
# a small model train the same weights.
TINY_STEP_S = 1e-3
# A timed call's least length: shorter, and the call's own overhead (milliseconds) would be
# timed, not the steps.
CALL_SECONDS = 0.05
# A run of at most this many steps runs the plain loop, neither loop compiled to be timed:
# what XLA saves a step on a CPU or GPU is the dispatch of its ops one by one, and its
# compile of the step costs thousands of those dispatches (Iris: 1.8 s of compile to save
# 0.25 ms a step, even after 7,000 steps; the timing itself costs a compile of each loop).
# A count, not a time, so that two fresh runs of one config choose alike on any machine.
SHORT_RUN_STEPS = 500


@dataclasses.dataclass(frozen=True)
class LoopTimes:
    """The device-data loops timed on the same state (seconds per step of each), and the
    loop chosen by them (`measured`): kept as chosen, so that a resumed run runs it even
    where the rule would now choose otherwise."""

    plain: float | None  # None: not timed, XLA's step is tiny (TINY_STEP_S), or a short run
    xla: float | None  # None: XLA could not compile the step (`xla_error` says why), or
    # was not tried: the run was short
    steps: int  # per timed call (0: none timed)
    use_xla: bool
    xla_error: str = ""
    run_steps: int = 0  # a short run's steps (at most SHORT_RUN_STEPS): neither loop timed

    @classmethod
    def measured(
        cls, plain: float | None, xla: float | None, steps: int, xla_error: str = ""
    ) -> LoopTimes:
        """The times, and the loop they choose: XLA, unless it failed or takes PLAIN_MARGIN
        times the plain loop's time or more."""
        use_xla = xla is not None and (plain is None or xla < PLAIN_MARGIN * plain)
        return cls(plain, xla, steps, use_xla, xla_error)

    @classmethod
    def short_run(cls, run_steps: int) -> LoopTimes:
        """The plain loop, untimed, for a run of `run_steps` <= SHORT_RUN_STEPS steps."""
        return cls(None, None, 0, False, run_steps=run_steps)

    def as_record(self) -> dict[str, Any]:
        """What model_dir/train_config.json keeps of it: a resumed run runs the same loop."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Any) -> LoopTimes | None:
        """The times a record kept; None if it kept none, or not in this form."""
        if not isinstance(record, dict):
            return None
        try:
            times = cls(**record)
        except TypeError:
            return None
        timed = [t for t in (times.plain, times.xla) if t is not None]
        valid = (
            all(isinstance(t, float) and t > 0 for t in timed)
            and isinstance(times.steps, int)
            and isinstance(times.use_xla, bool)
            and isinstance(times.xla_error, str)
            and (times.xla is not None or not times.use_xla)  # XLA's only if it compiled
            and isinstance(times.run_steps, int)
            and times.run_steps >= 0
            # neither timed: XLA failed, or the run was short (by the rule of the tpurun
            # that chose: kept even where this one's SHORT_RUN_STEPS differs)
            and (bool(timed) or bool(times.xla_error) or times.run_steps > 0)
        )
        return times if valid else None

    def shown(self) -> str:
        """Why this loop: `1.2 ms a step with XLA against 3.4 ms without (2.8x faster), timed
        on 100 steps each`."""
        if self.run_steps:
            return (
                f"the run's {self.run_steps} step{'s' * (self.run_steps > 1)} are too few for "
                f"XLA's compile to pay for itself (at most {SHORT_RUN_STEPS}: neither loop timed)"
            )
        if self.xla is None:
            return f"XLA could not compile the step ({self.xla_error})"
        if self.plain is None:
            return (
                f"{_duration(self.xla)} a step with XLA, timed on {self.steps} step"
                f"{'s' * (self.steps > 1)}: under {_duration(TINY_STEP_S)}, faster than "
                "its ops dispatched one by one"
            )
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


@tf.autograph.experimental.do_not_convert
def input_clock() -> Callable[[], tf.Tensor]:
    """What reads the time around each fetch of a batch in the tf.data host loop (seconds,
    float64; only differences count).

    `tf.timestamp`, an op of the loop itself: it costs nothing. Under TensorFlow's op
    determinism (config.train.deterministic, TF_DETERMINISTIC_OPS=1) its kernel refuses to
    run ("Timestamp cannot be called when determinism is enabled"), and no other op reads
    a clock. Then the host's own clock, `time.perf_counter`, read by a `tf.numpy_function`
    callback into this process at the same two points of the loop: a measurement as
    before, not an estimate. Nothing TensorFlow offers is cheaper and still times the
    step's own wait: tf.data's latency statistics (LatencyStatsDataset) time the
    pipeline's last stage, which on a GPU or a TPU the prefetch to the device reads, not
    the step; its getnext metrics are process-wide and not readable from Python; a fetch
    split out of the loop is a host call a step. The callbacks cost two calls into Python
    a step (tens of microseconds; a wait for the GIL when another thread holds it, which
    is then counted as input wait), so they run only under op determinism. TensorFlow
    runs them in this process: where the host loop runs on a CPU, a GPU or a TPU VM, no
    round trip to a device; on a TPU node, whose loop runs on the TPU's host, a round trip
    to this VM a step, which `tpurun.cluster.determinism` warns of (a TPU needs no op
    determinism: XLA's programs are deterministic).
    """
    if not tf_internals.op_determinism_enabled():
        return tf.timestamp
    return _host_time


def _host_time() -> tf.Tensor:
    seconds = tf.numpy_function(time.perf_counter, [], tf.float64, stateful=True)
    return tf.ensure_shape(seconds, [])


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
        clock's readings around `next(iterator)` (`input_clock`), the fetch after the first
        and the second after the batch."""
        parts = self.parts
        clock = input_clock()  # traced once: op determinism is set before a run's first op
        total = tf.zeros([MAX_SCALARS])
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            before = clock()
            with tf.control_dependencies([before]):
                batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += clock() - before
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

    def time_both(self) -> LoopTimes:
        """Times the XLA-compiled and the plain loop on this model's step and runs XLA's from
        then on unless the plain one is clearly faster (`LoopTimes.measured`; the loop
        chosen is compiled already, never twice); the state is put back as it was, bit
        for bit.

        Both loops run the same steps from the same state: every variable a loop call may
        write (it captures them: weights, optimizer slots and counts, the global step,
        Keras' seed generators, a user's own) is copied first and assigned back after,
        and the data position does not move, so the run's first real loop starts where it
        would have: a run that times both trains the weights a run forcing the faster one
        does. XLA's loop is compiled and timed first: a step under TINY_STEP_S keeps it,
        the plain loop never compiled. Else calls of as many steps as take 0.05 s, taking
        turns until both ran 0.5 s or one is clearly 2x the other: beyond the compiles,
        a second, or a few steps of a slow model.
        """
        first = tf.constant(self.position, tf.int64)
        plain, xla = self._function(False), self._function(True)
        state = self._state(xla.get_concrete_function(first, tf.constant(0)))
        saved = [tf.raw_ops.DeepCopy(x=variable.read_value()) for variable in state]
        try:
            times = self._time(plain, xla, first)
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

    def _time(self, plain: Any, xla: Any, first: tf.Tensor) -> LoopTimes:
        def timed(loop: Any, steps: int) -> float:
            start = time.perf_counter()
            loop(first, tf.constant(steps)).step.numpy()  # reading one waits for the loop
            return time.perf_counter() - start

        name = f"the host loop of {self.parts.model_name}'s train_step"
        purpose = " (to time it, then train with the faster loop)"
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
            with announced(f"Compiling {name}", f"Compiled {name}"):
                timed(plain, 0)
            return LoopTimes.measured(None, None, 0, failed)
        # Calls of 1, 8, 64... steps (the steps wrap around the data's order), the faster of
        # two each, until a call takes CALL_SECONDS. The call's overhead only inflates a
        # step's time, so a step under TINY_STEP_S even with it is decided at once (Iris:
        # after calls of 8 steps, ~20 ms).
        # And at least 10 times a call of no step: XLA's costs ~5 ms here, 50 ms under a
        # load of 19 on 2 cores, where one step of Iris timed alone was "26x slower" than
        # the plain loop's.
        least = max(CALL_SECONDS, 10 * min(timed(xla, 0), timed(xla, 0)))
        steps = 1
        while True:
            seconds = min(timed(xla, steps), timed(xla, steps))
            if seconds / steps < TINY_STEP_S:
                return LoopTimes.measured(None, seconds / steps, steps)
            if seconds >= least or steps >= 2**12:
                break
            steps *= 8
        with announced(f"Compiling {name} without XLA{purpose}", f"Compiled {name} without XLA"):
            timed(plain, 0)
        xlas, plains = [seconds], [timed(plain, steps)]
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
        return LoopTimes.measured(min(plains) / steps, min(xlas) / steps, steps)

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
