"""Will each step fit a TPU's memory? `tpurun check --target=TYPE`, before a TPU is rented.

For each step that passed the other checks, the single-device build that check's
XLA rule compiled (the runner's public `replica_step`: the Trainer's with its
optimizer, the Evaluator's, the Predictor's) is compiled again, at the target's
per-replica batch, for its buffer assignment (`tpurun.check.sizing.memory`). A step
that does not fit is searched for the largest per-replica batch that does
(`tpurun.check.sizing.batch_search`: at most ceil(log2(batch / 8)) + 2 more compiles).

What is compiled is what a TPU compiles. Under TPUStrategy the `--iterations`
host loop stays on the host (TensorFlow's TPU host-training-loop rewrite,
tensorflow/core/tpu/graph_rewrite/host_training_loop_optimization_util.cc) and
calls the compiled step once per step, so the loop needs what one step needs.
Even compiled as one XLA loop, N steps re-use one step's buffers: mnist's train
step at batch 128 assigns 146 MB, a while loop of 5 or 50 of them 145 MB
(tests/test_check_preflight.py checks it on Iris's step).

A model that trains on device data (`Model.train_arrays`, tpurun.inputs.device_data) has
its device-data train step estimated: its input is the arrays (and their order's
table) that every replica holds for the whole run, and the batch it gathers from
them is one of its temporaries; no batch is prefetched.

With the TPU compiler (`tpurun.check.sizing.tpu_compiler`, the `tpu-compile` extra) each
of those compiles is the TPU's own, for the target's generation, and a replica's
HBM is what that compiler allows a program; without it, or for a step whose TPU
compile fails (`fallbacks`: why), the XLA:CPU estimate sizes the step.
"""

from __future__ import annotations

import dataclasses
import time

from absl import logging

from tpurun.check.rules.input_rules import TPU_BATCH_MULTIPLE
from tpurun.check.rules.step_builds import StepBuilder
from tpurun.check.sizing import batch_search, memory
from tpurun.check.sizing.batch_search import Found, Outcome
from tpurun.check.sizing.memory import MemoryEstimate
from tpurun.check.sizing.tpu_compiler.client import CompileError
from tpurun.check.sizing.tpu_compiler.sizing import XLA_CPU, CompiledStep, RefusedStep, TpuSizer
from tpurun.check.targets import GENERATIONS, Target
from tpurun.model import Mode, has_generate
from tpurun.runners.train import Trainer

# A step's memory as the TPU compiler found it (or what it said when it refused the
# step), or as XLA:CPU estimates it.
StepSize = MemoryEstimate | CompiledStep | RefusedStep

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
    estimate: StepSize
    hbm_bytes: int
    # The search for the largest per-replica batch that fits, made only when `batch`
    # does not (its batch is None when not even a batch of 1 fits).
    search: Found | None = None
    # When not even a batch of 1 fits: the step at a batch of 1 (what it needs at least).
    smallest: StepSize | None = None
    micro_batches: int = 1  # train.accumulate_steps: batches stacked into one train step
    # The train step gathers its batches from the training arrays each replica holds
    # (tpurun.inputs.device_data): they are its input, instead of the batches prefetched.
    device_data: bool = False

    @property
    def fits(self) -> bool:
        return self.estimate.fits(self.hbm_bytes)

    @property
    def max_batch(self) -> int | None:
        """The largest per-replica batch the search found to fit (None: not searched, or
        not even a batch of 1 fits)."""
        return self.search.batch if self.search else None

    @property
    def headroom_bytes(self) -> int | None:
        """HBM minus the step's total; None for a step the compiler refused (no total)."""
        if isinstance(self.estimate, RefusedStep):
            return None
        return self.hbm_bytes - self.estimate.padded_total_bytes

    @property
    def compiler(self) -> str:
        """What sized the step: "tpu" or "xla:cpu"."""
        return XLA_CPU if isinstance(self.estimate, MemoryEstimate) else self.estimate.compiler

    @property
    def examples(self) -> int:
        """Examples one replica's step processes: its batch, times its micro-batches."""
        return self.batch * self.micro_batches


class Preflight:
    """The memory of the single-device steps `builds` holds against `hbm_bytes` per replica, one
    compile per (step, batch): by the TPU compiler with a `sizer`, else by XLA:CPU."""

    def __init__(self, builds: StepBuilder, hbm_bytes: int, sizer: TpuSizer | None = None):
        self.builds = builds
        self.hbm_bytes = hbm_bytes
        self.sizer = sizer
        # Steps the TPU compiler could not size, and why: estimated by XLA:CPU instead.
        self.fallbacks: dict[Mode, str] = {}
        self._estimates: dict[tuple[Mode, int], StepSize] = {}

    def not_estimated(self, mode: Mode) -> str | None:
        """Why a step is not estimated, or None if it is."""
        if mode is Mode.PREDICT and has_generate(self.builds.model):
            return (
                f"tpurun predict runs {self.builds.name}.generate(), not the predict step, "
                "so its memory is not estimated"
            )
        if mode not in self.builds.single_device_steps:
            return "not estimated: fix the errors of this step first"
        return None

    def on_tpu(self, mode: Mode) -> bool:
        """Whether the TPU compiler sizes `mode`'s step."""
        return self.sizer is not None and mode not in self.fallbacks

    def hbm_for(self, mode: Mode) -> int:
        """A replica's HBM for `mode`'s step: as the TPU compiler counts it when it sizes
        the step (15.75 GiB of a v5e chip's 16 GB), else the documented figure."""
        if self.sizer is not None and self.on_tpu(mode):
            return self.sizer.capacity.bytes
        return self.hbm_bytes

    def step_memory(self, mode: Mode) -> StepMemory:
        """The step at the target's per-replica batch, and the largest that fits if it does not.

        A TPU compile that fails (not a refusal for lack of memory: that is an answer)
        sends the whole step, its batch search included, to the XLA:CPU estimate.
        """
        try:
            return self._step_memory(mode)
        except CompileError as e:
            if not self.on_tpu(mode):
                raise
            self.fallbacks[mode] = str(e)
            self._estimates = {k: v for k, v in self._estimates.items() if k[0] is not mode}
            return self._step_memory(mode)

    def _step_memory(self, mode: Mode) -> StepMemory:
        batch = self.builds.per_replica_batch(mode)
        micro_batches = self.builds.run.config.train.accumulate_steps if mode is Mode.TRAIN else 1
        step = StepMemory(
            mode,
            batch,
            self.estimate(mode, batch),
            self.hbm_for(mode),
            micro_batches=micro_batches,
            device_data=on_device_data(self.builds.single_device_steps[mode].runner),
        )
        if step.fits:
            return step
        search = self.largest_batch(mode, batch)
        smallest = self.estimate(mode, 1) if search.batch is None else None
        return dataclasses.replace(step, search=search, smallest=smallest)

    def estimate(self, mode: Mode, batch: int) -> StepSize:
        """One replica's step at a per-replica batch, as a TPU would hold it (compiled once)."""
        key = (mode, batch)
        if key not in self._estimates:
            runner, spec = self.builds.single_device_steps[mode]
            variables = runner.optimizer_variables if isinstance(runner, Trainer) else ()
            function, args = self.builds.step_call(mode, runner, spec, batch)
            size = self.sizer.size if self.sizer is not None and self.on_tpu(mode) else None
            start = time.monotonic()
            if size is not None:
                found: StepSize = size(
                    function,
                    args,
                    weights=runner.weights,  # every model's: a GAN's step holds both
                    optimizer_variables=variables,  # every named optimizer's
                )
            else:
                found = memory.estimate(
                    function,
                    args,
                    weights=runner.weights,
                    optimizer_variables=variables,
                    compiled=self.builds.jit_step(runner, mode, batch, function, args),
                )
            # On device data the input is the arrays the replica holds: nothing is prefetched.
            held = 1 if on_device_data(runner) else 1 + PREFETCHED_BATCHES
            self._estimates[key] = dataclasses.replace(found, input_batches=held)
            if size is not None:  # seconds to minutes each: say what the wait is for
                logging.info(
                    "The TPU compiler sized the %s step at %d per replica in %.0f s: %s.",
                    mode.value,
                    batch,
                    time.monotonic() - start,
                    self._said(self._estimates[key], self.hbm_for(mode)),
                )
        return self._estimates[key]

    @staticmethod
    def _said(size: StepSize, hbm_bytes: int) -> str:
        if isinstance(size, RefusedStep):
            return f"refused, {size.stated}"
        fits = "fits" if size.fits(hbm_bytes) else "does not fit"
        total = memory.format_bytes(size.padded_total_bytes, 4)
        return f"{total} of {memory.format_bytes(hbm_bytes, 4)}, {fits}"

    def largest_batch(self, mode: Mode, batch: int) -> Found:
        """The largest per-replica batch below `batch` (which does not fit) that the
        search finds to fit, by compiling (`batch_search.largest_batch`: a multiple of 8
        unless only a smaller batch fits; at most `batch_search.compile_bound(batch)`
        compiles beyond those made already)."""
        hbm = self.hbm_for(mode)

        def probe(size: int) -> Outcome:
            return outcome(self.estimate(mode, size), hbm)

        known = {b: outcome(size, hbm) for (m, b), size in self._estimates.items() if m is mode}
        return batch_search.largest_batch(
            probe, hbm, batch, multiple=TPU_BATCH_MULTIPLE, known=known
        )


def outcome(size: StepSize, hbm_bytes: int) -> Outcome:
    """What the batch search takes of a step's size: whether it fits, and its total. A
    refusal's figure is no total (the planned temporaries, or the program, without the
    arguments): the search is given none then."""
    if isinstance(size, RefusedStep):
        return Outcome(False, None)
    return Outcome(size.fits(hbm_bytes), size.padded_total_bytes)


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
    # "compiled by the TPU compiler, libtpu 0.0.52 (jax 0.10.2), for TPU v5 lite"; None
    # when no step was (then `compiler_note` says why).
    compiler: str | None = None
    # Why the steps are XLA:CPU estimates (the extra is missing, the compiler failed).
    compiler_note: str | None = None
    fallbacks: dict[Mode, str] = dataclasses.field(default_factory=dict)  # per step
    # A replica's HBM as each generation's TPU compiler counts it (generation name ->
    # bytes), measured only when a step the compiler sized fits not even at a batch of 1.
    usable_hbm: dict[str, int] = dataclasses.field(default_factory=dict)

    def step(self, mode: Mode) -> StepMemory | None:
        return next((s for s in self.steps if s.mode is mode), None)


def estimate_steps(
    builds: StepBuilder, target: Target, sizer: TpuSizer | None = None, note: str | None = None
) -> TargetMemory:
    """Every step's memory on `target`, searched for the largest batch where it does not fit.

    With a `sizer` the TPU compiler sizes the steps; if it cannot even say how much
    HBM a replica has, every step is estimated by XLA:CPU, and `compiler_note` says why
    (as `note` does when the caller had no compiler to give).
    """
    header = None
    if sizer is not None:
        try:
            header = sizer.header()
        except CompileError as e:
            sizer, note = None, f"the TPU compiler failed: {e}"
    preflight = Preflight(builds, target.hbm_bytes_per_replica, sizer)
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
    if header is not None and steps and all(s.compiler == XLA_CPU for s in steps):
        header = None
        note = note or "the TPU compiler sized no step"
    nothing_fits = [s for s in steps if s.search and s.search.batch is None]
    usable = {}
    if sizer is not None and any(s.compiler != XLA_CPU for s in nothing_fits):
        usable = usable_hbm(sizer)
    return TargetMemory(
        target,
        tuple(steps),
        skipped,
        failed,
        compiler=header,
        compiler_note=note,
        fallbacks=dict(preflight.fallbacks),
        usable_hbm=usable,
    )


def usable_hbm(sizer: TpuSizer) -> dict[str, int]:
    """A replica's HBM as each generation's TPU compiler counts it (a refusal each, in
    under a second); a generation whose compiler does not say is left out."""
    found = {}
    for row in GENERATIONS:
        try:
            found[row.name] = TpuSizer(sizer.compiler, row).capacity.bytes
        except CompileError as e:
            logging.info("The TPU compiler of %s did not state its HBM: %s", row.name, e)
    return found
