"""On the device: what `train`/`eval`/`predict` say when a TPU runs out of memory, and the
memory a finished run records.

`out_of_memory` turns the TPU's out-of-memory error (a ResourceExhaustedError with
a page of allocations) into the one line `tpurun check --target` gives: what the
step needs, what a replica has, the largest per-replica batch that fits and the
other levers. `record_memory` adds to the run record the estimate of the run's
step beside the peak memory the devices measured, where they report one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.check.report import fit_findings, fit_report
from tpurun.check.rules.input_rules import BATCH_FLAGS
from tpurun.check.rules.step_builds import StepBuilder, global_batch
from tpurun.check.sizing.memory import MemoryEstimate
from tpurun.check.sizing.preflight import Preflight, StepSize
from tpurun.cluster import Cluster
from tpurun.errors.tf_errors import user_code_line
from tpurun.model import Mode, Model, has_generate
from tpurun.run_config import RunConfig
from tpurun.storage import records

# A size as XLA and the TPU runtime print them (tsl's HumanReadableNumBytes): binary
# units with one letter, "49.34G", "528.00M", "4.0K", "0B".
_SIZE = r"([\d.]+)\s*([KMGTP]?)i?B?"
# The messages of an out-of-memory TPU, from the OpenXLA error pages
# (https://openxla.org/xla/errors): E1000, the compiler's
#   "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used
#    49.34G of 32.00G hbm. Exceeded hbm capacity by 17.34G."
#   "TPU TensorCore Hbm usage: 34.82G, SparseCore Hbm usage 174.10G, exceeding
#    available bytes: 95.74G"
# E0101, loading the program ("Attempting to reserve 29.49G at the bottom of memory.
# That was not possible. There are 147.64M free, ..."), and E0100, a buffer
# ("Attempting to allocate 8.00M. That was not possible. There are 6.43M free.").
_COMPILE = re.compile(rf"Ran out of memory in memory space (\w+)\. Used {_SIZE} of {_SIZE} \w+")
_SPARSECORE = re.compile(
    rf"TensorCore Hbm usage: {_SIZE}, SparseCore Hbm usage {_SIZE}, exceeding available "
    rf"bytes: {_SIZE}"
)
_RUNTIME = re.compile(
    rf"Attempting to (?:reserve|allocate) {_SIZE}.*?That was not possible\. There are {_SIZE} "
    "free"
)
# TensorFlow's own allocator (GPU, or a host): no sizes in it that say the capacity.
_ALLOCATOR = "OOM when allocating tensor"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
    """What an out-of-memory message says: where, and the sizes it gives."""

    space: str  # "HBM", "vmem", "device memory"
    detail: str  # the sizes, as the message gives them
    needs: int | None = None  # what the compiled program needed, per replica
    capacity: int | None = None  # what a replica has for it


def parse(message: str) -> OutOfMemory | None:
    """The out-of-memory error in a ResourceExhaustedError's message; None if it is none."""
    text = " ".join(message.split())
    if match := _COMPILE.search(text):
        space, used, used_unit, total, total_unit = match.groups()
        space = "HBM" if space.lower() == "hbm" else space
        return OutOfMemory(
            space,
            f"XLA's TPU compile needs {used}{used_unit} per replica, which has {total}{total_unit}",
            _bytes(used, used_unit),
            _bytes(total, total_unit),
        )
    if match := _SPARSECORE.search(text):
        tc, tc_unit, sc, sc_unit, total, total_unit = match.groups()
        return OutOfMemory(
            "HBM",
            f"XLA's TPU compile needs {tc}{tc_unit} (TensorCore) + {sc}{sc_unit} (SparseCore) "
            f"per replica, which has {total}{total_unit}",
            _bytes(tc, tc_unit) + _bytes(sc, sc_unit),
            _bytes(total, total_unit),
        )
    if match := _RUNTIME.search(text):
        wanted, wanted_unit, free, free_unit = match.groups()
        return OutOfMemory(
            "HBM", f"the TPU needed {wanted}{wanted_unit} more and had {free}{free_unit} free"
        )
    if _ALLOCATOR in text:
        return OutOfMemory("device memory", "TensorFlow's allocator could not allocate a tensor")
    return None


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def out_of_memory(
    run: RunConfig, cluster: Cluster, model: Model, error: tf.errors.ResourceExhaustedError
) -> str | None:
    """The one line for a step that ran out of device memory; None if `error` is not that."""
    found = parse(error.message)
    if found is None or run.command not in ("train", "eval", "predict"):
        return None
    mode = Mode(run.command)
    step = "step" if not (mode is Mode.PREDICT and has_generate(model)) else "generate()"
    line = f"the {run.command} {step} ran out of {found.space} ({found.detail})"
    flag = BATCH_FLAGS[mode]
    batch = global_batch(run, mode) // cluster.num_replicas
    max_batch = None
    if found.needs and found.capacity and step == "step" and batch > 1:
        max_batch = _largest_batch(run, cluster, model, mode, found.needs, found.capacity)
    if max_batch:
        largest = f"the largest per-replica batch that fits is about {max_batch}"
        fix = fit_findings.levers(run, mode, batch, largest, max_batch, cluster.num_replicas, None)
    else:
        fix = (
            f"a smaller per-replica batch than {batch} ({flag}); `tpurun check "
            f"--config={run.config_name} --target=<TPU type>` finds the largest that fits"
        )
    return f"{line}: {fix}"


def _largest_batch(
    run: RunConfig, cluster: Cluster, model: Model, mode: Mode, needs: int, capacity: int
) -> int | None:
    """The largest per-replica batch that fits `capacity`, by estimate; None if unknown.

    The TPU's compiler measured what the step needs at this batch, the CPU compile
    estimates it; the search budget is the capacity scaled by their ratio, so an
    estimate that is off by a constant factor (high for CNNs) is off no more.
    """
    try:
        preflight, batch, estimate = _estimate(run, cluster, model, mode)
        assert isinstance(estimate, MemoryEstimate)  # no TPU compiler on this side
        preflight.hbm_bytes = int(capacity * estimate.padded_total_bytes / needs)
        with tf.device(_HOST_CPU):
            return preflight.largest_batch(mode, batch).batch
    except Exception as e:  # noqa: BLE001 - the advice without the batch is still advice
        logging.warning("Could not estimate the largest batch that fits: %s", user_code_line(e))
        return None


# The estimate builds a copy of the model on this process's CPU, also on a TPU run
# (whose ops otherwise go to the TPU worker's host).
_HOST_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _estimate(
    run: RunConfig, cluster: Cluster, model: Model, mode: Mode
) -> tuple[Preflight, int, StepSize]:
    """The run's step on one device at its per-replica batch, as `tpurun check` estimates it."""
    with tf.device(_HOST_CPU):
        builds = StepBuilder(run, cluster, model, replicas=cluster.num_replicas)
        builds.single_device_step(mode)
        preflight = Preflight(builds, hbm_bytes=0)  # only estimates until given one
        batch = builds.per_replica_batch(mode)
        return preflight, batch, preflight.estimate(mode, batch)


def record_memory(record: str, run: RunConfig, cluster: Cluster, model: Model) -> None:
    """Adds `memory` to the run record: the devices' peak beside the estimate. Never raises."""
    try:
        data = records.read_json(record) or {}
        data["memory"] = memory_entry(run, cluster, model)
        storage.write_atomically(record, json.dumps(data, indent=2, default=str) + "\n")
    except Exception as e:  # noqa: BLE001 - the run itself succeeded
        logging.warning("Could not add the memory to the run record %s: %s", record, e)


def memory_entry(run: RunConfig, cluster: Cluster, model: Model) -> dict[str, Any]:
    """The peak memory a replica's device measured and the estimate of the run's step.

    Only where the devices report a peak (TPUs, GPUs; `peak_bytes`): elsewhere
    neither is recorded, so a CPU run pays no compile for it.
    """
    peak = peak_bytes(cluster)
    if not peak:
        return {
            "peak_bytes_per_replica": None,
            "why": "no TPU or GPU reported its peak memory (tf.config.experimental."
            "get_memory_info; a CPU keeps no statistics of its own); `tpurun check "
            "--target=<TPU type>` estimates it",
        }
    entry: dict[str, Any] = {"peak_bytes_per_replica": peak}
    mode = Mode(run.command)
    if mode is Mode.PREDICT and has_generate(model):
        entry["estimate"] = None
        return entry
    try:
        _, batch, estimate = _estimate(run, cluster, model, mode)
    except Exception as e:  # noqa: BLE001 - a record without the estimate is still a record
        entry["estimate"] = None
        entry["why"] = f"the step could not be estimated: {user_code_line(e)}"
        return entry
    entry["estimate"] = {"step": run.command, **fit_report.step_bytes(batch, estimate)}
    return entry


def peak_bytes(cluster: Cluster) -> int | None:
    """The largest peak of the replicas' TPUs or GPUs (get_memory_info); None if none has one.

    CPU devices are left out: TensorFlow's CPU allocator keeps no statistics (0), or,
    for a CPU split into logical devices, those of an allocator shared by the whole
    process since it started, which are not the run's.
    """
    try:
        devices = cluster.strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: one local device, the CPU
        return None
    peaks = []
    for device in devices:
        if tf.DeviceSpec.from_string(device).device_type not in ("TPU", "GPU"):
            continue
        try:
            peaks.append(int(tf.config.experimental.get_memory_info(device)["peak"]))
        except (ValueError, KeyError, tf.errors.OpError):
            continue
    return max(peaks) if peaks and max(peaks) > 0 else None
