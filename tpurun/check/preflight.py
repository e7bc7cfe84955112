"""Will each step fit a TPU's memory? `tpurun check --target=TYPE`, before a TPU is rented.

For each step that passed the other checks, the single-device build that check's
XLA rule compiled (the runner's public `replica_step`: the Trainer's with its
optimizer, the Evaluator's, the Predictor's) is compiled again, at the target's
per-replica batch, for its buffer assignment (`tpurun.check.memory`). A step
that does not fit is searched for the largest per-replica batch that does.

What is compiled is what a TPU compiles. Under TPUStrategy the `--iterations`
host loop stays on the host (TensorFlow's TPU host-training-loop rewrite,
tensorflow/core/tpu/graph_rewrite/host_training_loop_optimization_util.cc) and
calls the compiled step once per step, so the loop needs what one step needs.
Even compiled as one XLA loop, N steps re-use one step's buffers: mnist's train
step at batch 128 assigns 146 MB, a while loop of 5 or 50 of them 145 MB
(tests/test_check_preflight.py checks it on Iris's step).

A model that trains on device data (`Model.train_arrays`, tpurun.device_data) has
its device-data train step estimated: its input is the arrays (and their order's
table) that every replica holds for the whole run, and the batch it gathers from
them is one of its temporaries; no batch is prefetched.
"""

from __future__ import annotations

import dataclasses

from tpurun.check import memory
from tpurun.check.input_rules import TPU_BATCH_MULTIPLE
from tpurun.check.memory import MemoryEstimate
from tpurun.check.steps import StepChecker
from tpurun.check.targets import Target
from tpurun.model import Mode, has_generate
from tpurun.train import Trainer

# tpurun.inputs distributes with InputOptions(experimental_fetch_to_device=True): on a
# TPU each replica's next batch is prefetched into its HBM while the step runs on
# the current one, experimental_per_replica_buffer_size of them (default 1,
# https://www.tensorflow.org/api_docs/python/tf/distribute/InputOptions).
PREFETCHED_BATCHES = 1


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One step's estimate at the target's per-replica batch, against a replica's HBM."""

    mode: Mode
    batch: int  # per replica (per micro-batch, with gradient accumulation)
    estimate: MemoryEstimate
    hbm_bytes: int
    # The largest per-replica batch that fits, searched only when `batch` does not
    # (None then: not even a batch of 1 fits).
    max_batch: int | None = None
    micro_batches: int = 1  # train.accumulate_steps: batches stacked into one train step
    # The train step gathers its batches from the training arrays each replica holds
    # (tpurun.device_data): they are its input, instead of the batches prefetched.
    device_data: bool = False

    @property
    def fits(self) -> bool:
        return self.estimate.fits(self.hbm_bytes)

    @property
    def headroom_bytes(self) -> int:
        return self.hbm_bytes - self.estimate.padded_total_bytes


class Preflight:
    """The memory of `checker`'s single-device steps against `hbm_bytes` per replica, one
    compile per (step, batch)."""

    def __init__(self, checker: StepChecker, hbm_bytes: int):
        self.checker = checker
        self.hbm_bytes = hbm_bytes
        self._estimates: dict[tuple[Mode, int], MemoryEstimate] = {}

    def not_estimated(self, mode: Mode) -> str | None:
        """Why a step is not estimated, or None if it is."""
        if mode is Mode.PREDICT and has_generate(self.checker.model):
            return (
                f"tpurun predict runs {self.checker.name}.generate(), not the predict step, "
                "so its memory is not estimated"
            )
        if mode not in self.checker.single_device_steps:
            return "not estimated: fix the errors of this step first"
        return None

    def step_memory(self, mode: Mode) -> StepMemory:
        """The step at the target's per-replica batch, and the largest that fits if it does not."""
        batch = self.checker.per_replica_batch(mode)
        micro_batches = self.checker.run.config.train.accumulate_steps if mode is Mode.TRAIN else 1
        step = StepMemory(
            mode,
            batch,
            self.estimate(mode, batch),
            self.hbm_bytes,
            micro_batches=micro_batches,
            device_data=on_device_data(self.checker.single_device_steps[mode].runner),
        )
        if step.fits:
            return step
        return dataclasses.replace(step, max_batch=self.largest_batch(mode, batch))

    def estimate(self, mode: Mode, batch: int) -> MemoryEstimate:
        """One replica's step at a per-replica batch, as a TPU would hold it (compiled once)."""
        key = (mode, batch)
        if key not in self._estimates:
            runner, spec = self.checker.single_device_steps[mode]
            variables = runner.optimizer_variables if isinstance(runner, Trainer) else ()
            function, args = self.checker.step_call(mode, runner, spec, batch)
            found = memory.estimate(
                function,
                args,
                weights=runner.weights,  # every model's: a GAN's step holds both
                optimizer_variables=variables,  # every named optimizer's
            )
            # On device data the input is the arrays the replica holds: nothing is prefetched.
            held = 1 if on_device_data(runner) else 1 + PREFETCHED_BATCHES
            self._estimates[key] = dataclasses.replace(found, input_batches=held)
        return self._estimates[key]

    def largest_batch(self, mode: Mode, batch: int) -> int | None:
        """The largest per-replica batch below `batch` that fits, by compiling (binary search).

        A multiple of 8 (the TPU pads a batch to one) unless only a smaller one fits.
        """
        hbm = self.hbm_bytes

        def build(size: int) -> MemoryEstimate:
            return self.estimate(mode, size)

        multiple = TPU_BATCH_MULTIPLE
        if batch > multiple:
            found = memory.max_batch_that_fits(
                build,
                hbm,
                multiple,
                batch - 1,
                multiple_of=multiple,
                guess=self._guess(mode, batch),
            )
            if found is not None:
                return found
        return (
            memory.max_batch_that_fits(build, hbm, 1, min(batch, multiple) - 1)
            if batch > 1
            else None
        )

    def _guess(self, mode: Mode, batch: int) -> int | None:
        """Where the memory crosses the HBM, on the line through `batch` and a quarter of it.

        The memory of a step is nearly affine in the batch (weights and optimizer
        state, plus activations and input per example), so this is usually right
        within one multiple of 8, and the search then needs two more compiles.
        """
        small = max(1, batch // 4)
        if small == batch:
            return None
        big_bytes = self.estimate(mode, batch).padded_total_bytes
        small_bytes = self.estimate(mode, small).padded_total_bytes
        per_example = (big_bytes - small_bytes) / (batch - small)
        if per_example <= 0:
            return None
        return int(small + (self.hbm_bytes - small_bytes) / per_example)


def on_device_data(runner: object) -> bool:
    """Whether a runner's step gathers its batches from arrays it holds (a Trainer's)."""
    return isinstance(runner, Trainer) and runner.device_data is not None


@dataclasses.dataclass(frozen=True)
class TargetMemory:
    """What `--target` found: each step's memory, and the steps it could not estimate."""

    target: Target
    steps: tuple[StepMemory, ...]
    skipped: dict[Mode, str]  # not estimated, and why (nothing to estimate, or other errors)
    failed: dict[Mode, str]  # the estimate itself failed: why

    def step(self, mode: Mode) -> StepMemory | None:
        return next((s for s in self.steps if s.mode is mode), None)


def estimate_steps(checker: StepChecker, target: Target) -> TargetMemory:
    """Every step's memory on `target`, searched for the largest batch where it does not fit."""
    preflight = Preflight(checker, target.hbm_bytes_per_replica)
    steps, skipped, failed = [], {}, {}
    for mode in Mode:
        why_not = preflight.not_estimated(mode)
        if why_not is not None:
            skipped[mode] = why_not
            continue
        try:
            steps.append(preflight.step_memory(mode))
        except memory.EstimateError as e:
            failed[mode] = str(e)
    return TargetMemory(target, tuple(steps), skipped, failed)
