"""Will the input keep up? The model's training input, measured here, against what the target's train step takes.

On a TPU the hosts' CPUs make every batch (read, decode, augment) while the chips
run the steps; where they cannot keep up, the chips wait, and nothing says so
before the bill starts. `tpurun check --target` therefore runs the model's real
training input - `input_fn(TRAIN)` (or its in-memory arrays' batches) for one of
the target's input pipelines, at its per-replica batch, as `tpurun.inputs` builds
it - on this machine for MEASURE_SECONDS after a warm-up, and counts its examples
per CPU-second. A target host has `targets.host_vcpus` vCPUs (the table beside the
peaks), so it makes at most about that many times as many examples/s: linear in
cores, at this CPU's speed per core. The train step's time bound
(`step_bounds`: the chips' peak FLOP/s and HBM bandwidth) says how many examples/s
one host's chips could take at most. Whichever is smaller binds: when it is the
host, the chips wait for the input 1 - host/step of the time, at least while the
step runs at its bound (a real step is slower, so they wait less).

A model on device data (its training arrays in every replica's memory, each step
gathering its own batch) has no host side to measure; check says so. `--input_check
=false` skips the measurement.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import data_service, inputs
from tpurun.check.bounds.step_bounds import StepBound, bounds, format_seconds
from tpurun.check.rules.step_builds import StepBuilder
from tpurun.check.sizing.preflight import TargetMemory
from tpurun.check.targets import Target, generation, host_vcpus
from tpurun.errors.tf_errors import one_line
from tpurun.model import Mode

MEASURE_SECONDS = 2.0  # steady state, after WARMUP_SECONDS
WARMUP_SECONDS = 0.5  # after the first batch: tf.data's autotuning settles
# A measuring call pulls batches in a compiled loop, doubling their number until a call
# takes this long: Python's per-call cost then does not count against a fast input.
CALL_SECONDS = 0.05
REMEDIES = (
    "more host vCPUs per chip (a slice with fewer chips per host), decoded examples "
    "cached (dataset.cache() after decoding, if they fit the host's memory), a lighter "
    "pipeline (smaller images, fewer augmentations, decode_and_crop_jpeg), more "
    "parallelism (num_parallel_calls=tf.data.AUTOTUNE), or tf.data service's CPU "
    "workers (below; a service-fed run does not resume exactly); docs/check.md"
)
ASSUMPTIONS = (
    "linear in cores; this CPU's speed per core, not the TPU host's; the step's time is a "
    "bound: a real step is slower and takes fewer examples/s"
)


@dataclasses.dataclass(frozen=True)
class Measured:
    """The training input of one pipeline, run on this machine."""

    examples: int  # in the measured time
    seconds: float
    cpu_seconds: float  # of this process, all its threads
    cores: int  # this machine's, as this process may use them
    first_batch_seconds: float  # building the pipeline and its first batch: start-up
    # This machine's cores no process used meanwhile (Linux's /proc/stat); None unknown.
    idle_cores: float | None = None

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds

    @property
    def examples_per_cpu_second(self) -> float:
        return self.examples / max(self.cpu_seconds, 1e-9)

    @property
    def cores_busy(self) -> float:
        return self.cpu_seconds / self.seconds


@dataclasses.dataclass(frozen=True)
class HostInput:
    """What check found about the target's hosts feeding its chips."""

    target: Target
    why_not: str | None = None  # nothing measured, and why
    measured: Measured | None = None
    vcpus: int | None = None  # of a target host
    examples_per_host_step: int = 0  # what a host feeds its chips per train step
    train_bound: StepBound | None = None  # the train step's time bound, if there is one
    no_bound: str = ""  # why there is no bound to compare with
    config_name: str = ""  # what the tf.data service's sizing trains (`data_service.sizing`)
    python_calls: tuple[str, ...] = ()  # Python the input calls: the service cannot run it

    @property
    def host_rate(self) -> float | None:
        """Examples/s a target host makes at most (linear in its vCPUs)."""
        if self.measured is None or self.vcpus is None:
            return None
        return self.measured.examples_per_cpu_second * self.vcpus

    @property
    def step_rate(self) -> float | None:
        """Examples/s one host's chips take at most: the train step at its bound."""
        if self.train_bound is None:
            return None
        return self.train_bound.examples_per_second / self.target.hosts

    @property
    def ratio(self) -> float | None:
        """host_rate / step_rate: below 1 the input binds."""
        if self.host_rate is None or not self.step_rate:
            return None
        return self.host_rate / self.step_rate

    @property
    def input_bound(self) -> bool:
        return self.ratio is not None and self.ratio < 1

    @property
    def chips_wait(self) -> float | None:
        """The share of the time the chips would wait for input at the step's bound."""
        return None if self.ratio is None else max(0.0, 1.0 - self.ratio)


def check(builds: StepBuilder, found: TargetMemory) -> HostInput:
    """Measures the model's training input here (MEASURE_SECONDS) and sets it against
    `found`'s train step."""
    target = found.target
    train = found.step(Mode.TRAIN)
    name = builds.name
    if train is None:
        return HostInput(target, why_not="the train step was not sized (see above)")
    if train.device_data:
        return HostInput(
            target,
            why_not=(
                f"{name} trains on device data: its training arrays stay in each replica's "
                "memory and every step gathers its own batch, so no host input pipeline feeds "
                "the chips (nothing to measure)"
            ),
        )
    if not train.fits:
        return HostInput(target, why_not="not measured: the train step does not fit")
    row = generation(target.generation)
    vcpus = host_vcpus(target)
    if vcpus is None:
        return HostInput(
            target, why_not=f"not measured: no vCPU count of a {row.name} host was found"
        )
    run = builds.run
    micro_batches = run.config.train.accumulate_steps
    context = tf.distribute.InputContext(
        num_input_pipelines=target.hosts, input_pipeline_id=0, num_replicas_in_sync=target.replicas
    )
    params = inputs.input_params(
        context, run.train_batch_size, run.seed, micro_batches=micro_batches
    )
    try:
        dataset = inputs.train_dataset(builds.model, params, builds.arrays)
        measured = measure(dataset, params.batch_size, MEASURE_SECONDS)
    except Exception as e:  # noqa: BLE001 - the user's input: any failure is reported, not fatal
        return HostInput(target, why_not=f"the training input failed here: {one_line(e)}")
    train_bound = bounds(found).get(Mode.TRAIN) if found.compiler else None
    no_bound = ""
    if train_bound is None:
        no_bound = row.missing_peaks or (
            "its XLA:CPU estimate counts no FLOPs"
            if found.compiler is None
            else "the TPU compiler gave the train step no cost"
        )
    host = HostInput(
        target,
        measured=measured,
        vcpus=vcpus,
        examples_per_host_step=train.examples * target.replicas // target.hosts,
        train_bound=train_bound,
        no_bound=no_bound,
        config_name=run.config_name,
    )
    if not host.input_bound:
        return host
    # Only an input-bound run is sized for the tf.data service, which cannot run Python:
    # its dataset's graph (arrays in it included) is read for that alone.
    try:
        calls = data_service.python_calls(dataset) or []
    except Exception as e:  # noqa: BLE001 - the sizing is then printed without that check
        logging.warning("Could not read the training input's graph for Python calls: %s", e)
        calls = []
    return dataclasses.replace(host, python_calls=tuple(calls))


def skipped(target: Target) -> HostInput:
    return HostInput(target, why_not="not measured (--input_check=false)")


def measure(
    dataset: tf.data.Dataset, batch_size: int, seconds: float, warmup: float | None = None
) -> Measured:
    """Pulls batches of `dataset` for `seconds` after its first batch and a warm-up
    (WARMUP_SECONDS unless `warmup` is given)."""
    start = time.perf_counter()
    iterator = iter(dataset)

    @tf.function(autograph=False)  # the loop written out: nothing depends on reading source
    def pull(count: tf.Tensor) -> tf.Tensor:
        def next_batch(pulled: tf.Tensor) -> tf.Tensor:
            batch = tf.nest.flatten(iterator.get_next(), expand_composites=True)
            with tf.control_dependencies(batch):
                return pulled + 1

        return tf.while_loop(lambda pulled: pulled < count, next_batch, [tf.zeros([], tf.int64)])

    pull(tf.constant(1, tf.int64))
    first_batch = time.perf_counter() - start
    count = 1
    warm_until = time.perf_counter() + (WARMUP_SECONDS if warmup is None else warmup)
    while time.perf_counter() < warm_until:
        count = _pull_timed(pull, count)
    batches, cpu, idle, began = 0, time.process_time(), _idle_ticks(), time.perf_counter()
    while time.perf_counter() - began < seconds:
        batches += count
        count = _pull_timed(pull, count)
    elapsed, idle_after = time.perf_counter() - began, _idle_ticks()
    idle_cores = None
    if idle is not None and idle_after is not None:
        idle_cores = (idle_after - idle) / os.sysconf("SC_CLK_TCK") / elapsed
    return Measured(
        examples=batches * batch_size,
        seconds=elapsed,
        cpu_seconds=time.process_time() - cpu,
        cores=len(os.sched_getaffinity(0)),
        first_batch_seconds=first_batch,
        idle_cores=idle_cores,
    )


def _idle_ticks() -> int | None:
    """This machine's idle CPU time so far, in clock ticks (Linux); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[4]) + int(fields[5])  # idle + iowait
    except (OSError, IndexError, ValueError):
        return None


def _pull_timed(pull: Any, count: int) -> int:
    """Pulls `count` batches; the count for the next call (doubled while calls are short)."""
    start = time.perf_counter()
    pull(tf.constant(count, tf.int64))
    return count * 2 if time.perf_counter() - start < CALL_SECONDS else count


def lines(host: HostInput) -> list[str]:
    """What check prints after the bounds: the measurement, the verdict, its assumptions."""
    if host.measured is None:
        return [f"Input: {host.why_not}"]
    measured, target = host.measured, host.target
    row = generation(target.generation)
    out = [
        "Will the input keep up? The training input, measured here "
        f"({format_seconds(measured.seconds)} after {format_seconds(measured.first_batch_seconds)} "
        "to its first batch; --input_check=false skips it):",
        f"  here: {rate(measured.examples_per_second)} examples/s on this machine's "
        f"{measured.cores} cores ({measured.cores_busy:.1f} busy): "
        f"{rate(measured.examples_per_cpu_second)} per CPU-second",
    ]
    makes = (
        f"a {target.name} host ({host.vcpus} vCPUs, {row.host_source}) makes at most "
        f"~{rate(host.host_rate or 0)} examples/s"
    )
    if host.ratio is None:
        out.append(f"  {makes}; no train step time to compare with: {host.no_bound}")
    elif host.input_bound:
        out.append(
            f"  input-bound: {makes}, the train step could take {rate(host.step_rate or 0)} per "
            f"host (at its bound, {host.examples_per_host_step:,} examples per host per step): "
            f"the chips would wait {host.chips_wait:.0%} of the time; remedies: {REMEDIES}"
        )
        out += data_service.sizing.lines(
            service_sizing(host), host.config_name, list(host.python_calls), rate
        )
    else:
        out.append(
            f"  keeps up: {makes}, {host.ratio:.1f}x the {rate(host.step_rate or 0)} per host "
            f"that the train step takes at its bound ({host.examples_per_host_step:,} examples "
            "per host per step)"
        )
    note = _cores_note(measured)
    if note:
        out.append(f"  note: {note}")
    out.append(f"  assumptions: {ASSUMPTIONS}")
    return out


def service_sizing(host: HostInput) -> data_service.sizing.Sizing:
    """The tf.data service workers that would make what the slice's train step takes."""
    assert host.measured is not None and host.step_rate is not None
    return data_service.sizing.Sizing.of(
        host.measured.examples_per_cpu_second, host.step_rate, host.target.hosts
    )


def _cores_note(measured: Measured) -> str | None:
    """Why the input used fewer than this machine's cores, when it did: cores left idle
    (a serial stage), or other processes on them (the per CPU-second figure holds)."""
    if measured.cores_busy >= 0.75 * measured.cores:
        return None
    busy = f"the input kept {measured.cores_busy:.1f} of this machine's {measured.cores} cores busy"
    if measured.idle_cores is None:
        return f"{busy}; others may have used the rest"
    if measured.idle_cores > 0.25 * measured.cores:
        return (
            f"{busy} and {measured.idle_cores:.1f} stayed idle: a serial stage (or too little "
            "parallelism) limits it, which more cores may not lift"
        )
    return f"{busy}: other processes used the rest (the figure per CPU-second is what carries over)"


def report(host: HostInput) -> dict[str, Any]:
    """`--report`'s "input" key: the measurement, the host's and the step's figures."""
    measured = host.measured
    if measured is None:
        return {"measured": False, "why_not": host.why_not}
    return {
        "measured": True,
        "seconds": measured.seconds,
        "first_batch_seconds": measured.first_batch_seconds,
        "examples_per_second_here": measured.examples_per_second,
        "cores_here": measured.cores,
        "cores_busy": measured.cores_busy,
        "cores_idle_here": measured.idle_cores,
        "examples_per_cpu_second": measured.examples_per_cpu_second,
        "host_vcpus": host.vcpus,
        "host_vcpus_source": generation(host.target.generation).host_source,
        "hosts": host.target.hosts,
        "examples_per_host_step": host.examples_per_host_step,
        "host_examples_per_second": host.host_rate,
        "step_examples_per_second_per_host": host.step_rate,
        "input_bound": None if host.ratio is None else host.input_bound,
        "chips_wait_fraction": host.chips_wait,
        "no_bound": host.no_bound or None,
        "data_service_workers": (
            service_sizing(host).workers if host.input_bound and not host.python_calls else None
        ),
    }


def rate(value: float) -> str:
    """41.2k, 4.86M, 812: 3 significant digits."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"
