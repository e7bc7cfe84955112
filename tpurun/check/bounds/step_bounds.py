"""How fast a step can be, and what training must cost at least: from the compiled steps' cost.

The TPU compiler counts each compiled step's FLOPs and the bytes it moves to and
from HBM (`cost_analysis`). A replica cannot compute faster than its chip's peak
bfloat16 FLOP/s, nor move bytes faster than its HBM bandwidth
(`tpurun.check.targets.Generation`, from the Cloud TPU pages), so

    step time >= max(flops / peak FLOP/s, bytes accessed / HBM bandwidth)

per replica (the replicas run their steps in parallel), and the one that binds
says whether the step is compute- or memory-bound. From it: the slice's
examples/s at most, and for `--train_steps` the time to train at least, and its
price at least: time x chips x $ per chip-hour (the generation's on-demand price
of `targets.PRICES_DATE`, or `--price_per_chip_hour`).

These are bounds, not predictions: a real step also waits for the host, the
input, collectives and the parts of the chip the peaks do not count (a float32
matmul runs at a fraction of the bfloat16 peak). The XLA:CPU estimate counts no
FLOPs, so without the TPU compiler there is no bound; nor for a generation whose
page publishes no peaks (v2), nor a price without one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpurun.check.rules.findings import STEP_NAMES
from tpurun.check.sizing.memory import format_bytes
from tpurun.check.sizing.preflight import StepMemory, TargetMemory
from tpurun.check.sizing.tpu_compiler.sizing import RefusedStep
from tpurun.check.targets import PRICES_DATE, PRICES_SOURCE, Generation, generation
from tpurun.model import Mode
from tpurun.run_config import RunConfig

PRICE_FLAG = "--price_per_chip_hour"
COMPUTE = "compute"
MEMORY = "memory"
# How far real runs sit from the compute bound, as a cited source says it: MaxText,
# Google's JAX LLM trainer tuned for TPUs, "typically achieves 55% to 60% model-flop
# utilization" (its README, https://github.com/google/maxtext).
REAL_RUNS = (
    "real steps take longer: even MaxText, tuned for TPUs, reports 55-60% of the peak "
    "FLOP/s (https://github.com/google/maxtext)"
)


@dataclasses.dataclass(frozen=True)
class StepBound:
    """The least time one step takes on a replica, and what binds it."""

    mode: Mode
    flops: float  # per replica and step
    bytes_accessed: float
    compute_seconds: float  # flops / peak FLOP/s
    memory_seconds: float  # bytes / HBM bandwidth
    examples: int  # per step, on the whole slice

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        """COMPUTE or MEMORY: which limit the bound is."""
        return COMPUTE if self.compute_seconds >= self.memory_seconds else MEMORY

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else float("inf")


@dataclasses.dataclass(frozen=True)
class RunBound:
    """The least time and price of the run's training steps."""

    train_steps: int
    seconds: float
    chips: int
    price_per_chip_hour: float | None
    price_source: str  # where the price comes from, or why there is none

    @property
    def cost_usd(self) -> float | None:
        if self.price_per_chip_hour is None:
            return None
        return self.seconds / 3600 * self.chips * self.price_per_chip_hour


def step_bound(step: StepMemory, row: Generation, replicas: int) -> StepBound | None:
    """The bound of a compiled step that fits, on `replicas` of a `row` generation; None
    without the compiler's cost or the generation's peaks."""
    flops = getattr(step.estimate, "flops", None)
    moved = getattr(step.estimate, "bytes_accessed", None)
    peak, bandwidth = row.peak_flops_per_replica, row.hbm_bandwidth_per_replica
    if not step.fits or flops is None or moved is None or not peak or not bandwidth:
        return None
    return StepBound(
        step.mode,
        flops=flops,
        bytes_accessed=moved,
        compute_seconds=flops / peak,
        memory_seconds=moved / bandwidth,
        examples=step.examples * replicas,
    )


def bounds(found: TargetMemory) -> dict[Mode, StepBound]:
    row = generation(found.target.generation)
    result = {}
    for step in found.steps:
        bound = step_bound(step, row, found.target.replicas)
        if bound is not None:
            result[step.mode] = bound
    return result


def run_bound(run: RunConfig, found: TargetMemory, train: StepBound | None) -> RunBound | None:
    """The run's training time and price at least; None without a train step's bound."""
    if train is None:
        return None
    row = generation(found.target.generation)
    if run.price_per_chip_hour is not None:
        price, source = run.price_per_chip_hour, PRICE_FLAG
    elif row.price_per_chip_hour is not None:
        price = row.price_per_chip_hour
        source = f"{row.name} on demand, {PRICES_DATE}, {PRICES_SOURCE}"
    else:
        price, source = None, row.missing_price or ""
    return RunBound(
        train_steps=run.train_steps,
        seconds=run.train_steps * train.seconds,
        chips=found.target.chips,
        price_per_chip_hour=price,
        price_source=source,
    )


def _length_flag(run: RunConfig) -> str:
    """The flag the run's length came from: its epochs (turned into steps) or its steps."""
    epochs = run.config.train.get("epochs")
    return f"--train_epochs={epochs:g}" if epochs else "--train_steps"


def lines(run: RunConfig, found: TargetMemory) -> list[str]:
    """What `tpurun check --target` prints after the memory table: the bounds, or why none."""
    if not found.steps:
        return []
    if found.compiler is None:
        return [f"Time per step and cost: no bound: {no_compiler(found)}"]
    row = generation(found.target.generation)
    if row.missing_peaks:
        return [f"Time per step: no bound: {row.missing_peaks}"]
    found_bounds = bounds(found)
    peak = row.peak_flops_per_replica or 0.0
    bandwidth = row.hbm_bandwidth_per_replica or 0.0
    out = [
        f"Time per step, at least (max(FLOPs / peak, bytes accessed / HBM bandwidth) with a "
        f"{row.name} replica's {peak / 1e12:.4g} TFLOP/s bfloat16 and {bandwidth / 1e9:.4g} "
        f"GB/s, {row.source}):"
    ]
    for step in found.steps:
        name = STEP_NAMES[step.mode]
        bound = found_bounds.get(step.mode)
        if bound is None:
            out.append(f"  {name}: no bound: {_why_no_bound(step)}")
            continue
        out.append(
            f"  {name}: {format_seconds(bound.seconds)} per step ({bound.bound}-bound: "
            f"{format_flops(bound.flops)} and {format_bytes(int(bound.bytes_accessed))} "
            f"accessed per replica), at most {bound.examples_per_second:,.0f} examples/s on the "
            f"{found.target.name}"
        )
    total = run_bound(run, found, found_bounds.get(Mode.TRAIN))
    if total is not None:
        text = (
            f"Training, at least: {total.train_steps} steps ({_length_flag(run)}) take "
            f"{format_seconds(total.seconds)} on the {found.target.name}"
        )
        if total.cost_usd is not None:
            source = total.price_source
            if source != PRICE_FLAG:
                source += f"; {PRICE_FLAG} overrides"
            text += (
                f", and cost {format_usd(total.cost_usd)}: {total.chips} chips at "
                f"${total.price_per_chip_hour:.2f} per chip-hour ({source})"
            )
        else:
            text += f"; no price: {total.price_source}"
        out.append(text)
    elif found.step(Mode.TRAIN) is not None:
        out.append("Training, at least: no bound, and no price: the train step has no bound")
    out.append(f"  note: these are bounds, not predictions: {REAL_RUNS}")
    return out


def no_compiler(found: TargetMemory) -> str:
    """Why there is no bound at all: the XLA:CPU estimate sized every step."""
    why = found.compiler_note or "the TPU compiler sized no step"
    return (
        f"XLA's CPU estimate counts no FLOPs, and the TPU compiler, which does, did not size "
        f"the steps ({why})"
    )


def _why_no_bound(step: StepMemory) -> str:
    if step.compiler != "tpu":
        return "estimated by XLA:CPU, which counts no FLOPs"
    if isinstance(step.estimate, RefusedStep):
        return "the TPU compiler refused it at this batch: no program, no FLOPs counted"
    return "it does not fit a replica at this batch"


def report(run: RunConfig, found: TargetMemory) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--report`'s keys: per step, and for the whole run (all null without a bound)."""
    found_bounds = bounds(found) if found.compiler is not None else {}
    per_step = {}
    for step in found.steps:
        bound = found_bounds.get(step.mode)
        per_step[STEP_NAMES[step.mode]] = {
            "compiler": step.compiler,
            "flops": getattr(step.estimate, "flops", None),
            "bytes_accessed": getattr(step.estimate, "bytes_accessed", None),
            "step_time_bound_s": bound.seconds if bound else None,
            "bound": bound.bound if bound else None,
            "examples_per_second_bound": bound.examples_per_second if bound else None,
        }
    total = run_bound(run, found, found_bounds.get(Mode.TRAIN))
    row = generation(found.target.generation)
    price = run.price_per_chip_hour
    if price is None:
        price = row.price_per_chip_hour
    whole = {
        "chips": found.target.chips,
        "price_per_chip_hour": price,
        "prices_date": None if run.price_per_chip_hour is not None else PRICES_DATE,
        "train_steps": run.train_steps,
        "train_time_bound_s": total.seconds if total else None,
        "cost_bound_usd": total.cost_usd if total else None,
    }
    return per_step, whole


def format_seconds(seconds: float) -> str:
    """3.2 us, 41.7 ms, 12.5 s, 3.4 min, 2.1 h, 3.2 days."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    for unit, size in (("ms", 1e-3), ("us", 1e-6)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_flops(flops: float) -> str:
    """524 GFLOP, 22.3 kFLOP: decimal units, 3 significant digits."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:.3g} {unit}"
    return f"{flops / 1e3:.3g} kFLOP" if flops >= 1e3 else f"{flops:.0f} FLOP"


def format_usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 0.01 else f"${amount:.2g}"
