"""The FLOPs of a run's train step, counted in the step as XLA compiles it (`tpurun report`'s
model FLOPs, MFU's numerator).

The replica step is built and compiled as `tpurun check` does (one device, the
per-replica batch, from TensorSpecs: nothing runs or is allocated), and its
optimized program's matrix products and convolutions are counted, 2 FLOP per
multiply-add, as MFU counts a model's FLOPs: elementwise work (activations, the
optimizer's update) is left out. An instruction inside a loop counts once per
iteration where XLA knows the trip count (`known_trip_count`), else once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from tpurun.check.rules import xla
from tpurun.check.rules.step_builds import StepBuilder, jit_flat
from tpurun.check.sizing import buffers
from tpurun.cluster import Cluster
from tpurun.model import Mode, Model
from tpurun.run_config import RunConfig

# The estimate builds a copy of the model on this process's CPU, also on a TPU run.
_HOST_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def train_step_flops(run: RunConfig, cluster: Cluster, model: Model) -> float:
    """The FLOPs of one training step over all replicas (each replica's, times the replicas)."""
    missing = xla.cpu_compiler_missing()
    if missing:  # tensorflow-tpu: the count needs XLA's CPU compile
        raise buffers.EstimateError(missing)
    with tf.device(_HOST_CPU):
        builds = StepBuilder(run, cluster, model, replicas=cluster.num_replicas)
        runner, spec = builds.single_device_step(Mode.TRAIN)
        function, args = builds.step_call(
            Mode.TRAIN, runner, spec, builds.per_replica_batch(Mode.TRAIN)
        )
        hlo = buffers.optimized_hlo(jit_flat(function, args), tf.nest.flatten(list(args)))
    return program_flops(hlo) * cluster.num_replicas


def program_flops(hlo: Any) -> float:
    """The dot and convolution FLOPs of an optimized HloProto, from its entry computation."""
    module = hlo.hlo_module
    computations = {c.id: c for c in module.computations}
    return _computation_flops(computations, module.entry_computation_id, set())


def _computation_flops(computations: dict[int, Any], cid: int, seen: set[int]) -> float:
    computation = computations.get(cid)
    if computation is None or cid in seen:
        return 0.0
    seen = seen | {cid}
    shapes = {i.id: list(i.shape.dimensions) for i in computation.instructions}
    total = 0.0
    for instruction in computation.instructions:
        if instruction.opcode == "dot":
            total += _dot(instruction, shapes)
        elif instruction.opcode == "convolution":
            total += _convolution(instruction, shapes)
        called = list(instruction.called_computation_ids)
        if not called:
            continue
        times = _trip_count(instruction) if instruction.opcode == "while" else 1
        # A while loop calls its condition and body; the body holds the work.
        bodies: Iterable[int] = called[1:] if instruction.opcode == "while" else called
        if instruction.opcode == "conditional":
            # One branch runs: the costliest, as an upper bound.
            total += max((_computation_flops(computations, c, seen) for c in called), default=0)
            continue
        total += times * sum(_computation_flops(computations, c, seen) for c in bodies)
    return total


def _dot(instruction: Any, shapes: dict[int, list[int]]) -> float:
    numbers = instruction.dot_dimension_numbers
    lhs = shapes.get(instruction.operand_ids[0], [])
    contracted = math.prod(lhs[d] for d in numbers.lhs_contracting_dimensions if d < len(lhs))
    return 2.0 * math.prod(instruction.shape.dimensions) * contracted


def _convolution(instruction: Any, shapes: dict[int, list[int]]) -> float:
    numbers = instruction.convolution_dimension_numbers
    kernel = shapes.get(instruction.operand_ids[1], [])
    spatial = math.prod(kernel[d] for d in numbers.kernel_spatial_dimensions if d < len(kernel))
    in_features = kernel[numbers.kernel_input_feature_dimension] if kernel else 1
    return 2.0 * math.prod(instruction.shape.dimensions) * spatial * in_features


def _trip_count(instruction: Any) -> int:
    try:
        config = json.loads(instruction.backend_config or b"{}")
        return max(1, int(config["known_trip_count"]["n"]))
    except (ValueError, KeyError, TypeError):
        return 1
